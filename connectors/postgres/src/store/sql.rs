//! The statement texts of one outbox table (the write-back's, the claims', the reaper's,
//! the checkpoint's) and how a row of their select list is read.

use bytes::Bytes;
use outboxd_connector::{ConnectorError, OutboxLayout};
use outboxd_connector_kit::columns::{self, RowNames};
use outboxd_connector_kit::{status, ColumnMap, Field, RowSource, Value};
use tokio_postgres::Row;

use super::{get, RowShape};
use crate::log::decode::iso8601;
use crate::schema::quote_ident;

/// The statement texts for one outbox table.
#[derive(Debug)]
pub(super) struct Sql {
    /// The columns the statements name.
    pub(super) names: RowColumns,
    pub(super) event_select: String,
    pub(super) success: String,
    /// `success` and `checkpoint` in one statement: the checkpoint is written only when
    /// every row of the batch was updated (see
    /// [`PgOutboxStore::write_back_at_once`](super::PgOutboxStore::write_back_at_once)).
    pub(super) success_and_checkpoint: String,
    pub(super) failed: String,
    pub(super) parked: String,
    pub(super) exists: String,
    pub(super) checkpoint: String,
    pub(super) load_checkpoint: String,
    pub(super) claim: [[String; 2]; 2],
    pub(super) complete_success: String,
    pub(super) complete_failed: String,
    pub(super) complete_released: String,
    pub(super) reap: String,
    pub(super) schedule: String,
    pub(super) blocked_all: String,
    pub(super) blocked_some: String,
}

/// The outbox columns the statements name, quoted: outboxd's own (`schemas/postgres/
/// outbox.sql`), or where `outbox.columns` puts them on the application's table (kept rows
/// on Debezium's table: `id` is the integer row id `init --add-columns` added,
/// `aggregateid` the key). The status columns always have outboxd's names.
#[derive(Debug)]
pub(crate) struct RowColumns {
    /// The columns the statements name besides the status columns.
    pub(crate) row: RowNames,
    /// The select list of the claim fields for alias `o` ([`RowColumns::select`]).
    pub(crate) select: String,
    /// Where each claim field is in a row of `select`; a claim's token follows them
    /// ([`ColumnMap::field_count`]).
    pub(crate) map: ColumnMap,
}

impl RowColumns {
    /// The columns under `layout`, the key and payload read as `shape` says: text-like
    /// ones as their text output (what the replication stream sees), `bytea` as raw bytes.
    pub(crate) fn of(layout: &OutboxLayout, shape: RowShape) -> Self {
        let fields = columns::claim_fields(layout);
        let select = fields
            .iter()
            .map(|(field, name)| {
                let column = format!("o.{}", quote_ident(name));
                match field {
                    Field::Key if shape.key_bytea => column,
                    Field::Payload if shape.payload_bytea => column,
                    // Any integer type: read as bigint.
                    Field::Id => format!("{column}::bigint"),
                    Field::RetryCount | Field::MaxRetryCount => format!("{column}::int"),
                    _ => format!("{column}::text"),
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        Self {
            row: RowNames::quoted(layout, quote_ident),
            map: ColumnMap::in_select_order(&fields, layout),
            select,
        }
    }
}

/// An SQL result row of [`RowColumns::select`] as the kit's row conversion reads it.
pub(super) struct SqlRow<'a> {
    pub(super) row: &'a Row,
    pub(super) shape: RowShape,
    pub(super) map: &'a ColumnMap,
}

impl RowSource for SqlRow<'_> {
    fn value(&self, field: Field) -> Result<Value, ConnectorError> {
        let Some(at) = self.map.get(field) else {
            return Ok(Value::Null);
        };
        let bytea = match field {
            Field::Key => self.shape.key_bytea,
            Field::Payload => self.shape.payload_bytea,
            _ => false,
        };
        Ok(match field {
            Field::Id => get::<Option<i64>>(self.row, at)?.map_or(Value::Null, Value::Int),
            Field::RetryCount | Field::MaxRetryCount => {
                get::<Option<i32>>(self.row, at)?.map_or(Value::Null, |i| Value::Int(i64::from(i)))
            }
            _ if bytea => get::<Option<Vec<u8>>>(self.row, at)?
                .map_or(Value::Null, |b| Value::Bytes(Bytes::from(b))),
            Field::CreatedAt => get::<Option<String>>(self.row, at)?
                .map_or(Value::Null, |t| Value::Bytes(Bytes::from(iso8601(&t)))),
            _ => get::<Option<String>>(self.row, at)?
                .map_or(Value::Null, |t| Value::Bytes(Bytes::from(t))),
        })
    }
}

impl Sql {
    /// `version` is `server_version_num`: `gen_random_uuid()` is built in from 13 on.
    pub(super) fn new(outbox: &str, checkpoint: &str, names: RowColumns, version: i32) -> Self {
        let blocking = status::blocking_sql_list();
        let RowColumns {
            row: RowNames { id, biz_key, .. },
            select: columns,
            ..
        } = &names;
        let token = if version >= 130_000 {
            "gen_random_uuid()".to_owned()
        } else {
            format!("md5(random()::text || clock_timestamp()::text || o.{id}::text)::uuid")
        };
        let next_retry = |delay: &str| format!("now() + {delay} * interval '1 millisecond'");
        // The statuses FAILED, parked and rejected rows are written from (see `failed`),
        // and what they leave of a SUCCESS (NULL already on an INIT row).
        let failable = "(o.status = 'INIT' OR ($4 AND o.status = 'SUCCESS'))";
        let unsent = "sent_at = NULL, kafka_partition = NULL, kafka_offset = NULL";
        let failed_status = "CASE WHEN o.retry_count + 1 >= o.max_retry_count \
                             THEN 'MANUAL_REQUIRED' ELSE 'FAILED' END";
        let claim = |poll: bool, strict: bool| claim_sql(outbox, &names, &token, poll, strict);
        // Leaves next_retry_time alone unless it is set (a FAILED row retried): for a
        // fresh row NULL → NULL is no change, which keeps the update HOT.
        let success = format!(
            "UPDATE {outbox} AS o SET status = 'SUCCESS', sent_at = now(), updated_at = now(), \
             kafka_partition = d.partition, kafka_offset = d.kafka_offset, \
             last_error = NULL, next_retry_time = NULL \
             FROM unnest($1::bigint[], $2::int[], $3::bigint[]) AS d(id, partition, kafka_offset) \
             WHERE o.{id} = d.id AND (o.status IN ('INIT', 'FAILED', 'MANUAL_REQUIRED') \
             OR ($4 AND o.status = 'SUCCESS')) RETURNING o.{id}::bigint"
        );
        // Never backward: LSNs compare as pg_lsn (text order is wrong for 9/… vs 10/…),
        // the LSN being what precedes the cluster's `;system=…`; other forms are replaced
        // as they come. `rows` is what is upserted: `VALUES (…)` or a `SELECT`.
        let checkpoint_upsert = |rows: &str| {
            format!(
                "INSERT INTO {checkpoint} AS t (pipeline, position, updated_at) {rows} \
                 ON CONFLICT (pipeline) DO UPDATE SET position = EXCLUDED.position, updated_at = now() \
                 WHERE CASE WHEN left(t.position, 4) = 'lsn:' AND left(EXCLUDED.position, 4) = 'lsn:' \
                       THEN pg_lsn(split_part(substr(t.position, 5), ';', 1)) \
                            <= pg_lsn(split_part(substr(EXCLUDED.position, 5), ';', 1)) \
                       ELSE true END"
            )
        };
        Self {
            event_select: format!("SELECT {columns} FROM {outbox} o"),
            // The checkpoint is upserted only when every row was updated: a row missing
            // from the statement's snapshot (not visible yet, or deleted) or past SUCCESS's
            // predicate (a replay) leaves it to the transaction of `write_back_on`.
            success_and_checkpoint: format!(
                "WITH s AS ({success}), \
                 n AS (SELECT (SELECT count(*) FROM s) = \
                       (SELECT count(DISTINCT i) FROM unnest($1::bigint[]) AS i) AS all_updated), \
                 c AS ({}) \
                 SELECT all_updated FROM n",
                checkpoint_upsert("SELECT $5, $6, now() FROM n WHERE n.all_updated")
            ),
            success,
            // From INIT, and under exactly-once ($4, `replace_positions`) from SUCCESS too:
            // such a row of a window read again was written SUCCESS before a Kafka commit
            // that never happened, and its position names an aborted record, so it goes.
            failed: format!(
                "UPDATE {outbox} AS o SET retry_count = o.retry_count + 1, \
                 next_retry_time = {}, last_error = f.error, updated_at = now(), \
                 status = {failed_status}, {unsent} \
                 FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS f(id, error, delay_ms) \
                 WHERE o.{id} = f.id AND {failable} RETURNING o.{id}::bigint",
                next_retry("f.delay_ms")
            ),
            // Parked rows (FAILED) and rejected ones (MANUAL_REQUIRED): due now, with the
            // reason, no attempt counted; from INIT, or SUCCESS as above.
            parked: format!(
                "UPDATE {outbox} AS o SET status = p.status, next_retry_time = now(), \
                 last_error = p.reason, updated_at = now(), {unsent} \
                 FROM unnest($1::bigint[], $2::text[], $3::text[]) AS p(id, reason, status) \
                 WHERE o.{id} = p.id AND {failable} RETURNING o.{id}::bigint"
            ),
            exists: format!("SELECT {id}::bigint FROM {outbox} WHERE {id} = ANY($1::bigint[])"),
            checkpoint: checkpoint_upsert("VALUES ($1, $2, now())"),
            load_checkpoint: format!("SELECT position FROM {checkpoint} WHERE pipeline = $1"),
            claim: [
                [claim(false, false), claim(false, true)],
                [claim(true, false), claim(true, true)],
            ],
            complete_success: format!(
                "UPDATE {outbox} AS o SET status = 'SUCCESS', sent_at = now(), updated_at = now(), \
                 kafka_partition = d.partition, kafka_offset = d.kafka_offset, \
                 last_error = NULL, next_retry_time = NULL, claimed_at = NULL, claim_token = NULL \
                 FROM unnest($1::bigint[], $2::int[], $3::bigint[], $4::text[]) \
                 AS d(id, partition, kafka_offset, token) \
                 WHERE o.{id} = d.id AND o.claim_token = d.token::uuid AND o.status = 'PROCESSING'"
            ),
            complete_failed: format!(
                "UPDATE {outbox} AS o SET retry_count = o.retry_count + 1, \
                 next_retry_time = {}, last_error = f.error, updated_at = now(), \
                 claimed_at = NULL, claim_token = NULL, status = {failed_status} \
                 FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[]) \
                 AS f(id, error, delay_ms, token) \
                 WHERE o.{id} = f.id AND o.claim_token = f.token::uuid AND o.status = 'PROCESSING'",
                next_retry("f.delay_ms")
            ),
            // Released claims (FAILED) and rejected rows (MANUAL_REQUIRED): no attempt
            // counted, the reason in last_error.
            complete_released: format!(
                "UPDATE {outbox} AS o SET next_retry_time = now(), last_error = r.reason, \
                 updated_at = now(), claimed_at = NULL, claim_token = NULL, status = r.status \
                 FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[]) \
                 AS r(id, reason, token, status) \
                 WHERE o.{id} = r.id AND o.claim_token = r.token::uuid AND o.status = 'PROCESSING'"
            ),
            // SKIP LOCKED: a row being written back by its worker right now is not stale.
            reap: format!(
                "UPDATE {outbox} AS o SET retry_count = o.retry_count + 1, \
                 next_retry_time = {}, last_error = $3, updated_at = now(), \
                 claimed_at = NULL, claim_token = NULL, status = {failed_status} \
                 WHERE o.{id} IN (SELECT e.{id} FROM {outbox} e WHERE e.next_retry_time IS NOT NULL \
                 AND e.status = 'PROCESSING' AND e.claimed_at < now() - $1::bigint * interval '1 millisecond' \
                 FOR UPDATE OF e SKIP LOCKED) \
                 RETURNING o.status",
                next_retry("$2::bigint")
            ),
            schedule: format!(
                "SELECT (SELECT min(next_retry_time) FROM {outbox} \
                         WHERE next_retry_time IS NOT NULL AND status = 'FAILED'), \
                        (SELECT min(claimed_at) FROM {outbox} \
                         WHERE next_retry_time IS NOT NULL AND status = 'PROCESSING')"
            ),
            blocked_all: format!(
                "SELECT DISTINCT {biz_key}::text FROM {outbox} \
                 WHERE next_retry_time IS NOT NULL AND status IN {blocking}"
            ),
            blocked_some: format!(
                "SELECT DISTINCT {biz_key}::text FROM {outbox} \
                 WHERE next_retry_time IS NOT NULL AND status IN {blocking} \
                 AND {biz_key} = ANY($1::text[])"
            ),
            names,
        }
    }
}

/// The claim statement. `$1` is the limit; strict poll mode also takes `$2`, the window.
///
/// - Due FAILED rows: `status = 'FAILED' AND next_retry_time <= now()`, served by the
///   retry index.
/// - Poll mode adds INIT rows (served by the optional poll index). The two kinds are
///   selected and locked separately, each `ORDER BY id LIMIT $1`, so each uses its index,
///   then the lowest `$1` ids of both are claimed (the other locked rows are released at
///   commit, milliseconds later).
/// - Strict: a row is taken only when no lower id of its key is FAILED, PROCESSING or
///   MANUAL_REQUIRED (served by the key index on the same rows) and, in poll mode, none
///   is INIT. For INIT rows that last test looks at a window of the lowest INIT ids
///   without locking them: the first row of each key in the window has no earlier INIT
///   row, also when another claimer holds that earlier row's lock.
///
/// Claimed rows get `next_retry_time = COALESCE(next_retry_time, now())`, so a PROCESSING
/// row claimed from INIT is in the partial indexes too.
fn claim_sql(outbox: &str, names: &RowColumns, token: &str, poll: bool, strict: bool) -> String {
    let blocking = status::blocking_sql_list();
    let RowColumns {
        row: RowNames { id, biz_key, .. },
        select: columns,
        ..
    } = names;
    let not_blocked = if strict {
        format!(
            "AND NOT EXISTS (SELECT 1 FROM {outbox} e WHERE e.{biz_key} = o.{biz_key} \
             AND e.{id} < o.{id} AND e.next_retry_time IS NOT NULL AND e.status IN {blocking})"
        )
    } else {
        String::new()
    };
    let due_failed = "o.status = 'FAILED' AND o.next_retry_time <= now()";
    let lock = format!("ORDER BY o.{id} LIMIT $1 FOR UPDATE OF o SKIP LOCKED");
    let ctes = match (poll, strict) {
        (false, _) => {
            format!(
                "c AS (SELECT o.{id} AS id FROM {outbox} o WHERE {due_failed} {not_blocked} {lock})"
            )
        }
        (true, false) => format!(
            "i AS (SELECT o.{id} AS id FROM {outbox} o WHERE o.status = 'INIT' {lock}), \
             f AS (SELECT o.{id} AS id FROM {outbox} o WHERE {due_failed} {lock}), \
             c AS (SELECT id FROM i UNION ALL SELECT id FROM f ORDER BY id LIMIT $1)"
        ),
        (true, true) => format!(
            "w AS MATERIALIZED (SELECT o.{id} AS id, o.{biz_key} AS biz_key FROM {outbox} o \
               WHERE o.status = 'INIT' ORDER BY o.{id} LIMIT $2), \
             first AS (SELECT id FROM (SELECT id, row_number() OVER \
               (PARTITION BY biz_key ORDER BY id) AS n FROM w) r WHERE n = 1), \
             i AS (SELECT o.{id} AS id FROM {outbox} o WHERE o.{id} IN (SELECT id FROM first) \
               AND o.status = 'INIT' {not_blocked} {lock}), \
             f AS (SELECT o.{id} AS id FROM {outbox} o WHERE {due_failed} {not_blocked} \
               AND NOT EXISTS (SELECT 1 FROM {outbox} e WHERE e.{biz_key} = o.{biz_key} \
               AND e.{id} < o.{id} AND e.status = 'INIT') {lock}), \
             c AS (SELECT id FROM i UNION ALL SELECT id FROM f ORDER BY id LIMIT $1)"
        ),
    };
    format!(
        "WITH {ctes} \
         UPDATE {outbox} AS o SET status = 'PROCESSING', claimed_at = now(), \
         claim_token = {token}, updated_at = now(), \
         next_retry_time = COALESCE(o.next_retry_time, now()) \
         FROM c WHERE o.{id} = c.id \
         RETURNING {columns}, o.claim_token::text"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_statements_lock_only_the_outbox_rows_they_take() {
        let cols = RowColumns::of(&OutboxLayout::default(), RowShape::default());
        for poll in [false, true] {
            for strict in [false, true] {
                let sql = claim_sql("\"outbox\"", &cols, "gen_random_uuid()", poll, strict);
                assert!(sql.contains("FOR UPDATE OF o SKIP LOCKED"), "{sql}");
                assert!(sql.contains("COALESCE(o.next_retry_time, now())"), "{sql}");
                assert_eq!(sql.contains("'INIT'"), poll, "{sql}");
                assert_eq!(sql.contains("NOT EXISTS"), strict, "{sql}");
                assert_eq!(sql.contains("$2"), poll && strict, "{sql}");
            }
        }
    }

    /// Kept rows on Debezium's table: every statement names the added integer id and
    /// `aggregateid`, never a column of outboxd's own table the layout maps elsewhere.
    #[test]
    fn statements_name_the_mapped_columns() {
        let layout = OutboxLayout {
            key_column: "aggregateid".into(),
            columns: outboxd_connector::ColumnNames::debezium_kept(),
            ..OutboxLayout::default()
        };
        let sql = Sql::new(
            "\"outboxevent\"",
            "\"outboxd_checkpoint\"",
            RowColumns::of(&layout, RowShape::default()),
            150_000,
        );
        let texts = [
            &sql.success,
            &sql.failed,
            &sql.parked,
            &sql.exists,
            &sql.claim[0][1],
            &sql.claim[1][1],
            &sql.complete_success,
            &sql.reap,
        ];
        for text in texts {
            assert!(text.contains("\"outboxd_seq\""), "{text}");
            for outboxd_only in ["o.id ", "o.id,", "e.id ", "biz_key =", "message_id"] {
                assert!(!text.contains(outboxd_only), "{outboxd_only} in {text}");
            }
        }
        assert!(sql.claim[0][1].contains("e.\"aggregateid\" = o.\"aggregateid\""));
        assert!(sql.blocked_some.contains("\"aggregateid\" = ANY"));
        assert!(sql.event_select.contains("o.\"aggregatetype\"::text"));
        assert!(
            sql.event_select.contains("o.\"id\"::text"),
            "the uuid as header `id`"
        );
        assert!(!sql.event_select.contains("o.\"topic\""));
    }
}
