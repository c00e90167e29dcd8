//! The TOML configuration: typed, `deny_unknown_fields`, validated before anything
//! connects, with secrets from the environment or files (see `crate::secrets`), and every
//! duration and size bounded at load.
//!
//! One file per section group: `pipeline.rs`, `source.rs`, `outbox.rs`, `delivery.rs`,
//! `retry.rs`, `poll.rs`, `metrics.rs`; the `[kafka]` section lives beside its sink
//! (`crate::sink::kafka`, `config.rs`) and `[inbox]` beside the inbox. This file holds
//! [`Config`] and its parsing, secret resolution and validation.

use std::path::Path;
use std::time::Duration;

use outboxd_connector::{Secret, SecretError};
use outboxd_connector_kit::config::check_duration;
use serde::Deserialize;

mod delivery;
mod features;
#[cfg(test)]
mod features_tests;
mod metrics;
mod outbox;
mod pipeline;
mod poll;
mod retry;
mod source;
#[cfg(test)]
mod tests;

pub use crate::secrets::ConfigWarning;

pub use crate::engines::SourceConfig;
pub use crate::sink::kafka::config::{
    CloudEventsConfig, CloudEventsMode, KafkaConfig, DEBEZIUM_TOPIC_TEMPLATE,
    ENV_KAFKA_BOOTSTRAP_SERVERS, ENV_KAFKA_SASL_PASSWORD,
};
pub use delivery::DeliveryConfig;
pub use metrics::{MetricsConfig, ENV_METRICS_BEARER_TOKEN};
pub use outbox::{ColumnsConfig, OutboxConfig, RowsConfig, TableLayout, DEBEZIUM_ROW_ID};
/// Environment variable that overrides `source.password`.
pub use outboxd_connector::ENV_SOURCE_PASSWORD;
pub use pipeline::{Ordering, PipelineConfig};
pub use poll::PollConfig;
pub use retry::{RetryConfig, DEFAULT_IDLE_CHECK};
pub use source::{SourceMode, SourceSection};

/// A configuration file that cannot be used, with the reason.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The path given.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown or missing keys.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The path given.
        path: String,
        /// What the parser said, with line and column.
        message: String,
    },
    /// The values do not make sense together.
    #[error("invalid config: {0}")]
    Invalid(String),
    /// A secret cannot be resolved (unreadable file, value and file both set).
    #[error("invalid config: {0}")]
    Secret(#[from] SecretError),
}

/// The whole configuration file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[pipeline]`: the name of the outbox relay's pipeline; optional without the relay.
    #[serde(default)]
    pub pipeline: PipelineConfig,
    /// `[source]`: the database, which both halves use.
    pub source: SourceSection,
    /// `[outbox]`: the outbox relay (present, or `[kafka]` present: the relay runs), its
    /// tables and how it finds rows.
    #[serde(default)]
    pub outbox: OutboxConfig,
    /// `[kafka]`: the relay's producer; absent in an inbox-only process or with `[http]`.
    #[serde(default)]
    pub kafka: KafkaConfig,
    /// `[http]`: the relay's HTTP sink, instead of `[kafka]`.
    #[serde(default)]
    pub http: Option<crate::sink::http::HttpSinkConfig>,
    /// `[delivery]`: in-flight bounds, write-back batching, shutdown.
    #[serde(default)]
    pub delivery: DeliveryConfig,
    /// `[retry]`: backoff of failed rows, the retry worker and the reaper.
    #[serde(default)]
    pub retry: RetryConfig,
    /// `[poll]`: poll mode's interval and batch.
    #[serde(default)]
    pub poll: PollConfig,
    /// `[metrics]`: the HTTP endpoint for `/metrics`, `/healthz` and `/readyz`; off when
    /// the section is absent.
    #[serde(default)]
    pub metrics: Option<MetricsConfig>,
    /// `[inbox]`: the receiving half; off when the section is absent.
    #[serde(default)]
    pub inbox: Option<crate::inbox::InboxConfig>,
    /// `[otlp]`: export the spans of traced events to an OpenTelemetry collector; off when
    /// the section is absent.
    #[serde(default)]
    pub otlp: Option<crate::observability::otlp::OtlpConfig>,
    /// `[canary]`: one row through the outbox every interval, its latency measured and
    /// `/readyz` failing when none arrives; off when the section is absent.
    #[serde(default)]
    pub canary: Option<crate::canary::CanaryConfig>,
    /// `[console]`: the operator console at `/ui` on the `[metrics]` address; off when
    /// the section is absent.
    #[serde(default)]
    pub console: Option<crate::console::ConsoleConfig>,
    /// What [`Config::load`] found wrong with the file itself (secrets in a file others
    /// may read); `check` prints it and `run` logs it.
    #[serde(skip)]
    pub warnings: Vec<ConfigWarning>,
}
impl Config {
    /// The config an operator command acts with: one outbox table. With several
    /// (`outbox.tables`), `table` names the one (as written in the list; row ids are
    /// per table); with one, `table`, if given, must be it.
    pub fn for_outbox_table(&self, table: Option<&str>) -> Result<Config, String> {
        let tables = self.outbox.layout().outbox_tables;
        let listed = tables.join(", ");
        let chosen = match table {
            None if tables.len() > 1 => {
                return Err(format!(
                    "outbox.tables names {} outbox tables ({listed}): name the one to act on \
                     with --table",
                    tables.len()
                ))
            }
            None => return Ok(self.clone()),
            Some(name) => tables
                .iter()
                .find(|t| t.as_str() == name)
                .or_else(|| tables.iter().find(|t| t.eq_ignore_ascii_case(name)))
                .ok_or_else(|| {
                    format!("--table {name}: not an outbox table of this pipeline ({listed})")
                })?,
        };
        let mut narrowed = self.clone();
        narrowed.outbox.table = chosen.clone();
        narrowed.outbox.tables = Vec::new();
        Ok(narrowed)
    }

    /// Reads `path`, resolves its secrets (environment, `*_file` keys) and validates it;
    /// [`Config::warnings`] says whether the file holds secrets others may read.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let mut config = Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.display().to_string(),
                message,
            },
            other => other,
        })?;
        // Parsed once more as a plain table: which secrets the file itself holds, before
        // the environment or files fill others in.
        if let Ok(table) = text.parse::<toml::Table>() {
            let keys = crate::secrets::inline_secrets(&table);
            config
                .warnings
                .extend(crate::secrets::permission_warning(path, &keys));
        }
        config.resolve_secrets(|name| std::env::var(name).ok())?;
        config.validate()?;
        Ok(config)
    }

    /// Parses TOML text without environment overrides or validation. An error on a line
    /// that may hold a secret names the line and key without quoting it.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let mut config: Self = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: "<text>".into(),
            message: crate::secrets::parse_error_message(&e, text),
        })?;
        let raw = text.parse::<toml::Table>().unwrap_or_default();
        // Debezium's Event Router routes to `outbox.event.<aggregatetype>`: so does the
        // Debezium layout unless the file names a template.
        if config.outbox.layout == TableLayout::Debezium {
            let named = raw
                .get("kafka")
                .and_then(|k| k.get("topic_template"))
                .is_some();
            if !named {
                config.kafka.topic_template = DEBEZIUM_TOPIC_TEMPLATE.into();
            }
        }
        config.apply_features(&raw)?;
        Ok(config)
    }

    /// Fills the secrets from the environment (which wins) or their `*_file` keys, and
    /// applies the environment's other overrides. `var` reads one variable. A file read
    /// that others may read adds a [`Config::warnings`] entry, as the config file does.
    pub fn resolve_secrets(
        &mut self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        // Every `*_file` key, the engines' and the inbox's too, is read with
        // `outboxd_connector::secret::read_file`, which notes the files others may read.
        let (resolved, readable) =
            outboxd_connector::secret::check_file_modes(|| self.read_secrets(&var));
        self.warnings
            .extend(readable.iter().map(crate::secrets::secret_file_warning));
        resolved
    }

    fn read_secrets(&mut self, var: &impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        self.source.engine.resolve_secrets(var)?;
        for (option, file_key, file, env) in [
            (
                "sasl.password",
                "kafka.sasl_password_file",
                &self.kafka.sasl_password_file,
                Some(ENV_KAFKA_SASL_PASSWORD),
            ),
            (
                "ssl.key.password",
                "kafka.ssl_key_password_file",
                &self.kafka.ssl_key_password_file,
                None,
            ),
        ] {
            let mut value = self.kafka.options.get(option).cloned().map(Secret::from);
            outboxd_connector::secret::resolve(
                &format!("kafka.options.\"{option}\""),
                file_key,
                &mut value,
                file.as_deref(),
                env.and_then(&var),
            )?;
            if let Some(value) = value {
                self.kafka
                    .options
                    .insert(option.to_owned(), value.expose().to_owned());
            }
        }
        if let Some(http) = self.inbox.as_mut().and_then(|i| i.http.as_mut()) {
            http.resolve_secret_files()?;
        }
        if let Some(http) = self.http.as_mut() {
            http.resolve_secret_files()?;
        }
        if let Some(metrics) = self.metrics.as_mut() {
            outboxd_connector::secret::resolve(
                "metrics.bearer_token",
                "metrics.bearer_token_file",
                &mut metrics.bearer_token,
                metrics.bearer_token_file.as_deref(),
                var(ENV_METRICS_BEARER_TOKEN),
            )?;
        }
        if let Some(console) = self.console.as_mut() {
            outboxd_connector::secret::resolve(
                "console.token",
                "console.token_file",
                &mut console.token,
                console.token_file.as_deref(),
                var(crate::console::ENV_CONSOLE_TOKEN),
            )?;
        }
        if let Some(servers) = var(ENV_KAFKA_BOOTSTRAP_SERVERS) {
            self.kafka.bootstrap_servers = servers;
        }
        Ok(())
    }

    /// Every duration within its range: a huge one would overflow the deadline computed
    /// from it (`Instant + d` panics), a zero period would spin. The engine's own keys
    /// are checked by the engine, the inbox's by [`crate::inbox::InboxConfig::validate`].
    fn check_durations(&self) -> Result<(), ConfigError> {
        let (ms, secs) = (Duration::from_millis, Duration::from_secs);
        const HOUR: u64 = 3600;
        const DAY: u64 = 24 * HOUR;
        let retry = &self.retry;
        for (key, value, min, max) in [
            // librdkafka's message.timeout.ms is an i32 of milliseconds (24.8 days).
            (
                "kafka.message_timeout",
                self.kafka.message_timeout,
                ms(100),
                secs(DAY),
            ),
            (
                "delivery.writeback_interval",
                self.delivery.writeback_interval,
                ms(0),
                secs(60),
            ),
            (
                "delivery.store_timeout",
                self.delivery.store_timeout,
                secs(1),
                secs(HOUR),
            ),
            (
                "delivery.shutdown_deadline",
                self.delivery.shutdown_deadline,
                ms(0),
                secs(HOUR),
            ),
            (
                "delivery.transaction_interval",
                self.delivery.transaction_interval,
                ms(1),
                secs(60),
            ),
            ("retry.base", retry.base, ms(1), secs(HOUR)),
            // Delays longer than a year are clamped when written (MAX_RETRY_DELAY).
            (
                "retry.cap",
                retry.cap,
                ms(1),
                outboxd_connector_kit::retry::MAX_RETRY_DELAY,
            ),
            ("retry.jitter", retry.jitter, ms(0), secs(HOUR)),
            (
                "retry.claim_timeout",
                retry.claim_timeout,
                secs(1),
                secs(7 * DAY),
            ),
            (
                "retry.idle_check",
                retry.idle_check.unwrap_or(DEFAULT_IDLE_CHECK),
                ms(10),
                secs(DAY),
            ),
            ("poll.interval", self.poll.interval, ms(10), secs(HOUR)),
        ] {
            check_duration(key, value, min, max).map_err(ConfigError::Invalid)?;
        }
        self.source.engine.validate().map_err(ConfigError::Invalid)
    }

    /// `[canary]` with the rest of the file: it needs the relay (it writes an outbox row
    /// and waits for the sink), rows kept (it deletes its row once SUCCESS), outboxd's own
    /// table (whose columns it writes, the topic column among them), and its own topic
    /// (with `[http]`, an endpoint).
    fn validate_canary(&self, canary: &crate::canary::CanaryConfig) -> Result<(), String> {
        canary.validate()?;
        if !self.relays_outbox() {
            return Err(
                "[canary] needs the outbox relay ([outbox] with [kafka] or [http]): it \
                        sends a row through it"
                    .into(),
            );
        }
        if self.outbox.rows() == outboxd_connector::RowLifecycle::Deleted {
            return Err(
                "[canary] needs outbox.rows = \"kept\": it finds its row by its status".into(),
            );
        }
        if self.outbox.layout().columns != outboxd_connector::ColumnNames::default() {
            return Err("[canary] writes the columns of outboxd's own outbox table \
                        (schemas/*/outbox.sql); with outbox.columns or the Debezium layout, \
                        leave [canary] out"
                .into());
        }
        let Some(topic) = &canary.topic else {
            return Err(
                "canary.topic is missing: name the canary's own Kafka topic (with \
                        [http], the endpoint) that no consumer reads as business events"
                    .into(),
            );
        };
        // Kafka would refuse every canary row (MANUAL_REQUIRED each interval).
        self.own_route_refusal(topic)
            .map_or(Ok(()), |why| Err(format!("canary.topic `{topic}`: {why}")))
    }

    /// Why the sink would refuse rows outboxd writes itself (the canary's, `verify`'s)
    /// with `topic` in the topic column: with `[http]` it must name an endpoint; with
    /// Kafka it must be allowed (`kafka.allowed_topics`) and not reserved.
    pub(crate) fn own_route_refusal(&self, topic: &str) -> Option<String> {
        if let Some(http) = &self.http {
            return (!http.endpoints.contains_key(topic)).then(|| {
                "it is not an endpoint of [http.endpoints]: with the HTTP sink it names the \
                 endpoint the rows are sent to"
                    .to_owned()
            });
        }
        let allowed = match crate::sink::kafka::AllowedTopics::parse(&self.kafka.allowed_topics) {
            Ok(allowed) => allowed,
            Err(e) => return Some(e),
        };
        let reserved = crate::sink::kafka::ReservedTopics::new(
            self.kafka.positions_topic(&self.pipeline.name),
        );
        allowed.refusal(topic).or_else(|| reserved.refusal(topic))
    }

    /// Checks what serde cannot: names, bounds, and librdkafka options that would
    /// weaken the delivery guarantee.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let name = &self.pipeline.name;
        let valid_name = !name.is_empty()
            && name.len() <= 48
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !valid_name {
            return Err(ConfigError::Invalid(format!(
                "pipeline.name `{name}` must be 1 to 48 characters of a-z, 0-9 and _ \
                 (it names the replication slot and publication)"
            )));
        }
        if let Some(http) = &self.http {
            http.validate().map_err(ConfigError::Invalid)?;
            crate::sink::kafka::TopicTemplate::parse(&http.endpoint_template)
                .and_then(|t| t.with_tables(&self.outbox.layout().outbox_tables))
                .map_err(|e| {
                    ConfigError::Invalid(
                        e.replace("kafka.topic_template", "http.endpoint_template"),
                    )
                })?;
            if self.delivery.exactly_once {
                return Err(ConfigError::Invalid(
                    "delivery.exactly_once = true needs the Kafka sink: HTTP has no \
                     transactions to commit the log position with"
                        .into(),
                ));
            }
            if self.outbox.rows() == outboxd_connector::RowLifecycle::Deleted {
                return Err(ConfigError::Invalid(
                    "outbox.rows = \"deleted\" (the Debezium layout's default) needs the Kafka \
                     sink: with no row to mark FAILED, an endpoint's refusal (a 4xx while a \
                     secret rotates, a 404 during a deploy) would stop the relay; keep the rows \
                     (outbox.rows = \"kept\")"
                        .into(),
                ));
            }
        }
        if self.sends_to_kafka() && self.kafka.bootstrap_servers.trim().is_empty() {
            return Err(ConfigError::Invalid(
                "kafka.bootstrap_servers is empty".into(),
            ));
        }
        if self.inbox.as_ref().is_some_and(|i| i.kafka.is_some())
            && self.inbox_bootstrap_servers().is_none()
        {
            return Err(ConfigError::Invalid(
                "[inbox.kafka] needs the brokers: set inbox.kafka.bootstrap_servers".into(),
            ));
        }
        let template = crate::sink::kafka::TopicTemplate::parse(&self.kafka.topic_template)
            .and_then(|t| t.with_tables(&self.outbox.layout().outbox_tables))
            .map_err(ConfigError::Invalid)?;
        crate::sink::kafka::validate_options(&self.kafka.options).map_err(ConfigError::Invalid)?;
        crate::secrets::check_kafka_options("kafka.options", &self.kafka.options)
            .map_err(ConfigError::Invalid)?;
        if let Some(kafka) = self.inbox.as_ref().and_then(|i| i.kafka.as_ref()) {
            crate::secrets::check_kafka_options("inbox.kafka.options", &kafka.options)
                .map_err(ConfigError::Invalid)?;
        }
        crate::sink::kafka::AllowedTopics::parse(&self.kafka.allowed_topics)
            .map_err(ConfigError::Invalid)?;
        // Positions and internal topics are refused row by row whatever the list says; a
        // list entry or a template that can only name them is a mistake to report now.
        let reserved = crate::sink::kafka::ReservedTopics::new(self.kafka.positions_topic(name));
        reserved
            .check_allowed_topics(&self.kafka.allowed_topics)
            .and_then(|()| reserved.check_template(&template, name))
            .map_err(ConfigError::Invalid)?;
        if let Some(cloudevents) = &self.kafka.cloudevents {
            cloudevents.validate().map_err(ConfigError::Invalid)?;
        }
        if let Some(otlp) = &self.otlp {
            otlp.validate().map_err(ConfigError::Invalid)?;
        }
        if let Some(canary) = &self.canary {
            self.validate_canary(canary).map_err(ConfigError::Invalid)?;
        }
        if let Some(console) = &self.console {
            console.validate().map_err(ConfigError::Invalid)?;
            if self.metrics.is_none() {
                return Err(ConfigError::Invalid(
                    "[console] is served on the [metrics] address: add [metrics]".into(),
                ));
            }
        }
        let d = &self.delivery;
        if d.max_in_flight_bytes < (1 << 20) || d.max_in_flight_bytes > (16 << 30) {
            return Err(ConfigError::Invalid(
                "delivery.max_in_flight_bytes must be between 1048576 (1 MiB) and 17179869184 \
                 (16 GiB)"
                    .into(),
            ));
        }
        if d.max_in_flight == 0 || d.max_in_flight > 1_000_000 {
            return Err(ConfigError::Invalid(
                "delivery.max_in_flight must be between 1 and 1000000".into(),
            ));
        }
        if d.writeback_batch == 0 || d.writeback_batch > 50_000 {
            return Err(ConfigError::Invalid(
                "delivery.writeback_batch must be between 1 and 50000".into(),
            ));
        }
        self.check_durations()?;
        self.outbox
            .validate(self.source.mode)
            .map_err(ConfigError::Invalid)?;
        if d.exactly_once && self.source.mode == SourceMode::Poll {
            return Err(ConfigError::Invalid(
                "delivery.exactly_once = true needs outbox.mode = \"log\": poll mode has no \
                 log position to commit with the records"
                    .into(),
            ));
        }
        if self
            .kafka
            .positions_topic
            .as_ref()
            .is_some_and(|t| t.trim().is_empty())
            || self
                .kafka
                .transactional_id
                .as_ref()
                .is_some_and(|id| id.trim().is_empty())
        {
            return Err(ConfigError::Invalid(
                "kafka.positions_topic and kafka.transactional_id must not be empty".into(),
            ));
        }
        if let SourceConfig::Mysql(mysql) = &self.source.engine {
            if mysql.server_id == 0 && self.relays_outbox() {
                return Err(ConfigError::Invalid(
                    "source.server_id is missing: the outbox relay registers with the server \
                     as a replica and needs an id unique among its replicas (an inbox-only \
                     process leaves it out)"
                        .into(),
                ));
            }
        }
        if let SourceConfig::Postgres(pg) = &self.source.engine {
            if pg.slot_failover && self.source.mode == SourceMode::Poll {
                return Err(ConfigError::Invalid(
                    "source.slot_failover = true needs mode = \"log\": poll mode has no slot"
                        .into(),
                ));
            }
        }
        if self.retry.base.is_zero() || self.retry.cap < self.retry.base {
            return Err(ConfigError::Invalid(
                "retry.base must be above zero and retry.cap at least retry.base".into(),
            ));
        }
        for (key, n) in [
            ("retry.batch_size", self.retry.batch_size),
            ("poll.batch_size", self.poll.batch_size),
        ] {
            if n == 0 || n > 10_000 {
                return Err(ConfigError::Invalid(format!(
                    "{key} must be between 1 and 10000"
                )));
            }
        }
        if self.retry.claim_timeout <= self.sink_timeout() {
            return Err(ConfigError::Invalid(format!(
                "retry.claim_timeout ({:?}) must be longer than kafka.message_timeout or \
                 http.timeout ({:?}): otherwise the reaper takes back rows whose delivery is \
                 still being retried",
                self.retry.claim_timeout,
                self.sink_timeout()
            )));
        }
        if let Some(inbox) = &self.inbox {
            inbox
                .validate(self.metrics.is_some())
                .map_err(ConfigError::Invalid)?;
        }
        let layout = self.outbox.layout();
        for (key, value) in self
            .outbox
            .tables
            .iter()
            .map(|t| ("outbox.tables", t))
            .chain([
                ("outbox.table", &self.outbox.table),
                ("outbox.inbox_table", &self.outbox.inbox_table),
                ("outbox.checkpoint_table", &self.outbox.checkpoint_table),
                ("outbox.key_column", &layout.key_column),
            ])
        {
            if value.trim().is_empty() || value.contains('"') {
                return Err(ConfigError::Invalid(format!(
                    "{key} `{value}` must be a non-empty name without double quotes"
                )));
            }
        }
        Ok(())
    }
}
