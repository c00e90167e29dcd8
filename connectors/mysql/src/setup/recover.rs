//! The log half of `outboxd recover` for MySQL and MariaDB: the checkpoint reset to the
//! server's current binlog position.

use super::*;

/// `outboxd recover`: records the server's current binlog position as the checkpoint,
/// whatever the row said (the caller then publishes every INIT row).
pub(crate) async fn reset_log_position(c: &MysqlConnector) -> Result<String, ConnectorError> {
    let mut conn = c.sql_conn().await?;
    if let Some(id) = lock_holder(&mut conn, c).await? {
        return Err(ConnectorError::definite(format!(
            "pipeline `{}` is running (connection id {id} holds {}): stop that outboxd before \
             `recover`",
            c.pipeline(),
            c.lock_name()
        )));
    }
    let server = server::info(&mut conn).await?;
    let position = server::current_position(&mut conn, &server).await?;
    // Named for this server: a checkpoint another server wrote (or from before a binlog
    // reset) is replaced whatever it said, even when it was ahead.
    let identity = ServerIdentity::of(&mut conn, &server).await?;
    let table = qualified(&c.layout().checkpoint_table);
    let sql = format!(
        "INSERT INTO {table} (pipeline, position, updated_at) VALUES ({pipeline}, {value}, NOW(6)) \
         ON DUPLICATE KEY UPDATE position = {value}, updated_at = NOW(6)",
        pipeline = sql_string(c.pipeline()),
        value = sql_string(&StoredCheckpoint::text(&position, &identity)),
    );
    execute(&mut conn, &sql, "resetting the checkpoint").await?;
    Ok(format!(
        "checkpoint of pipeline {} reset to the server's current position {position} \
         ({identity})",
        c.pipeline()
    ))
}
