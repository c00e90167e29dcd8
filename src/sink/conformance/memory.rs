//! The conformance suite against the in-memory twin (`sink/memory.rs`), on tokio's paused
//! clock. The core's unit tests (relay, claim worker, recover) stand on the twin behaving
//! as the real sinks do; these runs are what says it does. Its destination is the twin
//! itself: what it delivered, in order.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outboxd_connector::OutboxEvent;
use tokio::task::JoinHandle;

use super::{sink_conformance_tests, SinkHarness};
use crate::sink::memory::MemorySink;
use crate::sink::FailureKind;
use crate::testing::event;

/// See the module doc.
pub(crate) struct MemoryHarness {
    sink: Arc<MemorySink>,
    /// Completes held deliveries after a while, once [`SinkHarness::slow_down`] holds
    /// them.
    completer: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for MemoryHarness {
    fn drop(&mut self) {
        let completer = self.completer.get_mut().map(Option::take);
        if let Ok(Some(completer)) = completer {
            completer.abort();
        }
    }
}

impl SinkHarness for MemoryHarness {
    type Sink = MemorySink;

    async fn start() -> Self {
        Self {
            sink: Arc::new(MemorySink::default()),
            completer: Mutex::new(None),
        }
    }

    /// The twin is its own destination: every handle is the one sink.
    async fn sink(&self) -> Arc<MemorySink> {
        Arc::clone(&self.sink)
    }

    async fn delivered(&self, _at_least: usize) -> Vec<i64> {
        self.sink.delivered_ids()
    }

    /// Deliveries are held, and decided 25 ms (of the paused clock) later.
    fn slow_down(&self) {
        self.sink.hold();
        let sink = Arc::clone(&self.sink);
        let completer = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(25)).await;
                for id in sink.held() {
                    sink.complete(id);
                }
            }
        });
        let mut slot = self
            .completer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *slot = Some(completer);
    }

    fn refused_event(&self, id: i64, key: &str) -> OutboxEvent {
        self.sink.fail_id(id, FailureKind::Rejected);
        event(id, key)
    }

    async fn unreachable_sink(&self) -> Arc<MemorySink> {
        let sink = MemorySink::default();
        sink.fail_all(FailureKind::Retryable);
        Arc::new(sink)
    }

    /// As a librdkafka producer after a fatal error, until recovered.
    async fn fatal_sink(&self) -> Arc<MemorySink> {
        self.sink.turn_fatal();
        Arc::clone(&self.sink)
    }
}

sink_conformance_tests! {
    harness: MemoryHarness,
    runtime: #[tokio::test(start_paused = true)],
    applies: [
        each_keys_records_arrive_in_send_order_among_concurrent_keys,
        a_record_the_destination_refuses_is_rejected_and_others_go_on,
        a_refusal_is_the_records_alone_not_its_neighbours,
        an_unreachable_destination_is_retryable,
        recover_keeps_a_healthy_sink,
        a_fatal_sink_fails_fatal_until_recovered,
        flush_waits_for_records_whose_outcome_is_awaited,
        flush_waits_for_records_whose_delivery_was_dropped,
    ],
    not_applicable: [
        handed_over_bytes_stay_within_the_bound =>
            "the twin has no local queue, so send never waits; what the relay hands over \
             is bounded by its own delivery.max_in_flight(_bytes) window (relay/tests)",
    ],
}
