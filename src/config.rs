//! The TOML configuration: typed, `deny_unknown_fields`, validated before anything
//! connects, with secrets from the environment or files (see `crate::secrets`), and every
//! duration and size bounded at load.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use outboxd_connector::{ColumnNames, OutboxLayout, RowLifecycle, Secret, SecretError};
use outboxd_connector_kit::config::check_duration;
use serde::Deserialize;

pub use crate::secrets::ConfigWarning;

pub use crate::engines::SourceConfig;
/// Environment variable that overrides `source.password`.
pub use outboxd_connector::ENV_SOURCE_PASSWORD;
/// Environment variable that sets the librdkafka option `sasl.password`.
pub const ENV_KAFKA_SASL_PASSWORD: &str = "OUTBOXD_KAFKA_SASL_PASSWORD";
/// Environment variable that overrides `kafka.bootstrap_servers`.
pub const ENV_KAFKA_BOOTSTRAP_SERVERS: &str = "OUTBOXD_KAFKA_BOOTSTRAP_SERVERS";

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
    /// `[pipeline]`: the name of this source → Kafka pipeline.
    pub pipeline: PipelineConfig,
    /// `[source]`: the database to tail, and how.
    pub source: SourceSection,
    /// `[outbox]`: table names and the key column.
    #[serde(default)]
    pub outbox: OutboxConfig,
    /// `[kafka]`: the producer.
    pub kafka: KafkaConfig,
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
    /// What [`Config::load`] found wrong with the file itself (secrets in a file others
    /// may read); `check` prints it and `run` logs it.
    #[serde(skip)]
    pub warnings: Vec<ConfigWarning>,
}

/// `[pipeline]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// Names the checkpoint row and, by default, the slot and publication
    /// (`outboxd_<name>`). Lower-case letters, digits and `_`.
    pub name: String,
    /// Per-key ordering under failures.
    #[serde(default)]
    pub ordering: Ordering,
}

/// What happens to later events of a `biz_key` while an earlier one is FAILED,
/// PROCESSING or MANUAL_REQUIRED.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ordering {
    /// They are parked (status FAILED, due at once, `last_error` says why) and released
    /// in id order once the earlier event succeeds or an operator resolves it. Other keys
    /// flow without delay.
    #[default]
    Strict,
    /// They are published at once; a retried event arrives after later ones of its key.
    Relaxed,
}

/// `[source]`: how to read the outbox (`mode`) and the engine settings (`kind` and the
/// engine's own keys).
#[derive(Clone, Debug, Deserialize)]
pub struct SourceSection {
    /// `log` (default) tails the database log; `poll` claims INIT rows with
    /// `SELECT … FOR UPDATE SKIP LOCKED`, for databases where log access is not granted.
    #[serde(default)]
    pub mode: SourceMode,
    /// The engine and its connection settings.
    #[serde(flatten)]
    pub engine: SourceConfig,
}

/// How outboxd finds new outbox rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceMode {
    /// Logical replication / binlog: no polling, millisecond latency.
    #[default]
    Log,
    /// The claim query every `poll.interval`.
    Poll,
}

/// `[outbox]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutboxConfig {
    /// Outbox table, optionally schema-qualified.
    pub table: String,
    /// Several outbox tables read by one stream (a schema per tenant, a table per bounded
    /// context), instead of `table`: the topic template's `{schema}` and `{table}` tell
    /// their records apart. With kept rows each row's status is written to its table; the
    /// operator's commands take `--table` to address one.
    pub tables: Vec<String>,
    /// Inbox table, optionally schema-qualified.
    pub inbox_table: String,
    /// Checkpoint table, optionally schema-qualified.
    pub checkpoint_table: String,
    /// Column whose value is the Kafka record key; the layout's business key column
    /// (`biz_key`, Debezium's `aggregateid`) unless set.
    pub key_column: Option<String>,
    /// Whether `outboxd run` relays the outbox. `false` for a process that only runs the
    /// inbox (`[inbox]`) on this database.
    pub relay: bool,
    /// Whose column names the outbox has: outboxd's own (`schemas/*/outbox.sql`) or
    /// Debezium's outbox table.
    pub layout: TableLayout,
    /// Whether rows stay and carry their status (`kept`), or the application deletes
    /// them (`deleted`); by default `kept` for outboxd's layout, `deleted` for Debezium's.
    pub rows: Option<RowsConfig>,
    /// `[outbox.columns]`: column names that differ from the layout's.
    pub columns: ColumnsConfig,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        let layout = OutboxLayout::default();
        Self {
            table: layout.outbox_table().to_owned(),
            tables: Vec::new(),
            inbox_table: layout.inbox_table,
            checkpoint_table: layout.checkpoint_table,
            key_column: None,
            relay: true,
            layout: TableLayout::Outboxd,
            rows: None,
            columns: ColumnsConfig::default(),
        }
    }
}

/// `outbox.layout`
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TableLayout {
    /// `schemas/*/outbox.sql`.
    #[default]
    Outboxd,
    /// Debezium's outbox table: `id` (uuid), `aggregatetype`, `aggregateid`, `type`,
    /// `payload`, `tracingspancontext`.
    Debezium,
}

/// `outbox.rows`
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RowsConfig {
    /// Rows stay, outboxd writes their status.
    Kept,
    /// The application deletes rows; outboxd reads them from the log only.
    Deleted,
}

/// The integer row id `init --add-columns` adds to Debezium's table for kept rows
/// (`outbox.layout = "debezium"`, `outbox.rows = "kept"`), unless `outbox.columns.id`
/// names another.
pub const DEBEZIUM_ROW_ID: &str = "outboxd_seq";

/// `[outbox.columns]`: each key overrides one column name of the layout. With kept rows
/// `id` must be an integer row id, and the status columns keep outboxd's names (`init
/// --add-columns` adds them).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ColumnsConfig {
    /// An integer primary key; `""` for none.
    pub id: Option<String>,
    pub message_id: Option<String>,
    pub message_type: Option<String>,
    pub biz_key: Option<String>,
    /// A per-row topic; `""` for none.
    pub topic: Option<String>,
    pub payload: Option<String>,
    /// A JSON object of headers; `""` for none.
    pub headers: Option<String>,
    /// `""` for none.
    pub created_at: Option<String>,
    /// The `{routing}` of `kafka.topic_template`.
    pub routing: Option<String>,
    /// W3C trace context (a `traceparent`, or `traceparent=…` lines).
    pub trace: Option<String>,
    /// Further columns sent as headers named after them.
    pub header_columns: Option<Vec<String>>,
}

impl ColumnsConfig {
    /// `base` with these overrides; `""` means "the table has none".
    fn apply(&self, mut base: ColumnNames) -> ColumnNames {
        let optional = |value: &Option<String>, base: &mut Option<String>| {
            if let Some(value) = value {
                *base = (!value.is_empty()).then(|| value.clone());
            }
        };
        let required = |value: &Option<String>, base: &mut String| {
            if let Some(value) = value {
                *base = value.clone();
            }
        };
        optional(&self.id, &mut base.id);
        required(&self.message_id, &mut base.message_id);
        required(&self.message_type, &mut base.message_type);
        required(&self.biz_key, &mut base.biz_key);
        optional(&self.topic, &mut base.topic);
        required(&self.payload, &mut base.payload);
        optional(&self.headers, &mut base.headers);
        optional(&self.created_at, &mut base.created_at);
        optional(&self.routing, &mut base.routing);
        optional(&self.trace, &mut base.trace);
        if let Some(columns) = &self.header_columns {
            base.header_columns = columns.clone();
        }
        base
    }
}

impl OutboxConfig {
    /// `kept` or `deleted`, the layout's default when not set.
    pub fn rows(&self) -> RowLifecycle {
        match (self.rows, self.layout) {
            (Some(RowsConfig::Kept), _) | (None, TableLayout::Outboxd) => RowLifecycle::Kept,
            (Some(RowsConfig::Deleted), _) | (None, TableLayout::Debezium) => RowLifecycle::Deleted,
        }
    }

    /// The layout handed to connectors.
    pub fn layout(&self) -> OutboxLayout {
        let base = match (self.layout, self.rows()) {
            (TableLayout::Outboxd, _) => ColumnNames::default(),
            (TableLayout::Debezium, RowLifecycle::Deleted) => ColumnNames::debezium(),
            // Debezium's table has no integer id: `init --add-columns` adds this one.
            (TableLayout::Debezium, RowLifecycle::Kept) => ColumnNames {
                id: Some(DEBEZIUM_ROW_ID.into()),
                ..ColumnNames::debezium()
            },
        };
        let columns = self.columns.apply(base);
        OutboxLayout {
            outbox_tables: match self.tables.is_empty() {
                true => vec![self.table.clone()],
                false => self.tables.clone(),
            },
            inbox_table: self.inbox_table.clone(),
            checkpoint_table: self.checkpoint_table.clone(),
            key_column: self
                .key_column
                .clone()
                .unwrap_or_else(|| columns.biz_key.clone()),
            rows: self.rows(),
            columns,
        }
    }

    /// The combinations that cannot work, with what to change.
    fn validate(&self, mode: SourceMode) -> Result<(), String> {
        let deleted = self.rows() == RowLifecycle::Deleted;
        // Decided as the connectors decide it: the layout's names are not outboxd's own.
        let mapped = self.layout().columns != ColumnNames::default();
        if !deleted && mapped {
            // Kept rows on the application's own table (Debezium's, or renamed columns):
            // the status columns are added to it (`init --add-columns`) and every
            // statement names its columns as mapped.
            if mode == SourceMode::Poll {
                return Err(
                    "source.mode = \"poll\" reads outboxd's own table only: with \
                     outbox.layout = \"debezium\" or [outbox.columns] use source.mode = \"log\""
                        .into(),
                );
            }
            if self.layout().columns.id.is_none() {
                return Err(
                    "outbox.rows = \"kept\" needs an integer row id column to address and \
                     order rows: set outbox.columns.id (`outboxd init --add-columns` adds it)"
                        .into(),
                );
            }
        }
        if !self.tables.is_empty() {
            if self.table != OutboxLayout::default().outbox_table() {
                return Err("set outbox.table or outbox.tables, not both".into());
            }
            let mut seen = std::collections::HashSet::new();
            for name in &self.tables {
                if !seen.insert(name.to_lowercase()) {
                    return Err(format!("outbox.tables names `{name}` twice"));
                }
            }
            if self.tables.len() > usize::from(u16::MAX) {
                return Err("outbox.tables: at most 65535 tables".into());
            }
        }
        if deleted && mode == SourceMode::Poll {
            return Err(
                "outbox.rows = \"deleted\" needs source.mode = \"log\": deleted rows \
                        are only in the log, there is nothing to poll"
                    .into(),
            );
        }
        let names = self.layout().columns;
        for (key, name) in [
            ("message_id", &names.message_id),
            ("message_type", &names.message_type),
            ("biz_key", &names.biz_key),
            ("payload", &names.payload),
        ] {
            if name.trim().is_empty() {
                return Err(format!("outbox.columns.{key} must name a column"));
            }
        }
        if names.header_columns.iter().any(|c| c.trim().is_empty()) {
            return Err("outbox.columns.header_columns must not hold an empty name".into());
        }
        Ok(())
    }
}

/// `[kafka]`. `Debug` hides secret options (`sasl.password`, `ssl.key.password`, …).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// `host:port[,host:port…]`; `OUTBOXD_KAFKA_BOOTSTRAP_SERVERS` overrides it.
    pub bootstrap_servers: String,
    /// Topic for rows whose `topic` column is NULL. Placeholders: `{message_type}`,
    /// `{pipeline}`.
    #[serde(default = "default_topic_template")]
    pub topic_template: String,
    /// How long librdkafka keeps retrying one record before the row is marked FAILED.
    #[serde(default = "default_message_timeout", with = "humantime_serde")]
    pub message_timeout: Duration,
    /// Any librdkafka producer option (`compression.type`, `security.protocol`,
    /// `sasl.mechanism`, …). Options that would weaken the delivery guarantee are
    /// rejected.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
    /// Topics a row may be sent to: exact names and `*` patterns. Empty (the default):
    /// any. A row routed elsewhere is never sent; it becomes MANUAL_REQUIRED. Positions
    /// topics (`outboxd-positions-*`, `positions_topic`) and Kafka's internal topics
    /// (`__*`) are refused whatever the list says.
    #[serde(default)]
    pub allowed_topics: Vec<String>,
    /// File holding the librdkafka option `sasl.password`, read at load into `options`.
    #[serde(default)]
    pub sasl_password_file: Option<PathBuf>,
    /// File holding the librdkafka option `ssl.key.password`, read at load into `options`.
    #[serde(default)]
    pub ssl_key_password_file: Option<PathBuf>,
    /// `[kafka.cloudevents]`: every record also carries CloudEvents attributes as headers
    /// (the Kafka protocol binding's binary content mode); off when the section is absent.
    #[serde(default)]
    pub cloudevents: Option<CloudEventsConfig>,
    /// Exactly-once (`delivery.exactly_once`): the producer's `transactional.id`, one per
    /// pipeline; a second instance with the same id fences the first. Default:
    /// `outboxd-<pipeline.name>`.
    #[serde(default)]
    pub transactional_id: Option<String>,
    /// Exactly-once: the compacted topic where each Kafka transaction records the log
    /// position it reaches (keyed by `transactional_id`); created when missing. Default:
    /// `outboxd-positions-<pipeline.name>`, one per pipeline, so that no other pipeline's
    /// open transaction can hold back what a starting session reads.
    #[serde(default)]
    pub positions_topic: Option<String>,
}

impl KafkaConfig {
    /// The producer's `transactional.id` under exactly-once.
    pub fn transactional_id(&self, pipeline: &str) -> String {
        self.transactional_id
            .clone()
            .unwrap_or_else(|| format!("outboxd-{pipeline}"))
    }

    /// The topic of committed positions under exactly-once.
    pub fn positions_topic(&self, pipeline: &str) -> String {
        self.positions_topic
            .clone()
            .unwrap_or_else(|| format!("outboxd-positions-{pipeline}"))
    }
}

/// `[kafka.cloudevents]`: `ce_id` is the message id, `ce_type` the message type,
/// `ce_subject` the biz_key and `ce_time` the row's `created_at`; these two are the
/// pipeline's own.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CloudEventsConfig {
    /// `ce_source`, a URI-reference naming what produced the events. Default:
    /// `/outboxd/<pipeline.name>`.
    pub source: Option<String>,
    /// `content-type` (the event's `datacontenttype`) unless the row's `headers` set one.
    pub content_type: String,
    /// How the event travels: attributes as `ce_` headers and the payload as the value
    /// (`binary`, the default), or the whole event as one JSON document in the value
    /// (`structured`).
    pub mode: CloudEventsMode,
}

impl Default for CloudEventsConfig {
    fn default() -> Self {
        Self {
            source: None,
            content_type: "application/json".into(),
            mode: CloudEventsMode::Binary,
        }
    }
}

/// `kafka.cloudevents.mode`: the two content modes of the CloudEvents Kafka protocol
/// binding.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CloudEventsMode {
    /// Attributes as `ce_` record headers; the value is the payload as stored.
    #[default]
    Binary,
    /// The event as one JSON document (`application/cloudevents+json`): attributes as
    /// members, the payload as `data` (JSON content) or `data_base64` (anything else).
    Structured,
}

impl CloudEventsConfig {
    /// `ce_source` for `pipeline`.
    pub fn source(&self, pipeline: &str) -> String {
        self.source
            .clone()
            .unwrap_or_else(|| format!("/outboxd/{pipeline}"))
    }

    /// A non-empty URI-reference (RFC 3986 characters, `%` followed by two hex digits) and
    /// a media type: header values consumers parse.
    fn validate(&self) -> Result<(), String> {
        if let Some(source) = &self.source {
            let bytes = source.as_bytes();
            let uri_char =
                |b: u8| b.is_ascii_alphanumeric() || b"-._~:/?#[]@!$&'()*+,;=%".contains(&b);
            let escapes_ok = bytes.iter().enumerate().all(|(i, b)| {
                *b != b'%'
                    || bytes
                        .get(i + 1..i + 3)
                        .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
            });
            if source.is_empty() || !bytes.iter().all(|b| uri_char(*b)) || !escapes_ok {
                return Err(format!(
                    "kafka.cloudevents.source `{source}` must be a non-empty URI-reference \
                     (e.g. `/orders-service` or `urn:example:orders`; percent-encode other \
                     characters)"
                ));
            }
        }
        let ct = &self.content_type;
        let printable = ct.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
        if !printable || !ct.split(';').next().is_some_and(|t| t.trim().contains('/')) {
            return Err(format!(
                "kafka.cloudevents.content_type `{ct}` must be a media type such as \
                 `application/json` or `application/protobuf; proto=orders.v1.OrderCreated`"
            ));
        }
        Ok(())
    }
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("topic_template", &self.topic_template)
            .field("message_timeout", &self.message_timeout)
            .field("options", &crate::secrets::RedactedOptions(&self.options))
            .field("allowed_topics", &self.allowed_topics)
            .field("sasl_password_file", &self.sasl_password_file)
            .field("ssl_key_password_file", &self.ssl_key_password_file)
            .field("cloudevents", &self.cloudevents)
            .field("transactional_id", &self.transactional_id)
            .field("positions_topic", &self.positions_topic)
            .finish_non_exhaustive()
    }
}

/// The topic template of `outbox.layout = "debezium"`: Debezium's Event Router default.
pub const DEBEZIUM_TOPIC_TEMPLATE: &str = "outbox.event.{routing}";

fn default_topic_template() -> String {
    "outbox.{message_type}".into()
}

fn default_message_timeout() -> Duration {
    Duration::from_secs(30)
}

/// `[delivery]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeliveryConfig {
    /// Records handed to Kafka and not yet acknowledged, at most. Reading the log pauses
    /// at this bound.
    pub max_in_flight: usize,
    /// Bytes of events (payload, key, headers) read and not yet written back, at most:
    /// reading the log pauses at this bound, inside a large transaction too (its rows
    /// arrive in parts). The Kafka producer's local queue is bounded by the same figure
    /// (`queue.buffering.max.kbytes`, unless set in `[kafka.options]`).
    pub max_in_flight_bytes: usize,
    /// Acknowledged rows written back in one statement, at most.
    pub writeback_batch: usize,
    /// How long an acknowledged row may wait for its batch to fill.
    #[serde(with = "humantime_serde")]
    pub writeback_interval: Duration,
    /// On SIGTERM/SIGINT, how long in-flight deliveries may take to finish.
    #[serde(with = "humantime_serde")]
    pub shutdown_deadline: Duration,
    /// Exactly-once into Kafka (log mode): records go out in Kafka transactions that
    /// also carry the log position they reach (`kafka.positions_topic`), so a
    /// `read_committed` consumer sees each row once across crashes. See README.
    pub exactly_once: bool,
    /// Exactly-once: how long a Kafka transaction stays open before it is committed (at
    /// the next database transaction boundary). Longer: fewer commits, more latency.
    #[serde(with = "humantime_serde")]
    pub transaction_interval: Duration,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        Self {
            max_in_flight: 10_000,
            max_in_flight_bytes: 64 << 20,
            writeback_batch: 1_000,
            writeback_interval: Duration::from_millis(5),
            shutdown_deadline: Duration::from_secs(30),
            exactly_once: false,
            transaction_interval: Duration::from_millis(100),
        }
    }
}

/// `[retry]`: `next_retry_time = now + min(base * 2^retry_count, cap) + random(0..jitter)`,
/// and the worker that retries due FAILED rows.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Delay after the first failure.
    #[serde(with = "humantime_serde")]
    pub base: Duration,
    /// Longest delay between attempts.
    #[serde(with = "humantime_serde")]
    pub cap: Duration,
    /// Random extra delay, so failed rows of one burst do not retry in lockstep.
    #[serde(with = "humantime_serde")]
    pub jitter: Duration,
    /// Rows claimed per round of the retry worker.
    pub batch_size: usize,
    /// A row PROCESSING longer than this was abandoned by a stopped worker: the reaper
    /// returns it to FAILED (or MANUAL_REQUIRED at the limit).
    #[serde(with = "humantime_serde")]
    pub claim_timeout: Duration,
    /// With no FAILED row known, the retry worker still looks this often. Unset (the
    /// default): on PostgreSQL it sleeps until woken (a failure in the log pipeline, or
    /// the NOTIFY of `outboxd retry`/`resolve`), so an idle outbox sees no query; on
    /// engines without notifications it looks every 60 s.
    #[serde(with = "humantime_serde")]
    pub idle_check: Option<Duration>,
}

/// How often the retry worker looks when nothing wakes it and `retry.idle_check` is unset,
/// on engines that cannot notify it.
pub const DEFAULT_IDLE_CHECK: Duration = Duration::from_secs(60);

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
            jitter: Duration::from_millis(500),
            batch_size: 100,
            claim_timeout: Duration::from_secs(60),
            idle_check: None,
        }
    }
}

/// `[metrics]`: Prometheus `/metrics`, `/healthz` and `/readyz` over HTTP.
///
/// Off unless the section is present: a fixed default port would make a second outboxd on
/// the same host (a standby for the same pipeline, or another pipeline) fail to start.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Address to listen on; `0.0.0.0:9187` to be scraped or probed from other hosts.
    pub listen: std::net::SocketAddr,
    /// Topics with a series of their own in the per-topic counters; the topics seen after
    /// that count under `topic="other"`, so rows naming ever new topics (or message types)
    /// cannot grow memory or the scrape without bound.
    pub max_topic_series: usize,
    /// When set, every route but `/healthz` (`/metrics`, `/readyz`, the inbox's ingress)
    /// needs `Authorization: Bearer <token>`; `OUTBOXD_METRICS_BEARER_TOKEN` overrides it.
    pub bearer_token: Option<Secret>,
    /// File holding `bearer_token`.
    pub bearer_token_file: Option<PathBuf>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 9187)),
            max_topic_series: 200,
            bearer_token: None,
            bearer_token_file: None,
        }
    }
}

/// Environment variable that sets `metrics.bearer_token`.
pub const ENV_METRICS_BEARER_TOKEN: &str = "OUTBOXD_METRICS_BEARER_TOKEN";

/// `[poll]`: poll mode (`source.mode = "poll"`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PollConfig {
    /// Pause between claims when the last one found fewer rows than `batch_size`.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Rows claimed per round.
    pub batch_size: usize,
}

impl Default for PollConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            batch_size: 500,
        }
    }
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
        // Debezium's Event Router routes to `outbox.event.<aggregatetype>`: so does the
        // Debezium layout unless the file names a template.
        if config.outbox.layout == TableLayout::Debezium {
            let named = text.parse::<toml::Table>().ok().is_some_and(|t| {
                t.get("kafka")
                    .and_then(|k| k.get("topic_template"))
                    .is_some()
            });
            if !named {
                config.kafka.topic_template = DEBEZIUM_TOPIC_TEMPLATE.into();
            }
        }
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
        if let Some(metrics) = self.metrics.as_mut() {
            outboxd_connector::secret::resolve(
                "metrics.bearer_token",
                "metrics.bearer_token_file",
                &mut metrics.bearer_token,
                metrics.bearer_token_file.as_deref(),
                var(ENV_METRICS_BEARER_TOKEN),
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
        if self.kafka.bootstrap_servers.trim().is_empty() {
            return Err(ConfigError::Invalid(
                "kafka.bootstrap_servers is empty".into(),
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
                "delivery.exactly_once = true needs source.mode = \"log\": poll mode has no \
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
        if self.retry.claim_timeout <= self.kafka.message_timeout {
            return Err(ConfigError::Invalid(format!(
                "retry.claim_timeout ({:?}) must be longer than kafka.message_timeout ({:?}): \
                 otherwise the reaper takes back rows whose delivery is still being retried",
                self.retry.claim_timeout, self.kafka.message_timeout
            )));
        }
        if let Some(inbox) = &self.inbox {
            inbox
                .validate(self.metrics.is_some())
                .map_err(ConfigError::Invalid)?;
        } else if !self.outbox.relay {
            return Err(ConfigError::Invalid(
                "outbox.relay = false and no [inbox] section: there is nothing to run".into(),
            ));
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

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        [pipeline]
        name = "orders"
        [source]
        kind = "postgres"
        user = "outboxd"
        database = "app"
        [kafka]
        bootstrap_servers = "127.0.0.1:9092"
    "#;

    #[test]
    fn minimal_config_gets_defaults() {
        let config = Config::parse(MINIMAL).unwrap();
        config.validate().unwrap();
        assert_eq!(config.kafka.topic_template, "outbox.{message_type}");
        assert_eq!(config.outbox.table, "outbox");
        assert_eq!(config.delivery.max_in_flight, 10_000);
        let SourceConfig::Postgres(pg) = &config.source.engine else {
            panic!("{:?}", config.source.engine)
        };
        assert_eq!(pg.port, 5432);
        assert_eq!(config.source.mode, SourceMode::Log);
        assert_eq!(config.pipeline.ordering, Ordering::Strict);
        assert_eq!(pg.slot_name("orders"), "outboxd_orders");
    }

    #[test]
    fn slot_failover_is_for_log_mode() {
        let text = MINIMAL.replace(
            "kind = \"postgres\"",
            "kind = \"postgres\"\nslot_failover = true",
        );
        let config = Config::parse(&text).unwrap();
        config.validate().unwrap();
        let SourceConfig::Postgres(pg) = &config.source.engine else {
            panic!("{:?}", config.source.engine)
        };
        assert!(pg.slot_failover);
        let poll = text.replace(
            "kind = \"postgres\"",
            "kind = \"postgres\"\nmode = \"poll\"",
        );
        let err = Config::parse(&poll)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("source.slot_failover"), "{err}");
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_name() {
        let text = MINIMAL.replace("database = \"app\"", "database = \"app\"\nslots = \"x\"");
        let err = Config::parse(&text).unwrap_err().to_string();
        assert!(err.contains("slots"), "{err}");
        let text = format!("{MINIMAL}\n[kafka2]\nx = 1\n");
        assert!(Config::parse(&text)
            .unwrap_err()
            .to_string()
            .contains("kafka2"));
    }

    #[test]
    fn source_mode_sits_beside_the_engine_keys() {
        let text = MINIMAL.replace(
            "kind = \"postgres\"",
            "kind = \"postgres\"\nmode = \"poll\"",
        );
        let config = Config::parse(&text).unwrap();
        assert_eq!(config.source.mode, SourceMode::Poll);
        let text = MINIMAL.replace(
            "kind = \"postgres\"",
            "kind = \"postgres\"\nmode = \"tail\"",
        );
        assert!(Config::parse(&text)
            .unwrap_err()
            .to_string()
            .contains("tail"));
        let text = MINIMAL.replace("kind = \"postgres\"", "kind = \"postgres\"\nport = \"x\"");
        assert!(Config::parse(&text).is_err());
    }

    #[test]
    fn claim_timeout_must_outlast_the_producer_retries() {
        let text = format!("{MINIMAL}\n[retry]\nclaim_timeout = \"10s\"\n");
        let err = Config::parse(&text)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("claim_timeout"), "{err}");
    }

    #[test]
    fn metrics_endpoint_is_off_unless_configured() {
        assert!(Config::parse(MINIMAL).unwrap().metrics.is_none());
        let config = Config::parse(&format!("{MINIMAL}\n[metrics]\n")).unwrap();
        assert_eq!(config.metrics.unwrap().listen.to_string(), "127.0.0.1:9187");
        let text = format!("{MINIMAL}\n[metrics]\nlisten = \"0.0.0.0:9999\"\n");
        let config = Config::parse(&text).unwrap();
        assert_eq!(config.metrics.unwrap().listen.port(), 9999);
        let text = format!("{MINIMAL}\n[metrics]\nlisten = \"localhost\"\n");
        assert!(Config::parse(&text).is_err());
        let text = format!("{MINIMAL}\n[metrics]\nport = 1\n");
        let err = Config::parse(&text).unwrap_err().to_string();
        assert!(err.contains("port"), "{err}");
    }

    #[test]
    fn durations_are_typed() {
        let text = format!("{MINIMAL}\n[delivery]\nwriteback_interval = \"20ms\"\n");
        let config = Config::parse(&text).unwrap();
        assert_eq!(
            config.delivery.writeback_interval,
            Duration::from_millis(20)
        );
        let text = format!("{MINIMAL}\n[delivery]\nwriteback_interval = \"soon\"\n");
        assert!(Config::parse(&text).is_err());
    }

    #[test]
    fn environment_overrides_secrets() {
        let mut config = Config::parse(MINIMAL).unwrap();
        config
            .resolve_secrets(|name| match name {
                ENV_SOURCE_PASSWORD => Some("s3cret".into()),
                ENV_KAFKA_SASL_PASSWORD => Some("k3y".into()),
                _ => None,
            })
            .unwrap();
        let SourceConfig::Postgres(pg) = &config.source.engine else {
            panic!("{:?}", config.source.engine)
        };
        assert_eq!(pg.password.as_ref().map(Secret::expose), Some("s3cret"));
        assert_eq!(config.kafka.options["sasl.password"], "k3y");
    }

    #[test]
    fn mysql_source_gets_defaults_and_the_password_override() {
        let text = MINIMAL.replace("kind = \"postgres\"", "kind = \"mysql\"\nserver_id = 4242");
        let mut config = Config::parse(&text).unwrap();
        config.validate().unwrap();
        config
            .resolve_secrets(|name| (name == ENV_SOURCE_PASSWORD).then(|| "s3cret".into()))
            .unwrap();
        let SourceConfig::Mysql(my) = &config.source.engine else {
            panic!("{:?}", config.source.engine)
        };
        assert_eq!(my.port, 3306);
        assert_eq!(my.server_id, 4242);
        assert_eq!(my.heartbeat, Duration::from_secs(5));
        assert_eq!(my.password.as_ref().map(Secret::expose), Some("s3cret"));
        // server_id is required; unknown keys are named.
        let text = MINIMAL.replace("kind = \"postgres\"", "kind = \"mysql\"");
        assert!(Config::parse(&text)
            .unwrap_err()
            .to_string()
            .contains("server_id"));
        let text = MINIMAL.replace(
            "kind = \"postgres\"",
            "kind = \"mysql\"\nserver_id = 1\nslot = \"x\"",
        );
        assert!(Config::parse(&text)
            .unwrap_err()
            .to_string()
            .contains("slot"));
    }

    #[test]
    fn weakening_kafka_options_are_config_errors() {
        for (key, value) in [("enable.idempotence", "false"), ("acks", "1")] {
            let text = format!("{MINIMAL}\n[kafka.options]\n\"{key}\" = \"{value}\"\n");
            let err = Config::parse(&text)
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{err}");
        }
        let text = format!("{MINIMAL}\n[kafka.options]\n\"compression.type\" = \"zstd\"\n");
        Config::parse(&text).unwrap().validate().unwrap();
    }

    /// A huge duration is an error naming the key and the range, never a panic later
    /// (`Instant + d` overflows); so is a zero period.
    #[test]
    fn durations_are_bounded_at_load() {
        let huge = "\"18446744073709551615s\"";
        for (section, key) in [
            ("kafka", "message_timeout"),
            ("delivery", "writeback_interval"),
            ("delivery", "shutdown_deadline"),
            ("retry", "base"),
            ("retry", "cap"),
            ("retry", "jitter"),
            ("retry", "claim_timeout"),
            ("retry", "idle_check"),
            ("poll", "interval"),
            ("source", "status_interval"),
            ("source", "connect_timeout"),
        ] {
            let text = MINIMAL.replace(
                &format!("[{section}]"),
                &format!("[{section}]\n{key} = {huge}"),
            );
            let text = if text == MINIMAL {
                format!("{MINIMAL}\n[{section}]\n{key} = {huge}\n")
            } else {
                text
            };
            let err = Config::parse(&text)
                .unwrap()
                .validate()
                .expect_err(key)
                .to_string();
            assert!(
                err.contains(&format!("{section}.{key}")) && err.contains("allowed from"),
                "{err}"
            );
        }
        for (section, key) in [
            ("poll", "interval"),
            ("retry", "idle_check"),
            ("source", "status_interval"),
        ] {
            let text = MINIMAL.replace(
                &format!("[{section}]"),
                &format!("[{section}]\n{key} = \"0s\""),
            );
            let text = if text == MINIMAL {
                format!("{MINIMAL}\n[{section}]\n{key} = \"0s\"\n")
            } else {
                text
            };
            let err = Config::parse(&text)
                .unwrap()
                .validate()
                .expect_err(key)
                .to_string();
            assert!(err.contains(key), "{err}");
        }
        let mysql = MINIMAL.replace("kind = \"postgres\"", "kind = \"mysql\"\nserver_id = 7");
        for key in ["heartbeat", "connect_timeout"] {
            let text = mysql.replace("[source]", &format!("[source]\n{key} = {huge}"));
            let err = Config::parse(&text)
                .unwrap()
                .validate()
                .expect_err(key)
                .to_string();
            assert!(err.contains(&format!("source.{key}")), "{err}");
        }
    }

    #[test]
    fn cloudevents_are_off_unless_configured_and_checked() {
        assert!(Config::parse(MINIMAL).unwrap().kafka.cloudevents.is_none());
        let config = Config::parse(&format!("{MINIMAL}\n[kafka.cloudevents]\n")).unwrap();
        config.validate().unwrap();
        let ce = config.kafka.cloudevents.unwrap();
        assert_eq!(ce.source("orders"), "/outboxd/orders");
        assert_eq!(ce.content_type, "application/json");
        let text = format!(
            "{MINIMAL}\n[kafka.cloudevents]\nsource = \"urn:example:orders\"\n\
             content_type = \"application/cloudevents-batch\"\n"
        );
        Config::parse(&text).unwrap().validate().unwrap();
        for (line, key) in [
            ("source = \"\"", "source"),
            ("source = \"my service\"", "source"),
            ("source = \"/a%zz\"", "source"),
            ("content_type = \"json\"", "content_type"),
            ("content_type = \"application/json\\n\"", "content_type"),
        ] {
            let text = format!("{MINIMAL}\n[kafka.cloudevents]\n{line}\n");
            let err = Config::parse(&text)
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("kafka.cloudevents.{key}")),
                "{line}: {err}"
            );
        }
        let text = format!("{MINIMAL}\n[kafka.cloudevents]\nmode = \"structured\"\n");
        let ce = Config::parse(&text).unwrap().kafka.cloudevents.unwrap();
        assert_eq!(ce.mode, CloudEventsMode::Structured);
        let text = format!("{MINIMAL}\n[kafka.cloudevents]\nmode = \"batched\"\n");
        let err = Config::parse(&text).unwrap_err().to_string();
        assert!(err.contains("mode") || err.contains("batched"), "{err}");
    }

    #[test]
    fn bad_names_and_bounds_are_rejected() {
        let text = MINIMAL.replace("name = \"orders\"", "name = \"Orders-1\"");
        assert!(Config::parse(&text).unwrap().validate().is_err());
        let text = format!("{MINIMAL}\n[delivery]\nmax_in_flight = 0\n");
        assert!(Config::parse(&text).unwrap().validate().is_err());
        let text = MINIMAL.replace("[kafka]", "[kafka]\ntopic_template = \"t.{nope}\"");
        let err = Config::parse(&text)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("{nope}"), "{err}");
    }

    /// A configuration that can only route rows into a positions topic or a Kafka
    /// internal topic is refused at load, naming the key.
    #[test]
    fn reserved_topics_cannot_be_configured_as_destinations() {
        for (kafka, key, named) in [
            (
                "allowed_topics = [\"orders\", \"__consumer_offsets\"]",
                "kafka.allowed_topics",
                "__consumer_offsets",
            ),
            ("allowed_topics = [\"__*\"]", "kafka.allowed_topics", "__*"),
            (
                "allowed_topics = [\"outboxd-positions-*\"]",
                "kafka.allowed_topics",
                "outboxd-positions-*",
            ),
            (
                "positions_topic = \"it.positions\"\nallowed_topics = [\"it.positions\"]",
                "kafka.allowed_topics",
                "it.positions",
            ),
            (
                "topic_template = \"__transaction_state\"",
                "kafka.topic_template",
                "__transaction_state",
            ),
            (
                "topic_template = \"__{message_type}\"",
                "kafka.topic_template",
                "__{message_type}",
            ),
            (
                "topic_template = \"outboxd-positions-{pipeline}\"",
                "kafka.topic_template",
                "outboxd-positions-{pipeline}",
            ),
            (
                "positions_topic = \"it.positions\"\ntopic_template = \"it.positions\"",
                "kafka.topic_template",
                "it.positions",
            ),
        ] {
            let text = MINIMAL.replace("[kafka]", &format!("[kafka]\n{kafka}"));
            let err = Config::parse(&text)
                .unwrap()
                .validate()
                .expect_err(kafka)
                .to_string();
            assert!(
                err.contains(key) && err.contains(&format!("`{named}`")),
                "{kafka}: {err}"
            );
        }
        // Patterns that also match other topics stay: the sink refuses the reserved ones
        // row by row.
        for kafka in [
            "allowed_topics = [\"*\", \"outboxd-*\", \"_x*\"]",
            "topic_template = \"_{message_type}\"",
            "topic_template = \"outboxd-{pipeline}\"",
        ] {
            let text = MINIMAL.replace("[kafka]", &format!("[kafka]\n{kafka}"));
            Config::parse(&text).unwrap().validate().expect(kafka);
        }
    }

    #[test]
    fn several_outbox_tables_are_one_list_of_valid_names() {
        let tables =
            "[outbox]\nlayout = \"debezium\"\ntables = [\"a.outboxevent\", \"b.outboxevent\"]\n";
        let text = format!(
            "{}\n{tables}",
            MINIMAL.replace(
                "[kafka]",
                "[kafka]\ntopic_template = \"{schema}.{table}.{routing}\""
            )
        );
        let config = Config::parse(&text).unwrap();
        config.validate().unwrap();
        assert_eq!(
            config.outbox.layout().outbox_tables,
            ["a.outboxevent", "b.outboxevent"]
        );
        let invalid = |extra: &str, template: &str| {
            let text = format!(
                "{}\n[outbox]\n{extra}\n",
                MINIMAL.replace(
                    "[kafka]",
                    &format!("[kafka]\ntopic_template = \"{template}\"")
                )
            );
            Config::parse(&text)
                .and_then(|c| c.validate())
                .unwrap_err()
                .to_string()
        };
        // Kept rows too: each row's status goes to its own table.
        let kept = format!("{MINIMAL}\n[outbox]\ntables = [\"a.outbox\", \"b.outbox\"]\n");
        let config = Config::parse(&kept).expect("parse");
        config.validate().expect("kept rows in several tables");
        assert!(config.outbox.layout().tracks_status());
        // Both keys, a name twice, an empty name.
        let deleted = "layout = \"debezium\"";
        let err = invalid(
            &format!("{deleted}\ntable = \"x\"\ntables = [\"a.t\"]"),
            "t",
        );
        assert!(err.contains("not both"), "{err}");
        let err = invalid(&format!("{deleted}\ntables = [\"a.t\", \"A.T\"]"), "t");
        assert!(err.contains("twice"), "{err}");
        let err = invalid(&format!("{deleted}\ntables = [\"a.t\", \" \"]"), "t");
        assert!(err.contains("outbox.tables"), "{err}");
        // {schema} needs every name qualified.
        let err = invalid(
            &format!("{deleted}\ntables = [\"a.t\", \"u\"]"),
            "{schema}.x",
        );
        assert!(
            err.contains("`u`") && err.contains("schema-qualified"),
            "{err}"
        );
    }

    #[test]
    fn the_debezium_layout_reads_debeziums_columns_and_routes_as_its_event_router() {
        let text = format!("{MINIMAL}\n[outbox]\nlayout = \"debezium\"\n");
        let config = Config::parse(&text).unwrap();
        config.validate().unwrap();
        assert_eq!(config.kafka.topic_template, "outbox.event.{routing}");
        let layout = config.outbox.layout();
        assert_eq!(layout.rows, RowLifecycle::Deleted);
        assert_eq!(layout.key_column, "aggregateid");
        assert_eq!(layout.columns, ColumnNames::debezium());

        // A named template and column overrides win; "" means "the table has none".
        let text = format!(
            "{}\n[outbox]\nlayout = \"debezium\"\n[outbox.columns]\ntrace = \"\"\n\
             header_columns = [\"id\", \"tenant\"]\n",
            MINIMAL.replace("[kafka]", "[kafka]\ntopic_template = \"events\"")
        );
        let config = Config::parse(&text).unwrap();
        config.validate().unwrap();
        assert_eq!(config.kafka.topic_template, "events");
        let columns = config.outbox.layout().columns;
        assert_eq!(columns.trace, None);
        assert_eq!(columns.header_columns, ["id", "tenant"]);
    }

    #[test]
    fn renamed_columns_need_deleted_rows_and_deleted_rows_need_the_log() {
        let invalid = |extra: &str| {
            let text = format!("{MINIMAL}\n{extra}");
            Config::parse(&text)
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string()
        };
        // Kept rows on a mapped table: PostgreSQL's log mode, with an integer id.
        let kept = format!("{MINIMAL}\n[outbox]\nlayout = \"debezium\"\nrows = \"kept\"\n");
        let config = Config::parse(&kept).unwrap();
        config.validate().unwrap();
        let layout = config.outbox.layout();
        assert!(layout.tracks_status());
        assert_eq!(layout.columns.id.as_deref(), Some(DEBEZIUM_ROW_ID));
        assert_eq!(layout.key_column, "aggregateid");
        let err = invalid(
            "[outbox]\nlayout = \"debezium\"\nrows = \"kept\"\n[outbox.columns]\nid = \"\"\n",
        );
        assert!(err.contains("integer row id"), "{err}");
        let renamed = format!("{MINIMAL}\n[outbox.columns]\npayload = \"body\"\n");
        Config::parse(&renamed).unwrap().validate().unwrap();
        let poll = MINIMAL.replace(
            "kind = \"postgres\"",
            "kind = \"postgres\"\nmode = \"poll\"",
        );
        let err = Config::parse(&format!("{poll}\n[outbox.columns]\npayload = \"body\"\n"))
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("outboxd's own table only"), "{err}");
        let deleted = format!("{MINIMAL}\n[outbox]\nrows = \"deleted\"\n");
        Config::parse(&deleted).unwrap().validate().unwrap();
        let poll = MINIMAL.replace(
            "kind = \"postgres\"",
            "kind = \"postgres\"\nmode = \"poll\"",
        );
        let text = format!("{poll}\n[outbox]\nrows = \"deleted\"\n");
        let err = Config::parse(&text)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("nothing to poll"), "{err}");
        let err = invalid("[outbox]\nrows = \"deleted\"\n[outbox.columns]\nmessage_id = \"\"\n");
        assert!(err.contains("outbox.columns.message_id"), "{err}");
    }
}

#[cfg(test)]
mod example_tests {
    use super::*;

    /// The documented examples must stay valid configs.
    #[test]
    fn example_configs_are_valid() {
        for (name, text) in [
            (
                "examples/outboxd.toml",
                include_str!("../examples/outboxd.toml"),
            ),
            (
                "examples/docker/outboxd.toml",
                include_str!("../examples/docker/outboxd.toml"),
            ),
            (
                "examples/docker/outboxd-mysql.toml",
                include_str!("../examples/docker/outboxd-mysql.toml"),
            ),
        ] {
            let config = Config::parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            config.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    /// The commented `[otlp]` part of `examples/outboxd.toml`, uncommented, is valid.
    #[test]
    fn the_documented_otlp_keys_parse_and_validate() {
        let example = include_str!("../examples/outboxd.toml");
        let start = example.find("# [otlp]").expect("an [otlp] part");
        let part: String = example[start..]
            .lines()
            .take_while(|l| l.starts_with("# "))
            .map(|l| format!("{}\n", &l[2..]))
            .collect();
        let text = format!("{}\n{part}", include_str!("../examples/outboxd.toml"));
        let config = Config::parse(&text).unwrap_or_else(|e| panic!("{part}: {e}"));
        config.validate().unwrap();
        let otlp = config.otlp.expect("[otlp]");
        assert_eq!(otlp.endpoint, "http://127.0.0.1:4318");
        assert_eq!(otlp.timeout, Duration::from_secs(10));
        let text = format!("{text}bogus = 1\n");
        assert!(Config::parse(&text)
            .unwrap_err()
            .to_string()
            .contains("bogus"));
    }

    /// So must the MySQL examples.
    #[test]
    fn mysql_example_configs_are_valid() {
        for text in [
            include_str!("../examples/outboxd-mysql.toml"),
            include_str!("../examples/docker/outboxd-mysql.toml"),
        ] {
            let config = Config::parse(text).unwrap();
            config.validate().unwrap();
            assert!(matches!(config.source.engine, SourceConfig::Mysql(_)));
        }
    }
}
