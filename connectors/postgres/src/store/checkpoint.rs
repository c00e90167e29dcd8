//! The checkpoint row's parsing: its position and the cluster that wrote it.

use outboxd_connector::{ConnectorError, Position};

use crate::log::identity::StoredCheckpoint;

/// Parses a checkpoint row's position.
pub(crate) fn parse_checkpoint(
    text: &str,
    table: &str,
    pipeline: &str,
) -> Result<Position, ConnectorError> {
    parse_stored_checkpoint(text, table, pipeline).map(|c| c.position())
}

/// Parses a checkpoint row: its position and the cluster that wrote it.
pub(crate) fn parse_stored_checkpoint(
    text: &str,
    table: &str,
    pipeline: &str,
) -> Result<StoredCheckpoint, ConnectorError> {
    StoredCheckpoint::parse(text).map_err(|e| {
        ConnectorError::definite(format!(
            "the checkpoint of pipeline `{pipeline}` in {table} is corrupt; delete the row to \
             resume from the replication slot's position"
        ))
        .with_source(e)
    })
}
