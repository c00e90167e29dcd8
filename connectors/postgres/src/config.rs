use std::path::PathBuf;
use std::time::Duration;

use outboxd_connector::Secret;
pub use outboxd_connector_kit::SslMode;
use outboxd_connector_kit::TlsOptions;
use serde::Deserialize;

/// `[source]` of a PostgreSQL pipeline (`kind = "postgres"`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresConfig {
    /// Server host name or address.
    #[serde(default = "outboxd_connector_kit::config::default_host")]
    pub host: String,
    /// Server port.
    #[serde(default = "default_port")]
    pub port: u16,
    /// Role to connect as; needs the REPLICATION attribute (or superuser).
    pub user: String,
    /// Password; the `OUTBOXD_SOURCE_PASSWORD` environment variable overrides it.
    /// Redacted in `Debug`.
    #[serde(default)]
    pub password: Option<Secret>,
    /// File holding the password (one trailing newline ignored), read when the config is
    /// loaded into `password`; not together with `password`.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Database holding the outbox table.
    pub database: String,
    /// TLS mode, with libpq's meaning (see [`SslMode`]).
    #[serde(default)]
    pub sslmode: SslMode,
    /// PEM file of the CA certificate(s) the server's certificate must chain to. With
    /// `require` (or `prefer`) it makes the chain verified, as in libpq.
    #[serde(default)]
    pub sslrootcert: Option<PathBuf>,
    /// PEM file of the client certificate, for `cert` authentication (with `sslkey`).
    #[serde(default)]
    pub sslcert: Option<PathBuf>,
    /// PEM file of the client certificate's private key (unencrypted).
    #[serde(default)]
    pub sslkey: Option<PathBuf>,
    /// Send the password in cleartext or as an MD5 hash when the server asks for it over a
    /// channel whose certificate is not verified (or without TLS). Off: such a server is
    /// refused, since whoever poses as it would learn the password (cleartext) or a hash
    /// that logs in as the role (MD5). SCRAM never reveals the password and is always
    /// allowed. libpq's `require_auth` is the model.
    #[serde(default)]
    pub allow_insecure_password: bool,
    /// Logical replication slot; default `outboxd_<pipeline name>`.
    #[serde(default)]
    pub slot: Option<String>,
    /// Publication on the outbox table; default `outboxd_<pipeline name>`.
    #[serde(default)]
    pub publication: Option<String>,
    /// Create the slot with `failover = true` (PostgreSQL 17 and later), so that a standby
    /// that synchronizes slots keeps it and outboxd goes on from there after a failover.
    /// `init`, `recover` and `check` refuse it on an older server.
    #[serde(default)]
    pub slot_failover: bool,
    /// How often a standby status update is sent even when the server does not ask.
    #[serde(default = "default_status_interval", with = "humantime_serde")]
    pub status_interval: Duration,
    /// With no message from the server on the replication connection for this long
    /// (though it was asked to answer), the connection is taken for dead and the relay
    /// reconnects: a network partition behind a live proxy, a frozen server. Long by
    /// default: decoding a large transaction's commit keeps an older server from
    /// answering for a while. `0s`: never.
    #[serde(default = "default_silence_timeout", with = "humantime_serde")]
    pub silence_timeout: Duration,
    /// Time allowed to establish a connection.
    #[serde(
        default = "outboxd_connector_kit::config::default_connect_timeout",
        with = "humantime_serde"
    )]
    pub connect_timeout: Duration,
}

fn default_port() -> u16 {
    5432
}

fn default_status_interval() -> Duration {
    Duration::from_secs(10)
}

fn default_silence_timeout() -> Duration {
    Duration::from_secs(120)
}

impl PostgresConfig {
    /// The replication slot name for pipeline `pipeline`.
    pub fn slot_name(&self, pipeline: &str) -> String {
        self.slot
            .clone()
            .unwrap_or_else(|| format!("outboxd_{pipeline}"))
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

    /// Rejects durations out of their range, naming the key: a huge one would overflow a
    /// deadline (`Instant + d` panics), a zero one would spin.
    pub fn validate(&self) -> Result<(), String> {
        use outboxd_connector_kit::config::check_duration;
        check_duration(
            "source.status_interval",
            self.status_interval,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )?;
        check_duration(
            "source.connect_timeout",
            self.connect_timeout,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )?;
        if !self.silence_timeout.is_zero() {
            check_duration(
                "source.silence_timeout",
                self.silence_timeout,
                (self.status_interval * 2).max(Duration::from_secs(1)),
                Duration::from_secs(86_400),
            )?;
        }
        Ok(())
    }

    /// The publication name for pipeline `pipeline`.
    pub fn publication_name(&self, pipeline: &str) -> String {
        self.publication
            .clone()
            .unwrap_or_else(|| format!("outboxd_{pipeline}"))
    }
}
