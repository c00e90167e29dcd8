use std::path::PathBuf;
use std::time::Duration;

use outboxd_connector::Secret;
pub use outboxd_connector_kit::SslMode;
use outboxd_connector_kit::TlsOptions;
use serde::Deserialize;

/// `[source]` of a MySQL 8 or MariaDB pipeline (`kind = "mysql"`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MysqlConfig {
    /// Server host name or address.
    #[serde(default = "outboxd_connector_kit::config::default_host")]
    pub host: String,
    /// Server port.
    #[serde(default = "default_port")]
    pub port: u16,
    /// User to connect as; needs REPLICATION SLAVE and REPLICATION CLIENT (MariaDB 10.5+:
    /// BINLOG MONITOR too) and read/write on the outbox and checkpoint tables.
    pub user: String,
    /// Password; the `OUTBOXD_SOURCE_PASSWORD` environment variable overrides it.
    /// Redacted in `Debug`.
    #[serde(default)]
    pub password: Option<Secret>,
    /// File holding the password (one trailing newline ignored), read when the config is
    /// loaded into `password`; not together with `password`.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Database holding the outbox table (tables that are not qualified live here).
    pub database: String,
    /// The replica server id outboxd registers with. Must differ from the server's own
    /// `server_id` and from every other replica's: the server disconnects an older replica
    /// when a new one registers with the same id. Required by the outbox relay; an
    /// inbox-only process reads no binlog and may leave it out (0).
    #[serde(default)]
    pub server_id: u32,
    /// TLS mode, with libpq's meaning (see [`SslMode`]); the binlog connection uses it too.
    #[serde(default)]
    pub sslmode: SslMode,
    /// PEM file of the CA certificate(s) the server's certificate must chain to. With
    /// `require` (or `prefer`) it makes the chain verified, as in libpq.
    #[serde(default)]
    pub sslrootcert: Option<PathBuf>,
    /// PEM file of the client certificate (with `sslkey`), for users created
    /// `REQUIRE X509` or `REQUIRE SUBJECT`.
    #[serde(default)]
    pub sslcert: Option<PathBuf>,
    /// PEM file of the client certificate's private key (unencrypted).
    #[serde(default)]
    pub sslkey: Option<PathBuf>,
    /// Authenticate with caching_sha2_password or mysql_clear_password over a channel
    /// whose certificate is not verified (or without TLS). Off: such a server is refused
    /// before the password is sent, since whoever poses as it would learn the password
    /// (caching_sha2_password's full authentication sends it in clear inside TLS, or
    /// encrypted with a key the server supplies). mysql_native_password never reveals it
    /// and is always allowed. The PostgreSQL key of the same name is the model.
    #[serde(default)]
    pub allow_insecure_password: bool,
    /// Time allowed to establish a connection.
    #[serde(
        default = "outboxd_connector_kit::config::default_connect_timeout",
        with = "humantime_serde"
    )]
    pub connect_timeout: Duration,
    /// Heartbeat period asked of the server while the binlog is idle; a stream that hears
    /// nothing for three periods (plus a margin) is treated as broken and reopened.
    #[serde(default = "default_heartbeat", with = "humantime_serde")]
    pub heartbeat: Duration,
}

fn default_port() -> u16 {
    3306
}

fn default_heartbeat() -> Duration {
    Duration::from_secs(5)
}

impl MysqlConfig {
    /// Rejects durations out of their range, naming the key: a huge one would overflow a
    /// deadline (`Instant + d` panics; the server takes a heartbeat of at most 4294967 s),
    /// a zero heartbeat would turn the server's heartbeats off.
    pub fn validate(&self) -> Result<(), String> {
        use outboxd_connector_kit::config::check_duration;
        check_duration(
            "source.heartbeat",
            self.heartbeat,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )?;
        check_duration(
            "source.connect_timeout",
            self.connect_timeout,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )
    }

    /// The TLS keys.
    pub fn tls_options(&self) -> TlsOptions<'_> {
        TlsOptions {
            mode: self.sslmode,
            rootcert: self.sslrootcert.as_deref(),
            cert: self.sslcert.as_deref(),
            key: self.sslkey.as_deref(),
        }
    }
}
