//! The soak's results: what the reader saw of each relay, the tables and verdicts it
//! prints and records in docs/benchmarks.md, and its JSON.

use super::*;

/// What the bench's reader saw of one relay's topic.
#[derive(Debug, Default)]
pub(super) struct Delivered {
    /// When each duplicate was seen.
    pub(super) duplicates: Vec<Instant>,
    /// First sightings of a record after a later record of its key.
    pub(super) order_violations: usize,
    pub(super) examples: Vec<String>,
}

/// The settings and results of a soak, for the table, the JSON and the doc.
#[derive(Debug, Default)]
pub(crate) struct SoakReport {
    pub(super) minutes: f64,
    pub(super) rate: f64,
    pub(super) fault_seconds: (f64, f64),
    pub(super) budget_seconds: f64,
    pub(super) stuck_seconds: f64,
    pub(super) elapsed: Duration,
    pub(super) relays: Vec<RelayResult>,
    pub(super) inbox: InboxResult,
    pub(super) faults: Vec<FaultRow>,
    /// Every fault: (kind, target, length, per pipeline touched: name and recovery).
    pub(super) log: Vec<Value>,
    /// What went otherwise than planned, with when.
    pub(super) notes: Vec<String>,
}

#[derive(Debug, Default)]
pub(super) struct RelayResult {
    pub(super) label: String,
    pub(super) exactly_once: bool,
    pub(super) written: usize,
    pub(super) delivered: usize,
    pub(super) duplicates: usize,
    pub(super) order_violations: usize,
    pub(super) wedges: usize,
    pub(super) stuck: usize,
    pub(super) exits: usize,
    pub(super) kills: usize,
    pub(super) abandoned: usize,
    pub(super) longest: Option<(Duration, Duration, Kind)>,
    pub(super) examples: Vec<String>,
}

#[derive(Debug, Default)]
pub(super) struct InboxResult {
    pub(super) unique_in_topic: usize,
    pub(super) rows: usize,
    pub(super) done: usize,
    pub(super) wedges: usize,
    pub(super) stuck: usize,
    pub(super) exits: usize,
    pub(super) kills: usize,
    pub(super) longest: Option<(Duration, Duration, Kind)>,
}

#[derive(Debug)]
pub(super) struct FaultRow {
    pub(super) kind: Kind,
    pub(super) count: usize,
    pub(super) min_length: Duration,
    pub(super) max_length: Duration,
    pub(super) duplicates_at_least_once: usize,
    pub(super) duplicates_exactly_once: usize,
    /// (recovery, the fault's length).
    pub(super) longest: Option<(Duration, Duration)>,
    pub(super) within_goal: usize,
    pub(super) wedges: usize,
    pub(super) stuck: usize,
}

impl SoakReport {
    /// The soak's tables and verdicts, as printed and as recorded in the doc.
    pub(crate) fn text(&self) -> String {
        use std::fmt::Write as _;
        let secs = |d: Duration| format!("{:.1}", d.as_secs_f64());
        let mut t = String::new();
        let _ = writeln!(
            t,
            "soak: {:.1} min ({:.1} min with the drain), {} relays at {} events/s each \
             ({WRITERS} writers of {KEYS_PER_WRITER} keys, {TX_ROWS}-row transactions) and an \
             inbox; freezes and black holes of {}–{} s; wedge = not streaming {} s after a \
             fault's end plus its length, stuck = not after {} s (then killed and started again)",
            self.minutes,
            self.elapsed.as_secs_f64() / 60.0,
            self.relays.len(),
            self.rate,
            self.fault_seconds.0,
            self.fault_seconds.1,
            self.budget_seconds,
            self.stuck_seconds
        );
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "{:<28} {:>8} {:>9} {:>5} {:>6} {:>6} {:>6} {:>5} {:>5} {:>5}  longest to streaming again",
            "pipeline", "written", "delivered", "lost", "dups", "order", "wedges", "stuck", "exits", "kills"
        );
        let longest = |l: Option<(Duration, Duration, Kind)>| {
            l.map_or("-".to_owned(), |(at, length, kind)| {
                format!("{} s after {} ({} s)", secs(at), kind.name(), secs(length))
            })
        };
        for r in &self.relays {
            let _ = writeln!(
                t,
                "{:<28} {:>8} {:>9} {:>5} {:>6} {:>6} {:>6} {:>5} {:>5} {:>5}  {}",
                r.label,
                r.written,
                r.delivered,
                r.written.saturating_sub(r.delivered),
                r.duplicates,
                r.order_violations,
                r.wedges,
                r.stuck,
                r.exits,
                r.kills,
                longest(r.longest)
            );
        }
        let i = &self.inbox;
        let _ = writeln!(
            t,
            "{:<28} {:>8} {:>9} {:>5} {:>6} {:>6} {:>6} {:>5} {:>5} {:>5}  {}",
            "inbox (PostgreSQL's first)",
            i.unique_in_topic,
            i.done,
            i.unique_in_topic.saturating_sub(i.done),
            i.rows.saturating_sub(i.unique_in_topic),
            "-",
            i.wedges,
            i.stuck,
            i.exits,
            i.kills,
            longest(i.longest)
        );
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "{:<26} {:>6} {:>11} {:>9} {:>9}  {:<30} {:>12} {:>6} {:>5}",
            "fault",
            "count",
            "length s",
            "dups ALO",
            "dups EOS",
            "longest to streaming again",
            "within goal",
            "wedges",
            "stuck"
        );
        for f in &self.faults {
            let _ = writeln!(
                t,
                "{:<26} {:>6} {:>11} {:>9} {:>9}  {:<30} {:>12} {:>6} {:>5}",
                f.kind.name(),
                f.count,
                format!("{}–{}", secs(f.min_length), secs(f.max_length)),
                f.duplicates_at_least_once,
                f.duplicates_exactly_once,
                f.longest.map_or("-".to_owned(), |(at, length)| format!(
                    "{} s (a {} s fault)",
                    secs(at),
                    secs(length)
                )),
                format!("{} of {}", f.within_goal, f.count),
                f.wedges,
                f.stuck
            );
        }
        let _ = writeln!(t);
        for (target, verdict) in self.verdicts() {
            let _ = writeln!(t, "{verdict:<8} {target}");
        }
        for note in &self.notes {
            let _ = writeln!(t, "note: {note}");
        }
        for r in &self.relays {
            for e in &r.examples {
                let _ = writeln!(t, "order: {}: {e}", r.label);
            }
        }
        t
    }

    fn verdicts(&self) -> Vec<(String, &'static str)> {
        let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
        let lost: usize = (self.relays.iter())
            .map(|r| r.written.saturating_sub(r.delivered))
            .sum();
        let unhandled = self.inbox.unique_in_topic.saturating_sub(self.inbox.done);
        let order: usize = self.relays.iter().map(|r| r.order_violations).sum();
        let wedges: usize = self.relays.iter().map(|r| r.wedges).sum::<usize>() + self.inbox.wedges;
        let stuck: usize = self.relays.iter().map(|r| r.stuck).sum::<usize>() + self.inbox.stuck;
        let eos_dups: usize = (self.relays.iter().filter(|r| r.exactly_once))
            .map(|r| r.duplicates)
            .sum();
        let count: usize = self.faults.iter().map(|f| f.count).sum();
        let within: usize = self.faults.iter().map(|f| f.within_goal).sum();
        let exits: usize = self.relays.iter().map(|r| r.exits).sum::<usize>() + self.inbox.exits;
        vec![
            (format!("no event lost by the relays: {lost}"), verdict(lost == 0)),
            (
                format!("the inbox handled every message of its topic: {unhandled} left"),
                verdict(unhandled == 0),
            ),
            (
                format!("no per-key order violation: {order}"),
                verdict(order == 0),
            ),
            (format!("no wedge: {wedges}"), verdict(wedges == 0)),
            (
                format!("none stuck (killed to go on): {stuck}"),
                verdict(stuck == 0),
            ),
            (
                format!("no outboxd exit on its own: {exits}"),
                verdict(exits == 0),
            ),
            (
                format!("exactly-once: no duplicate read_committed: {eos_dups}"),
                verdict(eos_dups == 0),
            ),
            (
                format!(
                    "streaming again within 2 × the fault's length + 5 s: {within} of {count} faults"
                ),
                verdict(within == count),
            ),
        ]
    }

    pub(crate) fn json(&self) -> Value {
        let secs = |d: Duration| d.as_secs_f64();
        let longest = |l: &Option<(Duration, Duration, Kind)>| {
            l.map(|(at, length, kind)| {
                json!({"seconds": secs(at), "fault": kind.name(), "fault_length_seconds": secs(length)})
            })
        };
        json!({
            "minutes": self.minutes,
            "elapsed_seconds": secs(self.elapsed),
            "rate_per_relay": self.rate,
            "writers_per_relay": WRITERS,
            "keys_per_writer": KEYS_PER_WRITER,
            "rows_per_transaction": TX_ROWS,
            "fault_seconds": [self.fault_seconds.0, self.fault_seconds.1],
            "recovery_budget_seconds": self.budget_seconds,
            "stuck_limit_seconds": self.stuck_seconds,
            "relays": self.relays.iter().map(|r| json!({
                "pipeline": r.label,
                "exactly_once": r.exactly_once,
                "written": r.written,
                "delivered": r.delivered,
                "lost": r.written.saturating_sub(r.delivered),
                "duplicates": r.duplicates,
                "order_violations": r.order_violations,
                "order_examples": r.examples,
                "wedges": r.wedges,
                "stuck": r.stuck,
                "exits": r.exits,
                "kills": r.kills,
                "transactions_abandoned": r.abandoned,
                "longest_to_streaming_again": longest(&r.longest),
            })).collect::<Vec<_>>(),
            "inbox": {
                "unique_in_topic": self.inbox.unique_in_topic,
                "rows": self.inbox.rows,
                "done": self.inbox.done,
                "missing": self.inbox.unique_in_topic.saturating_sub(self.inbox.done),
                "wedges": self.inbox.wedges,
                "stuck": self.inbox.stuck,
                "exits": self.inbox.exits,
                "kills": self.inbox.kills,
                "longest_to_caught_up": longest(&self.inbox.longest),
            },
            "faults": self.faults.iter().map(|f| json!({
                "fault": f.kind.name(),
                "count": f.count,
                "min_length_seconds": secs(f.min_length),
                "max_length_seconds": secs(f.max_length),
                "duplicates_at_least_once": f.duplicates_at_least_once,
                "duplicates_exactly_once": f.duplicates_exactly_once,
                "longest_to_streaming_again_seconds": f.longest.map(|(at, _)| secs(at)),
                "longest_fault_length_seconds": f.longest.map(|(_, l)| secs(l)),
                "within_goal": f.within_goal,
                "wedges": f.wedges,
                "stuck": f.stuck,
            })).collect::<Vec<_>>(),
            "verdicts": self.verdicts().into_iter().map(|(t, v)| json!({"target": t, "verdict": v})).collect::<Vec<_>>(),
            "log": self.log,
            "notes": self.notes,
        })
    }
}
