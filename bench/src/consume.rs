//! Reads a bench topic from the beginning and notes, per record, its `message_id` header
//! and the broker's append time (the topic is created with `LogAppendTime`).

use std::collections::HashSet;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Timestamp, TopicPartitionList};

/// One record as the broker stored it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) message_id: String,
    /// Broker append time, ms since the epoch.
    pub(crate) append_ms: i64,
}

#[derive(Debug, Default)]
pub(crate) struct Consumed {
    /// First sighting of every distinct message_id.
    pub(crate) records: Vec<Seen>,
    /// Records whose message_id had been seen before.
    pub(crate) duplicates: usize,
    /// Records with CreateTime instead of LogAppendTime (should be 0).
    pub(crate) not_append_time: usize,
}

impl Consumed {
    pub(crate) fn last_append_ms(&self) -> i64 {
        self.records.iter().map(|r| r.append_ms).max().unwrap_or(0)
    }
}

pub(crate) async fn create_topic(kafka: &str, topic: &str, partitions: i32) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka)
        .create()?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1))
        .set("message.timestamp.type", "LogAppendTime");
    let results = admin
        .create_topics(
            [&new],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await?;
    for result in results {
        if let Err((topic, code)) = result {
            anyhow::bail!("creating topic {topic}: {code:?}");
        }
    }
    Ok(())
}

pub(crate) async fn delete_topics(kafka: &str, topics: &[String]) {
    let admin: Result<AdminClient<DefaultClientContext>, _> =
        ClientConfig::new().set("bootstrap.servers", kafka).create();
    if let Ok(admin) = admin {
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let _ = admin.delete_topics(&names, &AdminOptions::new()).await;
    }
}

/// Consumes in a thread until `expected` distinct records were seen and the topic was
/// quiet for a second, or `timeout` passed.
pub(crate) fn spawn(
    kafka: &str,
    topic: &str,
    partitions: i32,
    expected: usize,
    timeout: Duration,
) -> JoinHandle<anyhow::Result<Consumed>> {
    spawn_filtered(kafka, topic, partitions, expected, timeout, "")
}

/// As [`spawn`], counting only records whose message_id starts with `prefix`.
pub(crate) fn spawn_filtered(
    kafka: &str,
    topic: &str,
    partitions: i32,
    expected: usize,
    timeout: Duration,
    prefix: &str,
) -> JoinHandle<anyhow::Result<Consumed>> {
    let kafka = kafka.to_owned();
    let topic = topic.to_owned();
    let prefix = prefix.to_owned();
    std::thread::spawn(move || consume(&kafka, &topic, partitions, expected, timeout, &prefix))
}

/// A consumer of every partition of `topics` (each of `partitions`) from the beginning,
/// in group `group` (no offsets committed).
pub(crate) fn from_beginning(
    kafka: &str,
    group: &str,
    topics: &[&str],
    partitions: i32,
) -> anyhow::Result<BaseConsumer> {
    let mut assignment = TopicPartitionList::new();
    for topic in topics {
        for p in 0..partitions {
            assignment.add_partition_offset(topic, p, rdkafka::Offset::Beginning)?;
        }
    }
    from(kafka, group, &assignment)
}

/// A consumer of `assignment` (topics, partitions and where to start), in group `group`
/// (no offsets committed).
pub(crate) fn from(
    kafka: &str,
    group: &str,
    assignment: &TopicPartitionList,
) -> anyhow::Result<BaseConsumer> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10")
        // librdkafka's default, stated: with exactly-once, aborted records are not counted.
        .set("isolation.level", "read_committed")
        .create()?;
    consumer.assign(assignment)?;
    Ok(consumer)
}

/// A record's `message_id` header.
pub(crate) fn message_id<M: Message>(m: &M) -> Option<String> {
    m.headers().and_then(|h| {
        h.iter()
            .find(|h| h.key == "message_id")
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    })
}

fn consume(
    kafka: &str,
    topic: &str,
    partitions: i32,
    expected: usize,
    timeout: Duration,
    prefix: &str,
) -> anyhow::Result<Consumed> {
    let consumer = from_beginning(
        kafka,
        &format!("bench-{topic}-{prefix}"),
        &[topic],
        partitions,
    )?;
    let settle = Duration::from_millis(1000);
    let deadline = Instant::now() + timeout;
    let mut seen = HashSet::with_capacity(expected);
    let mut out = Consumed::default();
    let mut last = Instant::now();
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(m)) => {
                last = Instant::now();
                let append_ms = match m.timestamp() {
                    Timestamp::LogAppendTime(ms) => ms,
                    Timestamp::CreateTime(ms) => {
                        out.not_append_time += 1;
                        ms
                    }
                    Timestamp::NotAvailable => 0,
                };
                let id = message_id(&m);
                let Some(id) = id.filter(|id| id.starts_with(prefix)) else {
                    continue;
                };
                if seen.insert(id.clone()) {
                    out.records.push(Seen {
                        message_id: id,
                        append_ms,
                    });
                } else {
                    out.duplicates += 1;
                }
            }
            Some(Err(e)) => eprintln!("bench consumer: {e}"),
            None => {
                if seen.len() >= expected && last.elapsed() > settle {
                    break;
                }
            }
        }
    }
    Ok(out)
}
