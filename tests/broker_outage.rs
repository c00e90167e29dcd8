//! Issue 10, case 5: a broker outage longer than `kafka.message_timeout` must not reorder a
//! key's events. Before, the producer dropped the records that had waited longest (their
//! rows became FAILED and were retried later) and delivered the younger ones of the same
//! keys when the broker came back: a permanent reorder.
//!
//! This binary holds this one test on purpose: it pauses the shared broker (SIGSTOP), and
//! `cargo test` runs test binaries one at a time, so no other test sees the pause.

mod common;

use std::time::Duration;

use common::engine::{Event, Writer};
use common::postgres::TestPipeline;
use common::scenarios::{assert_every_event_in_key_order, FAST_FAILURES};
use common::wait_for;

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
