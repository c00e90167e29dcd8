//! The CloudEvents structured content mode (`kafka.cloudevents.mode = "structured"`): the
//! whole event as one JSON document in the record value (the JSON event format, content
//! type `application/cloudevents+json`), for consumers that read events that way (Knative
//! and other CloudEvents SDKs' structured readers, brokers that route on the body).
//!
//! ```json
//! {"specversion":"1.0","id":"…","source":"/outboxd/orders","type":"order.created",
//!  "subject":"order-42","time":"2026-05-09T07:30:00.123Z",
//!  "datacontenttype":"application/json","tenant":"acme","data":{"total":12}}
//! ```
//!
//! The payload is never re-encoded: JSON content (`application/json`, `text/json`, any
//! `+json` type) that parses as JSON is written into `data` byte for byte; anything else
//! (Avro, Protobuf, text, JSON that does not parse or is not UTF-8) goes into
//! `data_base64`, which any reader decodes to the stored bytes. An empty payload is an
//! event without data.
//! Extension attributes come from the row's headers named `ce_<name>` (`name` in lowercase
//! letters and digits, as the specification requires): `ce_tenant` becomes `"tenant"`
//! (a repeated one, once with its last value).
//!
//! The document is written here rather than through a `Serialize` type so that `data` can
//! be the stored bytes themselves (serde_json would need its `raw_value` feature and a copy
//! into a `RawValue` for the same result).

use std::collections::HashSet;

use base64::Engine as _;
use outboxd_connector::OutboxEvent;

/// The record's `content-type` in structured mode.
pub(super) const CONTENT_TYPE: &str = "application/cloudevents+json; charset=UTF-8";

/// Attribute names the envelope writes itself (or that would change what a reader takes
/// as the data): a row header `ce_<one of these>` is not an extension, and is sent as
/// `row-ce_<name>` like any header named like one outboxd writes.
pub(super) const RESERVED: [&str; 9] = [
    "specversion",
    "id",
    "source",
    "type",
    "time",
    "subject",
    "datacontenttype",
    "data",
    "data_base64",
];

/// The attributes of one event, already resolved by the caller.
pub(super) struct Attributes<'a> {
    pub source: &'a str,
    /// `ce_time`: `created_at` in RFC 3339, if it can be said.
    pub time: Option<&'a str>,
    /// The row's `content-type` header, else `kafka.cloudevents.content_type`.
    pub content_type: &'a [u8],
    /// `(name, value)` of the row's extension attributes, in the row's order (a repeated
    /// name: the last value is written).
    pub extensions: Vec<(&'a str, &'a str)>,
}

/// The extension attribute a row header carries: `ce_tenant` → `tenant`. `None` for
/// every other header (kept as a record header), including `ce_` names the
/// specification does not allow (`ce_Tenant`, `ce_tenant-id`), reserved ones, and values
/// that are not UTF-8.
pub(super) fn extension<'a>(key: &'a str, value: &'a [u8]) -> Option<(&'a str, &'a str)> {
    let name = key.strip_prefix("ce_")?;
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !valid || RESERVED.contains(&name) {
        return None;
    }
    Some((name, std::str::from_utf8(value).ok()?))
}

/// The record value of `event` in the JSON event format.
pub(super) fn envelope(event: &OutboxEvent, attributes: &Attributes<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(event.payload.len() + 256);
    out.push(b'{');
    member(&mut out, "specversion", "1.0");
    member(&mut out, "id", &event.message_id);
    member(&mut out, "source", attributes.source);
    member(&mut out, "type", &event.message_type);
    if !event.biz_key.is_empty() {
        member(&mut out, "subject", &event.biz_key);
    }
    if let Some(time) = attributes.time {
        member(&mut out, "time", time);
    }
    let content_type = String::from_utf8_lossy(attributes.content_type);
    member(&mut out, "datacontenttype", &content_type);
    // A name the row repeats is written once, with its last value, as jsonb, MySQL's JSON
    // and serde_json read a repeated name of the row's `headers`; a member written twice
    // would be read as either value, depending on the reader (RFC 8259).
    let mut seen = HashSet::new();
    let last: Vec<_> = (attributes.extensions.iter().rev())
        .filter(|(name, _)| seen.insert(*name))
        .collect();
    for (name, value) in last.into_iter().rev() {
        member(&mut out, name, value);
    }
    let payload = event.payload.as_ref();
    if !payload.is_empty() {
        if is_json(&content_type) && parses_as_json(payload) {
            out.extend_from_slice(b",\"data\":");
            out.extend_from_slice(payload);
        } else {
            let encoded = base64::engine::general_purpose::STANDARD.encode(payload);
            member(&mut out, "data_base64", &encoded);
        }
    }
    out.push(b'}');
    out
}

/// `,"name":"value"` (no comma before the first), the value escaped as JSON.
fn member(out: &mut Vec<u8>, name: &str, value: &str) {
    if out.len() > 1 {
        out.push(b',');
    }
    // Writing JSON strings into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, name);
    out.push(b':');
    let _ = serde_json::to_writer(&mut *out, value);
}

/// Whether a media type says JSON: `application/json`, `text/json`, `…+json`, with or
/// without parameters, in any case.
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence == "text/json" || essence.ends_with("+json")
}

/// Whether `payload` is JSON text: UTF-8 (serde_json's `from_slice` checks that only in
/// the strings it keeps, not in those it skips), one JSON value (whitespace around it
/// allowed).
fn parses_as_json(payload: &[u8]) -> bool {
    std::str::from_utf8(payload)
        .is_ok_and(|text| serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use serde_json::{json, Value};

    use super::*;

    fn event(payload: &[u8]) -> OutboxEvent {
        OutboxEvent {
            id: 1,
            table: 0,
            message_id: "m-\"1\"".into(),
            message_type: "order.created".into(),
            biz_key: "order-42".into(),
            key: Bytes::from("order-42"),
            topic: None,
            routing: None,
            payload: Bytes::copy_from_slice(payload),
            headers: Vec::new(),
            created_at: String::new(),
            retry_count: 0,
            max_retry_count: 10,
            commit_time: None,
            rejected: None,
        }
    }

    fn attributes<'a>(content_type: &'a str, extensions: &[(&'a str, &'a str)]) -> Attributes<'a> {
        Attributes {
            source: "/outboxd/orders",
            time: Some("2026-05-09T07:30:00.123Z"),
            content_type: content_type.as_bytes(),
            extensions: extensions.to_vec(),
        }
    }

    fn parsed(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).expect("the envelope is JSON")
    }

    #[test]
    fn json_data_is_embedded_as_stored() {
        let stored = br#"{"total": 12, "items": [1,2]}"#;
        let out = envelope(
            &event(stored),
            &attributes("application/json", &[("tenant", "acme")]),
        );
        assert_eq!(
            parsed(&out),
            json!({
                "specversion": "1.0", "id": "m-\"1\"", "source": "/outboxd/orders",
                "type": "order.created", "subject": "order-42",
                "time": "2026-05-09T07:30:00.123Z", "datacontenttype": "application/json",
                "tenant": "acme", "data": {"total": 12, "items": [1, 2]}
            })
        );
        // Byte for byte: the payload's own spacing is still there.
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.ends_with(r#","data":{"total": 12, "items": [1,2]}}"#),
            "{text}"
        );
    }

    #[test]
    fn other_content_and_unparsable_json_travel_as_base64() {
        for (content_type, payload) in [
            ("application/protobuf", &b"\x08\x96\x01"[..]),
            ("text/plain", b"hello"),
            ("application/json", b"{not json"),
        ] {
            let value = parsed(&envelope(&event(payload), &attributes(content_type, &[])));
            assert!(value.get("data").is_none(), "{value}");
            let encoded = value["data_base64"].as_str().expect("data_base64");
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .unwrap();
            assert_eq!(decoded, payload, "{content_type}");
            assert_eq!(value["datacontenttype"], content_type);
        }
        // A JSON type with parameters, or a +json suffix, is JSON.
        for content_type in [
            "application/json; charset=utf-8",
            "application/vnd.orders+JSON",
        ] {
            let value = parsed(&envelope(&event(b"[1]"), &attributes(content_type, &[])));
            assert_eq!(value["data"], json!([1]), "{content_type}");
        }
    }

    /// Found by the `cloudevents_structured` fuzz target: a JSON payload with a byte that
    /// is not UTF-8 inside a string (`{"\xff":2}`) passed as JSON (serde_json checks UTF-8
    /// only in strings it keeps) and was embedded as `data`, making the record value
    /// something no JSON reader takes. It is not JSON text: it travels as `data_base64`.
    #[test]
    fn json_content_that_is_not_utf8_travels_as_base64() {
        for payload in [&b"{\"\xff\":2}"[..], b"\"\xc3\"", b"[\"a\xed\xa0\x80\"]"] {
            let out = envelope(&event(payload), &attributes("application/json", &[]));
            let text = std::str::from_utf8(&out).expect("the envelope is UTF-8");
            let value: Value = serde_json::from_str(text).expect("the envelope is JSON");
            assert!(value.get("data").is_none(), "{value}");
            let encoded = value["data_base64"].as_str().expect("data_base64");
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .unwrap();
            assert_eq!(decoded, payload);
        }
    }

    /// Found by the `cloudevents_structured` fuzz target: a row whose `headers` repeat an
    /// extension (`{"ce_region8":"","ce_region8":""}`, which a `json` or text column
    /// keeps) gave the document that member twice, which RFC 8259 leaves to each reader.
    /// It is written once, with the last value, as jsonb, MySQL's JSON and serde_json read
    /// a repeated name.
    #[test]
    fn a_repeated_extension_is_one_member_with_the_last_value() {
        let a = attributes(
            "application/json",
            &[("tenant", "a"), ("region", "eu"), ("tenant", "b")],
        );
        let out = String::from_utf8(envelope(&event(b"{}"), &a)).unwrap();
        assert_eq!(out.matches("\"tenant\"").count(), 1, "{out}");
        let value = parsed(out.as_bytes());
        assert_eq!(value["tenant"], "b");
        assert_eq!(value["region"], "eu");
    }

    #[test]
    fn optional_attributes_and_data_are_left_out() {
        let mut e = event(b"");
        e.biz_key = String::new();
        let mut a = attributes("application/json", &[]);
        a.time = None;
        let value = parsed(&envelope(&e, &a));
        for absent in ["subject", "time", "data", "data_base64"] {
            assert!(value.get(absent).is_none(), "{absent}: {value}");
        }
    }

    #[test]
    fn only_valid_unreserved_ce_names_are_extensions() {
        assert_eq!(extension("ce_tenant", b"acme"), Some(("tenant", "acme")));
        assert_eq!(extension("ce_region2", b"eu"), Some(("region2", "eu")));
        for key in [
            "tenant",
            "ce_",
            "ce_Tenant",
            "ce_tenant-id",
            "CE_tenant",
            "ce_type",
        ] {
            assert_eq!(extension(key, b"x"), None, "{key}");
        }
        assert_eq!(extension("ce_data_base64", b"x"), None);
        assert_eq!(extension("ce_tenant", b"\xff"), None, "not UTF-8");
    }
}
