//! `[pipeline]`: the pipeline's name and its per-key ordering.

use serde::Deserialize;

/// `[pipeline]`: required by the outbox relay; an inbox-only process may leave it out.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// Names the checkpoint row and, by default, the slot and publication
    /// (`outboxd_<name>`). Lower-case letters, digits and `_`. Without the outbox relay:
    /// `inbox` unless set.
    #[serde(default)]
    pub name: String,
    /// Per-key ordering under failures.
    #[serde(default)]
    pub ordering: Ordering,
}

/// What happens to later events of a `biz_key` while an earlier one is FAILED,
/// PROCESSING or MANUAL_REQUIRED.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ordering {
    /// They are parked (status FAILED, due at once, `last_error` says why) and released
    /// in id order once the earlier event succeeds or an operator resolves it. Other keys
    /// flow without delay.
    #[default]
    Strict,
    /// They are published at once; a retried event arrives after later ones of its key.
    Relaxed,
}
