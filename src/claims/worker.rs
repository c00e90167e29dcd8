//! The claim worker: claim rows, send them, write back where the claim still holds, reap
//! abandoned claims, sleep until the table announces work.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use outboxd_connector::{
    ClaimRequest, ClaimScope, ClaimedEvent, ClaimedWriteBack, ConnectorError, OutboxStore,
    ParkedEvent, ReapPolicy, RetrySchedule,
};
use tokio::sync::{mpsc, watch, Notify};
use tracing::Instrument;

use super::schedule::next_look;
use crate::config::RetryConfig;
use crate::observability::trace_context::event_span;
use crate::reconnect::ReconnectBackoff;
use crate::relay::outcome::Outcome;
use crate::relay::PipelineStats;
use crate::sink::{acknowledged_by, FailureKind, Sink};

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
    /// How long a round waits for its records to be acknowledged
    /// (`kafka.message_timeout`); shorter than the claim timeout, so the rows are written
    /// back while the claim still holds.
    pub delivery_timeout: Duration,
    /// How long one call to the store may go unanswered (`delivery.store_timeout`): a
    /// silent database ends the round, and the loop reconnects.
    pub store_timeout: Duration,
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
pub struct ClaimWorker<'a, O, S> {
    store: &'a O,
    sink: &'a S,
    settings: WorkerSettings,
    stats: &'a PipelineStats,
    wake: Arc<Notify>,
    delivered_keys: mpsc::UnboundedSender<String>,
}

impl<O: OutboxStore, S: Sink> ClaimWorker<'_, O, S> {
    /// `call` bounded by `store_timeout` (see [`crate::reconnect::answered`]).
    async fn ask<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, outboxd_connector::ConnectorError>>,
    ) -> Result<T, outboxd_connector::ConnectorError> {
        crate::reconnect::answered(self.settings.store_timeout, what, call).await
    }
}

impl<'a, O: OutboxStore, S: Sink> ClaimWorker<'a, O, S> {
    /// A worker over `store`; `wake` is notified by the log pipeline, `delivered_keys`
    /// tells it which keys this worker delivered (strict ordering).
    pub fn new(
        store: &'a O,
        sink: &'a S,
        settings: WorkerSettings,
        stats: &'a PipelineStats,
        wake: Arc<Notify>,
        delivered_keys: mpsc::UnboundedSender<String>,
    ) -> Self {
        Self {
            store,
            sink,
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
            let claimed = self.ask("the claim", self.store.claim(request)).await?;
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
        let mut schedule = (self.ask("the retry schedule", self.store.retry_schedule())).await?;
        let now = SystemTime::now();
        let expired = |s: &RetrySchedule| {
            s.oldest_claim
                .is_some_and(|claimed| claimed + policy.claim_timeout <= now)
        };
        if expired(&schedule) {
            let report = self.ask("the reaper", self.store.reap(policy)).await?;
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
            schedule = (self.ask("the retry schedule", self.store.retry_schedule())).await?;
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
        let mut rejected = Vec::new();
        for mut c in claimed {
            let refused = c
                .event
                .rejected
                .take()
                .or_else(|| self.sink.refusal(&c.event));
            if let Some(reason) = refused {
                // Retrying cannot help: MANUAL_REQUIRED with the reason, never sent.
                rejected.push((
                    ParkedEvent {
                        id: c.event.id,
                        table: c.event.table,
                        reason,
                    },
                    c.claim_token,
                ));
                continue;
            }
            // The event's span (its trace id when the row carries a traceparent) covers
            // its send, its acknowledgement and what is logged about it.
            let span = event_span(&c.event);
            let delivery = self.sink.send(&c.event).instrument(span.clone()).await;
            pending.push((c, span, delivery));
        }
        let mut delivered = Vec::new();
        let mut failed = Vec::new();
        let mut released = Vec::new();
        let mut sink_failure: Option<String> = None;
        let mut keys = Vec::new();
        let deadline = tokio::time::Instant::now() + self.settings.delivery_timeout;
        for (c, span, delivery) in pending {
            let result = acknowledged_by(deadline, delivery)
                .instrument(span.clone())
                .await;
            let _entered = span.enter();
            match Outcome::new(
                c.event.row(),
                c.event.retry_count,
                result,
                &self.settings.retry,
            ) {
                Outcome::Delivered(d) => {
                    let topic = self.sink.destination(&c.event);
                    tracing::debug!(
                        %topic,
                        partition = d.partition,
                        offset = d.offset,
                        "delivered"
                    );
                    self.stats.metrics.acked(&topic, c.event.commit_time);
                    self.stats.canary.delivered(&c.event.message_id);
                    delivered.push((d, c.claim_token));
                    keys.push(c.event.biz_key);
                }
                Outcome::Failed {
                    failure,
                    kind: FailureKind::Fatal,
                } => {
                    // The sink failed, not the row: release the claim without counting
                    // an attempt; the row is due again once the sink is rebuilt.
                    released.push((
                        ParkedEvent {
                            id: c.event.id,
                            table: c.event.table,
                            reason: format!(
                                "not sent: the sink failed ({}); sent again once it is \
                                 rebuilt, no attempt counted",
                                failure.error
                            ),
                        },
                        c.claim_token,
                    ));
                    sink_failure.get_or_insert(failure.error);
                }
                Outcome::Failed {
                    failure,
                    kind: FailureKind::Refused,
                } => {
                    // The destination refused the record itself: an operator's turn.
                    self.stats.metrics.failed(&self.sink.destination(&c.event));
                    tracing::warn!(
                        id = c.event.id,
                        message_id = %c.event.message_id,
                        error = %failure.error,
                        "the destination refused the record; the row becomes MANUAL_REQUIRED"
                    );
                    rejected.push((
                        ParkedEvent {
                            id: failure.id,
                            table: failure.table,
                            reason: failure.error,
                        },
                        c.claim_token,
                    ));
                }
                Outcome::Failed { failure, .. } => {
                    self.stats.metrics.failed(&self.sink.destination(&c.event));
                    tracing::warn!(
                        id = c.event.id,
                        message_id = %c.event.message_id,
                        retry_count = c.event.retry_count,
                        error = %failure.error,
                        "retry failed"
                    );
                    failed.push((failure, c.claim_token));
                }
            }
        }
        let batch = ClaimedWriteBack {
            delivered: &delivered,
            failed: &failed,
            released: &released,
            rejected: &rejected,
        };
        let updated = (self.ask(
            "the claimed rows' write-back",
            self.store.complete_claimed(batch),
        ))
        .await?;
        let expected = (delivered.len() + failed.len() + released.len() + rejected.len()) as u64;
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
            .fetch_add((failed.len() + rejected.len()) as u64, Ordering::Relaxed);
        for key in keys {
            // The log pipeline may have stopped; then there is nobody to release keys for.
            let _ = self.delivered_keys.send(key);
        }
        if let Some(error) = sink_failure {
            match self.sink.recover().await {
                Ok(_) => tracing::warn!(
                    %error,
                    released = released.len(),
                    "the sink failed fatally and was rebuilt; released rows are sent again"
                ),
                Err(e) => {
                    return Err(ConnectorError::definite(format!(
                        "the sink failed fatally ({error}) and cannot be rebuilt: {e}"
                    )))
                }
            }
        }
        Ok(())
    }
}
