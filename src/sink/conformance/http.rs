//! The conformance suite against the HTTP sink, posting to a real HTTP server on loopback
//! (`loopback.rs`), on real time with bounded waits. The destination is the server: what
//! it answered 2xx, in the order of its answers, known at once (no reader to wait for).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use outboxd_connector::OutboxEvent;

use super::loopback::{closed_url, start, Server};
use super::{row_id, sink_conformance_tests, SinkHarness};
use crate::sink::http::{HttpSink, HttpSinkConfig};
use crate::testing::event;

/// See the module doc.
pub(crate) struct HttpHarness {
    server: Arc<Server>,
    url: String,
}

/// A sink posting every event to `url`, strict ordering, no secrets; `extra`: more keys
/// of the endpoint.
fn sink_to(url: &str) -> Arc<HttpSink> {
    sink_with(url, "")
}

fn sink_with(url: &str, extra: &str) -> Arc<HttpSink> {
    let text = format!(
        "endpoint_template = \"default\"\ntimeout = \"2s\"\n[endpoints.default]\nurl = \"{url}\"\n{extra}"
    );
    let config: HttpSinkConfig = toml::from_str(&text).expect("an [http] section");
    config.validate().expect("a valid [http] section");
    let sink = HttpSink::new(&config, "conformance", true, &["outbox".into()]);
    Arc::new(sink.expect("the HTTP sink"))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SinkHarness for HttpHarness {
    type Sink = HttpSink;

    async fn start() -> Self {
        let server = Arc::new(Server::default());
        let url = start(&server).await;
        Self { server, url }
    }

    async fn sink(&self) -> Arc<HttpSink> {
        sink_to(&self.url)
    }

    async fn delivered(&self, _at_least: usize) -> Vec<i64> {
        lock(&self.server.accepted)
            .iter()
            .map(|id| row_id(id))
            .collect()
    }

    /// Each answer takes 100 ms.
    fn slow_down(&self) {
        self.server.delay_ms.store(100, Ordering::SeqCst);
    }

    /// Answered 422 Unprocessable Content.
    fn refused_event(&self, id: i64, key: &str) -> OutboxEvent {
        let refused = event(id, key);
        lock(&self.server.refusing).push(refused.message_id.clone());
        refused
    }

    /// A loopback port nothing listens at: the connection is refused at once.
    async fn unreachable_sink(&self) -> Arc<HttpSink> {
        sink_to(&closed_url())
    }

    /// `max_queued_bytes` of 1 MiB; the server answers every request 503 after 300 ms (the
    /// breaker kept shut, so each one is given up rather than held).
    async fn bounded_sink(&self) -> (Arc<HttpSink>, usize) {
        const BOUND: usize = 1 << 20;
        self.server.status.store(503, Ordering::SeqCst);
        self.server.delay_ms.store(300, Ordering::SeqCst);
        let extra = format!("open_after = 1000\nmax_queued_bytes = {BOUND}\n");
        (sink_with(&self.url, &extra), BOUND)
    }
}

sink_conformance_tests! {
    harness: HttpHarness,
    runtime: #[tokio::test(flavor = "multi_thread", worker_threads = 2)],
    applies: [
        each_keys_records_arrive_in_send_order_among_concurrent_keys,
        a_record_the_destination_refuses_is_rejected_and_others_go_on,
        a_refusal_is_the_records_alone_not_its_neighbours,
        an_unreachable_destination_is_retryable,
        recover_keeps_a_healthy_sink,
        flush_waits_for_records_whose_outcome_is_awaited,
        handed_over_bytes_stay_within_the_bound,
    ],
    not_applicable: [
        flush_waits_for_records_whose_delivery_was_dropped =>
            "by design a dropped HTTP delivery whose turn has not come is never sent (its \
             caller, a claim past its deadline, has written the row FAILED: sending it later \
             would only make a duplicate, and tasks would pile up behind an endpoint that is \
             down); one already on the wire runs to its answer and flush waits for it (the \
             request's task holds the in-flight count, sink/http/endpoint.rs)",
        a_fatal_sink_fails_fatal_until_recovered =>
            "the HTTP sink has no fatal state: every request has its own outcome, so \
             recover always returns Ok(false) (recover_keeps_a_healthy_sink runs)",
    ],
}
