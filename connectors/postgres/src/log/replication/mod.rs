//! The streaming-replication wire protocol, spoken with `postgres-protocol`'s codecs over
//! tokio (tokio-postgres has no CopyBoth mode).
//!
//! [`ReplicationConnection::connect`] opens a `replication=database` session: TLS per
//! the config's TLS keys (the same verification as the SQL connections, `crate::tls`),
//! then trust, certificate, cleartext, MD5 (both only over a verified channel unless
//! `allow_insecure_password`) or SCRAM-SHA-256 authentication, with channel binding
//! (SCRAM-SHA-256-PLUS, tls-server-end-point) whenever TLS is on and the server offers it. On it,
//! [`ReplicationConnection::simple_query`] runs replication commands (`IDENTIFY_SYSTEM`,
//! `CREATE_REPLICATION_SLOT`, ...) and [`ReplicationConnection::start_logical_replication`]
//! switches to CopyBoth, giving a [`ReplicationStream`] of XLogData and keepalive messages
//! on which standby status updates are sent.
//!
//! The files follow the protocol's phases, so that each reads as one exchange: this file
//! holds the session and its commands (simple queries, `IDENTIFY_SYSTEM`,
//! `START_REPLICATION`); `startup.rs` the way in (SSLRequest, the startup message and
//! authentication), which is where the security decisions are; `wire.rs` the framing of
//! backend messages and the errors they carry, shared by every phase and kept pure so the
//! fuzzers reach it; `copy_both.rs` the CopyBoth phase after `START_REPLICATION`: the
//! [`ReplicationStream`] of XLogData and keepalives and the standby status updates.

use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use outboxd_connector::ConnectorError;
use outboxd_connector_kit::net::MaybeTls;
use outboxd_connector_kit::tls::Negotiated;
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use tokio::net::TcpStream;
use tokio_openssl::SslStream;

use super::position::Lsn;
use crate::tls::{tls_server_end_point, PgTls};
use crate::PostgresConfig;

mod copy_both;
mod startup;
mod wire;

pub use copy_both::{standby_status_update, ReplicationMessage, ReplicationStream};
use startup::negotiate_tls;
#[cfg(feature = "fuzzing")]
pub(crate) use wire::next_backend;
use wire::server_error;
pub(crate) use wire::Backend;

/// The socket: plain TCP or TLS over TCP.
type PgStream = MaybeTls<SslStream<TcpStream>>;

/// The rows of a simple query, every value in text form.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueryResult {
    /// Column names of the last result set.
    pub columns: Vec<String>,
    /// Rows of the last result set; `None` is SQL NULL.
    pub rows: Vec<Vec<Option<String>>>,
}

impl QueryResult {
    /// The value of column `name` in row `row`, if both exist and it is not NULL.
    pub fn get(&self, row: usize, name: &str) -> Option<&str> {
        let col = self.columns.iter().position(|c| c == name)?;
        self.rows.get(row)?.get(col)?.as_deref()
    }
}

/// The answer to `IDENTIFY_SYSTEM`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentifySystem {
    /// The cluster's system identifier.
    pub system_id: String,
    /// Current timeline.
    pub timeline: u32,
    /// Current WAL flush location.
    pub xlogpos: Lsn,
    /// The database connected to.
    pub dbname: Option<String>,
}

/// A `replication=database` session, before `START_REPLICATION`.
#[derive(Debug)]
pub struct ReplicationConnection {
    io: PgStream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    endpoint: String,
    tls: bool,
    negotiated: Negotiated,
    /// tls-server-end-point of the server's certificate, when over TLS.
    channel_binding: Option<Vec<u8>>,
}

impl ReplicationConnection {
    /// Connects, negotiates TLS per `config.sslmode` and authenticates, all within
    /// `config.connect_timeout`.
    pub async fn connect(config: &PostgresConfig) -> Result<Self, ConnectorError> {
        let endpoint = format!("{}:{}/{}", config.host, config.port, config.database);
        match tokio::time::timeout(
            config.connect_timeout,
            Self::connect_inner(config, &endpoint),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(ConnectorError::transient(format!(
                "replication connection to PostgreSQL at {endpoint}: timed out after {:?}",
                config.connect_timeout
            ))),
        }
    }

    async fn connect_inner(
        config: &PostgresConfig,
        endpoint: &str,
    ) -> Result<Self, ConnectorError> {
        let context = format!("replication connection to PostgreSQL at {endpoint}");
        let tcp = TcpStream::connect((config.host.as_str(), config.port))
            .await
            .map_err(|e| ConnectorError::transient(context.clone()).with_source(e))?;
        // Keepalive traffic is small and latency matters for status updates.
        let _ = tcp.set_nodelay(true);
        outboxd_connector_kit::net::detect_dead_peers(&tcp);
        let tls = PgTls::for_config(config)?;
        let (io, negotiated) = negotiate_tls(tcp, config, &tls, &context).await?;
        let channel_binding = match &io {
            PgStream::Tls(stream) => tls_server_end_point(stream.ssl()),
            PgStream::Plain(_) => None,
        };
        let mut conn = Self {
            io,
            rbuf: BytesMut::with_capacity(64 * 1024),
            wbuf: BytesMut::with_capacity(1024),
            endpoint: endpoint.to_owned(),
            tls: negotiated != Negotiated::Plain,
            negotiated,
            channel_binding,
        };
        conn.startup(config, &tls).await?;
        tracing::debug!(
            endpoint,
            tls = conn.tls,
            "replication connection established"
        );
        Ok(conn)
    }

    /// True when the session runs over TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// What the session's TLS negotiated and verified.
    pub fn negotiated(&self) -> &Negotiated {
        &self.negotiated
    }

    /// Runs `sql` with the simple query protocol and returns the rows of its last result
    /// set as text. A server error is classified by SQLSTATE.
    pub async fn simple_query(&mut self, sql: &str) -> Result<QueryResult, ConnectorError> {
        frontend::query(sql, &mut self.wbuf)
            .map_err(|e| self.protocol_error("encoding a query", e))?;
        self.flush().await?;
        let mut result = QueryResult::default();
        let mut error = None;
        loop {
            let message = match self.read_backend().await? {
                Backend::Message(m) => m,
                Backend::CopyBothResponse => return Err(self.unexpected("CopyBothResponse")),
            };
            match message {
                Message::RowDescription(body) => {
                    result = QueryResult::default();
                    let mut fields = body.fields();
                    while let Some(f) = fields
                        .next()
                        .map_err(|e| self.protocol_error("RowDescription", e))?
                    {
                        result.columns.push(f.name().to_owned());
                    }
                }
                Message::DataRow(body) => {
                    let buf = body.buffer();
                    let mut ranges = body.ranges();
                    let mut row = Vec::with_capacity(result.columns.len());
                    while let Some(range) = ranges
                        .next()
                        .map_err(|e| self.protocol_error("DataRow", e))?
                    {
                        row.push(range.map(|r| {
                            String::from_utf8_lossy(buf.get(r).unwrap_or_default()).into_owned()
                        }));
                    }
                    result.rows.push(row);
                }
                Message::ErrorResponse(body) => {
                    error = Some(server_error(
                        body.fields(),
                        &format!("{} running `{sql}`", self.context()),
                    ));
                }
                Message::ReadyForQuery(_) => break,
                Message::CommandComplete(_)
                | Message::EmptyQueryResponse
                | Message::NoticeResponse(_)
                | Message::ParameterStatus(_) => {}
                _ => return Err(self.unexpected("message in a simple query")),
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(result),
        }
    }

    /// `IDENTIFY_SYSTEM`.
    pub async fn identify_system(&mut self) -> Result<IdentifySystem, ConnectorError> {
        let r = self.simple_query("IDENTIFY_SYSTEM").await?;
        let bad = || self.unexpected("IDENTIFY_SYSTEM answer");
        Ok(IdentifySystem {
            system_id: r.get(0, "systemid").ok_or_else(bad)?.to_owned(),
            timeline: r
                .get(0, "timeline")
                .and_then(|t| t.parse().ok())
                .ok_or_else(bad)?,
            xlogpos: r
                .get(0, "xlogpos")
                .and_then(|t| t.parse().ok())
                .ok_or_else(bad)?,
            dbname: r.get(0, "dbname").map(str::to_owned),
        })
    }

    /// `START_REPLICATION SLOT <slot> LOGICAL <start> (proto_version '1',
    /// publication_names '<publication>')`. With `start` 0/0 the server resumes at the
    /// slot's `confirmed_flush_lsn`.
    ///
    /// Errors are classified by SQLSTATE: 55006 (slot active for another process) is
    /// transient, 42704 (no such slot) definite.
    pub async fn start_logical_replication(
        mut self,
        slot: &str,
        start: Lsn,
        publication: &str,
    ) -> Result<ReplicationStream, ConnectorError> {
        for (what, name) in [("slot", slot), ("publication", publication)] {
            // Written into the command unquoted, so hold them to the server's slot rule.
            let valid = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !valid {
                return Err(ConnectorError::definite(format!(
                    "{what} name `{name}` is invalid: use a-z, 0-9 and _"
                )));
            }
        }
        let sql = format!(
            "START_REPLICATION SLOT {slot} LOGICAL {start} \
             (proto_version '1', publication_names '{publication}')"
        );
        frontend::query(&sql, &mut self.wbuf)
            .map_err(|e| self.protocol_error("encoding START_REPLICATION", e))?;
        self.flush().await?;
        let mut error = None;
        loop {
            match self.read_backend().await? {
                Backend::CopyBothResponse => break,
                Backend::Message(Message::ErrorResponse(body)) => {
                    error = Some(server_error(
                        body.fields(),
                        &format!(
                            "starting replication from slot `{slot}` at {}",
                            self.endpoint
                        ),
                    ));
                }
                Backend::Message(Message::ReadyForQuery(_)) => {
                    return Err(error.unwrap_or_else(|| self.unexpected("end of START_REPLICATION")))
                }
                Backend::Message(Message::NoticeResponse(_) | Message::ParameterStatus(_)) => {}
                Backend::Message(_) => return Err(self.unexpected("START_REPLICATION answer")),
            }
        }
        tracing::debug!(slot, %start, publication, "logical replication started");
        Ok(ReplicationStream {
            conn: self,
            slot: slot.to_owned(),
            publication: publication.to_owned(),
        })
    }
}
