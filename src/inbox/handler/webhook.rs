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

/// Message headers copied onto every request: the trace context. Others only when the
/// handler's `forward_headers` names them: a message's headers come from outside (a Kafka
/// record's producer, an HTTP sender) and must not set what the user's service trusts.
const FORWARDED: [&str; 2] = ["traceparent", "tracestate"];

/// Headers never copied from a message, whatever `forward_headers` says: credentials and
/// what proxies and servers trust about the client, hop-by-hop and framing headers (they
/// describe a connection or a body, not the message), and the ones outboxd sets itself.
const NEVER_FORWARDED: [&str; 22] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "host",
    "forwarded",
    "x-real-ip",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
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

/// Header name prefixes never copied (`X-Forwarded-For`, `-Host`, `-Proto`, …).
const NEVER_FORWARDED_PREFIXES: [&str; 2] = ["x-forwarded-", "inbox-"];

/// Whether `name` may be listed in `forward_headers` (a name, or a prefix ending in `*`).
pub(crate) fn check_forwardable(name: &str) -> Result<(), String> {
    let lower = name.to_ascii_lowercase();
    let stem = lower.strip_suffix('*').unwrap_or(&lower);
    if stem.is_empty() || HeaderName::from_bytes(stem.as_bytes()).is_err() {
        return Err(format!(
            "`{name}` is not a header name (or a prefix ending in *)"
        ));
    }
    let prefix = lower.ends_with('*');
    // The name, or any name the prefix covers, is never forwarded.
    let covers = |header: &str| header == stem || (prefix && header.starts_with(stem));
    let never = NEVER_FORWARDED.iter().any(|n| covers(n))
        || NEVER_FORWARDED_PREFIXES
            .iter()
            .any(|p| stem.starts_with(p) || (prefix && p.starts_with(stem)));
    if never {
        return Err(format!(
            "`{name}` covers a header outboxd never copies from a message (credentials, \
             proxy, hop-by-hop or its own headers)"
        ));
    }
    Ok(())
}

/// Whether a message header may go onto the request, given the handler's list.
fn forwarded(name: &str, extra: &[String]) -> bool {
    let never = NEVER_FORWARDED.contains(&name)
        || NEVER_FORWARDED_PREFIXES.iter().any(|p| name.starts_with(p));
    !never
        && (FORWARDED.contains(&name)
            || extra.iter().any(|e| match e.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => name == e,
            }))
}

/// `url` with only what identifies the service: scheme, host and port. Its path, query
/// and credentials often carry a secret (a token in the path, `?key=`): they never reach
/// the log or `last_error`, which operators and the console show.
pub(crate) fn redacted(url: &Uri) -> String {
    let scheme = url.scheme_str().unwrap_or("http");
    let host = url.host().unwrap_or("?");
    let port = url.port_u16().map(|p| format!(":{p}")).unwrap_or_default();
    let path = if url.path_and_query().is_some_and(|p| p.as_str() != "/") {
        "/…"
    } else {
        ""
    };
    format!("{scheme}://{host}{port}{path}")
}

/// Of the answer's body, at most this many bytes are read (for `last_error`); the rest is
/// never received, whatever the service sends.
const ERROR_BODY_BYTES: usize = 4 * 1024;

/// Of the answer's body, at most this much goes into `last_error`.
const ERROR_BODY_CHARS: usize = 200;

/// POSTs each message to one URL.
#[derive(Clone, Debug)]
pub struct WebhookHandler {
    url: Uri,
    /// `url` as logs and `last_error` show it ([`redacted`]).
    shown: String,
    forward: Vec<String>,
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
            .map_err(|e| format!("cannot set up TLS for webhook url {}: {e}", redacted(&url)))?;
        let connector = HttpsConnector::from((http, tls.into()));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self {
            shown: redacted(&url),
            url,
            forward: Vec::new(),
            timeout,
            retryable: retryable.to_vec(),
            client,
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

    fn request(&self, message: &ClaimedMessage) -> Result<Request<Full<Bytes>>, String> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(self.url.clone())
            .body(Full::new(Bytes::from(message.payload.clone())))
            .map_err(|e| e.to_string())?;
        let headers = request.headers_mut();
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
                    error: format!(
                        "webhook {}: no answer within {:?}",
                        self.shown, self.timeout
                    ),
                    after: None,
                }
            }
            Ok(Err(e)) => {
                return Handled::Retry {
                    error: format!("webhook {}: {}", self.shown, with_causes(&e)),
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
        let body = tokio::time::timeout(self.timeout, first_bytes(response.into_body()))
            .await
            .unwrap_or_default();
        let snippet: String = String::from_utf8_lossy(&body)
            .chars()
            .take(ERROR_BODY_CHARS)
            .collect();
        let error = format!("webhook {} answered {status}: {snippet}", self.shown);
        classify(status, &self.retryable, error, retry_after)
    }
}

/// The first [`ERROR_BODY_BYTES`] of `body` (fewer if it ends or fails first); the
/// connection is dropped with the rest unread.
async fn first_bytes(mut body: hyper::body::Incoming) -> Vec<u8> {
    let mut kept = Vec::new();
    while kept.len() < ERROR_BODY_BYTES {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let room = ERROR_BODY_BYTES - kept.len();
                    kept.extend_from_slice(&data[..data.len().min(room)]);
                }
            }
            _ => break,
        }
    }
    kept
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

    /// Only the trace context and the listed headers reach the user's service; never
    /// credentials, proxy or hop-by-hop headers, whatever the message or the list says.
    #[test]
    fn only_allowed_headers_are_forwarded() {
        let listed = vec!["x-shop-*".to_owned(), "ce-id".to_owned()];
        for name in ["traceparent", "tracestate", "x-shop-tenant", "ce-id"] {
            assert!(forwarded(name, &listed), "{name}");
        }
        for name in [
            "authorization",
            "cookie",
            "host",
            "x-forwarded-for",
            "x-forwarded-host",
            "connection",
            "transfer-encoding",
            "biz-key",
            "user-agent",
            "ce-source",
        ] {
            assert!(!forwarded(name, &listed), "{name}");
        }
        for ok in ["x-shop-*", "ce-id", "X-Tenant"] {
            assert_eq!(check_forwardable(ok), Ok(()), "{ok}");
        }
        for refused in [
            "Authorization",
            "cookie",
            "x-forwarded-for",
            "x-forwarded-*",
            "x-*",
            "*",
            "",
            "a b",
            "inbox-attempt",
        ] {
            assert!(check_forwardable(refused).is_err(), "{refused}");
        }
    }

    /// A webhook URL's path, query and credentials never reach the log or `last_error`.
    #[test]
    fn urls_are_shown_without_their_secrets() {
        let shown = |url: &str| redacted(&url.parse().unwrap());
        assert_eq!(
            shown("https://user:pw@hooks.example.com:8443/T000/B000/XXXXSECRET?token=abc"),
            "https://hooks.example.com:8443/…"
        );
        assert_eq!(shown("http://127.0.0.1:9000/"), "http://127.0.0.1:9000");
        assert_eq!(shown("http://svc"), "http://svc");
    }

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
