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

fn client_config(kafka: &KafkaConfig) -> ClientConfig {
    crate::sink::kafka::connection_settings(kafka)
}

/// Creates `topic` when it is missing (the broker's default replication), and waits until
/// its partitions have leaders; says whether it created it. Looks before creating: a
/// cluster with ACLs may refuse a creation for an existing topic.
pub(crate) async fn ensure_topic(kafka: &KafkaConfig, topic: &str) -> Result<bool, String> {
    if partitions_with_leaders(kafka, topic).await?.is_some() {
        return Ok(false);
    }
    let admin: AdminClient<DefaultClientContext> = client_config(kafka)
        .create()
        .map_err(|e| format!("cannot create a Kafka admin client: {e}"))?;
    let new = NewTopic::new(topic, NEW_TOPIC_PARTITIONS, TopicReplication::Fixed(-1));
    let options = AdminOptions::new().operation_timeout(Some(CALL_TIMEOUT));
    let results = (admin.create_topics([&new], &options).await)
        .map_err(|e| format!("cannot create topic {topic}: {e}"))?;
    let created = match results.into_iter().next() {
        Some(Ok(_)) => true,
        Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) | None => false,
        Some(Err((_, code))) => {
            return Err(format!(
                "topic {topic} is missing and cannot be created ({code}): create it, or \
                 name another with --topic"
            ))
        }
    };
    // A new topic's partitions get their leaders a moment after the creation returns.
    for _ in 0..50 {
        if partitions_with_leaders(kafka, topic).await?.is_some() {
            return Ok(created);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!(
        "topic {topic} was created but its partitions have no leader after 10 s"
    ))
}

/// `Some(partitions)` when `topic` exists and every partition has a leader.
async fn partitions_with_leaders(
    kafka: &KafkaConfig,
    topic: &str,
) -> Result<Option<usize>, String> {
    let client = client_config(kafka);
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = client
            .create()
            .map_err(|e| format!("cannot create a Kafka client: {e}"))?;
        let metadata = consumer
            .fetch_metadata(Some(&topic), CALL_TIMEOUT)
            .map_err(|e| format!("cannot read topic {topic}'s metadata: {e}"))?;
        let found = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
            .map(|t| t.partitions())
            .filter(|p| !p.is_empty() && p.iter().all(|p| p.leader() >= 0));
        Ok(found.map(<[_]>::len))
    })
    .await
    .map_err(|e| format!("the Kafka metadata task failed: {e}"))?
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

/// An error that reading again will not cure.
fn is_fatal(error: &rdkafka::error::KafkaError) -> bool {
    use RDKafkaErrorCode::{TopicAuthorizationFailed, UnknownTopicOrPartition};
    matches!(
        error.rdkafka_error_code(),
        Some(TopicAuthorizationFailed | UnknownTopicOrPartition)
    )
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
                    let key = record.key().map(<[u8]>::to_vec);
                    arrivals.record(index, Some((record.partition(), record.offset())), key);
                }
            }
            // Not allowed to read the topic, or it is gone: nothing will ever arrive, and
            // that is the set-up's fault, not the relay's.
            Some(Err(e)) if is_fatal(&e) => {
                arrivals.reader_failed(format!(
                    "verify's consumer cannot read the run's topic: {e} (it needs READ on \
                     the topic with [kafka]'s credentials)"
                ));
                return;
            }
            // Transient (a broker restarting): the consumer goes on by itself.
            Some(Err(e)) => tracing::debug!(error = %e, "verify: Kafka consumer error"),
        }
    }
}
