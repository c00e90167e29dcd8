use bytes::Bytes;
use std::time::SystemTime;

/// One committed outbox row, as read from the database log (or claimed by a poller).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxEvent {
    /// The row's primary key; every write-back addresses the row by it.
    pub id: i64,
    /// Which outbox table the row is in: its index in
    /// [`crate::OutboxLayout::outbox_tables`] (0 for a pipeline with one table), for the
    /// topic template's `{schema}` and `{table}`.
    pub table: u16,
    /// Globally unique id of the message, set by the application.
    pub message_id: String,
    /// The kind of event, e.g. `order.created`; used by the topic template.
    pub message_type: String,
    /// The business key: events of one key keep their order.
    pub biz_key: String,
    /// The Kafka record key: the value of the configured key column (`biz_key` unless
    /// configured otherwise).
    pub key: Bytes,
    /// Destination topic set on the row; `None` means "use the topic template".
    pub topic: Option<String>,
    /// The value of the routing column (`outbox.columns.routing`, Debezium's
    /// `aggregatetype`) for the topic template's `{routing}` placeholder, if the table has
    /// one.
    pub routing: Option<String>,
    /// The payload bytes as stored (JSON text for `jsonb`, raw bytes for `bytea`).
    pub payload: Bytes,
    /// Extra record headers from the row's `headers` JSON object, in the object's order.
    pub headers: Vec<(String, Bytes)>,
    /// `created_at` as the database renders it (ISO 8601 with offset).
    pub created_at: String,
    /// Failed publish attempts so far (0 for a fresh row).
    pub retry_count: i32,
    /// Attempts allowed before the row becomes MANUAL_REQUIRED.
    pub max_retry_count: i32,
    /// When the transaction that inserted the row committed, when the log says so.
    pub commit_time: Option<SystemTime>,
    /// Why this row cannot be published as the application meant it (a NULL where a
    /// value is needed, a value outboxd cannot read), when it cannot: the event then
    /// carries only what could be read (`id`, and `biz_key` when readable). Retrying
    /// cannot help, so the core never sends it: it writes the row MANUAL_REQUIRED with
    /// this reason and, in strict ordering, holds its key back.
    pub rejected: Option<String>,
}

impl OutboxEvent {
    /// The row this event was read from: its table and id.
    pub fn row(&self) -> crate::RowId {
        crate::RowId {
            table: self.table,
            id: self.id,
        }
    }

    /// The bytes this event holds (payload, key, headers and its text fields): what the
    /// core counts against `delivery.max_in_flight_bytes`, and connectors against the size
    /// of a [`crate::TransactionPart`]. Not exact to the allocator; proportional to it.
    pub fn size(&self) -> usize {
        const FIXED: usize = 128;
        FIXED
            + self.message_id.len()
            + self.message_type.len()
            + self.biz_key.len()
            + self.key.len()
            + self.topic.as_ref().map_or(0, String::len)
            + self.routing.as_ref().map_or(0, String::len)
            + self.payload.len()
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.len() + 32)
                .sum::<usize>()
            + self.created_at.len()
    }
}
