use std::sync::Arc;

use outboxd_connector::{
    CheckReport, ConfiguredConnector, Connector, ConnectorError, ErrorReason, OutboxLayout,
    ReadMode, SecretError, ENV_SOURCE_PASSWORD,
};
use outboxd_connector_kit::tls::{Negotiated, TlsUse};
use tokio::net::TcpStream;
use tokio_postgres::config::SslMode as PgSslMode;

use crate::store::inbox::PgInboxStore;
use crate::store::PgOutboxStore;
use crate::stream::PgChangeStream;
use crate::tls::{carried_error, AuthGuard, PgTls, PgTlsConnect, PgTlsStream};
use crate::{setup as admin, PostgresConfig};

/// A SQL connection's driver: the guarded socket, TLS over it when negotiated.
pub(crate) type SqlConnection =
    tokio_postgres::Connection<AuthGuard<TcpStream>, PgTlsStream<AuthGuard<TcpStream>>>;

/// Everything outboxd does with one PostgreSQL pipeline, from its configuration.
#[derive(Clone, Debug)]
pub struct PostgresConnector {
    pub(crate) config: PostgresConfig,
    pub(crate) pipeline: String,
    pub(crate) layout: OutboxLayout,
    /// The TLS of every connection, from the config's TLS keys.
    pub(crate) tls: Arc<PgTls>,
}

impl PostgresConnector {
    /// Validates names and the TLS keys (the certificate files are read here) and builds
    /// the connector; connects to nothing yet.
    pub fn new(
        config: PostgresConfig,
        pipeline: &str,
        layout: OutboxLayout,
    ) -> Result<Self, ConnectorError> {
        let connector = Self {
            tls: PgTls::for_config(&config)?,
            config,
            pipeline: pipeline.to_owned(),
            layout,
        };
        for (what, name) in [
            ("replication slot", connector.slot()),
            ("publication", connector.publication()),
        ] {
            // Slot names are restricted by the server to [a-z0-9_]{1,63}; we hold the
            // publication to the same rule so both can be written without quoting.
            let valid = !name.is_empty()
                && name.len() <= 63
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !valid {
                return Err(ConnectorError::definite(format!(
                    "{what} name `{name}` is invalid: use 1 to 63 characters of a-z, 0-9 and _ \
                     (set `source.slot` / `source.publication`, or a pipeline name of that form)"
                )));
            }
        }
        Ok(connector)
    }

    /// The replication slot this pipeline reads.
    pub fn slot(&self) -> String {
        self.config.slot_name(&self.pipeline)
    }

    /// The publication this pipeline subscribes to.
    pub fn publication(&self) -> String {
        self.config.publication_name(&self.pipeline)
    }

    /// The pipeline name (checkpoint row key).
    pub fn pipeline(&self) -> &str {
        &self.pipeline
    }

    /// The configured tables and key column.
    pub fn layout(&self) -> &OutboxLayout {
        &self.layout
    }

    /// The source configuration.
    pub fn config(&self) -> &PostgresConfig {
        &self.config
    }

    /// `outboxd init`: creates what is missing (tables, publication, slot) and says what
    /// it created. Idempotent.
    pub async fn init(&self) -> Result<Vec<String>, ConnectorError> {
        admin::init(self, false).await
    }

    /// `outboxd init` for a source mode: with `poll_mode`, the tables and poll mode's index
    /// of INIT rows, and no publication or slot; otherwise as [`Self::init`]. Idempotent.
    pub async fn init_with(&self, poll_mode: bool) -> Result<Vec<String>, ConnectorError> {
        admin::init(self, poll_mode).await
    }

    /// `outboxd recover`, log half: drops the slot (refusing while a reader holds it) and
    /// creates it again at the current WAL position; says what it did.
    pub async fn reset_log_position(&self) -> Result<String, ConnectorError> {
        admin::reset_log_position(self).await
    }

    /// `outboxd check`: one line per prerequisite, with the fix for each failure.
    pub async fn check(&self) -> CheckReport {
        admin::check(self).await
    }

    /// Opens the SQL side (status write-back, checkpoint).
    pub async fn open_store(&self) -> Result<PgOutboxStore, ConnectorError> {
        PgOutboxStore::open(self).await
    }

    /// Opens the replication stream at the slot's confirmed position. Returns a
    /// transient error while another reader holds the slot.
    pub async fn open_stream(&self) -> Result<PgChangeStream, ConnectorError> {
        PgChangeStream::open(self).await
    }

    /// An ordinary SQL connection (its connection task is spawned on the runtime).
    pub async fn sql_client(&self) -> Result<tokio_postgres::Client, ConnectorError> {
        Ok(self.sql_client_tls().await?.0)
    }

    /// [`Self::sql_client`] and what its TLS negotiated (for `check`).
    pub(crate) async fn sql_client_tls(
        &self,
    ) -> Result<(tokio_postgres::Client, Negotiated), ConnectorError> {
        let (client, connection, negotiated) = self.connect_sql().await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "PostgreSQL SQL connection closed");
            }
        });
        Ok((client, negotiated))
    }

    /// Opens a SQL connection within `connect_timeout`. tokio-postgres runs the protocol
    /// over a socket outboxd opens and guards (see `crate::tls`): TLS per the config's
    /// policy, and no cleartext or MD5 password over an unverified channel.
    async fn connect_sql(
        &self,
    ) -> Result<(tokio_postgres::Client, SqlConnection, Negotiated), ConnectorError> {
        let context = format!("connecting to PostgreSQL at {}", self.endpoint());
        match tokio::time::timeout(
            self.config.connect_timeout,
            self.connect_sql_inner(&context),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(ConnectorError::transient(format!(
                "{context}: timed out after {:?}",
                self.config.connect_timeout
            ))),
        }
    }

    async fn connect_sql_inner(
        &self,
        context: &str,
    ) -> Result<(tokio_postgres::Client, SqlConnection, Negotiated), ConnectorError> {
        let mut pg = tokio_postgres::Config::new();
        pg.user(&self.config.user)
            .dbname(&self.config.database)
            .application_name("outboxd")
            // The guard refuses a server without TLS when TLS is required, with a message
            // naming the key; tokio-postgres only has to ask.
            .ssl_mode(match self.tls.policy().tls {
                TlsUse::Off => PgSslMode::Disable,
                TlsUse::IfOffered | TlsUse::Required => PgSslMode::Prefer,
            })
            // SCRAM-SHA-256-PLUS whenever the server offers it over TLS. Not `require`:
            // certificate (and trust) logins have no SCRAM exchange to bind.
            .channel_binding(tokio_postgres::config::ChannelBinding::Prefer);
        if let Some(password) = &self.config.password {
            pg.password(password.expose());
        }
        let tcp = TcpStream::connect((self.config.host.as_str(), self.config.port))
            .await
            .map_err(|e| ConnectorError::transient(context.to_owned()).with_source(e))?;
        let _ = tcp.set_nodelay(true);
        outboxd_connector_kit::net::detect_dead_peers(&tcp);
        let negotiated = Arc::new(std::sync::Mutex::new(None));
        let tls = PgTlsConnect {
            tls: Arc::clone(&self.tls),
            host: self.config.host.clone(),
            context: context.to_owned(),
            negotiated: Arc::clone(&negotiated),
        };
        let (client, connection) = pg
            .connect_raw(self.tls.guard(tcp, context), tls)
            .await
            .map_err(|e| match carried_error(&e) {
                Some(refused) => refused,
                None => classify_pg_error(&e, context),
            })?;
        let negotiated = negotiated
            .lock()
            .ok()
            .and_then(|mut n| n.take())
            .unwrap_or(Negotiated::Plain);
        Ok((client, connection, negotiated))
    }

    /// Calls `on_notify` whenever `outboxd retry` or `resolve` notifies this pipeline's
    /// channel ([`crate::retry_channel`]), and once as soon as it listens (covering
    /// anything sent while it was not). Runs until the connection fails; returns that
    /// error.
    pub async fn watch_retries(&self, on_notify: &(dyn Fn() + Send + Sync)) -> ConnectorError {
        let (client, mut connection, _) = match self.connect_sql().await {
            Ok(connected) => connected,
            Err(e) => return e,
        };
        let channel = crate::retry_channel(&self.pipeline);
        let listen_sql = format!("LISTEN {}", crate::schema::quote_ident(&channel));
        let listen = client.batch_execute(&listen_sql);
        tokio::pin!(listen);
        let mut listening = false;
        loop {
            tokio::select! {
                result = &mut listen, if !listening => match result {
                    Ok(()) => {
                        listening = true;
                        on_notify();
                    }
                    Err(e) => return classify_pg_error(&e, &format!("LISTEN on `{channel}`")),
                },
                message = std::future::poll_fn(|cx| connection.poll_message(cx)) => match message {
                    Some(Ok(tokio_postgres::AsyncMessage::Notification(_))) => on_notify(),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return classify_pg_error(&e, &format!("listening on `{channel}`")),
                    None => return ConnectorError::transient(format!("listening on `{channel}`: connection closed")),
                },
            }
        }
    }

    /// `host:port/database`, for messages.
    pub(crate) fn endpoint(&self) -> String {
        format!(
            "{}:{}/{}",
            self.config.host, self.config.port, self.config.database
        )
    }
}

/// `check` items that only matter when tailing the log.
const LOG_ONLY_CHECKS: &[&str] = &[
    "wal_level",
    "role",
    "max_replication_slots",
    "max_wal_senders",
    "publication",
    "replication slot",
    "slot lag",
    "slot reader",
    "replication tls",
];

impl ConfiguredConnector for PostgresConnector {
    type Config = PostgresConfig;

    fn from_config(
        config: PostgresConfig,
        pipeline: &str,
        layout: OutboxLayout,
    ) -> Result<Self, ConnectorError> {
        Self::new(config, pipeline, layout)
    }

    fn resolve_secrets(
        config: &mut PostgresConfig,
        var: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), SecretError> {
        outboxd_connector::secret::resolve(
            "source.password",
            "source.password_file",
            &mut config.password,
            config.password_file.as_deref(),
            var(ENV_SOURCE_PASSWORD),
        )
    }

    fn validate(config: &PostgresConfig) -> Result<(), String> {
        config.validate()
    }
}

impl Connector for PostgresConnector {
    type Stream = PgChangeStream;
    type Store = PgOutboxStore;
    type Inbox = PgInboxStore;

    async fn init(&self, mode: ReadMode) -> Result<Vec<String>, ConnectorError> {
        self.init_with(mode == ReadMode::Poll).await
    }

    async fn add_columns(&self) -> Result<Vec<String>, ConnectorError> {
        admin::add_columns(self).await
    }

    fn schema(&self, mode: ReadMode) -> String {
        admin::schema_script(self, mode)
    }

    async fn check(&self, mode: ReadMode) -> CheckReport {
        let report = PostgresConnector::check(self).await;
        match mode {
            ReadMode::Log => report,
            // Poll mode needs no replication: leave out what only the log needs.
            ReadMode::Poll => report
                .into_iter()
                .filter(|line| !LOG_ONLY_CHECKS.contains(&line.item.as_str()))
                .collect(),
        }
    }

    async fn open_stream(&self) -> Result<PgChangeStream, ConnectorError> {
        PostgresConnector::open_stream(self).await
    }

    async fn open_store(&self) -> Result<PgOutboxStore, ConnectorError> {
        PostgresConnector::open_store(self).await
    }

    async fn open_inbox(&self) -> Result<PgInboxStore, ConnectorError> {
        PgInboxStore::open(self).await
    }

    async fn reset_log_position(&self) -> Result<String, ConnectorError> {
        PostgresConnector::reset_log_position(self).await
    }

    fn describe(&self) -> String {
        format!("postgres {} slot {}", self.endpoint(), self.slot())
    }

    fn notifies_retries(&self) -> bool {
        true
    }

    async fn watch_retries(&self, on_notify: &(dyn Fn() + Send + Sync)) -> ConnectorError {
        PostgresConnector::watch_retries(self, on_notify).await
    }
}

/// Classifies a tokio-postgres error by SQLSTATE: connection-level trouble and
/// concurrency conflicts are transient, everything else (auth, missing objects,
/// privileges, bad data) is definite.
pub(crate) fn classify_pg_error(e: &tokio_postgres::Error, context: &str) -> ConnectorError {
    let message = match e.as_db_error() {
        Some(db) => {
            let mut m = format!(
                "{context}: {} (SQLSTATE {})",
                db.message(),
                db.code().code()
            );
            if let Some(detail) = db.detail() {
                m.push_str(&format!("; detail: {detail}"));
            }
            if let Some(hint) = db.hint() {
                m.push_str(&format!("; hint: {hint}"));
            }
            m
        }
        // tokio-postgres nests its errors; the root cause is the informative part
        // ("Connection refused", "password authentication failed", ...).
        None => {
            let mut root: &dyn std::error::Error = e;
            while let Some(next) = root.source() {
                root = next;
            }
            format!("{context}: {root}")
        }
    };
    let reason = match (e.as_db_error(), e.code()) {
        (Some(db), Some(code)) => sqlstate_reason(code.code(), db.message()),
        _ => ErrorReason::Unspecified,
    };
    let transient = match e.code() {
        // 08: connection exception, 40: transaction rollback (serialization, deadlock),
        // 53: insufficient resources, 57P01-03: admin/crash shutdown, cannot connect now,
        // 55006: object in use (e.g. the slot is active for another reader).
        Some(code) => {
            let c = code.code();
            c.starts_with("08")
                || c.starts_with("40")
                || c.starts_with("53")
                || c.starts_with("57P")
                || c == "55006"
        }
        // No SQLSTATE: I/O error, closed connection, timeout.
        None => true,
    };
    let error = if transient {
        ConnectorError::transient(message)
    } else {
        ConnectorError::definite(message)
    };
    error.with_reason(reason)
}

/// What a server error means for the operator, from its SQLSTATE (and, for the one
/// state PostgreSQL shares between causes, the server's own message field).
pub(crate) fn sqlstate_reason(code: &str, server_message: &str) -> ErrorReason {
    match code {
        // undefined_object: a slot or publication that does not exist.
        "42704" => ErrorReason::MissingObject,
        // undefined_table, undefined_column.
        "42P01" | "42703" => ErrorReason::SchemaMismatch,
        // object_in_use: the slot is active for another reader.
        "55006" => ErrorReason::SlotInUse,
        // object_not_in_prerequisite_state, raised for a slot whose WAL was removed.
        "55000" if server_message.contains("slot") => ErrorReason::PositionLost,
        _ => ErrorReason::Unspecified,
    }
}
