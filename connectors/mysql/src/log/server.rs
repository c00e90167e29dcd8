//! What the server says about its binlog: flavor, settings, current position, files, and
//! whether a checkpoint can still be resumed from.

use mysql_async::Conn;
use outboxd_connector::{ConnectorError, ErrorReason};

use crate::client::{classify, int, query, query_first, text, text_or_empty};
use crate::log::gtid::{GtidState, MariaDbGtidPos};
use crate::log::identity::{ServerIdentity, StoredCheckpoint};
use crate::log::position::BinlogPosition;
use crate::schema::sql_string;

/// The server's flavor and version.
#[derive(Clone, Debug)]
pub(crate) struct ServerInfo {
    /// `VERSION()`, e.g. `10.11.6-MariaDB-0+deb12u1-log`.
    pub(crate) version: String,
    pub(crate) mariadb: bool,
}

pub(crate) async fn info(conn: &mut Conn) -> Result<ServerInfo, ConnectorError> {
    let row = query_first(conn, "SELECT VERSION()", "reading the server version")
        .await?
        .ok_or_else(|| ConnectorError::definite("SELECT VERSION() returned no row"))?;
    let version = text_or_empty(&row, 0)?;
    Ok(ServerInfo {
        mariadb: version.to_ascii_lowercase().contains("mariadb"),
        version,
    })
}

/// A global variable's value, `None` when the server does not have it.
pub(crate) async fn variable(
    conn: &mut Conn,
    name: &str,
) -> Result<Option<String>, ConnectorError> {
    let sql = format!("SELECT @@GLOBAL.{name}");
    match conn.query_first::<mysql_async::Row, _>(sql).await {
        Ok(Some(row)) => text(&row, 0),
        Ok(None) => Ok(None),
        // 1193: unknown system variable.
        Err(mysql_async::Error::Server(e)) if e.code == 1193 => Ok(None),
        Err(e) => Err(classify(&e, &format!("reading @@{name}"))),
    }
}

use mysql_async::prelude::Queryable;

/// The server's current binlog position (`SHOW MASTER STATUS`, or `SHOW BINARY LOG STATUS`
/// where MySQL 8.4 removed the former), with its GTID state when GTIDs are on.
pub(crate) async fn current_position(
    conn: &mut Conn,
    server: &ServerInfo,
) -> Result<BinlogPosition, ConnectorError> {
    let context = "reading the current binlog position";
    let row = match conn
        .query_first::<mysql_async::Row, _>("SHOW MASTER STATUS")
        .await
    {
        Ok(row) => row,
        // 1064: syntax error (MySQL 8.4+).
        Err(mysql_async::Error::Server(e)) if e.code == 1064 => {
            query_first(conn, "SHOW BINARY LOG STATUS", context).await?
        }
        Err(e) => return Err(classify(&e, context)),
    };
    let Some(row) = row else {
        return Err(ConnectorError::definite(
            "the server has no binary log (log_bin is OFF): enable it (log_bin, binlog_format = \
             ROW, binlog_row_image = FULL, a server_id) and restart the server",
        ));
    };
    let file = text_or_empty(&row, 0)?;
    let offset = int(&row, 1)?.unwrap_or(4);
    let offset = u64::try_from(offset).unwrap_or(4);
    let gtid_set = if server.mariadb {
        mariadb_gtid_at(conn, &file, offset).await?
    } else if gtid_mode_on(conn).await? {
        // Executed_Gtid_Set, read together with the file and position.
        if row.len() > 4 {
            Some(
                text_or_empty(&row, 4)?
                    .chars()
                    .filter(|c| !c.is_whitespace())
                    .collect(),
            )
        } else {
            None
        }
    } else {
        None
    };
    Ok(BinlogPosition {
        file,
        offset,
        gtid_set,
    })
}

/// MySQL: `gtid_mode` is ON (or ON_PERMISSIVE). MariaDB always has GTIDs.
pub(crate) async fn gtid_mode_on(conn: &mut Conn) -> Result<bool, ConnectorError> {
    Ok(variable(conn, "gtid_mode")
        .await?
        .is_some_and(|m| m.to_ascii_uppercase().starts_with("ON")))
}

/// MariaDB: the GTID position at a binlog coordinate (`BINLOG_GTID_POS`).
pub(crate) async fn mariadb_gtid_at(
    conn: &mut Conn,
    file: &str,
    offset: u64,
) -> Result<Option<String>, ConnectorError> {
    let sql = format!("SELECT BINLOG_GTID_POS({}, {offset})", sql_string(file));
    let row = query_first(conn, &sql, "reading the GTID position of the binlog").await?;
    match row {
        Some(row) => text(&row, 0),
        None => Ok(None),
    }
}

/// `SHOW BINARY LOGS`: (file, size) of every binlog the server still has.
pub(crate) async fn binary_logs(conn: &mut Conn) -> Result<Vec<(String, u64)>, ConnectorError> {
    let rows = query(conn, "SHOW BINARY LOGS", "listing the binary logs").await?;
    let mut logs = Vec::with_capacity(rows.len());
    for row in &rows {
        let size = int(row, 1)?
            .and_then(|s| u64::try_from(s).ok())
            .unwrap_or(0);
        logs.push((text_or_empty(row, 0)?, size));
    }
    Ok(logs)
}

/// The error for a checkpoint whose binlog is gone.
pub(crate) fn purged_error(file: &str, pipeline: &str, detail: &str) -> ConnectorError {
    ConnectorError::definite(format!(
        "binlog `{file}` needed to resume pipeline `{pipeline}` was purged{detail}; run \
         `outboxd recover --config <file>` to rescan INIT rows"
    ))
    .with_reason(ErrorReason::PositionLost)
}

/// Checks that pipeline `pipeline` can resume from `checkpoint` on this server: the row
/// was written here (when it says where: rows of older outboxd versions do not), the
/// binlog is still here, and the GTIDs the checkpoint counted are this server's at that
/// coordinate. A checkpoint copied from another server (dump/restore, migration) or left
/// over a `RESET MASTER` names a coordinate that means something else here: resuming
/// there would skip transactions, so it is a definite error naming `outboxd recover`.
pub(crate) async fn verify_checkpoint(
    conn: &mut Conn,
    server: &ServerInfo,
    identity: &ServerIdentity,
    checkpoint: &StoredCheckpoint,
    pipeline: &str,
) -> Result<(), ConnectorError> {
    let position = &checkpoint.position;
    if let Some(theirs) = checkpoint.server.as_ref().filter(|s| *s != identity) {
        return Err(foreign_checkpoint_error(
            position,
            pipeline,
            &format!("was written on another server ({theirs}; this server has {identity})"),
        ));
    }
    check_available(conn, server, position, pipeline).await?;
    check_gtid_at(conn, server, position, pipeline).await
}

/// The error for a checkpoint that does not belong to this server's binlog.
pub(crate) fn foreign_checkpoint_error(
    position: &BinlogPosition,
    pipeline: &str,
    why: &str,
) -> ConnectorError {
    ConnectorError::definite(format!(
        "the checkpoint of pipeline `{pipeline}` ({position}) {why}: it was copied from another \
         server (a dump/restore or a migration) or this server's binlog was reset, so resuming \
         from it would skip transactions; nothing was read. Run `outboxd recover --config \
         <file>` to start at this server's current position and publish the INIT rows"
    ))
    .with_reason(ErrorReason::PositionLost)
}

/// The GTIDs the checkpoint counted against this server's: MariaDB's GTID position at
/// the coordinate (`BINLOG_GTID_POS`) must be the checkpoint's; on MySQL every GTID of
/// the checkpoint must have been executed here. Without GTIDs in the checkpoint there is
/// nothing to compare.
async fn check_gtid_at(
    conn: &mut Conn,
    server: &ServerInfo,
    position: &BinlogPosition,
    pipeline: &str,
) -> Result<(), ConnectorError> {
    let Some(gtid) = position.gtid_set.as_deref() else {
        return Ok(());
    };
    if server.mariadb {
        let Some(ours) = MariaDbGtidPos::parse(gtid) else {
            return Ok(());
        };
        let here = mariadb_gtid_at(conn, &position.file, position.offset).await?;
        // NULL: the coordinate is not an event boundary of this server's binlog.
        let here_pos = here.as_deref().and_then(MariaDbGtidPos::parse);
        if here_pos.as_ref() != Some(&ours) {
            let found = here.map_or_else(
                || "no event boundary there".to_owned(),
                |h| format!("GTID position `{h}` there"),
            );
            return Err(foreign_checkpoint_error(
                position,
                pipeline,
                &format!(
                    "counts GTID position `{gtid}`, but this server's binlog `{}` has {found}",
                    position.file
                ),
            ));
        }
    } else if GtidState::parse(gtid, false).is_some() && gtid_mode_on(conn).await? {
        let sql = format!(
            "SELECT GTID_SUBSET({}, @@GLOBAL.gtid_executed)",
            sql_string(gtid)
        );
        let row = query_first(conn, &sql, "comparing the checkpoint with gtid_executed").await?;
        let subset = match row {
            Some(row) => int(&row, 0)?.unwrap_or(0),
            None => 0,
        };
        if subset != 1 {
            return Err(foreign_checkpoint_error(
                position,
                pipeline,
                "counts GTIDs this server never executed",
            ));
        }
    }
    Ok(())
}

/// Checks that the server can still stream from `position`: its file is listed and long
/// enough, and (MySQL with GTIDs) no transaction after it was purged.
pub(crate) async fn check_available(
    conn: &mut Conn,
    server: &ServerInfo,
    position: &BinlogPosition,
    pipeline: &str,
) -> Result<(), ConnectorError> {
    let logs = binary_logs(conn).await?;
    let Some((_, size)) = logs.iter().find(|(name, _)| *name == position.file) else {
        let oldest = logs
            .first()
            .map(|(name, _)| format!(" (the oldest binlog on the server is `{name}`)"))
            .unwrap_or_default();
        return Err(purged_error(&position.file, pipeline, &oldest));
    };
    if position.offset > *size {
        return Err(ConnectorError::definite(format!(
            "binlog `{}` on the server is {size} bytes, shorter than the checkpoint offset {} of \
             pipeline `{pipeline}` (was RESET MASTER run?); run `outboxd recover --config <file>` \
             to rescan INIT rows",
            position.file, position.offset
        )));
    }
    if let (false, Some(gtid)) = (server.mariadb, &position.gtid_set) {
        if GtidState::parse(gtid, false).is_some() && gtid_mode_on(conn).await? {
            let sql = format!(
                "SELECT GTID_SUBSET(@@GLOBAL.gtid_purged, {})",
                sql_string(gtid)
            );
            let row = query_first(conn, &sql, "comparing the checkpoint with gtid_purged").await?;
            let subset = match row {
                Some(row) => int(&row, 0)?.unwrap_or(0),
                None => 0,
            };
            if subset != 1 {
                return Err(purged_error(
                    &position.file,
                    pipeline,
                    " (gtid_purged holds transactions the checkpoint has not seen)",
                ));
            }
        }
    }
    Ok(())
}
