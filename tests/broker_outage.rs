//! Issue 10, case 5: a broker outage longer than `kafka.message_timeout` must not reorder a
//! key's events. Before, the producer dropped the records that had waited longest (their
//! rows became FAILED and were retried later) and delivered the younger ones of the same
//! keys when the broker came back: a permanent reorder.
//!
//! Issue 26: a broker frozen for longer than `message_timeout` under load, again and
//! again, once came back fenced and left the producer waiting forever (no wedge may stay).
//!
//! This binary holds these tests alone on purpose: they pause the shared broker (SIGSTOP),
//! and `cargo test` runs test binaries one at a time, so no other test sees the pause; the
//! tests here take turns ([`BROKER`]).

mod common;

use std::time::Duration;

use common::engine::{Event, Writer};
use common::postgres::TestPipeline;
use common::scenarios::{assert_every_event_in_key_order, FAST_FAILURES};
use common::wait_for;

/// Held by each test while it may pause the broker: the tests of this binary run one at a
/// time.
static BROKER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The shared broker, paused until this guard is dropped (a failing test resumes it too).
struct PausedBroker {
    pid: String,
}

impl PausedBroker {
    fn pause() -> Self {
        let dir = std::env::var("OUTBOXD_SERVICES_DIR")
            .unwrap_or_else(|_| "/var/tmp/outboxd-services".into());
        let pid = std::fs::read_to_string(format!("{dir}/kafka/kafka.pid"))
            .expect("the broker's pid file (scripts/services start kafka)")
            .trim()
            .to_owned();
        signal(&pid, "-STOP");
        Self { pid }
    }
}

impl Drop for PausedBroker {
    fn drop(&mut self) {
        signal(&self.pid, "-CONT");
    }
}

fn signal(pid: &str, which: &str) {
    let status = std::process::Command::new("kill")
        .args([which, pid])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {which} {pid}");
}

const KEYS: usize = 4;
const PER_KEY: u32 = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_longer_than_the_message_timeout_keeps_every_key_in_order() {
    let _turn = BROKER.lock().await;
    let p = TestPipeline::new("outage", 2, FAST_FAILURES).await;
    // A short producer timeout, so the outage below outlasts it three times over.
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let config = config.replace("message_timeout = \"10s\"", "message_timeout = \"2s\"");
    std::fs::write(&p.config_path, config).expect("write config");
    p.init();
    let daemon = p.spawn_run("run.log");

    // The keys emit steadily, one event per transaction every 20 ms (about 5 s in all),
    // before, during and after the outage.
    let mut writer = p.writer().await;
    let writing = tokio::spawn(async move {
        for seq in 1..=PER_KEY {
            for k in 0..KEYS {
                let event: Event = (format!("key-{k}"), seq);
                writer.commit(&[event], "outage").await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let paused = PausedBroker::pause();
    // 1.5 × the timeout: before the fix the oldest records expired while younger ones of
    // the same keys survived and were delivered first (reproduced on the old code:
    // key-0 arrived as 1..18, 29..44, 19..28, 45..60).
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(paused);
    writing.await.expect("writer");

    let total = KEYS * PER_KEY as usize;
    wait_for("every row SUCCESS", Duration::from_secs(120), || async {
        let counts = p.status_counts().await;
        (counts.get("SUCCESS").copied().unwrap_or(0) == total as i64).then_some(())
    })
    .await;
    let log = daemon.log_text();
    assert!(
        log.contains("records wait for Kafka with no acknowledgement"),
        "the outage is reported while it lasts"
    );
    let records = p.consume(total, Duration::from_secs(60));
    let duplicates = assert_every_event_in_key_order(&records, KEYS, PER_KEY);
    println!("{duplicates} duplicates after the outage");
    drop(daemon);
    p.cleanup().await;
}

/// The broker frozen (SIGSTOP) for 10–12 s, `OUTBOXD_FREEZE_REPEATS` times (2 here; the
/// bench's figure is 20), under about 150 events/s on 6 keys, strict ordering,
/// `message_timeout` 5 s. After each freeze every row written so far becomes SUCCESS
/// within the freeze's length plus a minute, with no restart: a producer left stuck by
/// the broker's return is noticed (no acknowledgement for `message_timeout` while a
/// fresh client reaches the broker) and rebuilt. At the end every event is in Kafka, each
/// key in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_broker_freezes_leave_no_wedge() {
    let _turn = BROKER.lock().await;
    let repeats: usize = std::env::var("OUTBOXD_FREEZE_REPEATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    const FREEZE_KEYS: usize = 6;
    let p = TestPipeline::new("freeze", 2, FAST_FAILURES).await;
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let config = config.replace("message_timeout = \"10s\"", "message_timeout = \"5s\"");
    std::fs::write(&p.config_path, config).expect("write config");
    p.init();
    let daemon = p.spawn_run("run.log");

    // Writers: one event per key per round, about 150 events/s, until told to stop at the
    // end of a round (so every key has as many events).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let written = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut writer = p.writer().await;
    let writing = tokio::spawn({
        let (stop, written) = (stop.clone(), written.clone());
        async move {
            let mut seq = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                seq += 1;
                for k in 0..FREEZE_KEYS {
                    let event: Event = (format!("key-{k}"), seq);
                    writer.commit(&[event], "freeze").await;
                }
                written.store(seq, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            seq
        }
    });
    let mut recoveries = Vec::new();
    for repeat in 0..repeats {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let freeze = Duration::from_millis(10_000 + 500 * (repeat as u64 % 5));
        let paused = PausedBroker::pause();
        tokio::time::sleep(freeze).await;
        drop(paused);
        let resumed = std::time::Instant::now();
        let so_far = written.load(std::sync::atomic::Ordering::Relaxed) as i64;
        let expected = so_far * FREEZE_KEYS as i64;
        wait_for(
            &format!(
                "freeze {}: the {expected} rows written so far SUCCESS",
                repeat + 1
            ),
            freeze + Duration::from_secs(60),
            || async {
                let counts = p.status_counts().await;
                (counts.get("SUCCESS").copied().unwrap_or(0) >= expected).then_some(())
            },
        )
        .await;
        // Reported, not asserted (the soak in scripts/bench holds the target): from the
        // broker's return to every row written before it SUCCESS.
        recoveries.push((freeze.as_secs_f64(), resumed.elapsed().as_secs_f64()));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let per_key = writing.await.expect("writer");
    let total = FREEZE_KEYS * per_key as usize;
    wait_for("every row SUCCESS", Duration::from_secs(120), || async {
        let counts = p.status_counts().await;
        (counts.get("SUCCESS").copied().unwrap_or(0) == total as i64).then_some(())
    })
    .await;
    let records = p.consume(total, Duration::from_secs(60));
    let duplicates = assert_every_event_in_key_order(&records, FREEZE_KEYS, per_key);
    let log = daemon.log_text();
    let rebuilds = log
        .matches("the producer was stuck and has been rebuilt")
        .count();
    println!(
        "{repeats} freezes, {total} events: {duplicates} duplicates, {rebuilds} producer rebuilds"
    );
    for (i, (freeze, recovery)) in recoveries.iter().enumerate() {
        println!(
            "freeze {}: {freeze:.1} s, rows written before the return SUCCESS {recovery:.1} s after it",
            i + 1
        );
    }
    drop(daemon);
    p.cleanup().await;
}
