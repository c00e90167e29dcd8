//! The checkpoint row's reading: the position it holds and the server it was read from
//! (the stream resumes from it, `outboxd init` records one).

use mysql_async::Conn;
use outboxd_connector::ConnectorError;

use crate::client::{query_first, text};
use crate::log::identity::StoredCheckpoint;
use crate::schema::{qualified, sql_string};
use crate::MysqlConnector;

/// Reads the checkpoint row of the connector's pipeline: the position and, unless an
/// older outboxd wrote it, the server it was read from.
pub(crate) async fn load_checkpoint(
    conn: &mut Conn,
    connector: &MysqlConnector,
) -> Result<Option<StoredCheckpoint>, ConnectorError> {
    let table = &connector.layout.checkpoint_table;
    let sql = format!(
        "SELECT position FROM {} WHERE pipeline = {}",
        qualified(table),
        sql_string(&connector.pipeline)
    );
    let context = format!("reading the checkpoint from {table}");
    let Some(row) = query_first(conn, &sql, &context).await? else {
        return Ok(None);
    };
    let text = text(&row, 0)?.unwrap_or_default();
    match StoredCheckpoint::parse(&text) {
        Ok(checkpoint) => Ok(Some(checkpoint)),
        Err(_) => Err(ConnectorError::definite(format!(
            "the checkpoint of pipeline `{}` in {table} is `{text}`, not a binlog position; \
             delete the row, run `outboxd init --config <file>` to record the current position \
             and `outboxd recover --config <file>` to rescan INIT rows",
            connector.pipeline
        ))),
    }
}
