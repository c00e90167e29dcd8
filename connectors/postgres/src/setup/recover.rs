//! The log half of `outboxd recover` for PostgreSQL: the slot dropped and created again at
//! the server's current position.

use super::init::ensure_publication;
use super::*;
use crate::log::identity::{StoredCheckpoint, SystemIdentity};
use crate::log::position::Lsn;

/// The log half of `outboxd recover`: drops the pipeline's slot (whatever its state, also
/// invalidated) unless a reader holds it, makes sure the publication exists, and creates
/// the slot again at the server's current WAL position. Returns what it did, one sentence.
///
/// Everything committed before the new slot's consistent point is not in its log: the
/// caller publishes the INIT rows by scanning the table.
pub(crate) async fn reset_log_position(c: &PostgresConnector) -> Result<String, ConnectorError> {
    let client = c.sql_client().await?;
    let layout = c.layout();
    let slot_name = c.slot();
    let publication = c.publication();
    let in_use = |pid: &str| {
        ConnectorError::definite(format!(
            "replication slot `{slot_name}` is in use by server process {pid} (another outboxd \
             running on this pipeline?): stop the running outboxd first, then run \
             `outboxd recover --config <file>` again"
        ))
    };

    let row = query_one(
        &client,
        "SELECT current_setting('server_version_num')::int",
        &[],
        "reading the server version",
    )
    .await?;
    let version: i32 = get(&row, 0)?;
    // Before the slot is dropped: it could not be created again as configured.
    refuse_failover_unsupported(c, version)?;
    let mut said = Vec::new();
    match slot_info(&client, &slot_name, version).await? {
        Some(slot) => {
            if let Some(pid) = slot.active_pid {
                return Err(in_use(&pid.to_string()));
            }
            let dropped = client
                .execute("SELECT pg_drop_replication_slot($1)", &[&slot_name])
                .await;
            if let Err(e) = dropped {
                // 55006: it became active since we looked.
                if e.code().map(|c| c.code()) == Some("55006") {
                    return Err(in_use("(just started)"));
                }
                let context = format!("dropping replication slot {slot_name}");
                return Err(classify_pg_error(&e, &context));
            }
            said.push(format!(
                "dropped replication slot {slot_name} (confirmed at {}, wal_status {})",
                slot.confirmed_flush.as_deref().unwrap_or("none"),
                slot.wal_status.as_deref().unwrap_or("unknown"),
            ));
        }
        None => said.push(format!("replication slot {slot_name} did not exist")),
    }
    // The publication before the slot: a slot created first cannot decode the changes
    // made before its publication existed.
    said.push(ensure_publication(&client, layout, &publication).await?);
    let failover = c.config().slot_failover;
    let lsn = create_slot(&client, &slot_name, failover).await?;
    let with = if failover { ", failover" } else { "" };
    said.push(format!(
        "created replication slot {slot_name} (pgoutput{with}) at {lsn}"
    ));
    said.push(reset_checkpoint(c, &client, &lsn).await?);
    Ok(said.join("; "))
}

/// Points the checkpoint row at the new slot's start, naming this cluster, whatever it
/// said before: a row copied from another cluster (or ahead of this one's WAL) would make
/// the relay skip the transactions below it.
async fn reset_checkpoint(
    c: &PostgresConnector,
    client: &Client,
    lsn: &str,
) -> Result<String, ConnectorError> {
    let table = &c.layout().checkpoint_table;
    let lsn = lsn.parse::<Lsn>().map_err(|e| {
        ConnectorError::definite(format!("the new slot's LSN `{lsn}`")).with_source(e)
    })?;
    let system = SystemIdentity::of(client).await?;
    let text = StoredCheckpoint::text(&lsn.position(), &system);
    let sql = format!(
        "INSERT INTO {} AS t (pipeline, position, updated_at) VALUES ($1, $2, now()) \
         ON CONFLICT (pipeline) DO UPDATE SET position = EXCLUDED.position, updated_at = now()",
        qualified(table)
    );
    client
        .execute(&sql, &[&c.pipeline(), &text])
        .await
        .map_err(|e| classify_pg_error(&e, &format!("resetting the checkpoint in {table}")))?;
    Ok(format!(
        "checkpoint of pipeline {} set to {text}",
        c.pipeline()
    ))
}
