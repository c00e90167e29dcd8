//! Assembles committed outbox transactions from pgoutput messages: a pure state machine
//! (no I/O) over the decoded messages of [`crate::pgoutput`], tested on captured bytes.
//! Outbox inserts become events through the kit's row conversion
//! ([`outboxd_connector_kit::row`]); inserts into other tables are dropped before their
//! tuples are decoded.

use std::collections::HashMap;

use bytes::Bytes;
use outboxd_connector::{CommittedTransaction, ConnectorError, OutboxEvent};

use super::position::Lsn;
use outboxd_connector_kit::{row, ColumnMap, Field, RowSource, Value};

use crate::pgoutput::{self, ColumnValue, PgOutputMessage, Relation};

const BYTEA_OID: u32 = 17;

/// The result of one pgoutput message, when there is something to say.
#[derive(Debug)]
pub(crate) enum Decoded {
    /// A committed transaction with outbox rows, ending at this LSN.
    Transaction(Lsn, CommittedTransaction),
    /// A committed transaction without outbox rows, ending at this LSN.
    Empty(Lsn),
}

/// Where each outbox column is in the relation's tuples, and which of key and payload
/// are `bytea` (sent in hex text form, decoded to raw bytes).
#[derive(Clone, Debug)]
struct OutboxColumns {
    map: ColumnMap,
    bytea: Vec<bool>,
}

impl OutboxColumns {
    fn new(rel: &Relation, table: &str, key_column: &str) -> Result<Self, ConnectorError> {
        let map = ColumnMap::resolve(
            |name| rel.columns.iter().position(|c| c.name == name),
            key_column,
            table,
            "schemas/postgres/outbox.sql",
        )?;
        let bytea = rel
            .columns
            .iter()
            .map(|c| c.type_oid == BYTEA_OID)
            .collect();
        Ok(Self { map, bytea })
    }
}

/// Assembles committed outbox transactions from pgoutput messages. Pure state machine
/// (no I/O), so it is tested on captured bytes.
pub(crate) struct Decoder {
    schema: String,
    table: String,
    key_column: String,
    /// Relation OID → its outbox columns, or `None` for a table that is not the outbox.
    relations: HashMap<u32, Option<OutboxColumns>>,
    txn: Option<OpenTransaction>,
}

struct OpenTransaction {
    events: Vec<OutboxEvent>,
}

impl Decoder {
    pub(crate) fn new(outbox_table: &str, key_column: &str) -> Self {
        // As SQL reads names: quoted ones keep their case, bare ones fold to lower case.
        let unquote = |s: &str| {
            let s = s.trim();
            match s.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
                Some(quoted) => quoted.replace("\"\"", "\""),
                None => s.to_lowercase(),
            }
        };
        let (schema, table) = match outbox_table.split_once('.') {
            Some((schema, table)) => (unquote(schema), unquote(table)),
            None => ("public".to_owned(), unquote(outbox_table)),
        };
        Self {
            schema,
            table,
            key_column: key_column.to_owned(),
            relations: HashMap::new(),
            txn: None,
        }
    }

    pub(crate) fn in_transaction(&self) -> bool {
        self.txn.is_some()
    }

    fn table_name(&self) -> String {
        format!("{}.{}", self.schema, self.table)
    }

    pub(crate) fn handle(&mut self, data: &Bytes) -> Result<Option<Decoded>, ConnectorError> {
        // Inserts into other tables are dropped before decoding their tuples.
        if let [b'I', a, b, c, d, ..] = data[..] {
            if let Some(None) = self.relations.get(&u32::from_be_bytes([a, b, c, d])) {
                return Ok(None);
            }
        }
        let message = pgoutput::decode(data).map_err(|e| {
            ConnectorError::definite(format!(
                "cannot decode the replication stream of outbox `{}`",
                self.table_name()
            ))
            .with_source(e)
        })?;
        match message {
            PgOutputMessage::Begin(_) => {
                self.txn = Some(OpenTransaction { events: Vec::new() });
            }
            PgOutputMessage::Relation(rel) => {
                let columns = if rel.namespace == self.schema && rel.name == self.table {
                    Some(OutboxColumns::new(
                        &rel,
                        &self.table_name(),
                        &self.key_column,
                    )?)
                } else {
                    None
                };
                self.relations.insert(rel.oid, columns);
            }
            PgOutputMessage::Insert(insert) => {
                let columns = match self.relations.get(&insert.relation_oid) {
                    Some(Some(columns)) => columns,
                    Some(None) => return Ok(None),
                    None => {
                        return Err(ConnectorError::definite(format!(
                            "replication stream: insert into relation OID {} before its \
                             Relation message",
                            insert.relation_oid
                        )))
                    }
                };
                let event = to_event(&insert.tuple, columns, &self.table_name())?;
                let txn = self.txn.as_mut().ok_or_else(|| {
                    ConnectorError::definite("replication stream: insert outside a transaction")
                })?;
                if let Some(event) = event {
                    txn.events.push(event);
                }
            }
            PgOutputMessage::Commit(commit) => {
                let txn = self.txn.take().ok_or_else(|| {
                    ConnectorError::definite("replication stream: commit without begin")
                })?;
                if txn.events.is_empty() {
                    return Ok(Some(Decoded::Empty(commit.end_lsn)));
                }
                let commit_time = pgoutput::pg_timestamp(commit.commit_ts);
                let mut events = txn.events;
                for event in &mut events {
                    event.commit_time = commit_time;
                }
                return Ok(Some(Decoded::Transaction(
                    commit.end_lsn,
                    CommittedTransaction {
                        commit_position: commit.end_lsn.position(),
                        commit_time,
                        events,
                    },
                )));
            }
            PgOutputMessage::Skipped(_) => {}
        }
        Ok(None)
    }
}

/// One outbox insert as an event; `None` when its status is not INIT (inserted already
/// handled, nothing to publish).
fn to_event(
    tuple: &[ColumnValue],
    c: &OutboxColumns,
    table: &str,
) -> Result<Option<OutboxEvent>, ConnectorError> {
    row::event_from_insert(&Tuple { tuple, c, table }, table)
}

/// One pgoutput tuple as the kit's row conversion reads it.
struct Tuple<'a> {
    tuple: &'a [ColumnValue],
    c: &'a OutboxColumns,
    table: &'a str,
}

impl RowSource for Tuple<'_> {
    fn value(&self, field: Field) -> Result<Value, ConnectorError> {
        let table = self.table;
        let Some(i) = self.c.map.get(field) else {
            return Ok(Value::Null);
        };
        let bytes = match self.tuple.get(i) {
            Some(ColumnValue::Text(b)) => b,
            Some(ColumnValue::Null) => return Ok(Value::Null),
            Some(other) => {
                return Err(ConnectorError::definite(format!(
                    "outbox `{table}`: unexpected column value {other:?} in an insert"
                )))
            }
            None => {
                return Err(ConnectorError::definite(format!(
                    "outbox `{table}`: insert has {} columns, its relation more",
                    self.tuple.len()
                )))
            }
        };
        let bytea = matches!(field, Field::Key | Field::Payload)
            && self.c.bytea.get(i).copied().unwrap_or(false);
        if bytea {
            return decode_bytea_hex(bytes).map(Value::Bytes).ok_or_else(|| {
                ConnectorError::definite(format!(
                    "outbox `{table}`: column `{}` is not bytea in hex form",
                    field.label()
                ))
            });
        }
        if field == Field::CreatedAt {
            let text = String::from_utf8_lossy(bytes);
            return Ok(Value::Bytes(Bytes::from(iso8601(&text))));
        }
        Ok(Value::Bytes(bytes.clone()))
    }
}

/// `2026-05-09 07:30:00.123+00` (DateStyle ISO) → `2026-05-09T07:30:00.123+00`.
pub(crate) fn iso8601(text: &str) -> String {
    match text.split_once(' ') {
        Some((date, time)) if date.len() == 10 => format!("{date}T{time}"),
        _ => text.to_owned(),
    }
}

/// bytea's text output in hex form: `\x` then two hex digits a byte.
fn decode_bytea_hex(text: &[u8]) -> Option<Bytes> {
    let hex = text.strip_prefix(b"\\x")?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    hex.chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect::<Option<Vec<u8>>>()
        .map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::pgoutput::fixture;

    #[test]
    fn assembles_a_captured_transaction() {
        let mut decoder = Decoder::new("public.fixture_outbox", "biz_key");
        let mut out = Vec::new();
        for msg in fixture(include_str!("testdata/pgoutput_insert_tx.hex")) {
            if let Some(d) = decoder.handle(&msg).unwrap() {
                out.push(d);
            }
        }
        assert!(!decoder.in_transaction());
        let [Decoded::Transaction(_, txn)] = &out[..] else {
            panic!("{out:?}")
        };
        assert!(txn.commit_time.is_some());
        assert_eq!(txn.events.len(), 2);
        let e = &txn.events[0];
        assert_eq!(e.message_id, "m-1");
        assert_eq!(e.message_type, "order.created");
        assert_eq!(e.biz_key, "order-42");
        assert_eq!(&e.key[..], b"order-42");
        assert_eq!(e.topic, None);
        assert_eq!(&e.payload[..], br#"{"total": 12.5}"#);
        assert_eq!(
            e.headers,
            vec![("trace".to_owned(), Bytes::from_static(b"abc"))]
        );
        assert_eq!(e.retry_count, 0);
        assert_eq!(e.max_retry_count, 10);
        assert!(e.created_at.contains('T'), "{}", e.created_at);
        assert_eq!(e.commit_time, txn.commit_time);
        assert_eq!(txn.events[1].topic.as_deref(), Some("orders.special"));
        assert!(txn.events[1].id > e.id);

        // Another table name: the same bytes yield only an empty commit.
        let mut other = Decoder::new("outbox", "biz_key");
        let out: Vec<_> = fixture(include_str!("testdata/pgoutput_insert_tx.hex"))
            .iter()
            .filter_map(|m| other.handle(m).unwrap())
            .collect();
        assert!(matches!(out[..], [Decoded::Empty(_)]), "{out:?}");
    }

    #[test]
    fn missing_column_names_column_and_table() {
        let mut decoder = Decoder::new("public.fixture_outbox", "no_such_column");
        let err = fixture(include_str!("testdata/pgoutput_insert_tx.hex"))
            .iter()
            .map(|m| decoder.handle(m))
            .find_map(Result::err)
            .unwrap();
        assert!(!err.is_transient());
        assert!(err.message().contains("`no_such_column`"), "{err}");
        assert!(err.message().contains("`public.fixture_outbox`"), "{err}");
    }

    #[test]
    fn outbox_names_fold_like_sql() {
        let d = Decoder::new("Outbox", "biz_key");
        assert_eq!((d.schema.as_str(), d.table.as_str()), ("public", "outbox"));
        let d = Decoder::new("\"App\".\"Out\"\"box\"", "biz_key");
        assert_eq!((d.schema.as_str(), d.table.as_str()), ("App", "Out\"box"));
        let d = Decoder::new("app.outbox", "biz_key");
        assert_eq!((d.schema.as_str(), d.table.as_str()), ("app", "outbox"));
    }

    #[test]
    fn bytea_hex() {
        assert_eq!(
            decode_bytea_hex(b"\\x00ff10").unwrap(),
            Bytes::from_static(&[0, 255, 16])
        );
        assert_eq!(decode_bytea_hex(b"\\x").unwrap(), Bytes::new());
        assert!(decode_bytea_hex(b"\\x0").is_none());
        assert!(decode_bytea_hex(b"\\xzz").is_none());
        assert!(decode_bytea_hex(b"00").is_none());
    }

    #[test]
    fn iso8601_form() {
        assert_eq!(
            iso8601("2026-05-09 07:30:00.123+00"),
            "2026-05-09T07:30:00.123+00"
        );
        assert_eq!(iso8601("infinity"), "infinity");
    }
}
