//! Failed rows: their backoff (`next_retry_time = now + min(base * 2^retry_count, cap) +
//! jitter`), and the claim worker that retries them (and is the whole relay in poll mode).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use outboxd_connector::{
    ClaimRequest, ClaimScope, ClaimedEvent, ClaimedWriteBack, ConnectorError, Delivered,
    DeliveryFailure, OutboxStore, ReapPolicy, RetrySchedule,
};
use rand::Rng;
use tokio::sync::{mpsc, watch, Notify};

use crate::config::RetryConfig;
use crate::kafka::{DeliveryOutcome, Publisher};
use crate::pipeline::PipelineStats;

/// Delay before the next attempt of a row that has failed `retry_count` times before
/// this failure, with `jitter_fraction` in `[0, 1)` choosing the random extra delay.
pub fn backoff_delay(policy: &RetryConfig, retry_count: i32, jitter_fraction: f64) -> Duration {
    // 2^31 overflows any real cap long before the exponent matters; clamp it.
    let exponent = retry_count.clamp(0, 30) as u32;
    let exponential = policy.base.saturating_mul(1u32 << exponent);
    let jitter = policy.jitter.mul_f64(jitter_fraction.clamp(0.0, 1.0));
    exponential.min(policy.cap) + jitter
}

/// [`backoff_delay`] with a random jitter.
pub fn next_retry_delay(policy: &RetryConfig, retry_count: i32) -> Duration {
    backoff_delay(policy, retry_count, rand::thread_rng().gen::<f64>())
}

/// Waits `delay`, or less if shutdown is requested meanwhile.
pub(crate) async fn wait_or_shutdown(delay: Duration, shutdown: &mut watch::Receiver<bool>) {
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = shutdown.wait_for(|stop| *stop) => {}
    }
}

/// Backoff for reconnecting to a database that is unavailable: 250 ms doubling to 10 s,
/// reset once it answers again.
pub(crate) struct ReconnectBackoff {
    next: Duration,
}

impl ReconnectBackoff {
    const FIRST: Duration = Duration::from_millis(250);
    const MAX: Duration = Duration::from_secs(10);

    pub(crate) fn new() -> Self {
        Self { next: Self::FIRST }
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        delay
    }

    pub(crate) fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// What the claim worker takes and how often it looks.
#[derive(Clone, Debug)]
pub struct WorkerSettings {
    /// Backoff, batch, claim timeout.
    pub retry: RetryConfig,
    /// DueFailed for the retry worker beside the log; NewAndDueFailed in poll mode.
    pub scope: ClaimScope,
    /// Rows per claim.
    pub batch_size: usize,
    /// Longest sleep when the table announces no work (poll interval in poll mode);
    /// `None`: until woken.
    pub idle_check: Option<Duration>,
    /// Strict per-key order.
    pub strict_order: bool,
}

/// The claim worker: retries due FAILED rows beside the log pipeline, or, in poll mode,
/// is the whole relay (INIT rows too). Also runs the reaper.
///
/// Each round claims rows in one short transaction (PROCESSING, fresh claim token),
/// publishes them outside any transaction, and writes back only where the token still
/// matches. It sleeps until the earliest `next_retry_time` or claim expiry the table
/// announces, or until woken (by the log pipeline on a failure, or by an operator's
/// notification), and at most `idle_check` when set; with no failed row in the table it
/// issues no query until then.
pub struct ClaimWorker<'a, O> {
    store: &'a O,
    publisher: &'a Publisher,
    settings: WorkerSettings,
    stats: &'a PipelineStats,
    wake: Arc<Notify>,
    delivered_keys: mpsc::UnboundedSender<String>,
}

impl<'a, O: OutboxStore> ClaimWorker<'a, O> {
    /// A worker over `store`; `wake` is notified by the log pipeline, `delivered_keys`
    /// tells it which keys this worker delivered (strict ordering).
    pub fn new(
        store: &'a O,
        publisher: &'a Publisher,
        settings: WorkerSettings,
        stats: &'a PipelineStats,
        wake: Arc<Notify>,
        delivered_keys: mpsc::UnboundedSender<String>,
    ) -> Self {
        Self {
            store,
            publisher,
            settings,
            stats,
            wake,
            delivered_keys,
        }
    }

    /// Runs until `shutdown` turns true. Transient errors are logged and retried after
    /// a pause; definite ones end the worker.
    pub async fn run(&self, mut shutdown: watch::Receiver<bool>) -> Result<(), ConnectorError> {
        let mut next_round = Instant::now();
        let mut backoff = ReconnectBackoff::new();
        loop {
            tokio::select! {
                _ = shutdown.wait_for(|stop| *stop) => return Ok(()),
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep_until(next_round.into()) => {}
            }
            match self.round(&mut shutdown).await {
                Ok(next) => {
                    backoff.reset();
                    next_round = next;
                }
                Err(e) if e.is_transient() => {
                    let pause = backoff.next_delay();
                    tracing::warn!(error = %e, retry_in = ?pause, "claim worker: database unavailable");
                    next_round = Instant::now() + pause;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Claims and publishes until a claim comes back short, reaps abandoned claims, and
    /// returns when to look again.
    async fn round(&self, shutdown: &mut watch::Receiver<bool>) -> Result<Instant, ConnectorError> {
        loop {
            let request = ClaimRequest {
                scope: self.settings.scope,
                limit: self.settings.batch_size,
                strict_order: self.settings.strict_order,
            };
            let claimed = self.store.claim(request).await?;
            let full = claimed.len() == self.settings.batch_size;
            if !claimed.is_empty() {
                self.publish_claimed(claimed).await?;
            }
            if !full || *shutdown.borrow() {
                break;
            }
        }
        let policy = ReapPolicy {
            claim_timeout: self.settings.retry.claim_timeout,
            retry_delay: self.settings.retry.base,
        };
        let mut schedule = self.store.retry_schedule().await?;
        let now = SystemTime::now();
        let expired = |s: &RetrySchedule| {
            s.oldest_claim
                .is_some_and(|claimed| claimed + policy.claim_timeout <= now)
        };
        if expired(&schedule) {
            let report = self.store.reap(policy).await?;
            if report.failed + report.manual_required > 0 {
                tracing::warn!(
                    failed = report.failed,
                    manual_required = report.manual_required,
                    "reaped rows whose claim expired (a worker stopped while publishing)"
                );
                self.stats
                    .reaped
                    .fetch_add(report.failed + report.manual_required, Ordering::Relaxed);
            }
            schedule = self.store.retry_schedule().await?;
        }
        Ok(next_look(
            &schedule,
            policy.claim_timeout,
            self.settings.idle_check,
            now,
        ))
    }

    async fn publish_claimed(&self, claimed: Vec<ClaimedEvent>) -> Result<(), ConnectorError> {
        let mut pending = Vec::with_capacity(claimed.len());
        for c in claimed {
            let delivery = self.publisher.send(&c.event).await;
            pending.push((c, delivery));
        }
        let mut delivered = Vec::new();
        let mut failed = Vec::new();
        let mut keys = Vec::new();
        for (c, delivery) in pending {
            match delivery.outcome().await {
                DeliveryOutcome::Acked { partition, offset } => {
                    let topic = self.publisher.topic_for(&c.event);
                    self.stats.metrics.acked(&topic, c.event.commit_time);
                    delivered.push((
                        Delivered {
                            id: c.event.id,
                            partition,
                            offset,
                        },
                        c.claim_token,
                    ));
                    keys.push(c.event.biz_key);
                }
                DeliveryOutcome::Failed { error, .. } => {
                    self.stats
                        .metrics
                        .failed(&self.publisher.topic_for(&c.event));
                    tracing::warn!(
                        id = c.event.id,
                        message_id = %c.event.message_id,
                        retry_count = c.event.retry_count,
                        %error,
                        "retry failed"
                    );
                    let retry_delay = next_retry_delay(&self.settings.retry, c.event.retry_count);
                    failed.push((
                        DeliveryFailure {
                            id: c.event.id,
                            error,
                            retry_delay,
                        },
                        c.claim_token,
                    ));
                }
            }
        }
        let batch = ClaimedWriteBack {
            delivered: &delivered,
            failed: &failed,
        };
        let updated = self.store.complete_claimed(batch).await?;
        let expected = (delivered.len() + failed.len()) as u64;
        if updated < expected {
            tracing::warn!(
                lost = expected - updated,
                "some claims expired before their write-back; those rows keep their newer state"
            );
        }
        self.stats
            .retried
            .fetch_add(delivered.len() as u64, Ordering::Relaxed);
        self.stats
            .retry_failed
            .fetch_add(failed.len() as u64, Ordering::Relaxed);
        for key in keys {
            // The log pipeline may have stopped; then there is nobody to release keys for.
            let _ = self.delivered_keys.send(key);
        }
        Ok(())
    }
}

/// When to look again: the earliest due row or claim expiry, at most `idle_check` away,
/// at least a few milliseconds away (so a row due "now" that a stricter claim skipped
/// does not spin the worker).
fn next_look(
    schedule: &RetrySchedule,
    claim_timeout: Duration,
    idle_check: Option<Duration>,
    now: SystemTime,
) -> Instant {
    const FLOOR: Duration = Duration::from_millis(20);
    let until = |t: SystemTime| t.duration_since(now).unwrap_or(Duration::ZERO);
    // A year stands for "until woken".
    let mut wait = idle_check.unwrap_or(Duration::from_secs(365 * 86_400));
    if let Some(due) = schedule.next_due {
        wait = wait.min(until(due));
    }
    if let Some(claimed) = schedule.oldest_claim {
        wait = wait.min(until(claimed + claim_timeout));
    }
    Instant::now() + wait.max(FLOOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryConfig {
        RetryConfig {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
            jitter: Duration::from_millis(500),
            ..RetryConfig::default()
        }
    }

    #[test]
    fn doubles_per_attempt_up_to_the_cap() {
        let p = policy();
        assert_eq!(backoff_delay(&p, 0, 0.0), Duration::from_secs(1));
        assert_eq!(backoff_delay(&p, 1, 0.0), Duration::from_secs(2));
        assert_eq!(backoff_delay(&p, 5, 0.0), Duration::from_secs(32));
        assert_eq!(backoff_delay(&p, 6, 0.0), Duration::from_secs(60));
        assert_eq!(backoff_delay(&p, i32::MAX, 0.0), Duration::from_secs(60));
        assert_eq!(backoff_delay(&p, -3, 0.0), Duration::from_secs(1));
    }

    #[test]
    fn the_worker_wakes_for_the_earliest_due_row_or_expired_claim() {
        let now = SystemTime::now();
        let idle = Some(Duration::from_secs(60));
        let timeout = Duration::from_secs(30);
        let in_ = |d: Instant| d.saturating_duration_since(Instant::now());
        let nothing = RetrySchedule::default();
        assert!(in_(next_look(&nothing, timeout, idle, now)) > Duration::from_secs(59));
        let due = RetrySchedule {
            next_due: Some(now + Duration::from_secs(5)),
            oldest_claim: None,
        };
        let wait = in_(next_look(&due, timeout, idle, now));
        assert!(
            wait <= Duration::from_secs(5) && wait > Duration::from_secs(4),
            "{wait:?}"
        );
        let claim = RetrySchedule {
            next_due: Some(now + Duration::from_secs(50)),
            oldest_claim: Some(now - Duration::from_secs(20)),
        };
        let wait = in_(next_look(&claim, timeout, idle, now));
        assert!(
            wait <= Duration::from_secs(10) && wait > Duration::from_secs(9),
            "{wait:?}"
        );
        let overdue = RetrySchedule {
            next_due: Some(now - Duration::from_secs(5)),
            oldest_claim: None,
        };
        assert!(in_(next_look(&overdue, timeout, idle, now)) <= Duration::from_millis(20));
    }

    #[test]
    fn jitter_adds_at_most_the_configured_amount() {
        let p = policy();
        assert_eq!(backoff_delay(&p, 0, 0.5), Duration::from_millis(1250));
        assert_eq!(backoff_delay(&p, 10, 0.999_999).as_millis(), 60_499);
        for _ in 0..100 {
            let d = next_retry_delay(&p, 2);
            assert!(
                d >= Duration::from_secs(4) && d < Duration::from_millis(4500),
                "{d:?}"
            );
        }
    }
}
