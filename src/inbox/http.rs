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
    let fields = (|| {
        Ok::<_, String>((
            header_text(headers, "message-id")?,
            header_text(headers, "webhook-id")?,
            header_text(headers, "message-type")?,
            header_text(headers, "biz-key")?,
        ))
    })();
    let (message_id, webhook_id, message_type, biz_key) = match fields {
        Ok(fields) => fields,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, e),
    };
    let signed = ingress.secrets.get(&source);
    if let Some(secrets) = signed {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        if let Err(e) = signature::verify(
            secrets,
            header("webhook-id"),
            header("webhook-timestamp"),
            header("webhook-signature"),
            &body,
            ingress.config.timestamp_tolerance,
            SystemTime::now(),
        ) {
            return refuse(StatusCode::UNAUTHORIZED, e);
        }
    }
    // A signed request's id is the signed `webhook-id`: an unsigned Message-Id must not
    // let a captured request be stored again under another id.
    let message_id = if signed.is_some() {
        webhook_id
    } else {
        message_id.or(webhook_id)
    };
    let Some(message_id) = message_id else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "missing Message-Id (or webhook-id) header",
        );
    };
    let json_body = match ingress.ingest.payload_is_json().await {
        Ok(json) => json,
        Err(e) => return refuse(StatusCode::SERVICE_UNAVAILABLE, e),
    };
    let parsed: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
    if json_body && parsed.is_none() {
        return refuse(StatusCode::BAD_REQUEST, "the body is not JSON");
    }
    let body_type = (parsed.as_ref())
        .and_then(|v| v.get("type"))
        .and_then(|t| t.as_str())
        .map(str::to_owned);
    let Some(message_type) = message_type.or(body_type) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "missing Message-Type header (or a top-level \"type\" in the JSON body)",
        );
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
    let biz_key = biz_key.unwrap_or_else(|| format!("{source}:{message_id}"));
    let message = InboxMessage {
        source,
        biz_key,
        message_id,
        message_type,
        payload: body.to_vec(),
        headers: kept,
        rejected: None,
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
