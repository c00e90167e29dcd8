//! `outboxd check` for MySQL and MariaDB: one line per prerequisite of `run`, with its
//! fix.

use super::*;
use outboxd_connector_kit::check::table_grants_line;
use outboxd_connector_kit::tls::{tls_line, Negotiated};

const PAYLOAD_TYPES: &[&str] = &[
    "json",
    "longtext",
    "mediumtext",
    "text",
    "longblob",
    "mediumblob",
    "blob",
    "varchar",
    "varbinary",
];

/// `outboxd check`: see the module documentation. Stops after the connection line when the
/// server cannot be reached.
pub(crate) async fn check(c: &MysqlConnector, mode: ReadMode) -> CheckReport {
    let mut report = Vec::new();
    let mut conn = match c.sql_conn().await {
        Ok(conn) => conn,
        Err(e) => {
            report.push(CheckLine::fail(
                "connection",
                e.to_string(),
                "check host, port, user, password, database and sslmode in [source], and that \
                 the user may connect from this host",
            ));
            return report;
        }
    };
    let server = match server::info(&mut conn).await {
        Ok(server) => server,
        Err(e) => {
            report.push(failed_query("connection", &e));
            return report;
        }
    };
    let flavor = if server.mariadb { "MariaDB" } else { "MySQL" };
    report.push(CheckLine::ok(
        "connection",
        format!("{flavor} {} at {}", server.version, c.endpoint()),
    ));
    report.push(check_tls(&mut conn, c).await);
    if !c.layout().features.outbox {
        // An inbox-only process reads no binlog and no outbox table.
        return report;
    }
    if mode == ReadMode::Poll {
        match check_outbox(&mut conn, c, c.layout().outbox_table()).await {
            Ok(lines) => report.extend(lines),
            Err(e) => report.push(failed_query("outbox table", &e)),
        }
        let index = outbox_poll_index(c.layout());
        let line = match index_exists(&mut conn, c, c.layout().outbox_table(), &index).await {
            Ok(true) => CheckLine::ok("poll index", index),
            Ok(false) => CheckLine::warn(
                "poll index",
                format!("{index} is missing: every claim scans the outbox"),
                "run `outboxd init` with outbox.mode = \"poll\"",
            ),
            Err(e) => failed_query("poll index", &e),
        };
        report.push(line);
        return report;
    }

    push(
        &mut report,
        "log_bin",
        check_setting(&mut conn, "log_bin", &["ON", "1"], BINLOG_FIX).await,
    );
    push(
        &mut report,
        "binlog_format",
        check_setting(
            &mut conn,
            "binlog_format",
            &["ROW"],
            "SET GLOBAL binlog_format = 'ROW' and set binlog_format = ROW in the server's \
             configuration (sessions that started before keep their format until they reconnect)",
        )
        .await,
    );
    push(
        &mut report,
        "binlog_row_image",
        check_setting(
            &mut conn,
            "binlog_row_image",
            &["FULL"],
            "SET GLOBAL binlog_row_image = 'FULL' and set it in the server's configuration",
        )
        .await,
    );
    push(
        &mut report,
        "binlog_row_metadata",
        check_row_metadata(&mut conn).await,
    );
    push(&mut report, "durability", check_durability(&mut conn).await);
    push(&mut report, "gtid", check_gtid(&mut conn, &server).await);
    push(
        &mut report,
        "server_id",
        check_server_id(&mut conn, c, &server).await,
    );
    push(
        &mut report,
        "grants",
        check_grants(&mut conn, &server).await,
    );
    for table in &c.layout().outbox_tables {
        match check_outbox(&mut conn, c, table).await {
            Ok(lines) => report.extend(lines),
            Err(e) => report.push(failed_query("outbox table", &e)),
        }
    }
    push(
        &mut report,
        "table grants",
        check_table_grants(&mut conn, c).await,
    );
    match check_checkpoint(&mut conn, c, &server).await {
        Ok(lines) => report.extend(lines),
        Err(e) => report.push(failed_query("checkpoint", &e)),
    }
    push(&mut report, "pipeline lock", check_lock(&mut conn, c).await);
    report
}

async fn check_setting(
    conn: &mut Conn,
    name: &str,
    good: &[&str],
    fix: &str,
) -> Result<CheckLine, ConnectorError> {
    let value = server::variable(conn, name).await?;
    Ok(match value {
        Some(v) if good.iter().any(|g| v.eq_ignore_ascii_case(g)) => CheckLine::ok(name, v),
        Some(v) => CheckLine::fail(
            name,
            format!("{v} (outboxd needs {})", good[0]),
            fix.to_owned(),
        ),
        None => CheckLine::fail(name, "not set on this server", fix.to_owned()),
    })
}

async fn check_row_metadata(conn: &mut Conn) -> Result<CheckLine, ConnectorError> {
    Ok(match server::variable(conn, "binlog_row_metadata").await? {
        Some(v) if v.eq_ignore_ascii_case("FULL") => CheckLine::ok(
            "binlog_row_metadata",
            "FULL: the binlog names the outbox columns",
        ),
        Some(v) => CheckLine::warn(
            "binlog_row_metadata",
            format!(
                "{v}: column names come from information_schema, which is exact unless the \
                 outbox's columns are dropped or reordered while outboxd is behind"
            ),
            "SET GLOBAL binlog_row_metadata = 'FULL' (and in the server's configuration)",
        ),
        None => CheckLine::ok(
            "binlog_row_metadata",
            "not supported by this server; column names come from information_schema",
        ),
    })
}

/// A crash must not lose a commit the binlog (or the checkpoint) already counts.
async fn check_durability(conn: &mut Conn) -> Result<CheckLine, ConnectorError> {
    let sync_binlog = server::variable(conn, "sync_binlog")
        .await?
        .unwrap_or_default();
    let flush = server::variable(conn, "innodb_flush_log_at_trx_commit")
        .await?
        .unwrap_or_default();
    let detail = format!("sync_binlog = {sync_binlog}, innodb_flush_log_at_trx_commit = {flush}");
    Ok(if sync_binlog == "1" && flush == "1" {
        CheckLine::ok("durability", detail)
    } else {
        CheckLine::warn(
            "durability",
            format!(
                "{detail}: a server crash can lose commits the binlog or the checkpoint counted"
            ),
            "set sync_binlog = 1 and innodb_flush_log_at_trx_commit = 1",
        )
    })
}

async fn check_gtid(conn: &mut Conn, server: &ServerInfo) -> Result<CheckLine, ConnectorError> {
    if server.mariadb {
        let pos = server::variable(conn, "gtid_binlog_pos")
            .await?
            .unwrap_or_default();
        return Ok(CheckLine::ok(
            "gtid",
            format!("MariaDB GTIDs, gtid_binlog_pos {pos:?}; checkpoints carry them"),
        ));
    }
    Ok(match server::variable(conn, "gtid_mode").await? {
        Some(mode) if mode.to_ascii_uppercase().starts_with("ON") => CheckLine::ok(
            "gtid",
            format!("gtid_mode {mode}; checkpoints carry the executed GTID set"),
        ),
        Some(mode) => CheckLine::ok(
            "gtid",
            format!("gtid_mode {mode}; checkpoints use binlog file and position only"),
        ),
        None => CheckLine::ok("gtid", "no GTIDs; checkpoints use file and position only"),
    })
}

async fn check_server_id(
    conn: &mut Conn,
    c: &MysqlConnector,
    server: &ServerInfo,
) -> Result<CheckLine, ConnectorError> {
    let ours = c.config().server_id;
    let own = server::variable(conn, "server_id")
        .await?
        .unwrap_or_default();
    if own == ours.to_string() {
        return Ok(CheckLine::fail(
            "server_id",
            format!("source.server_id {ours} is the server's own server_id"),
            "set source.server_id to a number no server or replica in this topology uses",
        ));
    }
    let listing = if server.mariadb {
        "SHOW SLAVE HOSTS"
    } else {
        "SHOW REPLICAS"
    };
    let rows = match conn.query::<mysql_async::Row, _>(listing).await {
        Ok(rows) => rows,
        Err(mysql_async::Error::Server(e)) if e.code == 1064 && !server.mariadb => {
            query(conn, "SHOW SLAVE HOSTS", "listing replicas").await?
        }
        Err(mysql_async::Error::Server(e)) => {
            return Ok(CheckLine::warn(
                "server_id",
                format!(
                    "{ours}; could not list the server's replicas: {}",
                    e.message
                ),
                "grant REPLICATION MASTER ADMIN (MariaDB) / REPLICATION SLAVE to check for a \
                 clash, or make sure no replica uses this server_id",
            ))
        }
        Err(e) => return Err(crate::client::classify(&e, "listing replicas")),
    };
    let mut clash = None;
    for row in &rows {
        if int(row, 0)? == Some(i64::from(ours)) {
            clash = Some(text_or_empty(row, 1)?);
        }
    }
    Ok(match clash {
        None => CheckLine::ok(
            "server_id",
            format!(
                "{ours}, not used by the {} registered replica(s)",
                rows.len()
            ),
        ),
        Some(host) => {
            let locked = lock_holder(conn, c).await?.is_some();
            if locked {
                CheckLine::ok(
                    "server_id",
                    format!("{ours} is registered (by the outboxd running this pipeline)"),
                )
            } else {
                CheckLine::fail(
                    "server_id",
                    format!("{ours} is already used by a replica registered from `{host}`"),
                    "set source.server_id to a number no server or replica uses: the server \
                     disconnects one of two replicas with the same id",
                )
            }
        }
    })
}

/// The table privileges `run` needs (README, "Privileges"; `schemas/mysql/grants.sql`),
/// tried with statements that change nothing (`WHERE 1 = 0`): the server checks the
/// privileges of a statement before it looks for rows, so the answer is exact whatever
/// the grants' form (global, database, table, role). Without this line `check` would pass
/// and `run` fail at its first write-back.
async fn check_table_grants(
    conn: &mut Conn,
    c: &MysqlConnector,
) -> Result<CheckLine, ConnectorError> {
    /// ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR.
    const DENIED: [u16; 2] = [1142, 1143];
    /// ER_NO_SUCH_TABLE: its own line says so.
    const NO_TABLE: u16 = 1146;
    let layout = c.layout();
    let checkpoint = qualified(&layout.checkpoint_table);
    let mut probes: Vec<(&String, &str, String)> = Vec::new();
    for table in &layout.outbox_tables {
        let outbox = qualified(table);
        probes.push((
            table,
            "SELECT",
            format!("SELECT 1 FROM {outbox} WHERE 1 = 0"),
        ));
        // Deleted rows are read from the binlog only: nothing is written back to them (and
        // such a table, Debezium's, has no status column to probe).
        if layout.tracks_status() {
            probes.push((
                table,
                "UPDATE",
                format!("UPDATE {outbox} SET status = status WHERE 1 = 0"),
            ));
        }
    }
    probes.extend([
        (
            &layout.checkpoint_table,
            "SELECT",
            format!("SELECT 1 FROM {checkpoint} WHERE 1 = 0"),
        ),
        (
            &layout.checkpoint_table,
            "INSERT",
            format!(
                "INSERT INTO {checkpoint} (pipeline, position) SELECT 'check', 'check' FROM DUAL \
                 WHERE 1 = 0"
            ),
        ),
        (
            &layout.checkpoint_table,
            "UPDATE",
            format!("UPDATE {checkpoint} SET position = position WHERE 1 = 0"),
        ),
    ]);
    let mut missing: Vec<(String, Vec<&str>)> = Vec::new();
    for (table, privilege, sql) in &probes {
        match conn.query_drop(sql).await {
            Ok(()) => {}
            Err(mysql_async::Error::Server(e)) if DENIED.contains(&e.code) => {
                match missing.iter_mut().find(|(t, _)| t == *table) {
                    Some((_, lacking)) => lacking.push(privilege),
                    None => missing.push(((*table).clone(), vec![privilege])),
                }
            }
            Err(mysql_async::Error::Server(e)) if e.code == NO_TABLE => {}
            Err(e) => return Err(crate::client::classify(&e, "trying the table privileges")),
        }
    }
    Ok(table_grants_line(
        "the user",
        &missing,
        qualified,
        "<user>",
        "as an administrator",
        "schemas/mysql/grants.sql",
    ))
}

async fn check_grants(conn: &mut Conn, server: &ServerInfo) -> Result<CheckLine, ConnectorError> {
    let rows = query(conn, "SHOW GRANTS", "reading the user's grants").await?;
    let mut grants = String::new();
    for row in &rows {
        grants.push_str(&text_or_empty(row, 0)?.to_ascii_uppercase());
        grants.push('\n');
    }
    let global = |privilege: &str| {
        grants.lines().any(|l| {
            l.contains(" ON *.* ")
                && (l.contains(privilege) || l.starts_with("GRANT ALL PRIVILEGES ON *.*"))
        })
    };
    let slave = global("REPLICATION SLAVE") || global("REPLICATION REPLICA");
    // MariaDB 10.5+ renamed REPLICATION CLIENT to BINLOG MONITOR; SUPER covers both.
    let client = global("REPLICATION CLIENT") || global("BINLOG MONITOR") || global("SUPER");
    let mut missing = Vec::new();
    if !slave {
        missing.push("REPLICATION SLAVE");
    }
    if !client {
        missing.push(if server.mariadb {
            "BINLOG MONITOR"
        } else {
            "REPLICATION CLIENT"
        });
    }
    Ok(if missing.is_empty() {
        CheckLine::ok("grants", "REPLICATION SLAVE and REPLICATION CLIENT")
    } else {
        CheckLine::fail(
            "grants",
            format!("the user lacks {}", missing.join(" and ")),
            format!(
                "GRANT {} ON *.* TO <user>; (as an administrator)",
                missing.join(", ")
            ),
        )
    })
}

/// The lines about the outbox table `table` (one of the layout's).
async fn check_outbox(
    conn: &mut Conn,
    c: &MysqlConnector,
    table: &str,
) -> Result<Vec<CheckLine>, ConnectorError> {
    let layout = c.layout();
    let (db, name) = table_ident(table, &c.config().database);
    let sql = format!(
        "SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = {} \
         AND TABLE_NAME = {} ORDER BY ORDINAL_POSITION",
        sql_string(&db),
        sql_string(&name)
    );
    let rows = query(conn, &sql, "reading the outbox columns").await?;
    if rows.is_empty() {
        return Ok(vec![CheckLine::fail(
            "outbox table",
            format!("{table} does not exist"),
            outboxd_connector_kit::setup::missing_outbox_fix(
                layout,
                "run `outboxd init`, or create it with schemas/mysql/outbox.sql".to_owned(),
            ),
        )]);
    }
    let mut columns = Vec::with_capacity(rows.len());
    for row in &rows {
        columns.push((
            text_or_empty(row, 0)?,
            text_or_empty(row, 1)?.to_ascii_lowercase(),
        ));
    }
    let mut lines = vec![outbox_columns_line(
        table,
        &qualified(table),
        layout,
        "schemas/mysql/outbox.sql",
        |r| columns.iter().any(|(c, _)| c.eq_ignore_ascii_case(r)),
    )];
    lines.extend(payload_type_line(
        &columns,
        &layout.columns.payload,
        PAYLOAD_TYPES,
        "declare payload as JSON or LONGBLOB (or a text type)",
    ));
    Ok(lines)
}

async fn check_checkpoint(
    conn: &mut Conn,
    c: &MysqlConnector,
    server: &ServerInfo,
) -> Result<Vec<CheckLine>, ConnectorError> {
    let table = &c.layout().checkpoint_table;
    if !table_exists(conn, c, table).await? {
        return Ok(vec![CheckLine::fail(
            "checkpoint table",
            format!("{table} does not exist"),
            "run `outboxd init`, or create it with schemas/mysql/checkpoint.sql",
        )]);
    }
    let mut lines = vec![CheckLine::ok("checkpoint table", table.clone())];
    let pipeline = c.pipeline();
    match load_checkpoint(conn, c).await? {
        None => lines.push(CheckLine::fail(
            "checkpoint",
            format!("pipeline {pipeline} has no checkpoint yet"),
            "run `outboxd init`: it records the current binlog position as the start",
        )),
        Some(checkpoint) => {
            let identity = ServerIdentity::of(conn, server).await?;
            let shown = &checkpoint.position;
            match server::verify_checkpoint(conn, server, &identity, &checkpoint, pipeline).await {
                Ok(()) => lines.push(CheckLine::ok(
                    "checkpoint",
                    format!("{shown}, read from this server ({identity}); its binlog is here"),
                )),
                Err(e) if !e.is_transient() => lines.push(CheckLine::fail(
                    "checkpoint",
                    e.message().to_owned(),
                    "run `outboxd recover --config <file>` to start at this server's current \
                     position and rescan INIT rows",
                )),
                Err(e) => return Err(e),
            }
        }
    }
    Ok(lines)
}

async fn check_lock(conn: &mut Conn, c: &MysqlConnector) -> Result<CheckLine, ConnectorError> {
    Ok(match lock_holder(conn, c).await? {
        Some(id) => CheckLine::warn(
            "pipeline lock",
            format!("{} is held by connection {id}", c.lock_name()),
            "another outboxd runs this pipeline; a second one waits until it stops",
        ),
        None => CheckLine::ok("pipeline lock", format!("{} is free", c.lock_name())),
    })
}

/// What the connection's TLS verified. The binlog stream and the lock connection are
/// opened the same way, so one line covers them; the server says which TLS version.
async fn check_tls(conn: &mut Conn, c: &MysqlConnector) -> CheckLine {
    const ITEM: &str = "tls";
    let row = match query_first(
        conn,
        "SHOW SESSION STATUS LIKE 'Ssl_version'",
        "reading the session's TLS version",
    )
    .await
    {
        Ok(row) => row,
        Err(e) => return failed_query(ITEM, &e),
    };
    let version = match row.map(|row| text_or_empty(&row, 1)).transpose() {
        Ok(version) => version.unwrap_or_default(),
        Err(e) => return failed_query(ITEM, &e),
    };
    let negotiated = if version.is_empty() {
        Negotiated::Plain
    } else {
        Negotiated::Tls {
            version,
            verified: c.tls.policy.verify,
        }
    };
    let mut line = tls_line(ITEM, &c.config().host, &c.tls.policy, &negotiated);
    line.detail.push_str("; SQL and binlog connections alike");
    line
}
