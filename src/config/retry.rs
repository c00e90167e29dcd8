//! `[retry]`: backoff of failed rows, the retry worker and the reaper.

use std::time::Duration;

use serde::Deserialize;

/// `[retry]`: `next_retry_time = now + min(base * 2^retry_count, cap) + random(0..jitter)`,
/// and the worker that retries due FAILED rows.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Delay after the first failure.
    #[serde(with = "humantime_serde")]
    pub base: Duration,
    /// Longest delay between attempts.
    #[serde(with = "humantime_serde")]
    pub cap: Duration,
    /// Random extra delay, so failed rows of one burst do not retry in lockstep.
    #[serde(with = "humantime_serde")]
    pub jitter: Duration,
    /// Rows claimed per round of the retry worker.
    pub batch_size: usize,
    /// A row PROCESSING longer than this was abandoned by a stopped worker: the reaper
    /// returns it to FAILED (or MANUAL_REQUIRED at the limit).
    #[serde(with = "humantime_serde")]
    pub claim_timeout: Duration,
    /// With no FAILED row known, the retry worker still looks this often. Unset (the
    /// default): on PostgreSQL it sleeps until woken (a failure in the log pipeline, or
    /// the NOTIFY of `outboxd retry`/`resolve`), so an idle outbox sees no query; on
    /// engines without notifications it looks every 60 s.
    #[serde(with = "humantime_serde")]
    pub idle_check: Option<Duration>,
}

/// How often the retry worker looks when nothing wakes it and `retry.idle_check` is unset,
/// on engines that cannot notify it.
pub const DEFAULT_IDLE_CHECK: Duration = Duration::from_secs(60);

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
            jitter: Duration::from_millis(500),
            batch_size: 100,
            claim_timeout: Duration::from_secs(60),
            idle_check: None,
        }
    }
}
