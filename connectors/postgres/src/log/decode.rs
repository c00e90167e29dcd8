//! Assembles committed outbox transactions from pgoutput messages: a pure state machine
//! (no I/O) over the decoded messages of [`crate::pgoutput`], tested on captured bytes.
//! Outbox inserts become events through the kit's row conversion
//! ([`outboxd_connector_kit::row`]).
//!
//! Each outbox table is known by the OID the server resolved its configured name to
//! ([`OutboxTable`]), not by a spelling of its name. The publication holds the outbox
//! tables only (`init` makes it so, `check` fails otherwise), so a Relation message for
//! any other table is a definite error: treating it as a transaction without outbox rows
//! would let the slot be confirmed past rows that may be an outbox's, and they would stay
//! INIT (or, deleted, be lost).

use bytes::Bytes;
use std::time::SystemTime;

use outboxd_connector::{
    CommittedTransaction, ConnectorError, OutboxEvent, OutboxLayout, TransactionPart, PART_BYTES,
    PART_EVENTS,
};

use super::position::Lsn;
use outboxd_connector_kit::{row, ColumnMap, Field, RowSource, Value};

use crate::outbox_table::OutboxTable;
use crate::pgoutput::{self, ColumnValue, PgOutputMessage, Relation};
use crate::schema::quote_ident;

const BYTEA_OID: u32 = 17;

/// The result of one pgoutput message, when there is something to say.
#[derive(Debug)]
pub(crate) enum Decoded {
    /// A committed transaction with outbox rows, ending at this LSN.
    Transaction(Lsn, CommittedTransaction),
    /// A committed transaction without outbox rows, ending at this LSN.
    Empty(Lsn),
    /// The next rows of a large transaction (its end follows).
    Part(TransactionPart),
}

/// Where each outbox column is in the relation's tuples, and which of key and payload
/// are `bytea` (sent in hex text form, decoded to raw bytes).
#[derive(Clone, Debug)]
struct OutboxColumns {
    map: ColumnMap,
    bytea: Vec<bool>,
}

impl OutboxColumns {
    fn new(rel: &Relation, table: &str, layout: &OutboxLayout) -> Result<Self, ConnectorError> {
        let map = ColumnMap::resolve(
            |name| rel.columns.iter().position(|c| c.name == name),
            layout,
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
    /// The outbox tables, in the layout's order: an event's `table` is the index here.
    outboxes: Vec<OutboxTable>,
    /// Named in the error about a table that is not an outbox.
    publication: String,
    /// The column names and whether rows carry their status.
    layout: OutboxLayout,
    /// Each outbox's columns (same index), once its Relation message arrived.
    columns: Vec<Option<OutboxColumns>>,
    txn: Option<OpenTransaction>,
}

struct OpenTransaction {
    /// The LSN of its commit record (from Begin): where it begins, for its parts.
    final_lsn: Lsn,
    commit_time: Option<SystemTime>,
    events: Vec<OutboxEvent>,
    /// [`OutboxEvent::size`] of `events`.
    bytes: usize,
    /// Parts yielded so far: the end may then be empty.
    parts: usize,
}

impl Decoder {
    /// A decoder of the inserts into `outboxes` (at least one, in the layout's order).
    pub(crate) fn new(
        outboxes: Vec<OutboxTable>,
        publication: &str,
        layout: &OutboxLayout,
    ) -> Self {
        Self {
            columns: vec![None; outboxes.len()],
            outboxes,
            publication: publication.to_owned(),
            layout: layout.clone(),
            txn: None,
        }
    }

    /// The index of the outbox table with relation OID `oid`.
    fn outbox_index(&self, oid: u32) -> Option<usize> {
        self.outboxes.iter().position(|t| t.oid == oid)
    }

    pub(crate) fn in_transaction(&self) -> bool {
        self.txn.is_some()
    }

    /// The outbox tables, for messages.
    fn table_name(&self) -> String {
        let names: Vec<String> = self.outboxes.iter().map(ToString::to_string).collect();
        names.join(", ")
    }

    pub(crate) fn handle(&mut self, data: &Bytes) -> Result<Option<Decoded>, ConnectorError> {
        let message = pgoutput::decode(data).map_err(|e| {
            ConnectorError::definite(format!(
                "cannot decode the replication stream of outbox `{}`",
                self.table_name()
            ))
            .with_source(e)
        })?;
        match message {
            PgOutputMessage::Begin(begin) => {
                self.txn = Some(OpenTransaction {
                    final_lsn: begin.final_lsn,
                    commit_time: pgoutput::pg_timestamp(begin.commit_ts),
                    events: Vec::new(),
                    bytes: 0,
                    parts: 0,
                });
            }
            PgOutputMessage::Relation(rel) => {
                let Some(index) = self.outbox_index(rel.oid) else {
                    return Err(self.not_the_outbox(&rel));
                };
                let name = self.outboxes[index].to_string();
                self.columns[index] = Some(OutboxColumns::new(&rel, &name, &self.layout)?);
            }
            PgOutputMessage::Insert(insert) => {
                let index = self.outbox_index(insert.relation_oid);
                let Some((index, columns)) =
                    index.and_then(|i| Some((i, self.columns[i].as_ref()?)))
                else {
                    return Err(ConnectorError::definite(format!(
                        "replication stream: insert into relation OID {} before its Relation \
                         message (the outbox tables are {})",
                        insert.relation_oid,
                        self.outboxes
                            .iter()
                            .map(|t| format!("`{t}` OID {}", t.oid))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                };
                let name = self.outboxes[index].to_string();
                let mut event = to_event(&insert.tuple, columns, &name)?;
                if let Some(event) = &mut event {
                    // The layout's tables number at most u16::MAX (config).
                    event.table = u16::try_from(index).unwrap_or(u16::MAX);
                }
                let txn = self.txn.as_mut().ok_or_else(|| {
                    ConnectorError::definite("replication stream: insert outside a transaction")
                })?;
                if let Some(mut event) = event {
                    event.commit_time = txn.commit_time;
                    txn.bytes += event.size();
                    txn.events.push(event);
                    if txn.events.len() >= PART_EVENTS || txn.bytes >= PART_BYTES {
                        // A large transaction: hand its rows over as they come.
                        txn.parts += 1;
                        txn.bytes = 0;
                        return Ok(Some(Decoded::Part(TransactionPart {
                            begin_position: txn.final_lsn.position(),
                            commit_time: txn.commit_time,
                            events: std::mem::take(&mut txn.events),
                        })));
                    }
                }
            }
            PgOutputMessage::Commit(commit) => {
                let txn = self.txn.take().ok_or_else(|| {
                    ConnectorError::definite("replication stream: commit without begin")
                })?;
                if txn.events.is_empty() && txn.parts == 0 {
                    return Ok(Some(Decoded::Empty(commit.end_lsn)));
                }
                return Ok(Some(Decoded::Transaction(
                    commit.end_lsn,
                    CommittedTransaction {
                        commit_position: commit.end_lsn.position(),
                        commit_time: pgoutput::pg_timestamp(commit.commit_ts),
                        events: txn.events,
                    },
                )));
            }
            PgOutputMessage::Skipped(_) => {}
        }
        Ok(None)
    }

    /// The publication streams `rel`, which is not an outbox: say which, and the fix.
    fn not_the_outbox(&self, rel: &Relation) -> ConnectorError {
        let publication = &self.publication;
        let table = format!("{}.{}", rel.namespace, rel.name);
        let same_name = self
            .outboxes
            .iter()
            .find(|o| rel.namespace == o.schema && rel.name == o.name);
        let why = if let Some(outbox) = same_name {
            // A table of that name with another OID: written before the outbox was
            // dropped and created again. Its rows are not in today's table.
            format!(
                "the outbox `{outbox}` is OID {} now, the log holds inserts into an earlier \
                 table of that name (OID {}); if the outbox was dropped and created again, run \
                 `outboxd recover --config <file>` to start the slot anew and publish its INIT \
                 rows",
                outbox.oid, rel.oid
            )
        } else {
            let oids: Vec<String> = self
                .outboxes
                .iter()
                .map(|o| format!("`{o}` (OID {})", o.oid))
                .collect();
            let published: Vec<String> = self
                .outboxes
                .iter()
                .map(|o| format!("{}.{}", quote_ident(&o.schema), quote_ident(&o.name)))
                .collect();
            format!(
                "outboxd reads only the outbox table(s) {} (the tables the server finds by \
                 outbox.table or outbox.tables, through the role's search_path when \
                 unqualified); if `{table}` is your outbox, set outbox.table to `{table}` (or \
                 add it to outbox.tables), otherwise make the publication publish the outbox \
                 tables alone: ALTER PUBLICATION {} SET TABLE {}",
                oids.join(", "),
                quote_ident(publication),
                published.join(", ")
            )
        };
        ConnectorError::definite(format!(
            "publication `{publication}` streams inserts into table `{table}` (OID {}), which \
             is not an outbox table; stopping before its transaction is confirmed: {why}",
            rel.oid
        ))
    }
}

/// One outbox insert as an event; `None` when its status is not INIT (inserted already
/// handled, nothing to publish).
fn to_event(
    tuple: &[ColumnValue],
    c: &OutboxColumns,
    table: &str,
) -> Result<Option<OutboxEvent>, ConnectorError> {
    row::event_from_insert(&Tuple { tuple, c, table }, &c.map, table)
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

    const INSERT_TX: &str = include_str!("testdata/pgoutput_insert_tx.hex");

    /// The captured outbox, with the OID its Relation message carries.
    fn fixture_outbox() -> OutboxTable {
        let oid = fixture(INSERT_TX)
            .iter()
            .find_map(|m| match pgoutput::decode(m) {
                Ok(PgOutputMessage::Relation(rel)) => Some(rel.oid),
                _ => None,
            })
            .unwrap();
        OutboxTable {
            oid,
            schema: "public".into(),
            name: "fixture_outbox".into(),
        }
    }

    /// What `decoder` makes of the captured transaction, up to the first error.
    fn decode_all(decoder: &mut Decoder) -> (Vec<Decoded>, Option<ConnectorError>) {
        let mut out = Vec::new();
        for msg in fixture(INSERT_TX) {
            match decoder.handle(&msg) {
                Ok(Some(d)) => out.push(d),
                Ok(None) => {}
                Err(e) => return (out, Some(e)),
            }
        }
        (out, None)
    }

    #[test]
    fn assembles_a_captured_transaction() {
        let mut decoder = Decoder::new(
            vec![fixture_outbox()],
            "fixture_pub",
            &OutboxLayout::default(),
        );
        let (out, err) = decode_all(&mut decoder);
        assert!(err.is_none(), "{err:?}");
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
    }

    #[test]
    fn relation_that_is_not_the_outbox_is_a_definite_error() {
        // The outbox resolved to another table (e.g. `app.outbox` through search_path):
        // the captured inserts must stop the stream, never pass as an empty commit.
        let outbox = OutboxTable {
            oid: fixture_outbox().oid + 1,
            schema: "app".into(),
            name: "outbox".into(),
        };
        let mut decoder = Decoder::new(vec![outbox], "fixture_pub", &OutboxLayout::default());
        let (out, err) = decode_all(&mut decoder);
        assert!(out.is_empty(), "nothing before the error: {out:?}");
        let err = err.expect("an error");
        assert!(!err.is_transient());
        let message = err.message();
        for part in [
            "publication `fixture_pub`",
            "`public.fixture_outbox`",
            "`app.outbox`",
            "ALTER PUBLICATION \"fixture_pub\" SET TABLE \"app\".\"outbox\"",
            "set outbox.table to `public.fixture_outbox`",
        ] {
            assert!(message.contains(part), "`{part}` missing: {err}");
        }
    }

    #[test]
    fn outbox_name_with_another_oid_is_a_definite_error_naming_recover() {
        // Inserts logged before the outbox was dropped and created again.
        let outbox = OutboxTable {
            oid: fixture_outbox().oid + 1,
            ..fixture_outbox()
        };
        let mut decoder = Decoder::new(vec![outbox], "fixture_pub", &OutboxLayout::default());
        let (out, err) = decode_all(&mut decoder);
        assert!(out.is_empty(), "{out:?}");
        let err = err.expect("an error");
        assert!(!err.is_transient());
        assert!(err.message().contains("outboxd recover"), "{err}");
    }

    #[test]
    fn missing_column_names_column_and_table() {
        let layout = OutboxLayout {
            key_column: "no_such_column".into(),
            ..OutboxLayout::default()
        };
        let mut decoder = Decoder::new(vec![fixture_outbox()], "fixture_pub", &layout);
        let err = decode_all(&mut decoder).1.unwrap();
        assert!(!err.is_transient());
        assert!(err.message().contains("`no_such_column`"), "{err}");
        assert!(err.message().contains("`public.fixture_outbox`"), "{err}");
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
