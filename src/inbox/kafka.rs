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
        // A relay's canary (its header marks it) is acknowledged, never stored: it checks
        // the relay's path, and is no business event for a handler.
        let messages: Vec<InboxMessage> = records
            .iter()
            .map(Record::of)
            .filter(|record| !record.is_canary())
            .map(|record| to_message(&record, config, json))
            .collect();
        if !messages.is_empty() {
            ingest.store(&messages, "kafka").await?;
        }
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
        .set(
            "bootstrap.servers",
            // Its own brokers, or the relay's (validated at load: one of them is set).
            config
                .bootstrap_servers
                .as_deref()
                .unwrap_or(&kafka.bootstrap_servers),
        )
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

/// A consumed record as [`to_message`] reads it: the parts of an rdkafka message, so
/// that the conversion is a pure function of plain values (unit tests, the
/// `inbox_kafka_record` fuzz target).
pub(crate) struct Record<'a> {
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    /// `None`: a null key.
    pub(crate) key: Option<&'a [u8]>,
    /// `None`: a null value (a tombstone).
    pub(crate) payload: Option<&'a [u8]>,
    /// In the record's order, repeats included; `None`: a header without a value.
    pub(crate) headers: Vec<(&'a str, Option<&'a [u8]>)>,
}

impl<'a> Record<'a> {
    /// The parts of `record`.
    pub(crate) fn of<M: Message>(record: &'a M) -> Self {
        Record {
            topic: record.topic(),
            partition: record.partition(),
            offset: record.offset(),
            key: record.key(),
            payload: record.payload(),
            headers: record
                .headers()
                .map(|list| list.iter().map(|h| (h.key, h.value)).collect())
                .unwrap_or_default(),
        }
    }

    /// Whether it is a relay's canary (`[canary]`), marked by its header.
    pub(crate) fn is_canary(&self) -> bool {
        (self.headers.iter()).any(|(name, _)| *name == crate::canary::CANARY_HEADER)
    }
}

/// One record as an inbox message (rejected when it lacks what the inbox needs).
pub(crate) fn to_message(
    record: &Record<'_>,
    config: &KafkaIngressConfig,
    json: bool,
) -> InboxMessage {
    let coordinates = format!("{}/{}/{}", record.topic, record.partition, record.offset);
    let mut message_id = None;
    let mut message_type = None;
    let mut biz_key = None;
    let mut headers = Vec::new();
    for (name, value) in &record.headers {
        let value = value
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default();
        let name = *name;
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
    let key = biz_key.or_else(|| record.key.map(|k| String::from_utf8_lossy(k).into_owned()));
    let payload = record.payload.unwrap_or_default().to_vec();
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
    if json && !is_json_text(&payload) {
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
            .unwrap_or_else(|| record.topic.to_owned()),
        message_id,
        message_type,
        biz_key,
        payload,
        headers,
        rejected,
    }
}

/// Whether `payload` is JSON text: UTF-8 (serde_json's `from_slice` checks that only in
/// the strings it keeps, not in those it skips), one JSON value.
fn is_json_text(payload: &[u8]) -> bool {
    std::str::from_utf8(payload)
        .is_ok_and(|text| serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok())
}

#[cfg(test)]
mod tests {
    use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};

    use super::*;

    fn config(source: Option<&str>, derive_message_id: bool) -> KafkaIngressConfig {
        let mut config: KafkaIngressConfig =
            toml::from_str("topics = [\"orders\"]\ngroup_id = \"g\"").unwrap();
        config.source = source.map(str::to_owned);
        config.derive_message_id = derive_message_id;
        config
    }

    fn record(
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        headers: &[(&str, Option<&[u8]>)],
    ) -> OwnedMessage {
        let list = (!headers.is_empty()).then(|| {
            headers
                .iter()
                .fold(OwnedHeaders::new(), |list, (key, value)| {
                    list.insert(Header { key, value: *value })
                })
        });
        OwnedMessage::new(
            payload.map(<[u8]>::to_vec),
            key.map(<[u8]>::to_vec),
            "orders".into(),
            Timestamp::NotAvailable,
            3,
            42,
            list,
        )
    }

    /// The conversion as it was written inline against rdkafka's message before
    /// [`Record`] took the parts out (generic here only so an `OwnedMessage` can be given).
    /// Since then a value that is not UTF-8 is not JSON
    /// (`a_value_that_is_not_utf8_is_not_json`); the values compared are UTF-8.
    fn inline_to_message<M: Message>(
        record: &M,
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

    /// The pure conversion gives what the inline one gave, over records with and without
    /// each header, key and value (null and empty), repeats and non-UTF-8 bytes.
    #[test]
    fn the_pure_conversion_keeps_the_inline_ones_behaviour() {
        let json_value: &[u8] = br#"{"total": 12}"#;
        let keys: [Option<&[u8]>; 4] = [None, Some(b""), Some(b"order-7"), Some(b"k\xff")];
        let payloads: [Option<&[u8]>; 4] = [None, Some(b""), Some(json_value), Some(b"not json")];
        type HeaderSet<'a> = &'a [(&'a str, Option<&'a [u8]>)];
        let header_sets: [HeaderSet; 6] = [
            &[],
            &[
                ("message_id", Some(b"m-1")),
                ("message_type", Some(b"order.created")),
                ("biz_key", Some(b"order-1")),
                ("traceparent", Some(b"00-abc-def-01")),
            ],
            &[
                ("message_id", Some(b"")),
                ("message_type", None),
                ("biz_key", Some(b"")),
            ],
            &[
                ("message_id", Some(b"a")),
                ("message_id", Some(b"b")),
                ("x", None),
                ("x", Some(b"\xfe\xff")),
            ],
            &[("message_type", Some(b"t")), ("Message_Id", Some(b"case"))],
            &[("biz_key", None), ("message_id", Some(b"m\xff"))],
        ];
        let mut compared = 0;
        for source in [None, Some("billing")] {
            for derive in [false, true] {
                let config = config(source, derive);
                for key in keys {
                    for payload in payloads {
                        for headers in header_sets {
                            let message = record(key, payload, headers);
                            for json in [false, true] {
                                assert_eq!(
                                    to_message(&Record::of(&message), &config, json),
                                    inline_to_message(&message, &config, json),
                                    "{key:?} {payload:?} {headers:?} {json}"
                                );
                                compared += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(compared, 4 * 4 * 4 * 6 * 2);
    }

    /// Found by the `inbox_kafka_record` fuzz target: a value that is JSON but for a
    /// byte that is not UTF-8 inside a string (`"\xf6"`) was taken as JSON (serde_json
    /// checks UTF-8 only when it keeps a string, not when it skips one), and the store wrote
    /// it with U+FFFD in place of the byte: a message stored other than received, not
    /// rejected. JSON text is UTF-8, as the HTTP ingress already requires.
    #[test]
    fn a_canary_is_known_by_its_header_not_its_type() {
        let canary: &[(&str, Option<&[u8]>)] = &[
            ("message_type", Some(b"outboxd.canary")),
            (crate::canary::CANARY_HEADER, Some(b"1")),
        ];
        let message = record(Some(b"k"), Some(b"{}"), canary);
        assert!(Record::of(&message).is_canary());
        let typed: &[(&str, Option<&[u8]>)] = &[("message_type", Some(b"outboxd.canary"))];
        let message = record(Some(b"k"), Some(b"{}"), typed);
        assert!(!Record::of(&message).is_canary());
    }

    #[test]
    fn a_value_that_is_not_utf8_is_not_json() {
        let headers: &[(&str, Option<&[u8]>)] = &[("message_type", Some(b"c"))];
        for value in [&b"\"\xf6\""[..], b"{\"a\": \"\xff\xfe\"}", b"[\"\xc3\"]"] {
            let message = record(Some(b"i"), Some(value), headers);
            let got = to_message(&Record::of(&message), &config(Some("s"), true), true);
            let why = got.rejected.expect("rejected");
            assert!(why.contains("the value is not JSON"), "{why}");
            assert_eq!(got.payload, value, "kept as received");
            // A text payload column takes any bytes.
            let text = to_message(&Record::of(&message), &config(Some("s"), true), false);
            assert_eq!(text.rejected, None);
        }
        let message = record(Some(b"i"), Some("\"é\"".as_bytes()), headers);
        let got = to_message(&Record::of(&message), &config(Some("s"), true), true);
        assert_eq!(got.rejected, None);
    }

    #[test]
    fn a_record_becomes_a_message_or_a_rejected_one_with_the_reasons() {
        let headers: &[(&str, Option<&[u8]>)] = &[
            ("message_id", Some(b"m-1")),
            ("message_type", Some(b"order.created")),
            ("traceparent", Some(b"00-abc-def-01")),
        ];
        let message = record(Some(b"order-7"), Some(b"{}"), headers);
        let got = to_message(&Record::of(&message), &config(None, false), true);
        assert_eq!(
            got,
            InboxMessage {
                source: "orders".into(),
                message_id: "m-1".into(),
                message_type: "order.created".into(),
                biz_key: "order-7".into(),
                payload: b"{}".to_vec(),
                headers: vec![("traceparent".into(), "00-abc-def-01".into())],
                rejected: None,
            }
        );
        let bare = record(None, Some(b"nope"), &[]);
        let got = to_message(&Record::of(&bare), &config(Some("s"), false), true);
        assert_eq!(got.message_id, "orders/3/42");
        assert_eq!(got.message_type, "unknown:orders/3/42");
        assert_eq!(got.biz_key, "orders/3/42");
        assert_eq!(got.source, "s");
        assert_eq!(
            got.rejected.as_deref(),
            Some(
                "record orders/3/42 cannot be handled: no `message_id` header; no \
                 `message_type` header; no `biz_key` header and no record key; the value is \
                 not JSON (the inbox's payload column is)"
            )
        );
    }
}
