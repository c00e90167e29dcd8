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
//! With `outbox.rows = "deleted"` the log path reads the columns `outbox.columns` names
//! ([`ColumnMap`]): no `status` (every insert is an event), no integer `id` when the table
//! has none (the event's id is then 0: nothing is written back), and the optional routing
//! value, trace context and header columns.
//!
//! An engine converts its native values to [`Value`] behind [`RowSource`]: bytes as
//! stored (bytea decoded, JSON rendered as text), `created_at` already rendered as ISO
//! 8601 text in the engine's way.

use bytes::Bytes;
use outboxd_connector::{headers_from_json, ConnectorError, OutboxEvent};

use crate::columns::{ColumnMap, Field};
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

/// An inserted row seen in the log, its columns found by `map`: `None` when rows carry
/// their status and this one's is not INIT (a row inserted in another status is not for
/// outboxd to publish).
pub fn event_from_insert(
    row: &impl RowSource,
    map: &ColumnMap,
    table: &str,
) -> Result<Option<OutboxEvent>, ConnectorError> {
    let read = Reader { row, table, map };
    if map.tracks_status() && read.text(Field::Status)?.as_deref() != Some(status::INIT) {
        return Ok(None);
    }
    read.event_or_rejected().map(Some)
}

/// A row read by SQL whose select list is [`crate::columns::claim_fields`] (`map` from
/// [`ColumnMap::in_select_order`]): the event the log path makes of the same row under
/// the same layout, routing, trace and header columns included, without a commit time.
pub fn event_from_select(
    row: &impl RowSource,
    map: &ColumnMap,
    table: &str,
) -> Result<OutboxEvent, ConnectorError> {
    Reader { row, table, map }.event_or_rejected()
}

/// The W3C trace context a trace column holds, as the `traceparent` and `tracestate`
/// headers: either a bare `traceparent` value, or lines of `name=value` (a Java properties
/// text, as Debezium's `tracingspancontext` column stores the span context; `#` lines are
/// comments). Other names are ignored; an empty or unreadable text gives no header.
pub fn trace_headers(text: &str) -> Vec<(String, Bytes)> {
    let text = text.trim();
    let bare = !text.is_empty() && !text.starts_with(['#', '!']) && !text.contains(['=', ':']);
    if bare && !text.contains(char::is_whitespace) {
        return vec![("traceparent".to_owned(), Bytes::from(text.to_owned()))];
    }
    let mut headers = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        let Some((name, value)) = line.split_once(['=', ':']) else {
            continue;
        };
        let name = name.trim().to_ascii_lowercase();
        let value = value.trim();
        if (name == "traceparent" || name == "tracestate")
            && !value.is_empty()
            && !headers.iter().any(|(n, _)| *n == name)
        {
            headers.push((name, Bytes::from(value.to_owned())));
        }
    }
    headers
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
    /// Where each field is in the row (the log's columns, or a select list's).
    map: &'a ColumnMap,
}

impl<R: RowSource> Reader<'_, R> {
    /// Whether the row has `field` (a column of the log, or of the select list).
    fn has(&self, field: Field) -> bool {
        self.map.get(field).is_some()
    }

    /// The row's id; 0 for a table without one (rows deleted by the application: nothing
    /// addresses them).
    fn id(&self) -> Result<i64, ConnectorError> {
        if self.has(Field::Id) {
            self.int(Field::Id)
        } else {
            Ok(0)
        }
    }

    /// The event, or, when only its id can be read, a rejected event with the reason.
    fn event_or_rejected(&self) -> Result<OutboxEvent, ConnectorError> {
        let id = self.id()?;
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
                table: 0,
                message_id: self
                    .text(Field::MessageId)
                    .ok()
                    .flatten()
                    .unwrap_or_default(),
                message_type: String::new(),
                key: Bytes::from(biz_key.clone()),
                biz_key,
                topic: None,
                routing: None,
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
        let headers = self.headers()?;
        Ok(OutboxEvent {
            id: self.id()?,
            table: 0,
            message_id: self.not_null(Field::MessageId)?,
            message_type: self.not_null(Field::MessageType)?,
            biz_key: self.not_null(Field::BizKey)?,
            key: self.bytes(Field::Key)?,
            topic: self.text(Field::Topic)?,
            routing: self.text(Field::Routing)?,
            payload: self.bytes(Field::Payload)?,
            headers,
            created_at: match self.has(Field::CreatedAt) {
                true => self.not_null(Field::CreatedAt)?,
                false => String::new(),
            },
            retry_count: self.counter(Field::RetryCount)?,
            max_retry_count: self.counter(Field::MaxRetryCount)?,
            commit_time: None,
            rejected: None,
        })
    }

    /// The record headers: the `headers` JSON object's, then the trace column's
    /// `traceparent`/`tracestate` and the header columns, each unless the row's JSON
    /// already has one of that name (the application's own choice wins).
    fn headers(&self) -> Result<Vec<(String, Bytes)>, ConnectorError> {
        let json = self.text(Field::Headers)?;
        let mut headers = row_headers(json.as_deref(), self.table);
        let map = self.map;
        let mut more = Vec::new();
        if let Some(trace) = self.text(Field::Trace)? {
            more.extend(trace_headers(&trace));
        }
        for (i, name) in map.header_names().iter().enumerate() {
            match self.row.value(Field::HeaderColumn(i))? {
                Value::Null => {}
                Value::Int(v) => more.push((name.clone(), Bytes::from(v.to_string()))),
                Value::Bytes(b) => more.push((name.clone(), b)),
            }
        }
        for (name, value) in more {
            if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(&name)) {
                headers.push((name, value));
            }
        }
        Ok(headers)
    }

    /// A retry counter; 0 where rows carry no status.
    fn counter(&self, field: Field) -> Result<i32, ConnectorError> {
        if self.has(field) {
            self.int32(field)
        } else {
            Ok(0)
        }
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
    use outboxd_connector::{ColumnNames, OutboxLayout, RowLifecycle};
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

    /// outboxd's own table, every column present.
    fn kept() -> ColumnMap {
        ColumnMap::resolve(|_| Some(0), &OutboxLayout::default(), "outbox", "x.sql").unwrap()
    }

    /// A claim's select list on outboxd's own table.
    fn selected() -> ColumnMap {
        let layout = OutboxLayout::default();
        ColumnMap::in_select_order(&crate::columns::claim_fields(&layout), &layout)
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
        let e = event_from_select(&row(), &selected(), "outbox").unwrap();
        assert_eq!((e.id, e.message_id.as_str()), (7, "m-7"));
        assert_eq!(e.topic, None);
        assert_eq!(e.headers, vec![("trace".to_owned(), Bytes::from("abc"))]);
        assert_eq!((e.retry_count, e.max_retry_count), (0, 10));
    }

    #[test]
    fn only_init_inserts_are_events() {
        assert!(event_from_insert(&row(), &kept(), "outbox")
            .unwrap()
            .is_some());
        let mut done = row();
        done.0.insert(Field::Status, text("SUCCESS"));
        assert!(event_from_insert(&done, &kept(), "outbox")
            .unwrap()
            .is_none());
    }

    #[test]
    fn bad_headers_are_dropped_bad_values_reject_the_row_bad_ids_are_errors() {
        let mut r = row();
        r.0.insert(Field::Headers, text("[1]"));
        assert!(event_from_select(&r, &selected(), "outbox")
            .unwrap()
            .headers
            .is_empty());
        r.0.insert(Field::MessageId, Value::Null);
        let e = event_from_select(&r, &selected(), "outbox").unwrap();
        assert_eq!((e.id, e.biz_key.as_str()), (7, "o-7"));
        assert_eq!(
            e.rejected.as_deref(),
            Some("cannot be published: outbox `outbox`: column `message_id` is NULL")
        );
        let mut r = row();
        r.0.insert(Field::RetryCount, Value::Int(i64::MAX));
        let e = event_from_insert(&r, &kept(), "outbox").unwrap().unwrap();
        assert!(e.rejected.unwrap().contains("out of range"));
        let mut r = row();
        r.0.insert(Field::BizKey, Value::Null);
        let e = event_from_insert(&r, &kept(), "outbox").unwrap().unwrap();
        assert_eq!(e.biz_key, "", "no key to hold back");
        assert!(e.rejected.unwrap().contains("`biz_key` is NULL"));
        // A row that cannot be addressed is a definite error.
        r.0.insert(Field::Id, Value::Null);
        let err = event_from_select(&r, &selected(), "outbox").unwrap_err();
        assert!(!err.is_transient());
        assert_eq!(err.message(), "outbox `outbox`: column `id` is NULL");
    }

    #[test]
    fn a_debezium_row_is_an_event_without_status_or_id() {
        let layout = OutboxLayout {
            rows: RowLifecycle::Deleted,
            key_column: "aggregateid".into(),
            columns: ColumnNames::debezium(),
            ..OutboxLayout::default()
        };
        let map = ColumnMap::resolve(|_| Some(0), &layout, "outbox", "x.sql").unwrap();
        let uuid = "8d6c9c0e-6f6a-4d0e-9d55-0c1f6a0e2b11";
        let row = Row(HashMap::from([
            (Field::MessageId, text(uuid)),
            (Field::MessageType, text("OrderCreated")),
            (Field::BizKey, text("42")),
            (Field::Key, text("42")),
            (Field::Payload, text(r#"{"id": 42}"#)),
            (Field::Routing, text("order")),
            (
                Field::Trace,
                text("#Thu Dec 03 20:00:00 UTC 2026\ntraceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\n"),
            ),
            (Field::HeaderColumn(0), text(uuid)),
        ]));
        let e = event_from_insert(&row, &map, "outbox").unwrap().unwrap();
        assert_eq!((e.id, e.message_id.as_str()), (0, uuid));
        assert_eq!(e.routing.as_deref(), Some("order"));
        assert_eq!(e.created_at, "");
        assert_eq!((e.retry_count, e.max_retry_count), (0, 0));
        assert_eq!(e.rejected, None);
        assert_eq!(
            e.headers,
            vec![
                (
                    "traceparent".to_owned(),
                    Bytes::from("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
                ),
                ("id".to_owned(), Bytes::from(uuid)),
            ]
        );
    }

    #[test]
    fn trace_context_from_a_bare_value_or_properties() {
        let bare = trace_headers("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        assert_eq!(bare[0].0, "traceparent");
        let props = trace_headers("traceparent=00-a-b-01\ntracestate=k=v\nuber-trace-id=x\n");
        assert_eq!(
            props,
            vec![
                ("traceparent".to_owned(), Bytes::from("00-a-b-01")),
                ("tracestate".to_owned(), Bytes::from("k=v")),
            ]
        );
        assert!(trace_headers("").is_empty());
        assert!(trace_headers("# only a comment\n").is_empty());
    }
}
