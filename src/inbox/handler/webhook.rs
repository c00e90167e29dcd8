//! The webhook handler: POSTs the payload to the user's service with the message's
//! headers and `Idempotency-Key: <message_id>`, and maps the answer:
//!
//! - 2xx → DONE;
//! - 408, 425, 429 (honouring `Retry-After` in seconds), 5xx, a timeout or a connection
//!   error → a failed attempt, retried with backoff;
//! - other 4xx, and a redirect (never followed) → MANUAL_REQUIRED (the request itself is
//!   wrong and will stay wrong), unless its code is listed in `retryable_statuses`.
//!
//! The client, the classification and the header rules are `crate::webhooks::client`'s,
//! shared with the HTTP sink.

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use outboxd_connector::ClaimedMessage;

use super::{Handled, Handler};
pub(crate) use crate::webhooks::client::check_forwardable;
use crate::webhooks::client::{forwarded, Answer, Poster};

/// POSTs each message to one URL.
#[derive(Clone, Debug)]
pub struct WebhookHandler {
    poster: Poster,
    forward: Vec<String>,
    retryable: Vec<u16>,
}

impl WebhookHandler {
    /// A handler posting to `url` (http:// or https://), waiting at most `timeout` for an
    /// answer.
    pub fn new(url: &str, timeout: Duration, retryable: &[u16]) -> Result<Self, String> {
        let poster = Poster::new(url, timeout).map_err(|e| format!("webhook {e}"))?;
        Ok(Self {
            poster,
            forward: Vec::new(),
            retryable: retryable.to_vec(),
        })
    }

    /// Also copies the message headers `names` lists (see [`check_forwardable`]).
    pub fn forwarding(mut self, names: &[String]) -> Result<Self, String> {
        for name in names {
            check_forwardable(name)?;
        }
        self.forward = names.iter().map(|n| n.to_ascii_lowercase()).collect();
        Ok(self)
    }

    fn headers(&self, message: &ClaimedMessage) -> Result<HeaderMap, String> {
        let mut headers = HeaderMap::new();
        // Of the message's own headers, the trace context and those the handler lists.
        for (name, value) in &message.headers {
            let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_bytes(value.as_bytes()),
            ) else {
                continue;
            };
            if forwarded(name.as_str(), &self.forward) {
                headers.append(name, value);
            }
        }
        // Values as bytes: a UTF-8 key or id is sent as is (HTTP allows bytes above 0x7F).
        let value = |s: &str| HeaderValue::from_bytes(s.as_bytes()).map_err(|e| e.to_string());
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert("idempotency-key", value(&message.message_id)?);
        headers.insert("message-id", value(&message.message_id)?);
        headers.insert("message-type", value(&message.message_type)?);
        headers.insert("biz-key", value(&message.biz_key)?);
        headers.insert("inbox-source", value(&message.source)?);
        headers.insert(
            "inbox-attempt",
            value(&(message.retry_count + 1).to_string())?,
        );
        Ok(headers)
    }

    async fn call(&self, message: &ClaimedMessage) -> Handled {
        let headers = match self.headers(message) {
            Ok(headers) => headers,
            Err(e) => {
                return Handled::Manual {
                    reason: format!("webhook: cannot build the request: {e}"),
                }
            }
        };
        let body = Bytes::from(message.payload.clone());
        match self.poster.post(headers, body, &self.retryable).await {
            Answer::Accepted { .. } => Handled::Done,
            Answer::Retry { error, after, .. } => Handled::Retry {
                error: format!("webhook {error}"),
                after,
            },
            Answer::Refused { error, .. } => Handled::Manual {
                reason: format!("webhook {error}"),
            },
        }
    }
}

impl Handler for WebhookHandler {
    fn handle<'a>(&'a self, message: &'a ClaimedMessage) -> BoxFuture<'a, Handled> {
        Box::pin(self.call(message))
    }

    fn timeout(&self) -> Duration {
        // The request's own timeout, plus reading the error body.
        self.poster.timeout() * 2
    }
}
