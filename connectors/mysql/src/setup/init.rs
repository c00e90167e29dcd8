//! `outboxd init` for MySQL and MariaDB: missing tables and indexes, the starting
//! checkpoint (see the module documentation of `setup`).

use outboxd_connector_kit::setup;

use super::*;

/// `outboxd init`: see the module documentation.
pub(crate) async fn init(
    c: &MysqlConnector,
    mode: ReadMode,
) -> Result<Vec<String>, ConnectorError> {
    let mut conn = c.sql_conn().await?;
    let server = server::info(&mut conn).await?;
    // Refuse before changing anything when there is no binlog to start from.
    let log_bin = server::variable(&mut conn, "log_bin")
        .await?
        .unwrap_or_default();
    let layout = c.layout();
    // An inbox-only process: its table, and nothing of the relay's.
    let relay = layout.features.outbox;
    if mode == ReadMode::Log && relay && !is_on(&log_bin) {
        return Err(ConnectorError::definite(format!(
            "the binary log is off on {} (log_bin = {log_bin}); {BINLOG_FIX}",
            c.endpoint()
        )));
    }
    let mut report = Vec::new();
    // An application's table with kept rows must have outboxd's columns (`--add-columns`
    // runs before): refuse before anything is created.
    if relay {
        add_columns::refuse_missing_columns(&mut conn, c, layout).await?;
    }

    // Databases of qualified tables.
    for db in table_qualifiers(layout, |t| split_qualified(t).0) {
        let sql = format!(
            "SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = {}",
            sql_string(&db)
        );
        if query_first(&mut conn, &sql, "looking up databases")
            .await?
            .is_none()
        {
            let sql = format!(
                "CREATE DATABASE IF NOT EXISTS {} CHARACTER SET utf8mb4",
                quote_ident(&db)
            );
            execute(&mut conn, &sql, &format!("creating database {db}")).await?;
            report.push(format!("created database {db}"));
        }
    }

    let mut outbox_existed = Vec::new();
    for table in layout.outbox_tables.iter().filter(|_| relay) {
        outbox_existed.push(table_exists(&mut conn, c, table).await?);
    }
    // The application's tables: looked at, never created (`--add-columns` adds the status
    // columns to them first, when asked).
    report.extend(setup::application_outboxes(layout, &outbox_existed)?);
    for ddl in schema::render_all(layout) {
        if setup::is_application_outbox(layout, &ddl.table) {
            continue;
        }
        if !table_exists(&mut conn, c, &ddl.table).await? {
            execute(
                &mut conn,
                &ddl.sql,
                &format!("creating table {}", ddl.table),
            )
            .await?;
            report.push(format!("created table {}", ddl.table));
            continue;
        }
        let mut created = false;
        for (index, columns) in &ddl.indexes {
            if !index_exists(&mut conn, c, &ddl.table, index).await? {
                let sql = format!(
                    "ALTER TABLE {} ADD INDEX {} ({columns})",
                    qualified(&ddl.table),
                    quote_ident(index)
                );
                execute(&mut conn, &sql, &format!("creating index {index}")).await?;
                report.push(format!(
                    "created index {index} on existing table {}",
                    ddl.table
                ));
                created = true;
            }
        }
        if !created {
            report.push(format!("table {}: exists, nothing to do", ddl.table));
        }
    }

    if !relay {
        report.push("inbox only: no outbox relay, no binlog position needed".to_owned());
        return Ok(report);
    }
    if mode == ReadMode::Poll {
        for one in (0..layout.outbox_tables.len()).filter_map(|i| layout.for_table(i)) {
            let (table, index) = (one.outbox_table(), outbox_poll_index(&one));
            if !index_exists(&mut conn, c, table, &index).await? {
                let sql = format!(
                    "ALTER TABLE {} ADD INDEX {} (status, id)",
                    qualified(table),
                    quote_ident(&index)
                );
                execute(&mut conn, &sql, &format!("creating index {index}")).await?;
                report.push(format!(
                    "created index {index} on {table} (poll mode: finds INIT rows; the \
                     SUCCESS write-back updates it too)"
                ));
            }
        }
        report.push("poll mode: no binlog position needed".to_owned());
        return Ok(report);
    }

    // The starting checkpoint.
    let pipeline = c.pipeline();
    match load_checkpoint(&mut conn, c).await? {
        Some(checkpoint) => report.push(format!(
            "checkpoint of pipeline {pipeline}: exists at {checkpoint}, nothing to do"
        )),
        None => {
            let position = server::current_position(&mut conn, &server).await?;
            let identity = ServerIdentity::of(&mut conn, &server).await?;
            let table = qualified(&layout.checkpoint_table);
            let sql = checkpoint_sql(&table, pipeline, &position, &identity);
            execute(&mut conn, &sql, "recording the starting checkpoint").await?;
            report.push(format!(
                "recorded checkpoint {position} for pipeline {pipeline}: the first run starts there"
            ));
            let existing = (layout.outbox_tables.iter()).zip(&outbox_existed);
            for (table, _) in existing.filter(|(_, existed)| **existed) {
                if !layout.tracks_status() {
                    break;
                }
                let sql = setup::count_init_sql(&qualified(table));
                let row = query_first(&mut conn, &sql, "counting INIT rows").await?;
                let count = row.map(|r| int(&r, 0)).transpose()?.flatten().unwrap_or(0);
                report.extend(setup::init_rows_note(count, table, "the checkpoint"));
            }
        }
    }
    Ok(report)
}
