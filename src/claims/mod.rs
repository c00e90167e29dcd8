//! The claim worker: the second runtime path beside the log relay.
//!
//! Beside the log it retries due FAILED rows (and rows parked by strict ordering); in
//! poll mode (`outbox.mode = "poll"`) it is the whole relay, with INIT rows in scope. Each
//! round claims rows in one short transaction, sends them through the [`Sink`], writes
//! back only where the claim token still matches, and reaps claims abandoned by a stopped
//! worker (`worker.rs`). Failed rows wait out the backoff (`backoff.rs`); the worker
//! sleeps until the table says there is work (`schedule.rs`), or until woken by the relay
//! or by an operator's notification (`notifications.rs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use outboxd_connector::{ClaimScope, Connector};
use tokio::sync::{mpsc, watch, Notify};

use crate::reconnect::{reconnecting, ReconnectBackoff};
use crate::relay::{PipelineError, PipelineStats};
use crate::sink::Sink;

mod backoff;
mod notifications;
mod schedule;
mod worker;

pub use backoff::{backoff_delay, next_retry_delay};
pub(crate) use notifications::watch_retries;
pub use worker::{ClaimWorker, WorkerSettings};

/// Runs the claim worker with its own store connection, reopening it after transient
/// errors, until shutdown.
pub(crate) async fn run_worker<C: Connector, S: Sink>(
    connector: &C,
    sink: &S,
    settings: WorkerSettings,
    stats: &PipelineStats,
    wake: Arc<Notify>,
    delivered_keys: mpsc::UnboundedSender<String>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    // In poll mode the claim worker is the source: ready while it has its connection.
    let polling = settings.scope == ClaimScope::NewAndDueFailed;
    let session = async |_: &mut ReconnectBackoff, shutdown: watch::Receiver<bool>| {
        let result = async {
            let store = connector.open_store().await?;
            stats.streaming.fetch_or(polling, Ordering::Relaxed);
            let worker = ClaimWorker::new(
                &store,
                sink,
                settings.clone(),
                stats,
                Arc::clone(&wake),
                delivered_keys.clone(),
            );
            worker.run(shutdown).await
        }
        .await;
        if polling {
            stats.streaming.store(false, Ordering::Relaxed);
        }
        result
    };
    let on_retry = |e: &outboxd_connector::ConnectorError, pause| {
        tracing::warn!(error = %e, retry_in = ?pause, "claim worker: database unavailable");
    };
    reconnecting(ReconnectBackoff::new(), shutdown, session, on_retry)
        .await
        .map_err(PipelineError::from)
}

#[cfg(test)]
mod tests;
