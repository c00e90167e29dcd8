//! `[source]`: how to read the outbox; the engine's own keys are in `crate::engines`.

use serde::Deserialize;

use super::SourceConfig;

/// `[source]`: how to read the outbox (`mode`) and the engine settings (`kind` and the
/// engine's own keys).
#[derive(Clone, Debug, Deserialize)]
pub struct SourceSection {
    /// `log` (default) tails the database log; `poll` claims INIT rows with
    /// `SELECT … FOR UPDATE SKIP LOCKED`, for databases where log access is not granted.
    #[serde(default)]
    pub mode: SourceMode,
    /// The engine and its connection settings.
    #[serde(flatten)]
    pub engine: SourceConfig,
}

/// How outboxd finds new outbox rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceMode {
    /// Logical replication / binlog: no polling, millisecond latency.
    #[default]
    Log,
    /// The claim query every `poll.interval`.
    Poll,
}
