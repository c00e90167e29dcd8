//! The checks of `verify --inbox` (pure, unit-tested on made-up runs, broken ones
//! included) and its report.

use std::collections::HashMap;
use std::path::PathBuf;

use outboxd_connector::OwnMessageState;
use serde::Serialize;

use super::send::Sent;
use super::Message;
use crate::verify::check::{example, percentile};

/// The report of `verify --inbox`.
#[derive(Clone, Debug, Serialize)]
pub(super) struct InboxReport {
    pub(super) passed: bool,
    pub(super) run: String,
    pub(super) seed: u64,
    pub(super) source: String,
    pub(super) ingress: String,
    pub(super) relay: String,
    pub(super) relay_log: PathBuf,
    pub(super) wrote_seconds: f64,
    pub(super) cleanup: String,
    pub(super) findings: InboxFindings,
}

/// What the checks found.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct InboxFindings {
    pub(crate) messages: u64,
    /// Requests sent, redeliveries and retries after a refusal included.
    pub(crate) requests: u64,
    /// Redeliveries the ingress answered `"duplicate": true`.
    pub(crate) duplicates_acknowledged: u64,
    /// Messages never acknowledged with 200.
    pub(crate) unacknowledged: u64,
    /// Acknowledged messages with no row.
    pub(crate) lost: u64,
    pub(crate) lost_examples: Vec<String>,
    /// Rows not DONE by the end.
    pub(crate) not_done: u64,
    pub(crate) not_done_examples: Vec<String>,
    /// Messages whose effect is missing, or there more than once.
    pub(crate) effects_missing: u64,
    pub(crate) effects_repeated: u64,
    /// Effects of a key out of the order its messages were acknowledged.
    pub(crate) order_violations: u64,
    pub(crate) order_examples: Vec<String>,
    /// POST → 200, in milliseconds (the message is durably stored when it is answered).
    pub(crate) ack_p50_ms: f64,
    pub(crate) ack_p99_ms: f64,
    pub(crate) failures: Vec<String>,
}

pub(super) fn check(
    messages: &[Message],
    sent: &Sent,
    rows: &HashMap<String, OwnMessageState>,
    effects: &[(String, String)],
) -> InboxFindings {
    let mut f = InboxFindings {
        messages: messages.len() as u64,
        requests: sent.requests,
        duplicates_acknowledged: sent.duplicates_acknowledged,
        ..InboxFindings::default()
    };
    let mut effect_count: HashMap<&str, u64> = HashMap::new();
    for (message_id, _) in effects {
        *effect_count.entry(message_id.as_str()).or_default() += 1;
    }
    let index_of: HashMap<&str, usize> = (messages.iter().enumerate())
        .map(|(i, m)| (m.message_id.as_str(), i))
        .collect();
    for (i, message) in messages.iter().enumerate() {
        let Some(_) = sent.acknowledged[i] else {
            f.unacknowledged += 1;
            continue;
        };
        match rows.get(&message.message_id) {
            None => {
                f.lost += 1;
                example(&mut f.lost_examples, || message.message_id.clone());
                continue;
            }
            Some(row) if row.status != "DONE" => {
                f.not_done += 1;
                example(&mut f.not_done_examples, || {
                    format!(
                        "{}: {} (retry_count {})",
                        row.message_id, row.status, row.retry_count
                    )
                });
            }
            Some(_) => {}
        }
        match effect_count
            .get(message.message_id.as_str())
            .copied()
            .unwrap_or(0)
        {
            0 => f.effects_missing += 1,
            1 => {}
            _ => f.effects_repeated += 1,
        }
    }
    // Per key, effects in the order the messages were acknowledged (= stored, = index).
    // A repeated effect is counted above, not again here: only each one's first.
    let mut highest: HashMap<u32, usize> = HashMap::new();
    let mut first_seen = std::collections::HashSet::new();
    for (message_id, _) in effects {
        let Some(&i) = index_of.get(message_id.as_str()) else {
            continue;
        };
        if !first_seen.insert(i) {
            continue;
        }
        let key = messages[i].key;
        let top = highest.entry(key).or_insert(i);
        if i < *top {
            f.order_violations += 1;
            if f.order_examples.len() < 5 {
                f.order_examples.push(format!(
                    "key k{key}: message {i} handled after message {top}"
                ));
            }
        } else {
            *top = i;
        }
    }
    let mut ack = sent.ack_ms.clone();
    ack.sort_by(f64::total_cmp);
    f.ack_p50_ms = percentile(&ack, 0.50);
    f.ack_p99_ms = percentile(&ack, 0.99);

    let mut failures = Vec::new();
    let mut fail = |n: u64, what: &str| {
        if n > 0 {
            failures.push(format!("{n} {what}"));
        }
    };
    fail(f.unacknowledged, "message(s) never acknowledged");
    fail(f.lost, "acknowledged message(s) with no row");
    fail(f.not_done, "row(s) not DONE");
    fail(f.effects_missing, "message(s) without their effect");
    fail(
        f.effects_repeated,
        "message(s) whose effect happened more than once",
    );
    fail(f.order_violations, "effect(s) out of their key's order");
    f.failures = failures;
    f
}

impl InboxReport {
    pub(super) fn text(&self) -> String {
        let f = &self.findings;
        let mut lines = vec![
            format!(
                "outboxd verify --inbox: run {} (seed {}), source {} at {}",
                self.run, self.seed, self.source, self.ingress
            ),
            format!("  inbox       {}", self.relay),
            format!("  inbox log   {}", self.relay_log.display()),
            format!(
                "  sent        {} messages in {} s, {} requests ({} redeliveries answered duplicate)",
                f.messages, self.wrote_seconds, f.requests, f.duplicates_acknowledged
            ),
            format!(
                "  stored      {} never acknowledged, {} acknowledged without a row, {} not DONE",
                f.unacknowledged, f.lost, f.not_done
            ),
        ];
        lines.extend(
            f.lost_examples
                .iter()
                .map(|id| format!("    lost      {id}")),
        );
        lines.extend(f.not_done_examples.iter().map(|e| format!("    {e}")));
        lines.push(format!(
            "  effects     {} missing, {} more than once",
            f.effects_missing, f.effects_repeated
        ));
        lines.push(format!(
            "  order       {} effect(s) out of their key's order",
            f.order_violations
        ));
        lines.extend(f.order_examples.iter().map(|e| format!("    {e}")));
        lines.push(format!(
            "  latency     POST → 200 (stored) p50 {:.1} ms, p99 {:.1} ms",
            f.ack_p50_ms, f.ack_p99_ms
        ));
        lines.push(format!("  cleanup     {}", self.cleanup));
        lines.push(match self.passed {
            true => "PASSED".into(),
            false => format!("FAILED: {}", f.failures.join("; ")),
        });
        lines.join("\n") + "\n"
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    type Run = (
        Vec<Message>,
        Sent,
        HashMap<String, OwnMessageState>,
        Vec<(String, String)>,
    );

    /// Six messages over keys 0 and 1 (message i on key i % 2), all acknowledged, DONE,
    /// each effect once in order.
    fn healthy() -> Run {
        let messages: Vec<Message> = (0..6)
            .map(|i| Message {
                key: i % 2,
                message_id: format!("m{i}"),
                body: String::new(),
            })
            .collect();
        let sent = Sent {
            acknowledged: vec![Some(Instant::now()); 6],
            requests: 7,
            duplicates_acknowledged: 1,
            ack_ms: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        };
        let rows = (messages.iter())
            .map(|m| {
                let state = OwnMessageState {
                    message_id: m.message_id.clone(),
                    status: "DONE".into(),
                    retry_count: 0,
                };
                (m.message_id.clone(), state)
            })
            .collect();
        let effects = (messages.iter())
            .map(|m| (m.message_id.clone(), format!("k{}", m.key)))
            .collect();
        (messages, sent, rows, effects)
    }

    #[test]
    fn a_healthy_inbox_passes() {
        let (messages, sent, rows, effects) = healthy();
        let f = check(&messages, &sent, &rows, &effects);
        assert!(f.failures.is_empty(), "{:?}", f.failures);
        assert_eq!(
            (f.messages, f.requests, f.duplicates_acknowledged),
            (6, 7, 1)
        );
    }

    #[test]
    fn an_effect_twice_a_missing_one_and_a_swapped_pair_are_each_counted() {
        let (messages, sent, mut rows, mut effects) = healthy();
        effects.push(("m1".into(), "k1".into())); // handled twice
        effects.retain(|(id, _)| id != "m5"); // never handled
        effects.swap(0, 2); // m2 before m0, both of key 0
        rows.get_mut("m3").unwrap().status = "MANUAL_REQUIRED".into();
        rows.remove("m4");
        let f = check(&messages, &sent, &rows, &effects);
        assert_eq!(
            (
                f.effects_repeated,
                f.effects_missing,
                f.order_violations,
                f.not_done,
                f.lost
            ),
            (1, 1, 1, 1, 1)
        );
        assert_eq!(
            f.order_examples,
            ["key k0: message 0 handled after message 2"]
        );
        assert_eq!(f.failures.len(), 5, "{:?}", f.failures);
    }
}
