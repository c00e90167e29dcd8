//! The Kafka sink: a librdkafka producer with safe defaults (`options.rs`), topic routing
//! ([`TopicTemplate`]), record headers, and the classification of delivery errors
//! (`delivery.rs`).
//!
//! Per-key order comes from the producer, not from outboxd: records are keyed by the
//! row's key column, partitioned with murmur2 (as Java producers do), and the producer is
//! idempotent with `acks=all`, so a key's records land in one partition in send order
//! and an acknowledgement means every in-sync replica has the record.
//!
//! Under strict ordering the producer never drops a record on a timer
//! (`message.timeout.ms = 0`): librdkafka expires the records that waited longest and
//! keeps the younger ones, so a broker outage longer than the timeout would let a key's
//! later records reach the partition before its earlier ones are sent again. It waits for
//! the broker instead, in order; callers that hold a claim bound their own wait
//! ([`crate::sink::acknowledged_by`]).

use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use outboxd_connector::{CheckLine, OutboxEvent};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use crate::config::KafkaConfig;
use crate::sink::{CommittedPosition, FailureKind, Sink, SinkFailure};

mod allowed;
pub(crate) mod config;
mod delivery;
mod headers;
mod options;
mod structured;
mod topic;
mod transaction;

pub use allowed::{AllowedTopics, ReservedTopics};
pub use delivery::KafkaDelivery;
pub(crate) use options::{security_line, validate_options};
pub use topic::TopicTemplate;
pub(crate) use transaction::check_line as exactly_once_line;

pub(crate) use headers::RecordHeaders;

/// `[kafka]`'s connection and security settings (`bootstrap_servers` and the `security.`,
/// `sasl.`, `ssl.`, `client.` and `socket.` options), not its producer options: for the
/// other clients outboxd makes of the same cluster (the exactly-once position reader and
/// admin, `verify`'s consumer).
pub(crate) fn connection_settings(config: &config::KafkaConfig) -> rdkafka::ClientConfig {
    let mut client = rdkafka::ClientConfig::new();
    for (key, value) in &config.options {
        let shared = ["security.", "sasl.", "ssl.", "client.", "socket."];
        if shared.iter().any(|prefix| key.starts_with(prefix)) {
            client.set(key, value);
        }
    }
    client.set("bootstrap.servers", &config.bootstrap_servers);
    client
}
use options::SAFE_DEFAULTS;
use transaction::Transactions;

/// The librdkafka producer with outboxd's routing.
pub struct KafkaSink {
    /// Replaced by [`Sink::recover`] after librdkafka declares it fatal; senders take a
    /// clone (an `Arc` inside), so a replacement never waits for deliveries in flight.
    producer: RwLock<FutureProducer>,
    /// What a replacement producer is built from.
    client: ClientConfig,
    template: TopicTemplate,
    allowed: AllowedTopics,
    /// Refused whatever `allowed` says: positions and internal topics.
    reserved: ReservedTopics,
    headers: RecordHeaders,
    pipeline: String,
    /// Exactly-once: the relay's records go out in Kafka transactions (`transaction.rs`).
    transactions: Option<Transactions>,
}

impl KafkaSink {
    /// Builds the producer. librdkafka connects lazily; see [`Sink::check`].
    /// `strict_order`: records are never expired by the producer (see the module doc).
    /// `queue_bytes`: the producer's local queue holds at most this many bytes
    /// (`delivery.max_in_flight_bytes`), unless `[kafka.options]` sets
    /// `queue.buffering.max.kbytes` itself.
    pub fn new(
        config: &KafkaConfig,
        pipeline: &str,
        strict_order: bool,
        queue_bytes: usize,
    ) -> Result<Self, String> {
        validate_options(&config.options)?;
        let template = TopicTemplate::parse(&config.topic_template)?;
        let allowed = AllowedTopics::parse(&config.allowed_topics)?;
        let reserved = ReservedTopics::new(config.positions_topic(pipeline));
        let mut client = ClientConfig::new();
        // Java's default partitioner hashes keys with murmur2: records keyed by the same
        // biz_key land where a Java producer would put them.
        client.set("partitioner", "murmur2_random");
        client.set("compression.type", "lz4");
        // 10 ms, not librdkafka's 5: at a steady few thousand events per second most of the
        // relay's CPU is wake-ups (librdkafka's broker thread per produce request, the
        // delivery poller, the kernel switching between them), one round per linger
        // window. Measured in docs/benchmarks.md: 5 → 10 ms cut outboxd's CPU per event at
        // 5,000 events/s by about a fifth, p99 still within 20 ms; `[kafka.options]` may
        // set it either way.
        client.set("linger.ms", "10");
        client.set(
            "queue.buffering.max.kbytes",
            (queue_bytes / 1024).clamp(1024, 2_097_151).to_string(),
        );
        for (key, value) in &config.options {
            client.set(key, value);
        }
        for (key, value) in SAFE_DEFAULTS {
            client.set(*key, *value);
        }
        let timeout_ms = if strict_order {
            0 // librdkafka: no timeout
        } else {
            config
                .message_timeout
                .as_millis()
                .clamp(1, i32::MAX as u128)
        };
        client.set("bootstrap.servers", &config.bootstrap_servers);
        client.set("message.timeout.ms", timeout_ms.to_string());
        let producer = create_producer(&client)?;
        Ok(Self {
            producer: RwLock::new(producer),
            client,
            template,
            allowed,
            reserved,
            headers: RecordHeaders::new(config, pipeline),
            pipeline: pipeline.to_owned(),
            transactions: None,
        })
    }

    /// Makes this the relay's exactly-once sink: a transactional producer whose records
    /// the relay commits with the log position they reach (see `transaction.rs`).
    pub fn transactional(mut self, config: &KafkaConfig) -> Result<Self, String> {
        let transactions = Transactions::new(config, &self.pipeline);
        transactions.configure(&mut self.client, config.message_timeout);
        *self
            .producer
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner) = create_producer(&self.client)?;
        self.transactions = Some(transactions);
        Ok(self)
    }

    /// Puts a fresh producer in place of the current one, whose queued and in-flight
    /// records are purged at once (their deliveries fail, even while a sender or a health
    /// check still holds a clone of it, which would keep it alive), then dropped off the
    /// runtime (dropping may wait for librdkafka's threads).
    async fn replace_producer(&self) -> Result<FutureProducer, String> {
        let fresh = create_producer(&self.client)?;
        let old = std::mem::replace(
            &mut *self
                .producer
                .write()
                .unwrap_or_else(PoisonError::into_inner),
            fresh.clone(),
        );
        let _ = tokio::task::spawn_blocking(move || {
            old.purge(rdkafka::producer::PurgeConfig::default().queue().inflight());
            // Hands the purged records' outcomes to their deliveries.
            let _ = old.flush(Duration::from_millis(500));
            drop(old);
        })
        .await;
        Ok(fresh)
    }

    /// The current producer.
    fn producer(&self) -> FutureProducer {
        self.producer
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The sink of a pipeline reading `tables` (`outbox.table` or `outbox.tables`), for the
    /// topic template's `{schema}` and `{table}`.
    pub fn for_tables(mut self, tables: &[String]) -> Result<Self, String> {
        self.template = self.template.with_tables(tables)?;
        Ok(self)
    }

    /// The topic an event goes to: its own `topic` column, else the template.
    pub fn topic_for(&self, event: &OutboxEvent) -> String {
        match &event.topic {
            Some(topic) if !topic.is_empty() => topic.clone(),
            _ => self.template.render(event, &self.pipeline),
        }
    }
}

fn create_producer(client: &ClientConfig) -> Result<FutureProducer, String> {
    client
        .create()
        .map_err(|e| format!("cannot create the Kafka producer: {e}"))
}

impl Sink for KafkaSink {
    type Delivery = KafkaDelivery;

    /// Waits while librdkafka's local queue is full.
    async fn send(&self, event: &OutboxEvent) -> KafkaDelivery {
        let topic = self.topic_for(event);
        let value = self.headers.value(event);
        let mut record = FutureRecord::to(&topic)
            .key(event.key.as_ref())
            .payload(value.as_ref())
            .headers(self.headers.build(event));
        let mut producer = self.producer();
        if let Some(transactions) = &self.transactions {
            if let Err(e) = transactions.begin(&producer) {
                return KafkaDelivery::fatal(e);
            }
        }
        loop {
            match producer.send_result(record) {
                Ok(future) if self.transactions.is_some() => {
                    return KafkaDelivery::in_transaction(future)
                }
                Ok(future) => return KafkaDelivery::in_flight(future),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                    // librdkafka's queue is full: let it drain a little, then try again,
                    // on the current producer (a stuck one may have been replaced).
                    record = returned;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    producer = self.producer();
                }
                Err((e, _)) if self.transactions.is_some() => {
                    return KafkaDelivery::failed_in_transaction(&e)
                }
                Err((e, _)) => return KafkaDelivery::failed(&e),
            }
        }
    }

    fn destination(&self, event: &OutboxEvent) -> String {
        self.topic_for(event)
    }

    fn refusal(&self, event: &OutboxEvent) -> Option<String> {
        if self.template.lacks_routing(event) {
            return Some(
                "kafka.topic_template uses {routing} and the row's routing column \
                 (outbox.columns.routing) is NULL or empty: set it on the row"
                    .into(),
            );
        }
        let topic = self.topic_for(event);
        // Reserved first: its reason is the one to act on even when the list refuses too.
        self.reserved
            .refusal(&topic)
            .or_else(|| self.allowed.refusal(&topic))
            .or_else(|| self.headers.refusal(event))
    }

    async fn flush(&self, deadline: Duration) {
        if let Err(e) = self.producer().flush(deadline) {
            tracing::warn!(error = %e, "Kafka producer did not flush before the deadline");
        }
    }

    /// Can the brokers be reached, and how many.
    async fn check(&self, timeout: Duration) -> CheckLine {
        let producer = self.producer();
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

    /// Records waiting in librdkafka's queue or in flight to the broker.
    fn queue_depth(&self) -> i64 {
        i64::from(self.producer().in_flight_count())
    }

    fn transactional(&self) -> bool {
        self.transactions.is_some()
    }

    /// A fresh transactional producer for each session that holds the log: its
    /// `init_transactions` fences an older instance and aborts what that one left open.
    async fn committed_position(&self) -> Result<Option<CommittedPosition>, SinkFailure> {
        let Some(transactions) = &self.transactions else {
            return Ok(None);
        };
        let failure = |error: String| SinkFailure {
            kind: FailureKind::Fatal,
            error,
            retry_after: None,
        };
        let producer = self.replace_producer().await.map_err(failure)?;
        transactions.start(producer).await.map_err(failure)
    }

    async fn commit(&self, committed: &CommittedPosition) -> Result<(), SinkFailure> {
        let Some(transactions) = &self.transactions else {
            return Ok(());
        };
        transactions
            .commit(&self.producer(), committed)
            .await
            .map_err(|error| SinkFailure {
                kind: FailureKind::Fatal,
                error,
                retry_after: None,
            })
    }

    async fn abort(&self) {
        if let Some(transactions) = &self.transactions {
            transactions.abort(&self.producer()).await;
        }
    }

    /// A wedged producer (records unacknowledged long past `message_timeout`, seen once
    /// after a broker came back fenced: librdkafka lost the partition leaders and never
    /// asked again) is told from an outage by a fresh client: a separate producer without
    /// `transactional.id` (it must not fence anything). Healthy means every partition of
    /// every topic but Kafka's own (`__…`) has a leader and its whole replica set in sync:
    /// a leaderless or under-replicated partition is an outage the producer waits out
    /// itself (`acks=all`), and a rebuild would only cost duplicates.
    async fn destination_healthy(&self, timeout: Duration) -> Result<bool, String> {
        let mut probe_config = self.client.clone();
        probe_config.remove("transactional.id");
        let probe: rdkafka::producer::BaseProducer = probe_config
            .create()
            .map_err(|e| format!("cannot create a Kafka client to probe the brokers: {e}"))?;
        let healthy = tokio::task::spawn_blocking(move || {
            let healthy = match probe.client().fetch_metadata(None, timeout) {
                Ok(metadata) => {
                    !metadata.brokers().is_empty()
                        && metadata
                            .topics()
                            .iter()
                            .filter(|t| !t.name().starts_with("__"))
                            .all(|t| {
                                t.error().is_none()
                                    && t.partitions().iter().all(|p| {
                                        p.error().is_none()
                                            && p.leader() >= 0
                                            && p.isr().len() >= p.replicas().len()
                                    })
                            })
                }
                Err(_) => false,
            };
            drop(probe);
            healthy
        })
        .await;
        Ok(healthy.unwrap_or(false))
    }

    async fn rebuild(&self) -> Result<(), String> {
        drop(self.replace_producer().await?);
        Ok(())
    }

    /// Replaces the producer when librdkafka has declared it fatal (an idempotent
    /// producer that lost its guarantee: `fatal_error()` is set and every send fails).
    async fn recover(&self) -> Result<bool, String> {
        let old = {
            let mut current = self
                .producer
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            let Some((code, reason)) = current.client().fatal_error() else {
                return Ok(false);
            };
            tracing::warn!(?code, %reason, "the Kafka producer failed fatally; building a new one");
            std::mem::replace(&mut *current, create_producer(&self.client)?)
        };
        // Dropping a producer may wait for librdkafka's threads: not on the runtime.
        let _ = tokio::task::spawn_blocking(move || drop(old)).await;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A healthy producer is kept: only one librdkafka declared fatal is replaced.
    #[tokio::test]
    async fn recover_keeps_a_healthy_producer() {
        let config = KafkaConfig {
            bootstrap_servers: "127.0.0.1:1".into(),
            topic_template: "t".into(),
            message_timeout: Duration::from_secs(1),
            options: BTreeMap::new(),
            allowed_topics: Vec::new(),
            sasl_password_file: None,
            ssl_key_password_file: None,
            transactional_id: None,
            positions_topic: None,
            cloudevents: None,
        };
        let sink = KafkaSink::new(&config, "p", false, 64 << 20).expect("producer");
        assert!(sink.producer().client().fatal_error().is_none());
        assert_eq!(sink.recover().await, Ok(false));
    }

    /// The positions topics and Kafka's internal topics are never a row's destination,
    /// whatever `kafka.allowed_topics` says: `*` (or no list) would otherwise let a row
    /// write into the positions outboxd reads at every exactly-once start, or into the
    /// broker's own bookkeeping.
    #[test]
    fn reserved_topics_are_refused_whatever_allowed_topics_says() {
        for allowed in [Vec::new(), vec!["*".to_owned()]] {
            let config = KafkaConfig {
                bootstrap_servers: "127.0.0.1:1".into(),
                topic_template: "{message_type}".into(),
                message_timeout: Duration::from_secs(1),
                options: BTreeMap::new(),
                allowed_topics: allowed.clone(),
                sasl_password_file: None,
                ssl_key_password_file: None,
                transactional_id: None,
                positions_topic: Some("it.positions".into()),
                cloudevents: None,
            };
            let sink = KafkaSink::new(&config, "p", false, 64 << 20).expect("producer");
            let row = |topic: Option<&str>, message_type: &str| {
                let mut event = crate::testing::event(1, "k");
                event.topic = topic.map(Into::into);
                event.message_type = message_type.into();
                event
            };
            for topic in [
                "outboxd-positions-x",
                "outboxd-positions-p",
                "__consumer_offsets",
                "__transaction_state",
                "it.positions",
            ] {
                for event in [row(Some(topic), "m"), row(None, topic)] {
                    let why = sink
                        .refusal(&event)
                        .unwrap_or_else(|| panic!("{topic} with allowed_topics {allowed:?}"));
                    assert!(why.contains(&format!("`{topic}`")), "{why}");
                    assert!(why.contains("never sent"), "{why}");
                }
            }
            for topic in ["orders", "outboxd-positions", "_private", "it.positions.x"] {
                assert_eq!(sink.refusal(&row(Some(topic), "m")), None, "{topic}");
            }
        }
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
                allowed_topics: Vec::new(),
                sasl_password_file: None,
                ssl_key_password_file: None,
                transactional_id: None,
                positions_topic: None,
                cloudevents: None,
            };
            if let Err(e) = KafkaSink::new(&config, "p", false, 64 << 20) {
                panic!("{mechanism} with {compression}: {e}");
            }
        }
    }
}
