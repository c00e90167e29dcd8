use std::path::PathBuf;
use std::time::Duration;

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
    #[serde(default)]
    pub password: Option<String>,
    /// Database holding the outbox table (tables that are not qualified live here).
    pub database: String,
    /// The replica server id outboxd registers with. Must differ from the server's own
    /// `server_id` and from every other replica's: the server disconnects an older replica
    /// when a new one registers with the same id.
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
