//! Which cluster a checkpoint was written on.
//!
//! An LSN means something in one cluster only. A dump/restore or a migration copies the
//! checkpoint row to a cluster whose WAL is another history, and the relay would take
//! every transaction below the copied LSN for one it had already written back, and skip
//! it. So the checkpoint row carries the cluster's identity after the LSN:
//! `lsn:16/B374D848;system=7291234567890123456;timeline=1`. The column stays text; a row
//! written by an older outboxd has no suffix and is accepted, then rewritten with it.
//!
//! Only the system identifier is compared. The timeline is stored for the operator: a
//! promoted standby or a point-in-time restore of the same cluster shares the history
//! the checkpoint was read from, and the checkpoint row restored with the data is never
//! ahead of it.

use std::fmt;

use outboxd_connector::{ConnectorError, ErrorReason, ParsePositionError, Position};
use tokio_postgres::Client;

use crate::client::classify_pg_error;
use crate::log::position::Lsn;
use crate::schema::qualified;
use crate::PostgresConnector;

/// What tells one PostgreSQL cluster from another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SystemIdentity {
    /// `pg_control_system().system_identifier`, set by `initdb`.
    pub(crate) system_id: u64,
    /// The timeline of the last checkpoint (`pg_control_checkpoint().timeline_id`).
    pub(crate) timeline: u32,
}

impl SystemIdentity {
    /// The identity of the cluster `client` is connected to.
    pub(crate) async fn of(client: &Client) -> Result<SystemIdentity, ConnectorError> {
        let context = "reading the system identifier (pg_control_system())";
        let row = client
            .query_one(
                "SELECT s.system_identifier::text, c.timeline_id::bigint \
                 FROM pg_control_system() s, pg_control_checkpoint() c",
                &[],
            )
            .await
            .map_err(|e| classify_pg_error(&e, context))?;
        let bad = || ConnectorError::definite(format!("unexpected answer {context}"));
        let system_id: String = row.try_get(0).map_err(|_| bad())?;
        let timeline: i64 = row.try_get(1).map_err(|_| bad())?;
        Ok(SystemIdentity {
            system_id: system_id.parse().map_err(|_| bad())?,
            timeline: u32::try_from(timeline).map_err(|_| bad())?,
        })
    }

    /// Parses the suffix written by [`fmt::Display`] (without its leading `;`).
    fn parse(text: &str) -> Option<SystemIdentity> {
        let (mut system_id, mut timeline) = (None, None);
        for field in text.split(';') {
            match field.split_once('=')? {
                ("system", v) => system_id = Some(v.parse().ok()?),
                ("timeline", v) => timeline = Some(v.parse().ok()?),
                _ => return None,
            }
        }
        Some(SystemIdentity {
            system_id: system_id?,
            timeline: timeline?,
        })
    }
}

impl fmt::Display for SystemIdentity {
    /// The form stored after the LSN: `system=7291234567890123456;timeline=1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "system={};timeline={}", self.system_id, self.timeline)
    }
}

/// A checkpoint row's text: the LSN, and the cluster it was written on (`None` when an
/// older outboxd wrote it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StoredCheckpoint {
    pub(crate) lsn: Lsn,
    pub(crate) system: Option<SystemIdentity>,
}

impl StoredCheckpoint {
    /// The text stored for `position` (one of this connector's) read from `system`.
    pub(crate) fn text(position: &Position, system: &SystemIdentity) -> String {
        format!("{position};{system}")
    }

    /// Parses a checkpoint row's text, with or without the cluster's identity.
    pub(crate) fn parse(text: &str) -> Result<StoredCheckpoint, ParsePositionError> {
        let (lsn, system) = match text.split_once(';') {
            Some((lsn, system)) => {
                let system = SystemIdentity::parse(system).ok_or_else(|| {
                    ParsePositionError(format!(
                        "`{text}` names no cluster like `;system=…;timeline=…` after the LSN"
                    ))
                })?;
                (lsn, Some(system))
            }
            None => (text, None),
        };
        Ok(StoredCheckpoint {
            lsn: Lsn::from_text(lsn)?,
            system,
        })
    }

    /// The checkpoint's position, as the stream makes them.
    pub(crate) fn position(&self) -> Position {
        self.lsn.position()
    }

    /// Refuses a checkpoint written on another cluster than `here`.
    pub(crate) fn verify(
        &self,
        here: &SystemIdentity,
        table: &str,
        pipeline: &str,
    ) -> Result<(), ConnectorError> {
        match &self.system {
            Some(theirs) if theirs.system_id != here.system_id => Err(foreign_checkpoint_error(
                self, theirs, here, table, pipeline,
            )),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for StoredCheckpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.position())?;
        if let Some(system) = &self.system {
            write!(f, ";{system}")?;
        }
        Ok(())
    }
}

fn foreign_checkpoint_error(
    checkpoint: &StoredCheckpoint,
    theirs: &SystemIdentity,
    here: &SystemIdentity,
    table: &str,
    pipeline: &str,
) -> ConnectorError {
    ConnectorError::definite(format!(
        "the checkpoint of pipeline `{pipeline}` in {table} (at {}) was written on another \
         PostgreSQL cluster (system identifier {}, this one is {}): it was copied by a \
         dump/restore or a migration, and its LSN means nothing here, so resuming with it \
         would skip transactions; nothing was read. Run `outboxd recover --config <file>` to \
         start at this cluster's current position and publish the INIT rows",
        checkpoint.lsn, theirs.system_id, here.system_id
    ))
    .with_reason(ErrorReason::PositionLost)
}

/// Reads the pipeline's checkpoint row on `client` and refuses it when another cluster
/// wrote it. Returns the row (`None` when there is none yet) and this cluster's identity.
pub(crate) async fn verify_checkpoint(
    connector: &PostgresConnector,
    client: &Client,
) -> Result<(Option<StoredCheckpoint>, SystemIdentity), ConnectorError> {
    let here = SystemIdentity::of(client).await?;
    let table = &connector.layout().checkpoint_table;
    let sql = format!(
        "SELECT position FROM {} WHERE pipeline = $1",
        qualified(table)
    );
    let context = format!("reading the checkpoint from {table}");
    let row = client
        .query_opt(&sql, &[&connector.pipeline()])
        .await
        .map_err(|e| classify_pg_error(&e, &context))?;
    let Some(row) = row else {
        return Ok((None, here));
    };
    let text: String = row
        .try_get(0)
        .map_err(|e| ConnectorError::definite(context.clone()).with_source(e))?;
    let checkpoint = crate::store::parse_stored_checkpoint(&text, table, connector.pipeline())?;
    checkpoint.verify(&here, table, connector.pipeline())?;
    Ok((Some(checkpoint), here))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_carry_the_cluster_and_old_ones_still_parse() {
        let text = "lsn:16/B374D848;system=7291234567890123456;timeline=3";
        let checkpoint = StoredCheckpoint::parse(text).unwrap();
        assert_eq!(checkpoint.lsn, Lsn(0x16_B374_D848));
        let system = SystemIdentity {
            system_id: 7_291_234_567_890_123_456,
            timeline: 3,
        };
        assert_eq!(checkpoint.system, Some(system));
        assert_eq!(checkpoint.to_string(), text);
        assert_eq!(
            StoredCheckpoint::text(&checkpoint.position(), &system),
            text
        );
        assert_eq!(checkpoint.position().as_str(), "lsn:16/B374D848");

        // Written by an older outboxd: no cluster, accepted as it is.
        let old = StoredCheckpoint::parse("lsn:0/16B3748").unwrap();
        assert_eq!((old.lsn, old.system), (Lsn(0x16B_3748), None));
        assert_eq!(old.to_string(), "lsn:0/16B3748");

        for bad in [
            "lsn:0/1;system=1",
            "lsn:0/1;system=x;timeline=1",
            "lsn:0/1;timeline=1;color=blue",
            "lsn:0/1;",
            "binlog:f:4;system=1;timeline=1",
        ] {
            assert!(StoredCheckpoint::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_another_system_identifier_is_refused() {
        let here = SystemIdentity {
            system_id: 7,
            timeline: 2,
        };
        let at = |system| StoredCheckpoint {
            lsn: Lsn(42),
            system,
        };
        let verify = |c: StoredCheckpoint| c.verify(&here, "outboxd_checkpoint", "orders");
        assert!(verify(at(None)).is_ok(), "an older outboxd's row");
        assert!(verify(at(Some(here))).is_ok());
        let promoted = SystemIdentity {
            timeline: 1,
            ..here
        };
        assert!(
            verify(at(Some(promoted))).is_ok(),
            "same cluster, earlier timeline"
        );
        let other = SystemIdentity {
            system_id: 8,
            timeline: 2,
        };
        let err = verify(at(Some(other))).unwrap_err();
        assert_eq!(err.reason(), ErrorReason::PositionLost);
        assert!(!err.is_transient());
        assert!(
            err.message().contains("outboxd recover --config <file>"),
            "{err}"
        );
    }
}
