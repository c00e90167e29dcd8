//! Operator notifications: `outboxd retry` / `resolve` on an engine that can notify
//! (PostgreSQL `NOTIFY`) wake the claim worker at once instead of at its next look.

use std::sync::Arc;
use std::time::Duration;

use outboxd_connector::{Connector, ConnectorError};
use tokio::sync::{watch, Notify};

use crate::reconnect::{reconnecting, ReconnectBackoff, SessionError};

/// The listener's connection failed: always worth listening again.
struct Interrupted(ConnectorError);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl SessionError for Interrupted {
    fn is_transient(&self) -> bool {
        true
    }
}

/// Wakes the claim worker on the engine's operator notifications, listening again 1 s
/// after a failure, until shutdown. Engines without notifications wait for shutdown.
pub(crate) async fn watch_retries<C: Connector>(
    connector: &C,
    wake: &Arc<Notify>,
    shutdown: watch::Receiver<bool>,
) {
    let on_notify = || wake.notify_one();
    let session = async |_: &mut ReconnectBackoff, mut shutdown: watch::Receiver<bool>| {
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => Ok(()),
            e = connector.watch_retries(&on_notify) => Err(Interrupted(e)),
        }
    };
    let on_retry = |e: &Interrupted, _| {
        tracing::debug!(error = %e, "retry notifications interrupted; listening again in 1 s");
    };
    // Every error is transient: this only returns at shutdown.
    let _: Result<(), Interrupted> = reconnecting(
        ReconnectBackoff::constant(Duration::from_secs(1)),
        shutdown,
        session,
        on_retry,
    )
    .await;
}
