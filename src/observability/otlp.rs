//! OTLP export of outboxd's spans (`[otlp]`): the spans of events whose row carries a
//! valid `traceparent` ([`super::trace_context::event_span`]) go to an OpenTelemetry
//! collector as children of the application's span that wrote the row, so a trace shows
//! the hop through the outbox.
//!
//! The dataflow: a `tracing` layer ([`OtlpLayer`]) keeps each outboxd span's fields and
//! start time; when the span closes, it is queued (bounded: when the queue is full the span
//! is dropped and counted, never a wait on the relay's path). One thread of its own
//! (`otlp-export`, its own small runtime) sends the queue in batches as OTLP/HTTP JSON
//! (`POST <endpoint>/v1/traces`, what the collector's `otlphttp` receiver takes). An
//! export that fails is logged and its batch dropped: tracing is an extra, never a reason
//! to stop relaying. No dependency beyond what outboxd already has (hyper's client).
//!
//! Spans without a trace context are not exported: an outbox relays far more events than
//! anyone traces, and a root span per event would flood the collector. Nor are those of a
//! trace the caller did not sample (`trace_sampled = false`, from the `traceparent`'s
//! flags), whose other spans the collector never sees.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// Spans queued for export, at most; past this they are dropped (and counted).
const QUEUE: usize = 8192;
/// Spans per export request, at most.
const BATCH: usize = 512;
/// The longest a finished span waits for its batch to fill.
const BATCH_WAIT: Duration = Duration::from_secs(1);

/// `[otlp]`: export outboxd's event spans to an OpenTelemetry collector; off when absent.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    /// The collector's OTLP/HTTP base address; spans are posted to `<endpoint>/v1/traces`.
    pub endpoint: String,
    /// The resource's `service.name`.
    pub service_name: String,
    /// How long one export request may take.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        Self {
            endpoint: "http://127.0.0.1:4318".into(),
            service_name: "outboxd".into(),
            timeout: Duration::from_secs(10),
        }
    }
}

impl OtlpConfig {
    /// An `http://` or `https://` address, a service name, a timeout within reason.
    pub fn validate(&self) -> Result<(), String> {
        let uri: Result<hyper::Uri, _> = self.traces_url().parse();
        let scheme_ok = matches!(
            uri.as_ref().ok().and_then(|u| u.scheme_str()),
            Some("http" | "https")
        );
        if !scheme_ok || uri.as_ref().ok().and_then(|u| u.host()).is_none() {
            return Err(format!(
                "otlp.endpoint `{}` must be an http:// or https:// address such as \
                 `http://127.0.0.1:4318`",
                self.endpoint
            ));
        }
        if self.service_name.trim().is_empty() {
            return Err("otlp.service_name is empty".into());
        }
        outboxd_connector_kit::config::check_duration(
            "otlp.timeout",
            self.timeout,
            Duration::from_millis(100),
            Duration::from_secs(300),
        )
    }

    fn traces_url(&self) -> String {
        format!("{}/v1/traces", self.endpoint.trim_end_matches('/'))
    }
}

/// A finished span, as exported.
#[derive(Debug)]
struct FinishedSpan {
    name: &'static str,
    trace_id: String,
    span_id: String,
    parent_span_id: Option<String>,
    start: SystemTime,
    end: SystemTime,
    attributes: Vec<(&'static str, Value)>,
}

/// What the layer keeps of an open span (in its extensions).
struct OpenSpan {
    trace_id: Option<String>,
    sampled: bool,
    parent_span_id: Option<String>,
    span_id: String,
    start: SystemTime,
    attributes: Vec<(&'static str, Value)>,
}

impl Visit for OpenSpan {
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.set(field, json!({ "intValue": value.to_string() }));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.set(field, json!({ "intValue": value.to_string() }));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == "trace_sampled" {
            self.sampled = value;
        } else {
            self.set(field, json!({ "boolValue": value }));
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.text(field, value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.text(field, format!("{value:?}"));
    }
}

impl OpenSpan {
    fn text(&mut self, field: &Field, value: String) {
        match field.name() {
            "trace_id" => self.trace_id = Some(value),
            "parent_span_id" => self.parent_span_id = Some(value),
            _ => self.set(field, json!({ "stringValue": value })),
        }
    }
    fn set(&mut self, field: &Field, value: Value) {
        match self.attributes.iter_mut().find(|(k, _)| *k == field.name()) {
            Some((_, v)) => *v = value,
            None => self.attributes.push((field.name(), value)),
        }
    }
}

/// The `tracing` layer that queues outboxd's finished spans for export.
pub struct OtlpLayer {
    queue: mpsc::Sender<Message>,
    dropped: Arc<AtomicU64>,
}

enum Message {
    Span(FinishedSpan),
    /// Send what is queued, then answer.
    Flush(std::sync::mpsc::Sender<()>),
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for OtlpLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut open = OpenSpan {
            trace_id: None,
            sampled: true,
            parent_span_id: None,
            span_id: format!("{:016x}", rand::random::<u64>() | 1),
            start: SystemTime::now(),
            attributes: Vec::new(),
        };
        attrs.record(&mut open);
        // Inside another exported span: a child of it, in its trace.
        if open.trace_id.is_none() {
            if let Some(parent) = span.parent() {
                if let Some(p) = parent.extensions().get::<OpenSpan>() {
                    open.trace_id.clone_from(&p.trace_id);
                    open.sampled = p.sampled;
                    open.parent_span_id = Some(p.span_id.clone());
                }
            }
        }
        span.extensions_mut().insert(open);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(open) = span.extensions_mut().get_mut::<OpenSpan>() {
                values.record(open);
            }
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(open) = span.extensions_mut().remove::<OpenSpan>() else {
            return;
        };
        let Some(trace_id) = open.trace_id.filter(|_| open.sampled) else {
            return;
        };
        let finished = FinishedSpan {
            name: span.name(),
            trace_id,
            span_id: open.span_id,
            parent_span_id: open.parent_span_id,
            start: open.start,
            end: SystemTime::now(),
            attributes: open.attributes,
        };
        if self.queue.try_send(Message::Span(finished)).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The export thread; dropping it sends what is queued (waiting at most the export
/// timeout) and stops it.
pub struct OtlpExport {
    queue: mpsc::Sender<Message>,
    timeout: Duration,
}

impl Drop for OtlpExport {
    fn drop(&mut self) {
        let (done, wait) = std::sync::mpsc::channel();
        if self.queue.try_send(Message::Flush(done)).is_ok() {
            let _ = wait.recv_timeout(self.timeout + BATCH_WAIT);
        }
    }
}

/// Starts the export thread; the layer to install feeds it.
pub fn start(config: &OtlpConfig) -> std::io::Result<(OtlpLayer, OtlpExport)> {
    let (queue, spans) = mpsc::channel(QUEUE);
    let dropped = Arc::new(AtomicU64::new(0));
    let exporter = Exporter {
        url: config.traces_url(),
        timeout: config.timeout,
        resource: json!({
            "attributes": [
                { "key": "service.name", "value": { "stringValue": config.service_name } },
            ]
        }),
        dropped: dropped.clone(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("otlp-export".into())
        .spawn(move || runtime.block_on(exporter.run(spans)))?;
    let layer = OtlpLayer {
        queue: queue.clone(),
        dropped,
    };
    let export = OtlpExport {
        queue,
        timeout: config.timeout,
    };
    Ok((layer, export))
}

struct Exporter {
    url: String,
    timeout: Duration,
    resource: Value,
    dropped: Arc<AtomicU64>,
}

type Client = hyper_util::client::legacy::Client<
    hyper_tls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

impl Exporter {
    async fn run(self, mut queue: mpsc::Receiver<Message>) {
        let client: Client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(hyper_tls::HttpsConnector::new());
        let mut batch = Vec::new();
        loop {
            let deadline = tokio::time::Instant::now() + BATCH_WAIT;
            let mut flush = None;
            while batch.len() < BATCH && flush.is_none() {
                match tokio::time::timeout_at(deadline, queue.recv()).await {
                    Ok(Some(Message::Span(span))) => batch.push(span),
                    Ok(Some(Message::Flush(done))) => flush = Some(done),
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            if !batch.is_empty() {
                self.export(&client, std::mem::take(&mut batch)).await;
            }
            if let Some(done) = flush {
                let _ = done.send(());
                return;
            }
        }
    }

    async fn export(&self, client: &Client, spans: Vec<FinishedSpan>) {
        let count = spans.len();
        let body = self.request_body(spans);
        let request = hyper::Request::post(&self.url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())));
        let request = match request {
            Ok(request) => request,
            Err(e) => {
                tracing::warn!(error = %e, url = %self.url, "OTLP export: bad request");
                return;
            }
        };
        let sent = tokio::time::timeout(self.timeout, async {
            let response = client.request(request).await.map_err(|e| e.to_string())?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?;
            if status.is_success() {
                Ok(())
            } else {
                let text = String::from_utf8_lossy(&body.to_bytes()).into_owned();
                Err(format!(
                    "{status}: {}",
                    text.chars().take(200).collect::<String>()
                ))
            }
        })
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {:?}", self.timeout)));
        if let Err(error) = sent {
            tracing::warn!(
                %error,
                url = %self.url,
                spans = count,
                dropped_before = self.dropped.load(Ordering::Relaxed),
                "OTLP export failed; these spans are dropped (relaying goes on)"
            );
        }
    }

    /// An `ExportTraceServiceRequest` in OTLP's JSON encoding (ids in hex, 64-bit
    /// integers as strings).
    fn request_body(&self, spans: Vec<FinishedSpan>) -> Value {
        let nanos = |t: SystemTime| {
            t.duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
                .to_string()
        };
        let spans: Vec<Value> = spans
            .into_iter()
            .map(|s| {
                let mut span = json!({
                    "traceId": s.trace_id,
                    "spanId": s.span_id,
                    "name": s.name,
                    // SPAN_KIND_PRODUCER: the span sends a message to a broker.
                    "kind": 4,
                    "startTimeUnixNano": nanos(s.start),
                    "endTimeUnixNano": nanos(s.end),
                    "attributes": s.attributes.into_iter()
                        .map(|(key, value)| json!({ "key": key, "value": value }))
                        .collect::<Vec<_>>(),
                });
                if let Some(parent) = s.parent_span_id {
                    span["parentSpanId"] = Value::String(parent);
                }
                span
            })
            .collect();
        json!({
            "resourceSpans": [{
                "resource": self.resource,
                "scopeSpans": [{
                    "scope": { "name": "outboxd", "version": env!("CARGO_PKG_VERSION") },
                    "spans": spans,
                }],
            }],
        })
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    #[test]
    fn endpoints_are_checked() {
        OtlpConfig::default().validate().unwrap();
        for endpoint in ["", "127.0.0.1:4318", "ftp://collector", "http://"] {
            let config = OtlpConfig {
                endpoint: endpoint.into(),
                ..OtlpConfig::default()
            };
            let err = config.validate().unwrap_err();
            assert!(err.contains("otlp.endpoint"), "{endpoint}: {err}");
        }
        let config = OtlpConfig {
            endpoint: "https://collector.example:4318/".into(),
            ..OtlpConfig::default()
        };
        config.validate().unwrap();
        assert_eq!(
            config.traces_url(),
            "https://collector.example:4318/v1/traces"
        );
    }

    /// The layer queues only spans with a trace context, with their fields as attributes;
    /// a span opened inside one is its child.
    #[test]
    fn spans_with_a_trace_context_are_queued_with_their_fields() {
        let (queue, mut spans) = mpsc::channel(16);
        let layer = OtlpLayer {
            queue,
            dropped: Arc::default(),
        };
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let untraced = tracing::info_span!("event", id = 1, trace_id = tracing::field::Empty);
            drop(untraced);
            let traced = tracing::info_span!(
                "event",
                id = 2,
                message_id = "m-2",
                trace_id = tracing::field::Empty,
                parent_span_id = tracing::field::Empty,
            );
            traced.record(
                "trace_id",
                tracing::field::display("4bf92f3577b34da6a3ce929d0e0e4736"),
            );
            traced.record(
                "parent_span_id",
                tracing::field::display("00f067aa0ba902b7"),
            );
            traced.in_scope(|| drop(tracing::info_span!("write_back", rows = 1_u64)));
            drop(traced);
            let unsampled = tracing::info_span!(
                "event",
                trace_id = "4bf92f3577b34da6a3ce929d0e0e4736",
                trace_sampled = false
            );
            unsampled.in_scope(|| drop(tracing::info_span!("write_back")));
            drop(unsampled);
        });
        let mut got = Vec::new();
        while let Ok(Message::Span(span)) = spans.try_recv() {
            got.push(span);
        }
        assert_eq!(got.len(), 2, "{got:?}");
        let (child, event) = (&got[0], &got[1]);
        assert_eq!(event.name, "event");
        assert_eq!(event.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(event.parent_span_id.as_deref(), Some("00f067aa0ba902b7"));
        assert_eq!(event.span_id.len(), 16);
        assert_eq!(
            event.attributes,
            [
                ("id", json!({ "intValue": "2" })),
                ("message_id", json!({ "stringValue": "m-2" })),
            ]
        );
        assert_eq!(child.name, "write_back");
        assert_eq!(child.trace_id, event.trace_id);
        assert_eq!(child.parent_span_id.as_ref(), Some(&event.span_id));
    }

    #[test]
    fn the_request_is_otlp_json() {
        let exporter = Exporter {
            url: String::new(),
            timeout: Duration::from_secs(1),
            resource: json!({}),
            dropped: Arc::default(),
        };
        let start = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789);
        let body = exporter.request_body(vec![FinishedSpan {
            name: "event",
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            span_id: "0123456789abcdef".into(),
            parent_span_id: Some("00f067aa0ba902b7".into()),
            start,
            end: start + Duration::from_millis(2),
            attributes: vec![("id", json!({ "intValue": "7" }))],
        }]);
        let span = &body["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(span["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(span["parentSpanId"], "00f067aa0ba902b7");
        assert_eq!(span["startTimeUnixNano"], "1700000000123456789");
        assert_eq!(span["endTimeUnixNano"], "1700000000125456789");
        assert_eq!(span["kind"], 4);
        assert_eq!(span["attributes"][0]["value"]["intValue"], "7");
    }
}
