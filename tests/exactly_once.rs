//! Issue 14, item 4: exactly-once into Kafka (`delivery.exactly_once = true`).
//!
//! - outboxd killed with SIGKILL again and again while rows flow: a `read_committed`
//!   consumer sees every row exactly once, in per-key order, on both engines. (At least
//!   once, the same run leaves duplicates: what Kafka had acknowledged and the table did
//!   not yet show.)
//! - A zombie: a second producer with the pipeline's `transactional.id` fences the first;
//!   the first's open transaction is aborted (never seen) and its commit fails.
//! - Issue 26: a positions topic shared with another pipeline whose transaction stays open
//!   on it: a session start does not wait for that transaction, except for its own record
//!   past it.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use common::engine::{Engine, Pipeline, Writer};
use common::mysql::MysqlServices;
use common::postgres::PgServices;
use common::scenarios::{assert_every_event_in_key_order, FAST_FAILURES};
use common::{consume_all, create_topic_with, seqs_by_key, wait_for};
use outboxd::config::KafkaConfig;
use outboxd::sink::kafka::KafkaSink;
use outboxd::sink::{CommittedPosition, FailureKind, Sink};
use outboxd_connector::{OutboxEvent, Position};

const EXACTLY_ONCE: &str = "\n[delivery]\nexactly_once = true\ntransaction_interval = \"50ms\"\n";

async fn exactly_once_across_kill_9<E: Engine>() {
    const KEYS: u32 = 8;
    const PER_KEY: u32 = 150;
    let p = Pipeline::<E>::new("eos", 3, EXACTLY_ONCE).await;
    p.init();
    let mut daemon = p.spawn_run("run-0.log");
    let writer = {
        let mut writer = p.writer().await;
        tokio::spawn(async move {
            for seq in 1..=PER_KEY {
                for k in 0..KEYS {
                    writer.commit(&[(format!("acct-{k}"), seq)], "eos").await;
                }
                // Pacing, so that the kills land while rows flow.
                tokio::time::sleep(Duration::from_millis(60)).await;
            }
        })
    };
    let total = i64::from(KEYS * PER_KEY);
    // Each instance is killed a little after it has written rows back (a few Kafka
    // transactions have committed by then), at uneven moments: between a write-back and
    // its commit, with records in flight, in the middle of a window.
    let mut kills = 0;
    for (kill, after_ms) in [250, 420, 160, 330].into_iter().enumerate() {
        let before = p.success_count().await;
        let progressed = wait_for(
            "rows written back by this instance",
            Duration::from_secs(60),
            || async {
                let now = p.success_count().await;
                (now > before || now == total).then_some(now > before)
            },
        )
        .await;
        if !progressed {
            break;
        }
        kills += 1;
        tokio::time::sleep(Duration::from_millis(after_ms)).await;
        daemon.kill9();
        daemon = p.spawn_run(&format!("run-{}.log", kill + 1));
    }
    writer.await.expect("writer");
    wait_for("every row SUCCESS", Duration::from_secs(120), || async {
        (p.success_count().await == total).then_some(())
    })
    .await;
    // `consume` reads with isolation.level = read_committed: rows appear once their Kafka
    // transaction is committed, which may come after the row is SUCCESS.
    let records = p.consume(total as usize, Duration::from_secs(90));
    let log = daemon.log_text();
    assert!(
        log.contains("exactly-once: sending from the position the last Kafka transaction"),
        "the last instance starts from what the killed ones committed; log:\n{log}"
    );
    assert!(kills >= 3, "only {kills} kills landed while rows flowed");
    let duplicates = assert_every_event_in_key_order(&records, KEYS as usize, PER_KEY);
    assert_eq!(
        duplicates,
        0,
        "{} exactly-once across {kills} kill -9s: {} records for {total} rows",
        E::NAME,
        records.len()
    );
    drop(daemon);
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_exactly_once_across_kill_9() {
    exactly_once_across_kill_9::<PgServices>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_exactly_once_across_kill_9() {
    exactly_once_across_kill_9::<MysqlServices>().await;
}

/// Issue 26, finding 2: inside a Kafka transaction a record the broker refuses for good
/// (larger than its topic's `max.message.bytes`) dooms the transaction; sent again by
/// every session, it stopped the relay for good. Its row becomes FAILED with the broker's
/// reason outside the aborted transaction, the next session does not send it in one
/// again (its key's next row is parked behind it), and the rest is committed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_exactly_once_a_record_kafka_refuses_fails_its_row_and_the_rest_flows() {
    let p =
        Pipeline::<PgServices>::new("eosbig", 1, &format!("{EXACTLY_ONCE}{FAST_FAILURES}")).await;
    // The broker refuses records over 4 KB on this topic.
    let topic = format!("{}.small", p.topic);
    p.create_topic_with(&topic, 1, &[("max.message.bytes", "4096")])
        .await;
    p.init();
    let daemon = p.spawn_run("run.log");
    let mut writer = p.writer().await;
    writer
        .insert_padded("blocked-1", "blocked", 1, &topic, 8_000)
        .await;
    // The rows after it come once it is refused: librdkafka puts records of a partition
    // in one batch, and the broker refuses a batch over the limit whole.
    wait_for(
        "the refused row FAILED",
        Duration::from_secs(30),
        || async { (p.rows().await.get("blocked-1")?.status != "INIT").then_some(()) },
    )
    .await;
    writer
        .insert_padded("blocked-2", "blocked", 2, &topic, 10)
        .await;
    for seq in 1..=3 {
        let id = format!("free-{seq}");
        writer.insert_padded(&id, "free", seq, &topic, 10).await;
    }
    wait_for(
        "the rest through, the refused row's key held",
        Duration::from_secs(30),
        || async {
            let rows = p.rows().await;
            let refused = rows.get("blocked-1")?.status != "INIT";
            let parked = rows.get("blocked-2")?.status == "FAILED";
            let free = (1..=3).all(|s| {
                rows.get(&format!("free-{s}"))
                    .is_some_and(|r| r.status == "SUCCESS")
            });
            (refused && parked && free).then_some(())
        },
    )
    .await;
    let rows = p.rows().await;
    let refused = &rows["blocked-1"];
    let error = refused.last_error.clone().unwrap_or_default();
    assert!(
        error.to_lowercase().contains("too large"),
        "the broker's reason is kept: {error}"
    );
    assert!(refused.retry_count >= 1, "an attempt is counted");
    let parked = rows["blocked-2"].last_error.clone().unwrap_or_default();
    assert!(parked.contains("parked"), "strict ordering: {parked}");
    let records = consume_all(&kafka(), &topic, 1, 3, Duration::from_secs(20));
    let by_key = seqs_by_key(&records);
    assert_eq!(by_key.get("free"), Some(&vec![1, 2, 3]), "each once");
    assert_eq!(by_key.get("blocked"), None, "nothing of the held key yet");
    let log = daemon.log_text();
    let refusals = log
        .matches("the destination refused a record inside the Kafka transaction")
        .count();
    assert_eq!(refusals, 1, "sent in one transaction only; log:\n{log}");
    drop(daemon);
    p.cleanup().await;
}

fn kafka() -> String {
    std::env::var("OUTBOXD_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:29092".into())
}

fn event(id: i64, message_id: &str) -> OutboxEvent {
    OutboxEvent {
        id,
        table: 0,
        message_id: message_id.to_owned(),
        message_type: "zombie.test".to_owned(),
        biz_key: "k".to_owned(),
        key: Bytes::from_static(b"k"),
        topic: None,
        routing: None,
        payload: Bytes::from_static(b"{}"),
        headers: Vec::new(),
        created_at: "2026-12-03 00:00:00+00".to_owned(),
        retry_count: 0,
        max_retry_count: 5,
        commit_time: None,
        rejected: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_is_fenced_and_its_open_transaction_is_never_seen() {
    let suffix: u32 = rand_suffix();
    let topic = format!("it.zombie_{suffix}");
    create_topic_with(&kafka(), &topic, 1, &[]).await;
    let config = KafkaConfig {
        bootstrap_servers: kafka(),
        topic_template: topic.clone(),
        message_timeout: Duration::from_secs(10),
        options: BTreeMap::new(),
        allowed_topics: Vec::new(),
        sasl_password_file: None,
        ssl_key_password_file: None,
        cloudevents: None,
        transactional_id: Some(format!("it-zombie-{suffix}")),
        positions_topic: Some(format!("it.positions_{suffix}")),
    };
    let sink = || {
        KafkaSink::new(&config, "zombie", true, 64 << 20)
            .and_then(|s| s.transactional(&config))
            .expect("transactional sink")
    };
    let position = |n: u128| CommittedPosition {
        position: Position::new(n, format!("lsn:0/{n:X}")),
        checkpoint: Some(Position::new(n / 2, format!("lsn:0/{:X}", n / 2))),
    };

    // The first instance commits one transaction, then sends into a second one.
    let old = sink();
    assert_eq!(old.committed_position().await.expect("start"), None);
    old.send(&event(1, "committed-by-old"))
        .await
        .await
        .expect("ack");
    old.commit(&position(10)).await.expect("commit");
    old.send(&event(2, "left-open-by-old"))
        .await
        .await
        .expect("ack");

    // A new instance takes over: it fences the old producer and sees where it stopped.
    let new = sink();
    assert_eq!(
        new.committed_position().await.expect("start"),
        Some(position(10))
    );
    let refused = old
        .commit(&position(20))
        .await
        .expect_err("the zombie is fenced");
    assert_eq!(refused.kind, FailureKind::Fatal);
    assert!(refused.error.contains("fenced"), "{}", refused.error);
    new.send(&event(2, "sent-again-by-new"))
        .await
        .await
        .expect("ack");
    new.commit(&position(20)).await.expect("commit");

    let records = consume_all(&kafka(), &topic, 1, 2, Duration::from_secs(30));
    let ids: Vec<&str> = records
        .iter()
        .map(|r| r.headers.get("message_id").map_or("", String::as_str))
        .collect();
    assert_eq!(ids, ["committed-by-old", "sent-again-by-new"]);
    assert_eq!(
        sink().committed_position().await.expect("start"),
        Some(position(20))
    );
}

/// Issue 26: pipelines may share one `kafka.positions_topic`. Another pipeline's open
/// transaction there (one record written, no commit: a producer that died mid-commit, or
/// simply a busy one) holds the partition's last stable offset below its high watermark
/// until that transaction ends, up to its `transaction.timeout.ms`. A session start finds
/// its own position without waiting for it, unless its own last record lies past that
/// transaction: then it waits for it (a `read_committed` read cannot see the record yet,
/// and stopping short would take an older position and send committed records again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_positions_topic_does_not_wait_for_another_pipelines_transaction() {
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use std::time::Instant;

    let suffix: u32 = rand_suffix();
    let positions = format!("it.positions_shared_{suffix}");
    let config = KafkaConfig {
        bootstrap_servers: kafka(),
        topic_template: format!("it.shared_{suffix}"),
        message_timeout: Duration::from_secs(10),
        options: BTreeMap::new(),
        allowed_topics: Vec::new(),
        sasl_password_file: None,
        ssl_key_password_file: None,
        cloudevents: None,
        transactional_id: Some(format!("it-shared-{suffix}")),
        positions_topic: Some(positions.clone()),
    };
    let sink = || {
        KafkaSink::new(&config, "shared", true, 64 << 20)
            .and_then(|s| s.transactional(&config))
            .expect("transactional sink")
    };
    let position = |n: u128| CommittedPosition {
        position: Position::new(n, format!("lsn:0/{n:X}")),
        checkpoint: None,
    };

    // This pipeline commits a position (its first start creates the positions topic).
    let first = sink();
    assert_eq!(first.committed_position().await.expect("start"), None);
    first.commit(&position(10)).await.expect("commit");

    // Another pipeline, sharing the topic, leaves a transaction open on it for 120 s.
    let other_id = format!("it-shared-other-{suffix}");
    let other: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka())
        .set("transactional.id", &other_id)
        .set("transaction.timeout.ms", "120000")
        .create()
        .expect("other pipeline's producer");
    other
        .init_transactions(Duration::from_secs(30))
        .expect("init_transactions");
    other.begin_transaction().expect("begin");
    other
        .send(
            BaseRecord::to(&positions)
                .key(&other_id)
                .payload(r#"{"position":{"ordinal":"7","text":"lsn:0/7"},"checkpoint":null}"#),
        )
        .map_err(|(e, _)| e)
        .expect("send");
    other.flush(Duration::from_secs(30)).expect("flush");

    // A session start of this pipeline finds its position promptly.
    let second = sink();
    let started = Instant::now();
    let found = tokio::time::timeout(Duration::from_secs(10), second.committed_position())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the session start still waits after {:?} for the other pipeline's open \
                 transaction",
                started.elapsed()
            )
        })
        .expect("start");
    assert_eq!(found, Some(position(10)));

    // This pipeline's next position lies past the other's open transaction: a start must
    // not stop short of it (position 10 would send committed records again); it waits
    // until that transaction ends (here aborted after 3 s).
    second.commit(&position(20)).await.expect("commit");
    let ender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(3));
        other
            .abort_transaction(Duration::from_secs(30))
            .expect("abort");
    });
    let found = tokio::time::timeout(Duration::from_secs(25), sink().committed_position())
        .await
        .expect("a start once the other transaction is over")
        .expect("start");
    assert_eq!(found, Some(position(20)));
    ender.join().expect("abort thread");
}

fn rand_suffix() -> u32 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        % 1_000_000
}

/// `outboxd check` under exactly-once names the transactional id and the positions topic,
/// and warns with the fix when that topic is not compacted (it is read whole at every
/// session start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_the_positions_topic_and_warns_when_it_is_not_compacted() {
    let topic = format!("it.positions_plain_{}", rand_suffix());
    let extra = format!("positions_topic = \"{topic}\"{EXACTLY_ONCE}");
    let p = Pipeline::<PgServices>::new("eoscheck", 1, &extra).await;
    p.init();
    let check = |p: &Pipeline<PgServices>| {
        let out = p.outboxd(&["check"]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let before = check(&p);
    let line = before
        .lines()
        .find(|l| l.contains("exactly-once"))
        .unwrap_or_else(|| panic!("an exactly-once line in:\n{before}"));
    assert!(line.contains(&format!("outboxd-{}", p.name)), "{line}");
    assert!(line.contains("created at the first run"), "{line}");

    create_topic_with(&kafka(), &topic, 1, &[("cleanup.policy", "delete")]).await;
    let after = check(&p);
    let line = after
        .lines()
        .find(|l| l.contains("exactly-once"))
        .unwrap_or_else(|| panic!("an exactly-once line in:\n{after}"));
    assert!(line.contains("cleanup.policy=delete"), "{line}");
    assert!(after.contains("set cleanup.policy=compact"), "{after}");
    p.cleanup().await;
}
