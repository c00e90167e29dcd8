//! The claim worker without Kafka or a database: claimed rows go through the memory sink
//! and the one outcome mapping, are written back under their claim token, and the keys of
//! delivered rows are reported to the relay.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxd_connector::ClaimScope;
use tokio::sync::{mpsc, watch, Notify};

use super::{ClaimWorker, WorkerSettings};
use crate::config::RetryConfig;
use crate::relay::PipelineStats;
use crate::sink::memory::MemorySink;
use crate::sink::FailureKind;
use crate::testing::MemoryStore;

/// Poll mode's settings (INIT rows in scope), strict order: `batch_size` rows a claim,
/// looking again after `idle_check` at most.
fn poll_mode(batch_size: usize, idle_check: Duration) -> WorkerSettings {
    WorkerSettings {
        retry: RetryConfig::default(),
        scope: ClaimScope::NewAndDueFailed,
        batch_size,
        idle_check: Some(idle_check),
        strict_order: true,
        delivery_timeout: Duration::from_secs(30),
        store_timeout: Duration::from_secs(60),
    }
}

/// Runs `worker` until `done` holds, then stops it; fails with `what` after 5 s.
async fn run_until(
    worker: &ClaimWorker<'_, MemoryStore, MemorySink>,
    what: &str,
    done: impl Fn() -> bool,
) {
    let (stop, shutdown) = watch::channel(false);
    let driver = async {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(worker.run(shutdown), driver);
    result.unwrap();
}

#[tokio::test]
async fn claimed_rows_are_sent_written_back_and_their_keys_reported() {
    let store = MemoryStore::default();
    let sink = MemorySink::default();
    let stats = PipelineStats::default();
    store.insert(&[(1, "A"), (2, "B"), (3, "A")]);
    sink.fail_id(2, FailureKind::Retryable);
    let settings = poll_mode(2, Duration::from_secs(60));
    let (keys_tx, mut keys) = mpsc::unbounded_channel();
    let worker = ClaimWorker::new(
        &store,
        &sink,
        settings,
        &stats,
        Arc::new(Notify::new()),
        keys_tx,
    );
    run_until(&worker, "rows not written back", || {
        store.status(3) == "SUCCESS" && store.status(2) == "FAILED"
    })
    .await;

    assert_eq!(store.status(1), "SUCCESS");
    let failed = store.row(2).unwrap();
    assert_eq!(failed.retry_count, 1);
    assert_eq!(
        failed.last_error.as_deref(),
        Some("memory sink: Retryable failure of row 2")
    );
    // A full batch (2 rows) is followed by another claim in the same round; the failed
    // row 2 comes back due at once in this store, and fails again.
    assert!(
        sink.sent_ids().starts_with(&[1, 2, 3]),
        "{:?}",
        sink.sent_ids()
    );
    assert_eq!(stats.retried.load(Ordering::Relaxed), 2);
    assert!(stats.retry_failed.load(Ordering::Relaxed) >= 1);
    let mut reported = Vec::new();
    while let Ok(key) = keys.try_recv() {
        reported.push(key);
    }
    assert_eq!(reported, ["A", "A"]);
}

/// Issue 10, case 6: a sink that turns fatal (as a librdkafka producer does) costs the
/// claimed rows no attempt: their claims are released, the sink is rebuilt, and they are
/// delivered with their retry count unchanged. Before, every send failed at once and each
/// round burned an attempt until the rows needed an operator.
#[tokio::test]
async fn a_fatal_sink_is_rebuilt_and_costs_the_rows_no_attempt() {
    let store = MemoryStore::default();
    let sink = MemorySink::default();
    let stats = PipelineStats::default();
    store.insert(&[(1, "A"), (2, "B")]);
    sink.turn_fatal();
    let settings = poll_mode(10, Duration::from_millis(10));
    let (keys_tx, _keys) = mpsc::unbounded_channel();
    let worker = ClaimWorker::new(
        &store,
        &sink,
        settings,
        &stats,
        Arc::new(Notify::new()),
        keys_tx,
    );
    run_until(&worker, "rows not delivered after the rebuild", || {
        store.status(1) == "SUCCESS" && store.status(2) == "SUCCESS"
    })
    .await;

    assert_eq!(sink.recoveries(), 1);
    assert_eq!(
        sink.sent_ids(),
        [1, 2, 1, 2],
        "sent, failed fatally, sent again"
    );
    for id in [1, 2] {
        assert_eq!(
            store.row(id).unwrap().retry_count,
            0,
            "row {id}: no attempt counted"
        );
    }
    assert_eq!(stats.retry_failed.load(Ordering::Relaxed), 0);
}

/// A claimed row the destination refuses for good (an HTTP 4xx) becomes MANUAL_REQUIRED at
/// once, its attempts untouched, and is not claimed again.
#[tokio::test]
async fn a_claimed_row_the_destination_refuses_becomes_manual_required() {
    let store = MemoryStore::default();
    let sink = MemorySink::default();
    let stats = PipelineStats::default();
    store.insert(&[(1, "A"), (2, "B")]);
    sink.fail_id(1, FailureKind::Refused);
    let settings = poll_mode(10, Duration::from_secs(60));
    let (keys_tx, _keys) = mpsc::unbounded_channel();
    let worker = ClaimWorker::new(
        &store,
        &sink,
        settings,
        &stats,
        Arc::new(Notify::new()),
        keys_tx,
    );
    run_until(&worker, "rows not written back", || {
        store.status(1) == "MANUAL_REQUIRED" && store.status(2) == "SUCCESS"
    })
    .await;
    let refused = store.row(1).unwrap();
    assert_eq!(
        refused.retry_count, 0,
        "no attempt counted: an operator's turn"
    );
    assert_eq!(
        refused.last_error.as_deref(),
        Some("memory sink: Refused failure of row 1")
    );
    assert_eq!(sink.sent_ids(), [1, 2], "not claimed again");
}

/// A database that stops answering a claim (a network black hole: no error, no close):
/// after `store_timeout` the call is given up as transient and the worker claims again (on
/// a new connection, with a real store), instead of waiting for as long as the silence
/// lasts; once the database answers, the row goes. Paused clock.
#[tokio::test(start_paused = true)]
async fn a_claim_the_database_never_answers_is_given_up_after_store_timeout() {
    let store = MemoryStore::default();
    let sink = MemorySink::default();
    let stats = PipelineStats::default();
    store.insert(&[(1, "A")]);
    store.silence_claims(true);
    let mut settings = poll_mode(10, Duration::from_secs(1));
    settings.store_timeout = Duration::from_secs(2);
    let (keys_tx, _keys) = mpsc::unbounded_channel();
    let worker = ClaimWorker::new(
        &store,
        &sink,
        settings,
        &stats,
        Arc::new(Notify::new()),
        keys_tx,
    );
    let (stop, shutdown) = watch::channel(false);
    let driver = async {
        tokio::time::sleep(Duration::from_secs(8)).await;
        assert!(
            store.claim_calls() >= 3,
            "a silent claim is given up after store_timeout and made again: {} calls in 8 s",
            store.claim_calls()
        );
        assert!(sink.sent_ids().is_empty());
        store.silence_claims(false);
        while store.status(1) != "SUCCESS" {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(worker.run(shutdown), driver);
    result.unwrap();
    assert_eq!(sink.sent_ids(), [1]);
}
