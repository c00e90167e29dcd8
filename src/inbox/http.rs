//! HTTP ingress: `POST /v1/inbox/{source}` on the endpoint of `/metrics`.
//!
//! **Who may post.** A source is refused (401, nothing stored) unless the config names it:
//! with signing secrets (`inbox.http.secrets.<source>` or `secret_files`), every request
//! must carry a valid Standard Webhooks signature; with `[inbox.http.sources.<source>]
//! auth = "none"`, requests are taken unsigned, on purpose (a warning at start says so).
//!
//! **What decides a message's fields.** On a signed source only what the signature covers
//! counts: the id is `webhook-id`, the type is the body's top-level `"type"`, the key is
//! the body's `key_field` when the source sets one (else the id: no ordering). Unsigned
//! headers that say otherwise (`Message-Id`, `Message-Type`, `Biz-Key`) are refused with
//! 400, never silently preferred. On an unsigned source the headers `Message-Id` (or
//! `webhook-id`), `Message-Type` (or the body's `"type"`) and `Biz-Key` (or `key_field`)
//! give them. Either way the stored `biz_key` is `<source>:<key>`: a source's keys live in
//! its own space, so one source can never make another's message a duplicate by
//! `(message_type, biz_key)` nor hold up its keys' order.
//!
//! **Cost.** The head is bounded by the endpoint (8 KiB), the body by `max_body_bytes`,
//! and reading it counts toward `request_timeout`. Checking the signature and reading the
//! body's fields (one pass, no document built: `body_fields.rs`) run on the blocking pool,
//! a few at a time ([`cpu_permits`]), never on the runtime thread that drives the relay.
//!
//! Answers, as a JSON object; refusals carry a short `error` and a `request_id` (also the
//! `Request-Id` header) under which the log has the details, never internal ones in the
//! answer:
//! - 200 `{"id": …, "duplicate": false}` once the row is committed, or
//!   `{"duplicate": true}` when it was stored before;
//! - 400 for a missing, malformed or contradicting field, a body that is not JSON for a
//!   JSON column, or a value the database refuses (a NUL character in JSON text, an id
//!   too long);
//! - 401 for a source that is not configured, or whose signature or timestamp does not
//!   verify;
//! - 413 over `inbox.http.max_body_bytes`;
//! - 503 when the database cannot commit, or the request outlasts
//!   `inbox.http.request_timeout` (the sender retries; it will get a duplicate answer if
//!   the first attempt did commit).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use outboxd_connector::{Connector, InboxMessage, Ingested};
use serde_json::json;
use tokio::sync::Semaphore;

use super::body_fields::{self, BodyFieldsError};
use super::config::{HttpIngressConfig, SourceAuth};
use super::Ingest;
use crate::webhooks::signature::{self, Secret};

/// How one configured source's requests are checked.
#[derive(Clone, Debug)]
pub(crate) struct Source {
    /// Its signing secrets; `None`: unsigned on purpose (`auth = "none"`).
    pub(crate) secrets: Option<Vec<Secret>>,
    /// `key_field`, split at the dots.
    pub(crate) key_path: Option<Vec<String>>,
}

/// State of the route.
struct HttpIngress<C: Connector> {
    ingest: Arc<Ingest<C>>,
    config: HttpIngressConfig,
    sources: HashMap<String, Arc<Source>>,
    /// Requests checked at once on the blocking pool (see [`cpu_permits`]).
    cpu: Arc<Semaphore>,
}

/// Requests whose signature and body are checked at once: half the cores, at least one,
/// so that a flood of large requests leaves a core to the relay's runtime thread (and
/// librdkafka's) instead of queueing dozens of threads beside it.
fn cpu_permits() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

/// The configured sources, by name.
pub(crate) fn sources(config: &HttpIngressConfig) -> Result<HashMap<String, Arc<Source>>, String> {
    let key_path = |name: &str| {
        (config.sources.get(name))
            .and_then(|s| s.key_field.as_deref())
            .map(|field| field.split('.').map(str::to_owned).collect::<Vec<_>>())
    };
    let mut sources = HashMap::new();
    for (name, texts) in &config.secrets {
        let parsed: Result<Vec<Secret>, String> =
            texts.iter().map(|t| Secret::parse(t.expose())).collect();
        let secrets = parsed.map_err(|e| format!("inbox.http.secrets.{name}: {e}"))?;
        let source = Source {
            secrets: Some(secrets),
            key_path: key_path(name),
        };
        sources.insert(name.clone(), Arc::new(source));
    }
    for (name, settings) in &config.sources {
        if settings.auth == SourceAuth::None {
            let source = Source {
                secrets: None,
                key_path: key_path(name),
            };
            sources.insert(name.clone(), Arc::new(source));
        }
    }
    Ok(sources)
}

/// The route, to merge into the endpoint's router.
pub(crate) fn routes<C: Connector + 'static>(
    ingest: Arc<Ingest<C>>,
    config: &HttpIngressConfig,
) -> Result<Router, String> {
    let sources = sources(config)?;
    for (name, source) in &sources {
        if source.secrets.is_none() {
            tracing::warn!(
                source = %name,
                "inbox.http.sources.{name}.auth = \"none\": anyone who can reach metrics.listen \
                 can post messages as this source; sign its requests (inbox.http.secrets.{name}) \
                 unless the endpoint is reachable only by trusted senders"
            );
        }
    }
    let state = Arc::new(HttpIngress {
        ingest,
        config: config.clone(),
        sources,
        cpu: Arc::new(Semaphore::new(cpu_permits())),
    });
    Ok(Router::new()
        .route("/v1/inbox/{source}", post(receive::<C>))
        .with_state(state))
}

/// A header's trimmed text; `None` when absent, an error when empty or not visible ASCII.
fn header_text(headers: &HeaderMap, name: &str) -> Result<Option<String>, String> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => match v.to_str() {
            Ok(s) if !s.trim().is_empty() => Ok(Some(s.trim().to_owned())),
            _ => Err(format!("header {name} must be non-empty visible ASCII")),
        },
    }
}

/// A random id for one request, given to the caller and written with the log lines about
/// it, so a refusal's details can be found without being sent.
fn request_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

fn answer(status: StatusCode, request_id: &str, body: serde_json::Value) -> Response {
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        format!("{body}\n"),
    )
        .into_response();
    if let Ok(value) = HeaderValue::from_str(request_id) {
        response.headers_mut().insert("request-id", value);
    }
    response
}

/// A refusal: a short reason about the request, never about outboxd's insides.
fn refuse(status: StatusCode, request_id: &str, reason: impl std::fmt::Display) -> Response {
    answer(
        status,
        request_id,
        json!({ "error": reason.to_string(), "request_id": request_id }),
    )
}

async fn receive<C: Connector + 'static>(
    State(ingress): State<Arc<HttpIngress<C>>>,
    Path(source): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let id = request_id();
    let timeout = ingress.config.request_timeout;
    // The body is read inside the time limit too, so a slow sender cannot hold one of the
    // endpoint's few connections (shared with /healthz) for longer.
    let within = async {
        // An unknown source costs nothing more than its head: refused before the body.
        let Some(known) = ingress.sources.get(&source).cloned() else {
            // Debug: a flood of such requests must not flood the log too.
            tracing::debug!(request_id = %id, source = %source, "inbox HTTP ingress: unknown source");
            return refuse(
                StatusCode::UNAUTHORIZED,
                &id,
                format!(
                    "source `{source}` is not configured: it needs signing secrets \
                     (inbox.http.secrets) or [inbox.http.sources.<name>] auth = \"none\""
                ),
            );
        };
        let body = match axum::body::to_bytes(body, ingress.config.max_body_bytes).await {
            Ok(body) => body,
            Err(_) => {
                return refuse(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &id,
                    format!(
                        "the body is larger than inbox.http.max_body_bytes = {} or was cut off",
                        ingress.config.max_body_bytes
                    ),
                )
            }
        };
        receive_within(&ingress, source, known, headers, body, &id).await
    };
    match tokio::time::timeout(timeout, within).await {
        Ok(response) => response,
        Err(_) => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            &id,
            format!("not received and stored within {timeout:?}; retry"),
        ),
    }
}

async fn receive_within<C: Connector>(
    ingress: &HttpIngress<C>,
    name: String,
    source: Arc<Source>,
    headers: HeaderMap,
    body: Bytes,
    id: &str,
) -> Response {
    let json_body = match ingress.ingest.payload_is_json().await {
        Ok(json) => json,
        Err(e) => {
            tracing::warn!(request_id = %id, error = %e, "inbox HTTP ingress: cannot open the inbox's store");
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                id,
                "cannot store the message now; retry",
            );
        }
    };
    // The signature and the body's fields cost time in the body's size: off the runtime
    // thread, a few at a time.
    let Ok(permit) = Arc::clone(&ingress.cpu).acquire_owned().await else {
        return refuse(StatusCode::SERVICE_UNAVAILABLE, id, "shutting down; retry");
    };
    let tolerance = ingress.config.timestamp_tolerance;
    let checked = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let now = SystemTime::now();
        to_message(name, &source, &headers, &body, json_body, tolerance, now)
    })
    .await;
    let message = match checked {
        Ok(Ok(message)) => message,
        Ok(Err(Refusal(status, reason))) => {
            tracing::debug!(request_id = %id, %status, %reason, "inbox HTTP ingress: refused");
            return refuse(status, id, reason);
        }
        Err(e) => {
            tracing::error!(request_id = %id, error = %e, "inbox HTTP ingress: the request's check failed");
            return refuse(StatusCode::INTERNAL_SERVER_ERROR, id, "internal error");
        }
    };
    match ingress
        .ingest
        .store(std::slice::from_ref(&message), "http")
        .await
    {
        Ok(outcomes) => match outcomes.first() {
            Some(Ingested::Stored(row)) => {
                answer(StatusCode::OK, id, json!({ "id": row, "duplicate": false }))
            }
            Some(Ingested::Duplicate) => answer(StatusCode::OK, id, json!({ "duplicate": true })),
            None => {
                tracing::error!(request_id = %id, "inbox HTTP ingress: the store answered nothing");
                refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    id,
                    "cannot store the message now; retry",
                )
            }
        },
        Err(e) if e.is_transient() => {
            tracing::warn!(request_id = %id, error = %e, "inbox HTTP ingress: cannot store a message");
            refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                id,
                "cannot store the message now; retry",
            )
        }
        // The database refuses this message for good (a value it cannot hold): sending it
        // again would not help. The database's words stay in the log.
        Err(e) => {
            tracing::warn!(request_id = %id, error = %e, "inbox HTTP ingress: the database refuses a message");
            refuse(
                StatusCode::BAD_REQUEST,
                id,
                "the database refuses a value of this message (an id or key too long, a NUL \
                 character in JSON text, …); it will not be stored",
            )
        }
    }
}

/// Why a request is refused before it reaches the store: the status and a short reason.
#[derive(Debug)]
pub(crate) struct Refusal(pub(crate) StatusCode, pub(crate) String);

fn bad(reason: impl Into<String>) -> Refusal {
    Refusal(StatusCode::BAD_REQUEST, reason.into())
}

/// The message to store for a request to source `name`, checked as the module doc says:
/// signature, then the fields, from the signed body where the source is signed. Pure (the
/// fuzz target `inbox_http` feeds it) and bounded in cost by the body's size; `json_body`
/// when the inbox's payload column is JSON.
pub(crate) fn to_message(
    name: String,
    source: &Source,
    headers: &HeaderMap,
    body: &[u8],
    json_body: bool,
    tolerance: std::time::Duration,
    now: SystemTime,
) -> Result<InboxMessage, Refusal> {
    let message_id_header = header_text(headers, "message-id").map_err(bad)?;
    let webhook_id = header_text(headers, "webhook-id").map_err(bad)?;
    let type_header = header_text(headers, "message-type").map_err(bad)?;
    let key_header = header_text(headers, "biz-key").map_err(bad)?;
    let signed = source.secrets.is_some();
    if let Some(secrets) = &source.secrets {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        signature::verify(
            secrets,
            header("webhook-id"),
            header("webhook-timestamp"),
            header("webhook-signature"),
            body,
            tolerance,
            now,
        )
        .map_err(|e| Refusal(StatusCode::UNAUTHORIZED, e.to_string()))?;
    }
    // A signed request's id is the signed `webhook-id`: an unsigned Message-Id must not
    // let a captured request be stored again under another id.
    let message_id = if signed {
        let id = webhook_id.ok_or_else(|| bad("missing webhook-id header"))?;
        disagrees(
            "Message-Id",
            message_id_header.as_deref(),
            &id,
            "webhook-id",
        )?;
        id
    } else {
        (message_id_header.or(webhook_id))
            .ok_or_else(|| bad("missing Message-Id (or webhook-id) header"))?
    };

    // The body's fields, read only when something needs them; otherwise a JSON payload
    // column still needs the body to be JSON (any value).
    let key_path: Option<Vec<&str>> =
        (source.key_path.as_ref()).map(|p| p.iter().map(String::as_str).collect());
    let needs_fields = signed || type_header.is_none() || key_path.is_some();
    if !needs_fields && json_body && !is_json(body) {
        return Err(bad("the body is not JSON"));
    }
    let (body_type, body_key) = if needs_fields {
        let mut paths: Vec<&[&str]> = vec![&["type"]];
        if let Some(path) = &key_path {
            paths.push(path);
        }
        match body_fields::read(body, &paths) {
            Ok(mut found) => {
                let key = found.get_mut(1).and_then(Option::take);
                let kind = found.get_mut(0).and_then(Option::take);
                (kind, key)
            }
            Err(BodyFieldsError::BadField(e)) => return Err(bad(e)),
            Err(BodyFieldsError::NotJson(_)) if signed => {
                return Err(bad(
                    "a signed request's body must be a JSON object with a top-level \"type\"",
                ))
            }
            Err(BodyFieldsError::NotJson(_)) if key_path.is_some() => {
                return Err(bad("the body is not a JSON object"))
            }
            Err(BodyFieldsError::NotJson(_)) if json_body && !is_json(body) => {
                return Err(bad("the body is not JSON"))
            }
            // JSON, but not an object: it has no fields to read.
            Err(BodyFieldsError::NotJson(_)) => (None, None),
        }
    } else {
        (None, None)
    };

    let message_type = if signed {
        let kind = body_type.ok_or_else(|| {
            bad("a signed request's body must carry its type as a top-level \"type\" string")
        })?;
        disagrees(
            "Message-Type",
            type_header.as_deref(),
            &kind,
            "the signed body's type",
        )?;
        kind
    } else {
        type_header.or(body_type).ok_or_else(|| {
            bad("missing Message-Type header (or a top-level \"type\" in the JSON body)")
        })?
    };

    let key = match (&key_path, body_key) {
        (Some(_), Some(key)) => {
            disagrees(
                "Biz-Key",
                key_header.as_deref(),
                &key,
                "the body's key field",
            )?;
            key
        }
        (Some(path), None) => {
            return Err(bad(format!(
                "the body lacks `{}`, this source's key field",
                path.join(".")
            )))
        }
        (None, _) if signed && key_header.is_some() => {
            return Err(bad(
                "Biz-Key is not covered by the signature: a signed source takes its key from \
                 the body (key_field)",
            ))
        }
        (None, _) => key_header.unwrap_or_else(|| message_id.clone()),
    };

    let forwarded = [
        "webhook-timestamp",
        "content-type",
        "user-agent",
        "traceparent",
        "tracestate",
    ];
    let kept: Vec<(String, String)> = forwarded
        .iter()
        .filter_map(|name| {
            let value = headers.get(*name)?.to_str().ok()?;
            Some(((*name).to_owned(), value.to_owned()))
        })
        .collect();
    // Keys in the source's own space: see the module doc.
    let biz_key = format!("{name}:{key}");
    Ok(InboxMessage {
        source: name,
        biz_key,
        message_id,
        message_type,
        payload: body.to_vec(),
        headers: kept,
        rejected: None,
    })
}

/// Whether `body` is one JSON value (any kind), checked without building it; UTF-8
/// checked first (serde_json does not check the strings it skips).
fn is_json(body: &[u8]) -> bool {
    std::str::from_utf8(body).is_ok()
        && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
}

/// Refuses a header that says something else than what the signature (or the body)
/// decides; the same value is welcome.
fn disagrees(header: &str, given: Option<&str>, decided: &str, what: &str) -> Result<(), Refusal> {
    match given {
        Some(given) if given != decided => Err(bad(format!(
            "header {header} disagrees with {what}; send the same value or leave it out"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::webhooks::signature::sign;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const NOW: u64 = 1_700_000_000;

    fn signed_source(key_field: Option<&str>) -> Source {
        Source {
            secrets: Some(vec![Secret::parse(SECRET).unwrap()]),
            key_path: key_field.map(|f| f.split('.').map(str::to_owned).collect()),
        }
    }

    fn unsigned_source() -> Source {
        Source {
            secrets: None,
            key_path: None,
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn signed_headers(id: &str, body: &[u8], extra: &[(&str, &str)]) -> HeaderMap {
        let sig = sign(SECRET, id, NOW, body).unwrap();
        let ts = NOW.to_string();
        let mut pairs = vec![
            ("webhook-id", id),
            ("webhook-timestamp", ts.as_str()),
            ("webhook-signature", sig.as_str()),
        ];
        pairs.extend_from_slice(extra);
        headers(&pairs)
    }

    fn check(source: &Source, headers: &HeaderMap, body: &[u8]) -> Result<InboxMessage, Refusal> {
        let now = UNIX_EPOCH + Duration::from_secs(NOW);
        to_message(
            "shop".into(),
            source,
            headers,
            body,
            true,
            Duration::from_secs(300),
            now,
        )
    }

    fn refused(result: Result<InboxMessage, Refusal>) -> (u16, String) {
        match result {
            Ok(m) => panic!("accepted: {m:?}"),
            Err(Refusal(status, reason)) => (status.as_u16(), reason),
        }
    }

    /// On a signed source the type and key come from the signed body; the stored key is
    /// in the source's own space.
    #[test]
    fn a_signed_source_takes_its_fields_from_the_signed_body() {
        let body = br#"{"type": "order.paid", "data": {"order_id": "o-7"}}"#;
        let source = signed_source(Some("data.order_id"));
        let message = check(&source, &signed_headers("wh-1", body, &[]), body).unwrap();
        assert_eq!(
            (message.message_id.as_str(), message.message_type.as_str()),
            ("wh-1", "order.paid")
        );
        assert_eq!(message.biz_key, "shop:o-7");
        assert_eq!(message.source, "shop");

        // Headers that agree are welcome; headers that disagree are refused.
        let agreeing = [
            ("Message-Type", "order.paid"),
            ("Biz-Key", "o-7"),
            ("Message-Id", "wh-1"),
        ];
        assert!(check(&source, &signed_headers("wh-1", body, &agreeing), body).is_ok());
        for (name, value) in [
            ("Message-Type", "refund.issued"),
            ("Biz-Key", "victim-key"),
            ("Message-Id", "other-id"),
        ] {
            let (status, reason) = refused(check(
                &source,
                &signed_headers("wh-1", body, &[(name, value)]),
                body,
            ));
            assert_eq!(status, 400, "{name}");
            assert!(
                reason.contains(name) && reason.contains("disagrees"),
                "{reason}"
            );
        }

        // Without a key field: the id is the key, and an unsigned Biz-Key is refused.
        let plain = signed_source(None);
        let message = check(&plain, &signed_headers("wh-2", body, &[]), body).unwrap();
        assert_eq!(message.biz_key, "shop:wh-2");
        let (status, reason) = refused(check(
            &plain,
            &signed_headers("wh-2", body, &[("Biz-Key", "k")]),
            body,
        ));
        assert_eq!(status, 400);
        assert!(reason.contains("not covered by the signature"), "{reason}");

        // A signed body must say its type; the header cannot stand in for it.
        let untyped = br#"{"data": {"order_id": "o-7"}}"#;
        let with_header = signed_headers("wh-3", untyped, &[("Message-Type", "order.paid")]);
        let (status, reason) = refused(check(&source, &with_header, untyped));
        assert_eq!(status, 400);
        assert!(reason.contains("\"type\""), "{reason}");
        // Nor the key.
        let keyless = br#"{"type": "order.paid"}"#;
        let (status, reason) = refused(check(
            &source,
            &signed_headers("wh-4", keyless, &[]),
            keyless,
        ));
        assert_eq!(status, 400);
        assert!(reason.contains("data.order_id"), "{reason}");
    }

    #[test]
    fn a_bad_signature_is_401_before_anything_is_read() {
        let body = br#"{"type": "order.paid"}"#;
        let mut forged = signed_headers("wh-1", body, &[]);
        forged.insert("webhook-signature", HeaderValue::from_static("v1,AAAA"));
        let (status, _) = refused(check(&signed_source(None), &forged, body));
        assert_eq!(status, 401);
        let (status, _) = refused(check(
            &signed_source(None),
            &headers(&[("Message-Id", "m")]),
            body,
        ));
        assert_eq!(status, 401, "no signature at all");
    }

    /// An unsigned source (opted in) takes the headers, and its keys stay its own.
    #[test]
    fn an_unsigned_source_takes_headers_in_its_own_key_space() {
        let body = br#"{"paid": 10}"#;
        let h = headers(&[
            ("Message-Id", "m-1"),
            ("Message-Type", "payment.settled"),
            ("Biz-Key", "o-1"),
            ("Authorization", "Bearer x"),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        ]);
        let message = check(&unsigned_source(), &h, body).unwrap();
        assert_eq!(message.biz_key, "shop:o-1");
        assert_eq!(message.message_type, "payment.settled");
        let names: Vec<&str> = message.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["traceparent"], "only the kept headers are stored");
        let (status, _) = refused(check(
            &unsigned_source(),
            &headers(&[("Message-Id", "m")]),
            b"{}",
        ));
        assert_eq!(status, 400, "no type anywhere");
        let (status, _) = refused(check(
            &unsigned_source(),
            &headers(&[("Message-Id", "m"), ("Message-Type", "t")]),
            b"{not json",
        ));
        assert_eq!(status, 400, "not JSON for a JSON column");
        // Any JSON value is a payload when no field is read from it.
        let typed = headers(&[("Message-Id", "m"), ("Message-Type", "t")]);
        for body in [&b"[1, 2]"[..], b"\"text\"", b"7"] {
            assert!(check(&unsigned_source(), &typed, body).is_ok());
        }
        let (status, _) = refused(check(&unsigned_source(), &typed, b"[1, \"\xf6\"]"));
        assert_eq!(status, 400, "not UTF-8");
    }
}
