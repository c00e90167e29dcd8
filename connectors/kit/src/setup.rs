//! Pieces of `outboxd init` that read the same in every engine.

use outboxd_connector::{ConnectorError, OutboxLayout};

use crate::status;

/// What `init` says of an outbox the application owns (`outbox.rows = "deleted"`, e.g.
/// Debezium's table): it is left as it is, and must exist, since outboxd cannot know
/// its columns' types.
pub fn application_outbox(table: &str, exists: bool) -> Result<String, ConnectorError> {
    if exists {
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

/// What `outboxd schema` prints in place of the outbox DDL when the tables are the
/// application's (`outbox.rows = "deleted"`), as `init` leaves them.
pub fn application_outboxes_comment(layout: &OutboxLayout) -> String {
    format!(
        "-- The application's outbox table(s), not created here (outbox.rows = \"deleted\"): {}",
        layout.outbox_tables.join(", ")
    )
}

/// Whether `outboxd init` and `outboxd schema` leave the table `table` alone: an outbox
/// table the application owns (`outbox.rows = "deleted"`).
pub fn is_application_outbox(layout: &OutboxLayout, table: &str) -> bool {
    !layout.tracks_status() && layout.outbox_tables.iter().any(|t| t == table)
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
