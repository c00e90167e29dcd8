//! End-to-end: PostgreSQL outbox → outboxd → Kafka, on the real servers started by
//! `scripts/services`.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{consume_all, java_murmur2, java_partition, seqs_by_key, wait_for, TestPipeline};

#[test]
fn murmur2_matches_the_java_client() {
    // Vectors from the Java client's own unit tests of Utils.murmur2.
    assert_eq!(java_murmur2(b"21"), -973_932_308);
    assert_eq!(java_murmur2(b"foobar"), -790_332_482);
    assert_eq!(java_murmur2(b"a-little-bit-long-string"), -985_981_536);
    assert_eq!(java_murmur2(b"a-little-bit-longer-string"), -1_486_304_829);
    assert_eq!(
        java_murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
        -58_897_971
    );
    assert_eq!(java_murmur2(b"abc"), 479_470_107);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_arrive_in_key_order_where_java_would_put_them() {
    let p = TestPipeline::new("conc", 3, "").await;
    p.init();
    let mut daemon = p.spawn_run("run.log");

    // 8 writers, each owning 5 keys and writing 25 events per key, in transactions of
    // 1 to 5 rows, interleaved with the other writers: 1,000 events.
    const WRITERS: usize = 8;
    const KEYS_PER_WRITER: usize = 5;
    const EVENTS_PER_KEY: u32 = 25;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let client = p.sql().await;
        let table = p.table.clone();
        tasks.push(tokio::spawn(async move {
            let keys: Vec<String> = (0..KEYS_PER_WRITER).map(|k| format!("order-{w}-{k}")).collect();
            let mut seq = vec![0u32; keys.len()];
            let mut client = client;
            let mut round = 0usize;
            while seq.iter().any(|s| *s < EVENTS_PER_KEY) {
                let tx = client.transaction().await.expect("begin");
                for _ in 0..=(round % 5) {
                    let k = round % keys.len();
                    round += 1;
                    if seq[k] >= EVENTS_PER_KEY {
                        continue;
                    }
                    seq[k] += 1;
                    let sql = format!(
                        "INSERT INTO \"{table}\" (message_id, message_type, biz_key, payload, headers) \
                         VALUES ($1, $2, $3, $4::text::jsonb, $5::text::jsonb)"
                    );
                    let key = &keys[k];
                    let s = seq[k];
                    tx.execute(
                        &sql,
                        &[
                            &format!("m-{key}-{s}"),
                            &format!("order.step{s}"),
                            key,
                            &format!(r#"{{"key":"{key}","seq":{s}}}"#),
                            &format!(r#"{{"seq":"{s}"}}"#),
                        ],
                    )
                    .await
                    .expect("insert");
                }
                tx.commit().await.expect("commit");
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
    let total = WRITERS * KEYS_PER_WRITER * EVENTS_PER_KEY as usize;

    let records = consume_all(
        &p.services.kafka,
        &p.topic,
        p.partitions,
        total,
        Duration::from_secs(60),
    );
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
        assert!(r.headers["message_type"].starts_with("order.step"));
        assert!(
            r.payload.contains(&format!("\"key\": \"{}\"", r.key)),
            "payload {}",
            r.payload
        );
    }
    let by_key = seqs_by_key(&records);
    assert_eq!(by_key.len(), WRITERS * KEYS_PER_WRITER);
    for (key, seqs) in &by_key {
        let expected: Vec<u32> = (1..=EVENTS_PER_KEY).collect();
        assert_eq!(seqs, &expected, "order of key {key}");
    }

    // Every row SUCCESS, with where it landed.
    let counts = wait_for("all rows SUCCESS", Duration::from_secs(30), || async {
        let counts = p.status_counts().await;
        (counts.get("SUCCESS").copied() == Some(total as i64)).then_some(counts)
    })
    .await;
    assert_eq!(counts.len(), 1, "{counts:?}");
    let client = p.sql().await;
    let landed: HashMap<(i32, i64), String> = client
        .query(
            &format!(
                "SELECT kafka_partition, kafka_offset, message_id, sent_at IS NOT NULL FROM \"{}\"",
                p.table
            ),
            &[],
        )
        .await
        .expect("landed")
        .iter()
        .map(|r| {
            assert!(r.get::<_, bool>(3), "sent_at set");
            ((r.get(0), r.get(1)), r.get(2))
        })
        .collect();
    for r in &records {
        assert_eq!(
            landed.get(&(r.partition, r.offset)),
            r.headers.get("message_id")
        );
    }

    // The checkpoint row and the slot caught up.
    let checkpoint: String = client
        .query_one(
            "SELECT position FROM outboxd_checkpoint WHERE pipeline = $1",
            &[&p.name],
        )
        .await
        .expect("checkpoint row")
        .get(0);
    assert!(checkpoint.starts_with("lsn:"), "{checkpoint}");

    assert!(
        daemon.terminate().success(),
        "graceful stop exits 0:\n{}",
        daemon.log_text()
    );
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_transactions_publish_nothing() {
    let p = TestPipeline::new("rollback", 1, "").await;
    p.init();
    let _daemon = p.spawn_run("run.log");
    let mut client = p.sql().await;

    let tx = client.transaction().await.expect("begin");
    for seq in 1..=3 {
        let sql = format!(
            "INSERT INTO \"{}\" (message_id, message_type, biz_key, payload, headers) \
             VALUES ($1, 'order.created', $2, '{{}}', $3::text::jsonb)",
            p.table
        );
        tx.execute(
            &sql,
            &[
                &format!("rolled-{seq}"),
                &format!("ghost-{seq}"),
                &format!(r#"{{"seq":"{seq}"}}"#),
            ],
        )
        .await
        .expect("insert");
    }
    tx.rollback().await.expect("rollback");
    // A committed marker after the rolled-back work: once it arrives, anything the
    // rolled-back transaction could have produced would have arrived before it.
    p.insert_event(&client, "marker", 1, "committed").await;

    let records = consume_all(&p.services.kafka, &p.topic, 1, 1, Duration::from_secs(30));
    let keys: Vec<&str> = records.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["marker"], "only the committed event");
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_stream_loses_nothing() {
    let p = TestPipeline::new("kill", 3, "").await;
    p.init();
    let mut daemon = p.spawn_run("run-1.log");
    let client = p.sql().await;

    // Write continuously; kill outboxd while rows are flowing; restart it.
    const KEYS: u32 = 10;
    const PER_KEY: u32 = 60;
    let writer = {
        let client = p.sql().await;
        let table = p.table.clone();
        tokio::spawn(async move {
            for seq in 1..=PER_KEY {
                for k in 0..KEYS {
                    let key = format!("acct-{k}");
                    client
                        .execute(
                            &format!(
                                "INSERT INTO \"{table}\" (message_id, message_type, biz_key, payload, headers) \
                                 VALUES ($1, $2, $3, '{{}}', $4::text::jsonb)"
                            ),
                            &[&format!("k-{key}-{seq}"), &format!("t{seq}"), &key, &format!(r#"{{"seq":"{seq}"}}"#)],
                        )
                        .await
                        .expect("insert");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let table = p.table.clone();
    wait_for(
        "some rows published before the kill",
        Duration::from_secs(30),
        || async {
            let row = client
                .query_one(
                    &format!("SELECT count(*) FROM \"{table}\" WHERE status = 'SUCCESS'"),
                    &[],
                )
                .await
                .ok()?;
            (row.get::<_, i64>(0) >= 100).then_some(())
        },
    )
    .await;
    daemon.kill9();
    let restarted = p.spawn_run("run-2.log");
    writer.await.expect("writer");
    let total = (KEYS * PER_KEY) as usize;

    wait_for(
        "all rows SUCCESS after restart",
        Duration::from_secs(60),
        || async {
            let counts = p.status_counts().await;
            (counts.get("SUCCESS").copied() == Some(total as i64)).then_some(())
        },
    )
    .await;
    let records = consume_all(
        &p.services.kafka,
        &p.topic,
        p.partitions,
        total,
        Duration::from_secs(60),
    );
    let by_key = seqs_by_key(&records);
    let mut duplicates = 0;
    for (key, seqs) in &by_key {
        // At-least-once: every seq present; a replay after the kill may repeat a suffix
        // of what was sent, but the first occurrences stay in order.
        let mut seen = Vec::new();
        for s in seqs {
            if seen.contains(s) {
                duplicates += 1;
            } else {
                seen.push(*s);
            }
        }
        let expected: Vec<u32> = (1..=PER_KEY).collect();
        assert_eq!(
            seen, expected,
            "key {key}: every event, first occurrences in order"
        );
    }
    println!(
        "kill -9 test: {} events committed, {} records in Kafka, {duplicates} duplicates after the restart",
        total,
        records.len()
    );
    drop(restarted);
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_outbox_does_not_hold_back_the_slot() {
    let p = TestPipeline::new("idle", 1, "").await;
    p.init();
    let _daemon = p.spawn_run("run.log");
    let client = p.sql().await;
    let slot = format!("outboxd_{}", p.name);
    let other = format!("busy_{}", p.name);
    client
        .batch_execute(&format!(
            "CREATE TABLE \"{other}\" (id bigserial PRIMARY KEY, v text)"
        ))
        .await
        .expect("create busy table");

    // Wait until streaming has begun.
    wait_for("slot active", Duration::from_secs(30), || async {
        let row = client
            .query_one(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .ok()?;
        row.get::<_, bool>(0).then_some(())
    })
    .await;
    let start_lsn: String = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("lsn")
        .get(0);

    // Other tables write a lot; the outbox stays idle.
    for i in 0..200 {
        client
            .execute(
                &format!("INSERT INTO \"{other}\" (v) VALUES ($1)"),
                &[&format!("row {i} {}", "x".repeat(200))],
            )
            .await
            .expect("busy insert");
    }
    let moved = wait_for(
        "confirmed_flush_lsn passes the busy writes",
        Duration::from_secs(30),
        || async {
            let lsn: String = client
            .query_one(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .ok()?
            .get::<_, Option<String>>(0)?;
            let row = client
                .query_one(
                    "SELECT $1::text::pg_lsn >= $2::text::pg_lsn",
                    &[&lsn, &start_lsn],
                )
                .await
                .ok()?;
            row.get::<_, bool>(0).then_some(lsn)
        },
    )
    .await;
    println!("confirmed_flush_lsn moved to {moved} (busy writes began at {start_lsn})");
    let outbox_rows: i64 = client
        .query_one(&format!("SELECT count(*) FROM \"{}\"", p.table), &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(outbox_rows, 0);
    client
        .batch_execute(&format!("DROP TABLE \"{other}\""))
        .await
        .expect("drop busy table");
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_waits_for_the_slot_and_takes_over() {
    let p = TestPipeline::new("standby", 1, "").await;
    p.init();
    let client = p.sql().await;
    let mut first = p.spawn_run("first.log");
    p.insert_event(&client, "k", 1, "a").await;
    wait_for("first event SUCCESS", Duration::from_secs(30), || async {
        (p.status_counts().await.get("SUCCESS").copied() == Some(1)).then_some(())
    })
    .await;

    let mut second = p.spawn_run("second.log");
    // The second instance keeps waiting while the first holds the slot.
    wait_for(
        "the standby to report that the slot is busy",
        Duration::from_secs(30),
        || async {
            let log = second.log_text();
            log.contains("retrying").then_some(())
        },
    )
    .await;
    assert!(
        second.is_running(),
        "the standby keeps waiting:\n{}",
        second.log_text()
    );

    first.kill9();
    p.insert_event(&client, "k", 2, "b").await;
    wait_for(
        "the standby publishes after the takeover",
        Duration::from_secs(60),
        || async { (p.status_counts().await.get("SUCCESS").copied() == Some(2)).then_some(()) },
    )
    .await;
    let records = consume_all(&p.services.kafka, &p.topic, 1, 2, Duration::from_secs(30));
    let seqs: Vec<u32> = seqs_by_key(&records).remove("k").unwrap_or_default();
    assert!(seqs.starts_with(&[1]) && seqs.contains(&2), "{seqs:?}");
    drop(second);
    p.cleanup().await;
}

#[test]
fn bad_config_is_reported_with_the_key_at_fault() {
    let dir = std::env::temp_dir().join(format!("outboxd-badcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let cases = [
        ("[pipeline]\nname = \"x\"\n[source]\nkind = \"postgres\"\nuser = \"u\"\ndatabase = \"d\"\nbogus = 1\n[kafka]\nbootstrap_servers = \"h:1\"\n", "bogus"),
        ("[pipeline]\nname = \"x\"\n[source]\nkind = \"postgres\"\nuser = \"u\"\ndatabase = \"d\"\n[kafka]\nbootstrap_servers = \"h:1\"\n[kafka.options]\n\"acks\" = \"1\"\n", "acks"),
        ("[pipeline]\nname = \"x\"\n[source]\nkind = \"oracle\"\n[kafka]\nbootstrap_servers = \"h:1\"\n", "oracle"),
        ("[pipeline]\nname = \"Bad Name\"\n[source]\nkind = \"postgres\"\nuser = \"u\"\ndatabase = \"d\"\n[kafka]\nbootstrap_servers = \"h:1\"\n", "pipeline.name"),
    ];
    for (i, (text, needle)) in cases.iter().enumerate() {
        let path = dir.join(format!("bad-{i}.toml"));
        std::fs::write(&path, text).expect("write");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .expect("run outboxd");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "case {i}: {stderr}");
        assert!(
            stderr.contains(needle),
            "case {i}: expected `{needle}` in: {stderr}"
        );
    }
    let missing = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args(["run", "--config", "/nonexistent/outboxd.toml"])
        .output()
        .expect("run outboxd");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read config file"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_every_item_and_init_is_idempotent() {
    let p = TestPipeline::new("check", 1, "").await;
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
    assert!(again.status.success());
    let after = p.outboxd(&["check"]);
    let text = String::from_utf8_lossy(&after.stdout);
    assert!(after.status.success(), "check passes after init:\n{text}");
    assert!(text.contains("kafka"), "{text}");
    p.cleanup().await;
}
