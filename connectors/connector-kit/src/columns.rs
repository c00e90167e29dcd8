//! The outbox column model: every column outboxd reads or writes, with its role.
//!
//! From this one list come `check`'s required columns ([`required_columns`]), the columns
//! `init --add-columns` adds to an application's table ([`state_columns`]), the select list
//! of the claim queries ([`claim_fields`]) and the columns the row conversion reads
//! ([`Field`], [`ColumnMap`]), each under the layout's names (`outbox.columns`). An engine
//! adds only its dialect: casts, quoting, how its log names a column.

use outboxd_connector::{ConnectorError, ErrorReason, OutboxLayout};

/// A column the row → event conversion reads (see [`crate::row`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    /// `id`, the primary key.
    Id,
    /// `message_id`.
    MessageId,
    /// `message_type`.
    MessageType,
    /// `biz_key`.
    BizKey,
    /// The configured key column (`biz_key` unless configured otherwise).
    Key,
    /// `topic`, optional per row.
    Topic,
    /// `payload`.
    Payload,
    /// `headers`, a JSON object.
    Headers,
    /// `created_at`.
    CreatedAt,
    /// `retry_count`.
    RetryCount,
    /// `max_retry_count`.
    MaxRetryCount,
    /// `status`: the log path publishes only rows inserted as INIT.
    Status,
    /// `outbox.columns.routing`: the `{routing}` of the topic template (log path only).
    Routing,
    /// `outbox.columns.trace`: W3C trace context (log path only).
    Trace,
    /// `outbox.columns.header_columns[i]`: sent as a header named after its column (log
    /// path only).
    HeaderColumn(usize),
}

impl Field {
    /// The column's name; [`Field::Key`] is the configured key column.
    pub fn column(self, key_column: &str) -> &str {
        match self {
            Field::Key => key_column,
            other => other.fixed_name(),
        }
    }

    fn fixed_name(self) -> &'static str {
        match self {
            Field::Id => "id",
            Field::MessageId => "message_id",
            Field::MessageType => "message_type",
            Field::BizKey => "biz_key",
            Field::Key => "key column",
            Field::Topic => "topic",
            Field::Payload => "payload",
            Field::Headers => "headers",
            Field::CreatedAt => "created_at",
            Field::RetryCount => "retry_count",
            Field::MaxRetryCount => "max_retry_count",
            Field::Status => "status",
            Field::Routing => "routing column",
            Field::Trace => "trace column",
            Field::HeaderColumn(_) => "header column",
        }
    }

    /// The name used in error messages (`key column` for the key).
    pub fn label(self) -> &'static str {
        self.fixed_name()
    }

    /// Columns a log decoder may find missing and read as NULL: a table made before they
    /// existed still streams (`check` requires them, the claim path reads them).
    pub fn optional_in_log(self) -> bool {
        // The trace column too: Debezium's layout names `tracingspancontext`, which
        // Debezium itself needs only with tracing on; a table without it has no trace
        // context to send (`check` says so).
        matches!(self, Field::Topic | Field::Headers | Field::Trace)
    }
}

/// What outboxd does with a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Read into the event ([`Field`]).
    Read(Field),
    /// Written by the write-back, the claims, the reaper or an operator action.
    Written,
}

/// One outbox column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutboxColumn {
    /// Its name in `schemas/*/outbox.sql`.
    pub name: &'static str,
    /// What outboxd does with it.
    pub role: Role,
}

const fn read(name: &'static str, field: Field) -> OutboxColumn {
    OutboxColumn {
        name,
        role: Role::Read(field),
    }
}

const fn written(name: &'static str) -> OutboxColumn {
    OutboxColumn {
        name,
        role: Role::Written,
    }
}

/// Every column of the outbox, in the order of `schemas/*/outbox.sql`. All of them are
/// required by `check` (with the configured key column): the log path reads some, the
/// write-back, the claims (`claimed_at`, `claim_token`) and the operator actions write the
/// others.
pub const OUTBOX_COLUMNS: &[OutboxColumn] = &[
    read("id", Field::Id),
    read("message_id", Field::MessageId),
    read("message_type", Field::MessageType),
    read("biz_key", Field::BizKey),
    read("topic", Field::Topic),
    read("payload", Field::Payload),
    read("headers", Field::Headers),
    read("status", Field::Status),
    read("retry_count", Field::RetryCount),
    read("max_retry_count", Field::MaxRetryCount),
    written("next_retry_time"),
    written("claimed_at"),
    written("claim_token"),
    written("last_error"),
    read("created_at", Field::CreatedAt),
    written("updated_at"),
    written("sent_at"),
    written("kafka_partition"),
    written("kafka_offset"),
];

/// The columns `check` requires of a table whose rows carry their status: every outbox
/// column under the name `layout` gives it (a column the layout says the table lacks,
/// like Debezium's `topic`, is not required), the key column, and the log path's extra
/// columns (routing, trace, header columns). With outboxd's own layout: every column of
/// `schemas/*/outbox.sql` and the key column.
pub fn required_columns(layout: &OutboxLayout) -> Vec<&str> {
    let mut required: Vec<&str> = Vec::new();
    for column in OUTBOX_COLUMNS {
        let name = match column.role {
            Role::Read(field) => log_column(field, layout),
            Role::Written => Some(column.name),
        };
        required.extend(name);
    }
    // With kept rows the trace column stays required even where the log may lack it:
    // the claims of the retry worker select it.
    for (_, name) in log_fields(layout) {
        if !required.contains(&name) {
            required.push(name);
        }
    }
    required
}

/// The trace column the layout names and the table lacks (`present` says whether it has
/// a column of that name): its events carry no trace context.
pub fn missing_trace_column(layout: &OutboxLayout, present: impl Fn(&str) -> bool) -> Option<&str> {
    let trace = layout.columns.trace.as_deref()?;
    (!trace.is_empty() && !present(trace)).then_some(trace)
}

/// How `init --add-columns` adds a column outboxd writes to an application's table (kept
/// rows on a mapped layout, e.g. Debezium's table): the integer row id or a status
/// column, in the engine's dialect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateColumn {
    /// The integer row id, filled in insertion order by the engine (identity,
    /// auto-increment), for rows that exist already too.
    RowId,
    /// `status`: SUCCESS for the rows already there (sent before outboxd took over),
    /// INIT for every row inserted afterwards.
    Status,
    /// `retry_count` (0).
    RetryCount,
    /// `max_retry_count` (10).
    MaxRetryCount,
    /// A nullable timestamp: `next_retry_time`, `claimed_at`, `sent_at`.
    Timestamp,
    /// `updated_at`, set to the time of the change for the rows already there (the
    /// janitor ages a SUCCESS row never sent from it).
    UpdatedAt,
    /// `claim_token`.
    ClaimToken,
    /// `last_error`.
    LastError,
    /// `kafka_partition`.
    Partition,
    /// `kafka_offset`.
    Offset,
}

/// The columns `init --add-columns` adds to an application's outbox table when it lacks
/// them, with their names under `layout`: the integer row id (`outbox.columns.id`) and
/// every column the write-back, the claims and the operator write. Empty for a layout
/// whose rows carry no status.
pub fn state_columns(layout: &OutboxLayout) -> Vec<(&str, StateColumn)> {
    if !layout.tracks_status() {
        return Vec::new();
    }
    let mut columns: Vec<(&str, StateColumn)> = Vec::new();
    columns.extend(
        layout
            .columns
            .id
            .as_deref()
            .map(|id| (id, StateColumn::RowId)),
    );
    columns.extend([
        ("status", StateColumn::Status),
        ("retry_count", StateColumn::RetryCount),
        ("max_retry_count", StateColumn::MaxRetryCount),
        ("next_retry_time", StateColumn::Timestamp),
        ("claimed_at", StateColumn::Timestamp),
        ("claim_token", StateColumn::ClaimToken),
        ("last_error", StateColumn::LastError),
        ("updated_at", StateColumn::UpdatedAt),
        ("sent_at", StateColumn::Timestamp),
        ("kafka_partition", StateColumn::Partition),
        ("kafka_offset", StateColumn::Offset),
    ]);
    columns
}

/// The columns of [`state_columns`] a table lacks; `present` says whether it has a column
/// of that name (each engine compares names as its SQL does).
pub fn missing_state_columns(layout: &OutboxLayout, present: impl Fn(&str) -> bool) -> Vec<&str> {
    state_columns(layout)
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| !present(name))
        .collect()
}

/// Whether `init --add-columns` has columns to add: kept rows on an application's table
/// (`outbox.columns`, Debezium's layout), not outboxd's own.
pub fn adds_state_columns(layout: &OutboxLayout) -> bool {
    layout.tracks_status() && !is_outboxd_table(layout)
}

/// The outbox columns the store's statements name besides the status columns, quoted by
/// the engine: outboxd's own names, or where `outbox.columns` puts them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowNames {
    /// The integer row id every write-back addresses and claims order by.
    pub id: String,
    /// The business key of strict ordering.
    pub biz_key: String,
    /// The message type (`status` counts by it).
    pub message_type: String,
    /// When the row was created, if the table says.
    pub created_at: Option<String>,
}

impl RowNames {
    /// The names under `layout`, each through `quote` (the engine's identifier quoting).
    pub fn quoted(layout: &OutboxLayout, quote: impl Fn(&str) -> String) -> Self {
        let names = &layout.columns;
        Self {
            id: quote(names.id.as_deref().unwrap_or("id")),
            biz_key: quote(&names.biz_key),
            message_type: quote(&names.message_type),
            created_at: names.created_at.as_deref().map(&quote),
        }
    }
}

/// Whether the outbox is outboxd's own table (`schemas/*/outbox.sql`, created by `init`)
/// rather than the application's, whose columns `outbox.columns` names.
pub fn is_outboxd_table(layout: &OutboxLayout) -> bool {
    layout.columns == outboxd_connector::ColumnNames::default()
}

/// The fields the log path reads from an inserted row: the claim's, then `status`.
pub const LOG_FIELDS: [Field; 12] = [
    Field::Id,
    Field::MessageId,
    Field::MessageType,
    Field::BizKey,
    Field::Key,
    Field::Topic,
    Field::Payload,
    Field::Headers,
    Field::CreatedAt,
    Field::RetryCount,
    Field::MaxRetryCount,
    Field::Status,
];

/// The fields a claim (or a scan of rows) selects on outboxd's own table, in select-list
/// order ([`claim_fields`] gives them for any layout). A claim takes only rows it may
/// publish, so it does not read `status`.
pub const CLAIM_FIELDS: &[Field] = LOG_FIELDS.split_at(LOG_FIELDS.len() - 1).0;

/// The column `field` is read from in the log under `layout`, `None` when the table has
/// none. With kept rows ([`OutboxLayout::tracks_status`]) these are the columns of
/// `schemas/*/outbox.sql` (and the key column); with deleted rows, `outbox.columns`, and
/// the status columns are not read.
pub fn log_column(field: Field, layout: &OutboxLayout) -> Option<&str> {
    let names = &layout.columns;
    match field {
        Field::Id => names.id.as_deref(),
        Field::MessageId => Some(&names.message_id),
        Field::MessageType => Some(&names.message_type),
        Field::BizKey => Some(&names.biz_key),
        Field::Key => Some(&layout.key_column),
        Field::Topic => names.topic.as_deref(),
        Field::Payload => Some(&names.payload),
        Field::Headers => names.headers.as_deref(),
        Field::CreatedAt => names.created_at.as_deref(),
        Field::RetryCount | Field::MaxRetryCount | Field::Status => {
            layout.tracks_status().then(|| field.fixed_name())
        }
        Field::Routing => names.routing.as_deref(),
        Field::Trace => names.trace.as_deref(),
        Field::HeaderColumn(i) => names.header_columns.get(i).map(String::as_str),
    }
}

/// Every field the log path reads under `layout`, with its column name.
pub fn log_fields(layout: &OutboxLayout) -> Vec<(Field, &str)> {
    let headers = (0..layout.columns.header_columns.len()).map(Field::HeaderColumn);
    LOG_FIELDS
        .into_iter()
        .chain([Field::Routing, Field::Trace])
        .chain(headers)
        .filter_map(|field| log_column(field, layout).map(|name| (field, name)))
        .collect()
}

/// Where each field is in a row: the log's column index, found by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnMap {
    at: Vec<(Field, usize)>,
    /// The header columns' names, in `outbox.columns.header_columns` order.
    header_names: Vec<String>,
    tracks_status: bool,
}

impl ColumnMap {
    /// Finds every field the log reads under `layout` ([`log_fields`]) with `find` (the
    /// engine's name lookup). A missing column is a definite error naming it and the
    /// table, except the ones [`Field::optional_in_log`].
    pub fn resolve(
        find: impl Fn(&str) -> Option<usize>,
        layout: &OutboxLayout,
        table: &str,
        schema_file: &str,
    ) -> Result<Self, ConnectorError> {
        let mut at = Vec::new();
        for (field, name) in log_fields(layout) {
            match find(name) {
                Some(i) => at.push((field, i)),
                None if field.optional_in_log() => {}
                None => {
                    let see = if !layout.tracks_status() {
                        "see outbox.columns".to_owned()
                    } else if is_outboxd_table(layout) {
                        format!("see {schema_file}")
                    } else {
                        "run `outboxd init --add-columns`, or see outbox.columns".to_owned()
                    };
                    return Err(ConnectorError::definite(format!(
                        "outbox table `{table}` has no column `{name}` ({see})"
                    ))
                    .with_reason(ErrorReason::SchemaMismatch));
                }
            }
        }
        Ok(Self {
            at,
            header_names: layout.columns.header_columns.clone(),
            tracks_status: layout.tracks_status(),
        })
    }

    /// The map of a select list of `fields` ([`claim_fields`]): field `i` is column `i`.
    pub fn in_select_order(fields: &[(Field, &str)], layout: &OutboxLayout) -> Self {
        Self {
            at: fields
                .iter()
                .enumerate()
                .map(|(i, (f, _))| (*f, i))
                .collect(),
            header_names: layout.columns.header_columns.clone(),
            tracks_status: layout.tracks_status(),
        }
    }

    /// How many fields it places: for a select list's map, its number of columns (what
    /// follows them, like a claim's token, is at this index).
    pub fn field_count(&self) -> usize {
        self.at.len()
    }

    /// The column index of `field`; `None` when the table has no such column (or it is
    /// not read under this layout).
    pub fn get(&self, field: Field) -> Option<usize> {
        self.at.iter().find(|(f, _)| *f == field).map(|(_, i)| *i)
    }

    /// The names of the header columns, [`Field::HeaderColumn`]`(i)` is `[i]`.
    pub fn header_names(&self) -> &[String] {
        &self.header_names
    }

    /// Whether rows carry their status (`rows = "kept"`): only INIT inserts are events.
    pub fn tracks_status(&self) -> bool {
        self.tracks_status
    }
}

/// The fields a claim (or a scan of rows) selects under `layout`, with their column
/// names, in select-list order: the log path's fields but `status`, so a row read by SQL
/// becomes the event the log would have made of it (routing, trace and header columns
/// included). With outboxd's own layout these are [`CLAIM_FIELDS`].
pub fn claim_fields(layout: &OutboxLayout) -> Vec<(Field, &str)> {
    log_fields(layout)
        .into_iter()
        .filter(|(field, _)| *field != Field::Status)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_requires_the_claim_columns_and_the_key() {
        let layout = OutboxLayout {
            key_column: "tenant".into(),
            ..OutboxLayout::default()
        };
        let required = required_columns(&layout);
        for name in ["claimed_at", "claim_token", "topic", "headers", "tenant"] {
            assert!(required.contains(&name), "{name}");
        }
        let outboxd: Vec<&str> = OUTBOX_COLUMNS.iter().map(|c| c.name).collect();
        assert_eq!(required_columns(&OutboxLayout::default()), outboxd);
        assert!(is_outboxd_table(&OutboxLayout::default()));
    }

    /// Debezium's table with kept rows: its own columns are read under their names, the
    /// columns it lacks (topic, headers, created_at) are not required, and what `init
    /// --add-columns` adds is exactly what is required beyond Debezium's columns.
    fn debezium_kept() -> OutboxLayout {
        let mut columns = outboxd_connector::ColumnNames::debezium();
        columns.id = Some("outboxd_seq".into());
        OutboxLayout {
            key_column: "aggregateid".into(),
            columns,
            ..OutboxLayout::default()
        }
    }

    #[test]
    fn a_debezium_table_with_kept_rows_needs_the_state_columns_and_an_integer_id() {
        let layout = debezium_kept();
        assert!(!is_outboxd_table(&layout));
        let required = required_columns(&layout);
        // With kept rows the claims read `tracingspancontext` too: required.
        let debezium = [
            "id",
            "aggregatetype",
            "aggregateid",
            "type",
            "payload",
            "tracingspancontext",
        ];
        let added: Vec<&str> = state_columns(&layout).iter().map(|(n, _)| *n).collect();
        let mut expected: Vec<&str> = debezium.iter().chain(&added).copied().collect();
        expected.sort_unstable();
        let mut got = required.clone();
        got.sort_unstable();
        assert_eq!(got, expected);
        assert_eq!(
            state_columns(&layout)[0],
            ("outboxd_seq", StateColumn::RowId)
        );
        let fields = claim_fields(&layout);
        let map = ColumnMap::in_select_order(&fields, &layout);
        assert_eq!(map.get(Field::Id), Some(0));
        assert!(fields.contains(&(Field::Routing, "aggregatetype")));
        assert!(fields.contains(&(Field::HeaderColumn(0), "id")));
        assert_eq!(map.get(Field::Topic), None);
        assert_eq!(map.get(Field::Status), None);
    }

    #[test]
    fn outboxd_claims_select_the_claim_fields() {
        let layout = OutboxLayout::default();
        let fields: Vec<Field> = claim_fields(&layout).iter().map(|(f, _)| *f).collect();
        assert_eq!(fields, CLAIM_FIELDS);
    }

    #[test]
    fn every_read_field_is_an_outbox_column() {
        for field in LOG_FIELDS {
            if field != Field::Key {
                assert!(OUTBOX_COLUMNS
                    .iter()
                    .any(|c| c.role == Role::Read(field) && c.name == field.column("k")));
            }
        }
    }

    #[test]
    fn resolves_names_and_reports_the_missing_one() {
        let all = [
            "id",
            "message_id",
            "message_type",
            "biz_key",
            "payload",
            "status",
            "created_at",
            "retry_count",
            "max_retry_count",
        ];
        let first_six = |n: &str| all[..6].iter().position(|c| *c == n);
        let layout = OutboxLayout::default();
        let err = ColumnMap::resolve(first_six, &layout, "outbox", "x.sql").unwrap_err();
        assert!(err.message().contains("`created_at`"), "{err}");
        assert_eq!(err.reason(), ErrorReason::SchemaMismatch);
        let find = |n: &str| all.iter().position(|c| *c == n);
        let map = ColumnMap::resolve(find, &layout, "outbox", "x.sql").unwrap();
        assert_eq!(map.get(Field::Key), Some(3));
        assert_eq!(map.get(Field::Topic), None);
        assert_eq!(claim_fields(&layout).len(), 11);
    }

    #[test]
    fn deleted_rows_read_the_configured_columns_and_no_status() {
        let layout = OutboxLayout {
            rows: outboxd_connector::RowLifecycle::Deleted,
            key_column: "aggregateid".into(),
            columns: outboxd_connector::ColumnNames::debezium(),
            ..OutboxLayout::default()
        };
        let table = [
            "id",
            "aggregatetype",
            "aggregateid",
            "type",
            "payload",
            "tracingspancontext",
        ];
        let find = |n: &str| table.iter().position(|c| *c == n);
        let map = ColumnMap::resolve(find, &layout, "outbox", "x.sql").unwrap();
        assert_eq!(map.get(Field::MessageId), Some(0));
        assert_eq!(map.get(Field::Routing), Some(1));
        assert_eq!(map.get(Field::Key), Some(2));
        assert_eq!(map.get(Field::HeaderColumn(0)), Some(0));
        assert_eq!(map.get(Field::Id), None);
        assert_eq!(map.get(Field::Status), None);
        assert!(!map.tracks_status());
        assert_eq!(map.header_names(), ["id"]);
        // Without the trace column: no trace context, no error.
        let without_trace = |n: &str| table[..5].iter().position(|c| *c == n);
        let map = ColumnMap::resolve(without_trace, &layout, "outbox", "x.sql").unwrap();
        assert_eq!(map.get(Field::Trace), None);
        assert_eq!(map.get(Field::Key), Some(2));
        // Without the key: an error naming it.
        let without_key = |n: &str| {
            (n != "aggregateid")
                .then(|| table.iter().position(|c| *c == n))
                .flatten()
        };
        let err = ColumnMap::resolve(without_key, &layout, "outbox", "x.sql").unwrap_err();
        assert_eq!(
            err.message(),
            "outbox table `outbox` has no column `aggregateid` (see outbox.columns)"
        );
    }
}
