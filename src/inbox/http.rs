//! HTTP ingress: `POST /v1/inbox/{source}` on the endpoint of `/metrics`.
//!
//! Headers: `Message-Id` (or Standard Webhooks' `webhook-id`, the only id of a source with
//! secrets), `Message-Type` (or the body's top-level `"type"`, as Standard Webhooks
//! payloads carry it), `Biz-Key` (default: `<source>:<message id>`, i.e. no ordering
//! between messages). The body is the payload.
//!
//! Answers, as a JSON object:
//! - 200 `{"id": …, "duplicate": false}` once the row is committed, or
//!   `{"duplicate": true}` when it was stored before;
//! - 400 for a missing or malformed field, a body that is not JSON for a JSON column, or
//!   a value the database refuses (a NUL character in JSON text, an id too long);
//! - 401 when the source has secrets and the signature or timestamp does not verify;
//! - 413 over `inbox.http.max_body_bytes`;
//! - 503 when the database cannot commit, or the request outlasts
//!   `inbox.http.request_timeout` (the sender retries; it will get a duplicate answer if
//!   the first attempt did commit).
//!
//! The request head is bounded by the endpoint (8 KiB), the body by the limit above, and
//! reading the body counts toward `request_timeout`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use outboxd_connector::{Connector, InboxMessage, Ingested};
use serde_json::json;

use super::config::HttpIngressConfig;
use super::signature::{self, Secret};
use super::Ingest;

/// State of the route.
struct HttpIngress<C: Connector> {
    ingest: Arc<Ingest<C>>,
    config: HttpIngressConfig,
    secrets: HashMap<String, Vec<Secret>>,
}

/// The route, to merge into the endpoint's router.
pub(crate) fn routes<C: Connector + 'static>(
    ingest: Arc<Ingest<C>>,
    config: &HttpIngressConfig,
) -> Result<Router, String> {
    let mut secrets = HashMap::new();
    for (source, texts) in &config.secrets {
        let parsed: Result<Vec<Secret>, String> =
            texts.iter().map(|t| Secret::parse(t.expose())).collect();
        secrets.insert(
            source.clone(),
            parsed.map_err(|e| format!("inbox.http.secrets.{source}: {e}"))?,
        );
    }
    let state = Arc::new(HttpIngress {
        ingest,
        config: config.clone(),
        secrets,
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

fn answer(status: StatusCode, body: serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        format!("{body}\n"),
    )
        .into_response()
}

fn refuse(status: StatusCode, error: impl std::fmt::Display) -> Response {
    answer(status, json!({ "error": error.to_string() }))
}

async fn receive<C: Connector + 'static>(
    State(ingress): State<Arc<HttpIngress<C>>>,
    Path(source): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let timeout = ingress.config.request_timeout;
    // The body is read inside the time limit too, so a slow sender cannot hold one of the
    // endpoint's few connections (shared with /healthz) for longer.
    let within = async {
        let body = match axum::body::to_bytes(body, ingress.config.max_body_bytes).await {
            Ok(body) => body,
            Err(e) => {
                return refuse(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "the body could not be read within inbox.http.max_body_bytes = {}: {e}",
                        ingress.config.max_body_bytes
                    ),
                )
            }
        };
        receive_within(&ingress, source, &headers, body).await
    };
    match tokio::time::timeout(timeout, within).await {
        Ok(response) => response,
        Err(_) => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not received and stored within {timeout:?}; retry"),
        ),
    }
}

async fn receive_within<C: Connector>(
    ingress: &HttpIngress<C>,
    source: String,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let signed = ingress.secrets.get(&source).map(Vec::as_slice);
    let fields = match checked_headers(
        headers,
        &body,
        signed,
        ingress.config.timestamp_tolerance,
        SystemTime::now(),
    ) {
        Ok(fields) => fields,
        Err(Refusal(status, e)) => return refuse(status, e),
    };
    let json_body = match ingress.ingest.payload_is_json().await {
        Ok(json) => json,
        Err(e) => return refuse(StatusCode::SERVICE_UNAVAILABLE, e),
    };
    let message = match to_message(source, fields, headers, &body, json_body) {
        Ok(message) => message,
        Err(Refusal(status, e)) => return refuse(status, e),
    };
    match ingress
        .ingest
        .store(std::slice::from_ref(&message), "http")
        .await
    {
        Ok(outcomes) => match outcomes.first() {
            Some(Ingested::Stored(id)) => {
                answer(StatusCode::OK, json!({ "id": id, "duplicate": false }))
            }
            Some(Ingested::Duplicate) => answer(StatusCode::OK, json!({ "duplicate": true })),
            None => refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "the store answered nothing",
            ),
        },
        Err(e) if e.is_transient() => {
            tracing::warn!(error = %e, "inbox HTTP ingress: cannot store a message");
            refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "cannot store the message now; retry",
            )
        }
        // The database refuses this message for good (a value it cannot hold): sending it
        // again would not help.
        Err(e) => refuse(
            StatusCode::BAD_REQUEST,
            format!("the message cannot be stored: {}", e.message()),
        ),
    }
}

/// Why a request is refused before it reaches the store: the status and the error.
#[derive(Debug)]
pub(crate) struct Refusal(pub(crate) StatusCode, pub(crate) String);

/// What the headers say, once checked.
#[derive(Clone, Debug)]
pub(crate) struct Fields {
    message_id: String,
    message_type: Option<String>,
    biz_key: Option<String>,
}

/// Checks a request's headers, and its signature when the source has `secrets`. Pure (the
/// fuzz target `inbox_http` feeds it), and done before anything asks the database.
pub(crate) fn checked_headers(
    headers: &HeaderMap,
    body: &[u8],
    secrets: Option<&[Secret]>,
    tolerance: std::time::Duration,
    now: SystemTime,
) -> Result<Fields, Refusal> {
    let bad = |e: String| Refusal(StatusCode::BAD_REQUEST, e);
    let message_id = header_text(headers, "message-id").map_err(bad)?;
    let webhook_id = header_text(headers, "webhook-id").map_err(bad)?;
    let message_type = header_text(headers, "message-type").map_err(bad)?;
    let biz_key = header_text(headers, "biz-key").map_err(bad)?;
    if let Some(secrets) = secrets {
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
    let message_id = if secrets.is_some() {
        webhook_id
    } else {
        message_id.or(webhook_id)
    };
    let message_id = message_id.ok_or_else(|| {
        Refusal(
            StatusCode::BAD_REQUEST,
            "missing Message-Id (or webhook-id) header".into(),
        )
    })?;
    Ok(Fields {
        message_id,
        message_type,
        biz_key,
    })
}

/// The message to store for a request whose headers passed [`checked_headers`];
/// `json_body` when the inbox's payload column is JSON. Pure.
pub(crate) fn to_message(
    source: String,
    fields: Fields,
    headers: &HeaderMap,
    body: &[u8],
    json_body: bool,
) -> Result<InboxMessage, Refusal> {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    if json_body && parsed.is_none() {
        return Err(Refusal(
            StatusCode::BAD_REQUEST,
            "the body is not JSON".into(),
        ));
    }
    let body_type = (parsed.as_ref())
        .and_then(|v| v.get("type"))
        .and_then(|t| t.as_str())
        .map(str::to_owned);
    let Some(message_type) = fields.message_type.or(body_type) else {
        return Err(Refusal(
            StatusCode::BAD_REQUEST,
            "missing Message-Type header (or a top-level \"type\" in the JSON body)".into(),
        ));
    };
    let forwarded = [
        "webhook-timestamp",
        "content-type",
        "user-agent",
        "traceparent",
    ];
    let kept: Vec<(String, String)> = forwarded
        .iter()
        .filter_map(|name| {
            let value = headers.get(*name)?.to_str().ok()?;
            Some(((*name).to_owned(), value.to_owned()))
        })
        .collect();
    // Without a key, no ordering: each message its own key, unique across sources so that
    // (message_type, biz_key) cannot make one source's message a duplicate of another's.
    let message_id = fields.message_id;
    let biz_key = fields
        .biz_key
        .unwrap_or_else(|| format!("{source}:{message_id}"));
    Ok(InboxMessage {
        source,
        biz_key,
        message_id,
        message_type,
        payload: body.to_vec(),
        headers: kept,
        rejected: None,
    })
}
