//! `[http]`: the outbox relay's HTTP sink (instead of `[kafka]`): where each event is
//! POSTed, how it is signed, and each endpoint's bounds.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use outboxd_connector::{Secret, SecretError};
use serde::Deserialize;

/// `[http]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSinkConfig {
    /// The endpoint (a name under `[http.endpoints]`) of a row whose `topic` column is
    /// NULL. Placeholders as in `kafka.topic_template`: `{message_type}`, `{pipeline}`,
    /// `{routing}`, `{table}`, `{schema}`. A row's `topic` column, when set, names its
    /// endpoint instead. URLs come from the config only, never from a row.
    #[serde(default = "default_endpoint_template")]
    pub endpoint_template: String,
    /// How long one request may wait for its answer (connecting included): no answer in
    /// time is a failed attempt, retried with backoff.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// The request body: the row's payload as it is (`payload`), or the Standard
    /// Webhooks envelope `{"type", "timestamp", "key", "data"}` (`envelope`), which a
    /// receiver that dispatches on the type (outboxd's own inbox) reads.
    #[serde(default)]
    pub body: BodyFormat,
    /// Row headers sent as request headers besides `traceparent`/`tracestate` (names,
    /// or prefixes ending in `*`); credentials, hop-by-hop and outboxd's own headers
    /// never are.
    #[serde(default)]
    pub forward_headers: Vec<String>,
    /// `[http.endpoints.<name>]`
    pub endpoints: BTreeMap<String, EndpointConfig>,
}

/// `http.body`
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BodyFormat {
    /// The payload as stored.
    #[default]
    Payload,
    /// `{"type": message_type, "timestamp": created_at, "key": biz_key, "data": payload}`
    /// (`data` is the payload's JSON, or `data_base64` when it is not JSON).
    Envelope,
}

/// `[http.endpoints.<name>]`. `Debug` hides the secrets.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// `http://` or `https://` (verified against the system's roots).
    pub url: String,
    /// Standard Webhooks signing secrets (`whsec_<base64>`): each request carries one
    /// `webhook-signature` entry per secret (two while the receiver rotates). None: the
    /// requests are not signed.
    #[serde(default)]
    pub secrets: Vec<Secret>,
    /// A file holding the secrets, one per line, instead of `secrets`.
    #[serde(default)]
    pub secrets_file: Option<PathBuf>,
    /// PEM file of certificates trusted besides the system's roots (a private CA).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate (with `client_key`), for an endpoint that asks
    /// for one (mutual TLS).
    #[serde(default)]
    pub client_cert: Option<PathBuf>,
    /// PEM file of the client certificate's PKCS#8 key.
    #[serde(default)]
    pub client_key: Option<PathBuf>,
    /// Requests in flight to this endpoint at once, at most (never two of one key).
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// After this many failed attempts in a row (no answer, 408/425/429/5xx) the endpoint
    /// is taken for down: its rows wait, and one request at a time probes it, with a
    /// growing pause, until it answers.
    #[serde(default = "default_open_after")]
    pub open_after: u32,
    /// Bytes of requests (bodies and headers) handed to this endpoint and not yet
    /// answered, at most: past it, sending waits (as Kafka's producer queue makes it wait),
    /// so an endpoint that is slow or down holds a bounded amount of memory.
    #[serde(default = "default_max_queued_bytes")]
    pub max_queued_bytes: usize,
}

impl std::fmt::Debug for EndpointConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointConfig")
            .field("url", &"…")
            .field("secrets", &self.secrets.len())
            .field("concurrency", &self.concurrency)
            .field("open_after", &self.open_after)
            .field("max_queued_bytes", &self.max_queued_bytes)
            .finish_non_exhaustive()
    }
}

fn default_endpoint_template() -> String {
    "default".into()
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_concurrency() -> usize {
    16
}

fn default_open_after() -> u32 {
    5
}

fn default_max_queued_bytes() -> usize {
    16 << 20
}

impl EndpointConfig {
    /// The endpoint's TLS files; `client_cert` and `client_key` go together.
    pub(crate) fn tls(&self) -> Result<crate::webhooks::client::TlsFiles, String> {
        let client_cert = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            _ => return Err("client_cert and client_key go together".into()),
        };
        Ok(crate::webhooks::client::TlsFiles {
            ca_file: self.ca_file.clone(),
            client_cert,
        })
    }
}

impl HttpSinkConfig {
    /// Reads each endpoint's `secrets_file` into its `secrets`.
    pub(crate) fn resolve_secret_files(&mut self) -> Result<(), SecretError> {
        for (name, endpoint) in &mut self.endpoints {
            let Some(path) = &endpoint.secrets_file else {
                continue;
            };
            let file_key = format!("http.endpoints.{name}.secrets_file");
            if !endpoint.secrets.is_empty() {
                return Err(SecretError::Both {
                    key: format!("http.endpoints.{name}.secrets"),
                    file_key,
                });
            }
            endpoint.secrets = crate::secrets::read_secret_lines(&file_key, path)?;
        }
        Ok(())
    }

    /// What serde cannot check: names, URLs, secrets and bounds.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.endpoints.is_empty() {
            return Err(
                "[http] needs at least one endpoint: [http.endpoints.default] url = \"https://…\""
                    .into(),
            );
        }
        outboxd_connector_kit::config::check_duration(
            "http.timeout",
            self.timeout,
            Duration::from_millis(100),
            Duration::from_secs(600),
        )?;
        for name in &self.forward_headers {
            crate::webhooks::client::check_forwardable(name)
                .map_err(|e| format!("http.forward_headers: {e}"))?;
        }
        for (name, endpoint) in &self.endpoints {
            crate::webhooks::client::Poster::with_tls(
                &endpoint.url,
                self.timeout,
                &endpoint.tls()?,
            )
            .map_err(|e| format!("http.endpoints.{name}.{e}"))?;
            for secret in &endpoint.secrets {
                crate::webhooks::signature::Secret::parse(secret.expose())
                    .map_err(|e| format!("http.endpoints.{name}.secrets: {e}"))?;
            }
            if endpoint.concurrency == 0 || endpoint.concurrency > 1024 {
                return Err(format!(
                    "http.endpoints.{name}.concurrency must be between 1 and 1024"
                ));
            }
            if endpoint.max_queued_bytes < (64 << 10) || endpoint.max_queued_bytes > (1 << 30) {
                return Err(format!(
                    "http.endpoints.{name}.max_queued_bytes must be between 65536 (64 KiB) \
                     and 1073741824 (1 GiB)"
                ));
            }
            if endpoint.open_after == 0 || endpoint.open_after > 1000 {
                return Err(format!(
                    "http.endpoints.{name}.open_after must be between 1 and 1000"
                ));
            }
        }
        Ok(())
    }
}
