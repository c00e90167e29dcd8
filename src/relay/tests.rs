//! The relay session without Kafka or a database: the in-memory sink, store and stream
//! drive the checkpoint, strict-ordering parking and release, the shutdown drain and a
//! fatal sink error. Every confirmation is checked by the stream itself (see
//! [`crate::testing::MemoryStream`]): never backward, never past an INIT row.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outboxd_connector::OutboxStore;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, watch, Notify};

use super::session::{Session, Unwritten};
use super::{PipelineError, PipelineSettings, PipelineStats, RetryLink};
use crate::config::{DeliveryConfig, Ordering as KeyOrdering, RetryConfig};
use crate::reconnect::{ReconnectBackoff, SessionError};
use crate::sink::memory::MemorySink;
use crate::sink::{CommittedPosition, FailureKind};
use crate::testing::{event, lsn, CapturedLog, MemoryStore, MemoryStream, StreamLog};

struct Harness {
    store: Arc<MemoryStore>,
    sink: MemorySink,
    settings: PipelineSettings,
    stats: PipelineStats,
    wake: Arc<Notify>,
}

impl Harness {
    /// A harness whose sink is transactional (exactly-once), committing every 20 ms.
    fn exactly_once() -> Self {
        let mut h = Self::new(Duration::from_secs(2));
        h.sink = MemorySink::transactional();
        h.settings.delivery.exactly_once = true;
        h.settings.delivery.transaction_interval = Duration::from_millis(20);
        h
    }

    fn new(shutdown_deadline: Duration) -> Self {
        Self {
            store: Arc::new(MemoryStore::default()),
            sink: MemorySink::default(),
            settings: PipelineSettings {
                delivery: DeliveryConfig {
                    max_in_flight: 1000,
                    max_in_flight_bytes: 64 << 20,
                    writeback_batch: 100,
                    writeback_interval: Duration::from_millis(5),
                    shutdown_deadline,
                    exactly_once: false,
                    transaction_interval: Duration::from_millis(100),
                },
                retry: RetryConfig::default(),
                ordering: KeyOrdering::Strict,
                stall_warning: Duration::from_secs(30),
                stuck_after: Duration::from_secs(90),
                rows: outboxd_connector::RowLifecycle::Kept,
            },
            stats: PipelineStats::default(),
            wake: Arc::new(Notify::new()),
        }
    }

    /// One session as `relay::run` opens it.
    async fn session(
        &self,
        stream: &mut MemoryStream,
        link: &mut RetryLink,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), PipelineError> {
        self.session_carrying(stream, link, shutdown, &mut Unwritten::default())
            .await
    }

    /// One session as `relay::run` opens it after an earlier one: the outcomes that
    /// session could not write back are written first, and what this one leaves
    /// unwritten replaces them.
    async fn session_carrying(
        &self,
        stream: &mut MemoryStream,
        link: &mut RetryLink,
        mut shutdown: watch::Receiver<bool>,
        carried: &mut Unwritten,
    ) -> Result<(), PipelineError> {
        let mut session = Session::new(
            &*self.store,
            &self.sink,
            &self.settings,
            &self.stats,
            Arc::clone(&self.wake),
        );
        let result = async {
            session.write_unwritten(carried).await?;
            session.load_blocked_keys().await?;
            session.load_delivered_through().await?;
            // Exactly-once: fence the instance that held the transactions before reading
            // the checkpoint, which that instance may still have been writing.
            let committed = session.take_over_transactions().await?;
            session.set_written_through(self.store.load_checkpoint().await?);
            session.start_from_committed(committed);
            let mut backoff = ReconnectBackoff::new();
            session.run(stream, link, &mut shutdown, &mut backoff).await
        }
        .await;
        if result.is_err() {
            carried.merge(session.take_unwritten());
        }
        result
    }
}

fn link() -> (RetryLink, mpsc::UnboundedSender<String>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let link = RetryLink {
        wake_worker: Arc::new(Notify::new()),
        delivered_keys: rx,
    };
    (link, tx)
}

/// Polls `condition` until it holds; fails the test after 5 s.
async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn assert_no_violations(log: &Mutex<StreamLog>) {
    let log = log.lock().unwrap();
    assert!(log.violations.is_empty(), "{:?}", log.violations);
}

fn last_confirmed(log: &Mutex<StreamLog>) -> Option<outboxd_connector::Position> {
    log.lock().unwrap().confirmed.last().cloned()
}

#[tokio::test]
async fn after_a_failure_later_events_of_the_key_are_parked_and_other_keys_flow() {
    let h = Harness::new(Duration::from_secs(2));
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, delivered_keys) = link();
    let (stop, shutdown) = watch::channel(false);
    h.store
        .insert(&[(1, "K"), (2, "K"), (3, "L"), (4, "K"), (5, "K")]);
    h.sink.fail_id(1, FailureKind::Retryable);

    let driver = async {
        log.commit(10, vec![event(1, "K")]);
        wait_until("row 1 FAILED", || h.store.status(1) == "FAILED").await;
        log.commit(20, vec![event(2, "K"), event(3, "L")]);
        wait_until("row 2 parked, row 3 sent", || {
            h.store.status(2) == "FAILED" && h.store.status(3) == "SUCCESS"
        })
        .await;
        let parked = h
            .store
            .row(2)
            .and_then(|r| r.last_error)
            .unwrap_or_default();
        assert!(
            parked.starts_with("parked: an earlier event of biz_key `K`"),
            "{parked}"
        );
        assert_eq!(h.sink.sent_ids(), [1, 3], "row 2 must not reach the sink");
        wait_until("20 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(20))
        })
        .await;

        // The claim worker delivered a row of K, but the table still shows K's failed
        // rows: K stays blocked.
        let _ = delivered_keys.send("K".into());
        log.commit(30, vec![event(4, "K")]);
        wait_until("row 4 parked", || h.store.status(4) == "FAILED").await;
        assert_eq!(h.sink.sent_ids(), [1, 3]);

        // Now every earlier row of K is delivered: the next report releases the key.
        for id in [1, 2, 4] {
            h.store.set_status(id, "SUCCESS");
        }
        let _ = delivered_keys.send("K".into());
        log.commit(40, vec![event(5, "K")]);
        wait_until("row 5 sent", || h.store.status(5) == "SUCCESS").await;
        assert_eq!(h.sink.sent_ids(), [1, 3, 5]);
        wait_until("40 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(40))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_no_violations(&confirmed);
    assert_eq!(h.store.checkpoint(), Some(lsn(40)));
    assert_eq!(h.stats.parked.load(std::sync::atomic::Ordering::Relaxed), 2);
}

#[tokio::test]
async fn shutdown_writes_back_in_flight_deliveries_before_it_returns() {
    let h = Harness::new(Duration::from_secs(5));
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, _keys) = link();
    let (stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "A"), (2, "B"), (3, "A")]);
    h.sink.hold();

    let driver = async {
        log.commit(10, vec![event(1, "A"), event(2, "B")]);
        log.commit(20, vec![event(3, "A")]);
        wait_until("three in flight", || h.sink.held() == [1, 2, 3]).await;
        stop.send_replace(true);
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Out of log order: the checkpoint still waits for the whole prefix.
        for id in [3, 2, 1] {
            assert!(h.sink.complete(id));
        }
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    for id in [1, 2, 3] {
        assert_eq!(h.store.status(id), "SUCCESS", "row {id}");
    }
    assert_eq!(h.store.checkpoint(), Some(lsn(20)));
    assert_eq!(last_confirmed(&confirmed), Some(lsn(20)));
    assert_no_violations(&confirmed);
}

#[tokio::test]
async fn past_the_shutdown_deadline_unacknowledged_rows_stay_unconfirmed() {
    let h = Harness::new(Duration::from_millis(100));
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, _keys) = link();
    let (stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "A"), (2, "B")]);
    h.sink.hold();

    let driver = async {
        log.commit(10, vec![event(1, "A")]);
        log.commit(20, vec![event(2, "B")]);
        wait_until("two in flight", || h.sink.held() == [1, 2]).await;
        assert!(h.sink.complete(1));
        wait_until("10 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(10))
        })
        .await;
        stop.send_replace(true);
    };
    let started = Instant::now();
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(h.store.status(1), "SUCCESS");
    assert_eq!(
        h.store.status(2),
        "INIT",
        "read again from the log on restart"
    );
    assert_eq!(h.store.checkpoint(), Some(lsn(10)));
    assert_eq!(last_confirmed(&confirmed), Some(lsn(10)));
    assert_no_violations(&confirmed);
}

#[tokio::test]
async fn a_fatal_sink_error_leaves_its_row_unwritten_and_ends_the_session_for_a_rebuild() {
    let h = Harness::new(Duration::from_secs(5));
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, _keys) = link();
    let (_stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "A"), (2, "B"), (3, "C"), (4, "D")]);
    h.sink.fail_id(2, FailureKind::Fatal);
    h.sink.hold();

    let driver = async {
        log.commit(10, vec![event(1, "A")]);
        log.commit(20, vec![event(2, "B")]);
        log.commit(30, vec![event(3, "C")]);
        wait_until("three in flight", || h.sink.held() == [1, 2, 3]).await;
        assert!(h.sink.complete(2));
        wait_until("row 2's fatal outcome taken", || {
            h.stats.in_flight.load(std::sync::atomic::Ordering::Relaxed) == 2
        })
        .await;
        // The session reads no more once the sink is unusable.
        log.commit(40, vec![event(4, "D")]);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(h.sink.complete(1));
        assert!(h.sink.complete(3));
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    match result {
        Err(e @ PipelineError::SinkFailed(_)) => {
            assert!(e.to_string().contains("row 2"), "{e}");
            assert!(e.is_transient(), "a new session follows: {e}");
        }
        other => panic!("expected SinkFailed, got {other:?}"),
    }
    assert_eq!(h.sink.sent_ids(), [1, 2, 3]);
    // Row 2 is not to blame: no attempt is counted, it stays INIT and holds the
    // checkpoint, so the next session reads it from the log and sends it again.
    assert_eq!(
        [1, 2, 3, 4].map(|id| h.store.status(id)),
        ["SUCCESS", "INIT", "SUCCESS", "INIT"]
    );
    assert_eq!(h.store.row(2).unwrap().retry_count, 0);
    assert_eq!(h.store.checkpoint(), Some(lsn(10)));
    assert_no_violations(&confirmed);
}

/// Random transactions completed in random orders, relaxed ordering so every event is
/// sent: each confirmation is checked by the stream, and the last one is reached.
#[tokio::test]
async fn random_completion_orders_confirm_the_written_prefix_only() {
    for seed in 0..25u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut h = Harness::new(Duration::from_secs(5));
        h.settings.ordering = KeyOrdering::Relaxed;
        h.settings.delivery.writeback_batch = rng.gen_range(1..8);
        let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
        let (mut link, _keys) = link();
        let (stop, shutdown) = watch::channel(false);
        h.sink.hold();
        let mut txs = Vec::new();
        let mut id = 0;
        for t in 1..=rng.gen_range(1..12u64) {
            let events: Vec<_> = (0..rng.gen_range(1..4))
                .map(|_| {
                    id += 1;
                    h.store.insert(&[(id, "k")]);
                    event(id, &format!("k{}", id % 3))
                })
                .collect();
            txs.push((t * 10, events));
        }
        let last = txs.last().map(|(p, _)| *p);
        let mut ids: Vec<i64> = (1..=id).collect();
        ids.shuffle(&mut rng);

        let driver = async {
            for (position, events) in txs {
                log.commit(position, events);
            }
            wait_until("all in flight", || h.sink.held().len() == ids.len()).await;
            for id in &ids {
                assert!(h.sink.complete(*id));
                if rng.gen_bool(0.3) {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            wait_until("the last position confirmed", || {
                last_confirmed(&confirmed) == last.map(lsn)
            })
            .await;
            stop.send_replace(true);
        };
        let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
        result.unwrap();
        assert_no_violations(&confirmed);
        assert!(
            ids.iter().all(|id| h.store.status(*id) == "SUCCESS"),
            "seed {seed}"
        );
    }
}

#[tokio::test]
async fn relaxed_ordering_sends_later_events_of_a_failing_key() {
    let mut h = Harness::new(Duration::from_secs(2));
    h.settings.ordering = KeyOrdering::Relaxed;
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, _keys) = link();
    let (stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "K"), (2, "K"), (3, "L")]);
    h.sink.fail_key("K", FailureKind::Rejected);

    let driver = async {
        log.commit(10, vec![event(1, "K")]);
        wait_until("row 1 FAILED", || h.store.status(1) == "FAILED").await;
        log.commit(20, vec![event(2, "K"), event(3, "L")]);
        wait_until("20 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(20))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_eq!(h.sink.sent_ids(), [1, 2, 3]);
    assert_eq!(
        [1, 2, 3].map(|id| h.store.status(id)),
        ["FAILED", "FAILED", "SUCCESS"]
    );
    let error = h
        .store
        .row(2)
        .and_then(|r| r.last_error)
        .unwrap_or_default();
    assert!(error.contains("Rejected failure of row 2"), "{error}");
    assert_eq!(h.stats.parked.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_no_violations(&confirmed);
}

/// Issue 10, case 7: a row the connector could not turn into an event (a rejected event)
/// is never sent: it is written MANUAL_REQUIRED with the reason, later events of its key
/// are parked behind it, other keys flow, and the stream goes on past it.
#[tokio::test]
async fn a_rejected_row_needs_an_operator_holds_its_key_and_the_stream_goes_on() {
    let h = Harness::new(Duration::from_secs(2));
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, _keys) = link();
    let (stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "K"), (2, "L"), (3, "K")]);
    let mut bad = event(1, "K");
    bad.rejected = Some("cannot be published: column `message_type` is NULL".into());

    let driver = async {
        log.commit(10, vec![bad, event(2, "L")]);
        log.commit(20, vec![event(3, "K")]);
        wait_until("20 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(20))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_eq!(
        h.sink.sent_ids(),
        [2],
        "the rejected row and its key's next one stay back"
    );
    assert_eq!(
        [1, 2, 3].map(|id| h.store.status(id)),
        ["MANUAL_REQUIRED", "SUCCESS", "FAILED"]
    );
    assert_eq!(
        h.store.row(1).and_then(|r| r.last_error).as_deref(),
        Some("cannot be published: column `message_type` is NULL")
    );
    assert_no_violations(&confirmed);
}

#[tokio::test]
async fn rows_an_earlier_session_delivered_are_not_sent_again() {
    let h = Harness::new(Duration::from_secs(2));
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, _keys) = link();
    let (stop, shutdown) = watch::channel(false);
    h.store
        .insert(&[(1, "A"), (2, "B"), (3, "A"), (4, "C"), (5, "D"), (6, "D")]);
    // An earlier session delivered rows 1, 2 and 4 and wrote them back, but its
    // checkpoint did not get past their transactions (row 3 was still in flight).
    for id in [1, 2, 4] {
        h.store.set_status(id, "SUCCESS");
    }

    let driver = async {
        log.commit(10, vec![event(1, "A"), event(2, "B"), event(3, "A")]);
        log.commit(20, vec![event(4, "C")]);
        // New transactions, above the highest delivered id: no lookup, sent.
        log.commit(30, vec![event(5, "D"), event(6, "D")]);
        wait_until("30 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(30))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_eq!(
        h.sink.sent_ids(),
        [3, 5, 6],
        "rows already SUCCESS are not sent again"
    );
    for id in 1..=6 {
        assert_eq!(h.store.status(id), "SUCCESS", "row {id}");
    }
    assert_eq!(
        h.stats
            .skipped_delivered
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    assert_no_violations(&confirmed);
}

#[tokio::test]
async fn a_transaction_in_parts_is_sent_as_it_comes_and_confirmed_whole() {
    let mut h = Harness::new(Duration::from_secs(2));
    // Room for one event's bytes: reading pauses after each part until it is written.
    h.settings.delivery.max_in_flight_bytes = 1;
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, _keys) = link();
    let (stop, shutdown) = watch::channel(false);
    h.store
        .insert(&[(1, "A"), (2, "B"), (3, "A"), (4, "B"), (5, "A")]);
    h.sink.hold();

    let driver = async {
        log.commit(5, vec![]);
        log.part(6, vec![event(1, "A"), event(2, "B")]);
        log.part(6, vec![event(3, "A"), event(4, "B")]);
        log.commit(10, vec![event(5, "A")]);
        wait_until("the first part sent", || h.sink.held() == [1, 2]).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            h.sink.held(),
            [1, 2],
            "the byte bound holds the next part back"
        );
        for id in [1, 2] {
            assert!(h.sink.complete(id));
        }
        wait_until("the second part sent", || h.sink.held() == [3, 4]).await;
        assert!(
            last_confirmed(&confirmed) < Some(lsn(10)),
            "nothing of the transaction is confirmed before its end"
        );
        for id in [3, 4] {
            assert!(h.sink.complete(id));
        }
        wait_until("the end sent", || h.sink.held() == [5]).await;
        assert!(h.sink.complete(5));
        wait_until("10 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(10))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    for id in 1..=5 {
        assert_eq!(h.store.status(id), "SUCCESS", "row {id}");
    }
    assert_no_violations(&confirmed);
}

/// The database restarts while Kafka acknowledges: the write-back fails, the session
/// drains what is in flight and ends, and the next session writes those outcomes before it
/// reads. The transaction read again sends only what was never acknowledged.
#[tokio::test]
async fn outcomes_a_failed_write_back_held_are_written_by_the_next_session_not_resent() {
    let h = Harness::new(Duration::from_secs(5));
    let (mut link, _keys) = link();
    let (_stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "A"), (2, "B"), (3, "C"), (4, "D")]);
    h.sink.hold();
    let mut carried = Unwritten::default();

    // Session 1: rows 1 and 2 are acknowledged while the database is down.
    let (mut stream, log, _) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "A"), event(2, "B"), event(3, "C")]);
        wait_until("three in flight", || h.sink.held() == [1, 2, 3]).await;
        h.store.set_unavailable(true);
        assert!(h.sink.complete(1));
        assert!(h.sink.complete(2));
        // Row 3 is still in flight when the write-back fails; the session drains it.
        wait_until("a write-back refused", || h.store.refused_write_backs() > 0).await;
        assert!(h.sink.complete(3));
    };
    let (result, ()) = tokio::join!(
        h.session_carrying(&mut stream, &mut link, shutdown.clone(), &mut carried),
        driver
    );
    let error = result.expect_err("the write-back failed");
    assert!(error.is_transient(), "{error}");
    assert_eq!(
        [1, 2, 3].map(|id| h.store.status(id)),
        ["INIT", "INIT", "INIT"]
    );

    // Session 2: the database is back; the transaction is read again from the log.
    h.store.set_unavailable(false);
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "A"), event(2, "B"), event(3, "C")]);
        log.commit(20, vec![event(4, "D")]);
        wait_until("row 4 in flight", || h.sink.held() == [4]).await;
        assert!(h.sink.complete(4));
        wait_until("20 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(20))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(
        h.session_carrying(&mut stream, &mut link, shutdown, &mut carried),
        driver
    );
    result.unwrap();
    assert_eq!(
        h.sink.sent_ids(),
        [1, 2, 3, 4],
        "rows acknowledged while the database was down are not sent again"
    );
    for id in 1..=4 {
        assert_eq!(h.store.status(id), "SUCCESS", "row {id}");
    }
    assert_no_violations(&confirmed);
}

/// Exactly-once: Kafka transactions end on source transaction boundaries, the checkpoint
/// row never passes what Kafka committed, and after a crash everything past the committed
/// position is sent again, a row the table shows SUCCESS included (its write-back may
/// precede a commit that never happened). A consumer of committed records sees each row
/// once.
#[tokio::test]
async fn exactly_once_commits_whole_transactions_and_resends_past_the_committed_position() {
    let h = Harness::exactly_once();
    let (mut link, _keys) = link();
    h.store
        .insert(&[(1, "A"), (2, "B"), (3, "C"), (4, "D"), (5, "E"), (6, "F")]);

    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "A"), event(2, "B")]);
        log.commit(20, vec![event(3, "C")]);
        wait_until("1-3 committed", || h.sink.committed_ids() == [1, 2, 3]).await;
        assert_eq!(h.sink.last_committed_position(), Some(lsn(20)));
        // A large transaction arrives in parts: nothing of it is committed while it is
        // open.
        log.part(25, vec![event(4, "D"), event(5, "E")]);
        wait_until("4 and 5 sent", || h.sink.sent_ids().len() == 5).await;
        // A negative: nothing is committed for five transaction intervals. No state to
        // wait on says "would have committed by now"; time passing is the condition.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(h.sink.committed_ids(), [1, 2, 3]);
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert!(h.store.checkpoint() <= h.sink.last_committed_position());
    assert_no_violations(&confirmed);

    // As if a write-back of row 4 had committed and its Kafka transaction had not.
    h.store.set_status(4, "SUCCESS");
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        // The log is read again from the checkpoint.
        log.commit(10, vec![event(1, "A"), event(2, "B")]);
        log.commit(20, vec![event(3, "C")]);
        log.part(25, vec![event(4, "D"), event(5, "E")]);
        log.commit(30, vec![event(6, "F")]);
        wait_until("30 committed", || {
            h.sink.last_committed_position() == Some(lsn(30))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_eq!(
        h.sink.committed_ids(),
        [1, 2, 3, 4, 5, 6],
        "each row committed once"
    );
    for id in 1..=6 {
        assert_eq!(h.store.status(id), "SUCCESS", "row {id}");
    }
    assert!(h.store.checkpoint() <= Some(lsn(30)));
    assert_no_violations(&confirmed);
}

/// Exactly-once: a Kafka transaction holds whole source transactions, so one larger than
/// the in-flight bounds cannot be committed; the relay stops with a definite error that
/// names the way out instead of waiting forever.
#[tokio::test]
async fn exactly_once_stops_on_a_transaction_larger_than_the_in_flight_bounds() {
    let mut h = Harness::exactly_once();
    h.settings.delivery.max_in_flight = 3;
    let (mut link, _keys) = link();
    let (_stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "A"), (2, "B"), (3, "C"), (4, "D")]);
    let (mut stream, log, _) = MemoryStream::new(Arc::clone(&h.store));
    log.part(10, vec![event(1, "A"), event(2, "B")]);
    log.part(10, vec![event(3, "C"), event(4, "D")]);
    let result = tokio::time::timeout(
        Duration::from_secs(5),
        h.session(&mut stream, &mut link, shutdown),
    )
    .await
    .expect("the session ends instead of waiting forever");
    let error = result.expect_err("a definite error").to_string();
    assert!(error.contains("delivery.max_in_flight"), "{error}");
    assert!(h.sink.committed_ids().is_empty());
}

/// Exactly-once: transactions read again below the committed position (a crash between a
/// commit and the next checkpoint write) send nothing and never move the committed
/// position back; a checkpoint row reset since the last commit (`recover`, another
/// server with lower positions) wins over the committed position, so nothing is skipped.
#[tokio::test]
async fn exactly_once_never_moves_the_committed_position_back_nor_skips_after_a_reset() {
    let h = Harness::exactly_once();
    let (mut link, _keys) = link();
    h.store
        .insert(&[(1, "A"), (2, "B"), (3, "C"), (4, "D"), (7, "E")]);

    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, _) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "A")]);
        log.commit(20, vec![event(2, "B")]);
        log.commit(30, vec![event(3, "C")]);
        wait_until("30 committed", || {
            h.sink.last_committed_position() == Some(lsn(30))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    // The checkpoint row lags the committed position by one transaction at most.
    assert!(h.store.checkpoint() < Some(lsn(30)));
    assert_eq!(
        h.store.checkpoint(),
        h.sink.last_committed_checkpoint(),
        "each commit records what the checkpoint row shows"
    );

    // Read again from the checkpoint: 20 and 30 are below the committed position.
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, _) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(20, vec![event(2, "B")]);
        log.commit(30, vec![event(3, "C")]);
        log.commit(40, vec![event(4, "D")]);
        wait_until("40 committed", || {
            h.sink.last_committed_position() == Some(lsn(40))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    let positions = h.sink.commit_positions();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "the committed position never moves back: {positions:?}"
    );
    assert_eq!(h.sink.committed_ids(), [1, 2, 3, 4], "nothing sent twice");

    // `recover` on a new server: its positions start low again.
    h.store.reset_checkpoint(Some(lsn(5)));
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, _) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(7, vec![event(7, "E")]);
        wait_until("7 committed", || h.sink.committed_ids().contains(&7)).await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_eq!(h.store.status(7), "SUCCESS");
}

/// Exactly-once: a source transaction in parts that arrives when the window is almost
/// full is read to its end (it alone fits the bounds) and committed whole; no error.
#[tokio::test]
async fn exactly_once_reads_a_transaction_to_its_end_past_a_full_window() {
    let mut h = Harness::exactly_once();
    h.settings.delivery.max_in_flight = 4;
    h.settings.delivery.transaction_interval = Duration::from_secs(1);
    let (mut link, _keys) = link();
    let (stop, shutdown) = watch::channel(false);
    h.store.insert(&[
        (1, "A"),
        (2, "B"),
        (3, "C"),
        (4, "D"),
        (5, "E"),
        (6, "F"),
        (7, "G"),
    ]);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    log.commit(10, vec![event(1, "A"), event(2, "B"), event(3, "C")]);
    log.part(15, vec![event(4, "D"), event(5, "E")]);
    log.part(15, vec![event(6, "F")]);
    log.commit(20, vec![event(7, "G")]);
    let driver = async {
        wait_until("20 committed", || {
            h.sink.last_committed_position() == Some(lsn(20))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_eq!(h.sink.committed_ids(), [1, 2, 3, 4, 5, 6, 7]);
    assert_no_violations(&confirmed);
}

/// `outbox.rows = "deleted"`: nothing but the checkpoint is written back, and a record
/// that is not delivered (no row to mark FAILED) ends the session with the position held
/// before its transaction; the next session reads it again and sends it, then the rest,
/// in order.
#[tokio::test]
async fn deleted_rows_hold_the_position_at_a_failed_record_and_the_next_session_sends_it() {
    let mut h = Harness::new(Duration::from_secs(2));
    h.settings.rows = outboxd_connector::RowLifecycle::Deleted;
    let (mut link, _keys) = link();
    h.sink.fail_id(2, FailureKind::Retryable);

    // Session 1: row 2 fails; row 1's transaction is confirmed, row 2's is not.
    let (_stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    log.commit(10, vec![event(1, "A")]);
    log.commit(20, vec![event(2, "A")]);
    log.commit(30, vec![event(3, "B")]);
    let error = h
        .session(&mut stream, &mut link, shutdown)
        .await
        .expect_err("the session ends on the failed record");
    assert!(matches!(error, PipelineError::NotDelivered(_)), "{error}");
    assert!(error.is_transient(), "a new session follows: {error}");
    assert!(
        h.store.checkpoint() <= Some(lsn(10)),
        "{:?}",
        h.store.checkpoint()
    );
    assert!(last_confirmed(&confirmed) <= Some(lsn(10)));
    assert_eq!(h.store.status(1), "absent", "no row is written");
    assert_no_violations(&confirmed);

    // Session 2: the topic exists now; read again from the held position.
    h.sink.heal();
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(20, vec![event(2, "A")]);
        log.commit(30, vec![event(3, "B")]);
        wait_until("30 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(30))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    let sent = h.sink.sent_ids();
    let resent = &sent[sent.iter().rposition(|id| *id == 2).unwrap()..];
    assert_eq!(
        resent,
        [2, 3],
        "sent again from the held position, in order"
    );
    assert_eq!(h.store.checkpoint(), Some(lsn(30)));
}

/// `outbox.rows = "deleted"`: an event that can never be sent has no row to become
/// MANUAL_REQUIRED, so the relay stops before it (a definite error naming it) instead of
/// skipping it, and sends nothing after it.
#[tokio::test]
async fn deleted_rows_stop_before_an_event_that_can_never_be_sent() {
    let mut h = Harness::new(Duration::from_secs(2));
    h.settings.rows = outboxd_connector::RowLifecycle::Deleted;
    let (mut link, _keys) = link();
    let (_stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let mut bad = event(2, "K");
    bad.rejected = Some("cannot be published: column `type` is NULL".into());
    log.commit(10, vec![event(1, "K")]);
    log.commit(20, vec![bad, event(3, "L")]);
    log.commit(30, vec![event(4, "M")]);
    let error = h
        .session(&mut stream, &mut link, shutdown)
        .await
        .expect_err("the relay stops");
    assert!(!error.is_transient(), "{error}");
    assert!(
        error.to_string().contains("column `type` is NULL"),
        "the reason is named: {error}"
    );
    assert_eq!(h.sink.sent_ids(), [1], "nothing after it is sent");
    assert!(last_confirmed(&confirmed) <= Some(lsn(10)));
    assert_no_violations(&confirmed);
}

/// At least once, the session reads and sends on while a write-back waits for the
/// database; the write-back's position is confirmed once it is durable, and the rows
/// acknowledged meanwhile go in the next one.
#[tokio::test]
async fn the_session_sends_on_while_a_write_back_waits_for_the_database() {
    let h = Harness::new(Duration::from_secs(5));
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, _keys) = link();
    let (stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "A"), (2, "B"), (3, "C")]);
    h.store.hold_write_backs(true);

    let driver = async {
        log.commit(10, vec![event(1, "A"), event(2, "B")]);
        wait_until("a write-back waits", || h.store.held_write_backs() == 1).await;
        log.commit(20, vec![event(3, "C")]);
        wait_until("row 3 sent meanwhile", || h.sink.sent_ids() == [1, 2, 3]).await;
        assert_eq!(
            last_confirmed(&confirmed),
            None,
            "nothing confirmed before it is durable"
        );
        assert_eq!(h.store.status(1), "INIT");
        h.store.hold_write_backs(false);
        wait_until("20 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(20))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    for id in 1..=3 {
        assert_eq!(h.store.status(id), "SUCCESS", "row {id}");
    }
    assert_eq!(h.store.checkpoint(), Some(lsn(20)));
    assert_no_violations(&confirmed);
}

/// `outbox.rows = "deleted"`: a record the destination refuses for good (too large,
/// invalid) would fail the same way every session: the relay stops before it.
#[tokio::test]
async fn deleted_rows_stop_at_a_record_the_destination_refuses_for_good() {
    let mut h = Harness::new(Duration::from_secs(2));
    h.settings.rows = outboxd_connector::RowLifecycle::Deleted;
    let (mut link, _keys) = link();
    let (_stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    h.sink.fail_id(2, FailureKind::Rejected);
    log.commit(10, vec![event(1, "K")]);
    log.commit(20, vec![event(2, "K")]);
    let error = h
        .session(&mut stream, &mut link, shutdown)
        .await
        .expect_err("the relay stops");
    assert!(
        matches!(error, PipelineError::Unpublishable { .. }),
        "{error}"
    );
    assert!(!error.is_transient(), "{error}");
    assert!(last_confirmed(&confirmed) <= Some(lsn(10)));
    assert_no_violations(&confirmed);
}

/// A key the retry worker reports delivered is not released while a row of it this
/// session parked is still on its way to the table (in the batch behind a write-back
/// under way): the table would not show that row yet, and a later event of the key
/// would overtake it.
#[tokio::test]
async fn a_key_is_not_released_while_its_parked_row_waits_behind_a_write_back() {
    let h = Harness::new(Duration::from_secs(5));
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, delivered_keys) = link();
    let (stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "K"), (2, "K"), (3, "K"), (9, "Z")]);
    h.store.set_status(1, "FAILED");

    let driver = async {
        h.store.hold_write_backs(true);
        log.commit(10, vec![event(9, "Z")]);
        wait_until("a write-back waits", || h.store.held_write_backs() == 1).await;
        // Row 2 of the blocked key is parked into the next batch, in memory.
        log.commit(20, vec![event(2, "K")]);
        wait_until("row 2 parked", || {
            h.stats.parked.load(std::sync::atomic::Ordering::Relaxed) == 1
        })
        .await;
        // The retry worker delivers row 1 and says so.
        h.store.set_status(1, "SUCCESS");
        let _ = delivered_keys.send("K".into());
        tokio::task::yield_now().await;
        h.store.hold_write_backs(false);
        wait_until("10 confirmed", || {
            last_confirmed(&confirmed) >= Some(lsn(10))
        })
        .await;
        log.commit(30, vec![event(3, "K")]);
        wait_until("30 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(30))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_eq!(
        h.sink.sent_ids(),
        [9],
        "row 3 must not overtake parked row 2"
    );
    assert_eq!([2, 3].map(|id| h.store.status(id)), ["FAILED", "FAILED"]);
    assert_no_violations(&confirmed);
}

/// Exactly-once: records count as published once their Kafka transaction commits, not
/// when their statuses are written (a commit that fails publishes nothing).
#[tokio::test]
async fn exactly_once_counts_published_records_only_once_committed() {
    let h = Harness::exactly_once();
    let (mut stream, log, _confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, _keys) = link();
    let (_stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "A"), (2, "B")]);
    h.sink.fail_commits(true);
    log.commit(10, vec![event(1, "A"), event(2, "B")]);
    let error = h
        .session(&mut stream, &mut link, shutdown)
        .await
        .expect_err("the commit fails");
    assert!(matches!(error, PipelineError::SinkFailed(_)), "{error}");
    assert_eq!(h.sink.committed_ids(), Vec::<i64>::new());
    assert_eq!(
        h.stats.published.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "nothing committed, nothing published"
    );
    assert_eq!(
        h.stats.metrics.published_of("memory.test.event"),
        0,
        "nor counted in the topic's outboxd_events_published_total"
    );

    h.sink.fail_commits(false);
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, _confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "A"), event(2, "B")]);
        wait_until("1-2 committed", || h.sink.committed_ids() == [1, 2]).await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_eq!(
        h.stats.published.load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    assert_eq!(h.stats.metrics.published_of("memory.test.event"), 2);
}

/// Exactly-once: a row the table shows SUCCESS is sent again when its transaction is past
/// the committed position (its write-back preceded a commit that never happened), and then
/// takes the new record's offset: the old one is in the aborted Kafka transaction.
#[tokio::test]
async fn exactly_once_gives_a_row_sent_again_its_new_position() {
    let h = Harness::exactly_once();
    let (mut stream, log, _confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, _keys) = link();
    let (stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "A")]);
    h.store.set_delivered(1, 1_000);
    let driver = async {
        log.commit(10, vec![event(1, "A")]);
        wait_until("1 committed", || h.sink.committed_ids() == [1]).await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_eq!(h.store.status(1), "SUCCESS");
    let offset = h.store.offset(1);
    assert!(
        offset.is_some_and(|o| o != 1_000),
        "the resent record's offset, not the aborted one: {offset:?}"
    );
}

/// What the relay says about a traced event after its outcome (here: its delivery
/// failed, the row becomes FAILED) is inside the event's span, so the line carries the
/// trace id of the row's `traceparent`; an untraced event's line has no span.
#[tokio::test]
async fn a_traced_events_failure_is_logged_inside_its_span() {
    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let captured = CapturedLog::default();
    let _logging = tracing::subscriber::set_default(captured.subscriber());

    let h = Harness::new(Duration::from_secs(2));
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, _delivered_keys) = link();
    let (stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "K"), (2, "L")]);
    h.sink.fail_id(1, FailureKind::Retryable);
    h.sink.fail_id(2, FailureKind::Retryable);
    let mut traced = event(1, "K");
    traced.headers.push((
        "traceparent".into(),
        bytes::Bytes::from_static(TRACEPARENT.as_bytes()),
    ));
    let driver = async {
        log.commit(10, vec![traced, event(2, "L")]);
        wait_until("rows 1 and 2 FAILED", || {
            h.store.status(1) == "FAILED" && h.store.status(2) == "FAILED"
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_no_violations(&confirmed);

    let text = captured.text();
    let failed_line = |message_id: &str| -> serde_json::Value {
        let line = text
            .lines()
            .find(|l| l.contains("delivery failed") && l.contains(message_id))
            .unwrap_or_else(|| panic!("no failure line for {message_id} in {text}"));
        serde_json::from_str(line).expect("a JSON line")
    };
    let traced = failed_line("\"m-1\"");
    assert_eq!(
        traced["span"]["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736",
        "{traced}"
    );
    assert_eq!(traced["span"]["message_id"], "m-1", "{traced}");
    let untraced = failed_line("\"m-2\"");
    assert!(untraced.get("span").is_none(), "{untraced}");
}

/// Records wait with no acknowledgement (a producer stuck after a broker came back
/// fenced): while a fresh client cannot reach the destination either, the session keeps
/// waiting (strict ordering); once it can, the producer is rebuilt after `stuck_after`,
/// its records fail Fatal (rows INIT, no attempt counted, the position held), the session
/// ends, and the next one sends them again in order. Tokio's paused clock: no real waits.
#[tokio::test(start_paused = true)]
async fn a_stuck_producer_is_rebuilt_once_a_fresh_client_reaches_the_brokers() {
    let h = Harness::new(Duration::from_secs(5));
    let (mut link, _keys) = link();
    h.store.insert(&[(1, "K"), (2, "K"), (3, "L")]);
    h.sink.hold();
    h.sink.set_unreachable(true);

    let (_stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "K")]);
        log.commit(20, vec![event(2, "K"), event(3, "L")]);
        wait_until("three in flight", || h.sink.held() == [1, 2, 3]).await;
        // Twice `stuck_after` with the brokers away too: nothing is rebuilt.
        tokio::time::sleep(h.settings.stuck_after * 2).await;
        assert_eq!(
            h.sink.rebuilds(),
            0,
            "the destination is away: keep waiting"
        );
        assert_eq!(h.sink.held(), [1, 2, 3], "still waiting, in order");
        // The brokers answer a fresh client; the producer still acknowledges nothing: a
        // first healthy look gives it time, the second rebuilds it.
        h.sink.set_unreachable(false);
        tokio::time::sleep(h.settings.stuck_after * 3).await;
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    match result {
        Err(e @ PipelineError::SinkFailed(_)) => assert!(e.is_transient(), "{e}"),
        other => panic!("expected SinkFailed after the rebuild, got {other:?}"),
    }
    assert_eq!(h.sink.rebuilds(), 1);
    assert_eq!(
        h.stats
            .producer_rebuilds
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!([1, 2, 3].map(|id| h.store.status(id)), ["INIT"; 3]);
    assert_eq!(h.store.row(1).unwrap().retry_count, 0, "no attempt counted");
    assert_eq!(h.store.checkpoint(), None, "the position is held");
    assert_no_violations(&confirmed);

    // The next session reads them again and sends them, in order.
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "K")]);
        log.commit(20, vec![event(2, "K"), event(3, "L")]);
        wait_until("20 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(20))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    let sent = h.sink.sent_ids();
    assert_eq!(&sent[3..], [1, 2, 3], "sent again in order");
    assert_eq!([1, 2, 3].map(|id| h.store.status(id)), ["SUCCESS"; 3]);
}

/// Exactly-once take-over: the old instance, not fenced yet, commits its last window and
/// writes the checkpoint row after this session opened the log. The new session fences
/// before it reads the checkpoint, so it sees that window and sends nothing of it again
/// (read first, the stale checkpoint would not match the record, and every transaction
/// after it would be sent again: duplicates for a `read_committed` consumer).
#[tokio::test]
async fn exactly_once_fences_the_old_instance_before_reading_the_checkpoint() {
    let h = Harness::exactly_once();
    let (mut link, _keys) = link();
    h.store.insert(&[(1, "A"), (2, "B"), (3, "C"), (4, "D")]);
    // Both instances saw transactions through 10 committed and checkpointed. Then the
    // old one, not fenced yet, committed two more windows (20, then 30) in Kafka and
    // moved the checkpoint row to 30: the row moves at the fencing, the record was last
    // written by the old instance's commit of 30.
    h.store.reset_checkpoint(Some(lsn(10)));
    h.sink.set_committed_position(CommittedPosition {
        position: lsn(30),
        checkpoint: Some(lsn(20)),
    });
    let store = Arc::clone(&h.store);
    h.sink.before_fencing(move || {
        store.set_status(2, "SUCCESS");
        store.set_status(3, "SUCCESS");
        store.reset_checkpoint(Some(lsn(30)));
    });
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        // The log from the slot's confirmed position (10): the old instance's windows
        // come again, then a new transaction.
        log.commit(20, vec![event(2, "B")]);
        log.commit(30, vec![event(3, "C")]);
        log.commit(40, vec![event(4, "D")]);
        wait_until("40 committed", || {
            h.sink.last_committed_position() == Some(lsn(40))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_eq!(
        h.sink.committed_ids(),
        [4],
        "the old instance's committed windows are not sent again"
    );
    assert_no_violations(&confirmed);
}

/// Issue 26, finding 1. Exactly-once under strict ordering: a window holds row 1 (key K,
/// acknowledged) and row 2 (K, refused before it was sent: MANUAL_REQUIRED); its
/// write-back shows 1 SUCCESS and 2 MANUAL_REQUIRED, then the Kafka commit fails, so row
/// 1's record is in an aborted transaction. The next session holds K back (row 2) and
/// parks row 1 when it reads it again: the park must take the SUCCESS row (its record was
/// never committed), or row 1 stays SUCCESS with the offset of an aborted record while
/// the committed position moves past it, and a `read_committed` consumer never sees it.
/// Parked, row 1 is the earliest row of K in trouble, so the claim worker sends it first.
#[tokio::test]
async fn exactly_once_parks_a_row_whose_success_was_in_an_aborted_transaction() {
    let h = Harness::exactly_once();
    let (mut link, _keys) = link();
    h.store.insert(&[(1, "K"), (2, "K"), (3, "L")]);
    let refused = || {
        let mut bad = event(2, "K");
        bad.rejected = Some("cannot be published: column `message_type` is NULL".into());
        bad
    };

    // Session 1: the write-back happens, the commit fails.
    h.sink.fail_commits(true);
    let (_stop, shutdown) = watch::channel(false);
    let (mut stream, log, _) = MemoryStream::new(Arc::clone(&h.store));
    log.commit(10, vec![event(1, "K"), refused()]);
    let error = h
        .session(&mut stream, &mut link, shutdown)
        .await
        .expect_err("the commit fails");
    assert!(matches!(error, PipelineError::SinkFailed(_)), "{error}");
    assert_eq!(
        [1, 2].map(|id| h.store.status(id)),
        ["SUCCESS", "MANUAL_REQUIRED"],
        "written back before the commit that failed"
    );
    assert!(h.sink.committed_ids().is_empty());

    // Session 2: the log is read again from the committed position (none).
    h.sink.fail_commits(false);
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "K"), refused()]);
        log.commit(20, vec![event(3, "L")]);
        wait_until("20 committed", || {
            h.sink.last_committed_position() == Some(lsn(20))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_no_violations(&confirmed);
    let committed = h.sink.committed_ids();
    for id in 1..=3 {
        assert!(
            h.store.status(id) != "SUCCESS" || committed.contains(&id),
            "row {id} is SUCCESS but its record is in no committed transaction \
             (committed: {committed:?}); the position moved past it, so it is lost"
        );
    }
    let row = h.store.row(1).expect("row 1");
    assert_eq!(row.status, "FAILED", "parked behind row 2");
    assert!(
        row.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("parked: an earlier event of biz_key `K`")),
        "{:?}",
        row.last_error
    );
    assert_eq!(row.offset, None, "no offset of an aborted record");
    assert_eq!(h.store.status(2), "MANUAL_REQUIRED");
    assert_eq!(committed, [3]);
}

/// Issue 26, finding 3. Strict ordering: row 1 (key K) fails, row 2 (K) is parked behind
/// it, and the write-back holding both fails (the database went away). The next session
/// writes what the first could not before it reads: were row 2's park carried without
/// row 1's failure, row 2 would be FAILED and due while row 1 is still INIT, and the
/// claim worker (which takes a key's earliest row in trouble) would send 2 before the
/// relay reads 1 again and parks it. Carried together, row 1 is FAILED first, holds K
/// back when it is read again (so the relay does not send it a second time), and the
/// claim worker sends 1, then 2.
#[tokio::test(start_paused = true)]
async fn a_carried_park_never_comes_due_before_the_failure_behind_it() {
    let h = Harness::new(Duration::from_secs(5));
    let (mut link, _keys) = link();
    h.store.insert(&[(1, "K"), (2, "K")]);
    h.sink.fail_id(1, FailureKind::Retryable);
    let mut carried = Unwritten::default();

    // Session 1: row 1 fails, row 2 is parked, and the database is down.
    h.store.set_unavailable(true);
    let (_stop, shutdown) = watch::channel(false);
    let (mut stream, log, _) = MemoryStream::new(Arc::clone(&h.store));
    log.commit(10, vec![event(1, "K")]);
    log.commit(20, vec![event(2, "K")]);
    let error = h
        .session_carrying(&mut stream, &mut link, shutdown, &mut carried)
        .await
        .expect_err("the write-back fails");
    assert!(error.is_transient(), "{error}");
    assert_eq!(h.stats.parked.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!([1, 2].map(|id| h.store.status(id)), ["INIT", "INIT"]);

    // Session 2: the database is back; the carried outcomes are written before it reads.
    h.store.set_unavailable(false);
    h.sink.heal();
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        wait_until("the carried outcomes written", || {
            h.store.status(2) != "INIT"
        })
        .await;
        assert_ne!(
            h.store.status(1),
            "INIT",
            "row 2 is FAILED and due while row 1, before it, is INIT: the claim worker \
             would send 2 before the relay reads 1 again"
        );
        log.commit(10, vec![event(1, "K")]);
        log.commit(20, vec![event(2, "K")]);
        wait_until("20 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(20))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(
        h.session_carrying(&mut stream, &mut link, shutdown, &mut carried),
        driver
    );
    result.unwrap();
    assert_no_violations(&confirmed);
    assert_eq!(
        h.sink.sent_ids(),
        [1],
        "read again, row 1 waits for the claim worker instead of being sent twice"
    );
    let first = h.store.row(1).expect("row 1");
    assert_eq!((first.status, first.retry_count), ("FAILED", 1));
    assert!(
        first
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("Retryable failure of row 1")),
        "{:?}",
        first.last_error
    );
    assert_eq!(h.store.status(2), "FAILED");
}

/// Runs sessions carrying what each leaves to the next (as `relay::run` does), each
/// reading the log again with `feed`, until one commits through `lsn(end)` (and is
/// stopped) or `max` sessions have failed; returns the failures, in order.
async fn sessions_until_committed(
    h: &Harness,
    link: &mut RetryLink,
    carried: &mut Unwritten,
    feed: impl Fn(&crate::testing::LogWriter),
    end: u64,
    max: usize,
) -> Vec<PipelineError> {
    let mut errors = Vec::new();
    while errors.len() < max {
        let (stop, shutdown) = watch::channel(false);
        let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
        feed(&log);
        let ended = std::sync::atomic::AtomicBool::new(false);
        let session = async {
            let result = h
                .session_carrying(&mut stream, link, shutdown, carried)
                .await;
            ended.store(true, std::sync::atomic::Ordering::SeqCst);
            result
        };
        let driver = async {
            wait_until("committed through the end, or the session ended", || {
                h.sink.last_committed_position() == Some(lsn(end))
                    || ended.load(std::sync::atomic::Ordering::SeqCst)
            })
            .await;
            stop.send_replace(true);
        };
        let (result, ()) = tokio::join!(session, driver);
        assert_no_violations(&confirmed);
        match result {
            Ok(()) => return errors,
            Err(e) => errors.push(e),
        }
    }
    errors
}

/// Issue 26, finding 2. Exactly-once: inside a Kafka transaction a record the broker
/// refuses for good (larger than the topic's `max.message.bytes`) dooms the transaction,
/// and a session that sent it again every time would abort every time, forever. The
/// record's row becomes FAILED (with the broker's reason, an attempt counted) outside
/// the aborted transaction instead: the next session writes it before it reads and does
/// not send it in a transaction again; the rest of the window is sent again and
/// committed; under strict ordering its key's later rows are parked behind it. Nothing
/// of the aborted window is written SUCCESS. The claim worker then retries the row like
/// any FAILED row (at least once), up to MANUAL_REQUIRED.
#[tokio::test]
async fn exactly_once_a_record_the_broker_refuses_becomes_failed_outside_the_transaction() {
    for ordering in [KeyOrdering::Strict, KeyOrdering::Relaxed] {
        let mut h = Harness::exactly_once();
        h.settings.ordering = ordering;
        let (mut link, _keys) = link();
        h.store.insert(&[(1, "K"), (2, "L"), (3, "M"), (4, "L")]);
        h.sink.fail_id(2, FailureKind::Rejected);
        let feed = |log: &crate::testing::LogWriter| {
            log.commit(10, vec![event(1, "K"), event(2, "L")]);
            log.commit(20, vec![event(3, "M")]);
            log.commit(30, vec![event(4, "L")]);
        };
        let mut carried = Unwritten::default();

        let errors = sessions_until_committed(&h, &mut link, &mut carried, feed, 30, 1).await;
        assert_eq!(errors.len(), 1, "{ordering:?}: the first session ends");
        for id in [1, 3, 4] {
            assert_ne!(
                h.store.status(id),
                "SUCCESS",
                "{ordering:?}: row {id} written SUCCESS by a window that cannot commit"
            );
        }
        assert!(h.sink.committed_ids().is_empty());

        let more = sessions_until_committed(&h, &mut link, &mut carried, feed, 30, 2).await;
        assert!(
            more.is_empty(),
            "{ordering:?}: the refused record stops the relay: {}",
            more.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" / ")
        );
        let error = &errors[0];
        assert!(error.is_transient(), "{ordering:?}: {error}");
        let text = error.to_string();
        assert!(
            text.contains("m-2") && text.contains("Rejected failure of row 2"),
            "{ordering:?}: names the row and the broker's reason: {text}"
        );
        let sent_2 = h.sink.sent_ids().iter().filter(|id| **id == 2).count();
        assert_eq!(
            sent_2, 1,
            "{ordering:?}: row 2 sent in one transaction only"
        );
        let refused = h.store.row(2).expect("row 2");
        assert_eq!(
            (refused.status, refused.retry_count),
            ("FAILED", 1),
            "{ordering:?}"
        );
        assert!(
            refused
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("Rejected failure of row 2")),
            "{ordering:?}: {:?}",
            refused.last_error
        );
        match ordering {
            KeyOrdering::Strict => {
                assert_eq!(h.sink.committed_ids(), [1, 3]);
                assert_eq!(h.store.status(4), "FAILED", "parked behind row 2");
            }
            KeyOrdering::Relaxed => {
                assert_eq!(h.sink.committed_ids(), [1, 3, 4]);
                assert_eq!(h.store.status(4), "SUCCESS");
            }
        }
        for id in [1, 3] {
            assert_eq!(h.store.status(id), "SUCCESS", "{ordering:?}: row {id}");
        }
    }
}
