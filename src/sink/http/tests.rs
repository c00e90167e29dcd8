//! The HTTP sink against a real HTTP server on loopback (axum, started by each test; the
//! server is shared with the sink conformance suite: `sink/conformance/loopback.rs`): the
//! requests it makes, how it reads the answers, per-key order and the circuit breaker.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::sink::conformance::loopback::{closed_url, header, start, Server};
use crate::testing::event;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const NEXT_SECRET: &str = "whsec_b2xkLXNlY3JldC1vbGQtc2VjcmV0LWFiY2Q=";

fn sink_to(url: &str, body: &str, tweak: impl FnOnce(&mut HttpSinkConfig)) -> HttpSink {
    let text = format!(
        "endpoint_template = \"default\"\ntimeout = \"2s\"\nbody = \"{body}\"\n\
         forward_headers = [\"x-tenant\"]\n\
         [endpoints.default]\nurl = \"{url}\"\nsecrets = [\"{SECRET}\", \"{NEXT_SECRET}\"]\n"
    );
    let mut config: HttpSinkConfig = toml::from_str(&text).unwrap();
    tweak(&mut config);
    config.validate().unwrap();
    HttpSink::new(&config, "orders", true, &["outbox".into()]).unwrap()
}

/// A Standard Webhooks message the reference library verifies with either secret, with
/// the row's identity, trace context and listed headers, and none it must not carry.
#[tokio::test]
async fn each_event_is_a_standard_webhooks_message_the_reference_library_verifies() {
    let server = Arc::new(Server::default());
    let url = start(&server).await;
    let sink = sink_to(&url, "payload", |_| {});
    let mut sent = event(7, "order-1");
    sent.payload = Bytes::from_static(br#"{"amount": 12.5}"#);
    sent.headers = vec![
        (
            "traceparent".into(),
            Bytes::from_static(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        ),
        ("x-tenant".into(), Bytes::from_static(b"acme")),
        ("authorization".into(), Bytes::from_static(b"Bearer stolen")),
        ("x-other".into(), Bytes::from_static(b"not listed")),
    ];
    let receipt = sink.send(&sent).await.await.expect("delivered");
    assert_eq!(
        receipt.partition, 200,
        "the status is the receipt's partition"
    );

    let requests = server.requests.lock().unwrap();
    let (headers, body) = &requests[0];
    assert_eq!(body.as_ref(), br#"{"amount": 12.5}"#);
    for secret in [SECRET, NEXT_SECRET] {
        let reference = standardwebhooks::Webhook::new(secret).unwrap();
        reference
            .verify(body, headers)
            .expect("the reference library verifies it");
    }
    assert_eq!(header(headers, "webhook-id"), "m-7");
    assert_eq!(header(headers, "idempotency-key"), "m-7");
    assert_eq!(header(headers, "message-type"), "test.event");
    assert_eq!(header(headers, "biz-key"), "order-1");
    assert_eq!(header(headers, "content-type"), "application/json");
    assert_eq!(header(headers, "x-tenant"), "acme");
    assert!(header(headers, "traceparent").starts_with("00-0af7"));
    assert!(
        headers.get("authorization").is_none(),
        "credentials never forwarded"
    );
    assert!(headers.get("x-other").is_none(), "only listed headers");
    assert_eq!(header(headers, "webhook-signature").split(' ').count(), 2);
}

/// The envelope carries the type and key a receiver dispatches on (outboxd's inbox).
#[tokio::test]
async fn the_envelope_carries_type_timestamp_key_and_data() {
    let server = Arc::new(Server::default());
    let url = start(&server).await;
    let sink = sink_to(&url, "envelope", |_| {});
    let mut json = event(1, "k1");
    json.payload = Bytes::from_static(br#"{"a": 1}"#);
    let mut binary = event(2, "k2");
    binary.payload = Bytes::from_static(b"\x00\xff");
    sink.send(&json).await.await.unwrap();
    sink.send(&binary).await.await.unwrap();
    let requests = server.requests.lock().unwrap();
    let parsed =
        |i: usize| -> serde_json::Value { serde_json::from_slice(&requests[i].1).unwrap() };
    assert_eq!(
        parsed(0),
        serde_json::json!({"type": "test.event", "timestamp": "2026-01-01T00:00:00Z", "key": "k1", "data": {"a": 1}})
    );
    assert_eq!(parsed(1)["data_base64"], "AP8=");
}

/// 2xx → delivered; 5xx, 429, no connection → retried; other 4xx and redirects → refused,
/// with the status and the start of the answer in the error.
#[tokio::test]
async fn answers_decide_the_rows_outcome() {
    let server = Arc::new(Server::default());
    let url = start(&server).await;
    let sink = sink_to(&url, "payload", |_| {});
    for (status, expected) in [
        (201, None),
        (503, Some(FailureKind::Retryable)),
        (429, Some(FailureKind::Retryable)),
        (400, Some(FailureKind::Refused)),
        (410, Some(FailureKind::Refused)),
        (302, Some(FailureKind::Refused)),
    ] {
        server.status.store(status, AtomicOrdering::SeqCst);
        let result = sink
            .send(&event(i64::from(status), &format!("k{status}")))
            .await
            .await;
        match (result, expected) {
            (Ok(receipt), None) => assert_eq!(receipt.partition, i32::from(status)),
            (Err(failure), Some(kind)) => {
                assert_eq!(failure.kind, kind, "{status}: {}", failure.error);
                assert!(
                    failure.error.contains(&status.to_string()),
                    "{}",
                    failure.error
                );
                assert!(
                    failure.error.contains("answer"),
                    "the body's start: {}",
                    failure.error
                );
                assert!(
                    !failure.error.contains("/hooks/orders"),
                    "no path: {}",
                    failure.error
                );
            }
            (other, _) => panic!("{status}: {other:?}"),
        }
    }
    // Nothing listens: retried.
    let nowhere = sink_to(&closed_url(), "payload", |_| {});
    let failure = nowhere.send(&event(1, "k")).await.await.unwrap_err();
    assert_eq!(failure.kind, FailureKind::Retryable, "{}", failure.error);
}

/// A key's requests go one at a time, in send order; other keys in parallel. Under strict
/// ordering, after one of a key fails, its later ones are not sent.
#[tokio::test]
async fn a_key_has_one_request_at_a_time_and_a_failure_stops_the_keys_later_ones() {
    let server = Arc::new(Server::default());
    let url = start(&server).await;
    server.delay_ms.store(20, AtomicOrdering::SeqCst);
    server.failing.lock().unwrap().push("m-12".into());
    let sink = sink_to(&url, "payload", |_| {});
    let mut deliveries = Vec::new();
    for round in 0..4 {
        for key in 0..3 {
            let id = 10 * (key + 1) + round;
            deliveries.push((id, sink.send(&event(id, &format!("k{key}"))).await));
        }
    }
    let mut outcomes = BTreeMap::new();
    for (id, delivery) in deliveries {
        outcomes.insert(id, delivery.await);
    }
    assert_eq!(
        server.most_per_key.load(AtomicOrdering::SeqCst),
        1,
        "one request per key at a time"
    );
    assert!(
        server.most_at_once.load(AtomicOrdering::SeqCst) > 1,
        "keys in parallel"
    );
    let arrived: Vec<String> = (server.requests.lock().unwrap().iter())
        .map(|(h, _)| header(h, "webhook-id"))
        .collect();
    for key in 0..3 {
        let own: Vec<&String> = arrived
            .iter()
            .filter(|id| id[2..].parse::<i64>().unwrap() / 10 == key + 1)
            .collect();
        let mut sorted = own.clone();
        sorted.sort();
        assert_eq!(own, sorted, "key k{key} in send order");
    }
    // Key k0: m-12 failed (500), so m-13 was never sent.
    assert_eq!(
        outcomes[&12].as_ref().unwrap_err().kind,
        FailureKind::Retryable
    );
    let later = outcomes[&13].as_ref().unwrap_err();
    assert!(
        later.error.contains("earlier event of its key"),
        "{}",
        later.error
    );
    assert!(
        !arrived.contains(&"m-13".to_owned()),
        "not sent after its key's failure"
    );
    for id in [10, 11, 20, 21, 22, 23, 30, 31, 32, 33] {
        assert!(outcomes[&id].is_ok(), "m-{id}: {:?}", outcomes[&id]);
    }
    assert_eq!(sink.queue_depth(), 0);
}

/// An endpoint that keeps failing is taken for down after `open_after` failures: later
/// requests wait (they do not fail), one probe at a time asks it, and once it answers
/// the waiting requests go.
#[tokio::test]
async fn an_endpoint_that_is_down_holds_its_requests_until_it_answers() {
    let server = Arc::new(Server::default());
    let url = start(&server).await;
    server.status.store(503, AtomicOrdering::SeqCst);
    let sink = sink_to(&url, "payload", |config| {
        config.endpoints.get_mut("default").unwrap().open_after = 2;
    });
    for id in 1..=2 {
        let failure = sink
            .send(&event(id, &format!("k{id}")))
            .await
            .await
            .unwrap_err();
        assert_eq!(failure.kind, FailureKind::Retryable);
    }
    // Down now: these wait instead of failing.
    let mut waiting = Vec::new();
    for id in 3..=6 {
        waiting.push(Box::pin(sink.send(&event(id, &format!("k{id}"))).await));
    }
    let early = tokio::time::timeout(Duration::from_millis(300), &mut waiting[0]).await;
    assert!(
        early.is_err(),
        "a request to an endpoint taken for down waits"
    );
    let seen_while_down = server.requests.lock().unwrap().len();
    assert!(
        seen_while_down <= 3,
        "at most a probe reached it: {seen_while_down}"
    );
    let series = scrape(&sink);
    assert!(has(
        &series,
        "outboxd_http_endpoint_up{endpoint=\"default\"} 0"
    ));
    assert!(has(
        &series,
        "outboxd_http_requests_total{endpoint=\"default\",class=\"2xx\"} 0"
    ));
    // It answers again: the probe succeeds and every waiting request goes.
    server.status.store(200, AtomicOrdering::SeqCst);
    for delivery in waiting {
        let receipt = tokio::time::timeout(Duration::from_secs(10), delivery)
            .await
            .expect("delivered once the endpoint answers");
        assert_eq!(receipt.unwrap().partition, 200);
    }
    let series = scrape(&sink);
    assert!(has(
        &series,
        "outboxd_http_endpoint_up{endpoint=\"default\"} 1"
    ));
    assert!(has(
        &series,
        "outboxd_http_requests_total{endpoint=\"default\",class=\"2xx\"} 4"
    ));
    assert!(has(
        &series,
        "outboxd_http_requests_in_flight{endpoint=\"default\"} 0"
    ));
    let failed: u64 = (series.lines())
        .find_map(|l| {
            l.strip_prefix("outboxd_http_requests_total{endpoint=\"default\",class=\"5xx\"} ")
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_default();
    assert!(failed >= 2, "the 503s are counted: {failed}");
    assert!(has(
        &series,
        "outboxd_http_request_duration_seconds_count{endpoint=\"default\"} ",
    ));
}

/// The event `id` of key `key` with a payload of `kib` KiB: its request counts that many
/// bytes of the endpoint's queue.
fn sized(id: i64, key: &str, kib: usize) -> OutboxEvent {
    let mut sized = event(id, key);
    sized.payload = Bytes::from(vec![b'x'; kib << 10]);
    sized
}

/// An endpoint taken for down whose queue is full: `send` does not wait for room (which
/// comes only once the endpoint answers, maybe hours later, and the claim worker, a poll
/// batch or the log relay's shutdown would wait as long): the event fails at once, as
/// retryable, and the requests already queued still wait for the endpoint.
#[tokio::test]
async fn a_down_endpoint_with_a_full_queue_fails_sends_at_once() {
    let server = Arc::new(Server::default());
    let url = start(&server).await;
    server.status.store(503, AtomicOrdering::SeqCst);
    // 64 KiB of queue: one 40 KiB request fills it.
    let sink = sink_to(&url, "payload", |config| {
        let endpoint = config.endpoints.get_mut("default").unwrap();
        endpoint.open_after = 1;
        endpoint.max_queued_bytes = 64 << 10;
    });
    let failure = sink.send(&event(1, "k1")).await.await.unwrap_err();
    assert_eq!(failure.kind, FailureKind::Retryable);
    // Down now: this one has room and waits for the endpoint.
    let mut held = Box::pin(sink.send(&sized(2, "k2", 40)).await);
    let early = tokio::time::timeout(Duration::from_millis(100), &mut held).await;
    assert!(early.is_err(), "a request with room waits for the endpoint");
    // No room: decided at once, not queued.
    let refused = tokio::time::timeout(Duration::from_millis(500), sink.send(&sized(3, "k3", 40)))
        .await
        .expect("send does not wait for room at an endpoint taken for down");
    // A smaller event of its key, sent before the relay has seen that failure, finds room
    // but must not go before the refused one's retry (strict ordering).
    let later = sink.send(&sized(5, "k3", 1)).await;
    let failure = tokio::time::timeout(Duration::from_millis(100), refused)
        .await
        .expect("its outcome is decided")
        .unwrap_err();
    assert_eq!(failure.kind, FailureKind::Retryable);
    assert!(
        failure
            .error
            .contains("is taken for down and its queue is full"),
        "{}",
        failure.error
    );
    let later = tokio::time::timeout(Duration::from_secs(2), later)
        .await
        .expect("decided without the endpoint")
        .unwrap_err();
    assert!(
        later.error.contains("earlier event of its key"),
        "{}",
        later.error
    );
    assert_eq!(sink.queue_depth(), 1, "only the held request is queued");
    // It answers again: the held request goes, and there is room again.
    server.status.store(200, AtomicOrdering::SeqCst);
    let receipt = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("delivered once the endpoint answers");
    assert_eq!(receipt.unwrap().partition, 200);
    let receipt = sink.send(&sized(4, "k3", 40)).await.await.unwrap();
    assert_eq!(receipt.partition, 200);
}

/// A send waiting for room while the endpoint is up stops waiting once the endpoint is
/// taken for down meanwhile: room would come only when it answers again.
#[tokio::test]
async fn a_send_waiting_for_room_fails_once_the_endpoint_is_taken_for_down() {
    let server = Arc::new(Server::default());
    let url = start(&server).await;
    server.status.store(503, AtomicOrdering::SeqCst);
    server.delay_ms.store(300, AtomicOrdering::SeqCst);
    let sink = sink_to(&url, "payload", |config| {
        let endpoint = config.endpoints.get_mut("default").unwrap();
        endpoint.open_after = 1;
        endpoint.concurrency = 1;
        endpoint.max_queued_bytes = 64 << 10;
    });
    // 10 + 50 KiB of the 64: the first is sent (its 503 in 300 ms takes the endpoint for
    // down), the second waits for the slot, then for the endpoint, holding its 50 KiB.
    let first = sink.send(&sized(1, "k1", 10)).await;
    let _second = sink.send(&sized(2, "k2", 50)).await;
    // 20 KiB: no room even once the first is answered. Without the breaker's notice it
    // would wait until the second's probe (1 s later) failed and gave its bytes back.
    let started = tokio::time::Instant::now();
    let waiting = tokio::time::timeout(Duration::from_secs(5), sink.send(&sized(3, "k3", 20)))
        .await
        .expect("send stops waiting");
    let failure = tokio::time::timeout(Duration::from_millis(100), waiting)
        .await
        .expect("its outcome is decided, not queued")
        .unwrap_err();
    assert_eq!(failure.kind, FailureKind::Retryable);
    assert!(
        failure
            .error
            .contains("is taken for down and its queue is full"),
        "{}",
        failure.error
    );
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "it stopped when the endpoint was taken for down: {:?}",
        started.elapsed()
    );
    assert_eq!(first.await.unwrap_err().kind, FailureKind::Retryable);
}

/// The sink's series as `/metrics` shows them.
fn scrape(sink: &HttpSink) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    sink.endpoint_metrics()
        .expect("the HTTP sink has series")
        .register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
    text
}

/// Whether `text` has a line that is `line` (or, when `line` ends with a space, starts
/// with it).
fn has(text: &str, line: &str) -> bool {
    text.lines()
        .any(|l| l == line || (line.ends_with(' ') && l.starts_with(line)))
}

/// A row can name only a configured endpoint; a template over the row picks among them.
#[tokio::test]
async fn rows_name_only_configured_endpoints() {
    let server = Arc::new(Server::default());
    let url = start(&server).await;
    let sink = sink_to(&url, "payload", |config| {
        config.endpoint_template = "{message_type}".into();
        let endpoint = config.endpoints.remove("default").unwrap();
        config.endpoints.insert("test.event".into(), endpoint);
    });
    assert_eq!(sink.refusal(&event(1, "k")), None);
    let mut elsewhere = event(2, "k");
    elsewhere.topic = Some("https://attacker.example/".into());
    let reason = sink.refusal(&elsewhere).expect("refused");
    assert!(reason.contains("no endpoint"), "{reason}");
    assert_eq!(sink.destination(&event(3, "k")), "test.event");
}

/// Strict ordering when the relay has not yet taken a failure: a later event of the key
/// handed over in that moment finds the failed one and is not sent; once the failure is
/// taken, the key's next event goes.
#[tokio::test]
async fn a_failure_not_yet_taken_still_holds_its_keys_next_event() {
    let server = Arc::new(Server::default());
    let url = start(&server).await;
    server.failing.lock().unwrap().push("m-1".into());
    let sink = sink_to(&url, "payload", |_| {});
    let first = sink.send(&event(1, "k")).await;
    // The answer (500) is in, but nobody has taken the outcome yet.
    for _ in 0..200 {
        if server.requests.lock().unwrap().len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = sink.send(&event(2, "k")).await.await.unwrap_err();
    assert!(
        second.error.contains("earlier event of its key"),
        "{}",
        second.error
    );
    assert_eq!(first.await.unwrap_err().kind, FailureKind::Retryable);
    // Taken: the key goes on (its retry, then what follows).
    assert!(sink.send(&event(3, "k")).await.await.is_ok());
    let ids: Vec<String> = (server.requests.lock().unwrap().iter())
        .map(|(h, _)| header(h, "webhook-id"))
        .collect();
    assert_eq!(ids, ["m-1", "m-3"], "m-2 never sent");
}

/// A request whose caller stopped waiting before its turn came (a claim's deadline while
/// the endpoint was down) is never sent.
#[tokio::test]
async fn a_request_nobody_waits_for_is_not_sent_when_its_turn_comes() {
    let server = Arc::new(Server::default());
    let url = start(&server).await;
    server.status.store(503, AtomicOrdering::SeqCst);
    let sink = sink_to(&url, "payload", |config| {
        config.endpoints.get_mut("default").unwrap().open_after = 1;
    });
    assert!(sink.send(&event(1, "k1")).await.await.is_err());
    let abandoned = sink.send(&event(2, "k2")).await;
    let waited = tokio::time::timeout(Duration::from_millis(200), abandoned).await;
    assert!(waited.is_err(), "waits while the endpoint is down");
    server.status.store(200, AtomicOrdering::SeqCst);
    // The probe (a new request) finds the endpoint up; the abandoned one never went.
    let probe = tokio::time::timeout(Duration::from_secs(10), sink.send(&event(3, "k3")).await)
        .await
        .expect("the probe answered");
    assert!(probe.is_ok());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let ids: Vec<String> = (server.requests.lock().unwrap().iter())
        .map(|(h, _)| header(h, "webhook-id"))
        .collect();
    assert!(!ids.contains(&"m-2".to_owned()), "{ids:?}");
    assert_eq!(sink.queue_depth(), 0);
}
