//! Failures, retries and ordering on real servers with real faults: records the broker
//! rejects, topics that do not exist, workers that die mid-claim, a lost replication
//! slot. The outbox row must tell the truth throughout, and per-key order must hold.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::engine::random_pad;
use common::postgres::{PgServices, TestPipeline};
use common::scenarios::{self, FAST_FAILURES};
use common::{consume_all, wait_for};

async fn insert(
    p: &TestPipeline,
    client: &tokio_postgres::Client,
    message_id: &str,
    key: &str,
    seq: u32,
    topic: Option<&str>,
    payload_bytes: usize,
) {
    // Random letters: the producer compresses batches, so padding must not compress.
    let payload = format!(r#"{{"seq":{seq},"pad":"{}"}}"#, random_pad(payload_bytes));
    client
        .execute(
            &format!(
                "INSERT INTO \"{}\" (message_id, message_type, biz_key, topic, payload, headers) \
                 VALUES ($1, $2, $3, $4, $5::text::jsonb, $6::text::jsonb)",
                p.table
            ),
            &[
                &message_id,
                &format!("step{seq}"),
                &key,
                &topic,
                &payload,
                &format!(r#"{{"seq":"{seq}"}}"#),
            ],
        )
        .await
        .expect("insert outbox row");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_record_fails_its_row_parks_its_key_and_is_delivered_in_order_later() {
    scenarios::a_rejected_record_fails_its_row_parks_its_key_and_is_delivered_in_order_later::<
        PgServices,
    >()
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topic_fails_until_created_and_exhausted_rows_need_an_operator() {
    // Give up on a topic that does not appear within 2 s.
    let extra = FAST_FAILURES.replace(
        "[kafka.options]",
        "[kafka.options]\n\"topic.metadata.propagation.max.ms\" = \"2000\"",
    );
    let p = TestPipeline::new("missing", 1, &extra).await;
    p.init();
    let _daemon = p.spawn_run("run.log");
    let client = p.sql().await;
    let missing = format!("{}.missing", p.topic);

    insert(&p, &client, "m-1", "acct", 1, Some(&missing), 10).await;
    // A second key whose row may fail only twice.
    insert(
        &p,
        &client,
        "x-1",
        "exhaust",
        1,
        Some(&format!("{missing}.never")),
        10,
    )
    .await;
    client
        .execute(
            &format!(
                "UPDATE \"{}\" SET max_retry_count = 2 WHERE message_id = 'x-1'",
                p.table
            ),
            &[],
        )
        .await
        .expect("lower max_retry_count");

    wait_for(
        "the missing topic to fail the row",
        Duration::from_secs(60),
        || async {
            let rows = p.rows().await;
            (rows.get("m-1")?.status == "FAILED").then_some(())
        },
    )
    .await;
    let error = p.rows().await["m-1"].last_error.clone().unwrap_or_default();
    assert!(error.to_lowercase().contains("unknown topic"), "{error}");

    wait_for(
        "the row out of retries to need an operator",
        Duration::from_secs(90),
        || async {
            let rows = p.rows().await;
            let row = rows.get("x-1")?;
            (row.status == "MANUAL_REQUIRED").then_some(row.retry_count)
        },
    )
    .await;

    p.create_topic(&missing, 1).await;
    wait_for(
        "the row delivered once its topic exists",
        Duration::from_secs(60),
        || async { (p.rows().await.get("m-1")?.status == "SUCCESS").then_some(()) },
    )
    .await;
    let records = consume_all(&p.services.kafka, &missing, 1, 1, Duration::from_secs(30));
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].headers["message_id"], "m-1");
    assert_eq!(
        p.rows().await["x-1"].status,
        "MANUAL_REQUIRED",
        "stays for the operator"
    );
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_abandoned_by_a_dead_worker_is_reaped_and_delivered() {
    let extra = FAST_FAILURES.replace("claim_timeout = \"20s\"", "claim_timeout = \"12s\"");
    let p = TestPipeline::new("reap", 1, &extra).await;
    p.init();
    let client = p.sql().await;
    for seq in 1..=5 {
        insert(
            &p,
            &client,
            &format!("r-{seq}"),
            &format!("k{seq}"),
            seq,
            None,
            10,
        )
        .await;
    }
    // These rows were claimed by a worker that died an hour ago ...
    client
        .execute(
            &format!(
                "UPDATE \"{}\" SET status = 'PROCESSING', claimed_at = now() - interval '1 hour', \
                 claim_token = gen_random_uuid(), next_retry_time = now() - interval '1 hour'",
                p.table
            ),
            &[],
        )
        .await
        .expect("simulate a dead worker's claims");
    // ... and the log was confirmed past their inserts (as a relay does once it has
    // handed them on), so only the reaper and the claim worker can deliver them.
    client
        .execute(
            "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())",
            &[&format!("outboxd_{}", p.name)],
        )
        .await
        .expect("the slot is past the rows");
    let _daemon = p.spawn_run("run.log");
    wait_for("reaped rows delivered", Duration::from_secs(60), || async {
        let rows = p.rows().await;
        rows.values().all(|r| r.status == "SUCCESS").then_some(())
    })
    .await;
    for row in p.rows().await.values() {
        assert_eq!(
            row.retry_count, 1,
            "the reaper counted the abandoned attempt: {row:?}"
        );
    }
    let records = consume_all(&p.services.kafka, &p.topic, 1, 5, Duration::from_secs(30));
    assert_eq!(records.len(), 5);
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pollers_never_publish_a_row_twice() {
    let extra = "[poll]\ninterval = \"100ms\"\nbatch_size = 50\n";
    let p = TestPipeline::new("twopoll", 3, extra).await;
    let config = std::fs::read_to_string(&p.config_path).expect("config");
    std::fs::write(
        &p.config_path,
        config.replace(
            "kind = \"postgres\"",
            "kind = \"postgres\"\nmode = \"poll\"",
        ),
    )
    .expect("poll config");
    p.init();
    let client = p.sql().await;
    const ROWS: u32 = 600;
    for seq in 1..=ROWS {
        insert(
            &p,
            &client,
            &format!("p-{seq}"),
            &format!("key{}", seq % 40),
            seq,
            None,
            10,
        )
        .await;
    }
    let first = p.spawn_run("poll-1.log");
    let second = p.spawn_run("poll-2.log");
    wait_for("every row SUCCESS", Duration::from_secs(90), || async {
        let counts = p.status_counts().await;
        (counts.get("SUCCESS").copied() == Some(i64::from(ROWS))).then_some(())
    })
    .await;
    let records = consume_all(
        &p.services.kafka,
        &p.topic,
        3,
        ROWS as usize,
        Duration::from_secs(60),
    );
    let mut seen: HashMap<String, u32> = HashMap::new();
    for r in &records {
        *seen.entry(r.headers["message_id"].clone()).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "published more than once: {twice:?}");
    assert_eq!(seen.len(), ROWS as usize);
    // Both pollers did work (the claim is shared, not exclusive).
    let log1 = first.log_text();
    let log2 = second.log_text();
    assert!(log1.contains("poll mode") && log2.contains("poll mode"));
    drop((first, second));
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_dropped_while_down_is_reported_and_recover_delivers_every_row() {
    let p = TestPipeline::new("recover", 1, FAST_FAILURES).await;
    p.init();
    let client = p.sql().await;
    let mut daemon = p.spawn_run("run-1.log");
    insert(&p, &client, "before-1", "a", 1, None, 10).await;
    wait_for("first row SUCCESS", Duration::from_secs(30), || async {
        (p.rows().await.get("before-1")?.status == "SUCCESS").then_some(())
    })
    .await;
    assert!(daemon.terminate().success());

    // While outboxd is down: the slot is lost and rows keep coming.
    let slot = format!("outboxd_{}", p.name);
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await
        .expect("drop slot");
    for seq in 1..=20 {
        insert(&p, &client, &format!("lost-{seq}"), "b", seq, None, 10).await;
    }

    let failed_run = p.outboxd(&["run"]);
    let stderr = String::from_utf8_lossy(&failed_run.stderr);
    assert!(!failed_run.status.success());
    let expected = format!("outboxd recover --config {}", p.config_path.display());
    assert!(
        stderr.contains(&expected),
        "run names the exact command: {stderr}"
    );

    let recovered = p.outboxd(&["recover"]);
    let out = String::from_utf8_lossy(&recovered.stdout);
    assert!(
        recovered.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&recovered.stderr)
    );
    assert!(out.contains("20 INIT rows published"), "{out}");
    assert!(p.rows().await.values().all(|r| r.status == "SUCCESS"));

    // The relay resumes from the new slot.
    let _daemon = p.spawn_run("run-2.log");
    insert(&p, &client, "after-1", "c", 1, None, 10).await;
    wait_for(
        "rows after recovery flow again",
        Duration::from_secs(30),
        || async { (p.rows().await.get("after-1")?.status == "SUCCESS").then_some(()) },
    )
    .await;
    let records = consume_all(&p.services.kafka, &p.topic, 1, 22, Duration::from_secs(30));
    let ids: std::collections::HashSet<&str> = records
        .iter()
        .map(|r| r.headers["message_id"].as_str())
        .collect();
    assert_eq!(ids.len(), 22, "every row once at least");
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_outbox_sees_no_query_and_an_operator_retry_wakes_the_worker_at_once() {
    // Default retry settings: no periodic look; the worker sleeps until woken.
    let extra = r#"
[kafka.options]
"allow.auto.create.topics" = "false"
"topic.metadata.propagation.max.ms" = "2000"
"#;
    let p = TestPipeline::new("idleq", 1, extra).await;
    p.init();
    let _daemon = p.spawn_run("run.log");
    let client = p.sql().await;
    let missing = format!("{}.later", p.topic);
    insert(&p, &client, "late-1", "k", 1, Some(&missing), 10).await;
    client
        .execute(
            &format!("UPDATE \"{}\" SET max_retry_count = 1", p.table),
            &[],
        )
        .await
        .expect("one attempt only");
    wait_for(
        "the row to need an operator",
        Duration::from_secs(60),
        || async { (p.rows().await.get("late-1")?.status == "MANUAL_REQUIRED").then_some(()) },
    )
    .await;

    // Idle: no query on the outbox table. Backends flush their statistics within 10 s of
    // going idle, so read the counters after that long on both sides of the window.
    let scans = || async {
        let row = client
            .query_one(
                "SELECT seq_scan + COALESCE(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = $1",
                &[&p.table],
            )
            .await
            .expect("table statistics");
        row.get::<_, i64>(0)
    };
    tokio::time::sleep(Duration::from_secs(11)).await;
    let before = scans().await;
    tokio::time::sleep(Duration::from_secs(15 + 11)).await;
    let after = scans().await;
    assert_eq!(before, after, "scans of the idle outbox table during 15 s");

    // The operator fixes the cause and retries: the NOTIFY wakes the worker at once (the
    // worker would otherwise sleep indefinitely).
    p.create_topic(&missing, 1).await;
    let id: i64 = client
        .query_one(
            &format!("SELECT id FROM \"{}\" WHERE message_id = 'late-1'", p.table),
            &[],
        )
        .await
        .expect("id")
        .get(0);
    let out = p.outboxd(&["retry", "--id", &id.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(
        "the retried row delivered",
        Duration::from_secs(15),
        || async { (p.rows().await.get("late-1")?.status == "SUCCESS").then_some(()) },
    )
    .await;
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_while_publishing_leaves_rows_that_are_reaped_and_delivered() {
    // Retries of rows bound for a topic that does not exist yet stay PROCESSING for the
    // 8 s the producer keeps trying: a kill -9 then leaves real abandoned claims.
    let extra = r#"
[kafka.options]
"allow.auto.create.topics" = "false"

[retry]
base = "200ms"
cap = "500ms"
jitter = "50ms"
claim_timeout = "12s"
idle_check = "1s"
"#;
    let p = TestPipeline::new("killclaim", 1, extra).await;
    let config = std::fs::read_to_string(&p.config_path).expect("config");
    std::fs::write(
        &p.config_path,
        config.replace("message_timeout = \"10s\"", "message_timeout = \"8s\""),
    )
    .expect("config");
    p.init();
    let client = p.sql().await;
    let later = format!("{}.later", p.topic);
    for seq in 1..=3 {
        insert(
            &p,
            &client,
            &format!("c-{seq}"),
            &format!("key{seq}"),
            seq,
            Some(&later),
            10,
        )
        .await;
    }
    // Fail them once, quickly, so the retry worker is the one that claims them.
    client
        .execute(
            &format!(
                "UPDATE \"{}\" SET status = 'FAILED', retry_count = 1, next_retry_time = now(), \
                 last_error = 'set up by the test'",
                p.table
            ),
            &[],
        )
        .await
        .expect("mark FAILED");
    let mut first = p.spawn_run("first.log");
    wait_for(
        "the retry worker to claim the rows",
        Duration::from_secs(30),
        || async {
            let rows = p.rows().await;
            rows.values()
                .all(|r| r.status == "PROCESSING")
                .then_some(())
        },
    )
    .await;
    first.kill9();
    assert!(
        p.rows().await.values().all(|r| r.status == "PROCESSING"),
        "claims abandoned"
    );

    // The topic appears; a new outboxd reaps the abandoned claims and delivers the rows.
    p.create_topic(&later, 1).await;
    let _second = p.spawn_run("second.log");
    wait_for("reaped rows delivered", Duration::from_secs(60), || async {
        let rows = p.rows().await;
        rows.values().all(|r| r.status == "SUCCESS").then_some(())
    })
    .await;
    for row in p.rows().await.values() {
        assert!(
            row.retry_count >= 2,
            "the abandoned attempt was counted: {row:?}"
        );
    }
    let records = consume_all(&p.services.kafka, &later, 1, 3, Duration::from_secs(30));
    let ids: std::collections::HashSet<&str> = records
        .iter()
        .map(|r| r.headers["message_id"].as_str())
        .collect();
    assert_eq!(ids.len(), 3);
    p.cleanup().await;
}

/// Issue 10, case 4: a standby that takes over finds the FAILED row the dead instance
/// left, and delivers it once its topic exists, with no new event and no operator. Its
/// claim worker learned nothing of that row (the failure woke the first instance's
/// worker, and PostgreSQL's default is to sleep until woken), so only the takeover
/// itself can tell it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_takes_over_retries_the_failed_rows_the_dead_instance_left() {
    let extra = FAST_FAILURES.replace("idle_check = \"1s\"\n", "").replace(
        "[kafka.options]",
        "[kafka.options]\n\"topic.metadata.propagation.max.ms\" = \"2000\"",
    );
    let p = TestPipeline::new("takeover", 1, &extra).await;
    p.init();
    let mut first = p.spawn_run("first.log");
    wait_for(
        "the first instance to stream",
        Duration::from_secs(30),
        || async { first.log_text().contains("streaming").then_some(()) },
    )
    .await;
    let standby = p.spawn_run("standby.log");
    // The standby's claim worker has had its first look (nothing FAILED yet) and sleeps.
    wait_for("the standby to wait", Duration::from_secs(30), || async {
        standby.log_text().contains("retrying").then_some(())
    })
    .await;

    let client = p.sql().await;
    let missing = format!("{}.later", p.topic);
    insert(&p, &client, "t-1", "acct", 1, Some(&missing), 10).await;
    let written: String = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("lsn")
        .get(0);
    wait_for(
        "the first instance to fail the row",
        Duration::from_secs(60),
        || async { (p.rows().await.get("t-1")?.status == "FAILED").then_some(()) },
    )
    .await;
    // The slot is confirmed past the row, so the standby will not read it from the log.
    let slot = format!("outboxd_{}", p.name);
    wait_for(
        "the slot to pass the row",
        Duration::from_secs(60),
        || async {
            let past: Option<bool> = client
                .query_one(
                    "SELECT confirmed_flush_lsn >= $2::text::pg_lsn FROM pg_replication_slots \
                 WHERE slot_name = $1",
                    &[&slot, &written],
                )
                .await
                .ok()?
                .get(0);
            past.filter(|past| *past)
        },
    )
    .await;

    first.kill9();
    wait_for(
        "the standby to take over",
        Duration::from_secs(60),
        || async { standby.log_text().contains("streaming").then_some(()) },
    )
    .await;
    p.create_topic(&missing, 1).await;
    wait_for(
        "the standby to deliver the row the dead instance failed",
        Duration::from_secs(60),
        || async { (p.rows().await.get("t-1")?.status == "SUCCESS").then_some(()) },
    )
    .await;
    let records = consume_all(&p.services.kafka, &missing, 1, 1, Duration::from_secs(30));
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].headers["message_id"], "t-1");
    drop(standby);
    p.cleanup().await;
}

/// Issue 10, case 8: `recover` keeps strict per-key order. A key whose earlier event
/// waits for an operator (MANUAL_REQUIRED) keeps its later INIT rows back: they are
/// parked (FAILED, due, `last_error` says why), not sent ahead of it; other keys go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_parks_rows_behind_an_earlier_undelivered_event_of_their_key() {
    let p = TestPipeline::new("recoverorder", 1, FAST_FAILURES).await;
    p.init();
    let client = p.sql().await;
    let slot = format!("outboxd_{}", p.name);
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await
        .expect("drop slot");
    insert(&p, &client, "held-1", "held", 1, None, 10).await;
    insert(&p, &client, "held-2", "held", 2, None, 10).await;
    insert(&p, &client, "free-1", "free", 1, None, 10).await;
    insert(&p, &client, "held-3", "held", 3, None, 10).await;
    client
        .execute(
            &format!(
                "UPDATE \"{}\" SET status = 'MANUAL_REQUIRED', retry_count = 10, \
                 next_retry_time = now(), last_error = 'broker said no' \
                 WHERE message_id = 'held-1'",
                p.table
            ),
            &[],
        )
        .await
        .expect("an event waiting for an operator");

    let recovered = p.outboxd(&["recover"]);
    let out = String::from_utf8_lossy(&recovered.stdout);
    assert!(
        recovered.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&recovered.stderr)
    );
    let rows = p.rows().await;
    assert_eq!(rows["free-1"].status, "SUCCESS", "{out}");
    for id in ["held-2", "held-3"] {
        let row = &rows[id];
        assert_eq!(row.status, "FAILED", "{id} is parked, not sent: {row:?}");
        assert_eq!(row.retry_count, 0, "{id}: parking counts no attempt");
        assert!(
            row.last_error
                .as_deref()
                .unwrap_or_default()
                .contains("held"),
            "{id}: {row:?}"
        );
    }
    let records = consume_all(&p.services.kafka, &p.topic, 1, 1, Duration::from_secs(10));
    let sent: Vec<&str> = records
        .iter()
        .map(|r| r.headers["message_id"].as_str())
        .collect();
    assert_eq!(
        sent,
        ["free-1"],
        "nothing of the held key overtakes its earlier event"
    );
    p.cleanup().await;
}
