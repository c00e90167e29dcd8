//! The relay session without Kafka or a database: the in-memory sink, store and stream
//! drive the checkpoint, strict-ordering parking and release, the shutdown drain and a
//! fatal sink error. Every confirmation is checked by the stream itself (see
//! [`crate::testing::MemoryStream`]): never backward, never past an INIT row.
//!
//! Every test runs on tokio's paused clock (`start_paused`): a wait for "nothing more
//! happens" (a pause before asserting that a row was not sent) passes virtual time once
//! every task is idle, so it proves the absence without sleeping on the real clock, and
//! the timeouts of minutes (`stuck_after`, `delivery.store_timeout`) pass at once.

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

mod deleted_rows;
mod exactly_once;
mod faults;

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
                    store_timeout: Duration::from_secs(60),
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

#[tokio::test(start_paused = true)]
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

/// Random transactions completed in random orders, relaxed ordering so every event is
/// sent: each confirmation is checked by the stream, and the last one is reached.
#[tokio::test(start_paused = true)]
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

#[tokio::test(start_paused = true)]
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
#[tokio::test(start_paused = true)]
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

#[tokio::test(start_paused = true)]
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

#[tokio::test(start_paused = true)]
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

/// At least once, the session reads and sends on while a write-back waits for the
/// database; the write-back's position is confirmed once it is durable, and the rows
/// acknowledged meanwhile go in the next one.
#[tokio::test(start_paused = true)]
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

/// A key the retry worker reports delivered is not released while a row of it this
/// session parked is still on its way to the table (in the batch behind a write-back
/// under way): the table would not show that row yet, and a later event of the key
/// would overtake it.
#[tokio::test(start_paused = true)]
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

/// What the relay says about a traced event after its outcome (here: its delivery
/// failed, the row becomes FAILED) is inside the event's span, so the line carries the
/// trace id of the row's `traceparent`; an untraced event's line has no span.
#[tokio::test(start_paused = true)]
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

/// A record the destination refuses for good (an HTTP 4xx): its row is MANUAL_REQUIRED at
/// once, with the answer, and under strict ordering its key's later event waits behind it
/// (parked) while other keys flow.
#[tokio::test(start_paused = true)]
async fn a_refused_record_is_manual_required_at_once_and_holds_its_key() {
    let h = Harness::new(Duration::from_secs(2));
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, _keys) = link();
    let (stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "K"), (2, "K"), (3, "L")]);
    h.sink.fail_id(1, FailureKind::Refused);

    let driver = async {
        log.commit(10, vec![event(1, "K")]);
        wait_until("row 1 MANUAL_REQUIRED", || {
            h.store.status(1) == "MANUAL_REQUIRED"
        })
        .await;
        log.commit(20, vec![event(2, "K"), event(3, "L")]);
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
        [1, 3],
        "row 2 waits behind its key's refused row"
    );
    assert_eq!(
        [1, 2, 3].map(|id| h.store.status(id)),
        ["MANUAL_REQUIRED", "FAILED", "SUCCESS"]
    );
    let row = h.store.row(1).expect("row 1");
    assert!(
        row.last_error
            .unwrap_or_default()
            .contains("Refused failure of row 1"),
        "the answer is the row's last_error"
    );
    assert_no_violations(&confirmed);
}
