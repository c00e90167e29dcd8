//! The inbox workers: claim due messages, run their handlers outside any transaction,
//! write each outcome back under its claim token.
//!
//! One task claims for `workers` handler slots: it claims only as many rows as slots are
//! free, so a claimed row never waits in memory behind others, and the claim itself keeps
//! one message per `biz_key` in flight and each key in arrival order (see
//! [`InboxStore::claim`]). Outcomes are written through a few completion stores of their
//! own, so a slow SQL handler statement does not hold up claiming.
//!
//! It sleeps until ingress stores a message (`wake`), the schedule's next due row, the
//! oldest claim's expiry (the reaper), or `idle_check`, whichever comes first. On
//! shutdown it stops claiming and lets running handlers finish within the deadline;
//! what is still running then stays PROCESSING and is reaped by the next instance.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use outboxd_connector::{
    ClaimedMessage, Completed, ConnectorError, InboxOutcome, InboxStore, ReapPolicy,
};
use tokio::sync::{watch, Notify};

use super::handler::{Handled, Handlers, NoHandler};
use super::InboxStats;
use crate::claims::next_retry_delay;
use crate::config::RetryConfig;

/// What the workers need besides their stores.
#[derive(Clone)]
pub(crate) struct WorkerSettings {
    /// Handler slots.
    pub(crate) workers: usize,
    /// The reaper's limit on a claim.
    pub(crate) claim_timeout: Duration,
    /// The longest sleep with nothing due.
    pub(crate) idle_check: Duration,
    /// Backoff of failed attempts.
    pub(crate) retry: RetryConfig,
    /// Time given to running handlers on shutdown.
    pub(crate) shutdown_deadline: Duration,
}

/// Runs the workers until `shutdown`, or until a store fails definitely.
pub(crate) async fn run<I: InboxStore>(
    claims: &I,
    completions: &[I],
    handlers: &Handlers,
    settings: &WorkerSettings,
    stats: &InboxStats,
    wake: &Notify,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectorError> {
    let policy = ReapPolicy {
        claim_timeout: settings.claim_timeout,
        retry_delay: settings.retry.base,
    };
    let mut running = FuturesUnordered::new();
    let mut next_store = 0usize;
    let mut look_now = true;
    // Claim in batches: one claim query per half of the slots rather than one per
    // finished message, so the claim costs little next to the handlers.
    let refill_at = settings.workers.div_ceil(2);
    // The reaper's own schedule, kept across loop turns so that steady traffic (which
    // wakes the loop all the time) does not postpone it: claims left by a dead peer must
    // come back within about `claim_timeout` whatever the load.
    let reap_every = (settings.claim_timeout / 4).clamp(
        Duration::from_secs(1),
        settings.idle_check.max(Duration::from_secs(1)),
    );
    let mut next_reap = Instant::now();
    loop {
        if *shutdown.borrow() {
            break;
        }
        if Instant::now() >= next_reap {
            let reaped = claims.reap(policy).await?;
            stats.add_reaped(reaped.failed + reaped.manual_required);
            if reaped.failed + reaped.manual_required > 0 {
                look_now = true;
            }
            next_reap = Instant::now() + reap_every;
        }
        let free = settings.workers.saturating_sub(running.len());
        let mut sleep_for = settings.idle_check;
        if look_now && (free >= refill_at || running.is_empty()) {
            let claimed = claims.claim(free).await?;
            let got = claimed.len();
            for message in claimed {
                let store = &completions[next_store % completions.len()];
                next_store = next_store.wrapping_add(1);
                running.push(process(store, message, handlers, &settings.retry, stats));
            }
            sleep_for = if got == free {
                // Maybe more: look again as soon as enough slots are free.
                Duration::ZERO
            } else {
                // Woken early by a due row, the loop could only claim with enough free slots.
                let would_claim =
                    settings.workers - running.len() >= refill_at || running.is_empty();
                until_next(claims, settings, would_claim).await?
            };
            look_now = false;
        }
        let wake_at = (Instant::now() + sleep_for).min(next_reap);
        tokio::select! {
            Some(result) = running.next(), if !running.is_empty() => {
                finished(result)?;
                // More may have finished meanwhile: collect them before the next claim.
                while let Some(Some(result)) = running.next().now_or_never() {
                    finished(result)?;
                }
                look_now = true;
            }
            () = wake.notified() => look_now = true,
            () = tokio::time::sleep_until(wake_at), if running.len() < settings.workers || wake_at == next_reap => {
                look_now = true;
            }
            _ = shutdown.changed() => {}
        }
    }
    // Let running handlers finish and write back; past the deadline, their rows stay
    // PROCESSING and the reaper of the next instance returns them.
    let drain = async {
        while let Some(result) = running.next().await {
            finished(result)?;
        }
        Ok::<(), ConnectorError>(())
    };
    match tokio::time::timeout(settings.shutdown_deadline, drain).await {
        Ok(result) => result,
        Err(_) => {
            tracing::warn!(
                deadline = ?settings.shutdown_deadline,
                "inbox: handlers still running at the shutdown deadline; their rows stay \
                 PROCESSING until the reaper returns them"
            );
            Ok(())
        }
    }
}

/// One message's end: a transient failure to write its outcome leaves its row PROCESSING
/// for the reaper (logged) rather than stopping every other running handler; a definite
/// one (the table is gone) stops the workers.
fn finished(result: Result<(), ConnectorError>) -> Result<(), ConnectorError> {
    match result {
        Err(e) if e.is_transient() => {
            tracing::warn!(
                error = %e,
                "inbox: an outcome could not be written; the row stays PROCESSING until the \
                 reaper returns it"
            );
            Ok(())
        }
        other => other,
    }
}

/// How long to sleep when the claim found less than it could take: until the next due
/// row, at most `idle_check`. When waking would not lead to a claim (too few free slots;
/// a finishing handler wakes the loop then), the schedule is not read. Expired claims
/// have their own schedule, `next_reap`.
async fn until_next<I: InboxStore>(
    store: &I,
    settings: &WorkerSettings,
    would_claim: bool,
) -> Result<Duration, ConnectorError> {
    if !would_claim {
        return Ok(settings.idle_check);
    }
    let schedule = store.schedule().await?;
    let due = (schedule.next_due).map(|at| {
        at.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO)
    });
    // A due row the claim did not take is held by a claim elsewhere: do not spin.
    Ok(due.map_or(settings.idle_check, |due| {
        settings.idle_check.min(due.max(Duration::from_millis(50)))
    }))
}

/// Why `message` has no handler, with the config that would give it one.
fn no_handler_reason(message: &ClaimedMessage, missing: &NoHandler) -> String {
    let kind = &message.message_type;
    match missing {
        NoHandler::ForType => format!(
            "no handler for message type `{kind}`: add [inbox.handlers.{kind}] or \
             [inbox.handlers.default]"
        ),
        NoHandler::ForSource { bound_to } => format!(
            "no handler for message type `{kind}` from source `{}`: its handler takes only \
             sources {bound_to:?} (inbox.handlers.*.sources)",
            message.source
        ),
    }
}

/// Runs the handler of one claimed message and writes its outcome.
async fn process<I: InboxStore>(
    store: &I,
    message: ClaimedMessage,
    handlers: &Handlers,
    retry: &RetryConfig,
    stats: &InboxStats,
) -> Result<(), ConnectorError> {
    let started = std::time::Instant::now();
    let handler = match handlers.for_message(&message.source, &message.message_type) {
        Ok(handler) => handler,
        Err(missing) => {
            let reason = no_handler_reason(&message, &missing);
            return write(
                store,
                &message,
                InboxOutcome::ManualRequired { reason: &reason },
                stats,
            )
            .await;
        }
    };
    let handled = match tokio::time::timeout(handler.timeout(), handler.handle(&message)).await {
        Ok(handled) => handled,
        Err(_) => Handled::Retry {
            error: format!("handler did not finish within {:?}", handler.timeout()),
            after: None,
        },
    };
    stats.observe_handler(started.elapsed(), &handled);
    let delay = |after: Option<Duration>| {
        let backoff = next_retry_delay(retry, message.retry_count);
        // A Retry-After longer than retry.cap would hold the key back for as long.
        after.map_or(backoff, |after| after.min(retry.cap).max(backoff))
    };
    match handled {
        Handled::Done => {
            let done = InboxOutcome::Done {
                statement: handler.statement(),
            };
            match store.complete(&message, done).await? {
                Completed::StatementFailed(error) => {
                    stats.observe_statement_failed();
                    let failed = InboxOutcome::Failed {
                        error: &error,
                        retry_delay: delay(None),
                    };
                    write(store, &message, failed, stats).await
                }
                other => {
                    stats.observe_completed(&other, true);
                    Ok(())
                }
            }
        }
        Handled::Retry { error, after } => {
            let failed = InboxOutcome::Failed {
                error: &error,
                retry_delay: delay(after),
            };
            write(store, &message, failed, stats).await
        }
        Handled::Manual { reason } => {
            write(
                store,
                &message,
                InboxOutcome::ManualRequired { reason: &reason },
                stats,
            )
            .await
        }
    }
}

async fn write<I: InboxStore>(
    store: &I,
    message: &ClaimedMessage,
    outcome: InboxOutcome<'_>,
    stats: &InboxStats,
) -> Result<(), ConnectorError> {
    let completed = store.complete(message, outcome).await?;
    stats.observe_completed(&completed, false);
    if completed == Completed::ClaimLost {
        tracing::warn!(
            id = message.id,
            message_id = %message.message_id,
            "inbox: the claim was lost before the outcome was written (reaped or changed by \
             an operator); the row keeps its newer state"
        );
    }
    Ok(())
}
