//! The inbox end to end against real PostgreSQL and Kafka: `outboxd run` with `[inbox]`,
//! messages arriving over Kafka and HTTP, handled by the SQL handler and a webhook.
//! As README's "Privileges" says: `init` runs as the admin role, everything else as the
//! runtime role with the grants of `schemas/postgres/grants.sql`, and the SQL handler's
//! statement with the grants the application gave that role on its own table.

mod common;

use std::time::{Duration, Instant};

use common::inbox::{ident, kafka, pg, post, Inbox};
use common::wait_for;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn producer() -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", kafka())
        .set("message.timeout.ms", "10000")
        .create()
        .expect("producer")
}

/// Sends one record as outboxd's relay would.
async fn send(
    producer: &FutureProducer,
    topic: &str,
    id: &str,
    type_: &str,
    key: &str,
    payload: &str,
) {
    send_bytes(producer, topic, id, type_, key, payload.as_bytes()).await;
}

/// [`send`] with any bytes as the value.
async fn send_bytes(
    producer: &FutureProducer,
    topic: &str,
    id: &str,
    type_: &str,
    key: &str,
    payload: &[u8],
) {
    send_with_headers(producer, topic, (id, type_, key), payload, &[]).await;
}

/// [`send_bytes`] with `extra` headers after outboxd's own.
async fn send_with_headers(
    producer: &FutureProducer,
    topic: &str,
    (id, type_, key): (&str, &str, &str),
    payload: &[u8],
    extra: &[(&str, &str)],
) {
    let mut headers = OwnedHeaders::new()
        .insert(Header {
            key: "message_id",
            value: Some(id),
        })
        .insert(Header {
            key: "message_type",
            value: Some(type_),
        })
        .insert(Header {
            key: "biz_key",
            value: Some(key),
        });
    for &(name, value) in extra {
        headers = headers.insert(Header {
            key: name,
            value: Some(value),
        });
    }
    producer
        .send(
            FutureRecord::to(topic)
                .key(key)
                .payload(payload)
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("produce");
}

const SQL_HANDLER: &str = r#"
[inbox]
claim_timeout = "5s"
dedupe_retention = "1s"

[inbox.kafka]
topics = ["{topic}"]
group_id = "it-{name}"

[inbox.http]

[inbox.http.sources.shop]
auth = "none"
[inbox.http.sources.app]
auth = "none"
[inbox.http.sources.plain]
auth = "none"
[inbox.http.sources.web]
auth = "none"

[inbox.handlers.default]
kind = "sql"
statement = "INSERT INTO {schema}.effects (message_id, biz_key, payload) VALUES (:message_id, :biz_key, :payload::jsonb)"
"#;

/// The same message twice over Kafka and three times over HTTP: stored once each,
/// answered as duplicates, and the SQL handler's effect applied once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_over_kafka_and_http_are_handled_once() {
    let inbox = Inbox::new("dedupe", SQL_HANDLER).await;
    let mut daemon = inbox.run("run.log");
    inbox.wait_ready().await;

    let producer = producer();
    for _ in 0..2 {
        send(
            &producer,
            &inbox.topic,
            "k-1",
            "order.created",
            "o-1",
            r#"{"order": 1}"#,
        )
        .await;
    }
    let path = "/v1/inbox/shop";
    let headers = [
        ("Message-Id", "h-1"),
        ("Message-Type", "payment.settled"),
        ("Biz-Key", "o-1"),
        ("Content-Type", "application/json"),
    ];
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(post(inbox.port, path, &headers, br#"{"paid": 10}"#).await);
    }
    assert_eq!(answers[0].0, 200, "{answers:?}");
    assert!(answers[0].1.contains(r#""duplicate":false"#), "{answers:?}");
    for (status, body) in &answers[1..] {
        assert_eq!(*status, 200);
        assert!(body.contains(r#""duplicate":true"#), "{body}");
    }

    let done = wait_for("both messages handled", Duration::from_secs(30), || async {
        let rows = inbox.rows().await;
        (rows.len() == 2 && rows.iter().all(|(_, s, _)| s == "DONE")).then_some(rows)
    })
    .await;
    let mut ids: Vec<&str> = done.iter().map(|(id, _, _)| id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["h-1", "k-1"]);
    // The Kafka redelivery may still be on its way: wait until it was read (and counted as
    // a duplicate) before checking that nothing was applied twice.
    let port = inbox.port;
    let kafka_duplicate = format!(
        "{{ingress=\"kafka\",source=\"{}\",result=\"duplicate\"}}",
        inbox.topic
    );
    wait_for(
        "the Kafka redelivery read",
        Duration::from_secs(30),
        || async {
            let metrics = common::http_get(port, "/metrics").await?.1;
            let read =
                common::metric_value(&metrics, "outboxd_inbox_messages_total", &kafka_duplicate);
            (read == Some(1.0)).then_some(())
        },
    )
    .await;
    let mut effects = inbox.effects().await;
    effects.sort();
    assert_eq!(effects, ["h-1", "k-1"], "each effect once");
    assert_eq!(inbox.rows().await.len(), 2, "nothing stored twice");

    let metrics = common::http_get(inbox.port, "/metrics")
        .await
        .expect("metrics")
        .1;
    let duplicates = common::metric_value(
        &metrics,
        "outboxd_inbox_messages_total",
        "{ingress=\"http\",source=\"shop\",result=\"duplicate\"}",
    );
    assert_eq!(duplicates, Some(2.0), "{metrics}");
    let pending = common::metric_value(&metrics, "outboxd_inbox_rows", "{status=\"PENDING\"}");
    assert_eq!(pending, Some(0.0), "every row is DONE: {metrics}");
    assert!(
        metrics.contains("outboxd_inbox_handler_seconds_bucket"),
        "{metrics}"
    );
    assert!(daemon.terminate().success());

    // Past the deduplication window the janitor, as the runtime role, moves the rows into
    // an archive table the administrator made for it (the runtime role may create none).
    let archive = format!("{}.inbox_archive", inbox.schema);
    let run = ident(&inbox.services.run_user);
    inbox
        .as_admin(&format!(
            "CREATE TABLE {archive} (LIKE {}.inbox); GRANT INSERT ON {archive} TO {run}",
            inbox.schema
        ))
        .await;
    let report = inbox.janitor(2, &["--archive-table", &archive]).await;
    assert_eq!(
        (report["rows"].as_u64(), report["action"].as_str()),
        (Some(2), Some("archive")),
        "{report}"
    );
    assert!(inbox.rows().await.is_empty());
    let sql = format!("SELECT count(*) FROM {archive}");
    let archived: i64 = pg().await.query_one(&sql, &[]).await.expect(&sql).get(0);
    assert_eq!(archived, 2);
    inbox.cleanup().await;
}

/// The SQL handler's statement runs as the runtime role with only what the application
/// granted it: without USAGE on the effects table's sequence the message fails with
/// PostgreSQL's refusal in `last_error` and nothing is applied; once granted, the retry
/// applies it. The janitor, as that role, then deletes the DONE row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_handler_has_only_the_grants_the_application_gave() {
    let inbox = Inbox::new("grants", SQL_HANDLER).await;
    let sequence = format!("{}.effects_n_seq", inbox.schema);
    let run = ident(&inbox.services.run_user);
    let revoke = format!("REVOKE USAGE ON SEQUENCE {sequence} FROM {run}");
    pg().await.batch_execute(&revoke).await.expect(&revoke);
    let mut daemon = inbox.run("run.log");
    inbox.wait_ready().await;
    let headers = [
        ("Message-Id", "g-1"),
        ("Message-Type", "t"),
        ("Biz-Key", "k"),
    ];
    let (status, body) = post(inbox.port, "/v1/inbox/app", &headers, br#"{"a": 1}"#).await;
    assert_eq!(status, 200, "{body}");
    let attempt = format!(
        "SELECT retry_count, last_error FROM {}.inbox WHERE message_id = 'g-1'",
        inbox.schema
    );
    let error = wait_for("a failed attempt", Duration::from_secs(30), || async {
        let row = pg().await.query_one(&attempt, &[]).await.expect("g-1");
        let (tries, error): (i32, Option<String>) = (row.get(0), row.get(1));
        error.filter(|_| tries >= 1)
    })
    .await;
    assert!(
        error.contains("permission denied for sequence effects_n_seq"),
        "{error}"
    );
    assert!(inbox.effects().await.is_empty(), "nothing applied");

    let grant = format!("GRANT USAGE ON SEQUENCE {sequence} TO {run}");
    pg().await.batch_execute(&grant).await.expect(&grant);
    wait_for("handled once granted", Duration::from_secs(30), || async {
        let rows = inbox.rows().await;
        (rows.len() == 1 && rows[0].1 == "DONE").then_some(())
    })
    .await;
    assert_eq!(inbox.effects().await, ["g-1"]);
    assert!(daemon.terminate().success(), "{}", daemon.log_text());

    let report = inbox.janitor(1, &[]).await;
    assert_eq!(
        (report["rows"].as_u64(), report["action"].as_str()),
        (Some(1), Some("delete")),
        "{report}"
    );
    assert!(inbox.rows().await.is_empty());
    inbox.cleanup().await;
}

/// What HTTP ingress refuses is answered with its status and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_ingress_refuses_bad_requests_and_stores_nothing() {
    let secret = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0";
    let toml = format!("{SQL_HANDLER}\n[inbox.http.secrets]\nsigned = [\"{secret}\"]\n",)
        .replace("[inbox.http]\n", "[inbox.http]\nmax_body_bytes = 1024\n")
        // Signed requests replayed within the timestamp tolerance must still find their row.
        .replace("dedupe_retention = \"1s\"", "dedupe_retention = \"1h\"");
    let inbox = Inbox::new("refuse", &toml).await;
    let mut daemon = inbox.run("run.log");
    inbox.wait_ready().await;
    let port = inbox.port;
    let typed = [("Message-Id", "m-1"), ("Message-Type", "t")];

    let (status, body) = post(port, "/v1/inbox/plain", &[("Message-Type", "t")], b"{}").await;
    assert_eq!(status, 400, "missing id: {body}");
    let (status, body) = post(port, "/v1/inbox/plain", &typed, b"{not json").await;
    assert_eq!(status, 400, "not JSON: {body}");
    let big = format!(r#"{{"pad": "{}"}}"#, "x".repeat(2048));
    let (status, _) = post(port, "/v1/inbox/plain", &typed, big.as_bytes()).await;
    assert_eq!(status, 413, "over max_body_bytes");

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let body = br#"{"type": "invoice.paid", "id": 7}"#;
    let good = outboxd::inbox::signature::sign(secret, "wh-1", now, body).unwrap();
    let stale = outboxd::inbox::signature::sign(secret, "wh-1", now - 3600, body).unwrap();
    let ts = now.to_string();
    let old_ts = (now - 3600).to_string();
    let signed = |sig: &str, ts: &str| {
        vec![
            ("webhook-id".to_owned(), "wh-1".to_owned()),
            ("webhook-timestamp".to_owned(), ts.to_owned()),
            ("webhook-signature".to_owned(), sig.to_owned()),
        ]
    };
    let as_refs = |h: &Vec<(String, String)>| -> Vec<(String, String)> { h.clone() };
    for (headers, what) in [
        (signed("v1,AAAA", &ts), "bad signature"),
        (signed(&stale, &old_ts), "stale timestamp"),
    ] {
        let headers = as_refs(&headers);
        let refs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let (status, body) = post(port, "/v1/inbox/signed", &refs, body).await;
        assert_eq!(status, 401, "{what}: {body}");
    }
    assert!(inbox.rows().await.is_empty(), "nothing stored");

    // A correctly signed Standard Webhooks request: type from the body, id from webhook-id.
    let headers = signed(&good, &ts);
    let refs: Vec<(&str, &str)> = headers
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let (status, answer) = post(port, "/v1/inbox/signed", &refs, body).await;
    assert_eq!(status, 200, "{answer}");
    let rows = wait_for(
        "the signed message handled",
        Duration::from_secs(30),
        || async {
            let rows = inbox.rows().await;
            (rows.len() == 1 && rows[0].1 == "DONE").then_some(rows)
        },
    )
    .await;
    assert_eq!(rows[0].0, "wh-1");
    assert!(daemon.terminate().success());
    inbox.cleanup().await;
}

/// A minimal HTTP service for the webhook handler: answers each request with the next
/// status of `script` for its `Biz-Key` (the last one repeats; 0 = never answer) and
/// records `(biz_key, when, idempotency_key)` of each call.
async fn webhook_service(
    script: std::collections::HashMap<String, Vec<u16>>,
) -> (
    u16,
    std::sync::Arc<std::sync::Mutex<Vec<(String, Instant, String)>>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = std::sync::Arc::clone(&seen);
    tokio::spawn(async move {
        let mut calls: std::collections::HashMap<String, usize> = Default::default();
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let mut buf = vec![0u8; 65536];
            let mut read = 0;
            // Read the head and the body (Content-Length).
            while let Ok(n) = stream.read(&mut buf[read..]).await {
                if n == 0 {
                    break;
                }
                read += n;
                let text = String::from_utf8_lossy(&buf[..read]).to_string();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let length = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if body.len() >= length {
                        break;
                    }
                }
            }
            let text = String::from_utf8_lossy(&buf[..read]).to_string();
            let key = text
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("biz-key")
                        .then(|| v.trim().to_owned())
                })
                .unwrap_or_default();
            let idempotency = text
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("idempotency-key")
                        .then(|| v.trim().to_owned())
                })
                .unwrap_or_default();
            log.lock()
                .unwrap()
                .push((key.clone(), Instant::now(), idempotency));
            let n = calls.entry(key.clone()).or_default();
            let statuses = script.get(&key).cloned().unwrap_or_else(|| vec![200]);
            let status = statuses[(*n).min(statuses.len() - 1)];
            *n += 1;
            if status == 0 {
                // Hang: keep the connection open without answering.
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    drop(stream);
                });
                continue;
            }
            let reply =
                format!("HTTP/1.1 {status} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno");
            let _ = stream.write_all(reply.as_bytes()).await;
        }
    });
    (port, seen)
}

/// 500 then 200 → DONE after one retry, no sooner than the backoff; 400 → MANUAL_REQUIRED
/// at once, and a later message of its key waits behind it until an operator resolves it;
/// a call that never answers times out, counts as a failed attempt and is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_answers_decide_done_retry_or_manual() {
    let script = [
        ("hooks:retry-key".to_owned(), vec![500, 200]),
        ("hooks:bad-key".to_owned(), vec![400]),
        ("hooks:hang-key".to_owned(), vec![0, 200]),
    ]
    .into_iter()
    .collect();
    let (service, seen) = webhook_service(script).await;
    let toml = format!(
        r#"
[inbox]
claim_timeout = "10s"

[inbox.http]

[inbox.http.sources.hooks]
auth = "none"

[inbox.handlers.default]
kind = "webhook"
url = "http://127.0.0.1:{service}/hooks"
timeout = "2s"
"#
    );
    let inbox = Inbox::new("webhook", &toml).await;
    let mut daemon = inbox.run("run.log");
    inbox.wait_ready().await;
    let port = inbox.port;
    let send = |id: &'static str, type_: &'static str, key: &'static str| async move {
        let headers = [
            ("Message-Id", id),
            ("Message-Type", type_),
            ("Biz-Key", key),
        ];
        let (status, body) = post(port, "/v1/inbox/hooks", &headers, br#"{"a": 1}"#).await;
        assert_eq!(status, 200, "{body}");
    };
    send("r-1", "t1", "retry-key").await;
    send("b-1", "t1", "bad-key").await;
    send("b-2", "t2", "bad-key").await;
    send("h-1", "t1", "hang-key").await;

    let rows = wait_for("outcomes written", Duration::from_secs(30), || async {
        let rows = inbox.rows().await;
        let status = |id: &str| rows.iter().find(|r| r.0 == id).map(|r| r.1.clone());
        (status("r-1").as_deref() == Some("DONE")
            && status("b-1").as_deref() == Some("MANUAL_REQUIRED")
            && status("h-1").as_deref() == Some("DONE"))
        .then_some(rows)
    })
    .await;
    let r1 = rows.iter().find(|r| r.0 == "r-1").unwrap();
    assert_eq!(r1.2, 1, "one failed attempt before DONE");
    let h1 = rows.iter().find(|r| r.0 == "h-1").unwrap();
    assert_eq!(
        h1.2, 1,
        "the hanging call timed out and counted as a failed attempt"
    );
    let calls = seen.lock().unwrap().clone();
    let retry: Vec<Instant> = calls
        .iter()
        .filter(|c| c.0 == "hooks:retry-key")
        .map(|c| c.1)
        .collect();
    assert_eq!(retry.len(), 2, "{calls:?}");
    assert!(
        retry[1] - retry[0] >= Duration::from_millis(300),
        "the backoff (retry.base = 300ms) is respected"
    );
    // No extra wait needed: h-1's timeout and retry above took several claim rounds after
    // b-1 became MANUAL_REQUIRED, any of which would have taken b-2 were it not held back.
    let b2 = inbox
        .rows()
        .await
        .into_iter()
        .find(|r| r.0 == "b-2")
        .unwrap();
    assert_eq!(
        b2.1, "PENDING",
        "b-2 waits behind its key's MANUAL_REQUIRED message"
    );
    assert_eq!(
        calls.iter().filter(|c| c.0 == "hooks:bad-key").count(),
        1,
        "the 400 is not retried"
    );

    // The operator looks, then resolves b-1: b-2 is released and handled.
    let status = common::run_outboxd(&inbox.config, &["status", "--inbox", "--json"]);
    assert!(status.status.success(), "{status:?}");
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status JSON");
    assert_eq!(json["totals"]["MANUAL_REQUIRED"], 1, "{json}");
    assert_eq!(json["totals"]["PENDING"], 1, "{json}");
    let sql = format!(
        "SELECT id FROM {}.inbox WHERE message_id = 'b-1'",
        inbox.schema
    );
    let b1: i64 = pg().await.query_one(&sql, &[]).await.expect("b-1").get(0);
    let resolved = common::run_outboxd(
        &inbox.config,
        &[
            "resolve",
            "--inbox",
            "--id",
            &b1.to_string(),
            "--reason",
            "bad request fixed upstream",
        ],
    );
    let text = String::from_utf8_lossy(&resolved.stdout);
    assert!(resolved.status.success(), "{resolved:?}");
    assert!(
        text.contains("inbox row") && text.contains("DONE"),
        "{text}"
    );
    // The service answers 400 to its key again, so b-2 is attempted once and parked too.
    wait_for(
        "b-2 attempted once b-1 is resolved",
        Duration::from_secs(30),
        || async {
            let rows = inbox.rows().await;
            let b2 = rows
                .iter()
                .any(|r| r.0 == "b-2" && r.1 == "MANUAL_REQUIRED");
            b2.then_some(())
        },
    )
    .await;
    let calls = seen.lock().unwrap().clone();
    let bad: Vec<&str> = (calls.iter())
        .filter(|c| c.0 == "hooks:bad-key")
        .map(|c| c.2.as_str())
        .collect();
    assert_eq!(bad, ["b-1", "b-2"], "in order, once each");
    assert!(daemon.terminate().success());
    inbox.cleanup().await;
}

/// Many messages of few keys over Kafka, eight workers and a webhook that records what it
/// sees: every key's messages reach it one at a time, in the order they arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_is_handled_in_arrival_order_by_several_workers() {
    let (service, seen) = webhook_service(Default::default()).await;
    let toml = format!(
        r#"
[inbox]
workers = 8
claim_timeout = "10s"

[inbox.kafka]
topics = ["{{topic}}"]
group_id = "it-{{name}}"

[inbox.handlers.default]
kind = "webhook"
url = "http://127.0.0.1:{service}/hooks"
timeout = "2s"
"#
    );
    let inbox = Inbox::new("order", &toml).await;
    let mut daemon = inbox.run("run.log");
    inbox.wait_ready().await;
    let producer = producer();
    let keys = ["k0", "k1", "k2", "k3"];
    let mut sent: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for n in 0..200 {
        let key = keys[n % keys.len()];
        let id = format!("m-{n}");
        // (message_type, biz_key) is unique: one type per message of a key.
        send(
            &producer,
            &inbox.topic,
            &id,
            &format!("step-{n}"),
            key,
            r#"{"n": 1}"#,
        )
        .await;
        sent.entry(key).or_default().push(id);
    }
    wait_for("all handled", Duration::from_secs(60), || async {
        let rows = inbox.rows().await;
        (rows.len() == 200 && rows.iter().all(|r| r.1 == "DONE")).then_some(())
    })
    .await;
    let calls = seen.lock().unwrap().clone();
    let mut received: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (key, _, id) in &calls {
        received.entry(key.clone()).or_default().push(id.clone());
    }
    for key in keys {
        assert_eq!(
            received[key], sent[key],
            "key {key} in arrival order, once each"
        );
    }
    assert!(daemon.terminate().success());
    inbox.cleanup().await;
}

/// kill -9 while messages are stored but their offsets not yet committed, and while the
/// SQL handler runs: after a restart every message is handled, each effect exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_nothing_and_the_sql_handler_applies_each_effect_once() {
    // Offsets are committed once a minute: the kill always comes before the commit, so
    // the restarted consumer reads every record again.
    let toml = SQL_HANDLER.replace(
        "group_id = \"it-{name}\"",
        "group_id = \"it-{name}\"\noptions = { \"auto.commit.interval.ms\" = \"60000\" }",
    );
    let inbox = Inbox::new("kill", &toml).await;
    let mut daemon = inbox.run("run-1.log");
    inbox.wait_ready().await;
    let producer = producer();
    let total = 300;
    for n in 0..total {
        let key = format!("o-{}", n % 17);
        send(
            &producer,
            &inbox.topic,
            &format!("m-{n}"),
            &format!("t-{n}"),
            &key,
            r#"{"q": 1}"#,
        )
        .await;
    }
    wait_for("some handled", Duration::from_secs(30), || async {
        (inbox.effects().await.len() >= 50).then_some(())
    })
    .await;
    daemon.kill9();
    let mut daemon = inbox.run("run-2.log");
    wait_for(
        "all handled after the restart",
        Duration::from_secs(90),
        || async {
            let rows = inbox.rows().await;
            (rows.len() == total && rows.iter().all(|r| r.1 == "DONE")).then_some(())
        },
    )
    .await;
    let effects = inbox.effects().await;
    let unique: std::collections::BTreeSet<&String> = effects.iter().collect();
    assert_eq!(unique.len(), total, "every message's effect");
    assert_eq!(effects.len(), total, "and none twice");
    let log = daemon.log_text();
    assert!(daemon.terminate().success(), "{log}");
    inbox.cleanup().await;
}

/// kill -9 while a webhook call hangs: the claim is reaped after `claim_timeout` and the
/// webhook gets the message again with the same idempotency key (at-least-once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_webhook_redelivers_with_the_same_idempotency_key() {
    let (service, seen) = webhook_service(
        [("hooks:slow-key".to_owned(), vec![0, 200])]
            .into_iter()
            .collect(),
    )
    .await;
    let toml = format!(
        r#"
[inbox]
claim_timeout = "3s"
idle_check = "500ms"

[inbox.http]

[inbox.http.sources.hooks]
auth = "none"

[inbox.handlers.default]
kind = "webhook"
url = "http://127.0.0.1:{service}/hooks"
timeout = "1s"
"#
    );
    let inbox = Inbox::new("reap", &toml).await;
    let mut daemon = inbox.run("run-1.log");
    inbox.wait_ready().await;
    let headers = [
        ("Message-Id", "w-1"),
        ("Message-Type", "t"),
        ("Biz-Key", "slow-key"),
    ];
    let (status, body) = post(inbox.port, "/v1/inbox/hooks", &headers, b"{}").await;
    assert_eq!(status, 200, "{body}");
    wait_for("the first call", Duration::from_secs(10), || async {
        (!seen.lock().unwrap().is_empty()).then_some(())
    })
    .await;
    daemon.kill9();
    let row = inbox.rows().await;
    assert_eq!(row[0].1, "PROCESSING", "the dead worker's claim");
    let mut daemon = inbox.run("run-2.log");
    wait_for(
        "handled after the reap",
        Duration::from_secs(30),
        || async {
            let rows = inbox.rows().await;
            (rows[0].1 == "DONE").then_some(())
        },
    )
    .await;
    let calls = seen.lock().unwrap().clone();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(
        calls.iter().all(|c| c.2 == "w-1"),
        "same idempotency key: {calls:?}"
    );
    assert!(daemon.terminate().success());
    inbox.cleanup().await;
}

/// Values the database cannot hold as received (a JSON NUL escape, which `jsonb` refuses;
/// an Avro-style value starting with a NUL byte) neither stop Kafka ingress nor get lost:
/// they are kept MANUAL_REQUIRED with their bytes in base64, and the records after them
/// are handled. Over HTTP the same body is answered 400 and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_the_database_refuses_are_kept_for_an_operator() {
    let inbox = Inbox::new("unstorable", SQL_HANDLER).await;
    let mut daemon = inbox.run("run.log");
    inbox.wait_ready().await;
    let producer = producer();
    send(
        &producer,
        &inbox.topic,
        "nul-json",
        "t1",
        "k1",
        r#"{"a": "\u0000"}"#,
    )
    .await;
    send_bytes(
        &producer,
        &inbox.topic,
        "avro",
        "t2",
        "k2",
        &[0, 0, 0, 0, 7, 2, 0x41],
    )
    .await;
    send(&producer, &inbox.topic, "fine", "t3", "k3", r#"{"a": 1}"#).await;
    let rows = wait_for("all three stored", Duration::from_secs(30), || async {
        let rows = inbox.rows().await;
        let done = rows.iter().any(|r| r.0 == "fine" && r.1 == "DONE");
        (rows.len() == 3 && done).then_some(rows)
    })
    .await;
    for id in ["nul-json", "avro"] {
        let row = rows.iter().find(|r| r.0 == id).expect(id);
        assert_eq!(row.1, "MANUAL_REQUIRED", "{id}: {rows:?}");
    }
    let sql = format!(
        "SELECT payload->>'unstorable_payload_base64', last_error FROM {}.inbox WHERE message_id = 'avro'",
        inbox.schema
    );
    let row = pg().await.query_one(&sql, &[]).await.expect("avro row");
    assert_eq!(
        row.get::<_, Option<String>>(0).as_deref(),
        Some("AAAAAAcCQQ==")
    );
    let error: String = row.get(1);
    assert!(error.contains("base64"), "{error}");

    let headers = [("Message-Id", "h-nul"), ("Message-Type", "t")];
    let (status, body) = post(inbox.port, "/v1/inbox/web", &headers, br#"{"a": "\u0000"}"#).await;
    assert_eq!(status, 400, "{body}");
    // The answer says what is wrong with the request, not what the database said: that
    // stays in the log, under the answer's request id.
    let answer: serde_json::Value = serde_json::from_str(&body).expect("a JSON answer");
    let request_id = answer["request_id"].as_str().expect("a request id");
    for internal in [
        "Unicode",
        "SQLSTATE",
        "22P05",
        "jsonb",
        "127.0.0.1",
        "postgres",
    ] {
        assert!(!body.contains(internal), "{internal} in {body}");
    }
    let log = daemon.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains(request_id) && l.contains("Unicode")),
        "the log has the database's words under {request_id}"
    );
    assert_eq!(inbox.rows().await.len(), 3, "nothing stored from HTTP");
    assert!(daemon.terminate().success());
    inbox.cleanup().await;
}

/// A relay's canary (`[canary]`) on a topic an inbox reads anyway: acknowledged, never
/// stored, so no handler sees it; the business event after it (same key, so the same
/// partition, read after it) is stored and handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relays_canary_is_acknowledged_and_never_stored() {
    let inbox = Inbox::new("canary", SQL_HANDLER).await;
    let mut daemon = inbox.run("run.log");
    inbox.wait_ready().await;
    let producer = producer();
    send_with_headers(
        &producer,
        &inbox.topic,
        ("canary-orders-1-1-1", "outboxd.canary", "o-1"),
        br#"{"canary": 1}"#,
        &[(outboxd::canary::CANARY_HEADER, "1")],
    )
    .await;
    send(
        &producer,
        &inbox.topic,
        "k-1",
        "order.created",
        "o-1",
        r#"{"order": 1}"#,
    )
    .await;
    let rows = wait_for(
        "the business event handled",
        Duration::from_secs(30),
        || async {
            let rows = inbox.rows().await;
            rows.iter().any(|(_, s, _)| s == "DONE").then_some(rows)
        },
    )
    .await;
    assert_eq!(rows.len(), 1, "only the business event is stored: {rows:?}");
    daemon.terminate();
    inbox.cleanup().await;
}
