//! `[kafka]` and `[kafka.cloudevents]`: the Kafka sink's configuration, re-exported from
//! `crate::config`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// Environment variable that sets the librdkafka option `sasl.password`.
pub const ENV_KAFKA_SASL_PASSWORD: &str = "OUTBOXD_KAFKA_SASL_PASSWORD";
/// Environment variable that overrides `kafka.bootstrap_servers`.
pub const ENV_KAFKA_BOOTSTRAP_SERVERS: &str = "OUTBOXD_KAFKA_BOOTSTRAP_SERVERS";

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

/// Empty brokers: a process without the outbox relay leaves `[kafka]` out (validation
/// asks for `bootstrap_servers` only when the relay runs).
impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            bootstrap_servers: String::new(),
            topic_template: default_topic_template(),
            message_timeout: default_message_timeout(),
            options: BTreeMap::new(),
            allowed_topics: Vec::new(),
            sasl_password_file: None,
            ssl_key_password_file: None,
            cloudevents: None,
            transactional_id: None,
            positions_topic: None,
        }
    }
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
    pub(crate) fn validate(&self) -> Result<(), String> {
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
