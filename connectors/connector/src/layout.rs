//! Where the outbox lives, what its columns are called, and whether its rows carry their
//! delivery status: everything a connector needs to know about the application's tables.

/// Where the outbox lives, which column is the Kafka key, and how its rows are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxLayout {
    /// The outbox tables, each name optionally schema-qualified (`public.outbox`): one
    /// (`outbox.table`), or several read by one stream (`outbox.tables`, rows deleted
    /// only). Never empty. An event's [`crate::OutboxEvent::table`] is its index here.
    pub outbox_tables: Vec<String>,
    /// Inbox table name, optionally schema-qualified.
    pub inbox_table: String,
    /// Checkpoint table name, optionally schema-qualified.
    pub checkpoint_table: String,
    /// Column whose value becomes the Kafka record key.
    pub key_column: String,
    /// Whether rows stay in the table and carry their status, or are deleted by the
    /// application (only the log sees them).
    pub rows: RowLifecycle,
    /// The names of the columns the log path reads.
    pub columns: ColumnNames,
    /// Which halves this process runs on the database: `init`, `schema` and `check`
    /// create and look at only the tables (and log objects) of those.
    pub features: Features,
}

/// Which halves of outboxd a process runs on one database (the config's `[outbox]` and
/// `[inbox]` sections). Both by default, as for every configuration written before a
/// process could leave a half out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// The outbox relay: outbox tables, the checkpoint table, the log's objects (slot,
    /// publication, binlog checkpoint) or poll mode's index.
    pub outbox: bool,
    /// The inbox: its table.
    pub inbox: bool,
}

impl Default for Features {
    fn default() -> Self {
        Self {
            outbox: true,
            inbox: true,
        }
    }
}

impl OutboxLayout {
    /// A layout with these table names and the default key column (`biz_key`).
    pub fn with_tables(outbox: &str, inbox: &str, checkpoint: &str) -> Self {
        Self {
            outbox_tables: vec![outbox.into()],
            inbox_table: inbox.into(),
            checkpoint_table: checkpoint.into(),
            ..Self::default()
        }
    }

    /// The outbox table: the only one, or the first of several. The operator's commands
    /// act on one table: with several, on the one [`OutboxLayout::for_table`] keeps.
    /// The log path, the write-back and the claims cover them all
    /// ([`OutboxLayout::outbox_tables`]).
    pub fn outbox_table(&self) -> &str {
        self.outbox_tables.first().map_or("outbox", String::as_str)
    }

    /// The same layout narrowed to one of its outbox tables (by index), for the
    /// operator's commands, which act on one table at a time.
    pub fn for_table(&self, index: usize) -> Option<Self> {
        let table = self.outbox_tables.get(index)?.clone();
        Some(Self {
            outbox_tables: vec![table],
            ..self.clone()
        })
    }

    /// The tables of the features this process runs ([`OutboxLayout::features`]): the
    /// outbox tables and the checkpoint table for the relay, the inbox table for the inbox.
    pub fn tables_in_use(&self) -> Vec<&str> {
        let outbox = (self.outbox_tables.iter())
            .chain([&self.checkpoint_table])
            .filter(|_| self.features.outbox);
        let inbox = [&self.inbox_table]
            .into_iter()
            .filter(|_| self.features.inbox);
        outbox.chain(inbox).map(String::as_str).collect()
    }

    /// Whether the pipeline reads several outbox tables.
    pub fn has_several_tables(&self) -> bool {
        self.outbox_tables.len() > 1
    }

    /// Whether outboxd writes statuses back to the outbox rows (`rows = "kept"`).
    pub fn tracks_status(&self) -> bool {
        self.rows == RowLifecycle::Kept
    }
}

impl Default for OutboxLayout {
    fn default() -> Self {
        Self {
            outbox_tables: vec!["outbox".into()],
            inbox_table: "inbox".into(),
            checkpoint_table: "outboxd_checkpoint".into(),
            key_column: "biz_key".into(),
            rows: RowLifecycle::Kept,
            columns: ColumnNames::default(),
            features: Features::default(),
        }
    }
}

/// `outbox.rows`: what becomes of an outbox row once it is committed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RowLifecycle {
    /// The row stays, and outboxd keeps its status true (`status`, `retry_count`,
    /// `next_retry_time`, `last_error`): SUCCESS, FAILED with retries, MANUAL_REQUIRED.
    #[default]
    Kept,
    /// The application deletes the row, usually in the transaction that inserts it (the
    /// pattern Debezium recommends): only the log sees it. outboxd publishes from the log
    /// and writes nothing back; a record Kafka refuses holds the log position and is
    /// sent again, since there is no row to mark FAILED.
    Deleted,
}

/// The integer row id column `init --add-columns` adds to Debezium's table (which has
/// none) when outboxd keeps its rows: write-backs and claims address rows by it.
pub const DEBEZIUM_ROW_ID: &str = "outboxd_seq";

/// The names of the columns the log path reads into an event. outboxd's own table
/// (`schemas/*/outbox.sql`) is the default; [`ColumnNames::debezium`] is Debezium's
/// outbox table. Names are compared as the engine compares them (exact on PostgreSQL,
/// without case on MySQL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnNames {
    /// The integer row id every write-back addresses and claims order by; `None` for a
    /// table without one, which only `rows = "deleted"` can read (the event's id is then
    /// 0). With kept rows on Debezium's table, the column `init --add-columns` added.
    pub id: Option<String>,
    /// The message id (the `message_id` header, CloudEvents `ce_id`).
    pub message_id: String,
    /// The message type (the `{message_type}` placeholder, `ce_type`).
    pub message_type: String,
    /// The business key: events of one key keep their order.
    pub biz_key: String,
    /// A per-row destination topic, if the table has one.
    pub topic: Option<String>,
    /// The record value.
    pub payload: String,
    /// A JSON object of extra record headers, if the table has one.
    pub headers: Option<String>,
    /// When the row was created (the `created_at` header, `ce_time`), if the table says.
    pub created_at: Option<String>,
    /// A value for the topic template's `{routing}` placeholder (Debezium's
    /// `aggregatetype`).
    pub routing: Option<String>,
    /// W3C trace context of the event: a `traceparent` value, or lines of `name=value`
    /// holding `traceparent` and `tracestate` (how Debezium's `tracingspancontext` column
    /// stores it). Sent as the `traceparent`/`tracestate` headers.
    pub trace: Option<String>,
    /// Further columns sent as record headers, each under its column's name.
    pub header_columns: Vec<String>,
}

impl Default for ColumnNames {
    fn default() -> Self {
        Self {
            id: Some("id".into()),
            message_id: "message_id".into(),
            message_type: "message_type".into(),
            biz_key: "biz_key".into(),
            topic: Some("topic".into()),
            payload: "payload".into(),
            headers: Some("headers".into()),
            created_at: Some("created_at".into()),
            routing: None,
            trace: None,
            header_columns: Vec::new(),
        }
    }
}

impl ColumnNames {
    /// Debezium's outbox table (`id` uuid, `aggregatetype`, `aggregateid`, `type`,
    /// `payload`, `tracingspancontext`), read the way Debezium's Event Router reads it:
    /// the uuid is the message id and travels as the header `id`, `aggregateid` is the key,
    /// `aggregatetype` routes.
    pub fn debezium() -> Self {
        Self {
            id: None,
            message_id: "id".into(),
            message_type: "type".into(),
            biz_key: "aggregateid".into(),
            topic: None,
            payload: "payload".into(),
            headers: None,
            created_at: None,
            routing: Some("aggregatetype".into()),
            trace: Some("tracingspancontext".into()),
            header_columns: vec!["id".into()],
        }
    }

    /// Debezium's outbox table whose rows outboxd keeps (`outbox.rows = "kept"`): as
    /// [`ColumnNames::debezium`], with the integer row id [`DEBEZIUM_ROW_ID`] that
    /// `init --add-columns` adds.
    pub fn debezium_kept() -> Self {
        Self {
            id: Some(DEBEZIUM_ROW_ID.into()),
            ..Self::debezium()
        }
    }
}
