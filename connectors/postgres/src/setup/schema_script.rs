//! `outboxd schema`: the DDL `init` runs, printed instead of run, for teams that apply DDL
//! through a migration tool (Flyway, Liquibase, Rails, Alembic). The same renderings as
//! `init` (`crate::schema`), so what a migration creates is what `init` and `check` expect.

use outboxd_connector::ReadMode;
use outboxd_connector_kit::setup as kit_setup;
use outboxd_connector_kit::store::table_qualifiers;

use outboxd_connector_kit::columns;

use super::add_columns::add_columns_sql;
use super::create_publication_sql;
use crate::schema::{self, quote_ident, TableName};
use crate::PostgresConnector;

/// The script: schemas, tables with their indexes, and in log mode the publication; the
/// slot (not DDL, and it starts retaining WAL the moment it exists) as a comment.
pub(crate) fn schema_script(c: &PostgresConnector, mode: ReadMode) -> String {
    let layout = c.layout();
    let mut parts = vec![match layout.features.outbox {
        true => format!(
            "-- outboxd schema (PostgreSQL, {} mode) for pipeline `{}`, as `outboxd init` \
             would create it.",
            mode_name(mode),
            c.pipeline()
        ),
        false => "-- outboxd schema (PostgreSQL, inbox only), as `outboxd init` would create it."
            .to_owned(),
    }];
    for name in table_qualifiers(layout, |t| TableName::parse(t).schema) {
        parts.push(format!(
            "CREATE SCHEMA IF NOT EXISTS {};",
            quote_ident(&name)
        ));
    }
    if !layout.features.outbox {
        // An inbox-only process: its table, nothing of the relay's.
    } else if !layout.tracks_status() {
        parts.push(kit_setup::application_outboxes_comment(layout));
    } else if kit_setup::owns_no_outbox(layout) {
        // Kept rows on the application's table: what `init --add-columns` adds to it.
        for table in &layout.outbox_tables {
            let all: Vec<&str> = columns::state_columns(layout)
                .into_iter()
                .map(|(name, _)| name)
                .collect();
            parts.push(format!(
                "-- The application's outbox table {table}: the columns outboxd writes, as \
                 `outboxd init --add-columns` adds them\n{}",
                add_columns_sql(layout, table, &all)
            ));
        }
    }
    for ddl in schema::render_all(layout) {
        if kit_setup::is_application_outbox(layout, &ddl.table) {
            continue;
        }
        parts.push(ddl.sql.trim().to_owned());
    }
    match mode {
        _ if !layout.features.outbox => {}
        ReadMode::Poll => parts.extend(
            schema::render_poll_indexes(layout)
                .into_iter()
                .map(|ddl| ddl.sql.trim().to_owned()),
        ),
        ReadMode::Log => {
            parts.push(format!(
                "{};",
                create_publication_sql(&c.publication(), layout)
            ));
            let failover = if c.config().slot_failover {
                ", failover => true"
            } else {
                ""
            };
            parts.push(format!(
                "-- Not DDL: the replication slot. `outboxd init` creates it when it is\n\
                 -- missing (and checks wal_level first); or, once, by hand:\n\
                 -- SELECT pg_create_logical_replication_slot('{}', 'pgoutput'{failover});",
                c.slot()
            ));
        }
    }
    parts.join("\n\n") + "\n"
}

fn mode_name(mode: ReadMode) -> &'static str {
    match mode {
        ReadMode::Log => "log",
        ReadMode::Poll => "poll",
    }
}
