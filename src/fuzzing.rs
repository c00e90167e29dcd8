//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`; not an API): the
//! config loader and the inbox's HTTP request handling, fed arbitrary bytes. Errors are
//! ignored; a panic is a bug.

use std::time::{Duration, UNIX_EPOCH};

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::config::Config;
use crate::inbox::http::{to_message, Source};
use crate::webhooks::signature::Secret;

/// The signing secret of the source `signed` (the seeds are signed with it).
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// The clock of [`inbox_http`]: seeds' `webhook-timestamp` is this.
pub const NOW: u64 = 1_700_000_000;

/// `config_loader`: TOML text through what `Config::load` does with a file's text
/// (parse, with errors that must not quote secrets; the inline-secret scan; validation
/// with every bound), minus reading files and the environment.
pub fn config_loader(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(table) = text.parse::<toml::Table>() {
        let _ = crate::secrets::inline_secrets(&table);
    }
    match Config::parse(text) {
        Ok(config) => {
            let _ = config.validate();
            let _ = format!("{config:?}");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

/// `inbox_http`: a request to `POST /v1/inbox/{source}` as the handler sees it, in the
/// form `source\nname: value\n…\n\nbody` (header lines hyper would refuse are dropped).
/// The request becomes the stored message (the signature checked when the source is
/// `signed`, against [`SECRET`] at [`NOW`]), for a text and a JSON payload column alike.
pub fn inbox_http(data: &[u8]) {
    let (head, body) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(at) => (&data[..at], &data[at + 2..]),
        None => (data, &[][..]),
    };
    let mut lines = head.split(|b| *b == b'\n');
    let source = String::from_utf8_lossy(lines.next().unwrap_or_default()).into_owned();
    let mut headers = HeaderMap::new();
    for line in lines {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            headers.append(name, value);
        }
    }
    let _ = Secret::parse(&source);
    let secrets = vec![Secret::parse(SECRET).unwrap_or_else(|e| panic!("{e}"))];
    // `signed` checks signatures, `keyed` is unsigned with a key field, any other name
    // is unsigned on purpose.
    let known = match source.as_str() {
        "signed" => Source {
            secrets: Some(secrets),
            key_path: Some(vec!["data".into(), "order_id".into()]),
        },
        "keyed" => Source {
            secrets: None,
            key_path: Some(vec!["key".into()]),
        },
        _ => Source {
            secrets: None,
            key_path: None,
        },
    };
    let now = UNIX_EPOCH + Duration::from_secs(NOW);
    let tolerance = Duration::from_secs(300);
    for json_body in [false, true] {
        let _ = to_message(
            source.clone(),
            &known,
            &headers,
            body,
            json_body,
            tolerance,
            now,
        );
    }
}

/// The inbox Kafka ingress's settings of [`inbox_kafka_record`] (default header names).
fn kafka_ingress(
    source: bool,
    derive_message_id: bool,
) -> crate::inbox::config::KafkaIngressConfig {
    let mut config: crate::inbox::config::KafkaIngressConfig =
        toml::from_str("topics = [\"orders\"]\ngroup_id = \"outboxd\"")
            .unwrap_or_else(|e| panic!("{e}"));
    config.source = source.then(|| "billing".to_owned());
    config.derive_message_id = derive_message_id;
    config
}

/// `inbox_kafka_record`: a record of topic `orders`, partition 3, offset 42, as the Kafka
/// ingress turns it into the inbox message it stores. The bytes: a flags byte (bit 0 the
/// payload column is JSON, bit 1 `derive_message_id`, bit 2 `source = "billing"`, bit 3
/// a null key, bit 4 a null value), then `key\nname: value\n…\n\nvalue`: the record key,
/// one header a line (the value after `:` and one optional space, raw bytes; a line
/// without `:` is a header without a value; names as lossy UTF-8, rdkafka's are text),
/// and after the first empty line the record value.
///
/// Checked: the message has an id, a type and a key; its payload is the value as
/// received; the three headers it takes its fields from are not among the kept ones;
/// what a JSON column stores is JSON text, and for a message not rejected it is the
/// value itself (the message is not changed on its way in).
pub fn inbox_kafka_record(data: &[u8]) {
    use crate::inbox::kafka::{to_message, Record};

    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let (json, derive, source) = (flags & 1 != 0, flags & 2 != 0, flags & 4 != 0);
    let (head, value) = match rest.windows(2).position(|w| w == b"\n\n") {
        Some(at) => (&rest[..at], &rest[at + 2..]),
        None => (rest, &[][..]),
    };
    let mut lines = head.split(|b| *b == b'\n');
    let key = lines.next().unwrap_or_default();
    let names: Vec<(String, Option<&[u8]>)> = lines
        .map(|line| match line.iter().position(|b| *b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                let value = value.strip_prefix(b" ").unwrap_or(value);
                (
                    String::from_utf8_lossy(&line[..colon]).into_owned(),
                    Some(value),
                )
            }
            None => (String::from_utf8_lossy(line).into_owned(), None),
        })
        .collect();
    let record = Record {
        topic: "orders",
        partition: 3,
        offset: 42,
        key: (flags & 8 == 0).then_some(key),
        payload: (flags & 16 == 0).then_some(value),
        headers: names.iter().map(|(n, v)| (n.as_str(), *v)).collect(),
    };
    let config = kafka_ingress(source, derive);
    let message = to_message(&record, &config, json);

    assert!(!message.message_id.is_empty(), "{message:?}");
    assert!(!message.message_type.is_empty(), "{message:?}");
    assert!(!message.biz_key.is_empty(), "{message:?}");
    assert_eq!(message.source, if source { "billing" } else { "orders" });
    assert_eq!(message.payload, record.payload.unwrap_or_default());
    for (name, _) in &message.headers {
        assert!(
            *name != config.message_id_header
                && *name != config.message_type_header
                && *name != config.biz_key_header,
            "{name} kept as a header: {message:?}"
        );
    }
    let _ = outboxd_connector_kit::inbox::headers_json(&message);
    if json {
        let stored = outboxd_connector_kit::inbox::json_payload(&message);
        assert!(
            serde_json::from_str::<serde::de::IgnoredAny>(&stored).is_ok(),
            "a JSON column would be given {stored:?}"
        );
        if message.rejected.is_none() {
            assert_eq!(
                stored.as_bytes(),
                &message.payload[..],
                "a message taken as JSON is stored other than received"
            );
        }
    }
}

/// `headers_from_json`: text as an outbox row's `headers` column, through
/// `outboxd_connector::headers_from_json` (every engine's row → record headers) and the
/// inbox's `headers` column round trip.
///
/// Checked against serde_json's own reading of the text: headers exactly for a JSON
/// object; their names are its members' (repeats included, in document order; the last
/// of a repeated name is the object's value); a string value is its text, any other the
/// value as JSON.
pub fn headers_from_json(data: &[u8]) {
    use outboxd_connector_kit::inbox::{headers_from_column, headers_json};

    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let headers = outboxd_connector::headers_from_json(text);
    let parsed = serde_json::from_str::<serde_json::Value>(text);
    let object = match &parsed {
        Ok(serde_json::Value::Object(object)) => Some(object),
        _ => None,
    };
    assert_eq!(
        headers.is_some(),
        object.is_some(),
        "headers {headers:?} from {parsed:?}"
    );
    let (Some(headers), Some(object)) = (headers, object) else {
        return;
    };
    let mut last = std::collections::HashMap::new();
    for (name, value) in &headers {
        last.insert(name.as_str(), value);
    }
    assert_eq!(last.len(), object.len(), "{headers:?} from {object:?}");
    for (name, value) in last {
        let expected = match &object[name] {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        assert_eq!(value.as_ref(), expected.as_bytes(), "`{name}`");
    }
    // The inbox stores headers as an object of strings and reads them back with the same
    // function: stored again, they are what they were.
    let column = headers_from_column(Some(text));
    let mut message = outboxd_connector::InboxMessage {
        source: String::new(),
        message_id: String::new(),
        message_type: String::new(),
        biz_key: String::new(),
        payload: Vec::new(),
        headers: column,
        rejected: None,
    };
    let stored = headers_json(&message);
    message.headers = headers_from_column(Some(&stored));
    assert_eq!(headers_json(&message), stored);
}

/// `sql_binder`: text as the inbox SQL handler's statement through
/// `outboxd_connector_kit::inbox::bind_named`, with PostgreSQL's placeholders (`$1`, `$2`…)
/// and MySQL's (`?`) as the engines bind them.
///
/// Checked: both styles agree (the same fields, or the same definite error); each bound
/// name became one placeholder; the bound text has no name left to bind, so binding it
/// again changes nothing.
pub fn sql_binder(data: &[u8]) {
    use outboxd_connector_kit::inbox::bind_named;

    let Ok(statement) = std::str::from_utf8(data) else {
        return;
    };
    let dollar = bind_named(statement, |n| format!("${n}"));
    let question = bind_named(statement, |_| "?".to_owned());
    match (dollar, question) {
        (Ok((dollar, fields)), Ok((question, same))) => {
            assert_eq!(fields, same);
            let marks = |s: &str| s.matches('?').count();
            assert_eq!(marks(&question), marks(statement) + fields.len());
            for bound in [dollar, question] {
                let (again, none) = bind_named(&bound, |_| panic!("a name in {bound:?}"))
                    .unwrap_or_else(|e| panic!("{bound:?} binds to {e}"));
                assert!(none.is_empty());
                assert_eq!(again, bound);
            }
        }
        (Err(dollar), Err(question)) => {
            assert!(!dollar.is_transient());
            assert_eq!(dollar.message(), question.message());
        }
        (dollar, question) => panic!("{dollar:?} but {question:?}"),
    }
}

/// `cloudevents_structured`: an outbox event as the Kafka sink sends it under
/// `kafka.cloudevents.mode = "structured"` (the record's headers and value). The bytes: a
/// flags byte (bit 0 `source = "urn:example:orders"`, else `/outboxd/orders`; bit 1
/// `content_type = "application/protobuf"`, else `application/json`), then
/// `message_id\nmessage_type\nbiz_key\ncreated_at\nheaders\npayload`: text fields as
/// lossy UTF-8 (biz_key is the record key too), `headers` the row's headers column as
/// the connectors read it (JSON object, else none), the payload everything after.
///
/// Checked: the value is JSON text, an object without a repeated member, with the event's
/// attributes and extensions and its data (as stored, or base64) ; the record headers
/// hold outboxd's own and the structured mode's `content-type` once each (a row header
/// never replaces one), and none of the attributes the value holds.
pub fn cloudevents_structured(data: &[u8]) {
    use base64::Engine as _;
    use rdkafka::message::Headers as _;

    use crate::config::{CloudEventsConfig, CloudEventsMode, KafkaConfig};
    use crate::sink::kafka::RecordHeaders;

    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut fields = rest.splitn(6, |b| *b == b'\n');
    let mut text = || String::from_utf8_lossy(fields.next().unwrap_or_default()).into_owned();
    let (message_id, message_type, biz_key, created_at, headers) =
        (text(), text(), text(), text(), text());
    let payload = fields.next().unwrap_or_default();
    let event = outboxd_connector::OutboxEvent {
        id: 1,
        table: 0,
        key: bytes::Bytes::from(biz_key.clone()),
        message_id,
        message_type,
        biz_key,
        topic: None,
        routing: None,
        payload: bytes::Bytes::copy_from_slice(payload),
        headers: outboxd_connector_kit::row::row_headers(Some(&headers), "outbox"),
        created_at,
        retry_count: 0,
        max_retry_count: 10,
        commit_time: None,
        rejected: None,
    };
    let cloudevents = CloudEventsConfig {
        source: (flags & 1 != 0).then(|| "urn:example:orders".to_owned()),
        content_type: if flags & 2 != 0 {
            "application/protobuf"
        } else {
            "application/json"
        }
        .to_owned(),
        mode: CloudEventsMode::Structured,
    };
    let source = cloudevents.source("orders");
    let config_content_type = cloudevents.content_type.clone();
    let kafka = KafkaConfig {
        bootstrap_servers: "127.0.0.1:1".into(),
        topic_template: "{message_type}".into(),
        message_timeout: Duration::from_secs(1),
        options: Default::default(),
        allowed_topics: Vec::new(),
        sasl_password_file: None,
        ssl_key_password_file: None,
        transactional_id: None,
        positions_topic: None,
        cloudevents: Some(cloudevents),
    };
    let sink = RecordHeaders::new(&kafka, "orders");
    let _ = sink.refusal(&event);
    let value = sink.value(&event);
    let record_headers: Vec<(String, Vec<u8>)> = sink
        .build(&event)
        .iter()
        .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
        .collect();

    // The value: JSON text (UTF-8, RFC 8259's grammar), an object, no member twice.
    let text = std::str::from_utf8(&value)
        .unwrap_or_else(|e| panic!("the value is not UTF-8 ({e}): {value:?}"));
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(text) {
        panic!("the value is not JSON ({e}): {text}");
    }
    let MemberNames(mut names) = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("the value is not a JSON object ({e}): {text}"));
    names.sort_unstable();
    let count = names.len();
    names.dedup();
    assert_eq!(names.len(), count, "a member repeated: {text}");

    // Its attributes and data (serde_json's values refuse lone surrogates in `\u` escapes
    // and numbers beyond f64, which RFC 8259's grammar allows: a payload holding one is
    // checked as text above only).
    let row_content_type = event
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
    if let Ok(serde_json::Value::Object(doc)) = serde_json::from_str::<serde_json::Value>(text) {
        let attribute = |name: &str| doc.get(name).and_then(serde_json::Value::as_str);
        assert_eq!(attribute("specversion"), Some("1.0"));
        assert_eq!(attribute("id"), Some(event.message_id.as_str()));
        assert_eq!(attribute("type"), Some(event.message_type.as_str()));
        assert_eq!(attribute("source"), Some(source.as_str()));
        let subject = (!event.biz_key.is_empty()).then_some(event.biz_key.as_str());
        assert_eq!(attribute("subject"), subject);
        let content_type = row_content_type.unwrap_or(config_content_type);
        assert_eq!(attribute("datacontenttype"), Some(content_type.as_str()));
        let time = event.created_at.parse::<jiff::Timestamp>().ok();
        assert_eq!(attribute("time"), time.map(|t| t.to_string()).as_deref());
        let mut extensions = std::collections::HashMap::new();
        for (key, value) in &event.headers {
            if let (Some(name), Ok(value)) = (extension_name(key), std::str::from_utf8(value)) {
                extensions.insert(name, value);
            }
        }
        for (name, value) in extensions {
            assert_eq!(attribute(name), Some(value), "extension `{name}`: {text}");
        }
        match (doc.get("data"), attribute("data_base64")) {
            (Some(data), None) => {
                let stored: serde_json::Value =
                    serde_json::from_slice(payload).expect("data that is not the payload");
                assert_eq!(*data, stored);
                let payload = std::str::from_utf8(payload).expect("JSON data is text");
                let tail = format!(",\"data\":{payload}}}");
                assert!(text.ends_with(&tail), "the data is not as stored: {text}");
            }
            (None, Some(encoded)) => {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .expect("data_base64 is base64");
                assert_eq!(decoded, payload);
            }
            (None, None) => assert!(payload.is_empty(), "the data is missing: {text}"),
            (Some(_), Some(_)) => panic!("data and data_base64: {text}"),
        }
    } else {
        assert!(
            serde_json::from_slice::<serde_json::Value>(payload).is_err(),
            "the value does not read as JSON, the payload does: {text}"
        );
    }

    // The record headers.
    let count = |name: &str| {
        record_headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .count()
    };
    for (name, value) in [
        ("message_id", event.message_id.as_bytes()),
        ("message_type", event.message_type.as_bytes()),
        ("biz_key", event.biz_key.as_bytes()),
        ("created_at", event.created_at.as_bytes()),
        (
            "content-type",
            b"application/cloudevents+json; charset=UTF-8",
        ),
    ] {
        assert_eq!(count(name), 1, "`{name}` in {record_headers:?}");
        assert!(
            record_headers.iter().any(|(k, v)| k == name && v == value),
            "`{name}` in {record_headers:?}"
        );
    }
    for (key, value) in &record_headers {
        let attribute = key
            .get(..3)
            .filter(|p| p.eq_ignore_ascii_case("ce_"))
            .and_then(|_| key.get(3..));
        if let Some(name) = attribute {
            let lower = name.to_ascii_lowercase();
            assert!(
                !RESERVED_ATTRIBUTES.contains(&lower.as_str()),
                "`{key}` would read as an attribute: {record_headers:?}"
            );
        }
        // An extension stays a header only when its value cannot be a JSON string.
        assert!(
            extension_name(key).is_none() || std::str::from_utf8(value).is_err(),
            "extension `{key}` left in the headers: {record_headers:?}"
        );
    }
}

/// A JSON object's member names in document order, repeats included, its values skipped
/// unread (so any number or `\u` escape RFC 8259's grammar allows is taken, as in the
/// stored payload that `data` holds byte for byte).
struct MemberNames(Vec<String>);

impl<'de> serde::Deserialize<'de> for MemberNames {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = MemberNames;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<MemberNames, A::Error> {
                let mut names = Vec::new();
                while let Some((name, serde::de::IgnoredAny)) = map.next_entry()? {
                    names.push(name);
                }
                Ok(MemberNames(names))
            }
        }
        d.deserialize_map(Visitor)
    }
}

/// The extension attribute a row header `ce_<name>` names: lowercase letters and digits,
/// not one of [`RESERVED_ATTRIBUTES`].
fn extension_name(key: &str) -> Option<&str> {
    let name = key.strip_prefix("ce_")?;
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    (valid && !RESERVED_ATTRIBUTES.contains(&name)).then_some(name)
}

/// The CloudEvents attributes the structured mode's value holds itself (the
/// specification's names, as `cloudevents_structured` checks them).
const RESERVED_ATTRIBUTES: [&str; 9] = [
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
