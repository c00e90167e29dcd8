//! A decoder of pgoutput (logical replication protocol version 1) messages.
//!
//! Pure functions over bytes: [`decode`] takes the payload of one XLogData message and
//! returns a typed [`PgOutputMessage`], or a [`DecodeError`] for bytes that do not follow
//! the protocol. It never panics, whatever the input (see the truncation tests).
//!
//! Only what outboxd needs is decoded in full (Begin, Commit, Relation, Insert); the other
//! messages of protocol version 1 (Origin, Type, Update, Delete, Truncate, Message) are
//! recognised and skipped without looking inside them.
//!
//! Reference: <https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html>

use std::time::{Duration, SystemTime};

use super::position::Lsn;
use bytes::Bytes;

/// A pgoutput message that could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed pgoutput message: {0}")]
pub struct DecodeError(String);

impl DecodeError {
    fn new(what: impl Into<String>) -> Self {
        Self(what.into())
    }
}

/// `B`: the start of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Begin {
    /// The LSN of the transaction's commit record.
    pub final_lsn: Lsn,
    /// Commit timestamp, microseconds since 2000-01-01 (see [`pg_timestamp`]).
    pub commit_ts: i64,
    /// Transaction id.
    pub xid: u32,
}

/// `C`: the end of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commit {
    /// Flags (unused, 0).
    pub flags: u8,
    /// The LSN of the commit record.
    pub commit_lsn: Lsn,
    /// The LSN just past the commit record: the position to confirm.
    pub end_lsn: Lsn,
    /// Commit timestamp, microseconds since 2000-01-01 (see [`pg_timestamp`]).
    pub commit_ts: i64,
}

/// One column of a [`Relation`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelationColumn {
    /// Flags: 1 when the column is part of the replica identity key.
    pub flags: u8,
    /// Column name.
    pub name: String,
    /// Type OID (e.g. 25 text, 17 bytea, 3802 jsonb).
    pub type_oid: u32,
    /// Type modifier (`atttypmod`).
    pub type_modifier: i32,
}

/// `R`: the description of a table, sent before the first change to it in a session and
/// again after its definition changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relation {
    /// Table OID; later changes refer to the table by it.
    pub oid: u32,
    /// Schema name (`pg_catalog` is sent as an empty string).
    pub namespace: String,
    /// Table name.
    pub name: String,
    /// Replica identity setting (`d`efault, `n`othing, `f`ull, `i`ndex).
    pub replica_identity: u8,
    /// Columns, in table order (dropped and generated columns are not sent).
    pub columns: Vec<RelationColumn>,
}

/// The value of one column in a [`TupleData`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColumnValue {
    /// `n`: SQL NULL.
    Null,
    /// `u`: an unchanged TOASTed value (updates only); the value is not sent.
    UnchangedToast,
    /// `t`: the value in its text output form.
    Text(Bytes),
    /// `b`: the value in binary form (only with the `binary` option).
    Binary(Bytes),
}

/// A row as sent by pgoutput: one value per column of the [`Relation`].
pub type TupleData = Vec<ColumnValue>;

/// `I`: a row inserted into a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Insert {
    /// The OID of the [`Relation`] the row belongs to.
    pub relation_oid: u32,
    /// The new row.
    pub tuple: TupleData,
}

/// One decoded pgoutput message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PgOutputMessage {
    /// `B`
    Begin(Begin),
    /// `C`
    Commit(Commit),
    /// `R`
    Relation(Relation),
    /// `I`
    Insert(Insert),
    /// A message of protocol version 1 that outboxd does not use: `O`rigin, t`Y`pe,
    /// `U`pdate, `D`elete, `T`runcate or logical decoding `M`essage. Holds the tag.
    Skipped(u8),
}

/// Decodes the payload of one XLogData message.
pub fn decode(data: &Bytes) -> Result<PgOutputMessage, DecodeError> {
    let mut r = Reader { buf: data, pos: 0 };
    let tag = r.u8("message tag")?;
    let message = match tag {
        b'B' => PgOutputMessage::Begin(Begin {
            final_lsn: Lsn(r.u64("Begin final LSN")?),
            commit_ts: r.i64("Begin commit timestamp")?,
            xid: r.u32("Begin xid")?,
        }),
        b'C' => PgOutputMessage::Commit(Commit {
            flags: r.u8("Commit flags")?,
            commit_lsn: Lsn(r.u64("Commit LSN")?),
            end_lsn: Lsn(r.u64("Commit end LSN")?),
            commit_ts: r.i64("Commit timestamp")?,
        }),
        b'R' => PgOutputMessage::Relation(relation(&mut r)?),
        b'I' => {
            let relation_oid = r.u32("Insert relation OID")?;
            let marker = r.u8("Insert tuple marker")?;
            if marker != b'N' {
                return Err(DecodeError::new(format!(
                    "Insert: expected tuple marker `N`, found byte {marker}"
                )));
            }
            PgOutputMessage::Insert(Insert {
                relation_oid,
                tuple: tuple_data(&mut r)?,
            })
        }
        b'O' | b'Y' | b'U' | b'D' | b'T' | b'M' => return Ok(PgOutputMessage::Skipped(tag)),
        other => {
            return Err(DecodeError::new(format!(
                "unknown message tag {other} ({:?}) for protocol version 1",
                char::from(other)
            )))
        }
    };
    if r.pos != data.len() {
        return Err(DecodeError::new(format!(
            "{} trailing bytes after a `{}` message",
            data.len() - r.pos,
            char::from(tag)
        )));
    }
    Ok(message)
}

fn relation(r: &mut Reader<'_>) -> Result<Relation, DecodeError> {
    let oid = r.u32("Relation OID")?;
    let namespace = r.cstr("Relation namespace")?;
    let name = r.cstr("Relation name")?;
    let replica_identity = r.u8("Relation replica identity")?;
    let count = r.u16("Relation column count")?;
    // Each column takes at least 10 bytes; do not trust the count for the allocation.
    let mut columns = Vec::with_capacity(usize::from(count).min(r.remaining() / 10));
    for _ in 0..count {
        columns.push(RelationColumn {
            flags: r.u8("Relation column flags")?,
            name: r.cstr("Relation column name")?,
            type_oid: r.u32("Relation column type OID")?,
            type_modifier: r.i32("Relation column type modifier")?,
        });
    }
    Ok(Relation {
        oid,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

fn tuple_data(r: &mut Reader<'_>) -> Result<TupleData, DecodeError> {
    let count = r.u16("TupleData column count")?;
    let mut values = Vec::with_capacity(usize::from(count).min(r.remaining()));
    for _ in 0..count {
        let value = match r.u8("TupleData column kind")? {
            b'n' => ColumnValue::Null,
            b'u' => ColumnValue::UnchangedToast,
            b't' => ColumnValue::Text(r.counted("TupleData text value")?),
            b'b' => ColumnValue::Binary(r.counted("TupleData binary value")?),
            other => {
                return Err(DecodeError::new(format!(
                    "unknown TupleData column kind byte {other}"
                )))
            }
        };
        values.push(value);
    }
    Ok(values)
}

/// Converts a PostgreSQL timestamp (microseconds since 2000-01-01 00:00:00 UTC) to a
/// [`SystemTime`]; `None` when it is out of range (e.g. infinity).
pub fn pg_timestamp(micros: i64) -> Option<SystemTime> {
    let epoch = SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(PG_EPOCH_UNIX_SECS))?;
    if micros >= 0 {
        epoch.checked_add(Duration::from_micros(micros.unsigned_abs()))
    } else {
        epoch.checked_sub(Duration::from_micros(micros.unsigned_abs()))
    }
}

/// Seconds from 1970-01-01 to 2000-01-01.
pub(crate) const PG_EPOCH_UNIX_SECS: u64 = 946_684_800;

/// A cursor over a message; every read checks the length first.
struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
}

impl Reader<'_> {
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|end| *end <= self.buf.len())
            .ok_or_else(|| {
                DecodeError::new(format!(
                    "{what}: needs {n} bytes, {} left (truncated message)",
                    self.remaining()
                ))
            })?;
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &str) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    fn i32(&mut self, what: &str) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    fn i64(&mut self, what: &str) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array(what)?))
    }

    /// A NUL-terminated UTF-8 string.
    fn cstr(&mut self, what: &str) -> Result<String, DecodeError> {
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        let len = rest
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| DecodeError::new(format!("{what}: missing NUL terminator")))?;
        let s = std::str::from_utf8(&rest[..len])
            .map_err(|_| DecodeError::new(format!("{what}: not valid UTF-8")))?
            .to_owned();
        self.pos += len + 1;
        Ok(s)
    }

    /// An Int32 length followed by that many bytes, shared with the input (no copy).
    fn counted(&mut self, what: &str) -> Result<Bytes, DecodeError> {
        let len = self.i32(what)?;
        let len = usize::try_from(len)
            .map_err(|_| DecodeError::new(format!("{what}: negative length {len}")))?;
        let start = self.pos;
        self.take(len, what)?;
        Ok(self.buf.slice(start..self.pos))
    }
}

/// Parses a fixture file: one message per line, hex, `#` comments (for the unit tests of
/// this decoder and of `log::decode`).
#[cfg(test)]
pub(crate) fn fixture(text: &str) -> Vec<Bytes> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let hex = l.split_whitespace().last().unwrap_or_default();
            let bytes: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            Bytes::from(bytes)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(v: &ColumnValue) -> &str {
        match v {
            ColumnValue::Text(b) => std::str::from_utf8(b).unwrap(),
            other => panic!("expected text, got {other:?}"),
        }
    }

    #[test]
    fn decodes_captured_transaction() {
        let messages = fixture(include_str!("testdata/pgoutput_insert_tx.hex"));
        let decoded: Vec<_> = messages.iter().map(|m| decode(m).unwrap()).collect();
        let PgOutputMessage::Begin(begin) = &decoded[0] else {
            panic!("{:?}", decoded[0])
        };
        let PgOutputMessage::Commit(commit) = decoded.last().unwrap() else {
            panic!()
        };
        assert_eq!(begin.final_lsn, commit.commit_lsn);
        assert_eq!(begin.commit_ts, commit.commit_ts);
        assert!(commit.end_lsn > commit.commit_lsn);
        let ts = pg_timestamp(commit.commit_ts).unwrap();
        // Captured in 2026; anything after 2020 proves the epoch arithmetic.
        assert!(ts > SystemTime::UNIX_EPOCH + Duration::from_secs(1_577_836_800));

        let PgOutputMessage::Relation(rel) = &decoded[1] else {
            panic!("{:?}", decoded[1])
        };
        assert_eq!(rel.namespace, "public");
        assert_eq!(rel.name, "fixture_outbox");
        let names: Vec<_> = rel.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            &names[..6],
            [
                "id",
                "message_id",
                "message_type",
                "biz_key",
                "topic",
                "payload"
            ]
        );
        assert_eq!(rel.columns[0].flags, 1, "id is the replica identity key");
        assert_eq!(rel.columns[0].type_oid, 20); // bigint
        assert_eq!(rel.columns[5].type_oid, 3802); // jsonb

        let inserts: Vec<_> = decoded
            .iter()
            .filter_map(|m| match m {
                PgOutputMessage::Insert(i) => Some(i),
                _ => None,
            })
            .collect();
        assert_eq!(inserts.len(), 2);
        let first = inserts[0];
        assert_eq!(first.relation_oid, rel.oid);
        assert_eq!(first.tuple.len(), rel.columns.len());
        assert_eq!(text(&first.tuple[1]), "m-1");
        assert_eq!(text(&first.tuple[2]), "order.created");
        assert_eq!(text(&first.tuple[3]), "order-42");
        assert_eq!(first.tuple[4], ColumnValue::Null);
        assert_eq!(text(&first.tuple[5]), r#"{"total": 12.5}"#);
        assert_eq!(text(&first.tuple[6]), r#"{"trace": "abc"}"#);
        assert_eq!(text(&inserts[1].tuple[4]), "orders.special");
    }

    #[test]
    fn skips_other_messages_of_protocol_1() {
        // Captured: an UPDATE, a DELETE and a TRUNCATE of a table in the publication, and
        // a logical decoding message (pg_logical_emit_message).
        let messages = fixture(include_str!("testdata/pgoutput_other.hex"));
        let tags: Vec<_> = messages
            .iter()
            .filter_map(|m| match decode(m).unwrap() {
                PgOutputMessage::Skipped(tag) => Some(tag),
                _ => None,
            })
            .collect();
        for tag in [b'U', b'D', b'T'] {
            assert!(tags.contains(&tag), "no `{}` in {tags:?}", char::from(tag));
        }
        for tag in [b'O', b'Y', b'M'] {
            let msg = Bytes::from(vec![tag, 0, 0]);
            assert_eq!(decode(&msg).unwrap(), PgOutputMessage::Skipped(tag));
        }
    }

    #[test]
    fn decodes_every_column_kind() {
        let mut msg = vec![b'I', 0, 0, 0x40, 0x01, b'N', 0, 4];
        msg.push(b'n');
        msg.push(b'u');
        msg.extend_from_slice(&[b't', 0, 0, 0, 2, b'h', b'i']);
        msg.extend_from_slice(&[b'b', 0, 0, 0, 1, 0xff]);
        let PgOutputMessage::Insert(insert) = decode(&Bytes::from(msg)).unwrap() else {
            panic!()
        };
        assert_eq!(insert.relation_oid, 0x4001);
        assert_eq!(
            insert.tuple,
            vec![
                ColumnValue::Null,
                ColumnValue::UnchangedToast,
                ColumnValue::Text(Bytes::from_static(b"hi")),
                ColumnValue::Binary(Bytes::from_static(&[0xff])),
            ]
        );
    }

    #[test]
    fn every_truncation_of_captured_messages_is_an_error_not_a_panic() {
        let mut all = fixture(include_str!("testdata/pgoutput_insert_tx.hex"));
        all.extend(fixture(include_str!("testdata/pgoutput_other.hex")));
        for msg in &all {
            let full = decode(msg);
            assert!(full.is_ok());
            if matches!(full, Ok(PgOutputMessage::Skipped(_))) {
                continue; // skipped messages are not parsed, so truncation is invisible
            }
            for len in 0..msg.len() {
                assert!(
                    decode(&msg.slice(..len)).is_err(),
                    "prefix of {len} bytes decoded"
                );
            }
            let mut longer = msg.to_vec();
            longer.push(0);
            assert!(
                decode(&Bytes::from(longer)).is_err(),
                "trailing byte accepted"
            );
        }
    }

    #[test]
    fn corrupted_bytes_never_panic() {
        // A deterministic mutation sweep (xorshift), a cheap stand-in for `cargo fuzz`.
        let all = fixture(include_str!("testdata/pgoutput_insert_tx.hex"));
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for msg in &all {
            for _ in 0..2000 {
                let mut bytes = msg.to_vec();
                for _ in 0..=(next() % 4) {
                    let i = (next() as usize) % bytes.len();
                    bytes[i] = next() as u8;
                }
                let cut = (next() as usize) % (bytes.len() + 1);
                let _ = decode(&Bytes::from(bytes[..cut].to_vec()));
            }
        }
        // Hostile lengths: a huge column count and a negative value length.
        assert!(decode(&Bytes::from_static(&[b'I', 0, 0, 0, 1, b'N', 0xff, 0xff])).is_err());
        let neg: &[u8] = &[b'I', 0, 0, 0, 1, b'N', 0, 1, b't', 0xff, 0xff, 0xff, 0xff];
        assert!(decode(&Bytes::from_static(neg)).is_err());
        assert!(decode(&Bytes::from_static(&[b'R', 0, 0, 0, 1, b'x'])).is_err());
        assert!(decode(&Bytes::from_static(b"Zzz")).is_err());
        assert!(decode(&Bytes::new()).is_err());
    }

    #[test]
    fn timestamps_convert_from_the_2000_epoch() {
        assert_eq!(
            pg_timestamp(0),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(PG_EPOCH_UNIX_SECS))
        );
        assert_eq!(
            pg_timestamp(-1_000_000),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(PG_EPOCH_UNIX_SECS - 1))
        );
        let _ = pg_timestamp(i64::MAX);
        let _ = pg_timestamp(i64::MIN);
    }
}
