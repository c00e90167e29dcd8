//! `verify`'s view of Kafka: a consumer of the run's topic, assigned every partition at
//! its end as the run starts (so only this run's records are read, and none of them is
//! missed however late the relay sends it), `read_committed` so that records of aborted
//! exactly-once transactions are not counted. It polls on a thread of its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::arrivals::Arrivals;
use super::plan::find_index;
use crate::sink::kafka::config::KafkaConfig;

/// Metadata, watermark and admin calls wait at most this long.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// Partitions of a topic `verify` creates when it is missing.
const NEW_TOPIC_PARTITIONS: i32 = 3;

/// The connection and security settings of `[kafka]` (not its producer options), with
/// `bootstrap.servers`.
fn client_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut client = ClientConfig::new();
    for (key, value) in &kafka.options {
        let shared = ["security.", "sasl.", "ssl.", "client.", "socket."];
        if shared.iter().any(|p| key.starts_with(p)) {
            client.set(key, value);
        }
    }
    client.set("bootstrap.servers", &kafka.bootstrap_servers);
    client
}

/// Creates `topic` when it is missing (the broker's default replication); says whether
/// it did.
pub(crate) async fn ensure_topic(kafka: &KafkaConfig, topic: &str) -> Result<bool, String> {
    let admin: AdminClient<DefaultClientContext> = client_config(kafka)
        .create()
        .map_err(|e| format!("cannot create a Kafka admin client: {e}"))?;
    let new = NewTopic::new(topic, NEW_TOPIC_PARTITIONS, TopicReplication::Fixed(-1));
    let options = AdminOptions::new().operation_timeout(Some(CALL_TIMEOUT));
    let results = (admin.create_topics([&new], &options).await)
        .map_err(|e| format!("cannot create topic {topic}: {e}"))?;
    match results.into_iter().next() {
        Some(Ok(_)) => Ok(true),
        Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) | None => Ok(false),
        Some(Err((_, code))) => Err(format!(
            "topic {topic} is missing and cannot be created ({code}): create it, or name \
             another with --topic"
        )),
    }
}

/// Deletes `topic` (`--cleanup-topic`).
pub(crate) async fn delete_topic(kafka: &KafkaConfig, topic: &str) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> = client_config(kafka)
        .create()
        .map_err(|e| format!("cannot create a Kafka admin client: {e}"))?;
    let options = AdminOptions::new().operation_timeout(Some(CALL_TIMEOUT));
    let results = (admin.delete_topics(&[topic], &options).await)
        .map_err(|e| format!("cannot delete topic {topic}: {e}"))?;
    match results.into_iter().next() {
        Some(Err((_, code))) => Err(format!("cannot delete topic {topic}: {code}")),
        _ => Ok(()),
    }
}

/// The consumer thread; stops when dropped.
pub(crate) struct KafkaReader {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl KafkaReader {
    /// Assigns every partition of `topic` at its end, then reads on a thread: each record
    /// carrying an id of the run (`prefix`) is recorded in `arrivals`.
    pub(crate) async fn start(
        kafka: &KafkaConfig,
        run: &str,
        topic: &str,
        prefix: String,
        arrivals: Arc<Arrivals>,
    ) -> Result<Self, String> {
        let mut client = client_config(kafka);
        client
            .set("group.id", format!("outboxd-verify-{run}"))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .set("isolation.level", "read_committed");
        let topic = topic.to_owned();
        let consumer = tokio::task::spawn_blocking(move || assigned_at_end(&client, &topic))
            .await
            .map_err(|e| format!("the Kafka set-up task failed: {e}"))??;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("verify-kafka".into())
            .spawn(move || read(&consumer, &prefix, &arrivals, &stopped))
            .map_err(|e| format!("cannot start the Kafka reader thread: {e}"))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for KafkaReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn assigned_at_end(client: &ClientConfig, topic: &str) -> Result<BaseConsumer, String> {
    let consumer: BaseConsumer = client
        .create()
        .map_err(|e| format!("cannot create the Kafka consumer: {e}"))?;
    let metadata = consumer
        .fetch_metadata(Some(topic), CALL_TIMEOUT)
        .map_err(|e| format!("cannot read topic {topic}'s metadata: {e}"))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(format!(
            "topic {topic} has no partitions the consumer can see"
        ));
    }
    let mut assignment = TopicPartitionList::new();
    for partition in partitions {
        let (_, high) = consumer
            .fetch_watermarks(topic, partition, CALL_TIMEOUT)
            .map_err(|e| format!("cannot read the end of {topic}/{partition}: {e}"))?;
        assignment
            .add_partition_offset(topic, partition, Offset::Offset(high))
            .map_err(|e| format!("cannot assign {topic}/{partition}: {e}"))?;
    }
    consumer
        .assign(&assignment)
        .map_err(|e| format!("cannot assign {topic}'s partitions: {e}"))?;
    Ok(consumer)
}

fn read(consumer: &BaseConsumer, prefix: &str, arrivals: &Arrivals, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Ok(record)) => {
                let from_header = record.headers().and_then(|headers| {
                    headers
                        .iter()
                        .find(|h| h.key == "message_id")
                        .and_then(|h| h.value)
                        .and_then(|value| find_index(value, prefix))
                });
                let index =
                    from_header.or_else(|| record.payload().and_then(|p| find_index(p, prefix)));
                if let Some(index) = index {
                    arrivals.record(index, Some((record.partition(), record.offset())));
                }
            }
            // Transient (a broker restarting): the consumer goes on by itself.
            Some(Err(e)) => tracing::debug!(error = %e, "verify: Kafka consumer error"),
        }
    }
}
