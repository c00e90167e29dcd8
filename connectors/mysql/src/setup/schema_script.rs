//! `outboxd schema`: the DDL `init` runs, printed instead of run, for teams that apply DDL
//! through a migration tool (Flyway, Liquibase, Rails, Alembic). The same renderings as
//! `init` (`crate::schema`), so what a migration creates is what `init` and `check` expect.

use outboxd_connector::ReadMode;
use outboxd_connector_kit::setup as kit_setup;
use outboxd_connector_kit::store::table_qualifiers;

use super::add_columns::add_columns_sql;
use crate::schema::{self, quote_ident, split_qualified};
use crate::MysqlConnector;

/// The script: databases of qualified names, then the tables with their indexes. The
/// starting checkpoint (a row, not DDL) is `init`'s, said in a comment.
pub(crate) fn schema_script(c: &MysqlConnector, mode: ReadMode) -> String {
    let layout = c.layout();
    let mode_name = match mode {
        ReadMode::Log => "log",
        ReadMode::Poll => "poll",
    };
    let mut parts = vec![match layout.features.outbox {
        true => format!(
            "-- outboxd schema (MySQL/MariaDB, {mode_name} mode) for pipeline `{}`, as \
             `outboxd init` would create it.",
            c.pipeline()
        ),
        false => "-- outboxd schema (MySQL/MariaDB, inbox only), as `outboxd init` would \
                  create it."
            .to_owned(),
    }];
    for db in table_qualifiers(layout, |t| split_qualified(t).0) {
        parts.push(format!(
            "CREATE DATABASE IF NOT EXISTS {} CHARACTER SET utf8mb4;",
            quote_ident(&db)
        ));
    }
    if !layout.features.outbox {
        // An inbox-only process: its table, nothing of the relay's.
    } else if !layout.tracks_status() {
        parts.push(kit_setup::application_outboxes_comment(layout));
    } else if kit_setup::owns_no_outbox(layout) {
        // Kept rows on the application's table: what `init --add-columns` adds to it.
        for table in &layout.outbox_tables {
            let statements = add_columns_sql(layout, table, &Default::default());
            parts.push(format!(
                "-- The application's outbox table {table}: the columns outboxd writes, as \
                 `outboxd init --add-columns` adds them\n{};",
                statements.join(";\n")
            ));
        }
    }
    for ddl in schema::render_all(layout) {
        if kit_setup::is_application_outbox(layout, &ddl.table) {
            continue;
        }
        let sql = ddl.sql.trim();
        let end = if sql.ends_with(';') { "" } else { ";" };
        parts.push(format!("{sql}{end}"));
    }
    if mode == ReadMode::Log && layout.features.outbox {
        parts.push(
            "-- Not DDL: the starting checkpoint. `outboxd init` records the server's current\n\
             -- binlog position for the pipeline when it has none, so the first `run` starts\n\
             -- there; run it once after this script."
                .to_owned(),
        );
    }
    parts.join("\n\n") + "\n"
}
