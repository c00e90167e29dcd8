//! Exactly-once into Kafka (`delivery.exactly_once`): Kafka transactions that end on the
//! source's transaction boundaries and carry the log position they reach.
//!
//! How the guarantee holds (the relay's side is in `relay/session/`):
//! - Records go out inside one open Kafka transaction. At a database transaction boundary,
//!   once every record sent is acknowledged, the relay writes the rows' statuses back and
//!   then commits the Kafka transaction together with one record of the position it
//!   reaches, in the compacted `kafka.positions_topic`, keyed by the `transactional.id`.
//! - A `read_committed` consumer sees a transaction's records only once it is committed.
//!   After a crash the next session reads the last committed position from that topic and
//!   sends everything past it again, rows the table shows SUCCESS included: their
//!   write-back may precede a commit that never happened. Nothing at or below it is sent
//!   again, so each row is committed to Kafka once.
//! - Statuses are written before the commit because the other order would need the
//!   outcome of every row of the transaction stored in Kafka as well: a committed record
//!   whose row is still INIT could not be told from one that was never sent.
//! - The `transactional.id` is the pipeline's. A session that holds the log starts a fresh
//!   producer whose `init_transactions` fences any older one with the same id (an
//!   instance that lost the log but still runs: its commit fails) and aborts what that one
//!   left open.
//! - Pipelines may share one positions topic (each reads only its own key). A
//!   `read_committed` read stops at the last stable offset, which another pipeline's open
//!   transaction holds back, up to that pipeline's `transaction.timeout.ms` when it died
//!   between its position record and its commit. Waiting for the high watermark would
//!   stall every session start that long (issue 26); stopping at the stable offset alone
//!   is not sound either: this pipeline's last record may lie past that transaction,
//!   committed but not yet visible, and an older position would send committed records
//!   again. So after `init_transactions` (no record of this pipeline is undecided, and
//!   none is added until the session sends) the reader looks past the stable offset with
//!   `read_uncommitted`: without a record of its own there, what it read is complete;
//!   with one, it waits until the stable offset passes it (see [`read_position`]).
//!
//! Retries of FAILED rows (the claim worker) and `recover` use an ordinary producer: their
//! records are at least once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use outboxd_connector::CheckLine;
use outboxd_connector::Position;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::KafkaConfig;
use crate::sink::CommittedPosition;

/// How long one transactional call (init, commit) or the position read may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The Kafka-transaction state of an exactly-once sink.
pub(super) struct Transactions {
    /// `transactional.id`; also the key of this pipeline's position records.
    id: String,
    /// `kafka.positions_topic`.
    topic: String,
    /// Connection and security settings for the admin client and the position reader.
    reader: ClientConfig,
    /// A Kafka transaction is open on the current producer.
    open: AtomicBool,
    /// The positions topic is known to exist: created or found once, not at every
    /// session start.
    topic_ready: AtomicBool,
}

impl Transactions {
    pub(super) fn new(config: &KafkaConfig, pipeline: &str) -> Self {
        let reader = super::connection_settings(config);
        Self {
            id: config.transactional_id(pipeline),
            topic: config.positions_topic(pipeline),
            reader,
            open: AtomicBool::new(false),
            topic_ready: AtomicBool::new(false),
        }
    }

    /// The producer settings exactly-once needs. A record may wait for the broker at most
    /// `message_timeout`: past it the transaction is aborted and sent again whole, so the
    /// order of a key holds without the no-expiry rule of strict ordering.
    pub(super) fn configure(&self, client: &mut ClientConfig, message_timeout: Duration) {
        let message_ms = message_timeout.as_millis().clamp(1_000, 900_000);
        // The broker aborts a transaction open longer than this (its own maximum,
        // transaction.max.timeout.ms, defaults to 15 minutes).
        let transaction_ms = (message_ms * 2).clamp(60_000, 900_000);
        client.set("transactional.id", &self.id);
        client.set("message.timeout.ms", message_ms.to_string());
        client.set("transaction.timeout.ms", transaction_ms.to_string());
    }

    /// Starts `producer` as this pipeline's transactional producer (fencing any older
    /// one), makes sure the positions topic exists, and reads the last committed position.
    pub(super) async fn start(
        &self,
        producer: FutureProducer,
    ) -> Result<Option<CommittedPosition>, String> {
        self.open.store(false, Ordering::SeqCst);
        let id = self.id.clone();
        tokio::task::spawn_blocking(move || producer.init_transactions(CALL_TIMEOUT))
            .await
            .map_err(|e| format!("init_transactions task failed: {e}"))?
            .map_err(|e| {
                format!(
                    "cannot start Kafka transactions for transactional.id `{id}`: {e}; \
                     exactly-once needs brokers with transactions (Kafka 0.11+, \
                     transaction.state.log.* settings that the cluster can meet) and, \
                     with ACLs, WRITE and DESCRIBE on the transactional id"
                )
            })?;
        if !self.topic_ready.load(Ordering::SeqCst) {
            self.ensure_topic().await?;
            self.topic_ready.store(true, Ordering::SeqCst);
        }
        let reader = self.reader.clone();
        let (topic, key) = (self.topic.clone(), self.id.clone());
        tokio::task::spawn_blocking(move || read_position(&reader, &topic, &key))
            .await
            .map_err(|e| format!("position read task failed: {e}"))?
    }

    /// Opens a Kafka transaction unless one is open.
    pub(super) fn begin(&self, producer: &FutureProducer) -> Result<(), String> {
        if self.open.load(Ordering::SeqCst) {
            return Ok(());
        }
        producer
            .begin_transaction()
            .map_err(|e| format!("cannot begin a Kafka transaction: {e}"))?;
        self.open.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Commits every record sent since the last commit, together with `committed`.
    pub(super) async fn commit(
        &self,
        producer: &FutureProducer,
        committed: &CommittedPosition,
    ) -> Result<(), String> {
        self.begin(producer)?;
        let value = encode(committed);
        let record = FutureRecord::to(&self.topic).key(&self.id).payload(&value);
        let delivery = producer
            .send_result(record)
            .map_err(|(e, _)| format!("cannot record the position in {}: {e}", self.topic))?;
        // The position record is acknowledged before the commit is asked for, and so is
        // every other record (the relay commits only with every receipt in). The commit's
        // own flush then finds nothing to wait for: rdkafka's flush, finding a record
        // still out, blocks in `poll` for 100 ms while the producer's polling thread
        // takes the acknowledgement, which made every commit last 100 ms.
        // A record that failed is not the end of it: the commit below then fails, and
        // says why (a fenced producer's records are purged, for one).
        let record_failed = match tokio::time::timeout(CALL_TIMEOUT, delivery).await {
            Ok(Ok(Ok(_))) => None,
            Ok(Ok(Err((e, _)))) => {
                Some(format!("cannot record the position in {}: {e}", self.topic))
            }
            Ok(Err(_)) | Err(_) => Some(format!(
                "the position record in {} was not acknowledged",
                self.topic
            )),
        };
        if record_failed.is_none() {
            wait_for_empty_queue(producer).await;
        }
        self.open.store(false, Ordering::SeqCst);
        let committing = producer.clone();
        let result =
            tokio::task::spawn_blocking(move || committing.commit_transaction(CALL_TIMEOUT))
                .await
                .map_err(|e| format!("commit task failed: {e}"))?;
        if let (Ok(()), Some(why)) = (&result, record_failed) {
            // librdkafka fails a commit whose records failed; never report one as done.
            return Err(format!(
                "the Kafka transaction may not hold its position: {why}"
            ));
        }
        result.map_err(|e| {
            let fenced = matches!(
                e.rdkafka_error_code(),
                Some(RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch)
            );
            if fenced {
                format!(
                    "the Kafka transaction was not committed: another outboxd with \
                     transactional.id `{}` has taken over (this one is fenced): {e}",
                    self.id
                )
            } else {
                format!("the Kafka transaction was not committed: {e}")
            }
        })
    }

    /// Aborts the open transaction, if any, within a bound; errors are only logged (a
    /// fresh producer's `init_transactions` aborts it too).
    pub(super) async fn abort(&self, producer: &FutureProducer) {
        if !self.open.swap(false, Ordering::SeqCst) {
            return;
        }
        let aborting = producer.clone();
        let result = tokio::task::spawn_blocking(move || {
            aborting.abort_transaction(Duration::from_secs(10))
        })
        .await;
        if let Ok(Err(e)) = result {
            tracing::warn!(error = %e, "could not abort the open Kafka transaction; the broker aborts it after transaction.timeout.ms");
        }
    }

    /// Creates the compacted positions topic when it is missing.
    async fn ensure_topic(&self) -> Result<(), String> {
        let admin: AdminClient<DefaultClientContext> = self
            .reader
            .create()
            .map_err(|e| format!("cannot create a Kafka admin client: {e}"))?;
        // -1: the broker's default replication factor.
        // Compaction never touches the active segment, which every session start reads:
        // roll it hourly so it stays small (about ten records a second per pipeline).
        let topic = NewTopic::new(&self.topic, 1, TopicReplication::Fixed(-1))
            .set("cleanup.policy", "compact")
            .set("segment.ms", "3600000")
            .set("min.cleanable.dirty.ratio", "0.1");
        let options = AdminOptions::new().operation_timeout(Some(CALL_TIMEOUT));
        let results = admin
            .create_topics([&topic], &options)
            .await
            .map_err(|e| format!("cannot create topic {}: {e}", self.topic))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(format!(
                        "cannot create the positions topic {name}: {code}; create it \
                         (cleanup.policy=compact) or name another in kafka.positions_topic"
                    ))
                }
            }
        }
        Ok(())
    }
}

/// Waits, briefly, until librdkafka has let go of every acknowledged record: a record's
/// delivery resolves inside its delivery callback, a moment before librdkafka counts
/// it done, and a flush that still counts it waits 100 ms (see [`Transactions::commit`]).
async fn wait_for_empty_queue(producer: &FutureProducer) {
    const BOUND: Duration = Duration::from_millis(50);
    let started = Instant::now();
    while producer.in_flight_count() > 0 && started.elapsed() < BOUND {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// `outboxd check` under exactly-once: the transactional id and the positions topic, which
/// must be compacted (it is read from its start at every session start). Looks only: a
/// check must not fence the running instance, so no `init_transactions`.
pub(crate) async fn check_line(config: &KafkaConfig, pipeline: &str) -> CheckLine {
    let transactions = Transactions::new(config, pipeline);
    let topic = transactions.topic.as_str();
    let id = transactions.id.as_str();
    let admin: AdminClient<DefaultClientContext> = match transactions.reader.create() {
        Ok(admin) => admin,
        Err(e) => {
            return CheckLine::fail(
                "exactly-once",
                format!("no admin client: {e}"),
                "fix [kafka]",
            )
        }
    };
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(5)));
    let described = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &options)
        .await;
    let missing = CheckLine::ok(
        "exactly-once",
        format!(
            "Kafka transactions as `{id}`; the positions topic {topic} is created at the first \
             run (or create it with cleanup.policy=compact); consumers must read with \
             isolation.level=read_committed"
        ),
    );
    let policy = match described.as_deref() {
        // A topic that does not exist has no configuration (brokers answer either way).
        Ok([Ok(resource)]) if resource.entries.is_empty() => return missing,
        Ok([Err(RDKafkaErrorCode::UnknownTopicOrPartition)]) => return missing,
        Ok([Ok(resource)]) => resource.get("cleanup.policy").and_then(|e| e.value.clone()),
        Ok(other) => {
            return CheckLine::fail(
                "exactly-once",
                format!("cannot describe the positions topic {topic}: {other:?}"),
                "check that the brokers are reachable and that outboxd may DESCRIBE_CONFIGS it",
            )
        }
        Err(e) => {
            return CheckLine::fail(
                "exactly-once",
                format!("cannot describe the positions topic {topic}: {e}"),
                "check that the brokers are reachable and that outboxd may DESCRIBE_CONFIGS it",
            )
        }
    };
    if policy.as_deref().is_some_and(|p| p.contains("compact")) {
        CheckLine::ok(
            "exactly-once",
            format!(
                "Kafka transactions as `{id}`, positions in {topic} (compacted); consumers \
                 must read with isolation.level=read_committed"
            ),
        )
    } else {
        CheckLine::warn(
            "exactly-once",
            format!(
                "the positions topic {topic} has cleanup.policy={}: it grows without end and \
                 every session start reads it whole",
                policy.as_deref().unwrap_or("unknown")
            ),
            "set cleanup.policy=compact on it, or name a compacted topic in kafka.positions_topic",
        )
    }
}

/// The position reader's client context: reaching a partition's end is how the reader
/// knows it is done, not an error worth a log line.
struct PositionReader;

impl ClientContext for PositionReader {
    fn error(&self, error: KafkaError, reason: &str) {
        let end = matches!(error, KafkaError::PartitionEOF(_))
            || error.rdkafka_error_code() == Some(RDKafkaErrorCode::PartitionEOF);
        if !end {
            tracing::warn!(%error, reason, "reading the Kafka positions topic");
        }
    }
}

impl ConsumerContext for PositionReader {}

/// JSON: `{"position": {"ordinal": "…", "text": "…"}, "checkpoint": … or null}` (the
/// ordinal as a string: JSON numbers stop at 2^53; a position's text may hold anything).
fn encode(committed: &CommittedPosition) -> String {
    let position = |p: &Position| serde_json::json!({ "ordinal": p.ordinal().to_string(), "text": p.as_str() });
    serde_json::json!({
        "position": position(&committed.position),
        "checkpoint": committed.checkpoint.as_ref().map(position),
    })
    .to_string()
}

fn decode(value: &[u8]) -> Option<CommittedPosition> {
    let json: serde_json::Value = serde_json::from_slice(value).ok()?;
    let position = |v: &serde_json::Value| -> Option<Position> {
        let ordinal = v.get("ordinal")?.as_str()?.parse().ok()?;
        Some(Position::new(ordinal, v.get("text")?.as_str()?))
    };
    let checkpoint = match json.get("checkpoint")? {
        serde_json::Value::Null => None,
        v => Some(position(v)?),
    };
    Some(CommittedPosition {
        position: position(json.get("position")?)?,
        checkpoint,
    })
}

/// The last position committed under `key`: every partition of `topic` read with
/// `read_committed` (records of aborted transactions are never seen) to its last stable
/// offset, or further when a record under `key` lies past it (see the module doc).
fn read_position(
    reader: &ClientConfig,
    topic: &str,
    key: &str,
) -> Result<Option<CommittedPosition>, String> {
    let consumer: BaseConsumer<PositionReader> = reader
        .clone()
        .set("group.id", format!("{key}.position-reader"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        // The end of the partition is known from a fetch that finds nothing more, which
        // the broker holds for fetch.wait.max.ms (500 ms by default) first: a session
        // start (and the relay with it) would wait that long for nothing.
        .set("fetch.wait.max.ms", "10")
        .create_with_context(PositionReader)
        .map_err(|e| format!("cannot create a Kafka consumer: {e}"))?;
    // Reads past the last stable offset, which an open transaction holds back: records
    // of open and aborted transactions included, up to the high watermark.
    let probe: BaseConsumer<PositionReader> = reader
        .clone()
        .set("group.id", format!("{key}.position-reader"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_uncommitted")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "10")
        .create_with_context(PositionReader)
        .map_err(|e| format!("cannot create a Kafka consumer: {e}"))?;
    let metadata = consumer
        .fetch_metadata(Some(topic), CALL_TIMEOUT)
        .map_err(|e| format!("cannot read the metadata of {topic}: {e}"))?;
    let partitions = metadata
        .topics()
        .first()
        .map_or(0, |t| t.partitions().len());
    if partitions == 0 {
        return Err(format!("the positions topic {topic} has no partitions"));
    }
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions {
        let p = i32::try_from(p).map_err(|_| format!("{topic}: too many partitions"))?;
        assignment
            .add_partition_offset(topic, p, Offset::Beginning)
            .map_err(|e| e.to_string())?;
    }
    consumer.assign(&assignment).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + CALL_TIMEOUT;
    let mut at_end = std::collections::HashSet::new();
    // Per partition: one past this pipeline's last record, committed or not.
    let mut own_end = std::collections::HashMap::new();
    let mut last: Option<(i64, CommittedPosition)> = None;
    while at_end.len() < partitions {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "reading the positions topic {topic} did not reach its end within \
                 {CALL_TIMEOUT:?}; when this pipeline's last record lies past a Kafka \
                 transaction still open on the topic (another producer's, sharing it), it \
                 is read once that transaction ends (the broker aborts it after that \
                 producer's transaction.timeout.ms)"
            ));
        }
        match consumer.poll(left.min(Duration::from_millis(500))) {
            Some(Ok(message)) if message.key() == Some(key.as_bytes()) => {
                let position = message.payload().and_then(decode).ok_or_else(|| {
                    format!(
                        "the position record at {topic}/{}/{} cannot be read; it was not \
                         written by outboxd",
                        message.partition(),
                        message.offset()
                    )
                })?;
                // One partition holds a key's records; keep its latest.
                if last
                    .as_ref()
                    .is_none_or(|(offset, _)| message.offset() > *offset)
                {
                    last = Some((message.offset(), position));
                }
            }
            Some(Ok(_)) => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                // read_committed stops at the last stable offset: a transaction still
                // open on this partition (another pipeline's, when the topic is shared)
                // hides what follows it. Past it, only this pipeline's own records matter
                // (see the module doc): the end counts once the stable offset has passed
                // the last of them, found once with read_uncommitted.
                // Nothing fetched yet (an empty partition): the position is not an offset.
                let stable = consumer
                    .position()
                    .ok()
                    .and_then(|list| list.find_partition(topic, p).map(|tp| tp.offset()));
                let stable = match stable {
                    Some(Offset::Offset(n)) => n,
                    _ => {
                        probe
                            .fetch_watermarks(topic, p, Duration::from_secs(5))
                            .map_err(|e| format!("reading the watermarks of {topic}/{p}: {e}"))?
                            .0
                    }
                };
                let end = match own_end.get(&p) {
                    Some(end) => *end,
                    None => {
                        let end = own_records_end(&probe, topic, p, stable, key, deadline)?;
                        own_end.insert(p, end);
                        end
                    }
                };
                if stable >= end {
                    at_end.insert(p);
                } else {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            Some(Err(e)) => return Err(format!("reading the positions topic {topic}: {e}")),
            None => {}
        }
    }
    Ok(last.map(|(_, committed)| committed))
}

/// One past the offset of the last record keyed `key` in `topic`/`partition` at or after
/// `from` (`from` itself when there is none), read with `read_uncommitted`: records of
/// transactions still open or aborted included. Called after `init_transactions`, when no
/// record under `key` is added, so the partition's end at this read bounds them all.
fn own_records_end(
    probe: &BaseConsumer<PositionReader>,
    topic: &str,
    partition: i32,
    from: i64,
    key: &str,
    deadline: Instant,
) -> Result<i64, String> {
    let (_, high) = probe
        .fetch_watermarks(topic, partition, Duration::from_secs(5))
        .map_err(|e| format!("reading the watermarks of {topic}/{partition}: {e}"))?;
    if from >= high {
        return Ok(from);
    }
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, Offset::Offset(from))
        .map_err(|e| e.to_string())?;
    probe.assign(&assignment).map_err(|e| e.to_string())?;
    let mut end = from;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "reading the positions topic {topic} past its last stable offset did not \
                 reach its end within {CALL_TIMEOUT:?}"
            ));
        }
        match probe.poll(left.min(Duration::from_millis(500))) {
            Some(Ok(message)) => {
                if message.key() == Some(key.as_bytes()) {
                    end = end.max(message.offset() + 1);
                }
                if message.offset() + 1 >= high {
                    break;
                }
            }
            // The end, past `high` or at it (a transaction marker is the last offset).
            Some(Err(KafkaError::PartitionEOF(_))) => break,
            Some(Err(e)) => return Err(format!("reading the positions topic {topic}: {e}")),
            None => {}
        }
    }
    probe.unassign().map_err(|e| e.to_string())?;
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_survives_its_record() {
        let position = Position::new(u128::from(u64::MAX) + 7, "binlog:b.000001:4\ngtid\t\"x\"");
        for checkpoint in [None, Some(Position::new(3, "lsn:0/3"))] {
            let committed = CommittedPosition {
                position: position.clone(),
                checkpoint,
            };
            assert_eq!(decode(encode(&committed).as_bytes()), Some(committed));
        }
        assert_eq!(decode(b"not a position"), None);
        assert_eq!(
            decode(br#"{"position":{"ordinal":"x","text":"lsn:0/1"},"checkpoint":null}"#),
            None
        );
        assert_eq!(
            decode(br#"{"position":{"ordinal":"1","text":"lsn:0/1"}}"#),
            None
        );
        assert_eq!(decode(&[0xff, 0xfe]), None);
    }
}
