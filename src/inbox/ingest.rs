//! The one path into the inbox table, shared by Kafka and HTTP ingress: store a batch in
//! one transaction, count what was new and what was a duplicate, wake the workers.
//!
//! The store is opened on first use and kept; its connection reconnects by itself after
//! a failure, so a database that is down answers each call with a transient error (HTTP
//! 503, the consumer re-reads) until it is back.

use std::sync::Arc;

use base64::Engine as _;
use outboxd_connector::{Connector, ConnectorError, InboxMessage, InboxStore, Ingested};
use sha2::{Digest, Sha256};
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
    ///
    /// A batch the database refuses for good (a value it cannot take: a NUL in JSON text,
    /// an id longer than its column) is stored message by message, so that only the
    /// offending message is affected. Such a message from Kafka, which cannot be asked
    /// again, is kept for an operator ([`quarantined`]); from HTTP the error is returned
    /// and the sender is answered 400.
    pub async fn store(
        &self,
        messages: &[InboxMessage],
        ingress: &'static str,
    ) -> Result<Vec<Ingested>, ConnectorError> {
        let store = self.opened().await?;
        let outcomes = match store.insert(messages).await {
            Err(e) if !e.is_transient() => {
                let mut outcomes = Vec::with_capacity(messages.len());
                for message in messages {
                    let single = std::slice::from_ref(message);
                    match store.insert(single).await {
                        Ok(stored) => outcomes.extend(stored),
                        Err(e) if !e.is_transient() && ingress == "kafka" => {
                            tracing::warn!(
                                error = %e,
                                message_id = %message.message_id,
                                "inbox: a message the database refuses is kept MANUAL_REQUIRED \
                                 with its payload in base64"
                            );
                            let kept = quarantined(message, &e);
                            outcomes.extend(store.insert(std::slice::from_ref(&kept)).await?);
                        }
                        Err(e) => return Err(e),
                    }
                }
                outcomes
            }
            other => other?,
        };
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

/// Longest id, type or key kept as is in a quarantined message (below every engine's
/// column and index limits).
const KEPT_CHARS: usize = 200;

/// `message` in a form every inbox table can store: the payload as a JSON object holding
/// its bytes in base64, no headers, and its id, type and key without NUL characters and
/// cut to [`KEPT_CHARS`] (with a hash of the original, so cut values stay distinct),
/// MANUAL_REQUIRED with the database's error.
pub(crate) fn quarantined(message: &InboxMessage, error: &ConnectorError) -> InboxMessage {
    let payload = serde_json::json!({
        "unstorable_payload_base64": base64::engine::general_purpose::STANDARD.encode(&message.payload),
    });
    InboxMessage {
        source: storable(&message.source),
        message_id: storable(&message.message_id),
        message_type: storable(&message.message_type),
        biz_key: storable(&message.biz_key),
        payload: payload.to_string().into_bytes(),
        headers: Vec::new(),
        rejected: Some(format!(
            "the message could not be stored as received ({}); its payload is kept in base64",
            error.message()
        )),
    }
}

/// `text` without NUL characters, at most [`KEPT_CHARS`] long; when changed, followed by
/// `#` and 16 hex digits of the original's SHA-256.
fn storable(text: &str) -> String {
    let clean: String = text
        .chars()
        .filter(|c| *c != '\0')
        .take(KEPT_CHARS)
        .collect();
    if clean == text {
        return clean;
    }
    let digest = Sha256::digest(text.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{clean}#{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quarantined_messages_are_storable_and_stay_distinct() {
        let message = InboxMessage {
            source: "t".into(),
            message_id: format!("{}\0a", "x".repeat(300)),
            message_type: "order\0created".into(),
            biz_key: "k".into(),
            payload: vec![0, 1, 2, 0xff],
            headers: vec![("h".into(), "\0".into())],
            rejected: None,
        };
        let error = ConnectorError::definite("unsupported Unicode escape sequence");
        let kept = quarantined(&message, &error);
        assert!(kept.message_id.len() <= KEPT_CHARS + 17 && !kept.message_id.contains('\0'));
        assert_ne!(
            kept.message_id,
            storable(&format!("{}\0b", "x".repeat(300)))
        );
        assert!(kept.message_type.starts_with("ordercreated#"));
        assert_eq!(kept.biz_key, "k", "clean values are kept as they are");
        let payload: serde_json::Value = serde_json::from_slice(&kept.payload).unwrap();
        assert_eq!(payload["unstorable_payload_base64"], "AAEC/w==");
        assert!(kept.headers.is_empty());
        assert!(kept
            .rejected
            .unwrap()
            .contains("unsupported Unicode escape"));
    }
}
