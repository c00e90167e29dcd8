//! Kafka ingress: a consumer group reads the configured topics and stores each record in
//! the inbox before its offset may be committed.
//!
//! Offsets: librdkafka commits in the background (`enable.auto.commit`) only offsets this
//! code *stored*, and it stores a record's offset only after the inbox transaction
//! holding it committed (`enable.auto.offset.store=false`). On a rebalance or close,
//! librdkafka commits the stored offsets before it lets the partitions go; records read
//! but not yet stored are read again by the next owner and dropped there as duplicates.
//! A crash between the insert and the commit is the same case: at-least-once delivery
//! into a table that keeps each message once.
//!
//! Record → message: `message_id`, `message_type` and `biz_key` come from headers (names
//! configurable; `biz_key` falls back to the record key), the payload is the value, the
//! other headers are kept. A record that lacks what the inbox needs is never dropped: it
//! is stored MANUAL_REQUIRED with the reason, under `<topic>/<partition>/<offset>` as id.

use std::collections::HashMap;
use std::time::Instant;

use futures_util::FutureExt;
use outboxd_connector::{Connector, ConnectorError, InboxMessage};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;

use super::config::KafkaIngressConfig;
use super::Ingest;
use crate::config::KafkaConfig;
use crate::reconnect::ReconnectBackoff;

/// `[kafka.options]` keys that also apply to the consumer: how to reach and authenticate
/// to the same cluster.
const SHARED_OPTION_PREFIXES: [&str; 4] = ["security.", "sasl.", "ssl.", "client."];

/// Consumes until shutdown (Ok) or until the consumer or the inbox fails.
pub(crate) async fn run<C: Connector>(
    ingest: &Ingest<C>,
    kafka: &KafkaConfig,
    config: &KafkaIngressConfig,
    backoff: &mut ReconnectBackoff,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectorError> {
    let json = ingest.payload_is_json().await?;
    let consumer = consumer(kafka, config)?;
    let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
    consumer
        .subscribe(&topics)
        .map_err(|e| ConnectorError::definite(format!("cannot subscribe to {topics:?}: {e}")))?;
    tracing::info!(topics = ?config.topics, group = %config.group_id, "inbox Kafka ingress started");
    loop {
        let first = tokio::select! {
            received = consumer.recv() => received,
            _ = shutdown.wait_for(|stop| *stop) => return Ok(()),
        };
        // The batch: what has arrived already (under load, while the previous insert
        // committed), then, if configured, what arrives within `batch_wait`.
        let mut records = vec![first.map_err(kafka_error)?];
        while records.len() < config.batch_size {
            match consumer.recv().now_or_never() {
                Some(received) => records.push(received.map_err(kafka_error)?),
                None => break,
            }
        }
        let deadline = Instant::now() + config.batch_wait;
        while records.len() < config.batch_size && !config.batch_wait.is_zero() {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, consumer.recv()).await {
                Ok(received) => records.push(received.map_err(kafka_error)?),
                Err(_) => break,
            }
        }
        let messages: Vec<InboxMessage> = records
            .iter()
            .map(|record| to_message(record, config, json))
            .collect();
        ingest.store(&messages, "kafka").await?;
        backoff.reset();
        if let Err(e) = consumer.store_offsets(&next_offsets(&records)?) {
            // A partition revoked while its records were being stored: its new owner
            // reads them again and drops them as duplicates. Nothing to retry here.
            tracing::debug!(error = %e, "inbox Kafka ingress: offsets not stored (rebalanced meanwhile)");
        }
    }
}

fn consumer(
    kafka: &KafkaConfig,
    config: &KafkaIngressConfig,
) -> Result<StreamConsumer, ConnectorError> {
    let mut client = ClientConfig::new();
    for (key, value) in &kafka.options {
        if SHARED_OPTION_PREFIXES.iter().any(|p| key.starts_with(p)) {
            client.set(key, value);
        }
    }
    for (key, value) in &config.options {
        client.set(key, value);
    }
    client
        .set("bootstrap.servers", &kafka.bootstrap_servers)
        .set("group.id", &config.group_id)
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false");
    if !config.options.contains_key("auto.offset.reset") {
        client.set("auto.offset.reset", "earliest");
    }
    client.create().map_err(|e| {
        ConnectorError::definite(format!(
            "cannot create the inbox Kafka consumer: {}",
            crate::secrets::kafka_error_text(&e)
        ))
    })
}

fn kafka_error(e: rdkafka::error::KafkaError) -> ConnectorError {
    ConnectorError::transient(format!("inbox Kafka ingress: {e}"))
}

/// The offset after the last record of each partition.
fn next_offsets(records: &[BorrowedMessage<'_>]) -> Result<TopicPartitionList, ConnectorError> {
    let mut last: HashMap<(&str, i32), i64> = HashMap::new();
    for r in records {
        let entry = last.entry((r.topic(), r.partition())).or_insert(r.offset());
        *entry = (*entry).max(r.offset());
    }
    let mut list = TopicPartitionList::with_capacity(last.len());
    for ((topic, partition), offset) in last {
        list.add_partition_offset(topic, partition, Offset::Offset(offset + 1))
            .map_err(kafka_error)?;
    }
    Ok(list)
}

/// One record as an inbox message (rejected when it lacks what the inbox needs).
fn to_message(
    record: &BorrowedMessage<'_>,
    config: &KafkaIngressConfig,
    json: bool,
) -> InboxMessage {
    let coordinates = format!(
        "{}/{}/{}",
        record.topic(),
        record.partition(),
        record.offset()
    );
    let mut message_id = None;
    let mut message_type = None;
    let mut biz_key = None;
    let mut headers = Vec::new();
    if let Some(list) = record.headers() {
        for header in list.iter() {
            let value = header
                .value
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default();
            let name = header.key;
            if name == config.message_id_header {
                message_id = Some(value);
            } else if name == config.message_type_header {
                message_type = Some(value);
            } else if name == config.biz_key_header {
                biz_key = Some(value);
            } else {
                headers.push((name.to_owned(), value));
            }
        }
    }
    let key = biz_key.or_else(|| {
        record
            .key()
            .map(|k| String::from_utf8_lossy(k).into_owned())
    });
    let payload = record.payload().unwrap_or_default().to_vec();
    let mut problems = Vec::new();
    let message_id = match message_id.filter(|id| !id.is_empty()) {
        Some(id) => id,
        None if config.derive_message_id => coordinates.clone(),
        None => {
            problems.push(format!("no `{}` header", config.message_id_header));
            coordinates.clone()
        }
    };
    let message_type = message_type.filter(|t| !t.is_empty()).unwrap_or_else(|| {
        problems.push(format!("no `{}` header", config.message_type_header));
        format!("unknown:{coordinates}")
    });
    let biz_key = key.filter(|k| !k.is_empty()).unwrap_or_else(|| {
        problems.push(format!(
            "no `{}` header and no record key",
            config.biz_key_header
        ));
        coordinates.clone()
    });
    if json && serde_json::from_slice::<serde::de::IgnoredAny>(&payload).is_err() {
        problems.push("the value is not JSON (the inbox's payload column is)".into());
    }
    let rejected = (!problems.is_empty()).then(|| {
        format!(
            "record {coordinates} cannot be handled: {}",
            problems.join("; ")
        )
    });
    InboxMessage {
        source: config
            .source
            .clone()
            .unwrap_or_else(|| record.topic().to_owned()),
        message_id,
        message_type,
        biz_key,
        payload,
        headers,
        rejected,
    }
}
