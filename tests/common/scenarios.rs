//! The end-to-end scenarios every source engine passes, written once over [`Engine`]:
//! `tests/<engine>_pipeline.rs` runs each as one `#[tokio::test]` beside its engine-only
//! cases. What differs between engines (SQL, checkpoint text, what the logs say) is the
//! engine's; what is asserted is the same for all.

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine as _;
use serde_json::json;

use super::engine::{Engine, Event, Pipeline, Writer};
use super::{
    consume_all, free_port, http_get, java_partition, metric_value, metrics_section, seqs_by_key,
    topic_exists, wait_for, Record,
};

/// Every seq `1..=per_key` of each of `keys` keys, first occurrences in per-key order (an
/// at-least-once replay may repeat a suffix of what was sent); returns the repeats.
pub fn assert_every_event_in_key_order(records: &[Record], keys: usize, per_key: u32) -> usize {
    let by_key = seqs_by_key(records);
    assert_eq!(by_key.len(), keys, "keys in Kafka");
    let mut duplicates = 0;
    for (key, seqs) in &by_key {
        let mut seen = Vec::new();
        for s in seqs {
            if seen.contains(s) {
                duplicates += 1;
            } else {
                seen.push(*s);
            }
        }
        let expected: Vec<u32> = (1..=per_key).collect();
        assert_eq!(
            seen, expected,
            "key {key}: every event, first occurrences in order"
        );
    }
    duplicates
}

/// Writer `w`'s transactions: its `keys` keys, `per_key` events each, in transactions of
/// 1 to 5 rows that interleave its keys.
fn interleaved_transactions(w: usize, keys: usize, per_key: u32) -> Vec<Vec<Event>> {
    let keys: Vec<String> = (0..keys).map(|k| format!("order-{w}-{k}")).collect();
    let mut seq = vec![0u32; keys.len()];
    let mut round = 0usize;
    let mut transactions = Vec::new();
    while seq.iter().any(|s| *s < per_key) {
        let mut tx = Vec::new();
        for _ in 0..=(round % 5) {
            let k = round % keys.len();
            round += 1;
            if seq[k] >= per_key {
                continue;
            }
            seq[k] += 1;
            tx.push((keys[k].clone(), seq[k]));
        }
        transactions.push(tx);
    }
    transactions
}

fn event(key: &str, seq: u32) -> Vec<Event> {
    vec![(key.to_owned(), seq)]
}

/// Concurrent writers: every event exactly once, in per-key order, on the partition Java's
/// default partitioner picks, with its headers; every row SUCCESS and saying where it
/// landed; the checkpoint written; a graceful stop exits 0.
pub async fn concurrent_writers_arrive_in_key_order_where_java_would_put_them<E: Engine>() {
    let p = Pipeline::<E>::new("conc", 3, "").await;
    p.init();
    let mut daemon = p.spawn_run("run.log");

    // 8 writers, each owning 5 keys and writing 25 events per key, in transactions of
    // 1 to 5 rows, interleaved with the other writers: 1,000 events.
    const WRITERS: usize = 8;
    const KEYS_PER_WRITER: usize = 5;
    const EVENTS_PER_KEY: u32 = 25;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let mut writer = p.writer().await;
        let transactions = interleaved_transactions(w, KEYS_PER_WRITER, EVENTS_PER_KEY);
        tasks.push(tokio::spawn(async move {
            for tx in transactions {
                writer.commit(&tx, "m").await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
    let total = WRITERS * KEYS_PER_WRITER * EVENTS_PER_KEY as usize;

    let records = p.consume(total, Duration::from_secs(60));
    assert!(
        daemon.is_running(),
        "outboxd exited:\n{}",
        daemon.log_text()
    );
    assert_eq!(
        records.len(),
        total,
        "every event exactly once in a clean run"
    );
    for r in &records {
        assert_eq!(
            r.partition,
            java_partition(&r.key, p.partitions),
            "key {} partition",
            r.key
        );
        assert_eq!(r.headers.get("biz_key"), Some(&r.key));
        assert!(r.headers.contains_key("message_id") && r.headers.contains_key("created_at"));
        assert!(
            r.headers["created_at"].ends_with(E::CREATED_AT_SUFFIX),
            "{:?}",
            r.headers
        );
        assert!(r.headers["message_type"].starts_with("order.step"));
        assert!(
            r.payload.contains(&format!("\"key\": \"{}\"", r.key)),
            "payload {}",
            r.payload
        );
    }
    let duplicates =
        assert_every_event_in_key_order(&records, WRITERS * KEYS_PER_WRITER, EVENTS_PER_KEY);
    assert_eq!(duplicates, 0);

    // Every row SUCCESS, with where it landed.
    let counts = wait_for("all rows SUCCESS", Duration::from_secs(30), || async {
        let counts = p.status_counts().await;
        (counts.get("SUCCESS").copied() == Some(total as i64)).then_some(counts)
    })
    .await;
    assert_eq!(counts.len(), 1, "{counts:?}");
    let landed: HashMap<(i32, i64), String> = p
        .landed()
        .await
        .into_iter()
        .map(|(partition, offset, id, sent)| {
            assert!(sent, "sent_at set");
            ((partition, offset), id)
        })
        .collect();
    for r in &records {
        assert_eq!(
            landed.get(&(r.partition, r.offset)),
            r.headers.get("message_id")
        );
    }

    let checkpoint = p.checkpoint().await.expect("checkpoint row");
    assert!(checkpoint.starts_with(E::CHECKPOINT_PREFIX), "{checkpoint}");
    assert!(
        daemon.terminate().success(),
        "graceful stop exits 0:\n{}",
        daemon.log_text()
    );
    p.cleanup().await;
}

/// A rolled-back transaction publishes nothing.
pub async fn rolled_back_transactions_publish_nothing<E: Engine>() {
    let p = Pipeline::<E>::new("rollback", 1, "").await;
    p.init();
    let _daemon = p.spawn_run("run.log");
    let mut writer = p.writer().await;
    let ghosts: Vec<Event> = (1..=3).map(|seq| (format!("ghost-{seq}"), seq)).collect();
    writer.roll_back(&ghosts, "rolled").await;
    // A committed marker after the rolled-back work: once it arrives, anything the
    // rolled-back transaction could have produced would have arrived before it.
    writer.commit(&event("marker", 1), "committed").await;

    let records = p.consume(1, Duration::from_secs(30));
    let keys: Vec<&str> = records.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["marker"], "only the committed event");
    p.cleanup().await;
}

/// `kill -9` while rows flow, then a restart: every committed event reaches Kafka, first
/// occurrences in per-key order; the duplicates of the replay are counted and printed.
pub async fn kill_9_mid_stream_loses_nothing<E: Engine>() {
    let p = Pipeline::<E>::new("kill", 3, "").await;
    p.init();
    let mut daemon = p.spawn_run("run-1.log");

    // Write continuously; kill outboxd while rows are flowing; restart it.
    const KEYS: u32 = 10;
    const PER_KEY: u32 = 60;
    let writer = {
        let mut writer = p.writer().await;
        tokio::spawn(async move {
            for seq in 1..=PER_KEY {
                for k in 0..KEYS {
                    writer.commit(&event(&format!("acct-{k}"), seq), "k").await;
                }
                // Pacing, so that the kill lands mid-stream.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    wait_for(
        "some rows published before the kill",
        Duration::from_secs(30),
        || async { (p.success_count().await >= 100).then_some(()) },
    )
    .await;
    daemon.kill9();
    let restarted = p.spawn_run("run-2.log");
    writer.await.expect("writer");
    let total = (KEYS * PER_KEY) as usize;

    wait_for(
        "all rows SUCCESS after the restart",
        Duration::from_secs(60),
        || async { (p.success_count().await == total as i64).then_some(()) },
    )
    .await;
    let records = p.consume(total, Duration::from_secs(60));
    let duplicates = assert_every_event_in_key_order(&records, KEYS as usize, PER_KEY);
    println!(
        "{} kill -9 test: {total} events committed, {} records in Kafka, {duplicates} \
         duplicates after the restart",
        E::NAME,
        records.len()
    );
    drop(restarted);
    p.cleanup().await;
}

/// Issue 14, item 3: `kill -9` in the middle of one large transaction, then a restart.
/// The transaction is read again from its start (the checkpoint cannot pass it until its
/// last row is written back), but the rows the table already shows SUCCESS are not sent
/// again: the duplicates are at most what Kafka had acknowledged and the table did not yet
/// say. Before, every row of the transaction was sent again.
pub async fn a_large_transaction_read_again_is_not_sent_again<E: Engine>() {
    const ROWS: u32 = 40_000;
    let p = Pipeline::<E>::new("again", 1, "").await;
    p.init();
    let mut daemon = p.spawn_run("run-1.log");
    let events: Vec<Event> = (1..=ROWS)
        .map(|seq| (format!("k{}", seq % 50), seq))
        .collect();
    p.writer().await.commit(&events, "again").await;
    let success_at_kill = wait_for(
        "part of the transaction written back",
        Duration::from_secs(60),
        || async {
            let done = p.success_count().await;
            (done >= i64::from(ROWS) / 2).then_some(done)
        },
    )
    .await;
    daemon.kill9();
    assert!(
        success_at_kill < i64::from(ROWS),
        "the kill landed after the whole transaction was written back; make it larger"
    );
    let sent_before = p.consume(1, Duration::from_secs(60)).len();

    let restarted = p.spawn_run("run-2.log");
    wait_for("every row SUCCESS", Duration::from_secs(120), || async {
        (p.success_count().await == i64::from(ROWS)).then_some(())
    })
    .await;
    let records = p.consume(ROWS as usize, Duration::from_secs(60));
    let mut ids: Vec<&str> = records
        .iter()
        .filter_map(|r| r.headers.get("message_id").map(String::as_str))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), ROWS as usize, "every event in Kafka");
    let duplicates = records.len() - ROWS as usize;
    println!(
        "{} large transaction read again: {sent_before} records sent before the kill, \
         {success_at_kill} rows SUCCESS at the kill, {duplicates} duplicates",
        E::NAME
    );
    assert!(
        duplicates as i64 <= sent_before as i64 - success_at_kill,
        "rows already SUCCESS were sent again: {duplicates} duplicates, {sent_before} sent \
         before the kill of which {success_at_kill} were written back"
    );
    drop(restarted);
    p.cleanup().await;
}

/// A second instance waits while the first holds the pipeline (the slot, the lock), says
/// so, and takes over once the first is killed.
pub async fn a_standby_waits_and_takes_over<E: Engine>() {
    let p = Pipeline::<E>::new("standby", 1, "").await;
    p.init();
    let mut writer = p.writer().await;
    let mut first = p.spawn_run("first.log");
    writer.commit(&event("k", 1), "a").await;
    wait_for("first event SUCCESS", Duration::from_secs(30), || async {
        (p.success_count().await == 1).then_some(())
    })
    .await;

    let mut second = p.spawn_run("second.log");
    wait_for(
        "the standby to report that the pipeline is held",
        Duration::from_secs(30),
        || async {
            let log = second.log_text();
            E::STANDBY_WAITING
                .iter()
                .all(|says| log.contains(says))
                .then_some(())
        },
    )
    .await;
    assert!(
        second.is_running(),
        "the standby keeps waiting:\n{}",
        second.log_text()
    );

    first.kill9();
    writer.commit(&event("k", 2), "b").await;
    wait_for(
        "the standby publishes after the takeover",
        Duration::from_secs(60),
        || async { (p.success_count().await == 2).then_some(()) },
    )
    .await;
    let records = p.consume(2, Duration::from_secs(30));
    let seqs = seqs_by_key(&records).remove("k").unwrap_or_default();
    assert!(seqs.starts_with(&[1]) && seqs.contains(&2), "{seqs:?}");
    drop(second);
    p.cleanup().await;
}

/// `check` fails before `init` with a fix for each failure; `init` twice is fine and the
/// second has nothing to do; then `check` passes and reports every item.
pub async fn check_reports_every_item_and_init_is_idempotent<E: Engine>() {
    let p = Pipeline::<E>::new("check", 1, "").await;
    let before = p.outboxd(&["check"]);
    let text = String::from_utf8_lossy(&before.stdout);
    assert_eq!(
        before.status.code(),
        Some(1),
        "check fails before init:\n{text}"
    );
    assert!(text.contains("fix:"), "failures carry their fix:\n{text}");

    p.init();
    let again = p.outboxd(&["init"]);
    let init_text = String::from_utf8_lossy(&again.stdout);
    assert!(again.status.success(), "{init_text}");
    assert!(init_text.contains("exists, nothing to do"), "{init_text}");
    let after = p.outboxd(&["check"]);
    let text = String::from_utf8_lossy(&after.stdout);
    println!("{text}");
    assert!(after.status.success(), "check passes after init:\n{text}");
    for item in E::CHECK_ITEMS.iter().chain(&["kafka"]) {
        assert!(text.contains(item), "{item} in:\n{text}");
    }
    p.cleanup().await;
}

/// Settings that make failures show up within seconds instead of minutes.
pub const FAST_FAILURES: &str = r#"
[kafka.options]
"allow.auto.create.topics" = "false"
"topic.metadata.refresh.interval.ms" = "1000"

[retry]
base = "300ms"
cap = "2s"
jitter = "100ms"
claim_timeout = "20s"
idle_check = "1s"
"#;

/// A record the broker rejects (too large) fails its row with the broker's error and
/// parks its key while other keys flow; once the topic allows it, the retry worker
/// delivers the key in order.
pub async fn a_rejected_record_fails_its_row_parks_its_key_and_is_delivered_in_order_later<
    E: Engine,
>() {
    let p = Pipeline::<E>::new("toolarge", 1, FAST_FAILURES).await;
    // The broker rejects records over 4 KB on this topic.
    let topic = format!("{}.small", p.topic);
    p.create_topic_with(&topic, 1, &[("max.message.bytes", "4096")])
        .await;
    p.init();
    let daemon = p.spawn_run("run.log");
    let mut writer = p.writer().await;

    writer
        .insert_padded("blocked-1", "blocked", 1, &topic, 8_000)
        .await;
    wait_for(
        "the oversized record to fail its row",
        Duration::from_secs(30),
        || async { (p.rows().await.get("blocked-1")?.status == "FAILED").then_some(()) },
    )
    .await;
    for seq in 2..=3 {
        let id = format!("blocked-{seq}");
        writer.insert_padded(&id, "blocked", seq, &topic, 10).await;
    }
    for seq in 1..=3 {
        let id = format!("free-{seq}");
        writer.insert_padded(&id, "free", seq, &topic, 10).await;
    }
    wait_for("the other key to flow", Duration::from_secs(30), || async {
        let rows = p.rows().await;
        let free_done = (1..=3).all(|s| rows[&format!("free-{s}")].status == "SUCCESS");
        free_done.then_some(())
    })
    .await;

    let rows = p.rows().await;
    let first = &rows["blocked-1"];
    let error = first.last_error.clone().unwrap_or_default();
    assert!(
        error.to_lowercase().contains("too large"),
        "the broker's error is kept: {error}"
    );
    assert!(first.retry_count >= 1);
    for seq in 2..=3 {
        let row = &rows[&format!("blocked-{seq}")];
        assert_ne!(
            row.status, "SUCCESS",
            "strict ordering holds back blocked-{seq}"
        );
        let why = row.last_error.clone().unwrap_or_default();
        assert!(why.contains("parked"), "parked rows say why: {why}");
    }

    // The operator raises the limit; the retry worker delivers the key in order.
    p.alter_topic(&topic, "max.message.bytes", "1048576").await;
    wait_for("every row SUCCESS", Duration::from_secs(60), || async {
        let rows = p.rows().await;
        rows.values().all(|r| r.status == "SUCCESS").then_some(())
    })
    .await;
    let records = consume_all(p.services.kafka(), &topic, 1, 6, Duration::from_secs(30));
    let by_key = seqs_by_key(&records);
    assert_eq!(by_key["free"], [1, 2, 3]);
    assert_eq!(
        by_key["blocked"],
        [1, 2, 3],
        "the blocked key keeps its order"
    );
    drop(daemon);
    p.cleanup().await;
}

/// Issue 10, case 7: a row that cannot be published (here a NULL `message_type`, which a
/// user's own schema may allow) does not stop `run`: it becomes MANUAL_REQUIRED with the
/// reason, the next event of its key is parked behind it, other keys flow, and the relay
/// goes on. Before, `run` exited and met the same row again after every restart.
pub async fn a_row_that_cannot_be_published_needs_an_operator_and_the_relay_goes_on<E: Engine>() {
    let p = Pipeline::<E>::new("badrow", 1, FAST_FAILURES).await;
    p.init();
    E::execute(&p, &E::NULLABLE_MESSAGE_TYPE.replace("{table}", &p.table)).await;
    let mut daemon = p.spawn_run("run.log");
    E::execute(
        &p,
        &format!(
            "INSERT INTO {} (message_id, message_type, biz_key, payload) \
             VALUES ('bad-1', NULL, 'held', '{{}}')",
            p.table
        ),
    )
    .await;
    let mut writer = p.writer().await;
    writer.commit(&event("held", 2), "after").await;
    writer.commit(&event("free", 1), "other").await;
    wait_for(
        "the rows to be written back",
        Duration::from_secs(60),
        || async {
            let rows = p.rows().await;
            let done = rows.get("bad-1")?.status == "MANUAL_REQUIRED"
                && rows.values().filter(|r| r.status == "SUCCESS").count() == 1
                && rows.values().filter(|r| r.status == "FAILED").count() == 1;
            done.then_some(rows)
        },
    )
    .await;
    let rows = p.rows().await;
    let bad = &rows["bad-1"];
    assert_eq!(bad.retry_count, 0);
    let reason = bad.last_error.as_deref().unwrap_or_default();
    assert!(reason.contains("`message_type` is NULL"), "{reason}");
    assert!(daemon.is_running(), "run goes on:\n{}", daemon.log_text());
    let records = p.consume(1, Duration::from_secs(10));
    let keys: Vec<&str> = records
        .iter()
        .map(|r| r.headers["biz_key"].as_str())
        .collect();
    assert_eq!(keys, ["free"], "nothing of the held key is sent");
    p.cleanup().await;
}

/// Issue 10, case 8: an operator parks an INIT row that the running relay has not read yet
/// (here the relay is held by a lock on its checkpoint row, as a slow write-back would hold
/// it). The relay must not send it, nor the later event of its key; other keys flow; once
/// the operator retries the row, the key's events arrive in order. Before, the parked row's
/// key was blocked in the table only, and the relay sent both events.
pub async fn a_row_parked_while_the_relay_runs_holds_its_key<E: Engine>() {
    let port = free_port();
    let extra = format!("{FAST_FAILURES}{}", metrics_section(port));
    let p = Pipeline::<E>::new("opark", 1, &extra).await;
    p.init();
    let daemon = p.spawn_run("run.log");
    let mut writer = p.writer().await;
    writer.commit(&event("other", 1), "opark").await;
    wait_for("the first row SUCCESS", Duration::from_secs(30), || async {
        (p.rows().await.get("opark-other-1")?.status == "SUCCESS").then_some(())
    })
    .await;

    // Hold the relay: its next write-back waits for the checkpoint row.
    let lock = p.hold_checkpoint_row().await;
    writer.commit(&event("other", 2), "opark").await;
    assert_eq!(
        p.consume(2, Duration::from_secs(30)).len(),
        2,
        "other-2 sent"
    );
    // The write-back of other-2 now waits (shown on /metrics while it lasts); what
    // follows is not read until it commits.
    let waited = wait_for(
        "the write-back wait on /metrics",
        Duration::from_secs(10),
        || async {
            let (_, body) = http_get(port, "/metrics").await?;
            metric_value(&body, "outboxd_writeback_wait_seconds", "").filter(|s| *s > 0.2)
        },
    )
    .await;
    assert!(waited > 0.2);
    writer.commit(&event("k", 1), "opark").await;
    writer.commit(&event("k", 2), "opark").await;
    writer.commit(&event("other", 3), "opark").await;
    let parked = p.row_id("opark-k-1").await.to_string();
    let out = p.outboxd(&["park", "--id", &parked, "--reason", "hold the order"]);
    assert!(out.status.success(), "park: {out:?}");
    // Past the relay's refresh period (a duration the relay must let pass, not an
    // event to wait for), then release it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(lock);

    wait_for("the other key to flow", Duration::from_secs(30), || async {
        (p.rows().await.get("opark-other-3")?.status == "SUCCESS").then_some(())
    })
    .await;
    let rows = p.rows().await;
    assert_eq!(rows["opark-k-1"].status, "MANUAL_REQUIRED");
    let later = &rows["opark-k-2"];
    assert_ne!(later.status, "SUCCESS", "k-2 waits behind the parked k-1");
    let why = later.last_error.clone().unwrap_or_default();
    assert!(why.contains("parked"), "the parked row says why: {why}");
    let records = p.consume(3, Duration::from_secs(30));
    assert!(
        records.iter().all(|r| r.key != "k"),
        "nothing of the parked key was sent"
    );

    // The operator lets the key go: both events, in order.
    let out = p.outboxd(&["retry", "--id", &parked]);
    assert!(out.status.success(), "retry: {out:?}");
    wait_for("every row SUCCESS", Duration::from_secs(60), || async {
        let rows = p.rows().await;
        rows.values().all(|r| r.status == "SUCCESS").then_some(())
    })
    .await;
    let records = p.consume(5, Duration::from_secs(30));
    assert_eq!(
        seqs_by_key(&records)["k"],
        [1, 2],
        "the parked key in order"
    );
    drop(daemon);
    p.cleanup().await;
}

/// Issue 12: a row routed to a topic outside `kafka.allowed_topics` is never sent (no topic
/// is created for it): it becomes MANUAL_REQUIRED with the reason, its key waits behind it,
/// and other rows flow.
pub async fn a_topic_outside_the_allowed_list_is_never_written<E: Engine>() {
    let p = Pipeline::<E>::new("allowed", 1, "").await;
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let config = config.replace(
        "message_timeout = \"10s\"",
        &format!(
            "message_timeout = \"10s\"\nallowed_topics = [\"{}\", \"it.allowed.*\"]",
            p.topic
        ),
    );
    std::fs::write(&p.config_path, config).expect("write config");
    p.init();
    let daemon = p.spawn_run("run.log");
    let forbidden = format!("it.forbidden.{}", p.name);
    let allowed = format!("it.allowed.{}", p.name);
    p.create_topic(&allowed, 1).await;
    let mut writer = p.writer().await;
    writer
        .insert_padded("allowed-k-1", "k", 1, &forbidden, 10)
        .await;
    writer
        .insert_padded("allowed-k-2", "k", 2, &allowed, 10)
        .await;
    writer
        .insert_padded("allowed-j-1", "j", 1, &allowed, 10)
        .await;
    writer.commit(&event("j", 2), "allowed").await;

    wait_for(
        "the other rows delivered",
        Duration::from_secs(30),
        || async {
            let rows = p.rows().await;
            let done = ["allowed-j-1", "allowed-j-2"]
                .iter()
                .all(|id| rows.get(*id).is_some_and(|r| r.status == "SUCCESS"));
            (done && rows.get("allowed-k-2")?.status != "INIT").then_some(())
        },
    )
    .await;
    let rows = p.rows().await;
    let refused = &rows["allowed-k-1"];
    assert_eq!(refused.status, "MANUAL_REQUIRED");
    let why = refused.last_error.clone().unwrap_or_default();
    assert!(
        why.contains(&forbidden) && why.contains("kafka.allowed_topics"),
        "the reason names the topic and the key: {why}"
    );
    assert_ne!(
        rows["allowed-k-2"].status, "SUCCESS",
        "k-2 waits behind k-1"
    );
    assert!(
        !topic_exists(p.services.kafka(), &forbidden),
        "no topic was created for the refused row"
    );
    drop(daemon);
    p.cleanup().await;
}

/// The positions topics (`outboxd-positions-*`) and Kafka's internal topics (`__*`) are
/// never a row's destination, whatever `kafka.allowed_topics` allows (here `*`): under
/// exactly-once, where a record in a positions topic or a refused write to an internal
/// topic would break the pipeline's transactions, the two rows routed there become
/// MANUAL_REQUIRED with the reason and are never sent; the rows around them are delivered
/// and the relay keeps streaming.
pub async fn reserved_topics_are_never_written<E: Engine>() {
    let extra = "[delivery]\nexactly_once = true\ntransaction_interval = \"50ms\"\n";
    let p = Pipeline::<E>::new("reserved", 1, extra).await;
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let config = config.replace(
        "message_timeout = \"10s\"",
        "message_timeout = \"10s\"\nallowed_topics = [\"*\"]",
    );
    std::fs::write(&p.config_path, config).expect("write config");
    p.init();
    let daemon = p.spawn_run("run.log");
    // Named after the pipeline so that the topic's absence below means this run wrote
    // nothing there (Kafka's data outlives the services between runs).
    let positions = format!("outboxd-positions-x_{}", p.name);
    let internal = "__consumer_offsets";
    let mut writer = p.writer().await;
    writer.commit(&event("good", 1), "reserved").await;
    writer
        .insert_padded("reserved-pos-1", "pos", 1, &positions, 10)
        .await;
    writer
        .insert_padded("reserved-int-1", "int", 1, internal, 10)
        .await;
    writer.commit(&event("good", 2), "reserved").await;

    let refused_and_delivered = || async {
        let rows = p.rows().await;
        let delivered = ["reserved-good-1", "reserved-good-2"]
            .iter()
            .all(|id| rows.get(*id).is_some_and(|r| r.status == "SUCCESS"));
        let decided = ["reserved-pos-1", "reserved-int-1"]
            .iter()
            .all(|id| rows.get(*id).is_some_and(|r| r.status != "INIT"));
        (delivered && decided).then_some(())
    };
    wait_for(
        "the good rows delivered and the reserved ones decided",
        Duration::from_secs(60),
        refused_and_delivered,
    )
    .await;
    let rows = p.rows().await;
    for (id, topic) in [
        ("reserved-pos-1", positions.as_str()),
        ("reserved-int-1", internal),
    ] {
        let row = &rows[id];
        let why = row.last_error.clone().unwrap_or_default();
        assert_eq!(row.status, "MANUAL_REQUIRED", "{id}: {why}");
        assert!(
            why.contains(&format!("`{topic}`")) && why.contains("never sent"),
            "{id}: the reason names the topic: {why}"
        );
    }
    assert!(
        !topic_exists(p.services.kafka(), &positions),
        "no topic was created for the row routed to {positions}"
    );

    // The relay streams on: a later row is delivered, and a read_committed consumer sees
    // exactly the good rows, committed.
    writer.commit(&event("good", 3), "reserved").await;
    wait_for(
        "the later row delivered",
        Duration::from_secs(60),
        || async {
            let rows = p.rows().await;
            (rows.get("reserved-good-3")?.status == "SUCCESS").then_some(())
        },
    )
    .await;
    let records = p.consume(3, Duration::from_secs(30));
    assert_eq!(seqs_by_key(&records)["good"], [1, 2, 3], "{records:?}");
    assert_eq!(records.len(), 3, "only the good rows reach the topic");
    drop(daemon);
    p.cleanup().await;
}

/// Issue 13: `outboxd schema` prints the DDL `init` runs; applied by hand (as a migration
/// tool would), it is exactly what `init` and `check` expect: `init` then finds every
/// table, index (and on PostgreSQL the publication) in place, and `check` passes.
pub async fn the_schema_command_prints_what_init_and_check_expect<E: Engine>() {
    let p = Pipeline::<E>::new("schema", 1, "").await;
    // An inbox of its own: the script creates everything, as a migration of a new
    // service would (the shared test inbox belongs to another role).
    let inbox = format!("{}_in", p.table);
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let config = config.replace(
        "checkpoint_table = \"outboxd_checkpoint\"",
        &format!("checkpoint_table = \"outboxd_checkpoint\"\ninbox_table = \"{inbox}\""),
    );
    std::fs::write(&p.config_path, config).expect("write config");
    let out = p.outboxd(&["schema"]);
    assert!(out.status.success(), "schema: {out:?}");
    let script = String::from_utf8(out.stdout).expect("UTF-8 script");
    assert!(
        script.contains(&p.table),
        "the configured outbox name: {script}"
    );
    E::execute_as_admin(&p, &script).await;

    let out = p.outboxd(&["init"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "init after the script: {out:?}");
    assert!(
        !said.contains("created table") && !said.contains("created index"),
        "every table and index came from the script: {said}"
    );
    assert!(
        said.contains(&format!("table {}: exists, nothing to do", p.table)),
        "{said}"
    );
    if script.contains("CREATE PUBLICATION") {
        assert!(
            said.contains("publication") && said.contains("exists, nothing to do"),
            "{said}"
        );
    }
    let out = p.outboxd(&["check"]);
    assert!(
        out.status.success(),
        "check accepts tables made by the script: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    E::execute(&p, &format!("DROP TABLE IF EXISTS {inbox}")).await;
    p.cleanup().await;
}

/// Issue 12: `check` names a table privilege the runtime role lacks (with the GRANT that
/// fixes it), instead of passing and leaving `run` to fail at its first write-back.
pub async fn check_names_a_missing_table_grant<E: Engine>() {
    let p = Pipeline::<E>::new("grants", 1, "").await;
    p.init();
    let out = p.outboxd(&["check"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "check with every grant: {said}");
    assert!(said.contains("table grants"), "{said}");
    E::revoke_outbox_update(&p).await;
    let out = p.outboxd(&["check"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!out.status.success(), "check must fail: {said}");
    let line = said
        .lines()
        .find(|l| l.contains("table grants"))
        .unwrap_or_default();
    assert!(
        line.contains("FAIL") && line.contains("UPDATE") && line.contains(&p.table),
        "the missing grant is named: {said}"
    );
    assert!(said.contains("GRANT UPDATE ON"), "with the fix: {said}");
    p.cleanup().await;
}

/// Issue 13: with `[kafka.cloudevents]`, a consumer reads every CloudEvents attribute of
/// the binary content mode back, beside outboxd's own headers; the row's `traceparent` and
/// `tracestate` arrive unchanged (an invalid `traceparent` too: it is the application's
/// data); a row header named like an attribute outboxd writes arrives as `row-<name>`, an
/// extension attribute as written, and a row's `content-type` sets the event's.
pub async fn cloudevents_and_trace_context_reach_the_consumer<E: Engine>() {
    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const TRACESTATE: &str = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";
    let collector = OtlpCollector::start().await;
    let extra = format!(
        "[kafka.cloudevents]\nsource = \"urn:example:orders\"\n\n[otlp]\n\
         endpoint = \"http://127.0.0.1:{}\"\ntimeout = \"2s\"\n",
        collector.port
    );
    let p = Pipeline::<E>::new("cloudevents", 1, &extra).await;
    p.init();
    let daemon = p.spawn_run("run.log");
    let insert = |message_id: &str, biz_key: &str, headers: &str| {
        format!(
            "INSERT INTO {} (message_id, message_type, biz_key, payload, headers) \
             VALUES ('{message_id}', 'order.created', '{biz_key}', '{{\"total\": 12}}', \
             '{headers}')",
            p.table
        )
    };
    let traced = format!(
        r#"{{"traceparent": "{TRACEPARENT}", "tracestate": "{TRACESTATE}", "ce_type": "forged", "ce_tenant": "acme"}}"#
    );
    E::execute(&p, &insert("ce-traced", "order-1", &traced)).await;
    let odd = r#"{"traceparent": "00-not-a-trace", "Content-Type": "application/vnd.orders+json"}"#;
    E::execute(&p, &insert("ce-odd", "order-2", odd)).await;
    // One through the writer every scenario uses: its own headers, no trace context.
    p.writer().await.commit(&event("order-3", 1), "ce").await;

    let records = p.consume(3, Duration::from_secs(60));
    assert_eq!(records.len(), 3, "{records:?}");
    let by_id: HashMap<&str, &HashMap<String, String>> = records
        .iter()
        .map(|r| (r.headers["ce_id"].as_str(), &r.headers))
        .collect();
    for (id, biz_key, message_type) in [
        ("ce-traced", "order-1", "order.created"),
        ("ce-odd", "order-2", "order.created"),
        ("ce-order-3-1", "order-3", "order.step1"),
    ] {
        let h = by_id
            .get(id)
            .unwrap_or_else(|| panic!("{id} in {records:?}"));
        assert_eq!(h["ce_specversion"], "1.0", "{id}");
        assert_eq!(h["message_id"], id, "{id}: outboxd's own headers stay");
        assert_eq!(h["ce_source"], "urn:example:orders", "{id}");
        assert_eq!(h["ce_type"], message_type, "{id}");
        assert_eq!(h["message_type"], message_type, "{id}");
        assert_eq!(h["ce_subject"], biz_key, "{id}");
        // ce_time: RFC 3339 in UTC, the instant of created_at (as the engine renders it).
        let ce_time = &h["ce_time"];
        assert!(ce_time.ends_with('Z'), "{id}: {ce_time}");
        let time: jiff::Timestamp = ce_time.parse().expect("ce_time");
        let created: jiff::Timestamp = h["created_at"].parse().expect("created_at");
        assert_eq!(time, created, "{id}: {ce_time} vs {}", h["created_at"]);
        let age = jiff::Timestamp::now().duration_since(time);
        assert!(age.as_secs() < 600, "{id}: ce_time {ce_time} is now");
    }
    let traced = by_id["ce-traced"];
    assert_eq!(traced["traceparent"], TRACEPARENT);
    assert_eq!(traced["tracestate"], TRACESTATE);
    assert_eq!(traced["content-type"], "application/json");
    assert_eq!(
        traced["row-ce_type"], "forged",
        "the row cannot replace ce_type"
    );
    assert_eq!(traced["ce_tenant"], "acme", "an extension attribute passes");
    let odd = by_id["ce-odd"];
    assert_eq!(odd["traceparent"], "00-not-a-trace", "passed on as written");
    assert_eq!(odd["content-type"], "application/vnd.orders+json");
    assert!(
        !odd.contains_key("Content-Type"),
        "one content type: {odd:?}"
    );
    let plain = by_id["ce-order-3-1"];
    assert_eq!(plain["content-type"], "application/json");
    assert_eq!(plain["seq"], "1");
    assert!(!plain.contains_key("traceparent"));

    wait_for("every row SUCCESS", Duration::from_secs(30), || async {
        (p.success_count().await == 3).then_some(())
    })
    .await;

    // The log relay's path: the traced event's span covers its send and acknowledgement,
    // in the log and at the collector; the others have none.
    let log = without_ansi_colors(&daemon.log_text());
    let acknowledged: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("acknowledged by Kafka"))
        .collect();
    assert_eq!(acknowledged.len(), 1, "{log}");
    assert!(
        acknowledged[0].contains("message_id=ce-traced")
            && acknowledged[0].contains("trace_id=4bf92f3577b34da6a3ce929d0e0e4736"),
        "{log}"
    );
    let (_, span) = wait_for("the span exported", Duration::from_secs(15), || async {
        collector.spans().into_iter().next()
    })
    .await;
    assert_eq!(
        span["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736",
        "{span}"
    );
    assert_eq!(span["parentSpanId"], "00f067aa0ba902b7", "{span}");
    assert!(span.to_string().contains("\"ce-traced\""), "{span}");
    assert_eq!(collector.spans().len(), 1, "{:?}", collector.spans());
    drop(daemon);
    p.cleanup().await;
}

/// Issue 13: with `kafka.cloudevents.mode = "structured"` a consumer reads each event as
/// one CloudEvents JSON document: attributes as members (an extension from a `ce_` row
/// header), JSON data embedded as JSON, other content as `data_base64`; the record's
/// `content-type` says `application/cloudevents+json`, outboxd's own headers stay, and a
/// row header named like an attribute cannot pose as one.
pub async fn cloudevents_structured_mode_puts_the_event_in_the_value<E: Engine>() {
    let extra = "[kafka.cloudevents]\nmode = \"structured\"\nsource = \"urn:example:orders\"\n";
    let p = Pipeline::<E>::new("ce_structured", 1, extra).await;
    p.init();
    let daemon = p.spawn_run("run.log");
    let insert = |message_id: &str, headers: &str| {
        format!(
            "INSERT INTO {} (message_id, message_type, biz_key, payload, headers) \
             VALUES ('{message_id}', 'order.created', 'key-{message_id}', \
             '{{\"total\": 12}}', '{headers}')",
            p.table
        )
    };
    E::execute(
        &p,
        &insert(
            "ce-json",
            r#"{"ce_tenant": "acme", "ce_type": "forged", "traceparent": "00-x"}"#,
        ),
    )
    .await;
    E::execute(
        &p,
        &insert(
            "ce-bytes",
            r#"{"content-type": "application/octet-stream"}"#,
        ),
    )
    .await;

    let records = p.consume(2, Duration::from_secs(60));
    assert_eq!(records.len(), 2, "{records:?}");
    let by_id: HashMap<&str, &Record> = records
        .iter()
        .map(|r| (r.headers["message_id"].as_str(), r))
        .collect();
    let json = by_id["ce-json"];
    assert_eq!(
        json.headers["content-type"],
        "application/cloudevents+json; charset=UTF-8"
    );
    assert_eq!(json.key, "key-ce-json");
    assert_eq!(json.headers["traceparent"], "00-x");
    assert_eq!(json.headers["row-ce_type"], "forged");
    assert!(!json.headers.contains_key("ce_id"), "{:?}", json.headers);
    assert!(
        !json.headers.contains_key("ce_tenant"),
        "{:?}",
        json.headers
    );
    let event: serde_json::Value = serde_json::from_str(&json.payload).expect("a JSON event");
    assert_eq!(event["specversion"], "1.0");
    assert_eq!(event["id"], "ce-json");
    assert_eq!(event["source"], "urn:example:orders");
    assert_eq!(event["type"], "order.created");
    assert_eq!(event["subject"], "key-ce-json");
    assert_eq!(event["datacontenttype"], "application/json");
    assert_eq!(event["tenant"], "acme");
    assert_eq!(event["data"], serde_json::json!({"total": 12}), "{event}");
    let time: jiff::Timestamp = event["time"]
        .as_str()
        .expect("time")
        .parse()
        .expect("RFC 3339");
    let created: jiff::Timestamp = json.headers["created_at"].parse().expect("created_at");
    assert_eq!(time, created);

    let bytes = by_id["ce-bytes"];
    let event: serde_json::Value = serde_json::from_str(&bytes.payload).expect("a JSON event");
    assert_eq!(event["datacontenttype"], "application/octet-stream");
    assert!(event.get("data").is_none(), "{event}");
    let stored = base64::engine::general_purpose::STANDARD
        .decode(event["data_base64"].as_str().expect("data_base64"))
        .expect("base64");
    let stored: serde_json::Value = serde_json::from_slice(&stored).expect("the stored JSON");
    assert_eq!(stored, serde_json::json!({"total": 12}));
    assert_eq!(
        bytes.headers["content-type"], "application/cloudevents+json; charset=UTF-8",
        "the row's content type is the event's, not the record's"
    );

    wait_for("every row SUCCESS", Duration::from_secs(30), || async {
        (p.success_count().await == 2).then_some(())
    })
    .await;
    drop(daemon);
    p.cleanup().await;
}

/// Issue 13: outboxd's span for an event carries the trace id of the row's `traceparent`:
/// in poll mode (the claim worker's path), the log line of each delivery names it, and
/// with `[otlp]` the span reaches the collector as a child of the application's span; a
/// row with an invalid `traceparent` is delivered all the same, its line without a trace
/// id, its span not exported.
pub async fn the_events_span_carries_the_trace_id_of_its_traceparent<E: Engine>() {
    let collector = OtlpCollector::start().await;
    let extra = format!(
        "\n[poll]\ninterval = \"100ms\"\n\n[otlp]\nendpoint = \"http://127.0.0.1:{}\"\n\
         service_name = \"orders-relay\"\ntimeout = \"2s\"\n",
        collector.port
    );
    let p = Pipeline::<E>::new("tracespan", 1, &extra).await;
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    assert!(config.contains("[source]\n"), "{config}");
    let config = config.replacen("[source]\n", "[source]\nmode = \"poll\"\n", 1);
    std::fs::write(&p.config_path, config).expect("write config");
    p.init();
    let daemon = p.spawn_run("run.log");
    let insert = |message_id: &str, traceparent: &str| {
        format!(
            "INSERT INTO {} (message_id, message_type, biz_key, payload, headers) \
             VALUES ('{message_id}', 'order.{message_id}', 'k', '{{}}', \
             '{{\"traceparent\": \"{traceparent}\"}}')",
            p.table
        )
    };
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    E::execute(&p, &insert("traced", traceparent)).await;
    E::execute(
        &p,
        &insert("untraced", "00-4bf92f3577b34da6a3ce929d0e0e4736"),
    )
    .await;
    wait_for("both rows SUCCESS", Duration::from_secs(30), || async {
        (p.success_count().await == 2).then_some(())
    })
    .await;
    let log = wait_for(
        "both deliveries logged",
        Duration::from_secs(10),
        || async {
            let log = without_ansi_colors(&daemon.log_text());
            let lines = log.lines().filter(|l| l.contains("delivered")).count();
            (lines >= 2).then_some(log)
        },
    )
    .await;
    let delivered = |message_id: &str| {
        log.lines()
            .find(|l| l.contains("delivered") && l.contains(&format!("message_id={message_id}")))
            .unwrap_or_else(|| panic!("no delivery line of {message_id} in:\n{log}"))
            .to_owned()
    };
    let traced = delivered("traced");
    assert!(
        traced.contains("trace_id=4bf92f3577b34da6a3ce929d0e0e4736")
            && traced.contains("parent_span_id=00f067aa0ba902b7"),
        "{traced}"
    );
    let untraced = delivered("untraced");
    assert!(!untraced.contains("trace_id="), "{untraced}");
    // The collector got the traced event's span, in the application's trace.
    let span = wait_for("the span exported", Duration::from_secs(15), || async {
        collector.spans().into_iter().find(|(_, span)| {
            span["attributes"].as_array().is_some_and(|a| {
                a.contains(&json!({"key": "message_id", "value": {"stringValue": "traced"}}))
            })
        })
    })
    .await;
    let (resource, span) = span;
    assert_eq!(
        span["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736",
        "{span}"
    );
    assert_eq!(span["parentSpanId"], "00f067aa0ba902b7", "{span}");
    assert_eq!(span["name"], "event", "{span}");
    assert_eq!(span["spanId"].as_str().map(str::len), Some(16), "{span}");
    assert_eq!(
        resource["attributes"][0],
        json!({"key": "service.name", "value": {"stringValue": "orders-relay"}})
    );
    let untraced = collector
        .spans()
        .into_iter()
        .find(|(_, span)| span.to_string().contains("\"untraced\""));
    assert!(
        untraced.is_none(),
        "no trace context, no export: {untraced:?}"
    );
    let records = p.consume(2, Duration::from_secs(30));
    let passed: Vec<&str> = records
        .iter()
        .map(|r| r.headers["traceparent"].as_str())
        .collect();
    assert!(passed.contains(&traceparent), "{passed:?}");
    drop(daemon);
    p.cleanup().await;
}

/// `text` without the ANSI color sequences (`ESC [ … m`) of outboxd's text log.
fn without_ansi_colors(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| *c == 'm');
        } else {
            plain.push(c);
        }
    }
    plain
}

/// A stand-in for an OpenTelemetry collector's OTLP/HTTP receiver: keeps the JSON body of
/// every `POST /v1/traces` and answers 200, one request a connection.
struct OtlpCollector {
    port: u16,
    bodies: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
}

impl OtlpCollector {
    async fn start() -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let bodies: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>> = Default::default();
        let kept = std::sync::Arc::clone(&bodies);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let kept = std::sync::Arc::clone(&kept);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 8192];
                    let (path, body) = loop {
                        let Ok(n) = stream.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buf).into_owned();
                        let Some((head, body)) = text.split_once("\r\n\r\n") else {
                            continue;
                        };
                        let length = head
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if body.len() >= length {
                            let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
                            break (path, body.to_owned());
                        }
                    };
                    assert_eq!(path, "/v1/traces");
                    let json = serde_json::from_str(&body).expect("OTLP JSON");
                    kept.lock().expect("bodies").push(json);
                    let reply = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\
                                 Content-Type: application/json\r\nConnection: close\r\n\r\n{}";
                    let _ = stream.write_all(reply.as_bytes()).await;
                });
            }
        });
        Self { port, bodies }
    }

    /// Every span received, with its resource.
    fn spans(&self) -> Vec<(serde_json::Value, serde_json::Value)> {
        let bodies = self.bodies.lock().expect("bodies").clone();
        let mut spans = Vec::new();
        for body in bodies {
            for resource_spans in body["resourceSpans"]
                .as_array()
                .cloned()
                .unwrap_or_default()
            {
                let scopes = resource_spans["scopeSpans"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                for scope in scopes {
                    for span in scope["spans"].as_array().cloned().unwrap_or_default() {
                        spans.push((resource_spans["resource"].clone(), span));
                    }
                }
            }
        }
        spans
    }
}

/// Issue 13: several outbox tables in one pipeline with kept rows. Row ids repeat across
/// the tables, and each status lands in the row's own table: SUCCESS with the partition and
/// offset of its own record; MANUAL_REQUIRED for a row whose topic is refused, its key's
/// later row in that table held back behind it, while the row of the same id in the other
/// table stays SUCCESS. An operator command names its table with `--table` (and without
/// it is refused, ids being per table); once the refused row is resolved, the retry worker
/// claims the held-back row from its table and delivers it.
pub async fn several_outbox_tables_keep_each_rows_status_in_its_table<E: Engine>() {
    let port = free_port();
    let extra = format!(
        "[retry]\nbase = \"200ms\"\nidle_check = \"1s\"\n{}",
        metrics_section(port)
    );
    let p = Pipeline::<E>::new("tables", 1, &extra).await;
    let b = second_outbox_table(&p);
    let forbidden = format!("it.forbidden.{}", p.name);
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let config = config.replace(
        "message_timeout = \"10s\"",
        &format!(
            "message_timeout = \"10s\"\nallowed_topics = [\"{}\"]",
            p.topic
        ),
    );
    std::fs::write(&p.config_path, config).expect("write config");
    p.init();
    E::grant_runtime(&b).await;
    let check = p.outboxd(&["check"]);
    assert!(
        check.status.success(),
        "check with two kept outbox tables:\n{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let daemon = p.spawn_run("run.log");

    // Ids 1 and 2 in each table.
    let (mut wa, mut wb) = (p.writer().await, b.writer().await);
    wa.commit(&[("k".into(), 1), ("j".into(), 1)], "a").await;
    wb.commit(&[("k".into(), 1), ("j".into(), 1)], "b").await;
    let all_success = |rows: &std::collections::BTreeMap<String, super::engine::OutboxRow>,
                       n: usize| {
        rows.len() == n && rows.values().all(|r| r.status == "SUCCESS")
    };
    wait_for(
        "both tables' rows SUCCESS",
        Duration::from_secs(30),
        || async {
            (all_success(&p.rows().await, 2) && all_success(&b.rows().await, 2)).then_some(())
        },
    )
    .await;
    let records = p.consume(4, Duration::from_secs(20));
    assert_eq!(records.len(), 4, "each row once");
    let offset_of = |message_id: &str| {
        records
            .iter()
            .find(|r| r.headers.get("message_id").map(String::as_str) == Some(message_id))
            .map(|r| (r.partition, r.offset))
    };
    for table in [&p, &b] {
        for (partition, offset, message_id, sent) in table.landed().await {
            assert!(sent, "{message_id}: sent_at set");
            assert_eq!(
                Some((partition, offset)),
                offset_of(&message_id),
                "{message_id} in {} carries its own record's position",
                table.table
            );
        }
    }

    // Id 3 in both tables: a row of A delivered, B's refused (its topic is not allowed),
    // and B's next row of that key held back behind it.
    wa.commit(&[("s".into(), 1)], "a").await;
    wb.insert_padded("b-r-1", "r", 1, &forbidden, 10).await;
    wb.commit(&[("r".into(), 2)], "b").await;
    wait_for(
        "the refused row MANUAL_REQUIRED",
        Duration::from_secs(30),
        || async {
            let rows = b.rows().await;
            (rows.get("b-r-1")?.status == "MANUAL_REQUIRED"
                && rows.get("b-r-2")?.status != "INIT"
                && p.rows().await.get("a-s-1")?.status == "SUCCESS")
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        p.row_id("a-s-1").await,
        b.row_id("b-r-1").await,
        "the ids collide"
    );
    // `/metrics` counts the rows of every table.
    wait_for(
        "/metrics shows B's MANUAL_REQUIRED row",
        Duration::from_secs(30),
        || async {
            let (_, body) = http_get(port, "/metrics").await?;
            let series = "{status=\"MANUAL_REQUIRED\"}";
            (metric_value(&body, "outboxd_outbox_rows", series) == Some(1.0)).then_some(())
        },
    )
    .await;
    assert_ne!(
        b.rows().await["b-r-2"].status,
        "SUCCESS",
        "b-r-2 waits behind b-r-1"
    );
    assert!(
        all_success(&p.rows().await, 3),
        "table A untouched by B's trouble"
    );

    // The operator: row ids are per table, so the table is named.
    let id = b.row_id("b-r-1").await.to_string();
    let unnamed = p.outboxd(&["resolve", "--id", &id, "--reason", "skip"]);
    assert!(
        !unnamed.status.success(),
        "an id without its table is refused"
    );
    let stderr = String::from_utf8_lossy(&unnamed.stderr);
    assert!(
        stderr.contains("--table") && stderr.contains(&b.table),
        "{stderr}"
    );
    let status = p.outboxd(&["status", "--table", &b.table]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success() && text.contains("MANUAL_REQUIRED"),
        "{text}"
    );
    let resolve = p.outboxd(&[
        "resolve", "--table", &b.table, "--id", &id, "--reason", "skip",
    ]);
    assert!(
        resolve.status.success(),
        "{}",
        String::from_utf8_lossy(&resolve.stderr)
    );
    wait_for(
        "the held-back row delivered",
        Duration::from_secs(30),
        || async { (b.rows().await.get("b-r-2")?.status == "SUCCESS").then_some(()) },
    )
    .await;
    let records = p.consume(6, Duration::from_secs(20));
    let ids = sorted_message_ids(&records);
    assert_eq!(
        ids,
        ["a-j-1", "a-k-1", "a-s-1", "b-j-1", "b-k-1", "b-r-2"],
        "each row once; the refused one never"
    );
    drop(daemon);
    b.cleanup().await;
    p.cleanup().await;
}

/// The second outbox table of `p`'s pipeline (`<table>_b`), seen through a pipeline of the
/// same name and config; `p`'s config is rewritten to read both (`outbox.tables`).
fn second_outbox_table<E: Engine>(p: &Pipeline<E>) -> Pipeline<E> {
    let b = Pipeline::<E> {
        services: E::from_env(),
        name: p.name.clone(),
        table: format!("{}_b", p.table),
        topic: p.topic.clone(),
        partitions: p.partitions,
        config_path: p.config_path.clone(),
        dir: p.dir.clone(),
    };
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let config = config.replacen(
        &format!("table = \"{}\"", p.table),
        &format!("tables = [\"{}\", \"{}\"]", p.table, b.table),
        1,
    );
    std::fs::write(&p.config_path, config).expect("write config");
    b
}

/// Issue 13: several kept outbox tables through `outboxd recover` and in poll mode: each
/// scans or claims every table, and writes each row's status to its own table.
pub async fn several_outbox_tables_are_recovered_and_polled<E: Engine>() {
    let p = Pipeline::<E>::new("tblpoll", 1, "\n[poll]\ninterval = \"100ms\"\n").await;
    let b = second_outbox_table(&p);
    p.init();
    E::grant_runtime(&b).await;

    // Rows written while nothing runs: `recover` publishes those of both tables.
    let (mut wa, mut wb) = (p.writer().await, b.writer().await);
    wa.commit(&[("k".into(), 1), ("j".into(), 1)], "a").await;
    wb.commit(&[("k".into(), 1)], "b").await;
    let recover = p.outboxd(&["recover"]);
    assert!(
        recover.status.success(),
        "{}",
        String::from_utf8_lossy(&recover.stderr)
    );
    assert_eq!(
        (p.success_count().await, b.success_count().await),
        (2, 1),
        "recover: every table's INIT rows, each SUCCESS in its table"
    );

    // Poll mode claims from each table in turn.
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let config = config.replacen("[source]\n", "[source]\nmode = \"poll\"\n", 1);
    std::fs::write(&p.config_path, config).expect("write config");
    let daemon = p.spawn_run("run.log");
    wa.commit(&[("k".into(), 2)], "a").await;
    wb.commit(&[("k".into(), 2), ("j".into(), 2)], "b").await;
    wait_for(
        "every row SUCCESS in its table",
        Duration::from_secs(30),
        || async { (p.success_count().await == 3 && b.success_count().await == 3).then_some(()) },
    )
    .await;
    let records = p.consume(6, Duration::from_secs(20));
    let ids = sorted_message_ids(&records);
    assert_eq!(
        ids,
        ["a-j-1", "a-k-1", "a-k-2", "b-j-2", "b-k-1", "b-k-2"],
        "each row once"
    );
    drop(daemon);
    b.cleanup().await;
    p.cleanup().await;
}

/// The `message_id` headers of `records`, sorted.
fn sorted_message_ids(records: &[Record]) -> Vec<String> {
    let mut ids: Vec<String> = records
        .iter()
        .filter_map(|r| r.headers.get("message_id").cloned())
        .collect();
    ids.sort();
    ids
}
