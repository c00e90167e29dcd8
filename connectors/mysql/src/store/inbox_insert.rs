//! The MySQL/MariaDB inbox's batch insert: which message of a batch was stored, exactly.
//!
//! **Insert** is one transaction. A batch is sent as multi-row `INSERT … ON DUPLICATE KEY
//! UPDATE id = id` statements (at most 500 rows and ~1 MiB each, below the connection's
//! `max_allowed_packet`), each followed in the same round trip by a `SELECT` of the rows
//! with one of its `(source, message_id)` pairs and an id from `LAST_INSERT_ID()` (its first
//! stored row) on; `COMMIT` once all are read. Which message was stored is then exact, not
//! guessed: the affected-row count is the number of rows the statement stored (a duplicate
//! by either unique key counts 0: the connection does not set `CLIENT_FOUND_ROWS`), and each
//! stored row is the one of the first message with all four of its key values. One
//! ambiguity is left: another transaction committing one of the batch's own messages
//! while the statement ran, with an id in its range; the count shows it, and the batch is
//! rolled back and stored again as one `INSERT` per message, whose OK packets say exactly
//! what each did (one message alone is always stored that way; a refused batch is retried
//! that way too, so that the error names the message). Multi-row statements because they
//! are ~1.6 times as fast as one statement per row (the ingest target is 20k rows/s).
//! `INSERT IGNORE` is not used: it would also turn bad data into warnings.

use std::collections::HashMap;

use mysql_async::prelude::Queryable;
use mysql_async::Row;
use outboxd_connector::{last_error_text, ConnectorError, InboxMessage, Ingested};
use outboxd_connector_kit::inbox as kit;

use super::inbox::{
    answer, answers, answers_of, no_id, MysqlInboxStore, Payload, BEGIN, BEGIN_STATEMENTS,
};
use crate::client::{int, text_or_empty};
use crate::schema::{hex_literal, sql_string};

/// Bytes of statement text per round trip of an insert, at most: big enough for a batch
/// of ordinary messages, small enough to keep one text's parse and send time short.
const INSERT_TEXT_BYTES: usize = 1024 * 1024;
/// Rows per multi-row INSERT at most: keeps the mapping query's `IN` list a plain range of
/// the unique index (MariaDB turns a list of 1000 or more values into a subquery).
const ROWS_PER_INSERT: usize = 500;
/// Bytes of a query text kept free below `max_allowed_packet` (the packet's command byte,
/// the transaction statements around the inserts).
const PACKET_MARGIN: usize = 1024;

impl MysqlInboxStore {
    /// The payload as an SQL expression for this table's column.
    fn payload_sql(&self, message: &InboxMessage) -> String {
        match self.payload {
            Payload::Json => sql_string(&kit::json_payload(message)),
            Payload::Text => sql_string(&String::from_utf8_lossy(&message.payload)),
            Payload::Bytes => hex_literal(&message.payload),
        }
    }

    /// `INSERT INTO … VALUES`, before the rows of [`Self::row_sql`].
    fn insert_head(&self) -> String {
        format!(
            "INSERT INTO {} (source, message_id, message_type, biz_key, payload, headers, status, \
             last_error, next_retry_time) VALUES ",
            self.table
        )
    }

    /// One message's row of an `INSERT`: a rejected message is stored MANUAL_REQUIRED with
    /// its reason, any other PENDING.
    pub(super) fn row_sql(&self, message: &InboxMessage) -> String {
        let (status, reason, due) = match &message.rejected {
            Some(reason) => (
                kit::MANUAL_REQUIRED,
                sql_string(&last_error_text(reason)),
                "NOW(6)",
            ),
            None => (kit::PENDING, "NULL".to_owned(), "NULL"),
        };
        format!(
            "({}, {}, {}, {}, {}, {}, '{status}', {reason}, {due})",
            sql_string(&message.source),
            sql_string(&message.message_id),
            sql_string(&message.message_type),
            sql_string(&message.biz_key),
            self.payload_sql(message),
            sql_string(&kit::headers_json(message)),
        )
    }

    /// The definite error for a message whose statement exceeds the packet size.
    fn too_large(
        &self,
        at: usize,
        messages: &[InboxMessage],
        bytes: usize,
        max: usize,
    ) -> ConnectorError {
        ConnectorError::definite(format!(
            "{}: its INSERT statement has {bytes} bytes, more than the server's \
             max_allowed_packet ({max} bytes) allows; raise max_allowed_packet (SET GLOBAL \
             max_allowed_packet and in the server's configuration) or refuse such large \
             messages at the sender",
            self.context(
                &naming(messages.get(at).map(|m| (at, m)), messages.len()),
                0
            ),
        ))
    }

    /// The batch as multi-row INSERTs, each followed by the query that says which of its
    /// messages were stored, in one transaction. `None` (rolled back) when that cannot be
    /// told exactly: another transaction stored one of the batch's own messages meanwhile.
    pub(super) async fn insert_rows(
        &self,
        messages: &[InboxMessage],
        rows: &[String],
    ) -> Result<Option<Vec<Ingested>>, ConnectorError> {
        let head = self.insert_head();
        let tail = " ON DUPLICATE KEY UPDATE id = id;\n";
        let select = format!(
            "SELECT id, source, message_id, message_type, biz_key FROM {} \
             WHERE id >= LAST_INSERT_ID() AND (source, message_id) IN (",
            self.table
        );
        let pairs: Vec<String> = (messages.iter())
            .map(|m| format!("({}, {})", sql_string(&m.source), sql_string(&m.message_id)))
            .collect();
        let what = naming(None, messages.len());
        self.with_conn(async |s| {
            let packet = s.max_packet.saturating_sub(PACKET_MARGIN);
            let fixed = BEGIN.len() + head.len() + tail.len() + select.len() + 8;
            if let Some(at) =
                (0..rows.len()).find(|&i| fixed + rows[i].len() + pairs[i].len() > packet)
            {
                return Err(self.too_large(
                    at,
                    messages,
                    fixed + rows[at].len() + pairs[at].len(),
                    s.max_packet,
                ));
            }
            let room = packet.min(INSERT_TEXT_BYTES).saturating_sub(fixed);
            let mut outcomes = Vec::with_capacity(messages.len());
            let mut start = 0;
            while start < rows.len() {
                let mut end = start;
                let mut used = 0;
                while end < rows.len() && end - start < ROWS_PER_INSERT {
                    let cost = rows[end].len() + pairs[end].len() + 4;
                    if end > start && used + cost > room {
                        break;
                    }
                    used += cost;
                    end += 1;
                }
                let begin = if start == 0 {
                    format!("{BEGIN};\n")
                } else {
                    String::new()
                };
                let text = format!(
                    "{begin}{head}{}{tail}{select}{})",
                    rows[start..end].join(", "),
                    pairs[start..end].join(", ")
                );
                let mut answers = answers_of(self, &mut s.conn, &text, &what).await?;
                let last = answers.len().saturating_sub(1);
                let stored = (answer(&mut answers, last)?.rows.iter())
                    .map(StoredRow::read)
                    .collect::<Result<Vec<_>, _>>()?;
                let inserted = answer(&mut answers, last.saturating_sub(1))?.affected;
                let Some(chunk) = stored_of(&messages[start..end], inserted, &stored) else {
                    s.conn
                        .query_drop("ROLLBACK")
                        .await
                        .map_err(|e| self.fail(&what, &e))?;
                    return Ok(None);
                };
                outcomes.extend(chunk);
                start = end;
            }
            s.conn
                .query_drop("COMMIT")
                .await
                .map_err(|e| self.fail(&what, &e))?;
            Ok(Some(outcomes))
        })
        .await
    }

    /// The batch as one `INSERT … ON DUPLICATE KEY UPDATE` per message, in one transaction:
    /// each statement's own OK packet says exactly what it did (1 row: stored with its
    /// insert id, 0: a duplicate), and a failing statement names its message.
    pub(super) async fn insert_each(
        &self,
        messages: &[InboxMessage],
        rows: &[String],
    ) -> Result<Vec<Ingested>, ConnectorError> {
        let head = self.insert_head();
        let statements: Vec<String> = (rows.iter())
            .map(|row| format!("{head}{row} ON DUPLICATE KEY UPDATE id = id"))
            .collect();
        let what = |at: Option<usize>| {
            naming(
                at.and_then(|i| messages.get(i).map(|m| (i, m))),
                messages.len(),
            )
        };
        let counts = self
            .with_conn(async |s| {
                let packet = s.max_packet.saturating_sub(PACKET_MARGIN);
                if let Some(at) =
                    (0..statements.len()).find(|&i| statements[i].len() + BEGIN.len() + 8 > packet)
                {
                    return Err(self.too_large(at, messages, statements[at].len(), s.max_packet));
                }
                let texts = insert_texts(&statements, packet.min(INSERT_TEXT_BYTES));
                let mut counts = Vec::with_capacity(messages.len() + BEGIN_STATEMENTS + 1);
                for text in &texts {
                    let done = counts.len();
                    let answers = answers(&mut s.conn, text).await.map_err(|f| {
                        let at = (done + f.at).checked_sub(BEGIN_STATEMENTS);
                        self.fail(&what(at), &f.error)
                    })?;
                    counts.extend(answers.into_iter().map(|a| (a.affected, a.insert_id)));
                }
                Ok(counts)
            })
            .await?;
        // BEGIN's statements first, COMMIT last, one answer per message in between.
        let inserts = counts
            .get(BEGIN_STATEMENTS..counts.len().saturating_sub(1))
            .filter(|inserts| inserts.len() == messages.len())
            .ok_or_else(|| {
                ConnectorError::definite(format!(
                    "unexpected answer from MySQL: {} results for {} inbox inserts",
                    counts.len(),
                    messages.len()
                ))
            })?;
        inserts
            .iter()
            .map(|&(affected, id)| match (affected, id) {
                (0, _) => Ok(Ingested::Duplicate),
                (1, Some(id)) => i64::try_from(id).map(Ingested::Stored).map_err(|_| {
                    ConnectorError::definite(format!("unexpected inbox row id {id} from MySQL"))
                }),
                _ => Err(ConnectorError::definite(format!(
                    "unexpected answer from MySQL to an inbox insert: {affected} rows affected, \
                     insert id {id:?} (is CLIENT_FOUND_ROWS set on the connection?)"
                ))),
            })
            .collect()
    }
}

/// The insert statements cut into texts: the first opens the transaction, the last
/// commits, none longer than `limit` bytes unless a single statement is (checked by the
/// caller against the packet size).
fn insert_texts(statements: &[String], limit: usize) -> Vec<String> {
    let mut texts = Vec::new();
    let mut text = format!("{BEGIN};\n");
    for statement in statements {
        if text.len() + statement.len() + ";\nCOMMIT".len() > limit {
            texts.push(std::mem::take(&mut text));
        }
        text.push_str(statement);
        text.push_str(";\n");
    }
    text.push_str("COMMIT");
    texts.push(text);
    texts
}

/// `message` named for an error, with its place in the batch.
fn naming(message: Option<(usize, &InboxMessage)>, batch: usize) -> String {
    match message {
        Some((at, m)) => format!(
            "storing inbox message `{}` from `{}` ({} of a batch of {batch})",
            m.message_id,
            m.source,
            at + 1
        ),
        None => format!("storing a batch of {batch} inbox messages"),
    }
}

/// `(id, [source, message_id, message_type, biz_key])` of a row the mapping query read.
#[derive(Debug)]
struct StoredRow(i64, [String; 4]);

impl StoredRow {
    fn read(row: &Row) -> Result<Self, ConnectorError> {
        let id = int(row, 0)?.ok_or_else(|| no_id("the inbox"))?;
        let values = [
            text_or_empty(row, 1)?,
            text_or_empty(row, 2)?,
            text_or_empty(row, 3)?,
            text_or_empty(row, 4)?,
        ];
        Ok(Self(id, values))
    }
}

/// Which of `messages` one multi-row INSERT stored, from the `inserted` count and the
/// `rows` `(id, source, message_id, message_type, biz_key)` that have a pair of the
/// batch and an id from the INSERT's first one on. A row is the one of the first message
/// with all four of its values (a later equal message was its duplicate); a message
/// without one was a duplicate. `None` when the matches are not as many as the rows
/// inserted: another transaction stored one of these messages meanwhile, with an id in the
/// same range, and which row is whose cannot be told (or the server changed a value it
/// stored).
fn stored_of(
    messages: &[InboxMessage],
    inserted: u64,
    rows: &[StoredRow],
) -> Option<Vec<Ingested>> {
    if inserted == 0 {
        // Nothing new, and LAST_INSERT_ID() was an earlier statement's.
        return Some(vec![Ingested::Duplicate; messages.len()]);
    }
    // The pair is unique in the table, so at most one row per pair.
    let mut by_pair: HashMap<(&str, &str), (i64, &str, &str)> = (rows.iter())
        .map(|StoredRow(id, [source, message_id, type_, key])| {
            (
                (source.as_str(), message_id.as_str()),
                (*id, type_.as_str(), key.as_str()),
            )
        })
        .collect();
    let mut matched: u64 = 0;
    let outcomes = (messages.iter())
        .map(|m| {
            let pair = (m.source.as_str(), m.message_id.as_str());
            match by_pair.get(&pair) {
                Some(&(id, type_, key)) if type_ == m.message_type && key == m.biz_key => {
                    by_pair.remove(&pair);
                    matched += 1;
                    Ingested::Stored(id)
                }
                _ => Ingested::Duplicate,
            }
        })
        .collect();
    // Each stored row matches its message; a row left over has a pair of the batch but
    // other values: another message's, whose duplicate the batch's was. More matches than
    // inserted rows: a concurrent one matched too.
    (matched == inserted).then_some(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: &str, type_: &str, key: &str) -> InboxMessage {
        InboxMessage {
            source: "s".into(),
            message_id: id.into(),
            message_type: type_.into(),
            biz_key: key.into(),
            payload: b"{}".to_vec(),
            headers: Vec::new(),
            rejected: None,
        }
    }

    fn row(id: i64, m: &InboxMessage) -> StoredRow {
        StoredRow(
            id,
            [
                m.source.clone(),
                m.message_id.clone(),
                m.message_type.clone(),
                m.biz_key.clone(),
            ],
        )
    }

    use Ingested::{Duplicate, Stored};

    #[test]
    fn each_stored_row_is_the_first_message_with_all_its_values() {
        let batch = [
            message("m1", "t", "k1"),
            message("m1", "other", "other"), // same pair
            message("m9", "t", "k1"),        // same type and key
            message("m2", "t", "k2"),
            message("m2", "t", "k2"), // the same message again
        ];
        let rows = vec![row(11, &batch[3]), row(10, &batch[0])];
        assert_eq!(
            stored_of(&batch, 2, &rows),
            Some(vec![
                Stored(10),
                Duplicate,
                Duplicate,
                Stored(11),
                Duplicate
            ])
        );
    }

    #[test]
    fn a_reused_pair_is_matched_by_all_four_values() {
        // The first is a duplicate of an older row by type and key; the second, with the
        // same pair but another type and key, is stored.
        let batch = [message("m1", "t1", "k1"), message("m1", "t2", "k2")];
        let rows = vec![row(20, &batch[1])];
        assert_eq!(
            stored_of(&batch, 1, &rows),
            Some(vec![Duplicate, Stored(20)])
        );
    }

    #[test]
    fn rows_of_other_messages_with_a_pair_of_the_batch_are_not_its_own() {
        let batch = [message("m1", "t1", "k1"), message("m2", "t1", "k2")];
        // A concurrent m1 of other values: the batch's m1 was its duplicate.
        let rows = vec![row(30, &message("m1", "x", "y")), row(31, &batch[1])];
        assert_eq!(
            stored_of(&batch, 1, &rows),
            Some(vec![Duplicate, Stored(31)])
        );
    }

    #[test]
    fn a_concurrent_copy_of_a_message_makes_the_outcome_unknown() {
        let batch = [message("m1", "t", "k1"), message("m2", "t", "k2")];
        // One row inserted, two rows match: one was stored by another transaction.
        let rows = vec![row(40, &batch[0]), row(41, &batch[1])];
        assert_eq!(stored_of(&batch, 1, &rows), None);
        // A row the server stored with other values (truncated): unknown too.
        assert_eq!(stored_of(&batch, 2, &[row(42, &batch[0])]), None);
    }

    #[test]
    fn nothing_inserted_is_all_duplicates_whatever_last_insert_id_found() {
        let batch = [message("m1", "t", "k1")];
        let stale = vec![row(5, &batch[0])];
        assert_eq!(stored_of(&batch, 0, &stale), Some(vec![Duplicate]));
    }

    #[test]
    fn insert_texts_open_and_commit_one_transaction_under_the_limit() {
        let statements: Vec<String> = (0..100).map(|n| format!("INSERT {n:0>95}")).collect();
        let texts = insert_texts(&statements, 1000);
        assert!(texts.len() > 10, "{} texts", texts.len());
        for text in &texts {
            assert!(text.len() <= 1000, "{}", text.len());
        }
        let all = texts.concat();
        assert!(all.starts_with(&format!("{BEGIN};\n")));
        assert!(all.ends_with(";\nCOMMIT"));
        assert_eq!(all.matches("START TRANSACTION").count(), 1);
        assert_eq!(all.matches("INSERT").count(), 100);
        // One statement per message, in order, each whole in one text.
        let order: Vec<&str> = all
            .split(";\n")
            .filter(|s| s.starts_with("INSERT"))
            .collect();
        assert_eq!(order, statements);

        let one = insert_texts(&statements[..1], 1 << 20);
        assert_eq!(one.len(), 1, "a small batch is one round trip");
        // A statement longer than the limit goes alone (the caller checks the packet).
        let big = vec!["x".repeat(5000)];
        assert_eq!(insert_texts(&big, 1000).len(), 2);
    }
}
