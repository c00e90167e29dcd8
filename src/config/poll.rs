//! `[poll]`: poll mode's interval and batch.

use std::time::Duration;

use serde::Deserialize;

/// `[poll]`: poll mode (`outbox.mode = "poll"`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PollConfig {
    /// Pause between claims when the last one found fewer rows than `batch_size`.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Rows claimed per round.
    pub batch_size: usize,
}

impl Default for PollConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            batch_size: 500,
        }
    }
}
