//! The webhook handler: POSTs the payload to the user's service with the message's
//! headers and `Idempotency-Key: <message_id>`, and maps the answer:
//!
//! - 2xx → DONE;
//! - 408, 429 (honouring `Retry-After` in seconds), 5xx, a timeout or a connection
//!   error → a failed attempt, retried with backoff;
//! - other 4xx → MANUAL_REQUIRED (the request itself is wrong and will stay wrong),
//!   unless listed in `retryable_statuses`.
//!
//! hyper's pooled client keeps connections to the service open between messages. An
//! `https://` URL is verified as a browser would: the server's certificate must chain to
//! the system's trusted roots and name the URL's host (OpenSSL through `native-tls`).

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_tls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use outboxd_connector::ClaimedMessage;

use super::{Handled, Handler};

/// Header names of a message that are not copied onto the request: hop-by-hop and framing
/// headers, which describe a connection or a body, not the message, and the ones outboxd
/// sets itself.
const RESERVED: [&str; 15] = [
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "expect",
    "idempotency-key",
    "message-id",
    "message-type",
    "biz-key",
    "inbox-source",
];

/// Of the answer's body, at most this much goes into `last_error`.
const ERROR_BODY_CHARS: usize = 200;

/// POSTs each message to one URL.
#[derive(Clone, Debug)]
pub struct WebhookHandler {
    url: Uri,
    timeout: Duration,
    retryable: Vec<u16>,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl WebhookHandler {
    /// A handler posting to `url` (http:// or https://), waiting at most `timeout` for an
    /// answer.
    pub fn new(url: &str, timeout: Duration, retryable: &[u16]) -> Result<Self, String> {
        let url: Uri = url
            .parse()
            .map_err(|e| format!("webhook url `{url}` is not a URL: {e}"))?;
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(timeout));
        http.set_nodelay(true);
        // Lets https:// through the inner connector; plain http:// URLs stay plain.
        http.enforce_http(false);
        let tls = native_tls::TlsConnector::new()
            .map_err(|e| format!("cannot set up TLS for webhook url `{url}`: {e}"))?;
        let connector = HttpsConnector::from((http, tls.into()));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self {
            url,
            timeout,
            retryable: retryable.to_vec(),
            client,
        })
    }

    fn request(&self, message: &ClaimedMessage) -> Result<Request<Full<Bytes>>, String> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(self.url.clone())
            .body(Full::new(Bytes::from(message.payload.clone())))
            .map_err(|e| e.to_string())?;
        let headers = request.headers_mut();
        // The message's own headers, except those that describe this request rather than
        // the message (the connection, the body's framing) and those outboxd sets below.
        for (name, value) in &message.headers {
            let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_bytes(value.as_bytes()),
            ) else {
                continue;
            };
            if !RESERVED.contains(&name.as_str()) {
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
        Ok(request)
    }

    async fn call(&self, message: &ClaimedMessage) -> Handled {
        let request = match self.request(message) {
            Ok(request) => request,
            Err(e) => {
                return Handled::Manual {
                    reason: format!("webhook: cannot build the request: {e}"),
                }
            }
        };
        let response = match tokio::time::timeout(self.timeout, self.client.request(request)).await
        {
            Err(_) => {
                return Handled::Retry {
                    error: format!("webhook {}: no answer within {:?}", self.url, self.timeout),
                    after: None,
                }
            }
            Ok(Err(e)) => {
                return Handled::Retry {
                    error: format!("webhook {}: {}", self.url, with_causes(&e)),
                    after: None,
                }
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if status.is_success() {
            return Handled::Done;
        }
        let retry_after = (response.headers().get(RETRY_AFTER))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = match tokio::time::timeout(self.timeout, response.into_body().collect()).await {
            Ok(Ok(collected)) => collected.to_bytes(),
            _ => Bytes::new(),
        };
        let snippet: String = String::from_utf8_lossy(&body)
            .chars()
            .take(ERROR_BODY_CHARS)
            .collect();
        let error = format!("webhook {} answered {status}: {snippet}", self.url);
        classify(status, &self.retryable, error, retry_after)
    }
}

/// `e` and its causes, `a: b: c`: hyper's client errors say only "client error
/// (Connect)" themselves; the cause (refused, a certificate problem) is further down.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// The outcome of a non-2xx answer.
fn classify(
    status: StatusCode,
    retryable: &[u16],
    error: String,
    retry_after: Option<Duration>,
) -> Handled {
    let code = status.as_u16();
    let retry = status.is_server_error()
        || code == 408
        || code == 429
        || retryable.contains(&code)
        || !status.is_client_error();
    if retry {
        Handled::Retry {
            error,
            after: retry_after,
        }
    } else {
        Handled::Manual { reason: error }
    }
}

impl Handler for WebhookHandler {
    fn handle<'a>(&'a self, message: &'a ClaimedMessage) -> BoxFuture<'a, Handled> {
        Box::pin(self.call(message))
    }

    fn timeout(&self) -> Duration {
        // The request's own timeout, plus reading the error body.
        self.timeout * 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_map_to_outcomes() {
        let retry = |code: u16, listed: &[u16]| {
            matches!(
                classify(
                    StatusCode::from_u16(code).unwrap(),
                    listed,
                    "e".into(),
                    None
                ),
                Handled::Retry { .. }
            )
        };
        for code in [500, 502, 503, 408, 429] {
            assert!(retry(code, &[]), "{code} is retried");
        }
        for code in [400, 401, 404, 409, 422] {
            assert!(!retry(code, &[]), "{code} needs an operator");
        }
        assert!(retry(409, &[409]), "listed 4xx are retried");
        let after = classify(
            StatusCode::TOO_MANY_REQUESTS,
            &[],
            "e".into(),
            Some(Duration::from_secs(7)),
        );
        assert_eq!(
            after,
            Handled::Retry {
                error: "e".into(),
                after: Some(Duration::from_secs(7))
            }
        );
    }
}
