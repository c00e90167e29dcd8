//! The inbox's counters, as `prometheus-client` metrics updated in place and registered
//! into each `/metrics` scrape by [`InboxStats::register`].
//!
//! HTTP senders choose the `{source}` of their path, so the per-source series are capped
//! at [`MAX_SOURCES`] distinct sources; later ones count under `source="other"`.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use outboxd_connector::{Completed, InboxMessage, Ingested};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::handler::Handled;

/// Distinct `source` label values, at most.
const MAX_SOURCES: usize = 100;

/// Upper bounds, in seconds, of the handler latency histogram's buckets.
const HANDLER_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IngestLabels {
    ingress: &'static str,
    source: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// Counters of one inbox.
#[derive(Debug)]
pub struct InboxStats {
    ingested: Family<IngestLabels, Counter>,
    handled: Family<OutcomeLabel, Counter>,
    handler_seconds: Histogram,
    reaped: Counter,
    sources: Mutex<HashSet<String>>,
}

impl Default for InboxStats {
    fn default() -> Self {
        Self {
            ingested: Family::default(),
            handled: Family::default(),
            handler_seconds: Histogram::new(HANDLER_BUCKETS),
            reaped: Counter::default(),
            sources: Mutex::new(HashSet::new()),
        }
    }
}

impl InboxStats {
    fn source_label(&self, source: &str) -> String {
        let Ok(mut seen) = self.sources.lock() else {
            return "other".into();
        };
        if seen.contains(source) || seen.len() < MAX_SOURCES && seen.insert(source.to_owned()) {
            source.to_owned()
        } else {
            "other".into()
        }
    }

    /// A stored batch: each message new, duplicate or rejected.
    pub(crate) fn observe_ingested(
        &self,
        ingress: &'static str,
        messages: &[InboxMessage],
        outcomes: &[Ingested],
    ) {
        for (message, outcome) in messages.iter().zip(outcomes) {
            let result = match (outcome, &message.rejected) {
                (Ingested::Duplicate, _) => "duplicate",
                (Ingested::Stored(_), Some(_)) => "rejected",
                (Ingested::Stored(_), None) => "stored",
            };
            let labels = IngestLabels {
                ingress,
                source: self.source_label(&message.source),
                result,
            };
            self.ingested.get_or_create(&labels).inc();
        }
    }

    /// How long a handler took and what it said.
    pub(crate) fn observe_handler(&self, took: Duration, handled: &Handled) {
        self.handler_seconds.observe(took.as_secs_f64());
        let outcome = match handled {
            Handled::Done => return,
            Handled::Retry { .. } => "failed",
            Handled::Manual { .. } => "manual_required",
        };
        self.handled.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// An outcome written; `done` when it was the DONE of a successful handler.
    pub(crate) fn observe_completed(&self, completed: &Completed, done: bool) {
        let outcome = match completed {
            Completed::ClaimLost => "claim_lost",
            Completed::Written if done => "done",
            _ => return,
        };
        self.handled.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// The SQL handler's statement failed.
    pub(crate) fn observe_statement_failed(&self) {
        let labels = OutcomeLabel {
            outcome: "statement_failed",
        };
        self.handled.get_or_create(&labels).inc();
    }

    /// Rows the reaper returned.
    pub(crate) fn add_reaped(&self, rows: u64) {
        self.reaped.inc_by(rows);
    }

    /// Adds the inbox's series to a scrape's registry.
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "outboxd_inbox_messages",
            "Inbox messages received, by ingress, source and result (stored, duplicate, rejected)",
            self.ingested.clone(),
        );
        r.register(
            "outboxd_inbox_handled",
            "Inbox handler outcomes (done, failed, manual_required, statement_failed, claim_lost)",
            self.handled.clone(),
        );
        r.register(
            "outboxd_inbox_handler_seconds",
            "Time a handler took for one message",
            self.handler_seconds.clone(),
        );
        r.register(
            "outboxd_inbox_reaped",
            "Inbox claims returned to FAILED by the reaper",
            self.reaped.clone(),
        );
    }
}
