//! The inbox's HTTP door as an attacker on the open internet meets it, against real
//! PostgreSQL and the real `outboxd run`: who may post as which source, what decides a
//! message's fields, and what a flood of costly requests does to the probes.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::inbox::{pg, post, Inbox};
use common::wait_for;

const SECRET: &str = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// Standard Webhooks headers for `body` signed with [`SECRET`], plus `extra`.
fn signed(id: &str, body: &[u8], extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let ts = now();
    let sig = outboxd::inbox::signature::sign(SECRET, id, ts, body).expect("sign");
    let mut headers = vec![
        ("webhook-id".to_owned(), id.to_owned()),
        ("webhook-timestamp".to_owned(), ts.to_string()),
        ("webhook-signature".to_owned(), sig),
    ];
    headers.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    headers
}

fn refs(headers: &[(String, String)]) -> Vec<(&str, &str)> {
    headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// `(message_id, source, biz_key, status, last_error)` of every inbox row, in id order.
async fn rows(inbox: &Inbox) -> Vec<(String, String, String, String, Option<String>)> {
    let sql = format!(
        "SELECT message_id, source, biz_key, status, last_error FROM {}.inbox ORDER BY id",
        inbox.schema
    );
    let rows = pg().await.query(&sql, &[]).await.expect("inbox rows");
    rows.iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

const SOURCES: &str = r#"
[inbox]
claim_timeout = "5s"

[inbox.http]

[inbox.http.secrets]
shop = ["{secret}"]

[inbox.http.sources.shop]
key_field = "data.order_id"

[inbox.http.sources.web]
auth = "none"

[inbox.handlers."order.paid"]
kind = "sql"
statement = "INSERT INTO {schema}.effects (message_id, biz_key, payload) VALUES (:message_id, :biz_key, :payload::jsonb)"
sources = ["shop"]

[inbox.handlers.default]
kind = "sql"
statement = "INSERT INTO {schema}.effects (message_id, biz_key, payload) VALUES (:message_id, :biz_key, :payload::jsonb)"
"#;

/// A source with no secrets is refused unless configured unsigned; an unsigned source can
/// neither reach a handler bound to another source nor squat another source's key; a
/// signed source's type and key come from its signed body, and headers that say otherwise
/// are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_posts_only_as_itself() {
    let inbox = Inbox::new("door", &SOURCES.replace("{secret}", SECRET)).await;
    let mut daemon = inbox.run("run.log");
    inbox.wait_ready().await;
    let port = inbox.port;

    // An unconfigured source: 401, nothing stored, a request id and no detail.
    let squat = [
        ("Message-Id", "evil-1"),
        ("Message-Type", "order.paid"),
        ("Biz-Key", "o-1"),
    ];
    let (status, body) = post(port, "/v1/inbox/evil-x", &squat, br#"{"a": 1}"#).await;
    assert_eq!(status, 401, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert!(answer["request_id"].is_string(), "{body}");
    assert!(rows(&inbox).await.is_empty(), "nothing stored");

    // The unsigned source `web`, on purpose: stored under its own key space, so it does
    // not make the signed order a duplicate; its `order.paid` reaches no handler.
    let (status, body) = post(port, "/v1/inbox/web", &squat, br#"{"a": 1}"#).await;
    assert_eq!(status, 200, "{body}");
    let order = br#"{"type": "order.paid", "data": {"order_id": "o-1", "amount": 10}}"#;
    let lying = signed("wh-1", order, &[("Message-Type", "refund.issued")]);
    let (status, body) = post(port, "/v1/inbox/shop", &refs(&lying), order).await;
    assert_eq!(
        status, 400,
        "a header contradicting the signed body: {body}"
    );
    let headers = signed("wh-1", order, &[]);
    let (status, body) = post(port, "/v1/inbox/shop", &refs(&headers), order).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(r#""duplicate":false"#),
        "not squatted: {body}"
    );

    let rows = wait_for("both handled", Duration::from_secs(30), || async {
        let rows = rows(&inbox).await;
        let settled =
            rows.len() == 2 && rows.iter().all(|r| r.3 != "PENDING" && r.3 != "PROCESSING");
        settled.then_some(rows)
    })
    .await;
    let web = &rows[0];
    assert_eq!((web.1.as_str(), web.2.as_str()), ("web", "web:o-1"));
    assert_eq!(web.3, "MANUAL_REQUIRED", "{rows:?}");
    let reason = web.4.clone().unwrap_or_default();
    assert!(
        reason.contains("from source `web`") && reason.contains("shop"),
        "{reason}"
    );
    let shop = &rows[1];
    assert_eq!(
        (
            shop.0.as_str(),
            shop.1.as_str(),
            shop.2.as_str(),
            shop.3.as_str()
        ),
        ("wh-1", "shop", "shop:o-1", "DONE")
    );
    assert_eq!(
        inbox.effects().await,
        ["wh-1"],
        "only the signed order applied"
    );
    let log = daemon.log_text();
    assert!(
        log.contains("inbox.http.sources.web.auth = \"none\""),
        "the unsigned source is warned about at start"
    );
    assert!(daemon.terminate().success());
    inbox.cleanup().await;
}

/// Fifty clients at once sending the most costly request the door takes (a 1 MiB body, a
/// valid timestamp, a signature header of 1,500 entries) for a few seconds: `/healthz` and
/// `/readyz` keep answering, each within a deadline (3 s) that the flood's queue of such
/// requests exceeded before (each cost the runtime thread 0.79 s in a release build, and
/// probes went unanswered for over 5 s), and a genuine request is stored
/// once the flood ends. The precise figures are the bench's (`scripts/bench --scenarios
/// ingress-flood`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_costly_requests_leaves_the_probes_answering() {
    let toml = format!(
        "[inbox]\n[inbox.http]\n[inbox.http.secrets]\nshop = [\"{SECRET}\"]\n\
         [inbox.handlers.default]\nkind = \"sql\"\nstatement = \"SELECT 1\"\n"
    );
    let inbox = Inbox::new("flood", &toml).await;
    let mut daemon = inbox.run("run.log");
    inbox.wait_ready().await;
    let port = inbox.port;

    let body: Arc<Vec<u8>> = Arc::new({
        let mut body = br#"{"type": "x", "pad": ""#.to_vec();
        body.resize(1024 * 1024 - 2, b'a');
        body.extend_from_slice(b"\"}");
        body
    });
    // Seven entries of a tag's length (each could match, so each is a candidate) and a
    // long tail of empty ones.
    let signature = {
        let mut entries = vec![format!("v1,{}", "A".repeat(43) + "=")];
        entries.extend(std::iter::repeat_n(entries[0].clone(), 6));
        entries.extend(std::iter::repeat_n("v1,".to_owned(), 1_500));
        entries.join(" ")
    };
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let mut flood = Vec::new();
    for client in 0..50 {
        let (body, signature, stop, sent) = (
            Arc::clone(&body),
            signature.clone(),
            Arc::clone(&stop),
            Arc::clone(&sent),
        );
        flood.push(tokio::spawn(async move {
            let id = format!("flood-{client}");
            // Bounded in time (the flag) and in count.
            for _ in 0..1_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let ts = now().to_string();
                let headers = [
                    ("webhook-id", id.as_str()),
                    ("webhook-timestamp", ts.as_str()),
                    ("webhook-signature", signature.as_str()),
                ];
                post(port, "/v1/inbox/shop", &headers, &body).await;
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }

    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut probes = 0;
    while started.elapsed() < Duration::from_secs(4) {
        for path in ["/healthz", "/readyz"] {
            let asked = Instant::now();
            let answer = tokio::time::timeout(Duration::from_secs(3), common::http_get(port, path))
                .await
                .unwrap_or_else(|_| panic!("{path} did not answer within 3 s during the flood"));
            let (status, _) = answer.unwrap_or_else(|| panic!("{path}: no answer"));
            assert_eq!(status, 200, "{path}");
            slowest = slowest.max(asked.elapsed());
            probes += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for client in flood {
        client.await.expect("flood client");
    }
    eprintln!(
        "{probes} probes during {} hostile requests: slowest {slowest:?}",
        sent.load(Ordering::Relaxed)
    );
    assert!(sent.load(Ordering::Relaxed) >= 50, "the flood ran");
    assert!(rows(&inbox).await.is_empty(), "no hostile request stored");

    let genuine = br#"{"type": "order.paid"}"#;
    let headers = signed("wh-after", genuine, &[]);
    let (status, body) = post(port, "/v1/inbox/shop", &refs(&headers), genuine).await;
    assert_eq!(status, 200, "{body}");
    assert!(daemon.terminate().success());
    inbox.cleanup().await;
}
