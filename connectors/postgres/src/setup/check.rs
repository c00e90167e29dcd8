//! `outboxd check` for PostgreSQL: one line per prerequisite of `run`, with its fix.

use super::*;
use crate::replication::ReplicationConnection;
use outboxd_connector_kit::check::table_grants_line;
use outboxd_connector_kit::tls::tls_line;

/// Oldest server version outboxd supports (`server_version_num`).
const MIN_SERVER_VERSION: i32 = 120_000;

const PAYLOAD_TYPES: &[&str] = &["jsonb", "json", "bytea", "text"];

/// Slot lag above which `check` warns (1 GiB of WAL held back).
const LAG_WARN_BYTES: i64 = 1 << 30;

/// `outboxd check`: see the module documentation. Stops after the connection line when
/// the server cannot be reached.
pub(crate) async fn check(c: &PostgresConnector) -> CheckReport {
    let mut report = Vec::new();
    let (client, negotiated) = match c.sql_client_tls().await {
        Ok(connected) => connected,
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
    let policy = c.tls.policy();
    report.push(tls_line("tls", &c.config().host, policy, &negotiated));
    let layout = c.layout();
    if !layout.features.outbox {
        // An inbox-only process opens no replication connection and reads no outbox.
        return report;
    }
    report.push(check_replication_tls(c).await);

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

    for table in &layout.outbox_tables {
        match check_outbox(&client, layout, table).await {
            Ok(lines) => report.extend(lines),
            Err(e) => report.push(failed_query("outbox table", &e)),
        }
    }
    push(
        &mut report,
        "table grants",
        check_grants(&client, layout).await,
    );
    push(
        &mut report,
        "publication",
        check_publication(&client, &publication, layout).await,
    );
    if c.config().slot_failover {
        let slot = slot.as_ref().ok().and_then(Option::as_ref);
        let failover = slot.map(|s| s.failover);
        push(
            &mut report,
            "slot failover",
            check_failover(&client, c, version, failover).await,
        );
    }
    match slot {
        Ok(slot) => match check_slot(&client, &slot_name, slot).await {
            Ok(lines) => report.extend(lines),
            Err(e) => report.push(failed_query("replication slot", &e)),
        },
        Err(e) => report.push(failed_query("replication slot", &e)),
    }
    match check_checkpoint_table(&client, layout).await {
        Ok(line) => {
            let exists = line.status == CheckStatus::Ok;
            report.push(line);
            if exists {
                report.push(check_checkpoint(&client, c).await);
            }
        }
        Err(e) => report.push(failed_query("checkpoint table", &e)),
    }
    report
}

/// The checkpoint row was written on this cluster (or by an older outboxd, which did not
/// say where).
async fn check_checkpoint(client: &Client, c: &PostgresConnector) -> CheckLine {
    let pipeline = c.pipeline();
    match verify_checkpoint(c, client).await {
        Ok((None, _)) => CheckLine::ok(
            "checkpoint",
            format!("pipeline {pipeline} has none yet (the first write-back records it)"),
        ),
        Ok((Some(checkpoint), here)) if checkpoint.system.is_none() => CheckLine::ok(
            "checkpoint",
            format!(
                "{checkpoint} (written by an older outboxd; the next write-back names this \
                 cluster, system identifier {})",
                here.system_id
            ),
        ),
        Ok((Some(checkpoint), _)) => CheckLine::ok(
            "checkpoint",
            format!("{checkpoint}, written on this cluster"),
        ),
        Err(e) if e.reason() == ErrorReason::PositionLost => CheckLine::fail(
            "checkpoint",
            e.message().to_owned(),
            "run `outboxd recover --config <file>` to start at this cluster's current \
             position and rescan INIT rows",
        ),
        Err(e) => failed_query("checkpoint", &e),
    }
}

/// The TLS of the replication connection, which outboxd opens itself (the SQL
/// connection's is the `tls` line).
async fn check_replication_tls(c: &PostgresConnector) -> CheckLine {
    const ITEM: &str = "replication tls";
    match ReplicationConnection::connect(c.config()).await {
        Ok(conn) => tls_line(ITEM, &c.config().host, c.tls.policy(), conn.negotiated()),
        Err(e) if e.is_transient() => CheckLine::warn(
            ITEM,
            format!("could not open a replication connection: {e}"),
            "see the error; `run` retries",
        ),
        Err(e) => CheckLine::fail(
            ITEM,
            format!("could not open a replication connection: {e}"),
            "check the role's REPLICATION attribute, pg_hba.conf's `replication` lines and \
             the TLS keys in [source]",
        ),
    }
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

/// The table privileges `run` needs (README, "Privileges"; `schemas/postgres/grants.sql`),
/// on the tables that exist: without them `check` would pass and `run` fail at its first
/// write-back.
async fn check_grants(client: &Client, layout: &OutboxLayout) -> Result<CheckLine, ConnectorError> {
    // Deleted rows are read from the log only: nothing is written back to the outbox.
    let outbox_needs: &[&str] = match layout.tracks_status() {
        true => &["SELECT", "UPDATE"],
        false => &["SELECT"],
    };
    let checkpoint_needs = &["SELECT", "INSERT", "UPDATE"][..];
    let needs = (layout.outbox_tables.iter().map(|t| (t, outbox_needs)))
        .chain([(&layout.checkpoint_table, checkpoint_needs)]);
    // (table, privileges it lacks)
    let mut missing: Vec<(String, Vec<&str>)> = Vec::new();
    for (table, privileges) in needs {
        let name = qualified(table);
        let mut lacking = Vec::new();
        for privilege in privileges {
            let row = query_one(
                client,
                "SELECT has_table_privilege(to_regclass($1), $2)",
                &[&name, privilege],
                "reading table privileges",
            )
            .await?;
            // NULL: the table does not exist; its own line says so.
            if get::<Option<bool>>(&row, 0)? == Some(false) {
                lacking.push(*privilege);
            }
        }
        if !lacking.is_empty() {
            missing.push((name, lacking));
        }
    }
    let user: String = get(
        &query_one(client, "SELECT current_user::text", &[], "reading the role").await?,
        0,
    )?;
    Ok(table_grants_line(
        &user,
        &missing,
        str::to_owned,
        &quote_ident(&user),
        "as the tables' owner",
        "schemas/postgres/grants.sql",
    ))
}

/// `(max, used, "used of max in use")` of a server limit, from a query of the two.
async fn capacity(
    client: &Client,
    sql: &str,
    what: &str,
) -> Result<(i32, i32, String), ConnectorError> {
    let row = query_one(client, sql, &[], what).await?;
    let max: i32 = get(&row, 0)?;
    let used: i32 = get(&row, 1)?;
    Ok((max, used, format!("{used} of {max} in use")))
}

async fn check_slots_free(client: &Client, slot_exists: bool) -> Result<CheckLine, ConnectorError> {
    let (max, used, detail) = capacity(
        client,
        "SELECT current_setting('max_replication_slots')::int, \
         (SELECT count(*) FROM pg_replication_slots)::int",
        "counting replication slots",
    )
    .await?;
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
    let (max, used, detail) = capacity(
        client,
        "SELECT current_setting('max_wal_senders')::int, \
         (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender')::int",
        "counting WAL senders",
    )
    .await?;
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

/// The lines about the outbox table `table` (one of the layout's).
async fn check_outbox(
    client: &Client,
    layout: &OutboxLayout,
    table: &str,
) -> Result<Vec<CheckLine>, ConnectorError> {
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
            outboxd_connector_kit::setup::missing_outbox_fix(
                layout,
                format!(
                    "run `outboxd init`, or psql -v outbox_table={name} -f schemas/postgres/outbox.sql"
                ),
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
        layout,
        "schemas/postgres/outbox.sql",
        |r| columns.iter().any(|(c, _)| c == r),
    )];
    lines.extend(payload_type_line(
        &columns,
        &layout.columns.payload,
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
    let outboxes = match table_idents(client, layout).await? {
        Ok(outboxes) => outboxes,
        Err(missing) => {
            return Ok(CheckLine::fail(
                "publication",
                format!("{publication} exists, but the outbox table {missing} does not"),
                "run `outboxd init`",
            ))
        }
    };
    let problems = info.problems(&outboxes);
    Ok(if problems.is_empty() {
        // The tables as the server resolved the names (the ones `run` reads).
        let names: Vec<String> = outboxes.iter().map(|(s, t)| format!("{s}.{t}")).collect();
        CheckLine::ok(
            "publication",
            format!("{publication} publishes inserts into {}", names.join(", ")),
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

/// `source.slot_failover`: the server can keep the slot on a standby, the slot was created
/// so, and the primary waits for the standbys before sending changes. `failover` is the
/// slot's `pg_replication_slots.failover`, `None` when there is no slot.
async fn check_failover(
    client: &Client,
    c: &PostgresConnector,
    version: i32,
    failover: Option<Option<bool>>,
) -> Result<CheckLine, ConnectorError> {
    const ITEM: &str = "slot failover";
    if let Some(problem) = failover_unsupported(c, version) {
        return Ok(CheckLine::fail(ITEM, problem, FAILOVER_UNSUPPORTED_FIX));
    }
    let slot_name = c.slot();
    match failover {
        None => {
            return Ok(CheckLine::ok(
                ITEM,
                "`init` creates the slot with failover = true",
            ))
        }
        Some(Some(true)) => {}
        Some(_) => {
            return Ok(CheckLine::fail(
                ITEM,
                format!(
                    "{slot_name} was created without failover (pg_replication_slots.failover \
                     = false): no standby keeps it, and after a failover outboxd finds no slot"
                ),
                failover_fix(c, &slot_name),
            ))
        }
    }
    let standbys = setting(client, "synchronized_standby_slots").await?;
    Ok(if standbys.trim().is_empty() {
        CheckLine::warn(
            ITEM,
            format!(
                "{slot_name} has failover = true, but synchronized_standby_slots is empty: \
                 outboxd may receive a change no standby has yet, which a failover loses \
                 after it reached Kafka, and the standby's copy of the slot may not be ready"
            ),
            "set synchronized_standby_slots on the primary to the standbys' physical slots \
             (README: \"Failover slots\")",
        )
    } else {
        CheckLine::ok(
            ITEM,
            format!("{slot_name} has failover = true; synchronized_standby_slots = {standbys}"),
        )
    })
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
