//! The headers of a Kafka record, in this order:
//!
//! 1. outboxd's own: `message_id`, `message_type`, `biz_key`, `created_at`;
//! 2. with `[kafka.cloudevents]`, the CloudEvents attributes of the Kafka protocol binding's
//!    binary content mode: `ce_specversion` (`1.0`), `ce_id` (message id), `ce_source`,
//!    `ce_type` (message type), `ce_time` (`created_at` in RFC 3339, UTC), `ce_subject`
//!    (biz_key), and `content-type`;
//! 3. the row's own `headers`, which may add to these but never replace one: a row header
//!    named like one of 1 or 2 is sent as `row-<name>`. Other `ce_` names (`ce_dataschema`,
//!    extension attributes) pass as they are: that is how a row adds attributes. The one
//!    exception is `content-type`: a row's own sets the event's content type (a `bytea`
//!    outbox may hold JSON in one row and Protobuf in the next), sent once, as
//!    `content-type` (a row's second one, in any case, as `row-<name>`).
//!
//! In the structured content mode (`kafka.cloudevents.mode = "structured"`, see
//! `structured.rs`) the attributes live in the value instead: 2 is only `content-type:
//! application/cloudevents+json; charset=UTF-8`, and of 3, the row's `content-type`
//! (the event's `datacontenttype`) and its extension attributes (`ce_<name>`) go into the
//! value too.
//!
//! `ce_time` is left out when `created_at` is not a time RFC 3339 can say (`infinity`, a
//! year BC) and `ce_subject` when the biz_key is empty (the attributes are optional, and
//! when present must be valid); an event without an id or a type cannot be a CloudEvent
//! and is refused ([`RecordHeaders::refusal`]). `traceparent` and `tracestate` in the
//! row's headers pass unchanged (W3C trace context over Kafka).

use std::borrow::Cow;

use outboxd_connector::OutboxEvent;
use rdkafka::message::{Header, OwnedHeaders};

use super::structured::{self, Attributes};
use crate::config::{CloudEventsMode, KafkaConfig};

/// The headers outboxd writes on every record.
const OWN_HEADERS: [&str; 4] = ["message_id", "message_type", "biz_key", "created_at"];

/// The CloudEvents attributes outboxd writes (`content-type` is handled apart).
const CE_HEADERS: [&str; 6] = [
    "ce_specversion",
    "ce_id",
    "ce_source",
    "ce_type",
    "ce_time",
    "ce_subject",
];

const CONTENT_TYPE: &str = "content-type";

/// How a pipeline's records are headed: outboxd's own headers, and CloudEvents when
/// configured.
#[derive(Clone, Debug, Default)]
pub(crate) struct RecordHeaders {
    cloudevents: Option<CloudEvents>,
}

/// `[kafka.cloudevents]`, resolved for the pipeline.
#[derive(Clone, Debug)]
struct CloudEvents {
    source: String,
    content_type: String,
    mode: CloudEventsMode,
}

impl RecordHeaders {
    pub(crate) fn new(config: &KafkaConfig, pipeline: &str) -> Self {
        Self {
            cloudevents: config.cloudevents.as_ref().map(|ce| CloudEvents {
                source: ce.source(pipeline),
                content_type: ce.content_type.clone(),
                mode: ce.mode,
            }),
        }
    }

    /// Why `event` cannot be sent as configured: with CloudEvents, an empty message id or
    /// type (`ce_id` and `ce_type` must be non-empty). Retrying cannot help.
    pub(crate) fn refusal(&self, event: &OutboxEvent) -> Option<String> {
        self.cloudevents.as_ref()?;
        let empty = if event.message_id.is_empty() {
            "message_id"
        } else if event.message_type.is_empty() {
            "message_type"
        } else {
            return None;
        };
        Some(format!(
            "the row's {empty} is empty: with [kafka.cloudevents] it is the event's ce_{} \
             attribute, which must not be empty; set it on the row, then `outboxd retry`",
            if empty == "message_id" { "id" } else { "type" }
        ))
    }

    /// The record headers of `event`, in the order of the module doc.
    pub(crate) fn build(&self, event: &OutboxEvent) -> OwnedHeaders {
        let pairs = self.pairs(event);
        pairs.iter().fold(
            OwnedHeaders::new_with_capacity(pairs.len()),
            |headers, (key, value)| {
                headers.insert(Header {
                    key: key.as_ref(),
                    value: Some(value.as_ref()),
                })
            },
        )
    }

    /// The record value of `event`: its payload as stored, or in the structured mode the
    /// whole CloudEvent as JSON.
    pub(crate) fn value<'e>(&self, event: &'e OutboxEvent) -> Cow<'e, [u8]> {
        let Some(ce) = self.structured() else {
            return Cow::Borrowed(event.payload.as_ref());
        };
        let time = rfc3339(&event.created_at);
        let attributes = Attributes {
            source: &ce.source,
            time: time.as_deref(),
            content_type: row_content_type(event)
                .map_or(ce.content_type.as_bytes(), |i| event.headers[i].1.as_ref()),
            extensions: event
                .headers
                .iter()
                .filter_map(|(key, value)| structured::extension(key, value))
                .collect(),
        };
        Cow::Owned(structured::envelope(event, &attributes))
    }

    /// The CloudEvents settings when they ask for the structured mode.
    fn structured(&self) -> Option<&CloudEvents> {
        self.cloudevents
            .as_ref()
            .filter(|ce| ce.mode == CloudEventsMode::Structured)
    }

    /// The headers of `event` as `(name, value)`, in record order.
    fn pairs<'e>(&'e self, event: &'e OutboxEvent) -> Vec<(Cow<'e, str>, Cow<'e, [u8]>)> {
        let borrowed = |key: &'e str, value: &'e [u8]| (Cow::Borrowed(key), Cow::Borrowed(value));
        let mut pairs = Vec::with_capacity(11 + event.headers.len());
        pairs.push(borrowed("message_id", event.message_id.as_bytes()));
        pairs.push(borrowed("message_type", event.message_type.as_bytes()));
        pairs.push(borrowed("biz_key", event.biz_key.as_bytes()));
        pairs.push(borrowed("created_at", event.created_at.as_bytes()));
        if self.structured().is_some() {
            // The attributes, the row's content type and its extensions are in the value.
            pairs.push(borrowed(CONTENT_TYPE, structured::CONTENT_TYPE.as_bytes()));
            let row_content_type = row_content_type(event);
            for (i, (key, value)) in event.headers.iter().enumerate() {
                if Some(i) != row_content_type && structured::extension(key, value).is_none() {
                    pairs.push((self.row_header_name(key), Cow::Borrowed(value.as_ref())));
                }
            }
            return pairs;
        }
        let mut row_content_type = None;
        if let Some(ce) = &self.cloudevents {
            pairs.push(borrowed("ce_specversion", b"1.0"));
            pairs.push(borrowed("ce_id", event.message_id.as_bytes()));
            pairs.push(borrowed("ce_source", ce.source.as_bytes()));
            pairs.push(borrowed("ce_type", event.message_type.as_bytes()));
            if let Some(time) = rfc3339(&event.created_at) {
                pairs.push((Cow::Borrowed("ce_time"), Cow::Owned(time.into_bytes())));
            }
            if !event.biz_key.is_empty() {
                pairs.push(borrowed("ce_subject", event.biz_key.as_bytes()));
            }
            row_content_type = self::row_content_type(event);
            let content_type = match row_content_type {
                Some(i) => event.headers[i].1.as_ref(),
                None => ce.content_type.as_bytes(),
            };
            pairs.push(borrowed(CONTENT_TYPE, content_type));
        }
        for (i, (key, value)) in event.headers.iter().enumerate() {
            if Some(i) != row_content_type {
                pairs.push((self.row_header_name(key), Cow::Borrowed(value.as_ref())));
            }
        }
        pairs
    }

    /// The name a row's own header is sent under: as given, unless it is one outboxd
    /// writes (compared without case, as many consumers compare them), which a row must
    /// not be able to replace or shadow; that one is sent as `row-<name>`.
    fn row_header_name<'k>(&self, key: &'k str) -> Cow<'k, str> {
        let ce: &[&str] = match self.cloudevents {
            Some(_) => &CE_HEADERS,
            None => &[],
        };
        // In the structured mode a `ce_` header named like an attribute the value holds
        // would read as one to a binary-mode reader: renamed too.
        let reserved_in_value = self.structured().is_some()
            && key.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("ce_"))
            && key.get(3..).is_some_and(|name| {
                structured::RESERVED
                    .iter()
                    .any(|reserved| reserved.eq_ignore_ascii_case(name))
            });
        // With CloudEvents the record's `content-type` is outboxd's (the row's first one
        // sets it and is not renamed, `pairs` sends it in place): a second must not
        // shadow it.
        let second_content_type =
            self.cloudevents.is_some() && key.eq_ignore_ascii_case(CONTENT_TYPE);
        if reserved_in_value
            || second_content_type
            || OWN_HEADERS
                .iter()
                .chain(ce)
                .any(|own| own.eq_ignore_ascii_case(key))
        {
            Cow::Owned(format!("row-{key}"))
        } else {
            Cow::Borrowed(key)
        }
    }
}

/// Where the row's own `content-type` header is among its headers (compared without case).
fn row_content_type(event: &OutboxEvent) -> Option<usize> {
    event
        .headers
        .iter()
        .position(|(key, _)| key.eq_ignore_ascii_case(CONTENT_TYPE))
}

/// `created_at` (ISO 8601 with an offset, as the engine renders it: PostgreSQL's
/// `2026-05-09T07:30:00.123+00` or `+05:30`, MySQL's `…+00:00`) as RFC 3339 in UTC
/// (`2026-05-09T07:30:00.123Z`); `None` for what RFC 3339 cannot say.
fn rfc3339(created_at: &str) -> Option<String> {
    let time: jiff::Timestamp = created_at.parse().ok()?;
    Some(time.to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use bytes::Bytes;
    use rdkafka::message::Headers;

    use super::*;
    use crate::config::CloudEventsConfig;

    fn kafka(cloudevents: Option<CloudEventsConfig>) -> KafkaConfig {
        KafkaConfig {
            bootstrap_servers: "127.0.0.1:1".into(),
            topic_template: "t".into(),
            message_timeout: Duration::from_secs(1),
            options: BTreeMap::new(),
            allowed_topics: Vec::new(),
            sasl_password_file: None,
            ssl_key_password_file: None,
            transactional_id: None,
            positions_topic: None,
            cloudevents,
        }
    }

    fn event(headers: &[(&str, &str)]) -> OutboxEvent {
        OutboxEvent {
            id: 7,
            table: 0,
            message_id: "6c1f0b8e-0001".into(),
            message_type: "order.created".into(),
            biz_key: "order-42".into(),
            key: Bytes::from("order-42"),
            topic: None,
            routing: None,
            payload: Bytes::from(r#"{"total":12}"#),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Bytes::from((*v).to_owned())))
                .collect(),
            created_at: "2026-05-09T07:30:00.123+00".into(),
            retry_count: 0,
            max_retry_count: 10,
            commit_time: None,
            rejected: None,
        }
    }

    /// Every header as `(name, value)`, in record order.
    fn pairs(headers: &OwnedHeaders) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|h| {
                let value = String::from_utf8_lossy(h.value.unwrap_or_default());
                (h.key.to_owned(), value.into_owned())
            })
            .collect()
    }

    fn names(pairs: &[(String, String)]) -> Vec<&str> {
        pairs.iter().map(|(k, _)| k.as_str()).collect()
    }

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_row_header_cannot_replace_one_outboxd_writes() {
        let plain = RecordHeaders::default();
        assert_eq!(plain.row_header_name("trace_id"), "trace_id");
        assert_eq!(plain.row_header_name("message_id"), "row-message_id");
        assert_eq!(plain.row_header_name("Biz_Key"), "row-Biz_Key");
        assert_eq!(
            plain.row_header_name("created_at_local"),
            "created_at_local"
        );
        // Without CloudEvents, ce_ names are the row's to use.
        assert_eq!(plain.row_header_name("ce_type"), "ce_type");
        let ce = RecordHeaders::new(&kafka(Some(CloudEventsConfig::default())), "orders");
        assert_eq!(ce.row_header_name("ce_type"), "row-ce_type");
        assert_eq!(ce.row_header_name("CE_Source"), "row-CE_Source");
        assert_eq!(ce.row_header_name("ce_dataschema"), "ce_dataschema");
        assert_eq!(ce.row_header_name("ce_tenant"), "ce_tenant");
    }

    #[test]
    fn without_cloudevents_a_record_has_outboxd_headers_then_the_rows() {
        let headers = RecordHeaders::new(&kafka(None), "orders").build(&event(&[
            ("traceparent", TRACEPARENT),
            ("tracestate", "vendor=a,other=b"),
            ("content-type", "application/avro"),
        ]));
        assert_eq!(
            pairs(&headers),
            [
                ("message_id", "6c1f0b8e-0001"),
                ("message_type", "order.created"),
                ("biz_key", "order-42"),
                ("created_at", "2026-05-09T07:30:00.123+00"),
                ("traceparent", TRACEPARENT),
                ("tracestate", "vendor=a,other=b"),
                ("content-type", "application/avro"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
    }

    #[test]
    fn cloudevents_binary_mode_headers() {
        let config = CloudEventsConfig::default();
        let headers = RecordHeaders::new(&kafka(Some(config)), "orders").build(&event(&[
            ("traceparent", TRACEPARENT),
            ("tracestate", "vendor=a"),
            ("ce_type", "forged"),
            ("ce_dataschema", "https://example.com/order.json"),
        ]));
        assert_eq!(
            pairs(&headers),
            [
                ("message_id", "6c1f0b8e-0001"),
                ("message_type", "order.created"),
                ("biz_key", "order-42"),
                ("created_at", "2026-05-09T07:30:00.123+00"),
                ("ce_specversion", "1.0"),
                ("ce_id", "6c1f0b8e-0001"),
                ("ce_source", "/outboxd/orders"),
                ("ce_type", "order.created"),
                ("ce_time", "2026-05-09T07:30:00.123Z"),
                ("ce_subject", "order-42"),
                ("content-type", "application/json"),
                ("traceparent", TRACEPARENT),
                ("tracestate", "vendor=a"),
                ("row-ce_type", "forged"),
                ("ce_dataschema", "https://example.com/order.json"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
    }

    #[test]
    fn cloudevents_structured_mode_moves_the_attributes_into_the_value() {
        let config = CloudEventsConfig {
            mode: CloudEventsMode::Structured,
            ..CloudEventsConfig::default()
        };
        let ce = RecordHeaders::new(&kafka(Some(config)), "orders");
        let e = event(&[
            ("traceparent", TRACEPARENT),
            ("ce_tenant", "acme"),
            ("ce_type", "forged"),
            ("CE_DataContentType", "forged/too"),
            ("Content-Type", "application/vnd.orders+json"),
        ]);
        assert_eq!(
            pairs(&ce.build(&e)),
            [
                ("message_id", "6c1f0b8e-0001"),
                ("message_type", "order.created"),
                ("biz_key", "order-42"),
                ("created_at", "2026-05-09T07:30:00.123+00"),
                (
                    "content-type",
                    "application/cloudevents+json; charset=UTF-8"
                ),
                ("traceparent", TRACEPARENT),
                ("row-ce_type", "forged"),
                ("row-CE_DataContentType", "forged/too"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        let value: serde_json::Value = serde_json::from_slice(&ce.value(&e)).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "specversion": "1.0", "id": "6c1f0b8e-0001", "source": "/outboxd/orders",
                "type": "order.created", "subject": "order-42",
                "time": "2026-05-09T07:30:00.123Z",
                "datacontenttype": "application/vnd.orders+json", "tenant": "acme",
                "data": {"total": 12}
            })
        );
        // The binary mode and no CloudEvents leave the value as stored.
        for headers in [
            RecordHeaders::new(&kafka(Some(CloudEventsConfig::default())), "orders"),
            RecordHeaders::default(),
        ] {
            assert_eq!(headers.value(&e).as_ref(), br#"{"total":12}"#);
        }
    }

    #[test]
    fn the_configured_source_and_content_type_and_a_rows_content_type() {
        let config = CloudEventsConfig {
            source: Some("urn:example:orders".into()),
            content_type: "application/protobuf".into(),
            ..CloudEventsConfig::default()
        };
        let ce = RecordHeaders::new(&kafka(Some(config)), "orders");
        let plain = pairs(&ce.build(&event(&[])));
        assert!(plain.contains(&("ce_source".into(), "urn:example:orders".into())));
        assert!(plain.contains(&("content-type".into(), "application/protobuf".into())));
        // The row's own content type wins, sent once under the binding's name.
        let own = pairs(&ce.build(&event(&[("seq", "1"), ("Content-Type", "text/plain")])));
        let types: Vec<_> = own
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            .collect();
        assert_eq!(
            types,
            [&("content-type".to_owned(), "text/plain".to_owned())]
        );
        assert_eq!(names(&own).last(), Some(&"seq"));
    }

    /// Found by the `cloudevents_structured` fuzz target: a row with a second
    /// `content-type` header (`{"Content-Type":"","Content-Type":""}`, or `Content-Type`
    /// and `content-type`, two names to jsonb) sent it beside outboxd's, so the record had
    /// two; in the structured mode a reader that takes the last (Java's `lastHeader`) saw
    /// the row's instead of `application/cloudevents+json` and read the record in the
    /// binary mode. The row's first sets the event's content type, as before; the others
    /// are sent as `row-<name>`, like any row header named like one outboxd writes.
    #[test]
    fn a_rows_second_content_type_does_not_shadow_the_records() {
        let row = [
            ("Content-Type", "text/plain"),
            ("seq", "1"),
            ("content-type", "application/xml"),
        ];
        let structured = CloudEventsConfig {
            mode: CloudEventsMode::Structured,
            ..CloudEventsConfig::default()
        };
        for (config, expected) in [
            (CloudEventsConfig::default(), "text/plain"),
            (structured, structured::CONTENT_TYPE),
        ] {
            let ce = RecordHeaders::new(&kafka(Some(config)), "orders");
            let got = pairs(&ce.build(&event(&row)));
            let types: Vec<_> = (got.iter())
                .filter(|(k, _)| k.eq_ignore_ascii_case(CONTENT_TYPE))
                .collect();
            assert_eq!(types, [&(CONTENT_TYPE.to_owned(), expected.to_owned())]);
            assert!(
                got.contains(&("row-content-type".into(), "application/xml".into())),
                "{got:?}"
            );
        }
        // Without CloudEvents outboxd writes no content type: the row's pass as they are.
        let got = pairs(&RecordHeaders::default().build(&event(&row)));
        assert_eq!(&names(&got)[4..], ["Content-Type", "seq", "content-type"]);
    }

    #[test]
    fn optional_attributes_are_left_out_rather_than_invalid() {
        let ce = RecordHeaders::new(&kafka(Some(CloudEventsConfig::default())), "p");
        let mut e = event(&[]);
        e.created_at = "infinity".into();
        e.biz_key = String::new();
        let got = pairs(&ce.build(&e));
        assert!(!names(&got).contains(&"ce_time"), "{got:?}");
        assert!(!names(&got).contains(&"ce_subject"), "{got:?}");
        assert!(ce.refusal(&e).is_none());
        e.message_type = String::new();
        let why = ce.refusal(&e).expect("refused");
        assert!(
            why.contains("message_type") && why.contains("ce_type"),
            "{why}"
        );
        e.message_id = String::new();
        assert!(ce.refusal(&e).expect("refused").contains("ce_id"));
        // Without CloudEvents nothing is refused here.
        assert!(RecordHeaders::default().refusal(&e).is_none());
    }

    #[test]
    fn created_at_as_rfc3339_from_every_engine() {
        for (created_at, expected) in [
            // PostgreSQL, session time zone UTC (what outboxd's connections set).
            (
                "2026-05-09T07:30:00.123+00",
                Some("2026-05-09T07:30:00.123Z"),
            ),
            ("2026-05-09T07:30:00+00", Some("2026-05-09T07:30:00Z")),
            // PostgreSQL under another time zone.
            (
                "2026-05-09T09:00:00.5+05:30",
                Some("2026-05-09T03:30:00.5Z"),
            ),
            // MySQL/MariaDB.
            (
                "2026-05-09T07:30:00.123456+00:00",
                Some("2026-05-09T07:30:00.123456Z"),
            ),
            ("infinity", None),
            ("-infinity", None),
            ("0044-03-15T12:00:00+00 BC", None),
            ("", None),
        ] {
            assert_eq!(rfc3339(created_at).as_deref(), expected, "{created_at}");
        }
    }
}
