//! `outboxd init` and `outboxd check` for PostgreSQL.
//!
//! `init` creates what is missing, in the order the log needs: tables, then the
//! publication on the outbox, then the logical slot (a slot created before its publication
//! cannot decode the changes in between). It never alters or drops an existing object: a
//! publication or slot that does not fit is reported with the SQL that fixes it.
//!
//! `check` says, one line per prerequisite, whether `run` will work and what to do if not.
//!
//! In poll mode (`source.mode = "poll"`) `init` creates the tables and poll mode's index of
//! INIT rows, and no publication or slot: poll mode is for servers where log access is
//! not granted.
//!
//! `reset_log_position` is the log half of `outboxd recover`: the slot dropped and created
//! again at the server's current position.

use outboxd_connector::{CheckLine, CheckReport, ConnectorError, OutboxLayout};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

use outboxd_connector_kit::check::{failed_query, outbox_columns_line, payload_type_line, push};
use outboxd_connector_kit::store::table_qualifiers;

use crate::client::classify_pg_error;
use crate::schema::{self, qualified, quote_ident, split_qualified};
use crate::PostgresConnector;

/// Oldest server version outboxd supports (`server_version_num`).
const MIN_SERVER_VERSION: i32 = 120_000;

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

const PAYLOAD_TYPES: &[&str] = &["jsonb", "json", "bytea", "text"];

/// Slot lag above which `check` warns (1 GiB of WAL held back).
const LAG_WARN_BYTES: i64 = 1 << 30;

const WAL_LEVEL_FIX: &str = "set wal_level = logical in postgresql.conf \
    (ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL";

/// `outboxd init`: see the module documentation. Returns one line per item, saying what was
/// created or that there was nothing to do.
pub(crate) async fn init(
    c: &PostgresConnector,
    poll_mode: bool,
) -> Result<Vec<String>, ConnectorError> {
    let client = c.sql_client().await?;
    let layout = c.layout();
    let slot_name = c.slot();
    let publication = c.publication();
    let mut report = Vec::new();

    // Refuse before changing anything when the slot cannot be created anyway.
    let slot = if poll_mode {
        None
    } else {
        slot_info(&client, &slot_name, 0).await?
    };
    if slot.is_none() && !poll_mode {
        let wal_level = setting(&client, "wal_level").await?;
        if wal_level != "logical" {
            return Err(ConnectorError::definite(format!(
                "cannot create replication slot `{slot_name}`: wal_level is `{wal_level}` on {}, \
                 logical replication needs `logical`; {WAL_LEVEL_FIX}",
                c.endpoint()
            )));
        }
    }

    // Schemas of schema-qualified tables.
    for schema in table_qualifiers(layout, |t| split_qualified(t).0.map(str::to_owned)) {
        let schema = schema.as_str();
        let exists = query_opt(
            &client,
            "SELECT 1 FROM pg_namespace WHERE nspname = $1",
            &[&schema],
            "looking up schemas",
        )
        .await?
        .is_some();
        if !exists {
            let sql = format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(schema));
            execute(&client, &sql, &format!("creating schema {schema}")).await?;
            report.push(format!("created schema {schema}"));
        }
    }

    // Tables and their indexes.
    let outbox_existed = relation_exists(&client, &qualified(&layout.outbox_table)).await?;
    for ddl in schema::render_all(layout) {
        let existed = relation_exists(&client, &qualified(&ddl.table)).await?;
        let mut missing_indexes = Vec::new();
        for index in &ddl.indexes {
            if !relation_exists(&client, &index_name(&ddl.table, index)).await? {
                missing_indexes.push(index.clone());
            }
        }
        if !existed || !missing_indexes.is_empty() {
            execute(&client, &ddl.sql, &format!("creating table {}", ddl.table)).await?;
        }
        if !existed {
            report.push(format!("created table {}", ddl.table));
        } else if missing_indexes.is_empty() {
            report.push(format!("table {}: exists, nothing to do", ddl.table));
        } else {
            for index in missing_indexes {
                report.push(format!(
                    "created index {index} on existing table {}",
                    ddl.table
                ));
            }
        }
    }

    if poll_mode {
        let ddl = schema::render_poll_index(layout);
        for index in &ddl.indexes {
            if relation_exists(&client, &index_name(&ddl.table, index)).await? {
                report.push(format!("index {index}: exists, nothing to do"));
            } else {
                execute(&client, &ddl.sql, &format!("creating index {index}")).await?;
                report.push(format!(
                    "created index {index} on {} (poll mode: finds INIT rows; makes the SUCCESS \
                     write-back a non-HOT update, see schemas/postgres/outbox_poll.sql)",
                    ddl.table
                ));
            }
        }
        report.push("poll mode: no publication or replication slot needed".to_owned());
        return Ok(report);
    }

    // Publication.
    report.push(ensure_publication(&client, layout, &publication).await?);

    // Replication slot.
    match slot {
        None => {
            let row = query_opt(
                &client,
                "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
                &[&slot_name],
                &format!("creating replication slot {slot_name}"),
            )
            .await?;
            let lsn: Option<String> = row.and_then(|r| r.try_get(0).ok());
            report.push(format!(
                "created replication slot {slot_name} (pgoutput) at {}",
                lsn.as_deref().unwrap_or("?")
            ));
            // Rows inserted before the slot existed are not in its log.
            if outbox_existed {
                let sql = format!(
                    "SELECT count(*) FROM {} WHERE status = 'INIT'",
                    qualified(&layout.outbox_table)
                );
                let row = query_opt(&client, &sql, &[], "counting INIT rows").await?;
                let count: i64 = row.and_then(|r| r.try_get(0).ok()).unwrap_or(0);
                if count > 0 {
                    report.push(format!(
                        "note: {count} rows of {} are in INIT from before the slot existed; \
                         run `outboxd recover` to publish them",
                        layout.outbox_table
                    ));
                }
            }
        }
        Some(info) => {
            let problems = info.problems(&current_database(&client).await?);
            if let Some(problem) = problems.into_iter().next() {
                return Err(ConnectorError::definite(format!(
                    "replication slot `{slot_name}` {problem}"
                )));
            }
            report.push(format!(
                "replication slot {slot_name}: exists, nothing to do"
            ));
        }
    }
    Ok(report)
}

/// Creates the publication when it is missing; refuses (with the fixing SQL) one that
/// does not fit. Returns what it did.
async fn ensure_publication(
    client: &Client,
    layout: &OutboxLayout,
    publication: &str,
) -> Result<String, ConnectorError> {
    let outbox = table_ident(client, layout).await?.ok_or_else(|| {
        ConnectorError::definite(format!(
            "table {} does not exist: run `outboxd init --config <file>`",
            layout.outbox_table
        ))
    })?;
    match publication_info(client, publication).await? {
        None => {
            let sql = create_publication_sql(publication, layout);
            execute(client, &sql, &format!("creating publication {publication}")).await?;
            Ok(format!(
                "created publication {publication} for inserts into {}",
                layout.outbox_table
            ))
        }
        Some(info) => {
            let problems = info.problems(&outbox);
            if !problems.is_empty() {
                return Err(ConnectorError::definite(format!(
                    "publication `{publication}` exists but {}; outboxd leaves it alone. Fix: {}",
                    problems.join(" and "),
                    info.fix_sql(publication, layout)
                )));
            }
            Ok(format!("publication {publication}: exists, nothing to do"))
        }
    }
}

/// The log half of `outboxd recover`: drops the pipeline's slot (whatever its state, also
/// invalidated) unless a reader holds it, makes sure the publication exists, and creates
/// the slot again at the server's current WAL position. Returns what it did, one sentence.
///
/// Everything committed before the new slot's consistent point is not in its log: the
/// caller publishes the INIT rows by scanning the table.
pub(crate) async fn reset_log_position(c: &PostgresConnector) -> Result<String, ConnectorError> {
    let client = c.sql_client().await?;
    let layout = c.layout();
    let slot_name = c.slot();
    let publication = c.publication();
    let in_use = |pid: &str| {
        ConnectorError::definite(format!(
            "replication slot `{slot_name}` is in use by server process {pid} (another outboxd \
             running on this pipeline?): stop the running outboxd first, then run \
             `outboxd recover --config <file>` again"
        ))
    };

    let row = query_one(
        &client,
        "SELECT current_setting('server_version_num')::int",
        &[],
        "reading the server version",
    )
    .await?;
    let version: i32 = get(&row, 0)?;
    let mut said = Vec::new();
    match slot_info(&client, &slot_name, version).await? {
        Some(slot) => {
            if let Some(pid) = slot.active_pid {
                return Err(in_use(&pid.to_string()));
            }
            let dropped = client
                .execute("SELECT pg_drop_replication_slot($1)", &[&slot_name])
                .await;
            if let Err(e) = dropped {
                // 55006: it became active since we looked.
                if e.code().map(|c| c.code()) == Some("55006") {
                    return Err(in_use("(just started)"));
                }
                let context = format!("dropping replication slot {slot_name}");
                return Err(classify_pg_error(&e, &context));
            }
            said.push(format!(
                "dropped replication slot {slot_name} (confirmed at {}, wal_status {})",
                slot.confirmed_flush.as_deref().unwrap_or("none"),
                slot.wal_status.as_deref().unwrap_or("unknown"),
            ));
        }
        None => said.push(format!("replication slot {slot_name} did not exist")),
    }
    // The publication before the slot: a slot created first cannot decode the changes
    // made before its publication existed.
    said.push(ensure_publication(&client, layout, &publication).await?);
    let row = query_one(
        &client,
        "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
        &[&slot_name],
        &format!("creating replication slot {slot_name}"),
    )
    .await?;
    let lsn: String = get(&row, 0)?;
    said.push(format!(
        "created replication slot {slot_name} (pgoutput) at {lsn}"
    ));
    Ok(said.join("; "))
}

/// `outboxd check`: see the module documentation. Stops after the connection line when
/// the server cannot be reached.
pub(crate) async fn check(c: &PostgresConnector) -> CheckReport {
    let mut report = Vec::new();
    let client = match c.sql_client().await {
        Ok(client) => client,
        Err(e) => {
            report.push(CheckLine::fail(
                "connection",
                format!("{e}"),
                "check host, port, user, password, database and sslmode in [source], and that \
                 pg_hba.conf admits this client",
            ));
            return report;
        }
    };
    let version = match check_connection(&client, c).await {
        Ok((line, version)) => {
            report.push(line);
            version
        }
        Err(e) => {
            report.push(failed_query("connection", &e));
            return report;
        }
    };

    let layout = c.layout();
    let slot_name = c.slot();
    let publication = c.publication();
    let slot = slot_info(&client, &slot_name, version).await;

    push(&mut report, "wal_level", check_wal_level(&client).await);
    push(&mut report, "role", check_role(&client).await);
    let slot_exists = matches!(slot, Ok(Some(_)));
    push(
        &mut report,
        "max_replication_slots",
        check_slots_free(&client, slot_exists).await,
    );
    push(&mut report, "max_wal_senders", check_senders(&client).await);

    match check_outbox(&client, layout).await {
        Ok(lines) => report.extend(lines),
        Err(e) => report.push(failed_query("outbox table", &e)),
    }
    push(
        &mut report,
        "publication",
        check_publication(&client, &publication, layout).await,
    );
    match slot {
        Ok(slot) => match check_slot(&client, &slot_name, slot).await {
            Ok(lines) => report.extend(lines),
            Err(e) => report.push(failed_query("replication slot", &e)),
        },
        Err(e) => report.push(failed_query("replication slot", &e)),
    }
    push(
        &mut report,
        "checkpoint table",
        check_checkpoint_table(&client, layout).await,
    );
    report
}

async fn check_connection(
    client: &Client,
    c: &PostgresConnector,
) -> Result<(CheckLine, i32), ConnectorError> {
    let row = query_one(
        client,
        "SELECT current_setting('server_version'), current_setting('server_version_num')::int, \
         pg_is_in_recovery()",
        &[],
        "reading the server version",
    )
    .await?;
    let version: String = get(&row, 0)?;
    let num: i32 = get(&row, 1)?;
    let standby: bool = get(&row, 2)?;
    let detail = format!("PostgreSQL {version} at {}", c.endpoint());
    let line = if num < MIN_SERVER_VERSION {
        CheckLine::fail(
            "connection",
            detail,
            "outboxd needs PostgreSQL 12 or later; upgrade",
        )
    } else if standby {
        CheckLine::fail(
            "connection",
            format!("{detail} is a standby (in recovery)"),
            "point [source] at the primary: the write-back needs a writable database",
        )
    } else {
        CheckLine::ok("connection", detail)
    };
    Ok((line, num))
}

async fn check_wal_level(client: &Client) -> Result<CheckLine, ConnectorError> {
    let level = setting(client, "wal_level").await?;
    Ok(if level == "logical" {
        CheckLine::ok("wal_level", level)
    } else {
        CheckLine::fail(
            "wal_level",
            format!("{level} (logical decoding needs logical)"),
            WAL_LEVEL_FIX,
        )
    })
}

async fn check_role(client: &Client) -> Result<CheckLine, ConnectorError> {
    let row = query_one(
        client,
        "SELECT current_user::text, rolreplication, rolsuper FROM pg_roles \
         WHERE rolname = current_user",
        &[],
        "reading the role's attributes",
    )
    .await?;
    let user: String = get(&row, 0)?;
    let replication: bool = get(&row, 1)?;
    let superuser: bool = get(&row, 2)?;
    Ok(match (superuser, replication) {
        (true, _) => CheckLine::ok("role", format!("{user} is superuser")),
        (false, true) => CheckLine::ok("role", format!("{user} has REPLICATION")),
        (false, false) => CheckLine::fail(
            "role",
            format!("{user} has neither REPLICATION nor superuser"),
            format!(
                "ALTER ROLE {} WITH REPLICATION; (as a superuser; the role also needs to own the \
                 outbox table for `init`, or to be granted SELECT, UPDATE on it)",
                quote_ident(&user)
            ),
        ),
    })
}

async fn check_slots_free(client: &Client, slot_exists: bool) -> Result<CheckLine, ConnectorError> {
    let row = query_one(
        client,
        "SELECT current_setting('max_replication_slots')::int, \
         (SELECT count(*) FROM pg_replication_slots)::int",
        &[],
        "counting replication slots",
    )
    .await?;
    let max: i32 = get(&row, 0)?;
    let used: i32 = get(&row, 1)?;
    let detail = format!("{used} of {max} in use");
    Ok(if max == 0 {
        CheckLine::fail(
            "max_replication_slots",
            detail,
            "set max_replication_slots = 10 in postgresql.conf and restart PostgreSQL",
        )
    } else if !slot_exists && used >= max {
        CheckLine::fail(
            "max_replication_slots",
            format!("{detail}, none free for this pipeline's slot"),
            "raise max_replication_slots and restart PostgreSQL, or drop an unused slot \
             (SELECT pg_drop_replication_slot('<name>'))",
        )
    } else {
        CheckLine::ok("max_replication_slots", detail)
    })
}

async fn check_senders(client: &Client) -> Result<CheckLine, ConnectorError> {
    let row = query_one(
        client,
        "SELECT current_setting('max_wal_senders')::int, \
         (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender')::int",
        &[],
        "counting WAL senders",
    )
    .await?;
    let max: i32 = get(&row, 0)?;
    let used: i32 = get(&row, 1)?;
    let detail = format!("{used} of {max} in use");
    Ok(if max == 0 {
        CheckLine::fail(
            "max_wal_senders",
            detail,
            "set max_wal_senders = 10 in postgresql.conf and restart PostgreSQL",
        )
    } else if used >= max {
        CheckLine::fail(
            "max_wal_senders",
            format!("{detail}, none free"),
            "raise max_wal_senders and restart PostgreSQL, or stop another replication client",
        )
    } else {
        CheckLine::ok("max_wal_senders", detail)
    })
}

async fn check_outbox(
    client: &Client,
    layout: &OutboxLayout,
) -> Result<Vec<CheckLine>, ConnectorError> {
    let table = &layout.outbox_table;
    let name = qualified(table);
    let rows = query(
        client,
        "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
         WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
        &[&name],
        "reading the outbox columns",
    )
    .await?;
    if rows.is_empty() && !relation_exists(client, &name).await? {
        return Ok(vec![CheckLine::fail(
            "outbox table",
            format!("{table} does not exist"),
            format!(
                "run `outboxd init`, or psql -v outbox_table={name} -f schemas/postgres/outbox.sql"
            ),
        )]);
    }
    let mut columns = Vec::with_capacity(rows.len());
    for row in &rows {
        columns.push((get::<String>(row, 0)?, get::<String>(row, 1)?));
    }
    let mut lines = vec![outbox_columns_line(
        table,
        &name,
        &layout.key_column,
        "schemas/postgres/outbox.sql",
        |r| columns.iter().any(|(c, _)| c == r),
    )];
    lines.extend(payload_type_line(
        &columns,
        PAYLOAD_TYPES,
        "declare payload as jsonb, json, bytea or text",
    ));

    // Indexes that would make the SUCCESS write-back non-HOT.
    let rows = query(
        client,
        "SELECT c.relname::text, pg_get_indexdef(i.indexrelid) FROM pg_index i \
         JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = to_regclass($1)",
        &[&name],
        "reading the outbox indexes",
    )
    .await?;
    let mut offending = Vec::new();
    for row in &rows {
        let index: String = get(row, 0)?;
        let def: String = get(row, 1)?;
        let used = columns_in_index_def(&def);
        let hit: Vec<&str> = SUCCESS_COLUMNS
            .iter()
            .copied()
            .filter(|c| used.iter().any(|u| u == c))
            .collect();
        if !hit.is_empty() {
            offending.push(format!("{index} ({})", hit.join(", ")));
        }
    }
    if offending.is_empty() {
        lines.push(CheckLine::ok(
            "outbox indexes",
            format!(
                "{} index(es), none on a column the SUCCESS write-back changes",
                rows.len()
            ),
        ));
    } else {
        lines.push(CheckLine::warn(
            "outbox indexes",
            format!(
                "{} reference(s) a column the SUCCESS write-back changes: every write-back is a \
                 non-HOT update (more WAL, index bloat)",
                offending.join(", ")
            ),
            "index next_retry_time instead of status (see schemas/postgres/outbox.sql), or \
             drop the index",
        ));
    }
    Ok(lines)
}

async fn check_publication(
    client: &Client,
    publication: &str,
    layout: &OutboxLayout,
) -> Result<CheckLine, ConnectorError> {
    let Some(info) = publication_info(client, publication).await? else {
        return Ok(CheckLine::fail(
            "publication",
            format!("{publication} does not exist"),
            format!(
                "run `outboxd init`, or {}",
                create_publication_sql(publication, layout)
            ),
        ));
    };
    let Some(outbox) = table_ident(client, layout).await? else {
        return Ok(CheckLine::fail(
            "publication",
            format!("{publication} exists, but the outbox table does not"),
            "run `outboxd init`",
        ));
    };
    let problems = info.problems(&outbox);
    Ok(if problems.is_empty() {
        CheckLine::ok(
            "publication",
            format!(
                "{publication} publishes inserts into {}",
                layout.outbox_table
            ),
        )
    } else {
        CheckLine::fail(
            "publication",
            format!("{publication} {}", problems.join(" and ")),
            info.fix_sql(publication, layout),
        )
    })
}

async fn check_slot(
    client: &Client,
    slot_name: &str,
    slot: Option<SlotInfo>,
) -> Result<Vec<CheckLine>, ConnectorError> {
    let Some(slot) = slot else {
        return Ok(vec![CheckLine::fail(
            "replication slot",
            format!("{slot_name} does not exist"),
            format!(
                "run `outboxd init`, or SELECT pg_create_logical_replication_slot('{slot_name}', \
                 'pgoutput'); rows inserted before it exists need `outboxd recover`"
            ),
        )]);
    };
    let database = current_database(client).await?;
    if let Some(problem) = slot.problems(&database).into_iter().next() {
        return Ok(vec![CheckLine::fail(
            "replication slot",
            format!("{slot_name} {problem}"),
            slot_fix(slot_name),
        )]);
    }
    let mut lines = Vec::new();
    let at = slot.confirmed_flush.as_deref().unwrap_or("?");
    if slot.wal_status.as_deref() == Some("unreserved") {
        lines.push(CheckLine::warn(
            "replication slot",
            format!(
                "{slot_name} (pgoutput) confirmed at {at}; its WAL is about to be removed \
                     (wal_status unreserved, max_slot_wal_keep_size)"
            ),
            "start outboxd now, or raise max_slot_wal_keep_size",
        ));
    } else {
        lines.push(CheckLine::ok(
            "replication slot",
            format!("{slot_name} (pgoutput) confirmed at {at}"),
        ));
    }
    match slot.lag_bytes {
        Some(lag) if lag > LAG_WARN_BYTES => lines.push(CheckLine::warn(
            "slot lag",
            format!("{lag} bytes of WAL held back"),
            "start outboxd (or find why it is not confirming); the server keeps this WAL on disk",
        )),
        Some(lag) => lines.push(CheckLine::ok("slot lag", format!("{lag} bytes behind"))),
        None => lines.push(CheckLine::ok(
            "slot lag",
            "unknown (no confirmed position yet)",
        )),
    }
    match slot.active_pid {
        Some(pid) => lines.push(CheckLine::warn(
            "slot reader",
            format!("{slot_name} is in use by server process {pid}"),
            format!(
                "stop the other reader (another outboxd on this pipeline?), or \
                 SELECT pg_terminate_backend({pid})"
            ),
        )),
        None => lines.push(CheckLine::ok("slot reader", "not in use")),
    }
    Ok(lines)
}

async fn check_checkpoint_table(
    client: &Client,
    layout: &OutboxLayout,
) -> Result<CheckLine, ConnectorError> {
    let table = &layout.checkpoint_table;
    Ok(if relation_exists(client, &qualified(table)).await? {
        CheckLine::ok("checkpoint table", table.clone())
    } else {
        CheckLine::fail(
            "checkpoint table",
            format!("{table} does not exist"),
            format!(
                "run `outboxd init`, or psql -v checkpoint_table={} -f \
                 schemas/postgres/checkpoint.sql",
                qualified(table)
            ),
        )
    })
}

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
    fn problems(&self, outbox: &(String, String)) -> Vec<String> {
        let mut problems = Vec::new();
        if !self.tables.contains(outbox) {
            problems.push(format!("does not publish {}.{}", outbox.0, outbox.1));
        }
        if !self.insert {
            problems.push("does not publish inserts".to_owned());
        }
        let others = self.tables.iter().filter(|t| *t != outbox).count();
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
                table = qualified(&layout.outbox_table)
            )
        }
    }
}

fn create_publication_sql(publication: &str, layout: &OutboxLayout) -> String {
    format!(
        "CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert')",
        quote_ident(publication),
        qualified(&layout.outbox_table)
    )
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

/// `version` is `server_version_num`, 0 when unknown (wal_status is then not read).
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
    let sql = format!(
        "SELECT plugin::text, slot_type::text, database::text, active_pid, {wal_status}, \
         confirmed_flush_lsn::text, \
         CASE WHEN pg_is_in_recovery() OR confirmed_flush_lsn IS NULL THEN NULL \
         ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint END \
         FROM pg_replication_slots WHERE slot_name = $1"
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
    }))
}

/// `(schema, table)` of the outbox table, `None` when it does not exist.
async fn table_ident(
    client: &Client,
    layout: &OutboxLayout,
) -> Result<Option<(String, String)>, ConnectorError> {
    let row = query_opt(
        client,
        "SELECT n.nspname::text, c.relname::text FROM pg_class c \
         JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
        &[&qualified(&layout.outbox_table)],
        "looking up the outbox table",
    )
    .await?;
    match row {
        Some(row) => Ok(Some((get(&row, 0)?, get(&row, 1)?))),
        None => Ok(None),
    }
}

/// The quoted, schema-qualified (when the table is) name of an index of `table`.
fn index_name(table: &str, index: &str) -> String {
    match split_qualified(table) {
        (Some(schema), _) => format!("{}.{}", quote_ident(schema), quote_ident(index)),
        (None, _) => quote_ident(index),
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

fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    at: usize,
) -> Result<T, ConnectorError> {
    row.try_get(at).map_err(|e| {
        ConnectorError::definite(format!("unexpected answer from PostgreSQL (column {at})"))
            .with_source(e)
    })
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
        assert!(good.problems(&outbox).is_empty());
        let bad = PublicationInfo {
            all_tables: false,
            insert: true,
            other_ops: vec!["updates"],
            tables: vec![outbox.clone(), ("public".into(), "orders".into())],
        };
        let problems = bad.problems(&outbox);
        assert_eq!(problems.len(), 2, "{problems:?}");
        let fix = bad.fix_sql("p", &OutboxLayout::default());
        assert!(fix.contains("SET TABLE \"outbox\""), "{fix}");
        assert!(fix.contains("publish = 'insert'"), "{fix}");
    }
}
