//! The Kafka side: a librdkafka producer with safe defaults, topic routing, record
//! headers, and the classification of delivery errors.

use std::collections::BTreeMap;
use std::time::Duration;

use outboxd_connector::{CheckLine, OutboxEvent};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};

use crate::config::KafkaConfig;

/// Producer settings outboxd always applies. Together they make the producer
/// idempotent: no duplicates from internal retries and no reordering within a
/// partition, which is what keeps each `biz_key` in order.
const SAFE_DEFAULTS: &[(&str, &str)] = &[("enable.idempotence", "true"), ("acks", "all")];

/// Options outboxd sets itself from typed config keys.
const OWNED_OPTIONS: &[(&str, &str)] = &[
    ("bootstrap.servers", "kafka.bootstrap_servers"),
    ("message.timeout.ms", "kafka.message_timeout"),
    ("delivery.timeout.ms", "kafka.message_timeout"),
];

/// Rejects librdkafka options that would silently weaken the delivery guarantee.
pub(crate) fn validate_options(options: &BTreeMap<String, String>) -> Result<(), String> {
    for (key, value) in options {
        let value = value.trim().to_ascii_lowercase();
        let conflict = match key.as_str() {
            "enable.idempotence" if value != "true" => Some(
                "outboxd keeps the producer idempotent: without it a retried batch can be \
                 written twice or out of order, breaking per-key order",
            ),
            "acks" | "request.required.acks" if value != "all" && value != "-1" => Some(
                "outboxd marks a row SUCCESS only when every in-sync replica has it; a weaker \
                 acks setting can lose acknowledged records",
            ),
            "message.send.max.retries" | "retries" if value == "0" => Some(
                "the idempotent producer needs retries; give kafka.message_timeout to bound \
                 how long a record is retried",
            ),
            "max.in.flight.requests.per.connection" | "max.in.flight"
                if value.parse::<u32>().map_or(true, |n| n > 5) =>
            {
                Some("the idempotent producer keeps order only with at most 5 in-flight requests")
            }
            "transactional.id" => {
                Some("outboxd does not use Kafka transactions; the outbox row is the ledger")
            }
            _ => None,
        };
        if let Some(why) = conflict {
            return Err(format!(
                "kafka.options.\"{key}\" = \"{value}\" is not allowed: {why}"
            ));
        }
        if let Some((_, typed)) = OWNED_OPTIONS.iter().find(|(k, _)| k == key) {
            return Err(format!(
                "kafka.options.\"{key}\" is set by outboxd; use `{typed}` instead"
            ));
        }
    }
    Ok(())
}

/// A topic name template: literal text with `{message_type}` and `{pipeline}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicTemplate {
    parts: Vec<TemplatePart>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum TemplatePart {
    Literal(String),
    MessageType,
    Pipeline,
}

impl TopicTemplate {
    /// Parses a template; unknown placeholders and unbalanced braces are errors.
    pub fn parse(template: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(TemplatePart::Literal(rest[..open].to_owned()));
            }
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| format!("kafka.topic_template `{template}` has an unclosed `{{`"))?;
            let name = &rest[open + 1..open + close];
            parts.push(match name {
                "message_type" => TemplatePart::MessageType,
                "pipeline" => TemplatePart::Pipeline,
                other => {
                    return Err(format!(
                        "kafka.topic_template `{template}` uses unknown placeholder `{{{other}}}`; \
                         known: {{message_type}}, {{pipeline}}"
                    ))
                }
            });
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(TemplatePart::Literal(rest.to_owned()));
        }
        if parts.is_empty() {
            return Err("kafka.topic_template is empty".into());
        }
        Ok(Self { parts })
    }

    /// The topic for an event of `message_type` in `pipeline`.
    pub fn render(&self, message_type: &str, pipeline: &str) -> String {
        let mut topic = String::with_capacity(48);
        for part in &self.parts {
            match part {
                TemplatePart::Literal(s) => topic.push_str(s),
                TemplatePart::MessageType => topic.push_str(message_type),
                TemplatePart::Pipeline => topic.push_str(pipeline),
            }
        }
        topic
    }
}

/// What became of one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// Acknowledged by all in-sync replicas.
    Acked {
        /// Partition of the record.
        partition: i32,
        /// Offset of the record.
        offset: i64,
    },
    /// Not delivered; the row becomes FAILED with this error and is retried later.
    Failed {
        /// The broker's or client's error text.
        error: String,
        /// The producer itself is unusable (fatal idempotence error): the pipeline
        /// must restart after writing back.
        fatal: bool,
    },
}

/// The librdkafka producer with outboxd's routing.
pub struct Publisher {
    producer: FutureProducer,
    template: TopicTemplate,
    pipeline: String,
}

impl Publisher {
    /// Builds the producer. librdkafka connects lazily; see [`Publisher::check`].
    pub fn new(config: &KafkaConfig, pipeline: &str) -> Result<Self, String> {
        validate_options(&config.options)?;
        let template = TopicTemplate::parse(&config.topic_template)?;
        let mut client = ClientConfig::new();
        // Java's default partitioner hashes keys with murmur2: records keyed by the same
        // biz_key land where a Java producer would put them.
        client.set("partitioner", "murmur2_random");
        client.set("compression.type", "lz4");
        client.set("linger.ms", "5");
        for (key, value) in &config.options {
            client.set(key, value);
        }
        for (key, value) in SAFE_DEFAULTS {
            client.set(*key, *value);
        }
        let timeout_ms = config
            .message_timeout
            .as_millis()
            .clamp(1, i32::MAX as u128);
        client.set("bootstrap.servers", &config.bootstrap_servers);
        client.set("message.timeout.ms", timeout_ms.to_string());
        let producer: FutureProducer = client
            .create()
            .map_err(|e| format!("cannot create the Kafka producer: {e}"))?;
        Ok(Self {
            producer,
            template,
            pipeline: pipeline.to_owned(),
        })
    }

    /// The topic an event goes to: its own `topic` column, else the template.
    pub fn topic_for(&self, event: &OutboxEvent) -> String {
        match &event.topic {
            Some(topic) if !topic.is_empty() => topic.clone(),
            _ => self.template.render(&event.message_type, &self.pipeline),
        }
    }

    /// Hands one record to librdkafka. Waits while its local queue is full. Errors
    /// that concern only this record come back as a failed outcome, immediately.
    pub async fn send(&self, event: &OutboxEvent) -> PendingDelivery {
        let topic = self.topic_for(event);
        let mut headers = OwnedHeaders::new_with_capacity(4 + event.headers.len())
            .insert(Header {
                key: "message_id",
                value: Some(event.message_id.as_bytes()),
            })
            .insert(Header {
                key: "message_type",
                value: Some(event.message_type.as_bytes()),
            })
            .insert(Header {
                key: "biz_key",
                value: Some(event.biz_key.as_bytes()),
            })
            .insert(Header {
                key: "created_at",
                value: Some(event.created_at.as_bytes()),
            });
        for (key, value) in &event.headers {
            headers = headers.insert(Header {
                key: key.as_str(),
                value: Some(value.as_ref()),
            });
        }
        let mut record = FutureRecord::to(&topic)
            .key(event.key.as_ref())
            .payload(event.payload.as_ref())
            .headers(headers);
        loop {
            match self.producer.send_result(record) {
                Ok(future) => return PendingDelivery::InFlight(future),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                    // librdkafka's queue is full: let it drain a little, then try again.
                    record = returned;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Err((e, _)) => return PendingDelivery::Done(failed_outcome(&e)),
            }
        }
    }

    /// Waits up to `deadline` for librdkafka to deliver what it holds.
    pub fn flush(&self, deadline: Duration) {
        if let Err(e) = self.producer.flush(deadline) {
            tracing::warn!(error = %e, "Kafka producer did not flush before the deadline");
        }
    }

    /// Records waiting in librdkafka's queue or in flight to the broker.
    pub fn queue_depth(&self) -> i32 {
        self.producer.in_flight_count()
    }

    /// `outboxd check`: can the brokers be reached, and how many.
    pub async fn check(&self, timeout: Duration) -> CheckLine {
        let producer = self.producer.clone();
        let result =
            tokio::task::spawn_blocking(move || producer.client().fetch_metadata(None, timeout))
                .await;
        match result {
            Ok(Ok(metadata)) => CheckLine::ok(
                "kafka",
                format!(
                    "{} broker(s), {} topic(s) visible",
                    metadata.brokers().len(),
                    metadata.topics().len()
                ),
            ),
            Ok(Err(e)) => CheckLine::fail(
                "kafka",
                format!("cannot fetch cluster metadata: {e}"),
                "check kafka.bootstrap_servers, that the brokers are up and reachable from \
                 here, and the security.protocol / sasl.* options",
            ),
            Err(e) => CheckLine::fail("kafka", format!("check task failed: {e}"), "retry"),
        }
    }
}

/// A record handed to the producer.
pub enum PendingDelivery {
    /// Waiting for the broker's acknowledgement.
    InFlight(DeliveryFuture),
    /// Already decided (rejected before it was queued).
    Done(DeliveryOutcome),
}

impl PendingDelivery {
    /// Waits for the outcome.
    pub async fn outcome(self) -> DeliveryOutcome {
        match self {
            PendingDelivery::Done(outcome) => outcome,
            PendingDelivery::InFlight(future) => match future.await {
                Ok(Ok(delivery)) => DeliveryOutcome::Acked {
                    partition: delivery.partition,
                    offset: delivery.offset,
                },
                Ok(Err((e, _message))) => failed_outcome(&e),
                Err(_canceled) => DeliveryOutcome::Failed {
                    error: "the Kafka producer was shut down before the record was acknowledged"
                        .into(),
                    fatal: true,
                },
            },
        }
    }
}

fn failed_outcome(e: &KafkaError) -> DeliveryOutcome {
    let fatal = matches!(e.rdkafka_error_code(), Some(RDKafkaErrorCode::Fatal));
    DeliveryOutcome::Failed {
        error: e.to_string(),
        fatal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_template_renders_placeholders() {
        let t = TopicTemplate::parse("outbox.{message_type}").unwrap();
        assert_eq!(t.render("order.created", "p"), "outbox.order.created");
        let t = TopicTemplate::parse("{pipeline}-events").unwrap();
        assert_eq!(t.render("x", "orders"), "orders-events");
        assert_eq!(
            TopicTemplate::parse("fixed").unwrap().render("x", "p"),
            "fixed"
        );
        assert!(TopicTemplate::parse("a.{message_type").is_err());
        assert!(TopicTemplate::parse("a.{biz}")
            .unwrap_err()
            .contains("{biz}"));
        assert!(TopicTemplate::parse("").is_err());
    }

    /// librdkafka must be built with what production clusters use: TLS, SASL PLAIN and
    /// SCRAM, zstd and lz4. A missing feature fails at producer creation.
    #[test]
    fn the_bundled_librdkafka_speaks_sasl_ssl_and_compresses() {
        for (mechanism, compression) in [
            ("SCRAM-SHA-512", "zstd"),
            ("SCRAM-SHA-256", "lz4"),
            ("PLAIN", "gzip"),
        ] {
            let config = KafkaConfig {
                bootstrap_servers: "127.0.0.1:1".into(),
                topic_template: "t".into(),
                message_timeout: Duration::from_secs(1),
                options: BTreeMap::from([
                    ("security.protocol".to_owned(), "SASL_SSL".to_owned()),
                    ("sasl.mechanism".to_owned(), mechanism.to_owned()),
                    ("sasl.username".to_owned(), "u".to_owned()),
                    ("sasl.password".to_owned(), "p".to_owned()),
                    ("compression.type".to_owned(), compression.to_owned()),
                ]),
            };
            if let Err(e) = Publisher::new(&config, "p") {
                panic!("{mechanism} with {compression}: {e}");
            }
        }
    }

    #[test]
    fn options_that_weaken_delivery_are_rejected() {
        let reject = |k: &str, v: &str| {
            let options = BTreeMap::from([(k.to_owned(), v.to_owned())]);
            validate_options(&options).unwrap_err()
        };
        assert!(reject("enable.idempotence", "false").contains("idempotent"));
        assert!(reject("acks", "1").contains("acks"));
        assert!(reject("max.in.flight.requests.per.connection", "10").contains("5"));
        assert!(reject("bootstrap.servers", "x:1").contains("kafka.bootstrap_servers"));
        assert!(reject("transactional.id", "t").contains("transactions"));
        let fine = BTreeMap::from([
            ("acks".to_owned(), "all".to_owned()),
            ("compression.type".to_owned(), "zstd".to_owned()),
            ("security.protocol".to_owned(), "SASL_SSL".to_owned()),
        ]);
        validate_options(&fine).unwrap();
    }
}
