//! The outbox column model: every column outboxd reads or writes, with its role.
//!
//! From this one list come `check`'s required columns ([`required_columns`]), the select
//! list of the claim queries ([`CLAIM_FIELDS`], [`select_list`]) and the columns the row
//! conversion reads ([`Field`], [`ColumnMap`]). An engine adds only its dialect: casts,
//! quoting, how its log names a column.

use outboxd_connector::{ConnectorError, ErrorReason};

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
        }
    }

    /// The name used in error messages (`key column` for the key).
    pub fn label(self) -> &'static str {
        self.fixed_name()
    }

    /// Columns a log decoder may find missing and read as NULL: a table made before they
    /// existed still streams (`check` requires them, the claim path reads them).
    pub fn optional_in_log(self) -> bool {
        matches!(self, Field::Topic | Field::Headers)
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

/// The columns `check` requires: every outbox column and the key column.
pub fn required_columns(key_column: &str) -> Vec<&str> {
    let mut required: Vec<&str> = OUTBOX_COLUMNS.iter().map(|c| c.name).collect();
    if !required.contains(&key_column) {
        required.push(key_column);
    }
    required
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

/// The fields a claim (or a scan of rows) selects, in select-list order; the SQL result
/// row's column `i` is `CLAIM_FIELDS[i]`. A claim's token follows them. A claim takes
/// only rows it may publish, so it does not read `status`.
pub const CLAIM_FIELDS: &[Field] = LOG_FIELDS.split_at(LOG_FIELDS.len() - 1).0;

/// The select list of [`CLAIM_FIELDS`], each rendered by the engine (alias, quoting,
/// casts), joined with `, `.
pub fn select_list(render: impl Fn(Field) -> String) -> String {
    CLAIM_FIELDS
        .iter()
        .map(|f| render(*f))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where each field is in a row: the log's column index, found by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnMap {
    at: [Option<usize>; LOG_FIELDS.len()],
}

impl ColumnMap {
    /// Finds every field of [`LOG_FIELDS`] with `find` (the engine's name lookup). A
    /// missing column is a definite error naming it and the table, except the ones
    /// [`Field::optional_in_log`].
    pub fn resolve(
        find: impl Fn(&str) -> Option<usize>,
        key_column: &str,
        table: &str,
        schema_file: &str,
    ) -> Result<Self, ConnectorError> {
        let mut at = [None; LOG_FIELDS.len()];
        for (slot, field) in at.iter_mut().zip(LOG_FIELDS) {
            let name = field.column(key_column);
            *slot = find(name);
            if slot.is_none() && !field.optional_in_log() {
                return Err(ConnectorError::definite(format!(
                    "outbox table `{table}` has no column `{name}` (see {schema_file})"
                ))
                .with_reason(ErrorReason::SchemaMismatch));
            }
        }
        Ok(Self { at })
    }

    /// The column index of `field`; `None` only for a missing optional column.
    pub fn get(&self, field: Field) -> Option<usize> {
        let i = LOG_FIELDS.iter().position(|f| *f == field)?;
        self.at[i]
    }
}

/// Where `field` is in a claim's result row (see [`CLAIM_FIELDS`]).
pub fn position_in_claim(field: Field) -> Option<usize> {
    CLAIM_FIELDS.iter().position(|f| *f == field)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_requires_the_claim_columns_and_the_key() {
        let required = required_columns("tenant");
        for name in ["claimed_at", "claim_token", "topic", "headers", "tenant"] {
            assert!(required.contains(&name), "{name}");
        }
        assert_eq!(required_columns("biz_key").len(), OUTBOX_COLUMNS.len());
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
        let err = ColumnMap::resolve(first_six, "biz_key", "outbox", "x.sql").unwrap_err();
        assert!(err.message().contains("`created_at`"), "{err}");
        assert_eq!(err.reason(), ErrorReason::SchemaMismatch);
        let find = |n: &str| all.iter().position(|c| *c == n);
        let map = ColumnMap::resolve(find, "biz_key", "outbox", "x.sql").unwrap();
        assert_eq!(map.get(Field::Key), Some(3));
        assert_eq!(map.get(Field::Topic), None);
        assert_eq!(
            select_list(|f| f.column("k").to_owned())
                .split(", ")
                .count(),
            11
        );
    }
}
