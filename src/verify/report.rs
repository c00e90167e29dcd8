//! `verify`'s report: a few lines for a person, or one JSON document (`--json`).

use serde::Serialize;

use super::check::{Findings, Promise};

/// The facts of a run besides the findings.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RunFacts {
    pub(crate) run: String,
    /// `--seed` repeats the run's choices.
    pub(crate) seed: u64,
    pub(crate) pipeline: String,
    pub(crate) source: String,
    pub(crate) sink: String,
    /// The run's Kafka topic or HTTP endpoint.
    pub(crate) topic: String,
    /// Already running, or spawned (and killed how often).
    pub(crate) relay: String,
    /// The spawned relay's log file.
    pub(crate) relay_log: Option<std::path::PathBuf>,
    pub(crate) transactions: Transactions,
    pub(crate) wrote_seconds: f64,
    pub(crate) drained_seconds: f64,
    pub(crate) bad_signatures: u64,
    /// What was cleaned up.
    pub(crate) cleanup: String,
}

/// Transactions written, and of them rolled back.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(crate) struct Transactions {
    pub(crate) total: u64,
    pub(crate) rolled_back: u64,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) passed: bool,
    #[serde(flatten)]
    pub(crate) facts: RunFacts,
    pub(crate) promise: Promise,
    pub(crate) findings: Findings,
}

impl Report {
    pub(crate) fn new(facts: RunFacts, promise: Promise, findings: Findings) -> Self {
        Self {
            passed: findings.failures.is_empty(),
            facts,
            promise,
            findings,
        }
    }

    /// The report for a person.
    pub(crate) fn text(&self) -> String {
        let (r, f, p) = (&self.facts, &self.findings, &self.promise);
        let mut out = String::new();
        let mut line = |text: String| {
            out.push_str(&text);
            out.push('\n');
        };
        line(format!(
            "outboxd verify: run {} (seed {}), pipeline {}: {} → {} `{}`",
            r.run, r.seed, r.pipeline, r.source, r.sink, r.topic
        ));
        line(format!(
            "  promise     {}, {} ordering, rows {}",
            if p.exactly_once {
                "exactly-once"
            } else {
                "at-least-once"
            },
            if p.strict_order { "strict" } else { "relaxed" },
            if p.rows_kept { "kept" } else { "deleted" }
        ));
        line(format!("  relay       {}", r.relay));
        if let Some(log) = &r.relay_log {
            line(format!("  relay log   {}", log.display()));
        }
        line(format!(
            "  written     {} transactions in {} s ({} rolled back): {} events committed, {} rolled back",
            r.transactions.total, r.wrote_seconds, r.transactions.rolled_back, f.events_committed, f.events_rolled_back
        ));
        line(format!(
            "  delivered   {} of {} (lost {}), then {} s to drain",
            f.delivered, f.events_committed, f.lost, r.drained_seconds
        ));
        for id in &f.lost_examples {
            line(format!("    lost      {id}"));
        }
        line(format!("  rolled back arrived {}", f.phantoms));
        for id in &f.phantom_examples {
            line(format!("    arrived   {id}"));
        }
        line(format!(
            "  duplicates  {}{}",
            f.duplicates,
            match (f.duplicates, p.exactly_once) {
                (0, _) => "",
                (_, true) => " (exactly-once promises none)",
                (_, false) => " (allowed: at-least-once sends again after a crash)",
            }
        ));
        line(format!(
            "  order       {} violation(s) of a key's commit order",
            f.order_violations
        ));
        for example in &f.order_examples {
            line(format!("    {example}"));
        }
        if p.sink_positions {
            line(format!(
                "  routing     {} record(s) under another key or partition than their key's",
                f.routing_violations
            ));
            for example in &f.routing_examples {
                line(format!("    {example}"));
            }
        }
        if p.rows_kept {
            line(format!(
                "  rows        {} not SUCCESS, {} at a position no copy has",
                f.status_mismatches, f.position_mismatches
            ));
            for example in f.status_examples.iter().chain(&f.position_examples) {
                line(format!("    {example}"));
            }
        }
        if r.bad_signatures > 0 {
            line(format!("  signatures  {} refused", r.bad_signatures));
        }
        line(format!(
            "  latency     commit → arrival p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            f.latency.p50_ms, f.latency.p99_ms, f.latency.max_ms
        ));
        line(format!("  cleanup     {}", r.cleanup));
        if self.passed {
            line("PASSED".into());
        } else {
            line(format!("FAILED: {}", f.failures.join("; ")));
        }
        out
    }
}
