//! The checks of `verify`: what was written against what the sink delivered and what the
//! outbox rows say. Pure (no I/O), so each finding is unit-tested on made-up runs, the
//! broken ones included.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use outboxd_connector::OwnRowState;
use serde::Serialize;

use super::plan::PlannedEvent;

/// How a transaction of `verify` ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Committed: its events must arrive.
    Committed,
    /// Rolled back: none may.
    RolledBack,
    /// The commit's answer was lost (the connection dropped): the table says which.
    Unknown,
}

/// An event as written.
#[derive(Clone, Debug)]
pub(crate) struct WrittenEvent {
    pub(crate) event: PlannedEvent,
    pub(crate) outcome: Outcome,
    /// When its transaction's commit returned.
    pub(crate) committed_at: Option<Instant>,
}

/// One copy of an event the sink delivered.
#[derive(Clone, Debug)]
pub(crate) struct Arrival {
    pub(crate) index: u64,
    pub(crate) at: Instant,
    /// Kafka's partition and offset; `None` for HTTP.
    pub(crate) position: Option<(i32, i64)>,
    /// Kafka's record key; `None` for HTTP.
    pub(crate) record_key: Option<Vec<u8>>,
}

/// What the configuration promises, which decides what is a failure.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct Promise {
    /// `delivery.exactly_once`: no duplicates.
    pub(crate) exactly_once: bool,
    /// `pipeline.ordering = "strict"`: a key's events in commit order.
    pub(crate) strict_order: bool,
    /// `outbox.rows = "kept"`: every delivered row shows SUCCESS.
    pub(crate) rows_kept: bool,
    /// The sink has positions (Kafka): a SUCCESS row's partition and offset name a copy.
    pub(crate) sink_positions: bool,
}

/// A few examples of a finding: enough to look into, never the whole run.
pub(super) const EXAMPLES: usize = 5;

/// Commit → first arrival, in milliseconds.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub(crate) struct Latency {
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
}

/// What the checks found.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Findings {
    pub(crate) events_committed: u64,
    pub(crate) events_rolled_back: u64,
    /// Committed events that arrived (each counted once).
    pub(crate) delivered: u64,
    /// Committed events that never arrived.
    pub(crate) lost: u64,
    pub(crate) lost_examples: Vec<String>,
    /// Rolled-back events that arrived.
    pub(crate) phantoms: u64,
    pub(crate) phantom_examples: Vec<String>,
    /// Copies beyond the first.
    pub(crate) duplicates: u64,
    /// Events that first arrived after a later event of their key.
    pub(crate) order_violations: u64,
    pub(crate) order_examples: Vec<String>,
    /// Kafka copies under another record key than their `biz_key`, and keys whose copies
    /// landed in more than one partition: either breaks per-key order for consumers.
    pub(crate) routing_violations: u64,
    pub(crate) routing_examples: Vec<String>,
    /// Committed events whose row does not show SUCCESS.
    pub(crate) status_mismatches: u64,
    pub(crate) status_examples: Vec<String>,
    /// SUCCESS rows whose partition and offset name no copy that arrived.
    pub(crate) position_mismatches: u64,
    pub(crate) position_examples: Vec<String>,
    pub(crate) latency: Latency,
    /// What failed, one line each; empty when the run passed.
    pub(crate) failures: Vec<String>,
}

pub(super) fn example(list: &mut Vec<String>, text: impl FnOnce() -> String) {
    if list.len() < EXAMPLES {
        list.push(text());
    }
}

/// The value at `q` (0..=1) of sorted `values`.
pub(super) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Checks a run. `arrivals` are in the order they arrived (per Kafka partition, the log's
/// order); `rows` are the outbox rows found, by message id.
pub(crate) fn check(
    written: &[WrittenEvent],
    arrivals: &[Arrival],
    rows: &HashMap<String, OwnRowState>,
    promise: Promise,
) -> Findings {
    let mut f = Findings::default();
    let mut copies: HashMap<u64, Vec<&Arrival>> = HashMap::new();
    for arrival in arrivals {
        copies.entry(arrival.index).or_default().push(arrival);
    }
    let by_index: HashMap<u64, &WrittenEvent> =
        written.iter().map(|w| (w.event.index, w)).collect();
    let committed = |w: &WrittenEvent| match w.outcome {
        Outcome::Committed => true,
        Outcome::RolledBack => false,
        // A commit whose answer was lost took effect if its row exists (or, with rows
        // deleted, if it arrived).
        Outcome::Unknown => {
            rows.contains_key(&w.event.message_id) || copies.contains_key(&w.event.index)
        }
    };

    let mut latencies = Vec::new();
    for w in written {
        let arrived = copies.get(&w.event.index);
        if !committed(w) {
            f.events_rolled_back += 1;
            if arrived.is_some() {
                f.phantoms += 1;
                example(&mut f.phantom_examples, || w.event.message_id.clone());
            }
            continue;
        }
        f.events_committed += 1;
        let Some(arrived) = arrived else {
            f.lost += 1;
            example(&mut f.lost_examples, || w.event.message_id.clone());
            continue;
        };
        f.delivered += 1;
        f.duplicates += arrived.len() as u64 - 1;
        if let Some(at) = w.committed_at {
            let first = arrived[0].at.saturating_duration_since(at);
            latencies.push(first.as_secs_f64() * 1000.0);
        }
        if !promise.rows_kept {
            continue;
        }
        match rows.get(&w.event.message_id) {
            Some(row) if row.status == "SUCCESS" => {
                let named = arrived.iter().any(|a| a.position == row.position);
                if promise.sink_positions && !named {
                    f.position_mismatches += 1;
                    example(&mut f.position_examples, || {
                        format!(
                            "{}: the row says {:?}, the copies are at {:?}",
                            w.event.message_id,
                            row.position,
                            arrived.iter().map(|a| a.position).collect::<Vec<_>>()
                        )
                    });
                }
            }
            other => {
                f.status_mismatches += 1;
                example(&mut f.status_examples, || match other {
                    Some(row) => format!(
                        "{}: {} (retry_count {}, last_error {:?})",
                        w.event.message_id, row.status, row.retry_count, row.last_error
                    ),
                    None => format!("{}: the row is gone", w.event.message_id),
                });
            }
        }
    }

    // Order: per key, each event's first copy must come after the first copies of the
    // key's earlier events. Copies sent again (at-least-once) do not count.
    let mut highest: HashMap<u32, u64> = HashMap::new();
    let mut first_seen = std::collections::HashSet::new();
    for arrival in arrivals {
        let Some(w) = by_index.get(&arrival.index) else {
            continue;
        };
        if !first_seen.insert(arrival.index) {
            continue;
        }
        let top = highest.entry(w.event.key).or_insert(arrival.index);
        if arrival.index < *top {
            f.order_violations += 1;
            let (event, after) = (arrival.index, *top);
            example(&mut f.order_examples, || {
                format!(
                    "key {}: event {event} arrived after event {after}",
                    w.event.key
                )
            });
        } else {
            *top = arrival.index;
        }
    }

    // Routing (Kafka): each copy under its key, each key in one partition.
    let mut partitions: HashMap<u32, i32> = HashMap::new();
    for arrival in arrivals {
        let (Some(w), Some(record_key)) = (by_index.get(&arrival.index), &arrival.record_key)
        else {
            continue;
        };
        if record_key.as_slice() != w.event.biz_key.as_bytes() {
            f.routing_violations += 1;
            example(&mut f.routing_examples, || {
                format!(
                    "{}: record key {:?}, not its biz_key",
                    w.event.message_id,
                    String::from_utf8_lossy(record_key)
                )
            });
        }
        let Some((partition, _)) = arrival.position else {
            continue;
        };
        let first = *partitions.entry(w.event.key).or_insert(partition);
        if first != partition {
            f.routing_violations += 1;
            example(&mut f.routing_examples, || {
                format!(
                    "key {}: {} in partition {partition}, earlier events in {first}",
                    w.event.key, w.event.message_id
                )
            });
        }
    }

    latencies.sort_by(f64::total_cmp);
    f.latency = Latency {
        p50_ms: percentile(&latencies, 0.50),
        p99_ms: percentile(&latencies, 0.99),
        max_ms: latencies.last().copied().unwrap_or(0.0),
    };
    f.failures = verdict(&f, promise);
    f
}

fn verdict(f: &Findings, promise: Promise) -> Vec<String> {
    let mut failures = Vec::new();
    if f.lost > 0 {
        failures.push(format!("{} committed event(s) never arrived", f.lost));
    }
    if f.phantoms > 0 {
        failures.push(format!("{} rolled-back event(s) arrived", f.phantoms));
    }
    if f.order_violations > 0 && promise.strict_order {
        failures.push(format!(
            "{} event(s) arrived after a later event of their key",
            f.order_violations
        ));
    }
    if f.routing_violations > 0 {
        failures.push(format!(
            "{} record(s) under another key or in another partition than their key's",
            f.routing_violations
        ));
    }
    if f.duplicates > 0 && promise.exactly_once {
        failures.push(format!("{} duplicate(s) under exactly-once", f.duplicates));
    }
    if f.status_mismatches > 0 {
        failures.push(format!(
            "{} delivered event(s) whose row does not show SUCCESS",
            f.status_mismatches
        ));
    }
    if f.position_mismatches > 0 {
        failures.push(format!(
            "{} row(s) whose partition and offset name no delivered copy",
            f.position_mismatches
        ));
    }
    if f.events_committed == 0 {
        failures.push("no event was committed: nothing was checked".into());
    }
    failures
}

/// How long a run took, for the report.
pub(crate) fn seconds(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROMISE: Promise = Promise {
        exactly_once: true,
        strict_order: true,
        rows_kept: true,
        sink_positions: true,
    };

    /// `n` committed events over `keys` keys (event i on key i % keys), each delivered
    /// once at offset i, every row SUCCESS at its offset.
    fn healthy(
        n: u64,
        keys: u32,
    ) -> (
        Vec<WrittenEvent>,
        Vec<Arrival>,
        HashMap<String, OwnRowState>,
    ) {
        let start = Instant::now();
        let mut written = Vec::new();
        let mut arrivals = Vec::new();
        let mut rows = HashMap::new();
        for i in 0..n {
            let message_id = format!("m{i}");
            written.push(WrittenEvent {
                event: PlannedEvent {
                    index: i,
                    key: (i % u64::from(keys)) as u32,
                    message_id: message_id.clone(),
                    biz_key: format!("k{}", i % u64::from(keys)),
                },
                outcome: Outcome::Committed,
                committed_at: Some(start),
            });
            arrivals.push(Arrival {
                index: i,
                at: start + Duration::from_millis(10 + i),
                position: Some((0, i as i64)),
                record_key: Some(format!("k{}", i % u64::from(keys)).into_bytes()),
            });
            rows.insert(
                message_id.clone(),
                OwnRowState {
                    message_id,
                    status: "SUCCESS".into(),
                    retry_count: 0,
                    position: Some((0, i as i64)),
                    last_error: None,
                },
            );
        }
        (written, arrivals, rows)
    }

    #[test]
    fn a_healthy_run_passes_with_its_latency() {
        let (written, arrivals, rows) = healthy(100, 4);
        let f = check(&written, &arrivals, &rows, PROMISE);
        assert!(f.failures.is_empty(), "{:?}", f.failures);
        assert_eq!((f.events_committed, f.delivered, f.lost), (100, 100, 0));
        assert_eq!(f.latency.max_ms, 109.0);
        assert_eq!(f.latency.p50_ms, 60.0);
    }

    #[test]
    fn a_relay_that_drops_one_event_in_ten_fails_with_the_count() {
        let (written, mut arrivals, rows) = healthy(100, 4);
        arrivals.retain(|a| a.index % 10 != 9);
        let f = check(&written, &arrivals, &rows, PROMISE);
        assert_eq!(f.lost, 10);
        assert_eq!(f.lost_examples[0], "m9");
        assert_eq!(f.failures, ["10 committed event(s) never arrived"]);
    }

    #[test]
    fn two_events_of_a_key_swapped_are_one_order_violation() {
        let (written, mut arrivals, rows) = healthy(40, 4);
        // Events 5 and 9 share key 1.
        arrivals.swap(5, 9);
        let f = check(&written, &arrivals, &rows, PROMISE);
        assert_eq!(f.order_violations, 1);
        assert_eq!(f.order_examples, ["key 1: event 5 arrived after event 9"]);
        let relaxed = Promise {
            strict_order: false,
            ..PROMISE
        };
        let f = check(&written, &arrivals, &rows, relaxed);
        assert_eq!(f.order_violations, 1, "still counted");
        assert!(f.failures.is_empty(), "not promised: {:?}", f.failures);
    }

    #[test]
    fn duplicates_fail_only_under_exactly_once_and_resent_copies_are_not_disorder() {
        let (written, mut arrivals, mut rows) = healthy(20, 2);
        // A crash after 6: 4..=6 sent again, at new offsets; the rows took the new ones.
        for i in 4..=6 {
            arrivals.push(Arrival {
                index: i,
                at: Instant::now(),
                position: Some((0, 100 + i as i64)),
                record_key: Some(format!("k{}", i % 2).into_bytes()),
            });
            rows.get_mut(&format!("m{i}")).unwrap().position = Some((0, 100 + i as i64));
        }
        let f = check(&written, &arrivals, &rows, PROMISE);
        assert_eq!(
            (f.duplicates, f.order_violations, f.position_mismatches),
            (3, 0, 0)
        );
        assert_eq!(f.failures, ["3 duplicate(s) under exactly-once"]);
        let at_least_once = Promise {
            exactly_once: false,
            ..PROMISE
        };
        assert!(check(&written, &arrivals, &rows, at_least_once)
            .failures
            .is_empty());
    }

    #[test]
    fn rows_must_show_success_at_a_delivered_position_and_rollbacks_must_not_arrive() {
        let (mut written, arrivals, mut rows) = healthy(10, 2);
        rows.get_mut("m3").unwrap().status = "FAILED".into();
        rows.get_mut("m4").unwrap().position = Some((2, 4));
        rows.remove("m5");
        written[7].outcome = Outcome::RolledBack;
        rows.remove("m7");
        let f = check(&written, &arrivals, &rows, PROMISE);
        assert_eq!(
            (f.status_mismatches, f.position_mismatches, f.phantoms),
            (2, 1, 1)
        );
        assert_eq!(f.status_examples[1], "m5: the row is gone");
        assert_eq!(f.failures.len(), 3, "{:?}", f.failures);
    }

    #[test]
    fn a_wrong_record_key_or_a_key_split_over_partitions_fails() {
        let (written, mut arrivals, mut rows) = healthy(12, 3);
        arrivals[4].record_key = None; // HTTP-like: not checked
        arrivals[5].record_key = Some(b"k0".to_vec()); // event 5 is key 2's
        arrivals[7].position = Some((1, 7)); // key 1, elsewhere than its earlier events
        rows.get_mut("m7").unwrap().position = Some((1, 7));
        let f = check(&written, &arrivals, &rows, PROMISE);
        assert_eq!(f.routing_violations, 2, "{:?}", f.routing_examples);
        assert_eq!(
            f.routing_examples[1],
            "key 1: m7 in partition 1, earlier events in 0"
        );
        assert_eq!(f.failures.len(), 1, "{:?}", f.failures);
    }

    #[test]
    fn an_unknown_commit_counts_as_committed_only_where_it_took_effect() {
        let (mut written, mut arrivals, mut rows) = healthy(4, 1);
        written[1].outcome = Outcome::Unknown; // row and copy exist: it committed
        written[2].outcome = Outcome::Unknown; // neither: it did not
        rows.remove("m2");
        arrivals.retain(|a| a.index != 2);
        let f = check(&written, &arrivals, &rows, PROMISE);
        assert_eq!((f.events_committed, f.events_rolled_back), (3, 1));
        assert!(f.failures.is_empty(), "{:?}", f.failures);
    }
}
