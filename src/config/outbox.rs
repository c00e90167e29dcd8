//! `[outbox]` and `[outbox.columns]`: table names, the layout, rows kept or deleted.

use outboxd_connector::{ColumnNames, Features, OutboxLayout, RowLifecycle};
use serde::Deserialize;

use super::SourceMode;

/// `[outbox]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutboxConfig {
    /// Outbox table, optionally schema-qualified.
    pub table: String,
    /// Several outbox tables read by one stream (a schema per tenant, a table per bounded
    /// context), instead of `table`: the topic template's `{schema}` and `{table}` tell
    /// their records apart. With kept rows each row's status is written to its table; the
    /// operator's commands take `--table` to address one.
    pub tables: Vec<String>,
    /// Inbox table, optionally schema-qualified.
    pub inbox_table: String,
    /// Checkpoint table, optionally schema-qualified.
    pub checkpoint_table: String,
    /// Column whose value is the Kafka record key; the layout's business key column
    /// (`biz_key`, Debezium's `aggregateid`) unless set.
    pub key_column: Option<String>,
    /// How the relay finds new rows: `log` (default) tails the database log; `poll` claims
    /// INIT rows with `SELECT … FOR UPDATE SKIP LOCKED`, where log access is not granted.
    /// (Formerly `source.mode`, still read.)
    pub mode: Option<SourceMode>,
    /// Deprecated: whether `outboxd run` relays the outbox. An inbox-only process leaves
    /// `[outbox]` and `[kafka]` out instead. After loading: whether the relay runs.
    pub relay: bool,
    /// Whose column names the outbox has: outboxd's own (`schemas/*/outbox.sql`) or
    /// Debezium's outbox table.
    pub layout: TableLayout,
    /// Whether rows stay and carry their status (`kept`), or the application deletes
    /// them (`deleted`); by default `kept` for outboxd's layout, `deleted` for Debezium's.
    pub rows: Option<RowsConfig>,
    /// `[outbox.columns]`: column names that differ from the layout's.
    pub columns: ColumnsConfig,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        let layout = OutboxLayout::default();
        Self {
            table: layout.outbox_table().to_owned(),
            tables: Vec::new(),
            inbox_table: layout.inbox_table,
            checkpoint_table: layout.checkpoint_table,
            key_column: None,
            mode: None,
            relay: true,
            layout: TableLayout::Outboxd,
            rows: None,
            columns: ColumnsConfig::default(),
        }
    }
}

/// `outbox.layout`
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TableLayout {
    /// `schemas/*/outbox.sql`.
    #[default]
    Outboxd,
    /// Debezium's outbox table: `id` (uuid), `aggregatetype`, `aggregateid`, `type`,
    /// `payload`, `tracingspancontext`.
    Debezium,
}

/// `outbox.rows`
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RowsConfig {
    /// Rows stay, outboxd writes their status.
    Kept,
    /// The application deletes rows; outboxd reads them from the log only.
    Deleted,
}

/// The integer row id `init --add-columns` adds to Debezium's table for kept rows
/// (`outbox.layout = "debezium"`, `outbox.rows = "kept"`), unless `outbox.columns.id`
/// names another.
pub use outboxd_connector::DEBEZIUM_ROW_ID;

/// `[outbox.columns]`: each key overrides one column name of the layout. With kept rows
/// `id` must be an integer row id, and the status columns keep outboxd's names (`init
/// --add-columns` adds them).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ColumnsConfig {
    /// An integer primary key; `""` for none.
    pub id: Option<String>,
    pub message_id: Option<String>,
    pub message_type: Option<String>,
    pub biz_key: Option<String>,
    /// A per-row topic; `""` for none.
    pub topic: Option<String>,
    pub payload: Option<String>,
    /// A JSON object of headers; `""` for none.
    pub headers: Option<String>,
    /// `""` for none.
    pub created_at: Option<String>,
    /// The `{routing}` of `kafka.topic_template`.
    pub routing: Option<String>,
    /// W3C trace context (a `traceparent`, or `traceparent=…` lines).
    pub trace: Option<String>,
    /// Further columns sent as headers named after them.
    pub header_columns: Option<Vec<String>>,
}

impl ColumnsConfig {
    /// `base` with these overrides; `""` means "the table has none".
    fn apply(&self, mut base: ColumnNames) -> ColumnNames {
        let optional = |value: &Option<String>, base: &mut Option<String>| {
            if let Some(value) = value {
                *base = (!value.is_empty()).then(|| value.clone());
            }
        };
        let required = |value: &Option<String>, base: &mut String| {
            if let Some(value) = value {
                *base = value.clone();
            }
        };
        optional(&self.id, &mut base.id);
        required(&self.message_id, &mut base.message_id);
        required(&self.message_type, &mut base.message_type);
        required(&self.biz_key, &mut base.biz_key);
        optional(&self.topic, &mut base.topic);
        required(&self.payload, &mut base.payload);
        optional(&self.headers, &mut base.headers);
        optional(&self.created_at, &mut base.created_at);
        optional(&self.routing, &mut base.routing);
        optional(&self.trace, &mut base.trace);
        if let Some(columns) = &self.header_columns {
            base.header_columns = columns.clone();
        }
        base
    }
}

impl OutboxConfig {
    /// `kept` or `deleted`, the layout's default when not set.
    pub fn rows(&self) -> RowLifecycle {
        match (self.rows, self.layout) {
            (Some(RowsConfig::Kept), _) | (None, TableLayout::Outboxd) => RowLifecycle::Kept,
            (Some(RowsConfig::Deleted), _) | (None, TableLayout::Debezium) => RowLifecycle::Deleted,
        }
    }

    /// The layout handed to connectors.
    pub fn layout(&self) -> OutboxLayout {
        let base = match (self.layout, self.rows()) {
            (TableLayout::Outboxd, _) => ColumnNames::default(),
            (TableLayout::Debezium, RowLifecycle::Deleted) => ColumnNames::debezium(),
            // Debezium's table has no integer id: `init --add-columns` adds this one.
            (TableLayout::Debezium, RowLifecycle::Kept) => ColumnNames::debezium_kept(),
        };
        let columns = self.columns.apply(base);
        OutboxLayout {
            outbox_tables: match self.tables.is_empty() {
                true => vec![self.table.clone()],
                false => self.tables.clone(),
            },
            inbox_table: self.inbox_table.clone(),
            checkpoint_table: self.checkpoint_table.clone(),
            key_column: self
                .key_column
                .clone()
                .unwrap_or_else(|| columns.biz_key.clone()),
            rows: self.rows(),
            columns,
            features: Features::default(),
        }
    }

    /// The combinations that cannot work, with what to change.
    pub(super) fn validate(&self, mode: SourceMode) -> Result<(), String> {
        let deleted = self.rows() == RowLifecycle::Deleted;
        // Decided as the connectors decide it: the layout's names are not outboxd's own.
        let mapped = self.layout().columns != ColumnNames::default();
        if !deleted && mapped {
            // Kept rows on the application's own table (Debezium's, or renamed columns):
            // the status columns are added to it (`init --add-columns`) and every
            // statement names its columns as mapped.
            if mode == SourceMode::Poll {
                return Err(
                    "outbox.mode = \"poll\" reads outboxd's own table only: with \
                     outbox.layout = \"debezium\" or [outbox.columns] use outbox.mode = \"log\""
                        .into(),
                );
            }
            if self.layout().columns.id.is_none() {
                return Err(
                    "outbox.rows = \"kept\" needs an integer row id column to address and \
                     order rows: set outbox.columns.id (`outboxd init --add-columns` adds it)"
                        .into(),
                );
            }
        }
        if !self.tables.is_empty() {
            if self.table != OutboxLayout::default().outbox_table() {
                return Err("set outbox.table or outbox.tables, not both".into());
            }
            let mut seen = std::collections::HashSet::new();
            for name in &self.tables {
                if !seen.insert(name.to_lowercase()) {
                    return Err(format!("outbox.tables names `{name}` twice"));
                }
            }
            if self.tables.len() > usize::from(u16::MAX) {
                return Err("outbox.tables: at most 65535 tables".into());
            }
        }
        if deleted && mode == SourceMode::Poll {
            return Err(
                "outbox.rows = \"deleted\" needs outbox.mode = \"log\": deleted rows \
                        are only in the log, there is nothing to poll"
                    .into(),
            );
        }
        let names = self.layout().columns;
        for (key, name) in [
            ("message_id", &names.message_id),
            ("message_type", &names.message_type),
            ("biz_key", &names.biz_key),
            ("payload", &names.payload),
        ] {
            if name.trim().is_empty() {
                return Err(format!("outbox.columns.{key} must name a column"));
            }
        }
        if names.header_columns.iter().any(|c| c.trim().is_empty()) {
            return Err("outbox.columns.header_columns must not hold an empty name".into());
        }
        Ok(())
    }
}
