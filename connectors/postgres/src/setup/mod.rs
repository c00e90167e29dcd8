//! `outboxd init` and `outboxd check` for PostgreSQL.
//!
//! `init` creates what is missing, in the order the log needs: tables, then the
//! publication on the outbox, then the logical slot (a slot created before its publication
//! cannot decode the changes in between). It never alters or drops an existing object: a
//! publication or slot that does not fit is reported with the SQL that fixes it.
//!
//! `check` says, one line per prerequisite, whether `run` will work and what to do if not.
//!
//! In poll mode (`outbox.mode = "poll"`) `init` creates the tables and poll mode's index of
//! INIT rows, and no publication or slot: poll mode is for servers where log access is
//! not granted.
//!
//! `reset_log_position` is the log half of `outboxd recover`: the slot dropped and created
//! again at the server's current position.
//!
//! `init.rs`, `check.rs` and `recover.rs` hold one command each; the catalog look-ups and
//! query helpers they share live here.

mod add_columns;
mod check;
mod init;
mod recover;
mod schema_script;

pub(crate) use add_columns::add_columns;
pub(crate) use check::check;
pub(crate) use init::init;
pub(crate) use recover::reset_log_position;
pub(crate) use schema_script::schema_script;

use outboxd_connector::{
    CheckLine, CheckReport, CheckStatus, ConnectorError, ErrorReason, OutboxLayout,
};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

use outboxd_connector_kit::check::{failed_query, outbox_columns_line, payload_type_line, push};
use outboxd_connector_kit::store::table_qualifiers;

use crate::client::classify_pg_error;
use crate::log::identity::verify_checkpoint;
use crate::outbox_table::OutboxTable;
use crate::schema::{self, qualified, quote_ident, TableName};
use crate::store::get;
use crate::PostgresConnector;

/// Columns the SUCCESS write-back changes on a fresh row: an index that references any of
/// them (key, expression or predicate) makes every write-back a non-HOT update.
const SUCCESS_COLUMNS: &[&str] = &[
    "status",
    "sent_at",
    "updated_at",
    "kafka_partition",
    "kafka_offset",
    "last_error",
];

const WAL_LEVEL_FIX: &str = "set wal_level = logical in postgresql.conf \
    (ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL";

/// What `pg_publication` and `pg_publication_tables` say about one publication.
struct PublicationInfo {
    all_tables: bool,
    insert: bool,
    other_ops: Vec<&'static str>,
    /// `(schema, table)` of every table it publishes.
    tables: Vec<(String, String)>,
}

impl PublicationInfo {
    /// Why the publication does not fit outboxd, empty when it does.
    /// `outboxes`: `(schema, table)` of each outbox table, as the server resolved them.
    fn problems(&self, outboxes: &[(String, String)]) -> Vec<String> {
        let mut problems = Vec::new();
        for outbox in outboxes {
            if !self.tables.contains(outbox) {
                problems.push(format!("does not publish {}.{}", outbox.0, outbox.1));
            }
        }
        if !self.insert {
            problems.push("does not publish inserts".to_owned());
        }
        let others = self.tables.iter().filter(|t| !outboxes.contains(t)).count();
        if self.all_tables {
            problems.push("is FOR ALL TABLES".to_owned());
        } else if others > 0 {
            problems.push(format!("also publishes {others} other table(s)"));
        }
        if !self.other_ops.is_empty() {
            problems.push(format!(
                "also publishes {} (every status write-back would be streamed back)",
                self.other_ops.join(", ")
            ));
        }
        problems
    }

    /// SQL that makes the publication fit.
    fn fix_sql(&self, publication: &str, layout: &OutboxLayout) -> String {
        let create = create_publication_sql(publication, layout);
        if self.all_tables {
            format!("DROP PUBLICATION {}; {create};", quote_ident(publication))
        } else {
            format!(
                "ALTER PUBLICATION {pubname} SET TABLE {table}; \
                 ALTER PUBLICATION {pubname} SET (publish = 'insert');",
                pubname = quote_ident(publication),
                table = published_tables(layout)
            )
        }
    }
}

fn create_publication_sql(publication: &str, layout: &OutboxLayout) -> String {
    format!(
        "CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert')",
        quote_ident(publication),
        published_tables(layout)
    )
}

/// The outbox tables, quoted, as a publication's table list.
fn published_tables(layout: &OutboxLayout) -> String {
    let tables: Vec<String> = layout.outbox_tables.iter().map(|t| qualified(t)).collect();
    tables.join(", ")
}

async fn publication_info(
    client: &Client,
    publication: &str,
) -> Result<Option<PublicationInfo>, ConnectorError> {
    let Some(row) = query_opt(
        client,
        "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication \
         WHERE pubname = $1",
        &[&publication],
        "looking up the publication",
    )
    .await?
    else {
        return Ok(None);
    };
    let mut other_ops = Vec::new();
    for (at, op) in [(2, "updates"), (3, "deletes"), (4, "truncates")] {
        if get::<bool>(&row, at)? {
            other_ops.push(op);
        }
    }
    let rows = query(
        client,
        "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
        &[&publication],
        "listing the publication's tables",
    )
    .await?;
    let mut tables = Vec::with_capacity(rows.len());
    for row in &rows {
        tables.push((get(row, 0)?, get(row, 1)?));
    }
    Ok(Some(PublicationInfo {
        all_tables: get(&row, 0)?,
        insert: get(&row, 1)?,
        other_ops,
        tables,
    }))
}

/// What `pg_replication_slots` says about one slot.
struct SlotInfo {
    plugin: Option<String>,
    slot_type: String,
    database: Option<String>,
    active_pid: Option<i32>,
    wal_status: Option<String>,
    confirmed_flush: Option<String>,
    lag_bytes: Option<i64>,
    /// `pg_replication_slots.failover`, read from 17 on (`None` below).
    failover: Option<bool>,
}

impl SlotInfo {
    /// Why the slot cannot be used by this pipeline, empty when it can.
    fn problems(&self, database: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if self.slot_type != "logical" {
            problems.push(format!("is a {} slot, not a logical one", self.slot_type));
        } else if self.plugin.as_deref() != Some("pgoutput") {
            problems.push(format!(
                "uses output plugin {}, not pgoutput",
                self.plugin.as_deref().unwrap_or("(none)")
            ));
        }
        if self.slot_type == "logical" && self.database.as_deref() != Some(database) {
            problems.push(format!(
                "belongs to database {}, not {database}",
                self.database.as_deref().unwrap_or("(none)")
            ));
        }
        if self.wal_status.as_deref() == Some("lost") {
            problems.push(
                "was invalidated: the WAL it needed was removed (wal_status lost)".to_owned(),
            );
        }
        problems
    }
}

fn slot_fix(slot: &str) -> String {
    format!(
        "use another slot name (source.slot), or drop it (SELECT pg_drop_replication_slot('{slot}')), \
         run `outboxd init` to create it again and `outboxd recover` to publish the INIT rows \
         written meanwhile"
    )
}

/// `version` is `server_version_num`, 0 when unknown (wal_status and failover are then
/// not read).
async fn slot_info(
    client: &Client,
    slot: &str,
    version: i32,
) -> Result<Option<SlotInfo>, ConnectorError> {
    let wal_status = if version >= 130_000 {
        "wal_status::text"
    } else {
        "NULL::text"
    };
    let failover = if version >= FAILOVER_SERVER_VERSION {
        "failover"
    } else {
        "NULL::bool"
    };
    let sql = format!(
        "SELECT plugin::text, slot_type::text, database::text, active_pid, {wal_status}, \
         confirmed_flush_lsn::text, \
         CASE WHEN pg_is_in_recovery() OR confirmed_flush_lsn IS NULL THEN NULL \
         ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint END, \
         {failover} FROM pg_replication_slots WHERE slot_name = $1"
    );
    let Some(row) = query_opt(client, &sql, &[&slot], "looking up the replication slot").await?
    else {
        return Ok(None);
    };
    Ok(Some(SlotInfo {
        plugin: get(&row, 0)?,
        slot_type: get(&row, 1)?,
        database: get(&row, 2)?,
        active_pid: get(&row, 3)?,
        wal_status: get(&row, 4)?,
        confirmed_flush: get(&row, 5)?,
        lag_bytes: get(&row, 6)?,
        failover: get(&row, 7)?,
    }))
}

/// `(schema, table)` of each outbox table, resolved as the replication stream resolves
/// them ([`OutboxTable`]); `Err` with the configured name of the first that does not
/// exist.
async fn table_idents(
    client: &Client,
    layout: &OutboxLayout,
) -> Result<Result<Vec<(String, String)>, String>, ConnectorError> {
    let mut idents = Vec::with_capacity(layout.outbox_tables.len());
    for configured in &layout.outbox_tables {
        match OutboxTable::resolve(client, configured).await? {
            Some(t) => idents.push((t.schema, t.name)),
            None => return Ok(Err(configured.clone())),
        }
    }
    Ok(Ok(idents))
}

/// The quoted, schema-qualified (when the table is) name of an index of `table`.
fn index_name(table: &str, index: &str) -> String {
    match TableName::parse(table).schema {
        Some(schema) => format!("{}.{}", quote_ident(&schema), quote_ident(index)),
        None => quote_ident(index),
    }
}

/// Identifiers after `USING` in a `pg_get_indexdef` text: the key columns, expressions and
/// predicate, with string literals skipped. Good enough to spot a column name.
fn columns_in_index_def(def: &str) -> Vec<String> {
    let body = def.split_once(" USING ").map_or(def, |(_, body)| body);
    let mut idents = Vec::new();
    let mut chars = body.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '\'' => {
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                }
            }
            '"' => {
                let mut ident = String::new();
                for c in chars.by_ref() {
                    if c == '"' {
                        break;
                    }
                    ident.push(c);
                }
                idents.push(ident);
            }
            c if c.is_alphanumeric() || c == '_' => {
                let mut ident = c.to_string();
                while let Some(&n) = chars.peek() {
                    if !(n.is_alphanumeric() || n == '_') {
                        break;
                    }
                    ident.push(n);
                    chars.next();
                }
                idents.push(ident);
            }
            _ => {}
        }
    }
    idents
}

async fn setting(client: &Client, name: &str) -> Result<String, ConnectorError> {
    let row = query_one(
        client,
        "SELECT current_setting($1)",
        &[&name],
        &format!("reading {name}"),
    )
    .await?;
    get(&row, 0)
}

async fn current_database(client: &Client) -> Result<String, ConnectorError> {
    let row = query_one(
        client,
        "SELECT current_database()::text",
        &[],
        "reading the database",
    )
    .await?;
    get(&row, 0)
}

/// `name` is a quoted, optionally qualified relation name.
async fn relation_exists(client: &Client, name: &str) -> Result<bool, ConnectorError> {
    let row = query_one(
        client,
        "SELECT to_regclass($1) IS NOT NULL",
        &[&name],
        &format!("looking up {name}"),
    )
    .await?;
    get(&row, 0)
}

async fn execute(client: &Client, sql: &str, context: &str) -> Result<(), ConnectorError> {
    client
        .batch_execute(sql)
        .await
        .map_err(|e| classify_pg_error(&e, context))
}

async fn query(
    client: &Client,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    context: &str,
) -> Result<Vec<Row>, ConnectorError> {
    client
        .query(sql, params)
        .await
        .map_err(|e| classify_pg_error(&e, context))
}

async fn query_opt(
    client: &Client,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    context: &str,
) -> Result<Option<Row>, ConnectorError> {
    client
        .query_opt(sql, params)
        .await
        .map_err(|e| classify_pg_error(&e, context))
}

async fn query_one(
    client: &Client,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    context: &str,
) -> Result<Row, ConnectorError> {
    client
        .query_one(sql, params)
        .await
        .map_err(|e| classify_pg_error(&e, context))
}

/// Oldest server whose slots can be synchronized to a standby (`failover`).
const FAILOVER_SERVER_VERSION: i32 = 170_000;

async fn server_version_num(client: &Client) -> Result<i32, ConnectorError> {
    let row = query_one(
        client,
        "SELECT current_setting('server_version_num')::int",
        &[],
        "reading the server version",
    )
    .await?;
    get(&row, 0)
}

const FAILOVER_UNSUPPORTED_FIX: &str =
    "upgrade the server to PostgreSQL 17 or later, or set source.slot_failover = false";

/// `source.slot_failover` on a server before 17: refused (a slot created without failover
/// would silently not survive a failover). The problem; the fix is
/// [`FAILOVER_UNSUPPORTED_FIX`].
fn failover_unsupported(c: &PostgresConnector, version: i32) -> Option<String> {
    (c.config().slot_failover && version < FAILOVER_SERVER_VERSION).then(|| {
        format!(
            "source.slot_failover is on, but {} runs PostgreSQL {}.{}: slots that standbys \
             synchronize (failover) need 17 or later",
            c.endpoint(),
            version / 10_000,
            version % 10_000
        )
    })
}

/// [`failover_unsupported`] as the definite error of `init` and `recover`.
fn refuse_failover_unsupported(c: &PostgresConnector, version: i32) -> Result<(), ConnectorError> {
    match failover_unsupported(c, version) {
        Some(problem) => Err(ConnectorError::definite(format!(
            "{problem}; {FAILOVER_UNSUPPORTED_FIX}"
        ))),
        None => Ok(()),
    }
}

/// The fix for an existing slot of a pipeline with `source.slot_failover` whose
/// `pg_replication_slots.failover` is false.
fn failover_fix(c: &PostgresConnector, slot: &str) -> String {
    format!(
        "with outboxd stopped (the slot must be inactive), over a replication connection: \
         psql \"host={} port={} dbname={} replication=database\" -c \
         'ALTER_REPLICATION_SLOT {slot} (FAILOVER true)'; or `outboxd recover --config <file>` \
         creates it again with failover (and rescans INIT rows)",
        c.config().host,
        c.config().port,
        c.config().database
    )
}

/// Creates the pipeline's logical slot (pgoutput), with `failover` when asked (the caller
/// has checked the server is 17 or later), and returns the LSN it starts at.
async fn create_slot(
    client: &Client,
    slot: &str,
    failover: bool,
) -> Result<String, ConnectorError> {
    let sql = if failover {
        "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', failover => true)"
    } else {
        "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')"
    };
    let row = query_one(
        client,
        sql,
        &[&slot],
        &format!("creating replication slot {slot}"),
    )
    .await?;
    get(&row, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_columns_in_index_definitions() {
        let def = "CREATE INDEX outbox_retry_due_idx ON public.outbox USING btree \
                   (next_retry_time, id) WHERE (next_retry_time IS NOT NULL)";
        let cols = columns_in_index_def(def);
        assert!(cols.iter().any(|c| c == "next_retry_time"));
        assert!(!cols.iter().any(|c| SUCCESS_COLUMNS.contains(&c.as_str())));

        let def = "CREATE INDEX x ON \"Sales\".outbox USING btree (id) \
                   WHERE (status = ANY (ARRAY['INIT'::text, 'sent_at'::text]))";
        let cols = columns_in_index_def(def);
        assert!(cols.iter().any(|c| c == "status"));
        assert!(
            !cols.iter().any(|c| c == "sent_at"),
            "string literals are skipped"
        );
        assert!(
            !cols.iter().any(|c| c == "Sales"),
            "the table name is not a column"
        );
    }

    #[test]
    fn publication_problems_are_named() {
        let outbox = ("public".to_owned(), "outbox".to_owned());
        let good = PublicationInfo {
            all_tables: false,
            insert: true,
            other_ops: vec![],
            tables: vec![outbox.clone()],
        };
        assert!(good.problems(std::slice::from_ref(&outbox)).is_empty());
        let bad = PublicationInfo {
            all_tables: false,
            insert: true,
            other_ops: vec!["updates"],
            tables: vec![outbox.clone(), ("public".into(), "orders".into())],
        };
        let problems = bad.problems(std::slice::from_ref(&outbox));
        assert_eq!(problems.len(), 2, "{problems:?}");
        let fix = bad.fix_sql("p", &OutboxLayout::default());
        assert!(fix.contains("SET TABLE \"outbox\""), "{fix}");
        assert!(fix.contains("publish = 'insert'"), "{fix}");
        // Several outbox tables: each must be published, and only they.
        let orders = ("public".to_owned(), "orders".to_owned());
        let both = [outbox.clone(), orders.clone()];
        assert!(bad
            .problems(&both)
            .iter()
            .all(|p| !p.contains("other table")));
        let problems = good.problems(&both);
        assert_eq!(problems, ["does not publish public.orders"], "{problems:?}");
        let layout = OutboxLayout {
            outbox_tables: vec!["outbox".into(), "t1.outbox".into()],
            ..OutboxLayout::default()
        };
        let fix = good.fix_sql("p", &layout);
        assert!(
            fix.contains("SET TABLE \"outbox\", \"t1\".\"outbox\""),
            "{fix}"
        );
    }
}
