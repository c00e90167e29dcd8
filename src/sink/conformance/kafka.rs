//! The conformance suite against the Kafka sink and the real broker at
//! `OUTBOXD_TEST_KAFKA` (`eval "$(scripts/services env)"` sets it; scripts/test does):
//! nothing mocked, so what the suite says of librdkafka's ordering, classification,
//! fencing and queue bound is what production gets. Without the variable every scenario
//! fails and says how to set it: a skipped Kafka run must not look like a passing one.
//!
//! Each scenario gets a topic of its own (3 partitions, `max.message.bytes` 64 KiB so a
//! larger record is refused by the broker), read back with a `read_committed` consumer
//! up to the end of every partition. The fatal state is a real one: a transactional sink
//! fenced by a second instance with its `transactional.id`. A destination nobody answers
//! at is a closed loopback port; those sinks are not strict (a 1 s `message_timeout`):
//! under strict ordering the producer waits for the broker without limit and the
//! caller's own deadline classifies the wait ([`crate::sink::acknowledged_by`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxd_connector::OutboxEvent;
use rand::RngCore;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::loopback::closed_port;
use super::{row_id, sink_conformance_tests, SinkHarness, DECIDED_WITHIN};
use crate::config::KafkaConfig;
use crate::sink::kafka::KafkaSink;
use crate::sink::Sink;
use crate::testing::event;

/// Partitions of each scenario's topic.
const PARTITIONS: i32 = 3;
/// The topic's `max.message.bytes`: the broker refuses a larger record.
const MAX_MESSAGE_BYTES: usize = 64 << 10;
/// The smallest local queue [`KafkaSink::new`] makes (`queue.buffering.max.kbytes` 1024).
const SMALLEST_QUEUE: usize = 1 << 20;

/// The broker's address, or a failure that says how to start it.
fn brokers() -> String {
    std::env::var("OUTBOXD_TEST_KAFKA").unwrap_or_else(|_| {
        panic!(
            "OUTBOXD_TEST_KAFKA is not set: the Kafka sink's conformance scenarios run \
             against the test broker. Start it and set the variable with \
             `scripts/services start kafka && eval \"$(scripts/services env)\"` (scripts/test \
             does both)"
        )
    })
}

/// See the module doc.
pub(crate) struct KafkaHarness {
    brokers: String,
    topic: String,
    /// Makes this scenario's names unique on the shared broker.
    suffix: u32,
}

impl KafkaHarness {
    /// `[kafka]` to `bootstrap`, routing every event to this scenario's topic.
    fn config(&self, bootstrap: &str, message_timeout: Duration) -> KafkaConfig {
        KafkaConfig {
            bootstrap_servers: bootstrap.to_owned(),
            topic_template: self.topic.clone(),
            message_timeout,
            options: BTreeMap::new(),
            allowed_topics: Vec::new(),
            sasl_password_file: None,
            ssl_key_password_file: None,
            transactional_id: Some(format!("conformance-{}", self.suffix)),
            positions_topic: Some(format!("conformance.positions_{}", self.suffix)),
            cloudevents: None,
        }
    }

    /// A sink to a closed port (nobody answers), not strict, giving records up after 1 s.
    fn unanswered(&self, queue_bytes: usize) -> Arc<KafkaSink> {
        let config = self.config(
            &format!("127.0.0.1:{}", closed_port()),
            Duration::from_secs(1),
        );
        Arc::new(build(&config, false, queue_bytes))
    }

    /// A transactional (exactly-once) sink to this scenario's topic, its session started.
    /// A start may fail while the positions topic it has just created is not yet known to
    /// the reader (UnknownPartition): it is tried again, as the relay's next session does.
    async fn started_transactional(&self) -> KafkaSink {
        let config = self.config(&self.brokers, Duration::from_secs(10));
        let sink = build(&config, true, 64 << 20)
            .transactional(&config)
            .expect("a transactional Kafka sink");
        for attempt in 1.. {
            match sink.committed_position().await {
                Ok(_) => break,
                Err(failure) if attempt < 3 => {
                    eprintln!("a session start failed, tried again: {}", failure.error);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(failure) => panic!("init_transactions and the position read: {failure:?}"),
            }
        }
        sink
    }
}

fn build(config: &KafkaConfig, strict: bool, queue_bytes: usize) -> KafkaSink {
    KafkaSink::new(config, "conformance", strict, queue_bytes)
        .and_then(|sink| sink.for_tables(&["outbox".to_owned()]))
        .expect("the Kafka sink")
}

async fn create_topic(brokers: &str, topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("a Kafka admin client");
    let max_bytes = MAX_MESSAGE_BYTES.to_string();
    let new = NewTopic::new(topic, PARTITIONS, TopicReplication::Fixed(1))
        .set("max.message.bytes", &max_bytes);
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin
        .create_topics([&new], &options)
        .await
        .unwrap_or_else(|e| panic!("creating topic {topic} at {brokers}: {e}"));
    for result in results {
        if let Err((topic, code)) = result {
            panic!("creating topic {topic}: {code:?}");
        }
    }
}

/// Row ids of `topic`'s committed records, partition by partition in offset order: read
/// until there are `at_least` and every partition is at its end, or [`DECIDED_WITHIN`].
/// The consumer's errors are passing ones (a topic a moment old may not be known to every
/// broker yet): it reads on, and the last one is shown if the read comes up short.
fn read(brokers: &str, topic: &str, at_least: usize) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("conformance-reader-{topic}"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()
        .expect("a Kafka consumer");
    let mut assignment = TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        assignment
            .add_partition_offset(topic, partition, Offset::Beginning)
            .expect("an assignment");
    }
    consumer.assign(&assignment).expect("assign");
    let deadline = Instant::now() + DECIDED_WITHIN;
    let mut records = Vec::new();
    let mut at_end = BTreeSet::new();
    let mut last_error = None;
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                let message_id = (message.headers())
                    .and_then(|headers| headers.iter().find(|h| h.key == "message_id"))
                    .and_then(|header| header.value)
                    .map(|value| String::from_utf8_lossy(value).into_owned())
                    .expect("a message_id header");
                records.push((message.partition(), message.offset(), row_id(&message_id)));
                at_end.remove(&message.partition());
            }
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                at_end.insert(partition);
            }
            Some(Err(e)) => last_error = Some(e),
            None => {}
        }
        if records.len() >= at_least && at_end.len() == PARTITIONS as usize {
            break;
        }
    }
    if records.len() < at_least {
        eprintln!(
            "reading {topic}: {} of {at_least} records within {DECIDED_WITHIN:?}; last \
             consumer error: {last_error:?}",
            records.len()
        );
    }
    records.sort_unstable();
    records.into_iter().map(|(_, _, id)| id).collect()
}

impl SinkHarness for KafkaHarness {
    type Sink = KafkaSink;

    async fn start() -> Self {
        let brokers = brokers();
        let suffix = rand::random::<u32>();
        let topic = format!("conformance.sink_{suffix}");
        create_topic(&brokers, &topic).await;
        Self {
            brokers,
            topic,
            suffix,
        }
    }

    async fn sink(&self) -> Arc<KafkaSink> {
        let config = self.config(&self.brokers, Duration::from_secs(10));
        Arc::new(build(&config, true, 64 << 20))
    }

    async fn delivered(&self, at_least: usize) -> Vec<i64> {
        let (brokers, topic) = (self.brokers.clone(), self.topic.clone());
        tokio::task::spawn_blocking(move || read(&brokers, &topic, at_least))
            .await
            .expect("the reader")
    }

    /// Nothing to do: every record waits for `linger.ms` and the broker's acknowledgement.
    fn slow_down(&self) {}

    /// Twice the topic's `max.message.bytes`, of bytes that do not compress: the broker
    /// refuses it (librdkafka's own limit, `message.max.bytes`, lets it go).
    fn refused_event(&self, id: i64, key: &str) -> OutboxEvent {
        let mut payload = vec![0; 2 * MAX_MESSAGE_BYTES];
        rand::thread_rng().fill_bytes(&mut payload);
        let mut refused = event(id, key);
        refused.payload = payload.into();
        refused
    }

    async fn unreachable_sink(&self) -> Arc<KafkaSink> {
        self.unanswered(64 << 20)
    }

    /// A transactional sink fenced by a second instance with its `transactional.id`, as
    /// an instance that lost the log to another: librdkafka declares it fatal.
    async fn fatal_sink(&self) -> Arc<KafkaSink> {
        let fenced = self.started_transactional().await;
        let successor = self.started_transactional().await;
        // Dropping a producer may wait for librdkafka's threads: not on the runtime.
        let _ = tokio::task::spawn_blocking(move || drop(successor)).await;
        Arc::new(fenced)
    }

    async fn bounded_sink(&self) -> (Arc<KafkaSink>, usize) {
        (self.unanswered(SMALLEST_QUEUE), SMALLEST_QUEUE)
    }
}

sink_conformance_tests! {
    harness: KafkaHarness,
    runtime: #[tokio::test(flavor = "multi_thread", worker_threads = 2)],
    applies: [
        each_keys_records_arrive_in_send_order_among_concurrent_keys,
        a_record_the_destination_refuses_is_rejected_and_others_go_on,
        #[ignore = "librdkafka batches a partition's records and the broker refuses the whole \
                    batch (MessageSizeTooLarge) when one record exceeds the topic's \
                    max.message.bytes: its batch-mates fail Rejected too, though they go \
                    when sent again"]
        a_refusal_is_the_records_alone_not_its_neighbours,
        an_unreachable_destination_is_retryable,
        recover_keeps_a_healthy_sink,
        a_fatal_sink_fails_fatal_until_recovered,
        handed_over_bytes_stay_within_the_bound,
        flush_waits_for_records_whose_outcome_is_awaited,
        flush_waits_for_records_whose_delivery_was_dropped,
    ],
    not_applicable: [],
}
