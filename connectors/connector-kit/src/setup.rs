//! Pieces of `outboxd init` that read the same in every engine.

use outboxd_connector::{ConnectorError, OutboxLayout};

use crate::{columns, status};

/// What `init` says of an outbox the application owns (`outbox.rows = "deleted"`, or
/// kept rows on a table `outbox.columns` maps, e.g. Debezium's table): it is left as it
/// is (`init --add-columns` adds the status columns), and must exist, since outboxd
/// cannot know its columns' types.
pub fn application_outbox(
    layout: &OutboxLayout,
    table: &str,
    exists: bool,
) -> Result<String, ConnectorError> {
    if exists && layout.tracks_status() {
        Ok(format!(
            "table {table}: the application's outbox (outbox.columns), its columns left as \
             they are"
        ))
    } else if exists {
        Ok(format!(
            "table {table}: the application's outbox (outbox.rows = \"deleted\"), left as it is"
        ))
    } else {
        Err(ConnectorError::definite(format!(
            "outbox table {table} does not exist: with outbox.rows = \"deleted\" it is the \
             application's table (e.g. Debezium's outbox), which outboxd does not create; \
             create it first, then run `outboxd init` again"
        )))
    }
}

/// What `init` says of each outbox table when they are the application's
/// ([`application_outbox`]), `existed` saying whether each of `layout.outbox_tables` is
/// there (none looked at: nothing said); nothing when outboxd owns its outbox.
pub fn application_outboxes(
    layout: &OutboxLayout,
    existed: &[bool],
) -> Result<Vec<String>, ConnectorError> {
    debug_assert!(existed.is_empty() || existed.len() == layout.outbox_tables.len());
    if !owns_no_outbox(layout) {
        return Ok(Vec::new());
    }
    (layout.outbox_tables.iter().zip(existed))
        .map(|(table, existed)| application_outbox(layout, table, *existed))
        .collect()
}

/// What `outboxd schema` prints in place of the outbox DDL when the tables are the
/// application's (`outbox.rows = "deleted"`), as `init` leaves them.
pub fn application_outboxes_comment(layout: &OutboxLayout) -> String {
    format!(
        "-- The application's outbox table(s), not created here (outbox.rows = \"deleted\"): {}",
        layout.outbox_tables.join(", ")
    )
}

/// Whether `outboxd init` and `outboxd schema` leave the table `table` alone: an outbox
/// table the application owns (`outbox.rows = "deleted"`, or columns mapped by
/// `outbox.columns`; `init --add-columns` adds the status columns to the latter).
pub fn is_application_outbox(layout: &OutboxLayout, table: &str) -> bool {
    owns_no_outbox(layout) && layout.outbox_tables.iter().any(|t| t == table)
}

/// What `init --add-columns` says when the layout has nothing to add to.
pub fn nothing_to_add() -> String {
    "--add-columns: nothing to add (outboxd's own table is created whole by `init`; deleted \
     rows carry no status)"
        .to_owned()
}

/// The error of `init --add-columns` for an application's table that does not exist.
pub fn application_table_missing(table: &str) -> ConnectorError {
    ConnectorError::definite(format!(
        "outbox table {table} does not exist: it is the application's table (outbox.columns), \
         which outboxd does not create; create it first"
    ))
}

/// What `init --add-columns` did to `table`: added `missing` (by name), and the indexes.
pub fn added_columns_line(table: &str, missing: &[&str]) -> String {
    if missing.is_empty() {
        format!("table {table}: has every column outboxd writes (and its retry indexes)")
    } else {
        format!(
            "added column(s) {} to table {table}, and its retry indexes (rows already there: \
             SUCCESS, not sent)",
            missing.join(", ")
        )
    }
}

/// What `check` says to do about a missing outbox table: outboxd's own is created by
/// `init` (`create_own`, the engine's words); the application's is not.
pub fn missing_outbox_fix(layout: &OutboxLayout, create_own: String) -> String {
    if owns_no_outbox(layout) {
        "it is the application's table (outbox.layout / outbox.columns), which outboxd does \
         not create: create it, then run `outboxd init`"
            .to_owned()
    } else {
        create_own
    }
}

/// Whether the outbox tables are the application's, not outboxd's own.
pub fn owns_no_outbox(layout: &OutboxLayout) -> bool {
    !layout.tracks_status() || !columns::is_outboxd_table(layout)
}

/// The error of `init` when an application's table with kept rows lacks the columns
/// outboxd writes (`missing`, by name).
pub fn columns_to_add(table: &str, missing: &[&str]) -> ConnectorError {
    ConnectorError::definite(format!(
        "outbox table {table} lacks column(s) {}: run `outboxd init --add-columns` to add \
         them (rows already there become SUCCESS: they are not sent), or add them by hand \
         (`outboxd schema` prints the statements)",
        missing.join(", ")
    ))
}

/// Counts the outbox's INIT rows; `quoted_table` as the engine's SQL writes the name.
pub fn count_init_sql(quoted_table: &str) -> String {
    format!(
        "SELECT COUNT(*) FROM {quoted_table} WHERE status = '{}'",
        status::INIT
    )
}

/// The note `init` adds when INIT rows predate the log position it just recorded (they
/// are not in the log it will read): `since` names that position ("the checkpoint",
/// "the slot existed").
pub fn init_rows_note(count: i64, table: &str, since: &str) -> Option<String> {
    (count > 0).then(|| {
        format!(
            "note: {count} rows of {table} are in INIT from before {since}; run `outboxd \
             recover` to publish them"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn note_only_when_rows_wait() {
        assert_eq!(init_rows_note(0, "outbox", "the checkpoint"), None);
        assert_eq!(
            init_rows_note(3, "outbox", "the checkpoint").as_deref(),
            Some(
                "note: 3 rows of outbox are in INIT from before the checkpoint; run `outboxd \
                 recover` to publish them"
            )
        );
        assert_eq!(
            count_init_sql("`o`"),
            "SELECT COUNT(*) FROM `o` WHERE status = 'INIT'"
        );
    }
}
