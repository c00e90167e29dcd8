//! `[source]`: the database (its engine and connection); the engine's own keys are in
//! `crate::engines`.

use serde::Deserialize;

use super::SourceConfig;

/// `[source]`: the database both halves use: the engine (`kind`) and its own keys.
#[derive(Clone, Debug, Deserialize)]
pub struct SourceSection {
    /// Deprecated place of `outbox.mode` (still read). After loading: the relay's mode,
    /// wherever the file set it.
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
