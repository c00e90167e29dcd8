//! The inbox: the receiving half of the pattern.
//!
//! Messages arrive over Kafka (`kafka.rs`, a consumer group) or HTTP (`http.rs`,
//! `POST /v1/inbox/{source}` on the server of `/metrics`), are stored through
//! [`Ingest`] **before** they are acknowledged (offsets stored for commit, 200 answered
//! only after the insert committed), deduplicated by the table's two unique keys, and
//! handled by the workers (`worker.rs`) through the configured [`handler`]s:
//! PENDING → PROCESSING → DONE / FAILED → … → MANUAL_REQUIRED.
//!
//! - `config.rs`: the `[inbox]` section;
//! - `ingest.rs`: the one path into the table, shared by both ingresses;
//! - `signature.rs`: Standard Webhooks signatures of HTTP ingress;
//! - `body_fields.rs`: the few fields HTTP ingress reads from a JSON body, in one pass;
//! - `stats.rs`: counters for logs and `/metrics`.

mod body_fields;
pub mod config;
pub mod handler;
pub(crate) mod http;
mod ingest;
pub(crate) mod kafka;
/// Standard Webhooks signatures (in `crate::webhooks`, shared with the HTTP sink).
pub use crate::webhooks::signature;
mod stats;
mod worker;

use outboxd_connector::{Connector, ConnectorError};
use tokio::sync::watch;

pub use config::InboxConfig;
pub use handler::{Handled, Handler, Handlers, NoHandler};
pub use ingest::Ingest;
pub use stats::InboxStats;

use crate::config::Config;
use crate::reconnect::{reconnecting, ReconnectBackoff};

/// Completion stores per process: outcomes (and SQL handler statements) are written on
/// these connections, round robin, beside the claiming one.
const COMPLETION_STORES: usize = 4;

/// Runs the inbox of `outboxd.inbox` (nothing without one): its workers and its Kafka
/// ingress (HTTP ingress is served by the endpoint, see [`http::routes`]) until
/// `shutdown`, reconnecting after transient errors. A definite error (a missing table)
/// ends it.
pub async fn run<C: Connector + Clone + 'static>(
    connector: &C,
    ingest: &Ingest<C>,
    handlers: &Handlers,
    outboxd: &Config,
    shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectorError> {
    let Some(config) = &outboxd.inbox else {
        return Ok(());
    };
    let kafka = &outboxd.kafka;
    let settings = worker::WorkerSettings {
        workers: config.workers,
        claim_timeout: config.claim_timeout,
        idle_check: config.idle_check,
        retry: outboxd.retry.clone(),
        shutdown_deadline: outboxd.delivery.shutdown_deadline,
    };
    let stats = ingest.stats();
    let wake = ingest.wake();
    let workers = reconnecting(
        ReconnectBackoff::new(),
        shutdown.clone(),
        async |backoff: &mut ReconnectBackoff, shutdown| {
            let claims = connector.open_inbox().await?;
            let mut completions = Vec::with_capacity(COMPLETION_STORES);
            for _ in 0..COMPLETION_STORES {
                completions.push(connector.open_inbox().await?);
            }
            backoff.reset();
            tracing::info!(workers = settings.workers, "inbox workers started");
            worker::run(
                &claims,
                &completions,
                handlers,
                &settings,
                &stats,
                &wake,
                shutdown,
            )
            .await
        },
        |e, delay| tracing::warn!(error = %e, retry_in = ?delay, "inbox workers: reconnecting"),
    );
    let consumer = async {
        let Some(ingress) = &config.kafka else {
            return Ok(());
        };
        reconnecting(
            ReconnectBackoff::new(),
            shutdown.clone(),
            async |backoff: &mut ReconnectBackoff, shutdown| {
                kafka::run(ingest, kafka, ingress, backoff, shutdown).await
            },
            |e, delay| tracing::warn!(error = %e, retry_in = ?delay, "inbox Kafka ingress: reconnecting"),
        )
        .await
    };
    // The first definite failure of either ends both: a consumer storing messages that no
    // worker handles (or workers waiting for messages no consumer stores) would look
    // healthy while the inbox does nothing.
    tokio::try_join!(workers, consumer).map(|((), ())| ())
}
