//! The scenarios of the sink conformance suite, each generic over a [`SinkHarness`] and
//! calling only the [`Sink`] trait: what the trait's doc promises, checked against the
//! destination itself (the harness's reader), never against the sink's own account.
//!
//! - per-key order under concurrency with other keys;
//! - failure classification: refused for good is `Rejected` (that record alone),
//!   unreachable `Retryable`;
//! - `recover`: a healthy sink is kept, a fatal one is replaced and delivers again;
//! - the local byte bound: `send` waits rather than queue past it;
//! - the shutdown drain: `flush` waits for every record handed over, whether its outcome
//!   is awaited (the relay's window) or its delivery was dropped (a claim's deadline),
//!   and `queue_depth` is back to 0.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use futures_util::FutureExt;
use tokio::time::Instant;

use super::{decided, SinkHarness, DECIDED_WITHIN};
use crate::sink::{CommittedPosition, FailureKind, Sink};
use crate::testing::{event, lsn};

/// Row id of record `n` of key number `key`.
fn id_of(key: i64, n: i64) -> i64 {
    (key + 1) * 1000 + n
}

/// Key number of a row id of [`id_of`].
fn key_of(id: i64) -> i64 {
    id / 1000 - 1
}

fn key_name(key: i64) -> String {
    format!("key-{key}")
}

/// Waits (bounded) until the sink counts nothing undecided: every record's outcome is in,
/// but a sink may let go of a record a moment after resolving it (librdkafka does).
async fn queue_returns_to_zero(sink: &impl Sink) {
    let until = Instant::now() + Duration::from_secs(5);
    while sink.queue_depth() != 0 {
        assert!(
            Instant::now() < until,
            "queue_depth is still {} with every outcome in",
            sink.queue_depth()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Records of one key handed over in order reach the destination in that order, while
/// other keys are sent at the same time from other tasks; each exactly once.
pub(crate) async fn each_keys_records_arrive_in_send_order_among_concurrent_keys<H: SinkHarness>() {
    const KEYS: i64 = 6;
    const PER_KEY: i64 = 25;
    let harness = H::start().await;
    let sink = harness.sink().await;
    // One sender per key, all at once. Each hands its key's records over in order, the
    // next once the previous is handed over, as the core does.
    let senders: Vec<_> = (0..KEYS)
        .map(|key| {
            let sink = Arc::clone(&sink);
            tokio::spawn(async move {
                let mut deliveries = Vec::new();
                for n in 0..PER_KEY {
                    let id = id_of(key, n);
                    deliveries.push((id, sink.send(&event(id, &key_name(key))).await));
                    tokio::task::yield_now().await;
                }
                deliveries
            })
        })
        .collect();
    let mut deliveries = Vec::new();
    for sender in senders {
        deliveries.extend(sender.await.expect("a sender task"));
    }
    let outcomes =
        join_all(deliveries.into_iter().map(|(id, delivery)| async move {
            (id, decided(&format!("m-{id}"), delivery).await)
        }))
        .await;
    for (id, outcome) in &outcomes {
        assert!(outcome.is_ok(), "m-{id}: {outcome:?}");
    }

    let arrived = harness.delivered(outcomes.len()).await;
    let mut by_key: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for id in arrived {
        by_key.entry(key_of(id)).or_default().push(id);
    }
    for key in 0..KEYS {
        let sent: Vec<i64> = (0..PER_KEY).map(|n| id_of(key, n)).collect();
        assert_eq!(
            by_key.get(&key),
            Some(&sent),
            "{}: every record once, in send order",
            key_name(key)
        );
    }
    assert_eq!(by_key.len(), KEYS as usize, "nothing else arrived");
    queue_returns_to_zero(&*sink).await;
}

/// A record the destination refuses for good fails `Rejected` with the destination's
/// reason; the refusal is the record's, so the sink delivers the next one.
pub(crate) async fn a_record_the_destination_refuses_is_rejected_and_others_go_on<
    H: SinkHarness,
>() {
    let harness = H::start().await;
    let sink = harness.sink().await;
    let refused = harness.refused_event(1, "refused");
    let failure = decided("the refused record", sink.send(&refused).await)
        .await
        .expect_err("the destination refuses it");
    // Refused for good: Rejected (Kafka: FAILED, retries spent before MANUAL_REQUIRED) or
    // Refused (HTTP's 4xx: MANUAL_REQUIRED at once); never retryable nor fatal.
    assert!(
        matches!(failure.kind, FailureKind::Rejected | FailureKind::Refused),
        "{:?}: {}",
        failure.kind,
        failure.error
    );
    assert!(
        !failure.error.trim().is_empty(),
        "the reason is what the row's last_error shows"
    );

    let next = decided("the next record", sink.send(&event(2, "other")).await).await;
    assert!(next.is_ok(), "the sink goes on after a refusal: {next:?}");
    assert_eq!(
        harness.delivered(1).await,
        [2],
        "the refused record is not in the destination, the next one is"
    );
    queue_returns_to_zero(&*sink).await;
}

/// The refusal of one record is that record's alone: records handed over with it, of its
/// key before it and of other keys, go (their rows are not to be failed, let alone
/// counted towards MANUAL_REQUIRED, for a neighbour).
pub(crate) async fn a_refusal_is_the_records_alone_not_its_neighbours<H: SinkHarness>() {
    let harness = H::start().await;
    let sink = harness.sink().await;
    let mut deliveries = Vec::new();
    for id in [1, 2] {
        deliveries.push((id, sink.send(&event(id, "k")).await));
    }
    let refused = harness.refused_event(3, "k");
    deliveries.push((3, sink.send(&refused).await));
    for id in [4, 5] {
        deliveries.push((id, sink.send(&event(id, "other")).await));
    }
    for (id, delivery) in deliveries {
        let outcome = decided(&format!("m-{id}"), delivery).await;
        match outcome {
            Err(failure) if id == 3 => assert!(
                matches!(failure.kind, FailureKind::Rejected | FailureKind::Refused),
                "{:?}: {}",
                failure.kind,
                failure.error
            ),
            Ok(_) if id != 3 => {}
            other => panic!("m-{id}: {other:?}"),
        }
    }
    let mut arrived = harness.delivered(4).await;
    arrived.sort_unstable();
    assert_eq!(arrived, [1, 2, 4, 5]);
}

/// A destination nobody answers at: the record fails `Retryable` (the row is retried
/// with backoff), within a bound, and is not counted as undecided any more.
pub(crate) async fn an_unreachable_destination_is_retryable<H: SinkHarness>() {
    let harness = H::start().await;
    let sink = harness.unreachable_sink().await;
    let failure = decided("a record nobody answers", sink.send(&event(1, "k")).await)
        .await
        .expect_err("nobody answers");
    assert_eq!(failure.kind, FailureKind::Retryable, "{}", failure.error);
    assert!(!failure.error.trim().is_empty());
    queue_returns_to_zero(&*sink).await;
}

/// `recover` on a healthy sink replaces nothing (`Ok(false)`) and the sink goes on.
pub(crate) async fn recover_keeps_a_healthy_sink<H: SinkHarness>() {
    let harness = H::start().await;
    let sink = harness.sink().await;
    let first = decided("m-1", sink.send(&event(1, "k")).await).await;
    assert!(first.is_ok(), "{first:?}");
    assert_eq!(sink.recover().await, Ok(false), "a healthy sink is kept");
    let second = decided("m-2", sink.send(&event(2, "k")).await).await;
    assert!(second.is_ok(), "{second:?}");
    assert_eq!(harness.delivered(2).await, [1, 2]);
}

/// A sink in its fatal state fails every record `Fatal` (the row is not to blame);
/// `recover` replaces what was fatal (`Ok(true)`), after which records go again (a
/// transactional sink first starts a new session, as the relay's next session does) and
/// a second `recover` finds nothing to replace. The record that failed is not in the
/// destination: the caller sends it again.
pub(crate) async fn a_fatal_sink_fails_fatal_until_recovered<H: SinkHarness>() {
    let harness = H::start().await;
    let sink = harness.fatal_sink().await;
    let failure = decided(
        "a record of the fatal sink",
        sink.send(&event(1, "k")).await,
    )
    .await
    .expect_err("a fatal sink delivers nothing");
    assert_eq!(failure.kind, FailureKind::Fatal, "{}", failure.error);

    assert_eq!(sink.recover().await, Ok(true), "recover replaces it");
    if sink.transactional() {
        sink.committed_position()
            .await
            .expect("a new session starts on the recovered sink");
    }
    let again = decided("a record after recover", sink.send(&event(2, "k")).await).await;
    assert!(again.is_ok(), "the recovered sink delivers: {again:?}");
    if sink.transactional() {
        let committed = CommittedPosition {
            position: lsn(2),
            checkpoint: None,
        };
        sink.commit(&committed).await.expect("commit");
    }
    assert_eq!(
        sink.recover().await,
        Ok(false),
        "once recovered, nothing to replace"
    );
    assert_eq!(
        harness.delivered(1).await,
        [2],
        "only the record sent after recover is in the destination"
    );
}

/// A sink with a local byte bound never holds more than it: `send` waits for room. The
/// destination takes nothing, so records leave only by being given up (retryable); of
/// 1.5 times the bound handed over, never more than the bound is undecided at once.
/// Undecided is what the deliveries say at each handover, not `queue_depth` (which may
/// count more than records: librdkafka's pending events).
pub(crate) async fn handed_over_bytes_stay_within_the_bound<H: SinkHarness>() {
    const RECORDS: usize = 24;
    let harness = H::start().await;
    let (sink, bound) = harness.bounded_sink().await;
    let size = bound / 16;
    let most = bound / size;
    let mut undecided = Vec::new();
    let mut outcomes = Vec::new();
    let mut deepest = 0;
    for id in 1..=RECORDS {
        let mut record = event(id as i64, &format!("key-{}", id % 4));
        record.payload = Bytes::from(vec![b'x'; size]);
        let delivery = tokio::time::timeout(DECIDED_WITHIN, sink.send(&record))
            .await
            .expect("send waits only until records given up make room");
        undecided.push(Box::pin(delivery));
        undecided.retain_mut(|delivery| match delivery.as_mut().now_or_never() {
            Some(outcome) => {
                outcomes.push(outcome);
                false
            }
            None => true,
        });
        deepest = deepest.max(undecided.len());
    }
    assert!(
        deepest <= most,
        "at most {most} records of {size} bytes ({bound} bytes) undecided at once; saw \
         {deepest} of the {RECORDS} handed over"
    );
    for (n, delivery) in undecided.into_iter().enumerate() {
        outcomes.push(decided(&format!("undecided record {n}"), delivery).await);
    }
    assert_eq!(outcomes.len(), RECORDS);
    for outcome in outcomes {
        let failure = outcome.expect_err("the destination takes nothing");
        assert_eq!(failure.kind, FailureKind::Retryable, "{}", failure.error);
    }
    queue_returns_to_zero(&*sink).await;
}

/// Records handed over for the shutdown drains: 12 over 3 keys.
const DRAINED: i64 = 12;
/// What a drain's `flush` is given.
const FLUSH_DEADLINE: Duration = Duration::from_secs(10);

/// Shutdown, while the relay's window still awaits outcomes: `flush` returns once every
/// record handed over is decided (before its deadline, `queue_depth` 0), and once the
/// process is gone (the sink dropped) the destination holds them all.
pub(crate) async fn flush_waits_for_records_whose_outcome_is_awaited<H: SinkHarness>() {
    let harness = H::start().await;
    harness.slow_down();
    let sink = harness.sink().await;
    let mut deliveries = Vec::new();
    for id in 1..=DRAINED {
        deliveries.push(sink.send(&event(id, &format!("key-{}", id % 3))).await);
    }
    let awaiting = tokio::spawn(join_all(deliveries));
    let started = Instant::now();
    sink.flush(FLUSH_DEADLINE).await;
    assert!(
        started.elapsed() < FLUSH_DEADLINE,
        "flush returned at its deadline, not once the records were decided"
    );
    assert_eq!(
        sink.queue_depth(),
        0,
        "flush returned with records undecided"
    );
    drop(sink);
    let outcomes = tokio::time::timeout(DECIDED_WITHIN, awaiting)
        .await
        .expect("outcomes after flush")
        .expect("the awaiting task");
    for outcome in &outcomes {
        assert!(outcome.is_ok(), "{outcome:?}");
    }
    let mut arrived = harness.delivered(DRAINED as usize).await;
    arrived.sort_unstable();
    assert_eq!(arrived, (1..=DRAINED).collect::<Vec<_>>());
}

/// Shutdown after a caller stopped waiting (a claim's deadline drops the delivery; the
/// record may still go): `flush` waits for those records too, and once the process is
/// gone (the sink dropped) the destination holds them all.
pub(crate) async fn flush_waits_for_records_whose_delivery_was_dropped<H: SinkHarness>() {
    let harness = H::start().await;
    harness.slow_down();
    let sink = harness.sink().await;
    for id in 1..=DRAINED {
        drop(sink.send(&event(id, &format!("key-{}", id % 3))).await);
    }
    let started = Instant::now();
    sink.flush(FLUSH_DEADLINE).await;
    assert!(
        started.elapsed() < FLUSH_DEADLINE,
        "flush returned at its deadline, not once the records were decided"
    );
    assert_eq!(
        sink.queue_depth(),
        0,
        "flush returned with records undecided"
    );
    drop(sink);
    let mut arrived = harness.delivered(DRAINED as usize).await;
    arrived.sort_unstable();
    assert_eq!(
        arrived,
        (1..=DRAINED).collect::<Vec<_>>(),
        "what flush did not wait for is lost when the process goes"
    );
}
