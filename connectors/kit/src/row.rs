//! One outbox row → [`OutboxEvent`], for every engine and for the log and claim paths
//! alike, with one policy for bad values:
//!
//! - a NULL or non-UTF-8 `message_id`, `message_type`, `biz_key` or `created_at`, a count
//!   that is not an integer or out of range, a value the engine cannot read: the row
//!   cannot be published as the application meant it, and retrying cannot change that.
//!   It becomes a *rejected* event ([`OutboxEvent::rejected`] names the column and why),
//!   which the core writes MANUAL_REQUIRED instead of sending, so one bad row never
//!   stops the relay;
//! - a row whose `id` (or, in the log, `status`) cannot be read cannot even be addressed:
//!   a definite error naming the table and the column;
//! - a `headers` value that is not a JSON object: logged (warn) and the event is published
//!   without headers (the payload is intact; headers are extras);
//! - a NULL key, payload, topic or headers: empty bytes, no topic, no headers.
//!
//! An engine converts its native values to [`Value`] behind [`RowSource`]: bytes as
//! stored (bytea decoded, JSON rendered as text), `created_at` already rendered as ISO
//! 8601 text in the engine's way.

use bytes::Bytes;
use outboxd_connector::{headers_from_json, ConnectorError, OutboxEvent};

use crate::columns::Field;
use crate::status;

/// A column value, engine-neutral.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// SQL NULL (or a column the log path may lack, see [`Field::optional_in_log`]).
    Null,
    /// An integer the engine read as one.
    Int(i64),
    /// Text or bytes as stored; integers may come as their decimal text.
    Bytes(Bytes),
}

/// A row as the conversion reads it.
pub trait RowSource {
    /// The value of `field`. An error is for a value the engine cannot turn into a
    /// [`Value`] (a type outboxd does not read, a truncated row).
    fn value(&self, field: Field) -> Result<Value, ConnectorError>;
}

/// An inserted row seen in the log: `None` unless its status is INIT (a row inserted in
/// another status is not for outboxd to publish).
pub fn event_from_insert(
    row: &impl RowSource,
    table: &str,
) -> Result<Option<OutboxEvent>, ConnectorError> {
    let read = Reader { row, table };
    if read.text(Field::Status)?.as_deref() != Some(status::INIT) {
        return Ok(None);
    }
    read.event_or_rejected().map(Some)
}

/// A row read by SQL (a claim, a scan): as the log path would build it, without a commit
/// time.
pub fn event_from_row(row: &impl RowSource, table: &str) -> Result<OutboxEvent, ConnectorError> {
    Reader { row, table }.event_or_rejected()
}

/// The row's `headers` JSON as record headers under the bad-value policy: a value that is
/// not a JSON object is logged and dropped.
pub fn row_headers(json: Option<&str>, table: &str) -> Vec<(String, Bytes)> {
    match json {
        Some(json) => headers_from_json(json).unwrap_or_else(|| {
            tracing::warn!(
                table,
                "outbox `headers` is not a JSON object; publishing without headers"
            );
            Vec::new()
        }),
        None => Vec::new(),
    }
}

struct Reader<'a, R> {
    row: &'a R,
    table: &'a str,
}

impl<R: RowSource> Reader<'_, R> {
    /// The event, or, when only its id can be read, a rejected event with the reason.
    fn event_or_rejected(&self) -> Result<OutboxEvent, ConnectorError> {
        let id = self.int(Field::Id)?;
        self.event().or_else(|e| {
            let biz_key = self.text(Field::BizKey).ok().flatten().unwrap_or_default();
            tracing::warn!(
                table = self.table,
                id,
                reason = %e,
                "an outbox row cannot be published; it becomes MANUAL_REQUIRED"
            );
            Ok(OutboxEvent {
                id,
                message_id: self
                    .text(Field::MessageId)
                    .ok()
                    .flatten()
                    .unwrap_or_default(),
                message_type: String::new(),
                key: Bytes::from(biz_key.clone()),
                biz_key,
                topic: None,
                payload: Bytes::new(),
                headers: Vec::new(),
                created_at: String::new(),
                retry_count: self.int32(Field::RetryCount).unwrap_or(0),
                max_retry_count: self.int32(Field::MaxRetryCount).unwrap_or(0),
                commit_time: None,
                rejected: Some(format!("cannot be published: {e}")),
            })
        })
    }

    fn event(&self) -> Result<OutboxEvent, ConnectorError> {
        let headers = self.text(Field::Headers)?;
        Ok(OutboxEvent {
            id: self.int(Field::Id)?,
            message_id: self.not_null(Field::MessageId)?,
            message_type: self.not_null(Field::MessageType)?,
            biz_key: self.not_null(Field::BizKey)?,
            key: self.bytes(Field::Key)?,
            topic: self.text(Field::Topic)?,
            payload: self.bytes(Field::Payload)?,
            headers: row_headers(headers.as_deref(), self.table),
            created_at: self.not_null(Field::CreatedAt)?,
            retry_count: self.int32(Field::RetryCount)?,
            max_retry_count: self.int32(Field::MaxRetryCount)?,
            commit_time: None,
            rejected: None,
        })
    }

    fn error(&self, field: Field, what: &str) -> ConnectorError {
        ConnectorError::definite(format!(
            "outbox `{}`: column `{}` {what}",
            self.table,
            field.label()
        ))
    }

    fn bytes(&self, field: Field) -> Result<Bytes, ConnectorError> {
        Ok(match self.row.value(field)? {
            Value::Null => Bytes::new(),
            Value::Int(i) => Bytes::from(i.to_string()),
            Value::Bytes(b) => b,
        })
    }

    fn text(&self, field: Field) -> Result<Option<String>, ConnectorError> {
        match self.row.value(field)? {
            Value::Null => Ok(None),
            Value::Int(i) => Ok(Some(i.to_string())),
            Value::Bytes(b) => String::from_utf8(b.to_vec())
                .map(Some)
                .map_err(|_| self.error(field, "is not UTF-8")),
        }
    }

    fn not_null(&self, field: Field) -> Result<String, ConnectorError> {
        self.text(field)?
            .ok_or_else(|| self.error(field, "is NULL"))
    }

    fn int(&self, field: Field) -> Result<i64, ConnectorError> {
        match self.row.value(field)? {
            Value::Int(i) => Ok(i),
            _ => {
                let text = self.not_null(field)?;
                text.trim()
                    .parse()
                    .map_err(|_| self.error(field, &format!("= `{text}` is not an integer")))
            }
        }
    }

    fn int32(&self, field: Field) -> Result<i32, ConnectorError> {
        i32::try_from(self.int(field)?).map_err(|_| self.error(field, "is out of range"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Row(HashMap<Field, Value>);

    impl RowSource for Row {
        fn value(&self, field: Field) -> Result<Value, ConnectorError> {
            Ok(self.0.get(&field).cloned().unwrap_or(Value::Null))
        }
    }

    fn text(s: &str) -> Value {
        Value::Bytes(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn row() -> Row {
        Row(HashMap::from([
            (Field::Id, Value::Int(7)),
            (Field::MessageId, text("m-7")),
            (Field::MessageType, text("order.created")),
            (Field::BizKey, text("o-7")),
            (Field::Key, text("o-7")),
            (Field::Payload, text("{}")),
            (Field::Headers, text(r#"{"trace": "abc"}"#)),
            (Field::CreatedAt, text("2026-05-09T07:30:00+00:00")),
            (Field::RetryCount, text("0")),
            (Field::MaxRetryCount, Value::Int(10)),
            (Field::Status, text("INIT")),
        ]))
    }

    #[test]
    fn converts_a_row() {
        let e = event_from_row(&row(), "outbox").unwrap();
        assert_eq!((e.id, e.message_id.as_str()), (7, "m-7"));
        assert_eq!(e.topic, None);
        assert_eq!(e.headers, vec![("trace".to_owned(), Bytes::from("abc"))]);
        assert_eq!((e.retry_count, e.max_retry_count), (0, 10));
    }

    #[test]
    fn only_init_inserts_are_events() {
        assert!(event_from_insert(&row(), "outbox").unwrap().is_some());
        let mut done = row();
        done.0.insert(Field::Status, text("SUCCESS"));
        assert!(event_from_insert(&done, "outbox").unwrap().is_none());
    }

    #[test]
    fn bad_headers_are_dropped_bad_values_reject_the_row_bad_ids_are_errors() {
        let mut r = row();
        r.0.insert(Field::Headers, text("[1]"));
        assert!(event_from_row(&r, "outbox").unwrap().headers.is_empty());
        r.0.insert(Field::MessageId, Value::Null);
        let e = event_from_row(&r, "outbox").unwrap();
        assert_eq!((e.id, e.biz_key.as_str()), (7, "o-7"));
        assert_eq!(
            e.rejected.as_deref(),
            Some("cannot be published: outbox `outbox`: column `message_id` is NULL")
        );
        let mut r = row();
        r.0.insert(Field::RetryCount, Value::Int(i64::MAX));
        let e = event_from_insert(&r, "outbox").unwrap().unwrap();
        assert!(e.rejected.unwrap().contains("out of range"));
        let mut r = row();
        r.0.insert(Field::BizKey, Value::Null);
        let e = event_from_insert(&r, "outbox").unwrap().unwrap();
        assert_eq!(e.biz_key, "", "no key to hold back");
        assert!(e.rejected.unwrap().contains("`biz_key` is NULL"));
        // A row that cannot be addressed is a definite error.
        r.0.insert(Field::Id, Value::Null);
        let err = event_from_row(&r, "outbox").unwrap_err();
        assert!(!err.is_transient());
        assert_eq!(err.message(), "outbox `outbox`: column `id` is NULL");
    }
}
