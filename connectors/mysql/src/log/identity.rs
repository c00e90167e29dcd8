//! Which server a checkpoint was read from.
//!
//! A binlog coordinate means something on one server only: a dump/restore or a migration
//! copies the checkpoint row to a server whose `mysql-bin.000042:1234` is another
//! transaction (or none), and resuming there would skip everything before it. So the
//! checkpoint row carries the identity of the server it was written on, after the
//! position: `binlog:mysql-bin.000042:1234:<gtid set>;server_uuid=3e11fa47-…` (MySQL) or
//! `binlog:mariadb-bin.000002:1234:0-1-9;server_id=1;domain=0` (MariaDB, which has no
//! server UUID). The column stays text; a row written by an older outboxd has no suffix
//! and is accepted, then rewritten with it.
//!
//! MariaDB's `server_id` and `gtid_domain_id` are often the same on every server, so the
//! stream also compares the GTID position the checkpoint records with the one this server
//! has at that coordinate (see `server::verify_checkpoint`).

use std::fmt;

use mysql_async::Conn;
use outboxd_connector::{ConnectorError, ParsePositionError};

use crate::log::position::BinlogPosition;
use crate::log::server::{variable, ServerInfo};

/// What tells one server from another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ServerIdentity {
    /// MySQL: `@@server_uuid`.
    Mysql {
        /// `@@server_uuid`, lower case.
        uuid: String,
    },
    /// MariaDB: `@@server_id` and `@@gtid_domain_id`.
    MariaDb {
        /// `@@server_id`.
        server_id: u32,
        /// `@@gtid_domain_id`.
        domain: u32,
    },
}

impl ServerIdentity {
    /// The identity of the server `conn` is connected to.
    pub(crate) async fn of(
        conn: &mut Conn,
        server: &ServerInfo,
    ) -> Result<ServerIdentity, ConnectorError> {
        let missing =
            |name: &str| ConnectorError::definite(format!("the server has no usable @@{name}"));
        if server.mariadb {
            let number = |value: Option<String>, name: &str| {
                value
                    .and_then(|v| v.trim().parse::<u32>().ok())
                    .ok_or_else(|| missing(name))
            };
            let server_id = number(variable(conn, "server_id").await?, "server_id")?;
            let domain = number(variable(conn, "gtid_domain_id").await?, "gtid_domain_id")?;
            Ok(ServerIdentity::MariaDb { server_id, domain })
        } else {
            let uuid = variable(conn, "server_uuid")
                .await?
                .filter(|u| !u.trim().is_empty())
                .ok_or_else(|| missing("server_uuid"))?;
            Ok(ServerIdentity::Mysql {
                uuid: uuid.trim().to_ascii_lowercase(),
            })
        }
    }

    /// Parses the suffix written by [`fmt::Display`] (without its leading `;`).
    fn parse(text: &str) -> Option<ServerIdentity> {
        let mut uuid = None;
        let (mut server_id, mut domain) = (None, None);
        for field in text.split(';') {
            let (key, value) = field.split_once('=')?;
            match key {
                "server_uuid" if !value.is_empty() => uuid = Some(value.to_ascii_lowercase()),
                "server_id" => server_id = Some(value.parse().ok()?),
                "domain" => domain = Some(value.parse().ok()?),
                _ => return None,
            }
        }
        match (uuid, server_id, domain) {
            (Some(uuid), None, None) => Some(ServerIdentity::Mysql { uuid }),
            (None, Some(server_id), Some(domain)) => {
                Some(ServerIdentity::MariaDb { server_id, domain })
            }
            _ => None,
        }
    }
}

impl fmt::Display for ServerIdentity {
    /// The form stored after the position: `server_uuid=…` or `server_id=1;domain=0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerIdentity::Mysql { uuid } => write!(f, "server_uuid={uuid}"),
            ServerIdentity::MariaDb { server_id, domain } => {
                write!(f, "server_id={server_id};domain={domain}")
            }
        }
    }
}

/// A checkpoint row's text: the position, and the server it was written on (`None` when
/// an older outboxd wrote it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoredCheckpoint {
    pub(crate) position: BinlogPosition,
    pub(crate) server: Option<ServerIdentity>,
}

impl StoredCheckpoint {
    /// The text stored for `position` read from server `server`.
    pub(crate) fn text(position: &BinlogPosition, server: &ServerIdentity) -> String {
        format!("{position};{server}")
    }

    /// Parses a checkpoint row's text, with or without the server's identity.
    pub(crate) fn parse(text: &str) -> Result<StoredCheckpoint, ParsePositionError> {
        let (position, server) = match text.split_once(';') {
            Some((position, server)) => {
                let server = ServerIdentity::parse(server).ok_or_else(|| {
                    ParsePositionError(format!(
                        "`{text}` names no server like `;server_uuid=…` or \
                         `;server_id=1;domain=0` after the position"
                    ))
                })?;
                (position, Some(server))
            }
            None => (text, None),
        };
        Ok(StoredCheckpoint {
            position: position.parse()?,
            server,
        })
    }
}

impl fmt::Display for StoredCheckpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.server {
            Some(server) => write!(f, "{};{server}", self.position),
            None => write!(f, "{}", self.position),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_carry_the_server_and_old_ones_still_parse() {
        let mysql = "binlog:mysql-bin.000042:1234:3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5;\
                     server_uuid=3e11fa47-71ca-11e1-9e33-c80aa9429562";
        let maria = "binlog:mariadb-bin.000002:1234:0-1-9;server_id=1;domain=0";
        for text in [mysql, maria] {
            let checkpoint = StoredCheckpoint::parse(text).unwrap();
            assert!(checkpoint.server.is_some(), "{text}");
            assert_eq!(checkpoint.to_string(), text);
            let server = checkpoint.server.as_ref().unwrap();
            assert_eq!(StoredCheckpoint::text(&checkpoint.position, server), text);
        }
        let checkpoint = StoredCheckpoint::parse(maria).unwrap();
        assert_eq!(
            checkpoint.server,
            Some(ServerIdentity::MariaDb {
                server_id: 1,
                domain: 0
            })
        );
        assert_eq!(checkpoint.position.gtid_set.as_deref(), Some("0-1-9"));
        assert_eq!(checkpoint.position.offset, 1234);

        // Written by an older outboxd: no server, accepted as it is.
        for old in ["binlog:mysql-bin.000042:1234", "binlog:b.000001:4:0-1-42"] {
            let checkpoint = StoredCheckpoint::parse(old).unwrap();
            assert_eq!(checkpoint.server, None);
            assert_eq!(checkpoint.to_string(), old);
        }

        for bad in [
            "binlog:b.000001:4;server_id=1",
            "binlog:b.000001:4;server_id=x;domain=0",
            "binlog:b.000001:4;color=blue",
            "binlog:b.000001:4;",
            "lsn:0/1;server_id=1;domain=0",
        ] {
            assert!(StoredCheckpoint::parse(bad).is_err(), "{bad}");
        }
    }
}
