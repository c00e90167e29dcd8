use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use mysql_async::prelude::Queryable;
use mysql_async::{ClientIdentity, Conn, Opts, OptsBuilder, Row, SslOpts, Value};
use openssl::pkcs12::Pkcs12;
use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
use openssl::stack::Stack;
use outboxd_connector::{
    CheckReport, ConfiguredConnector, Connector, ConnectorError, ErrorReason, OutboxLayout,
    ReadMode, SecretError, ENV_SOURCE_PASSWORD,
};
use outboxd_connector_kit::tls::{self, read_file, root_certificates, Roots, TlsUse, Verification};
use outboxd_connector_kit::TlsPolicy;

use crate::guard::{Channel, Guard, GuardError, GuardTls, Target};
use crate::log::stream::MysqlChangeStream;
use crate::schema::{split_qualified, table_ident};
use crate::store::inbox::MysqlInboxStore;
use crate::store::MysqlOutboxStore;
use crate::{setup as admin, MysqlConfig};

/// Everything outboxd does with one MySQL or MariaDB pipeline, from its configuration.
#[derive(Clone, Debug)]
pub struct MysqlConnector {
    pub(crate) config: MysqlConfig,
    pub(crate) pipeline: String,
    pub(crate) layout: OutboxLayout,
    /// Connection id of the last connection a stream of this connector took the
    /// pipeline's lock with (0: none yet). Shared by its clones, so the stores opened
    /// from it fence their write-backs on that connection still holding the lock.
    pub(crate) lock_conn: Arc<AtomicU32>,
    /// The TLS of every connection (SQL and binlog), from the config's TLS keys.
    pub(crate) tls: Arc<MysqlTls>,
}

/// The TLS of one configuration: its policy, and the files read once, when the connector
/// is built (so a missing or bad file is a config error, not a connection failure).
#[derive(Clone)]
pub(crate) struct MysqlTls {
    pub(crate) policy: TlsPolicy,
    /// `source.allow_insecure_password`: no password guard.
    allow_insecure_password: bool,
    /// PEM of `sslrootcert`.
    roots: Option<Vec<u8>>,
    /// `sslcert` + `sslkey` as the PKCS#12 archive native-tls takes (no password).
    identity: Option<Vec<u8>>,
    /// The OpenSSL settings of the password guard's TLS (unverified TLS with the guard:
    /// see [`crate::guard`]); built once, as loading them reads the system's CA bundle.
    guard_tls: Option<SslConnector>,
}

impl std::fmt::Debug for MysqlTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlTls")
            .field("policy", &self.policy)
            .field("allow_insecure_password", &self.allow_insecure_password)
            .finish_non_exhaustive()
    }
}

/// How one connection attempt reaches the server.
#[derive(Clone, Debug)]
enum Route {
    /// mysql_async connects itself, with these TLS options (none: plain TCP), and may
    /// send the password whichever way the server asks: the server is verified, or the
    /// config allows it.
    Direct {
        ssl: Option<SslOpts>,
        cleartext: bool,
    },
    /// Through the password guard (the channel is not verified).
    Guarded(GuardTls),
}

impl MysqlTls {
    fn new(config: &MysqlConfig) -> Result<Self, ConnectorError> {
        let policy = TlsPolicy::from_options(config.tls_options())?;
        let allow_insecure_password = config.allow_insecure_password;
        let guard_tls = if !allow_insecure_password
            && policy.verify == Verification::None
            && policy.tls != TlsUse::Off
        {
            Some(guard_connector(&policy)?)
        } else {
            None
        };
        let roots = match &policy.roots {
            Roots::File(path) if policy.verify != Verification::None => {
                // Checked here, with errors that name the key; the driver reads the file.
                root_certificates(path)?;
                Some(read_file("source.sslrootcert", path)?)
            }
            _ => None,
        };
        let identity = match &policy.client {
            Some(client) => {
                let tls::ClientIdentity { leaf, chain, key } = tls::ClientIdentity::load(client)?;
                let openssl = |e: openssl::error::ErrorStack| {
                    ConnectorError::definite("cannot build the client certificate archive")
                        .with_source(e)
                };
                let mut rest = Stack::new().map_err(openssl)?;
                for cert in chain {
                    rest.push(cert).map_err(openssl)?;
                }
                let mut builder = Pkcs12::builder();
                builder.name("outboxd").pkey(&key).cert(&leaf);
                if !rest.is_empty() {
                    builder.ca(rest);
                }
                Some(
                    builder
                        .build2("")
                        .and_then(|p| p.to_der())
                        .map_err(openssl)?,
                )
            }
            None => None,
        };
        Ok(Self {
            policy,
            allow_insecure_password,
            roots,
            identity,
            guard_tls,
        })
    }

    /// The route of a connection without TLS.
    fn plain_route(&self) -> Route {
        if self.allow_insecure_password {
            Route::Direct {
                ssl: None,
                cleartext: true,
            }
        } else {
            Route::Guarded(GuardTls::Off)
        }
    }

    /// The route of a connection with TLS (`tls`: required, or if offered).
    fn tls_route(&self, tls: GuardTls) -> Route {
        if self.allow_insecure_password || self.policy.verify != Verification::None {
            // mysql_async verifies the certificate, or the config allows what it sends:
            // any plugin, the cleartext one too (PAM, LDAP).
            Route::Direct {
                ssl: Some(self.ssl_opts()),
                cleartext: true,
            }
        } else {
            Route::Guarded(tls)
        }
    }

    /// mysql_async's TLS options for this policy (native-tls, the system OpenSSL).
    fn ssl_opts(&self) -> SslOpts {
        let mut opts = SslOpts::default();
        if let Some(roots) = &self.roots {
            // Only the configured CAs vouch for the server, not the system's too.
            opts = opts
                .with_root_certs(vec![roots.clone().into()])
                .with_disable_built_in_roots(true);
        }
        if let Some(identity) = &self.identity {
            opts = opts.with_client_identity(Some(ClientIdentity::new(identity.clone().into())));
        }
        match self.policy.verify {
            Verification::None => opts
                .with_danger_accept_invalid_certs(true)
                .with_danger_skip_domain_validation(true),
            Verification::Chain => opts.with_danger_skip_domain_validation(true),
            Verification::ChainAndHost => opts,
        }
    }
}

/// The OpenSSL settings of the guard's TLS: nothing verified (the guard serves only
/// unverified TLS), the client certificate presented.
fn guard_connector(policy: &TlsPolicy) -> Result<SslConnector, ConnectorError> {
    let openssl = |e: openssl::error::ErrorStack| {
        ConnectorError::definite("cannot initialise OpenSSL").with_source(e)
    };
    let mut builder = SslConnector::builder(SslMethod::tls_client()).map_err(openssl)?;
    builder.set_verify(SslVerifyMode::NONE);
    if let Some(client) = &policy.client {
        let identity = tls::ClientIdentity::load(client)?;
        builder.set_certificate(&identity.leaf).map_err(openssl)?;
        for extra in identity.chain {
            builder.add_extra_chain_cert(extra).map_err(openssl)?;
        }
        builder.set_private_key(&identity.key).map_err(openssl)?;
    }
    Ok(builder.build())
}

impl MysqlConnector {
    /// Validates the configuration and builds the connector; connects to nothing yet.
    pub fn new(
        config: MysqlConfig,
        pipeline: &str,
        layout: OutboxLayout,
    ) -> Result<Self, ConnectorError> {
        if config.server_id == 0 && layout.features.outbox {
            return Err(ConnectorError::definite(
                "source.server_id must be a non-zero replica id, unique among the server's \
                 replicas and different from the server's own server_id (the outbox relay \
                 needs it; an inbox-only process may leave it out)",
            ));
        }
        if pipeline.is_empty() || pipeline.len() > 48 {
            return Err(ConnectorError::definite(format!(
                "pipeline name `{pipeline}` must be 1 to 48 characters"
            )));
        }
        let outbox_tables = layout.outbox_tables.iter().map(|t| ("outbox.table", t));
        for (what, name) in outbox_tables.chain([
            ("outbox.inbox_table", &layout.inbox_table),
            ("outbox.checkpoint_table", &layout.checkpoint_table),
        ]) {
            let (db, table) = split_qualified(name);
            let too_long = |s: &str| s.is_empty() || s.chars().count() > 64;
            if too_long(&table) || db.as_deref().is_some_and(too_long) {
                return Err(ConnectorError::definite(format!(
                    "{what} `{name}`: MySQL names are 1 to 64 characters"
                )));
            }
        }
        Ok(Self {
            tls: Arc::new(MysqlTls::new(&config)?),
            config,
            pipeline: pipeline.to_owned(),
            layout,
            lock_conn: Arc::new(AtomicU32::new(0)),
        })
    }

    /// The pipeline name (checkpoint row key, lock name).
    pub fn pipeline(&self) -> &str {
        &self.pipeline
    }

    /// The configured tables and key column.
    pub fn layout(&self) -> &OutboxLayout {
        &self.layout
    }

    /// The source configuration.
    pub fn config(&self) -> &MysqlConfig {
        &self.config
    }

    /// The name of the `GET_LOCK` lock that admits one stream per pipeline.
    pub fn lock_name(&self) -> String {
        format!("outboxd:{}", self.pipeline)
    }

    /// `(database, table)` of the outbox (the first, when there are several).
    pub(crate) fn outbox_ident(&self) -> (String, String) {
        table_ident(self.layout.outbox_table(), &self.config.database)
    }

    /// `(database, table)` of each outbox table, in the layout's order.
    pub(crate) fn outbox_idents(&self) -> Vec<(String, String)> {
        (self.layout.outbox_tables.iter())
            .map(|t| table_ident(t, &self.config.database))
            .collect()
    }

    /// `outboxd init` (log mode): creates the tables and records the starting position.
    /// Idempotent.
    pub async fn init(&self) -> Result<Vec<String>, ConnectorError> {
        admin::init(self, ReadMode::Log).await
    }

    /// `outboxd check` (log mode): one line per prerequisite, with the fix for each failure.
    pub async fn check(&self) -> CheckReport {
        admin::check(self, ReadMode::Log).await
    }

    /// Opens the SQL side (status write-back, checkpoint).
    pub async fn open_store(&self) -> Result<MysqlOutboxStore, ConnectorError> {
        MysqlOutboxStore::open(self).await
    }

    /// Opens the binlog stream at the checkpoint. Returns a transient error while another
    /// outboxd holds this pipeline.
    pub async fn open_stream(&self) -> Result<MysqlChangeStream, ConnectorError> {
        MysqlChangeStream::open(self).await
    }

    /// An ordinary SQL connection in UTC with utf8mb4, TLS per the config's TLS keys. The
    /// binlog stream and the pipeline lock are opened through it too. Over a channel
    /// whose server is not verified it goes through the password guard (`guard`), unless
    /// `source.allow_insecure_password`.
    pub async fn sql_conn(&self) -> Result<Conn, ConnectorError> {
        match self.tls.policy.tls {
            TlsUse::Off => self.connect(self.tls.plain_route()).await,
            TlsUse::Required => self
                .connect(self.tls.tls_route(GuardTls::Required))
                .await
                .map_err(|e| {
                    if e.reason() != ErrorReason::TlsUnavailable {
                        e
                    } else if e.is_transient() {
                        // The handshake failed: under a verifying mode, the certificate.
                        if self.tls.policy.verify == Verification::None {
                            e
                        } else {
                            let context = format!("connecting to MySQL at {}", self.endpoint());
                            let cause = e.to_string();
                            let cause = cause
                                .strip_prefix(&format!("{context}: "))
                                .unwrap_or(&cause);
                            self.tls.policy.verification_failed(&context, cause)
                        }
                    } else {
                        self.tls.policy.downgrade_refused(&format!(
                            "connecting to MySQL at {}",
                            self.endpoint()
                        ))
                    }
                }),
            // libpq's `prefer`: TLS when the server offers it (and the handshake works),
            // plain TCP otherwise.
            TlsUse::IfOffered => {
                match self.connect(self.tls.tls_route(GuardTls::IfOffered)).await {
                    Err(e) if e.reason() == ErrorReason::TlsUnavailable => {
                        tracing::debug!(error = %e, "server offers no TLS; connecting without");
                        self.connect(self.tls.plain_route()).await
                    }
                    other => other,
                }
            }
        }
    }

    async fn connect(&self, route: Route) -> Result<Conn, ConnectorError> {
        let context = format!("connecting to MySQL at {}", self.endpoint());
        let builder = OptsBuilder::default()
            .user(Some(self.config.user.clone()))
            .pass(self.config.password.as_ref().map(|p| p.expose().to_owned()))
            .db_name(Some(self.config.database.clone()))
            .prefer_socket(false)
            .tcp_nodelay(true)
            // Keepalive probes find a vanished server (a network partition) on a direct
            // connection; guarded ones get the full set on the guard's own socket
            // (`outboxd_connector_kit::net`).
            .tcp_keepalive(Some(outboxd_connector_kit::net::KEEPALIVE_IDLE))
            .stmt_cache_size(Some(32))
            // mysql_old_password's hash is as good as the password: never (the default,
            // stated).
            .secure_auth(true)
            .setup(vec!["SET NAMES utf8mb4, time_zone = '+00:00'"]);
        let (builder, guard) = match route {
            Route::Direct { ssl, cleartext } => (
                builder
                    .ip_or_hostname(self.config.host.clone())
                    .tcp_port(self.config.port)
                    .ssl_opts(ssl)
                    .enable_cleartext_plugin(cleartext),
                None,
            ),
            Route::Guarded(tls) => {
                let guard = Guard::start(Target {
                    host: self.config.host.clone(),
                    port: self.config.port,
                    tls,
                    connector: self.tls.guard_tls.clone(),
                })
                .await
                .map_err(|e| self.guard_error(e, &context))?;
                let builder = builder
                    .ip_or_hostname(guard.address())
                    .tcp_port(guard.port())
                    .connect_attributes(guard.attributes())
                    // Plain TCP to the guard, which does the TLS; cleartext never.
                    .ssl_opts(None)
                    .enable_cleartext_plugin(false);
                (builder, Some(guard))
            }
        };
        let opts: Opts = builder.into();
        let result = tokio::time::timeout(self.config.connect_timeout, Conn::new(opts)).await;
        let error = match result {
            // The guard, if any, relays the connection for its life.
            Ok(Ok(conn)) => return Ok(conn),
            Ok(Err(e)) => classify(&e, &context),
            Err(_) => ConnectorError::transient(format!(
                "{context}: timed out after {:?}",
                self.config.connect_timeout
            )),
        };
        // The guard's reason, when it ended the connection, says more than the client's
        // "connection closed".
        match guard.and_then(Guard::failed) {
            Some(e) => Err(self.guard_error(e, &context)),
            None => Err(error),
        }
    }

    /// The error of a guarded connection, as the rest of the connector classifies them.
    fn guard_error(&self, e: GuardError, context: &str) -> ConnectorError {
        let policy = &self.tls.policy;
        match e {
            GuardError::Refused { exposing, channel } => {
                let channel = match channel {
                    Channel::Plain => "a connection without TLS".to_owned(),
                    Channel::UnverifiedTls => format!(
                        "TLS whose certificate is not verified (sslmode={})",
                        policy.mode
                    ),
                };
                ConnectorError::definite(format!(
                    "{context}: the server asks to authenticate with {}, {}, over {channel}; \
                     refused, since whoever poses as the server would learn the password. \
                     Verify the server (source.sslmode = \"verify-full\", or \"verify-ca\" with \
                     source.sslrootcert), or give the user mysql_native_password or a client \
                     certificate (source.sslcert), or set source.allow_insecure_password = \
                     true to send it anyway",
                    exposing.plugin(),
                    exposing.how(),
                ))
            }
            GuardError::NoTls => policy.downgrade_refused(context),
            // As a failed handshake of mysql_async's: `prefer` connects without TLS.
            GuardError::Handshake(cause) => {
                ConnectorError::transient(format!("{context}: TLS handshake failed"))
                    .with_reason(ErrorReason::TlsUnavailable)
                    .with_source(cause)
            }
            GuardError::Server(cause) => ConnectorError::transient(context).with_source(cause),
            other @ (GuardError::Malformed(_) | GuardError::Stranger | GuardError::Local(_)) => {
                ConnectorError::transient(format!("{context}: {other}"))
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

impl ConfiguredConnector for MysqlConnector {
    type Config = MysqlConfig;

    fn from_config(
        config: MysqlConfig,
        pipeline: &str,
        layout: OutboxLayout,
    ) -> Result<Self, ConnectorError> {
        Self::new(config, pipeline, layout)
    }

    fn resolve_secrets(
        config: &mut MysqlConfig,
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

    fn validate(config: &MysqlConfig) -> Result<(), String> {
        config.validate()
    }
}

impl Connector for MysqlConnector {
    type Stream = MysqlChangeStream;
    type Store = MysqlOutboxStore;
    type Inbox = MysqlInboxStore;

    async fn init(&self, mode: ReadMode) -> Result<Vec<String>, ConnectorError> {
        admin::init(self, mode).await
    }

    async fn add_columns(&self) -> Result<Vec<String>, ConnectorError> {
        admin::add_columns(self).await
    }

    fn schema(&self, mode: ReadMode) -> String {
        admin::schema_script(self, mode)
    }

    async fn check(&self, mode: ReadMode) -> CheckReport {
        admin::check(self, mode).await
    }

    async fn open_stream(&self) -> Result<MysqlChangeStream, ConnectorError> {
        MysqlConnector::open_stream(self).await
    }

    async fn open_inbox(&self) -> Result<MysqlInboxStore, ConnectorError> {
        MysqlInboxStore::open(self).await
    }

    async fn open_store(&self) -> Result<MysqlOutboxStore, ConnectorError> {
        MysqlConnector::open_store(self).await
    }

    async fn reset_log_position(&self) -> Result<String, ConnectorError> {
        admin::reset_log_position(self).await
    }

    fn describe(&self) -> String {
        format!(
            "mysql {} server_id {} pipeline {}",
            self.endpoint(),
            self.config.server_id,
            self.pipeline
        )
    }
}

/// Classifies a `mysql_async` error (its text becomes part of the message): broken connections, server shutdown, lock waits and
/// deadlocks, too many connections are transient; everything else (access denied, missing
/// tables or columns, privileges, bad data) is definite.
pub(crate) fn classify(e: &mysql_async::Error, context: &str) -> ConnectorError {
    match e {
        mysql_async::Error::Server(server) => {
            let message = format!(
                "{context}: {} (error {}, SQLSTATE {})",
                server.message, server.code, server.state
            );
            let transient = server.state.starts_with("08")
                || server.state == "40001"
                || matches!(
                    server.code,
                    // too many connections, out of resources, shutdown in progress,
                    // query interrupted, lock wait timeout, deadlock, connection killed,
                    // net read/write errors and timeouts, read-only during a failover,
                    // idle client disconnected (MySQL 8).
                    1040 | 1041
                        | 1053
                        | 1077
                        | 1078
                        | 1079
                        | 1080
                        | 1152
                        | 1153
                        | 1158
                        | 1159
                        | 1160
                        | 1161
                        | 1205
                        | 1213
                        | 1290
                        | 1317
                        | 1836
                        | 1927
                        | 3024
                        | 4031
                );
            if transient {
                ConnectorError::transient(message)
            } else {
                ConnectorError::definite(message)
            }
        }
        mysql_async::Error::Url(_) => ConnectorError::definite(format!("{context}: {e}")),
        mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer) => {
            ConnectorError::definite(format!("{context}: {e}"))
                .with_reason(ErrorReason::TlsUnavailable)
        }
        // The TLS handshake failed: `prefer` then connects without, as libpq does.
        mysql_async::Error::Io(mysql_async::IoError::Tls(_)) => {
            ConnectorError::transient(format!("{context}: {e}"))
                .with_reason(ErrorReason::TlsUnavailable)
        }
        mysql_async::Error::Driver(
            mysql_async::DriverError::UnknownAuthPlugin { .. }
            | mysql_async::DriverError::MysqlOldPasswordDisabled
            | mysql_async::DriverError::CleartextPluginDisabled,
        ) => ConnectorError::definite(format!("{context}: {e}")),
        // I/O, TLS, closed connection.
        _ => ConnectorError::transient(format!("{context}: {e}")),
    }
}

/// Runs `sql` (one or more statements) and drops any results.
pub(crate) async fn execute(
    conn: &mut Conn,
    sql: &str,
    context: &str,
) -> Result<(), ConnectorError> {
    conn.query_drop(sql)
        .await
        .map_err(|e| classify(&e, context))
}

/// The rows of `sql`.
pub(crate) async fn query(
    conn: &mut Conn,
    sql: &str,
    context: &str,
) -> Result<Vec<Row>, ConnectorError> {
    conn.query::<Row, _>(sql)
        .await
        .map_err(|e| classify(&e, context))
}

/// The first row of `sql`, if any.
pub(crate) async fn query_first(
    conn: &mut Conn,
    sql: &str,
    context: &str,
) -> Result<Option<Row>, ConnectorError> {
    conn.query_first::<Row, _>(sql)
        .await
        .map_err(|e| classify(&e, context))
}

/// Column `at` of `row` as text (`None` for NULL); numbers are rendered in decimal.
pub(crate) fn text(row: &Row, at: usize) -> Result<Option<String>, ConnectorError> {
    match row.as_ref(at) {
        Some(Value::NULL) => Ok(None),
        Some(Value::Bytes(b)) => String::from_utf8(b.clone()).map(Some).map_err(|_| {
            ConnectorError::definite(format!(
                "unexpected answer from MySQL: column {at} is not UTF-8"
            ))
        }),
        Some(Value::Int(i)) => Ok(Some(i.to_string())),
        Some(Value::UInt(u)) => Ok(Some(u.to_string())),
        Some(other) => Ok(Some(other.as_sql(true).trim_matches('\'').to_owned())),
        None => Err(ConnectorError::definite(format!(
            "unexpected answer from MySQL: no column {at}"
        ))),
    }
}

/// Column `at` of `row` as an integer (`None` for NULL).
pub(crate) fn int(row: &Row, at: usize) -> Result<Option<i64>, ConnectorError> {
    match text(row, at)? {
        None => Ok(None),
        Some(t) => t.trim().parse().map(Some).map_err(|_| {
            ConnectorError::definite(format!(
                "unexpected answer from MySQL: column {at} = `{t}` is not an integer"
            ))
        }),
    }
}

/// Column `at` of `row` as text, NULL read as the empty string.
pub(crate) fn text_or_empty(row: &Row, at: usize) -> Result<String, ConnectorError> {
    Ok(text(row, at)?.unwrap_or_default())
}
