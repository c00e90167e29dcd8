//! `outboxd init` for PostgreSQL: tables, then the publication, then the slot (see the
//! module documentation of `setup`).

use outboxd_connector_kit::setup;

use super::*;

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
    // An inbox-only process: its table, and nothing of the relay's.
    let relay = layout.features.outbox;
    // An application's table with kept rows must have outboxd's columns (`--add-columns`
    // runs before): refuse before anything is created.
    if relay {
        add_columns::refuse_missing_columns(&client, layout).await?;
    }

    // Refuse before changing anything when the slot cannot be created anyway.
    let slot = if poll_mode || !relay {
        None
    } else {
        let version = server_version_num(&client).await?;
        refuse_failover_unsupported(c, version)?;
        slot_info(&client, &slot_name, version).await?
    };
    if slot.is_none() && !poll_mode && relay {
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
    for schema in table_qualifiers(layout, |t| TableName::parse(t).schema) {
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
    let mut outbox_existed = Vec::new();
    for table in layout.outbox_tables.iter().filter(|_| relay) {
        outbox_existed.push(relation_exists(&client, &qualified(table)).await?);
    }
    // The application's tables: looked at, never created (`--add-columns` adds the status
    // columns to them first, when asked).
    report.extend(setup::application_outboxes(layout, &outbox_existed)?);
    for ddl in schema::render_all(layout) {
        if setup::is_application_outbox(layout, &ddl.table) {
            continue;
        }
        let existed = relation_exists(&client, &qualified(&ddl.table)).await?;
        let mut missing_indexes = Vec::new();
        for index in &ddl.indexes {
            if !relation_exists(&client, &index_name(&ddl.table, index)).await? {
                missing_indexes.push(index.clone());
            }
        }
        if !existed || !missing_indexes.is_empty() {
            let context = format!("creating table {}", ddl.table);
            create_if_not_exists(&client, &ddl.sql, &context).await?;
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

    if !relay {
        report.push("inbox only: no outbox relay, no publication or replication slot".to_owned());
        return Ok(report);
    }
    if poll_mode {
        for ddl in schema::render_poll_indexes(layout) {
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
        }
        report.push("poll mode: no publication or replication slot needed".to_owned());
        return Ok(report);
    }

    // Publication.
    report.push(ensure_publication(&client, layout, &publication).await?);

    // Replication slot.
    match slot {
        None => {
            let failover = c.config().slot_failover;
            let lsn = create_slot(&client, &slot_name, failover).await?;
            let with = if failover { ", failover" } else { "" };
            report.push(format!(
                "created replication slot {slot_name} (pgoutput{with}) at {lsn}"
            ));
            // Rows inserted before the slot existed are not in its log.
            let existing = (layout.outbox_tables.iter()).zip(&outbox_existed);
            for (table, _) in existing.filter(|(_, existed)| **existed) {
                if !layout.tracks_status() {
                    break;
                }
                let sql = setup::count_init_sql(&qualified(table));
                let row = query_opt(&client, &sql, &[], "counting INIT rows").await?;
                let count: i64 = row.and_then(|r| r.try_get(0).ok()).unwrap_or(0);
                report.extend(setup::init_rows_note(count, table, "the slot existed"));
            }
        }
        Some(info) => {
            let problems = info.problems(&current_database(&client).await?);
            if let Some(problem) = problems.into_iter().next() {
                return Err(ConnectorError::definite(format!(
                    "replication slot `{slot_name}` {problem}: {}",
                    slot_fix(&slot_name)
                )));
            }
            if c.config().slot_failover && info.failover == Some(false) {
                // Left alone like every existing object; `check` fails on it too.
                report.push(format!(
                    "replication slot {slot_name}: exists, but without failover \
                     (source.slot_failover); fix: {}",
                    failover_fix(c, &slot_name)
                ));
            } else {
                report.push(format!(
                    "replication slot {slot_name}: exists, nothing to do"
                ));
            }
        }
    }
    Ok(report)
}

/// Creates the publication when it is missing; refuses (with the fixing SQL) one that
/// does not fit. Returns what it did.
pub(super) async fn ensure_publication(
    client: &Client,
    layout: &OutboxLayout,
    publication: &str,
) -> Result<String, ConnectorError> {
    let outboxes = table_idents(client, layout).await?.map_err(|missing| {
        ConnectorError::definite(format!(
            "table {missing} does not exist: run `outboxd init --config <file>`"
        ))
    })?;
    match publication_info(client, publication).await? {
        None => {
            let sql = create_publication_sql(publication, layout);
            execute(client, &sql, &format!("creating publication {publication}")).await?;
            Ok(format!(
                "created publication {publication} for inserts into {}",
                layout.outbox_tables.join(", ")
            ))
        }
        Some(info) => {
            let problems = info.problems(&outboxes);
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

/// Runs `IF NOT EXISTS` DDL, once more when another `init` created the same relation at
/// the same moment (two instances starting together, or tests sharing a database):
/// PostgreSQL's `IF NOT EXISTS` is not atomic against a concurrent `CREATE`, which fails
/// on the catalog's unique index (23505) or as a duplicate table (42P07); the second run
/// then finds the relation and skips it.
async fn create_if_not_exists(
    client: &tokio_postgres::Client,
    sql: &str,
    context: &str,
) -> Result<(), ConnectorError> {
    use tokio_postgres::error::SqlState;
    match client.batch_execute(sql).await {
        Err(e)
            if e.code().is_some_and(|code| {
                *code == SqlState::UNIQUE_VIOLATION
                    || *code == SqlState::DUPLICATE_TABLE
                    || *code == SqlState::DUPLICATE_OBJECT
            }) =>
        {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            client
                .batch_execute(sql)
                .await
                .map_err(|e| crate::client::classify_pg_error(&e, context))
        }
        Err(e) => Err(crate::client::classify_pg_error(&e, context)),
        Ok(()) => Ok(()),
    }
}
