//! The one path into the inbox table, shared by Kafka and HTTP ingress: store a batch in
//! one transaction, count what was new and what was a duplicate, wake the workers.
//!
//! The store is opened on first use and kept; its connection reconnects by itself after
//! a failure, so a database that is down answers each call with a transient error (HTTP
//! 503, the consumer re-reads) until it is back.

use std::sync::Arc;

use outboxd_connector::{Connector, ConnectorError, InboxMessage, InboxStore, Ingested};
use tokio::sync::{Notify, OnceCell};

use super::InboxStats;

/// Stores messages for both ingresses.
pub struct Ingest<C: Connector> {
    connector: C,
    store: OnceCell<C::Inbox>,
    stats: Arc<InboxStats>,
    wake: Arc<Notify>,
}

impl<C: Connector> Ingest<C> {
    /// Ingest into `connector`'s inbox table.
    pub fn new(connector: C, stats: Arc<InboxStats>) -> Self {
        Self {
            connector,
            store: OnceCell::new(),
            stats,
            wake: Arc::new(Notify::new()),
        }
    }

    /// The counters.
    pub fn stats(&self) -> Arc<InboxStats> {
        Arc::clone(&self.stats)
    }

    /// Notified after every batch that stored something new.
    pub fn wake(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }

    async fn opened(&self) -> Result<&C::Inbox, ConnectorError> {
        self.store
            .get_or_try_init(|| self.connector.open_inbox())
            .await
    }

    /// Whether bodies must be JSON (the payload column is JSON).
    pub async fn payload_is_json(&self) -> Result<bool, ConnectorError> {
        Ok(self.opened().await?.payload_is_json())
    }

    /// Stores `messages` in one transaction; durable when it returns. `ingress` names
    /// the path for the counters (`kafka`, `http`).
    pub async fn store(
        &self,
        messages: &[InboxMessage],
        ingress: &'static str,
    ) -> Result<Vec<Ingested>, ConnectorError> {
        let outcomes = self.opened().await?.insert(messages).await?;
        let stored = outcomes
            .iter()
            .filter(|o| matches!(o, Ingested::Stored(_)))
            .count();
        self.stats.observe_ingested(ingress, messages, &outcomes);
        if stored > 0 {
            self.wake.notify_one();
        }
        Ok(outcomes)
    }
}
