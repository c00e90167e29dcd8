//! Outbound HTTP, for the inbox's webhook handler and the HTTP sink alike: one pooled
//! client per destination, a POST bounded in time, the answer's body read only up to a
//! bound, URLs shown without their secrets, and the rules for which of a message's own
//! headers may go onto a request.
//!
//! hyper's pooled client keeps connections open between requests: HTTP/2 where an
//! `https://` endpoint offers it (ALPN), else HTTP/1.1 with keep-alive.
//! Redirects are never followed: a 3xx is an answer like any other. An `https://` URL is
//! verified as a browser would: the server's certificate must chain to the system's
//! trusted roots and name the URL's host (OpenSSL through `native-tls`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderMap, HeaderName, RETRY_AFTER};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_tls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

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

/// Whether `name` may be listed in a `forward_headers` (a name, or a prefix ending in `*`).
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

/// Whether a message header may go onto a request, given the configured list.
pub(crate) fn forwarded(name: &str, extra: &[String]) -> bool {
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

/// A pooled client that POSTs to one URL (several requests at once share its connections).
#[derive(Clone, Debug)]
pub(crate) struct Poster {
    url: Uri,
    /// `url` as logs and `last_error` show it ([`redacted`]).
    shown: String,
    timeout: Duration,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// The client's connector, for [`Poster::probe`].
    connector: HttpsConnector<HttpConnector>,
}

/// PEM files for an endpoint's TLS: a private CA, and a client certificate with its key.
#[derive(Clone, Debug, Default)]
pub(crate) struct TlsFiles {
    /// Certificates (one or more, PEM) trusted besides the system's roots.
    pub(crate) ca_file: Option<std::path::PathBuf>,
    /// The client's certificate chain (PEM) and its PKCS#8 key (PEM).
    pub(crate) client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl TlsFiles {
    fn connector(&self) -> Result<native_tls::TlsConnector, String> {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
        };
        let mut builder = native_tls::TlsConnector::builder();
        // HTTP/2 where the endpoint offers it (ALPN), else HTTP/1.1 with keep-alive.
        builder.request_alpns(&["h2", "http/1.1"]);
        if let Some(path) = &self.ca_file {
            let pem = read(path)?;
            let mut found = 0;
            for block in pem_blocks(&pem, "CERTIFICATE") {
                let cert = native_tls::Certificate::from_pem(&block)
                    .map_err(|e| format!("{}: not a PEM certificate: {e}", path.display()))?;
                builder.add_root_certificate(cert);
                found += 1;
            }
            if found == 0 {
                return Err(format!("{}: no PEM certificate in it", path.display()));
            }
        }
        if let Some((cert, key)) = &self.client_cert {
            let identity =
                native_tls::Identity::from_pkcs8(&read(cert)?, &read(key)?).map_err(|e| {
                    format!(
                        "{} and {}: not a PEM certificate and PKCS#8 key (`openssl pkcs8 \
                         -topk8 -nocrypt` converts an RSA key): {e}",
                        cert.display(),
                        key.display()
                    )
                })?;
            builder.identity(identity);
        }
        builder.build().map_err(|e| e.to_string())
    }
}

/// Each `-----BEGIN <label>-----` … `-----END <label>-----` block of `pem`, whole.
fn pem_blocks(pem: &[u8], label: &str) -> Vec<Vec<u8>> {
    let text = String::from_utf8_lossy(pem);
    let (begin, end) = (
        format!("-----BEGIN {label}-----"),
        format!("-----END {label}-----"),
    );
    let mut blocks = Vec::new();
    let mut rest = text.as_ref();
    while let Some(start) = rest.find(&begin) {
        let Some(stop) = rest[start..].find(&end) else {
            break;
        };
        let stop = start + stop + end.len();
        blocks.push(rest.as_bytes()[start..stop].to_vec());
        rest = &rest[stop..];
    }
    blocks
}

/// What a POST came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A 2xx, after `latency`.
    Accepted {
        /// The status code.
        status: u16,
        /// From sending the request to the answer's head.
        latency: Duration,
    },
    /// Try again later: 408, 425, 429, 5xx (and any other code the caller lists), no
    /// answer within the timeout, or no connection. `after`: the answer's `Retry-After`
    /// in seconds, when it gave one.
    Retry {
        /// What happened, for `last_error`: the URL without secrets, the status and the
        /// start of the answer's body, or the connection error.
        error: String,
        /// The answer's `Retry-After`.
        after: Option<Duration>,
        /// The answer's status code; `None` when no answer came.
        status: Option<u16>,
    },
    /// The request itself is wrong and will stay wrong: another 4xx, or a redirect (never
    /// followed).
    Refused {
        /// As for [`Answer::Retry`].
        error: String,
        /// The answer's status code.
        status: u16,
    },
}

impl Answer {
    /// The answer's status code; `None` when no answer came.
    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            Self::Accepted { status, .. } | Self::Refused { status, .. } => Some(*status),
            Self::Retry { status, .. } => *status,
        }
    }
}

impl Poster {
    /// A client for `url` (http:// or https://) whose requests wait at most `timeout`
    /// (connecting included) for an answer.
    pub(crate) fn new(url: &str, timeout: Duration) -> Result<Self, String> {
        Self::with_tls(url, timeout, &TlsFiles::default())
    }

    /// As [`Poster::new`], with a private CA's certificates trusted besides the system's,
    /// and a client certificate for endpoints that ask for one (PEM files, read now).
    pub(crate) fn with_tls(url: &str, timeout: Duration, files: &TlsFiles) -> Result<Self, String> {
        let url: Uri = url
            .parse()
            .map_err(|e| format!("url `{url}` is not a URL: {e}"))?;
        if !matches!(url.scheme_str(), Some("http" | "https")) || url.host().is_none() {
            return Err(format!(
                "url {} must be http:// or https:// with a host",
                redacted(&url)
            ));
        }
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(timeout));
        http.set_nodelay(true);
        // Lets https:// through the inner connector; plain http:// URLs stay plain.
        http.enforce_http(false);
        let tls = files
            .connector()
            .map_err(|e| format!("cannot set up TLS for url {}: {e}", redacted(&url)))?;
        let connector = HttpsConnector::from((http, tls.into()));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector.clone());
        Ok(Self {
            shown: redacted(&url),
            url,
            timeout,
            client,
            connector,
        })
    }

    /// The URL as logs and `last_error` show it.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// How long a request may wait for its answer.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether the URL's host resolves, a connection opens and, for `https://`, the TLS
    /// handshake verifies the server, each within `timeout`; no request is sent. What it
    /// found (`"TLS verified, h2"`), or which step failed and why.
    pub(crate) async fn probe(&self, timeout: Duration) -> Result<String, String> {
        use tower_service::Service as _;
        let host = self.url.host().unwrap_or_default().trim_matches(['[', ']']);
        let https = self.url.scheme_str() == Some("https");
        let port = self.url.port_u16().unwrap_or(if https { 443 } else { 80 });
        let addresses =
            match tokio::time::timeout(timeout, tokio::net::lookup_host((host, port))).await {
                Err(_) => return Err(format!("DNS: `{host}` not resolved within {timeout:?}")),
                Ok(Err(e)) => return Err(format!("DNS: cannot resolve `{host}`: {e}")),
                Ok(Ok(addresses)) => addresses.count(),
            };
        let mut connector = self.connector.clone();
        let connecting = async {
            std::future::poll_fn(|cx| connector.poll_ready(cx)).await?;
            connector.call(self.url.clone()).await
        };
        let stream = match tokio::time::timeout(timeout, connecting).await {
            Err(_) => return Err(format!("no connection within {timeout:?}")),
            Ok(Err(e)) => {
                let what = if https { "connect or TLS" } else { "connect" };
                return Err(format!("{what}: {}", with_causes(e.as_ref())));
            }
            Ok(Ok(stream)) => stream,
        };
        let resolved = format!("{addresses} address(es)");
        Ok(match stream {
            hyper_tls::MaybeHttpsStream::Http(_) => format!("{resolved}, connected (plain HTTP)"),
            hyper_tls::MaybeHttpsStream::Https(tls) => {
                let alpn = (tls.inner().get_ref().negotiated_alpn().ok().flatten())
                    .map(|p| String::from_utf8_lossy(&p).into_owned())
                    .unwrap_or_else(|| "http/1.1".into());
                format!("{resolved}, TLS verified, {alpn}")
            }
        })
    }

    /// POSTs `body` with `headers`; `also_retried` are 4xx codes the caller retries too.
    pub(crate) async fn post(
        &self,
        headers: HeaderMap,
        body: Bytes,
        also_retried: &[u16],
    ) -> Answer {
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.url.clone();
        *request.headers_mut() = headers;
        let started = Instant::now();
        let response = match tokio::time::timeout(self.timeout, self.client.request(request)).await
        {
            Err(_) => {
                return Answer::Retry {
                    error: format!("{}: no answer within {:?}", self.shown, self.timeout),
                    after: None,
                    status: None,
                }
            }
            Ok(Err(e)) => {
                return Answer::Retry {
                    error: format!("{}: {}", self.shown, with_causes(&e)),
                    after: None,
                    status: None,
                }
            }
            Ok(Ok(response)) => response,
        };
        let latency = started.elapsed();
        let status = response.status();
        if status.is_success() {
            return Answer::Accepted {
                status: status.as_u16(),
                latency,
            };
        }
        let after = (response.headers().get(RETRY_AFTER))
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
        let error = format!("{} answered {status}: {snippet}", self.shown);
        classify(status, also_retried, error, after)
    }
}

/// The meaning of a non-2xx answer.
fn classify(
    status: StatusCode,
    also_retried: &[u16],
    error: String,
    after: Option<Duration>,
) -> Answer {
    let code = status.as_u16();
    let retry = status.is_server_error()
        || matches!(code, 408 | 425 | 429)
        || also_retried.contains(&code)
        || status.is_informational();
    if retry {
        Answer::Retry {
            error,
            after,
            status: Some(code),
        }
    } else {
        Answer::Refused {
            error,
            status: code,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the trace context and the listed headers pass; never credentials, proxy or
    /// hop-by-hop headers, whatever the message or the list says.
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

    /// A URL's path, query and credentials never reach the log or `last_error`.
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
    fn answers_are_classified() {
        let retried = |code: u16, listed: &[u16]| {
            let status = StatusCode::from_u16(code).unwrap();
            matches!(
                classify(status, listed, "e".into(), None),
                Answer::Retry { .. }
            )
        };
        for code in [500, 502, 503, 408, 425, 429] {
            assert!(retried(code, &[]), "{code} is retried");
        }
        for code in [301, 302, 307, 400, 401, 404, 409, 422] {
            assert!(!retried(code, &[]), "{code} needs an operator");
        }
        assert!(retried(409, &[409]), "listed 4xx are retried");
        let after = classify(
            StatusCode::TOO_MANY_REQUESTS,
            &[],
            "e".into(),
            Some(Duration::from_secs(7)),
        );
        assert_eq!(
            after,
            Answer::Retry {
                error: "e".into(),
                after: Some(Duration::from_secs(7)),
                status: Some(429),
            }
        );
    }
}
