//! `[inbox]`: the receiving half. Present → `outboxd run` runs the inbox (ingress and
//! workers) on the `[source]` database's `inbox.table`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use outboxd_connector::{Secret, SecretError};
use outboxd_connector_kit::config::check_duration;
use serde::Deserialize;

/// `[inbox]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InboxConfig {
    /// The inbox table, optionally schema-qualified; default `outbox.inbox_table`'s
    /// (`inbox`).
    #[serde(default)]
    pub table: Option<String>,
    /// Messages handled at once (one per `biz_key` at most).
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// A claim older than this was abandoned (the process died mid-handler): the reaper
    /// returns it to FAILED. Must exceed the longest handler timeout.
    #[serde(default = "default_claim_timeout", with = "humantime_serde")]
    pub claim_timeout: Duration,
    /// With nothing due, how often the workers look anyway (rows made due by an operator,
    /// or by another outboxd's ingress).
    #[serde(default = "default_idle_check", with = "humantime_serde")]
    pub idle_check: Duration,
    /// The janitor never deletes an inbox row younger than this, whatever its status:
    /// it is the deduplication window.
    #[serde(default = "default_retention", with = "humantime_serde")]
    pub dedupe_retention: Duration,
    /// `[inbox.kafka]`: the consumer ingress; off when absent.
    #[serde(default)]
    pub kafka: Option<KafkaIngressConfig>,
    /// `[inbox.http]`: `POST /v1/inbox/{source}` on `metrics.listen`; off when absent.
    #[serde(default)]
    pub http: Option<HttpIngressConfig>,
    /// `[inbox.handlers.<message_type>]`, and `[inbox.handlers.default]` for the others.
    #[serde(default)]
    pub handlers: BTreeMap<String, HandlerConfig>,
}

/// `[inbox.kafka]`. `Debug` hides secret options.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaIngressConfig {
    /// `host:port[,host:port…]`; default `[kafka]`'s (a process with the outbox relay).
    #[serde(default)]
    pub bootstrap_servers: Option<String>,
    /// Topics to consume.
    pub topics: Vec<String>,
    /// The consumer group.
    pub group_id: String,
    /// The inbox `source` of every record; default: the record's topic.
    #[serde(default)]
    pub source: Option<String>,
    /// Header holding the message id (outboxd's relay writes `message_id`).
    #[serde(default = "header_message_id")]
    pub message_id_header: String,
    /// Header holding the message type.
    #[serde(default = "header_message_type")]
    pub message_type_header: String,
    /// Header holding the business key; without it, the record key.
    #[serde(default = "header_biz_key")]
    pub biz_key_header: String,
    /// A record without a message id gets `<topic>/<partition>/<offset>` as its id
    /// instead of being stored MANUAL_REQUIRED.
    #[serde(default)]
    pub derive_message_id: bool,
    /// Records stored per inbox transaction, at most.
    #[serde(default = "default_kafka_batch")]
    pub batch_size: usize,
    /// How long to wait for more records to fill a batch; 0 (default): store what has
    /// arrived (under load, batches fill while the previous insert commits).
    #[serde(default = "default_kafka_linger", with = "humantime_serde")]
    pub batch_wait: Duration,
    /// Any librdkafka consumer option (the bootstrap servers and security options of
    /// `[kafka]` apply too). `enable.auto.commit` is outboxd's: offsets are stored for the
    /// background commit only after the inbox transaction holding their records committed.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

impl std::fmt::Debug for KafkaIngressConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaIngressConfig")
            .field("topics", &self.topics)
            .field("group_id", &self.group_id)
            .field("source", &self.source)
            .field("batch_size", &self.batch_size)
            .field("batch_wait", &self.batch_wait)
            .field("options", &crate::secrets::RedactedOptions(&self.options))
            .finish_non_exhaustive()
    }
}

/// `[inbox.http]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpIngressConfig {
    /// Largest body accepted, in bytes (larger: 413).
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// Time allowed for one request, body and commit included.
    #[serde(default = "default_request_timeout", with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Standard Webhooks: how far `webhook-timestamp` may be from now.
    #[serde(default = "default_tolerance", with = "humantime_serde")]
    pub timestamp_tolerance: Duration,
    /// Signing secrets per source (`whsec_…` base64, or raw text), several at once while
    /// rotating. A source listed here accepts only correctly signed requests.
    #[serde(default)]
    pub secrets: BTreeMap<String, Vec<Secret>>,
    /// Per source, a file of its signing secrets, one a line (blank lines ignored), read at
    /// load into `secrets`; a source is in `secrets` or here, not both.
    #[serde(default)]
    pub secret_files: BTreeMap<String, PathBuf>,
    /// `[inbox.http.sources.<source>]`: how a source's requests are taken. A source with
    /// secrets needs no entry here; a source with neither is refused (401).
    #[serde(default)]
    pub sources: BTreeMap<String, HttpSourceConfig>,
}

/// `[inbox.http.sources.<source>]`
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSourceConfig {
    /// `"signature"` (default): Standard Webhooks signatures with the source's secrets;
    /// `"none"`: unsigned requests accepted on purpose (a warning at start says so).
    #[serde(default)]
    pub auth: SourceAuth,
    /// The member of the JSON body that holds the business key, as a dotted path
    /// (`"data.order_id"`); on a signed source the only way to give messages a key (and
    /// so an order). Without it: `Biz-Key` on unsigned sources, else the message id.
    #[serde(default)]
    pub key_field: Option<String>,
}

/// How an HTTP source's requests are authenticated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceAuth {
    /// Standard Webhooks signatures.
    #[default]
    Signature,
    /// None: anyone who reaches the endpoint may post as this source.
    None,
}

impl HttpIngressConfig {
    /// The sources requests are taken from: those with secrets (or secret files) and those
    /// unsigned on purpose.
    pub(crate) fn source_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = (self.secrets.keys().chain(self.secret_files.keys()))
            .map(String::as_str)
            .collect();
        for (name, source) in &self.sources {
            if source.auth == SourceAuth::None {
                names.push(name);
            }
        }
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Each `[inbox.http.sources.<source>]` consistent with the secrets.
    fn check_sources(&self) -> Result<(), String> {
        for (name, source) in &self.sources {
            let has_secrets =
                self.secrets.contains_key(name) || self.secret_files.contains_key(name);
            match source.auth {
                SourceAuth::None if has_secrets => {
                    return Err(format!(
                        "inbox.http.sources.{name}.auth = \"none\" but the source has signing \
                         secrets: remove one or the other"
                    ))
                }
                SourceAuth::Signature if !has_secrets => {
                    return Err(format!(
                        "inbox.http.sources.{name} requires signatures but has no secrets: add \
                         inbox.http.secrets.{name} (or secret_files.{name}), or set auth = \
                         \"none\" to take its requests unsigned"
                    ))
                }
                _ => {}
            }
            if let Some(field) = &source.key_field {
                if field
                    .split('.')
                    .any(|part| part.is_empty() || part.trim() != part)
                {
                    return Err(format!(
                        "inbox.http.sources.{name}.key_field `{field}` must be member names \
                         joined by dots, e.g. \"data.order_id\""
                    ));
                }
            }
        }
        Ok(())
    }
}

impl HttpIngressConfig {
    /// Reads `secret_files` into `secrets`.
    pub(crate) fn resolve_secret_files(&mut self) -> Result<(), SecretError> {
        for (source, path) in &self.secret_files {
            let file_key = format!("inbox.http.secret_files.{source}");
            if self.secrets.contains_key(source) {
                return Err(SecretError::Both {
                    key: format!("inbox.http.secrets.{source}"),
                    file_key,
                });
            }
            let secrets = crate::secrets::read_secret_lines(&file_key, path)?;
            self.secrets.insert(source.clone(), secrets);
        }
        Ok(())
    }
}

/// `[inbox.handlers.<message_type>]`
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum HandlerConfig {
    /// POST the payload to the user's service.
    Webhook {
        /// `http://host:port/path` or `https://…` (certificate verified against the
        /// system's roots).
        url: String,
        /// Time allowed for an answer.
        #[serde(default = "default_handler_timeout", with = "humantime_serde")]
        timeout: Duration,
        /// 4xx statuses retried like 5xx (408 and 429 always are).
        #[serde(default)]
        retryable_statuses: Vec<u16>,
        /// Message headers copied onto the request besides the trace context
        /// (`traceparent`, `tracestate`); a name ending in `*` is a prefix. Credentials,
        /// proxy and hop-by-hop headers are never copied.
        #[serde(default)]
        forward_headers: Vec<String>,
        /// Only messages from these sources; empty: any source.
        #[serde(default)]
        sources: Vec<String>,
    },
    /// A statement run in the transaction that marks the message DONE.
    Sql {
        /// SQL naming `:id`, `:source`, `:message_id`, `:message_type`, `:biz_key`,
        /// `:payload`, `:headers`.
        statement: String,
        /// Only messages from these sources; empty: any source.
        #[serde(default)]
        sources: Vec<String>,
    },
}

impl HandlerConfig {
    /// The sources the handler is bound to; empty: any.
    pub fn sources(&self) -> &[String] {
        match self {
            HandlerConfig::Webhook { sources, .. } | HandlerConfig::Sql { sources, .. } => sources,
        }
    }
}

fn default_workers() -> usize {
    8
}
fn default_claim_timeout() -> Duration {
    Duration::from_secs(120)
}
fn default_idle_check() -> Duration {
    Duration::from_secs(5)
}
/// `dedupe_retention` when `[inbox]` does not set it (7 days).
pub fn default_retention() -> Duration {
    Duration::from_secs(7 * 24 * 3600)
}
fn header_message_id() -> String {
    "message_id".into()
}
fn header_message_type() -> String {
    "message_type".into()
}
fn header_biz_key() -> String {
    "biz_key".into()
}
fn default_kafka_batch() -> usize {
    500
}
fn default_kafka_linger() -> Duration {
    Duration::ZERO
}
fn default_max_body() -> usize {
    1024 * 1024
}
fn default_request_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_tolerance() -> Duration {
    Duration::from_secs(5 * 60)
}
fn default_handler_timeout() -> Duration {
    Duration::from_secs(30)
}

impl InboxConfig {
    /// Every duration within its range: a huge one would overflow a deadline or a
    /// timestamp computed from it, a zero period would spin.
    fn check_durations(&self) -> Result<(), String> {
        let (ms, secs) = (Duration::from_millis, Duration::from_secs);
        const HOUR: u64 = 3600;
        const DAY: u64 = 24 * HOUR;
        let mut checks = vec![
            (
                "inbox.claim_timeout".to_owned(),
                self.claim_timeout,
                secs(1),
                secs(7 * DAY),
            ),
            (
                "inbox.idle_check".to_owned(),
                self.idle_check,
                ms(10),
                secs(HOUR),
            ),
            (
                "inbox.dedupe_retention".to_owned(),
                self.dedupe_retention,
                secs(1),
                secs(3650 * DAY),
            ),
        ];
        if let Some(kafka) = &self.kafka {
            checks.push((
                "inbox.kafka.batch_wait".into(),
                kafka.batch_wait,
                ms(0),
                secs(60),
            ));
        }
        if let Some(http) = &self.http {
            checks.push((
                "inbox.http.request_timeout".into(),
                http.request_timeout,
                ms(100),
                secs(HOUR),
            ));
            checks.push((
                "inbox.http.timestamp_tolerance".into(),
                http.timestamp_tolerance,
                secs(1),
                secs(DAY),
            ));
        }
        for (message_type, handler) in &self.handlers {
            if let HandlerConfig::Webhook { timeout, .. } = handler {
                checks.push((
                    format!("inbox.handlers.{message_type}.timeout"),
                    *timeout,
                    ms(1),
                    secs(HOUR),
                ));
            }
        }
        for (key, value, min, max) in checks {
            check_duration(&key, value, min, max)?;
        }
        Ok(())
    }

    /// Checks what serde cannot; errors name the key to fix.
    pub fn validate(&self, metrics_configured: bool) -> Result<(), String> {
        if self.workers == 0 || self.workers > 1024 {
            return Err("inbox.workers must be between 1 and 1024".into());
        }
        self.check_durations()?;
        if self.kafka.is_none() && self.http.is_none() {
            return Err(
                "[inbox] needs an ingress: add [inbox.kafka] (topics, group_id) or [inbox.http]"
                    .into(),
            );
        }
        for (message_type, handler) in &self.handlers {
            match handler {
                HandlerConfig::Webhook {
                    url,
                    timeout,
                    forward_headers,
                    ..
                } => {
                    for name in forward_headers {
                        super::handler::check_forwardable(name).map_err(|e| {
                            format!("inbox.handlers.{message_type}.forward_headers: {e}")
                        })?;
                    }
                    if !url.starts_with("http://") && !url.starts_with("https://") {
                        return Err(format!(
                            "inbox.handlers.{message_type}.url `{url}` must be an http:// or \
                             https:// URL"
                        ));
                    }
                    if url.parse::<hyper::Uri>().is_err() {
                        return Err(format!(
                            "inbox.handlers.{message_type}.url `{url}` is not a valid URL"
                        ));
                    }
                    // A call may take its timeout twice (the answer, then its body).
                    if *timeout * 2 >= self.claim_timeout || timeout.is_zero() {
                        return Err(format!(
                            "inbox.handlers.{message_type}.timeout must be above zero and \
                             less than half of inbox.claim_timeout ({:?}): a claim must outlast \
                             the call, or the reaper hands the message to another worker while \
                             it is still being delivered",
                            self.claim_timeout
                        ));
                    }
                }
                HandlerConfig::Sql { statement, .. } => {
                    if statement.trim().is_empty() {
                        return Err(format!("inbox.handlers.{message_type}.statement is empty"));
                    }
                    outboxd_connector_kit::inbox::bind_named(statement, |_| "?".into())
                        .map_err(|e| format!("inbox.handlers.{message_type}.statement: {e}"))?;
                }
            }
        }
        if let Some(kafka) = &self.kafka {
            if kafka.topics.is_empty() || kafka.group_id.trim().is_empty() {
                return Err("inbox.kafka needs topics and a group_id".into());
            }
            if kafka.batch_size == 0 || kafka.batch_size > 10_000 {
                return Err("inbox.kafka.batch_size must be between 1 and 10000".into());
            }
            if kafka.options.contains_key("enable.auto.commit") {
                return Err(
                    "inbox.kafka.options: enable.auto.commit is set by outboxd (offsets are \
                     stored for commit only after the inbox transaction)"
                        .into(),
                );
            }
        }
        if let Some(http) = &self.http {
            if !metrics_configured {
                return Err(
                    "[inbox.http] is served on metrics.listen: add a [metrics] section".into(),
                );
            }
            if http.max_body_bytes == 0 || http.max_body_bytes > 64 * 1024 * 1024 {
                return Err("inbox.http.max_body_bytes must be between 1 and 67108864".into());
            }
            for (source, secrets) in &http.secrets {
                for secret in secrets {
                    crate::webhooks::signature::Secret::parse(secret.expose())
                        .map_err(|e| format!("inbox.http.secrets.{source}: {e}"))?;
                }
            }
            http.check_sources()?;
            if http.source_names().is_empty() {
                return Err(
                    "[inbox.http] names no source, so every request would be refused \
                     (401): add signing secrets (inbox.http.secrets.<source> or \
                     secret_files.<source>), or [inbox.http.sources.<source>] auth = \"none\" \
                     for a source taken unsigned on purpose"
                        .into(),
                );
            }
            // A signed request may be replayed while its timestamp is within the
            // tolerance; its row must still be there to make the replay a duplicate.
            let signed = !http.secrets.is_empty() || !http.secret_files.is_empty();
            // A timestamp up to the tolerance ahead of the clock is taken too, so a
            // request may be replayed until twice the tolerance after it was received.
            if signed && self.dedupe_retention < http.timestamp_tolerance * 2 {
                return Err(format!(
                    "inbox.dedupe_retention ({:?}) is shorter than twice \
                     inbox.http.timestamp_tolerance ({:?}): a signed request replayed after \
                     its row was deleted would be stored again; make the retention longer",
                    self.dedupe_retention, http.timestamp_tolerance
                ));
            }
        }
        self.check_handler_sources()?;
        Ok(())
    }

    /// Every source a handler is bound to is one an ingress receives from: a misspelt
    /// name would leave the handler unused and its messages MANUAL_REQUIRED.
    fn check_handler_sources(&self) -> Result<(), String> {
        let mut known: Vec<&str> = Vec::new();
        if let Some(http) = &self.http {
            known.extend(http.source_names());
        }
        if let Some(kafka) = &self.kafka {
            match &kafka.source {
                Some(source) => known.push(source),
                None => known.extend(kafka.topics.iter().map(String::as_str)),
            }
        }
        for (message_type, handler) in &self.handlers {
            for source in handler.sources() {
                if !known.contains(&source.as_str()) {
                    return Err(format!(
                        "inbox.handlers.{message_type}.sources names `{source}`, which no \
                         ingress receives from (known: {})",
                        known.join(", ")
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    /// The commented `[inbox]` part of `examples/outboxd.toml`, uncommented, is a valid
    /// config: the documented keys are the keys the code reads.
    #[test]
    fn the_documented_inbox_keys_parse_and_validate() {
        let example = include_str!("../../examples/outboxd.toml");
        let start = example.find("# [inbox]").expect("the inbox part");
        let (head, inbox) = example.split_at(start);
        let uncommented: String = inbox
            .lines()
            .map(|l| l.strip_prefix("# ").unwrap_or(l))
            .filter(|l| *l != "#")
            .map(|l| format!("{l}\n"))
            .collect();
        let config = Config::parse(&format!("{head}\n{uncommented}")).expect("parses");
        config.validate().expect("valid");
        let inbox = config.inbox.expect("an inbox");
        assert_eq!(inbox.workers, 8);
        assert_eq!(inbox.handlers.len(), 2);
        assert!(inbox.kafka.is_some() && inbox.http.is_some());
    }

    /// Huge durations are errors naming the key, not panics when a deadline is computed.
    #[test]
    fn inbox_durations_are_bounded() {
        let base = include_str!("../../examples/outboxd.toml");
        let huge = "\"18446744073709551615s\"";
        for (extra, key) in [
            (format!("[inbox]\nclaim_timeout = {huge}\n[inbox.http]\n"), "inbox.claim_timeout"),
            ("[inbox]\nidle_check = \"0s\"\n[inbox.http]\n".to_owned(), "inbox.idle_check"),
            (format!("[inbox]\ndedupe_retention = {huge}\n[inbox.http]\n"), "inbox.dedupe_retention"),
            (format!("[inbox]\n[inbox.http]\nrequest_timeout = {huge}\n"), "inbox.http.request_timeout"),
            (format!("[inbox]\n[inbox.http]\ntimestamp_tolerance = {huge}\n"), "inbox.http.timestamp_tolerance"),
            (
                format!("[inbox]\n[inbox.kafka]\ntopics = [\"t\"]\ngroup_id = \"g\"\nbatch_wait = {huge}\n"),
                "inbox.kafka.batch_wait",
            ),
        ] {
            let config = Config::parse(&format!("{base}\n{extra}")).expect("parses");
            let err = config.validate().expect_err(key).to_string();
            assert!(err.contains(key) && err.contains("allowed from"), "{extra}: {err}");
        }
    }

    #[test]
    fn bad_inbox_settings_name_their_key() {
        let base = include_str!("../../examples/outboxd.toml");
        for (extra, key) in [
            ("[inbox]\n[inbox.handlers.default]\nkind = \"sql\"\nstatement = \"SELECT 1\"\n", "needs an ingress"),
            ("[inbox]\n[inbox.http]\n[inbox.handlers.default]\nkind = \"sql\"\nstatement = \"SELECT :nope\"\n", ":nope"),
            ("[inbox]\n[inbox.http]\n[inbox.handlers.default]\nkind = \"webhook\"\nurl = \"ftp://x\"\n", "http://"),
            ("[inbox]\n[inbox.http]\n[inbox.http.secrets]\ns = [\"short\"]\n", "inbox.http.secrets.s"),
            ("[inbox]\n[inbox.http]\n[inbox.handlers.default]\nkind = \"sql\"\nstatement = \"SELECT 1\"\n", "names no source"),
            ("[inbox]\n[inbox.http]\n[inbox.http.sources.w]\nauth = \"none\"\nkey_field = \"data. id\"\n", "key_field"),
            ("[inbox]\ndedupe_retention = \"9m\"\n[inbox.http]\n[inbox.http.secrets]\ns = [\"0123456789abcdef\"]\n", "twice"),
        ] {
            let config = Config::parse(&format!("{base}\n{extra}")).expect("parses");
            let err = config.validate().expect_err(extra).to_string();
            assert!(err.contains(key), "{extra}: {err}");
        }
    }
}
