//! The HTTP sink: each outbox event POSTed to an endpoint of `[http.endpoints]`, as a
//! Standard Webhooks message: `webhook-id` is the row's `message_id`, `webhook-timestamp`
//! the sending time, `webhook-signature` one `v1,` HMAC-SHA256 entry per configured
//! secret; `Idempotency-Key` is the `message_id` too, `Message-Type` and `Biz-Key` the
//! row's; the body is the payload (or the envelope of `http.body`); the row's trace
//! context and the headers `http.forward_headers` lists go along.
//!
//! The answer decides the row, as Kafka's does: 2xx → SUCCESS (the row's
//! `kafka_partition` holds the HTTP status and `kafka_offset` the answer's latency in
//! milliseconds); no answer, 408, 425, 429 or 5xx → FAILED with backoff (or the answer's
//! `Retry-After`); another 4xx or a redirect (never followed) → MANUAL_REQUIRED at once
//! ([`FailureKind::Refused`]) with the status and the start of the answer's body. Order,
//! concurrency and outages per endpoint: `endpoint.rs`; the requests run on the sink's own
//! thread: `io_thread.rs`.
//!
//! The endpoint of an event is a name: the row's `topic` column when set, else
//! `http.endpoint_template`; its URL comes from the config, never from a row. HTTP has
//! no transactions: `delivery.exactly_once` needs Kafka.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use outboxd_connector::{CheckLine, OutboxEvent};

use crate::observability::endpoint_metrics::EndpointMetrics;
use crate::sink::kafka::TopicTemplate;
use crate::sink::{FailureKind, Sink, SinkFailure, SinkResult};
use crate::webhooks::client::{forwarded, Poster};
use crate::webhooks::signature::Secret;

pub mod config;
mod endpoint;
mod io_thread;

pub use config::{BodyFormat, EndpointConfig, HttpSinkConfig};
use endpoint::{Endpoint, Prepared, Queued};

/// See the module documentation.
pub struct HttpSink {
    template: TopicTemplate,
    pipeline: String,
    endpoints: BTreeMap<String, Arc<Endpoint>>,
    body: BodyFormat,
    forward: Vec<String>,
    in_flight: Arc<AtomicI64>,
    metrics: EndpointMetrics,
    /// Declared last: dropped after the endpoints, whose tasks run on it.
    _io: io_thread::IoThread,
}

impl HttpSink {
    /// The sink of `config` for `pipeline`, whose outbox tables are `tables` (for the
    /// template's `{schema}` and `{table}`). `strict`: a key's request is not sent after
    /// an earlier one of its key failed.
    pub fn new(
        config: &HttpSinkConfig,
        pipeline: &str,
        strict: bool,
        tables: &[String],
    ) -> Result<Self, String> {
        let rename = |e: String| e.replace("kafka.topic_template", "http.endpoint_template");
        let template = TopicTemplate::parse(&config.endpoint_template)
            .and_then(|t| t.with_tables(tables))
            .map_err(rename)?;
        let metrics = EndpointMetrics::default();
        let io = io_thread::IoThread::start()?;
        let mut endpoints = BTreeMap::new();
        for (name, endpoint) in &config.endpoints {
            let poster = endpoint
                .tls()
                .and_then(|tls| Poster::with_tls(&endpoint.url, config.timeout, &tls))
                .map_err(|e| format!("http.endpoints.{name}.{e}"))?;
            let secrets = (endpoint.secrets.iter())
                .map(|s| Secret::parse(s.expose()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("http.endpoints.{name}.secrets: {e}"))?;
            let endpoint = Endpoint::new(
                name,
                endpoint,
                poster,
                secrets,
                strict,
                metrics.endpoint(name),
                io.handle().clone(),
            );
            endpoints.insert(name.clone(), Arc::new(endpoint));
        }
        Ok(Self {
            template,
            pipeline: pipeline.to_owned(),
            endpoints,
            body: config.body,
            forward: (config.forward_headers.iter())
                .map(|n| n.to_ascii_lowercase())
                .collect(),
            in_flight: Arc::new(AtomicI64::new(0)),
            metrics,
            _io: io,
        })
    }

    /// The endpoint name of `event`: its `topic` column, else the template's.
    fn endpoint_name(&self, event: &OutboxEvent) -> String {
        match event.topic.as_deref().filter(|t| !t.is_empty()) {
            Some(named) => named.to_owned(),
            None => self.template.render(event, &self.pipeline),
        }
    }

    /// The request for `event`, but for its signature and timestamp.
    fn prepare(&self, event: &OutboxEvent) -> Result<Prepared, String> {
        let mut headers = HeaderMap::new();
        let mut content_type = None;
        for (name, value) in &event.headers {
            let lower = name.to_ascii_lowercase();
            if lower == "content-type" {
                content_type = Some(value.clone());
                continue;
            }
            // Standard Webhooks' own headers are the sink's to set, never a row's.
            if lower.starts_with("webhook-") {
                continue;
            }
            let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(lower.as_bytes()),
                HeaderValue::from_bytes(value),
            ) else {
                continue;
            };
            if forwarded(name.as_str(), &self.forward) {
                headers.append(name, value);
            }
        }
        let text = |what: &str, value: &str| {
            HeaderValue::from_bytes(value.as_bytes())
                .map_err(|_| format!("its {what} cannot be an HTTP header value"))
        };
        headers.insert("webhook-id", text("message_id", &event.message_id)?);
        headers.insert("idempotency-key", text("message_id", &event.message_id)?);
        headers.insert("message-type", text("message_type", &event.message_type)?);
        headers.insert("biz-key", text("biz_key", &event.biz_key)?);
        let body = match self.body {
            BodyFormat::Payload => {
                let content_type = match content_type {
                    Some(value) => HeaderValue::from_bytes(&value)
                        .map_err(|_| "its content-type header is not a header value")?,
                    None => HeaderValue::from_static("application/json"),
                };
                headers.insert(CONTENT_TYPE, content_type);
                event.payload.clone()
            }
            BodyFormat::Envelope => {
                headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                envelope(event)
            }
        };
        Ok(Prepared {
            key: event.key.clone(),
            message_id: event.message_id.clone(),
            headers,
            body,
        })
    }
}

/// `{"type", "timestamp", "key", "data"}`: the payload as JSON when it is JSON, else as
/// `data_base64`.
fn envelope(event: &OutboxEvent) -> Bytes {
    use base64::Engine as _;
    let mut object = serde_json::Map::new();
    object.insert("type".into(), event.message_type.clone().into());
    object.insert("timestamp".into(), event.created_at.clone().into());
    object.insert("key".into(), event.biz_key.clone().into());
    match serde_json::from_slice::<serde_json::Value>(&event.payload) {
        Ok(data) => object.insert("data".into(), data),
        Err(_) => object.insert(
            "data_base64".into(),
            base64::engine::general_purpose::STANDARD
                .encode(&event.payload)
                .into(),
        ),
    };
    Bytes::from(serde_json::Value::Object(object).to_string())
}

/// The outcome of one request.
pub struct HttpDelivery(Delivery);

enum Delivery {
    Queued(Queued),
    Decided(Option<SinkResult>),
}

impl Future for HttpDelivery {
    type Output = SinkResult;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<SinkResult> {
        match &mut self.0 {
            Delivery::Decided(result) => Poll::Ready(result.take().unwrap_or_else(|| {
                Err(SinkFailure {
                    kind: FailureKind::Fatal,
                    error: "an HTTP delivery was polled after it completed".into(),
                    retry_after: None,
                })
            })),
            Delivery::Queued(queued) => {
                let Poll::Ready(result) = queued.poll_outcome(cx) else {
                    return Poll::Pending;
                };
                self.0 = Delivery::Decided(None);
                Poll::Ready(result)
            }
        }
    }
}

impl Drop for HttpDelivery {
    fn drop(&mut self) {
        // A delivery dropped before its outcome (a claim's deadline): not sent if its
        // turn has not come; a request already on its way still counts until it is done.
        if let Delivery::Queued(queued) = &mut self.0 {
            queued.abandon();
        }
    }
}

impl Sink for HttpSink {
    type Delivery = HttpDelivery;

    async fn send(&self, event: &OutboxEvent) -> HttpDelivery {
        let name = self.endpoint_name(event);
        let refused = |error: String| {
            HttpDelivery(Delivery::Decided(Some(Err(SinkFailure {
                kind: FailureKind::Rejected,
                error,
                retry_after: None,
            }))))
        };
        let Some(endpoint) = self.endpoints.get(&name) else {
            return refused(no_endpoint(&name));
        };
        let request = match self.prepare(event) {
            Ok(request) => request,
            Err(e) => return refused(format!("cannot send it over HTTP: {e}")),
        };
        // Waits here, as Kafka's full producer queue makes a send wait, while the endpoint
        // holds `max_queued_bytes` of requests not yet answered; but not while it is taken
        // for down: then the event fails at once, as retryable (see `Endpoint::reserve`).
        let size = request.body.len()
            + (request.headers.iter())
                .map(|(name, value)| name.as_str().len() + value.len())
                .sum::<usize>();
        let bytes = match endpoint.reserve(size).await {
            Ok(bytes) => bytes,
            Err(failure) => {
                return HttpDelivery(Delivery::Queued(
                    endpoint.failed_before_queued(request.key, failure),
                ))
            }
        };
        HttpDelivery(Delivery::Queued(endpoint.enqueue(
            request,
            Arc::clone(&self.in_flight),
            bytes,
        )))
    }

    fn waits_for(&self) -> &'static str {
        "the HTTP endpoints"
    }

    fn destination(&self, event: &OutboxEvent) -> String {
        self.endpoint_name(event)
    }

    fn refusal(&self, event: &OutboxEvent) -> Option<String> {
        if self.template.lacks_routing(event) {
            return Some(
                "http.endpoint_template uses {routing} and the row's routing column \
                 (outbox.columns.routing) is NULL or empty: set it on the row"
                    .into(),
            );
        }
        let name = self.endpoint_name(event);
        if !self.endpoints.contains_key(&name) {
            return Some(no_endpoint(&name));
        }
        self.prepare(event)
            .err()
            .map(|e| format!("cannot send it over HTTP: {e}"))
    }

    async fn flush(&self, deadline: Duration) {
        let until = tokio::time::Instant::now() + deadline;
        while self.in_flight.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn check(&self, timeout: Duration) -> CheckLine {
        // Every endpoint is probed, so one run names every one that fails.
        let mut reached = Vec::new();
        let mut failed = Vec::new();
        for (name, endpoint) in &self.endpoints {
            match endpoint.poster().probe(timeout).await {
                Ok(found) => reached.push(format!("{name} ({found})")),
                Err(e) => failed.push(format!("endpoint `{name}` ({}): {e}", endpoint.shown())),
            }
        }
        if failed.is_empty() {
            return CheckLine::ok(
                "http",
                format!("endpoints reachable: {}", reached.join(", ")),
            );
        }
        let reachable = match reached.is_empty() {
            true => String::new(),
            false => format!("; reachable: {}", reached.join(", ")),
        };
        CheckLine::fail(
            "http",
            format!("{}{reachable}", failed.join("; ")),
            "check http.endpoints.<name>.url, that the service is up and reachable from this \
             host, and for https:// that its certificate chains to a trusted root (or ca_file) \
             and names its host",
        )
    }

    fn queue_depth(&self) -> i64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    async fn destination_healthy(&self, _timeout: Duration) -> Result<bool, String> {
        // Nothing to rebuild: each request has its own answer or timeout.
        Ok(false)
    }

    async fn rebuild(&self) -> Result<(), String> {
        Ok(())
    }

    async fn recover(&self) -> Result<bool, String> {
        Ok(false)
    }

    fn endpoint_metrics(&self) -> Option<EndpointMetrics> {
        Some(self.metrics.clone())
    }
}

fn no_endpoint(name: &str) -> String {
    format!(
        "no endpoint `{name}` in [http.endpoints] (the row's topic column or \
         http.endpoint_template names it)"
    )
}

#[cfg(test)]
mod tests;
