//! W3C Trace Context of an outbox event: the application writes the `traceparent` (and
//! `tracestate`) of the request that produced the event into the row's `headers`; they
//! travel to Kafka unchanged as record headers (`sink/kafka/headers.rs`), and outboxd's
//! own span for the event ([`event_span`]) carries the trace id, so its log lines about
//! the event can be found from the application's trace.
//!
//! A `traceparent` that is not valid per the W3C recommendation is ignored (no trace id
//! on the span; the header itself still travels as written): it is the application's
//! data, never a reason to fail or to stop.

use outboxd_connector::OutboxEvent;

/// The ids of a valid `traceparent`: `00-<trace-id>-<parent-id>-<flags>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TraceParent<'a> {
    /// 32 lower-case hex digits, not all zero.
    pub(crate) trace_id: &'a str,
    /// The span of the application that wrote the row: 16 lower-case hex digits, not all
    /// zero.
    pub(crate) parent_id: &'a str,
    /// The `sampled` trace flag: the caller may have recorded its span.
    pub(crate) sampled: bool,
}

impl<'a> TraceParent<'a> {
    /// Parses a `traceparent` value as W3C Trace Context level 1 says a receiver must:
    /// version `ff` is invalid; version `00` is exactly 55 characters; a later version
    /// may be longer, with a `-` after the fields this version knows. Lower-case hex
    /// only; an all-zero trace id or parent id is invalid. Surrounding blanks (optional
    /// whitespace in HTTP) are ignored.
    pub(crate) fn parse(value: &'a [u8]) -> Option<Self> {
        let value = std::str::from_utf8(value).ok()?.trim_matches([' ', '\t']);
        let fields = value.get(..55)?;
        let rest = &value[55..];
        let version = fields.get(..2)?;
        if !lower_hex(version) || version == "ff" {
            return None;
        }
        if (version == "00" && !rest.is_empty()) || !(rest.is_empty() || rest.starts_with('-')) {
            return None;
        }
        let mut parts = fields.split('-');
        let (Some(_), Some(trace_id), Some(parent_id), Some(flags), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        let valid = |s: &str, len: usize| s.len() == len && lower_hex(s);
        let zero = |s: &str| s.bytes().all(|b| b == b'0');
        if !valid(trace_id, 32) || zero(trace_id) || !valid(parent_id, 16) || zero(parent_id) {
            return None;
        }
        if !valid(flags, 2) {
            return None;
        }
        let flags = u8::from_str_radix(flags, 16).ok()?;
        Some(Self {
            trace_id,
            parent_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The `traceparent` among `event`'s row headers (the name compared without case, as
    /// HTTP does), when there is one and it is valid.
    pub(crate) fn of(event: &'a OutboxEvent) -> Option<Self> {
        let (_, value) = event
            .headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case("traceparent"))?;
        Self::parse(value)
    }
}

fn lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// outboxd's span for publishing `event`: its `id` and `message_id`, and when the row's
/// headers hold a valid `traceparent`, its `trace_id` and `parent_span_id` (the span of
/// the application that wrote the row), and `trace_sampled = false` when the caller did
/// not sample the trace (the OTLP export then leaves the span out). Log lines inside
/// carry them.
pub(crate) fn event_span(event: &OutboxEvent) -> tracing::Span {
    let span = tracing::info_span!(
        "event",
        id = event.id,
        message_id = %event.message_id,
        trace_id = tracing::field::Empty,
        parent_span_id = tracing::field::Empty,
        trace_sampled = tracing::field::Empty,
    );
    if let Some(parent) = TraceParent::of(event) {
        span.record("trace_id", tracing::field::display(parent.trace_id));
        span.record("parent_span_id", tracing::field::display(parent.parent_id));
        if !parent.sampled {
            span.record("trace_sampled", false);
        }
    }
    span
}

/// The span a sink opens for sending `event` and holds until the outcome: `event`'s
/// span when it has a valid `traceparent` and no event span is open already (the claim
/// worker opens one around its sends; the log relay does not). Untraced events get none:
/// the relay's path pays a look at the headers, no span.
pub(crate) fn send_span(event: &OutboxEvent) -> Option<tracing::Span> {
    TraceParent::of(event)?;
    let inside_one = tracing::Span::current()
        .metadata()
        .is_some_and(|m| m.name() == "event" && m.target() == module_path!());
    (!inside_one).then(|| event_span(event))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn parse(value: &str) -> Option<TraceParent<'_>> {
        TraceParent::parse(value.as_bytes())
    }

    #[test]
    fn a_valid_traceparent() {
        assert_eq!(
            parse(VALID),
            Some(TraceParent {
                trace_id: "4bf92f3577b34da6a3ce929d0e0e4736",
                parent_id: "00f067aa0ba902b7",
                sampled: true,
            })
        );
        let unsampled = parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
        assert!(!unsampled.expect("valid").sampled);
        assert!(parse(&format!(" {VALID}\t")).is_some(), "blanks around");
        // A later version: longer, the known fields first.
        let v1 = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-what-comes-next";
        assert_eq!(
            parse(v1).map(|t| t.trace_id),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert!(parse(&VALID.replacen("00", "cc", 1)).is_some());
    }

    #[test]
    fn invalid_traceparents_are_ignored_never_a_panic() {
        for bad in [
            "",
            "00",
            "garbage",
            &VALID[..54],
            &format!("{VALID}-"), // 00 is exactly 55
            &format!("{VALID}x"),
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // version ff
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero parent id
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", // upper case
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01", // misplaced dash
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\u{e9}",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba9\u{e9}b7-0",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        assert_eq!(TraceParent::parse(&[0xff; 60]), None, "not UTF-8");
        // Every prefix and every one-byte change of a valid value: no panic.
        for i in 0..VALID.len() {
            let _ = parse(&VALID[..i]);
            for b in [b'-', b'0', b'f', b'g', b' ', 0x80] {
                let mut bytes = VALID.as_bytes().to_vec();
                bytes[i] = b;
                let _ = TraceParent::parse(&bytes);
            }
        }
    }

    /// What is logged inside the span of an event with `traceparent`, in JSON as `run
    /// --log-format json` writes it.
    fn logged_inside_span(traceparent: &str) -> String {
        let captured = crate::testing::CapturedLog::default();
        let subscriber = captured.subscriber();
        let mut event = event_with(vec![(
            "traceparent".into(),
            Bytes::from(traceparent.to_owned()),
        )]);
        event.message_id = "msg-1".into();
        tracing::subscriber::with_default(subscriber, || {
            let _entered = event_span(&event).entered();
            tracing::warn!("delivery failed");
        });
        captured.text()
    }

    #[test]
    fn the_events_span_carries_the_trace_id_of_a_valid_traceparent_only() {
        let line = logged_inside_span(VALID);
        let json: serde_json::Value = serde_json::from_str(line.trim()).expect(&line);
        let span = &json["span"];
        assert_eq!(span["name"], "event", "{line}");
        assert_eq!(span["message_id"], "msg-1", "{line}");
        assert_eq!(
            span["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736",
            "{line}"
        );
        assert_eq!(span["parent_span_id"], "00f067aa0ba902b7", "{line}");
        let line = logged_inside_span("00-nope");
        let json: serde_json::Value = serde_json::from_str(line.trim()).expect(&line);
        assert_eq!(json["span"]["message_id"], "msg-1", "{line}");
        assert!(json["span"].get("trace_id").is_none(), "{line}");
    }

    fn event_with(headers: Vec<(String, Bytes)>) -> OutboxEvent {
        OutboxEvent {
            id: 1,
            table: 0,
            message_id: "m".into(),
            message_type: "t".into(),
            biz_key: "k".into(),
            key: Bytes::new(),
            topic: None,
            routing: None,
            payload: Bytes::new(),
            headers,
            created_at: String::new(),
            retry_count: 0,
            max_retry_count: 10,
            commit_time: None,
            rejected: None,
        }
    }

    #[test]
    fn a_sink_opens_the_span_of_a_traced_event_unless_one_is_open() {
        let traced = event_with(vec![("traceparent".into(), Bytes::from(VALID))]);
        let untraced = event_with(vec![("traceparent".into(), Bytes::from("00-x"))]);
        tracing::subscriber::with_default(tracing_subscriber::registry(), || {
            let opened = send_span(&traced).expect("a traced event's span");
            assert_eq!(opened.metadata().map(|m| m.name()), Some("event"));
            assert!(send_span(&untraced).is_none());
            let caller = event_span(&traced);
            caller.in_scope(|| assert!(send_span(&traced).is_none(), "the caller's is open"));
        });
    }

    #[test]
    fn the_events_traceparent_header_is_found_without_case() {
        let mut event = event_with(vec![
            ("tracestate".into(), Bytes::from("a=b")),
            ("TraceParent".into(), Bytes::from(VALID)),
        ]);
        assert_eq!(
            TraceParent::of(&event).map(|t| t.parent_id),
            Some("00f067aa0ba902b7")
        );
        event.headers[1].1 = Bytes::from("00-nope");
        assert_eq!(TraceParent::of(&event), None);
        event.headers.clear();
        assert_eq!(TraceParent::of(&event), None);
    }
}
