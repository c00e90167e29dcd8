//! `outboxd verify` on the real servers: it passes on healthy PostgreSQL and MariaDB
//! pipelines, at-least-once and exactly-once, with its own relay killed with SIGKILL at
//! random moments (`--spawn --faults kill`), into Kafka and into an HTTP endpoint; and it
//! fails, with the right numbers, against a relay that is deliberately broken (a test
//! double that reads the outbox and publishes to Kafka itself, dropping one event in ten,
//! or swapping two events of a key), so the checker is shown to catch what it claims to.
//! And `verify --inbox` passes on both engines with its inbox killed meanwhile.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::engine::{Engine, Pipeline};
use common::mysql::MysqlServices;
use common::postgres::PgServices;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use serde_json::Value;

const EXACTLY_ONCE: &str = "\n[delivery]\nexactly_once = true\ntransaction_interval = \"50ms\"\n";

/// `verify --json` on the pipeline's config: its exit code and report.
fn verify(p: &Pipeline<impl Engine>, args: &[&str]) -> (i32, Value) {
    let out = p.outboxd(&[&["verify", "--json"], args].concat());
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "verify printed no JSON report ({e}):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}

fn count(report: &Value, finding: &str) -> u64 {
    report["findings"][finding]
        .as_u64()
        .unwrap_or_else(|| panic!("no findings.{finding} in {report:#}"))
}

/// `verify --spawn --faults kill` for 8 s at 40 transactions a second, the relay killed
/// about every 2 s: passes, every committed event delivered, the rows SUCCESS and, under
/// exactly-once, no duplicate.
async fn passes_with_kills<E: Engine>(prefix: &str, extra: &str) {
    let p = Pipeline::<E>::new(prefix, 3, extra).await;
    p.init();
    E::grant_canary(&p).await;
    let (code, report) = verify(
        &p,
        &[
            "--topic",
            &p.topic,
            "--duration",
            "8s",
            "--rate",
            "40",
            "--spawn",
            "--faults",
            "kill",
            "--kill-every",
            "2s",
        ],
    );
    assert_eq!(code, 0, "verify failed: {report:#}");
    assert_eq!(report["passed"], true);
    let committed = count(&report, "events_committed");
    assert!(committed > 200, "{committed} events committed in 8 s");
    assert_eq!(count(&report, "delivered"), committed);
    assert_eq!(count(&report, "lost"), 0);
    assert_eq!(count(&report, "phantoms"), 0);
    assert!(count(&report, "events_rolled_back") > 0, "some rolled back");
    assert_eq!(count(&report, "order_violations"), 0);
    assert_eq!(count(&report, "status_mismatches"), 0);
    assert_eq!(count(&report, "position_mismatches"), 0);
    if extra.contains("exactly_once = true") {
        assert_eq!(report["promise"]["exactly_once"], true);
        assert_eq!(count(&report, "duplicates"), 0);
    }
    let relay = report["relay"].as_str().expect("relay");
    let kills: u32 = relay
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("relay: {relay}"));
    assert!(kills >= 2, "{relay}");
    // Its rows are gone: the outbox holds none of the run's.
    let rows = p.rows().await;
    let run = report["run"].as_str().expect("run id");
    let left = rows.keys().filter(|id| id.contains(run)).count();
    assert_eq!(left, 0, "{left} of the run's rows left in the outbox");
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_at_least_once_passes_with_kills() {
    passes_with_kills::<PgServices>("vfy_alo", "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_exactly_once_passes_with_kills() {
    passes_with_kills::<PgServices>("vfy_eos", EXACTLY_ONCE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_at_least_once_passes_with_kills() {
    passes_with_kills::<MysqlServices>("vfy_alo", "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_exactly_once_passes_with_kills() {
    passes_with_kills::<MysqlServices>("vfy_eos", EXACTLY_ONCE).await;
}

/// Into an HTTP endpoint: verify listens on the endpoint's address itself, checks each
/// request's signature, and passes with its relay killed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_sink_passes_with_kills() {
    let p = Pipeline::<PgServices>::new("vfy_http", 1, "").await;
    let port = common::free_port();
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let start = config.find("\n[kafka]\n").expect("a [kafka] section");
    let end = start
        + config[start..]
            .find("message_timeout = \"10s\"\n")
            .expect("kafka")
        + "message_timeout = \"10s\"\n".len();
    let http = format!(
        "\n[http]\ntimeout = \"3s\"\n[http.endpoints.verify]\n\
         url = \"http://127.0.0.1:{port}/hooks\"\n\
         secrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\n"
    );
    std::fs::write(
        &p.config_path,
        format!("{}{http}{}", &config[..start], &config[end..]),
    )
    .expect("write config");
    p.init();
    PgServices::grant_canary(&p).await;
    let (code, report) = verify(
        &p,
        &[
            "--topic",
            "verify",
            "--duration",
            "6s",
            "--rate",
            "30",
            "--spawn",
            "--faults",
            "kill",
            "--kill-every",
            "2s",
        ],
    );
    assert_eq!(code, 0, "verify failed: {report:#}");
    assert_eq!(report["sink"], "http");
    assert_eq!(report["bad_signatures"], 0);
    assert!(count(&report, "delivered") > 100);
    assert_eq!(count(&report, "lost"), 0);
    assert_eq!(count(&report, "order_violations"), 0);
    p.cleanup().await;
}

/// What the broken relay double does wrong.
#[derive(Clone, Copy, PartialEq)]
enum Breakage {
    /// Marks every tenth event SUCCESS without publishing it.
    DropsOneInTen,
    /// Publishes the first two events of each batch it reads in the wrong order.
    SwapsTwoOfAKey,
}

/// A relay double: reads the run's INIT rows, publishes them to the pipeline's topic
/// (key `biz_key`), marks them SUCCESS at their offsets, and breaks as `breakage` says,
/// until `verify` exits. Returns how often it broke.
async fn broken_relay(p: &Pipeline<PgServices>, verify: &mut Child, breakage: Breakage) -> u64 {
    let client = p.sql().await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", p.services.kafka())
        .create()
        .expect("producer");
    let select = format!(
        "SELECT id, biz_key, payload::text FROM \"{}\" WHERE status = 'INIT' \
         AND message_type LIKE 'outboxd.verify.%' ORDER BY id",
        p.table
    );
    let update = format!(
        "UPDATE \"{}\" SET status = 'SUCCESS', kafka_partition = $2, kafka_offset = $3 \
         WHERE id = $1",
        p.table
    );
    let (mut seen, mut broken) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(60);
    while verify.try_wait().expect("verify's status").is_none() {
        assert!(Instant::now() < deadline, "verify did not finish in 60 s");
        let mut rows = client.query(&select, &[]).await.expect("read the outbox");
        if breakage == Breakage::SwapsTwoOfAKey && rows.len() >= 2 {
            rows.swap(0, 1);
            broken += 1;
        }
        for row in rows {
            let (id, key, payload): (i64, String, String) = (row.get(0), row.get(1), row.get(2));
            seen += 1;
            let (mut partition, mut offset) = (None::<i32>, None::<i64>);
            if breakage == Breakage::DropsOneInTen && seen % 10 == 0 {
                broken += 1;
            } else {
                let record = FutureRecord::to(&p.topic).key(&key).payload(&payload);
                let delivery = producer
                    .send(record, Duration::from_secs(10))
                    .await
                    .expect("publish");
                (partition, offset) = (Some(delivery.partition), Some(delivery.offset));
            }
            client
                .execute(&update, &[&id, &partition, &offset])
                .await
                .expect("mark SUCCESS");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    broken
}

/// Runs `verify` (no `--spawn`: the double is the relay) against `breakage`; returns its
/// exit code, its report and how often the double broke.
async fn against_a_broken_relay(prefix: &str, breakage: Breakage) -> (i32, Value, u64) {
    let p = Pipeline::<PgServices>::new(prefix, 1, "").await;
    p.init();
    PgServices::grant_canary(&p).await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args([
            "verify",
            "--json",
            "--topic",
            &p.topic,
            "--duration",
            "4s",
            "--rate",
            "25",
        ])
        .args(["--keys", "1", "--max-batch", "1", "--rollback-percent", "0"])
        .args(["--drain-timeout", "5s", "--config"])
        .arg(&p.config_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start verify");
    let broken = broken_relay(&p, &mut child, breakage).await;
    let out = child.wait_with_output().expect("verify's output");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    p.cleanup().await;
    (out.status.code().unwrap_or(-1), report, broken)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_drops_one_event_in_ten_fails_verify_with_the_count() {
    let (code, report, dropped) = against_a_broken_relay("vfy_drop", Breakage::DropsOneInTen).await;
    assert!(dropped >= 5, "the double dropped {dropped}");
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["passed"], false);
    assert_eq!(count(&report, "lost"), dropped, "{report:#}");
    assert_eq!(count(&report, "order_violations"), 0);
    let failures = report["findings"]["failures"].to_string();
    assert!(failures.contains("never arrived"), "{failures}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_swaps_two_events_of_a_key_fails_verify_with_the_count() {
    let (code, report, swapped) =
        against_a_broken_relay("vfy_swap", Breakage::SwapsTwoOfAKey).await;
    assert!(swapped >= 3, "the double swapped {swapped} pairs");
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(count(&report, "lost"), 0, "{report:#}");
    assert_eq!(count(&report, "order_violations"), swapped, "{report:#}");
    let failures = report["findings"]["failures"].to_string();
    assert!(
        failures.contains("after a later event of their key"),
        "{failures}"
    );
}

/// `verify --inbox --spawn --faults kill`: signed messages posted to the HTTP ingress of
/// an inbox verify runs and kills about every 2 s, some posted twice: each stored once,
/// DONE, its SQL handler's effect exactly once, in its key's order. Run with the admin's
/// login, which may create verify's scratch table (the runtime role may not).
async fn inbox_passes_with_kills<E: Engine>(prefix: &str) {
    let p = Pipeline::<E>::new(prefix, 1, "").await;
    p.init();
    let port = common::free_port();
    let inbox = format!("inbox_{}", p.name);
    let config = format!(
        "{}\n\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n\n[inbox]\ntable = \"{inbox}\"\n\
         workers = 4\n\n[inbox.http.secrets]\npartner = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\n",
        p.services.source_section()
    );
    let admin = p.dir.join("inbox-admin.toml");
    std::fs::write(&admin, p.services.as_admin(&config)).expect("write config");
    let init = common::run_outboxd(&admin, &["init"]);
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let out = common::run_outboxd(
        &admin,
        &[
            "verify",
            "--inbox",
            "--spawn",
            "--json",
            "--duration",
            "6s",
            "--rate",
            "40",
            "--keys",
            "8",
            "--faults",
            "kill",
            "--kill-every",
            "2s",
        ],
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    for zero in [
        "unacknowledged",
        "lost",
        "not_done",
        "effects_missing",
        "effects_repeated",
        "order_violations",
    ] {
        assert_eq!(count(&report, zero), 0, "{zero}: {report:#}");
    }
    assert_eq!(count(&report, "messages"), 240);
    assert!(count(&report, "duplicates_acknowledged") > 10, "{report:#}");
    let relay = report["relay"].as_str().expect("relay");
    assert!(
        relay.contains("killed") && !relay.contains("killed 0"),
        "{relay}"
    );
    assert!(
        report["cleanup"].as_str().unwrap_or("").contains("dropped"),
        "{report:#}"
    );
    E::execute_as_admin(&p, &format!("DROP TABLE {inbox};")).await;
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_inbox_passes_with_kills() {
    inbox_passes_with_kills::<PgServices>("vfy_inbox").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_inbox_passes_with_kills() {
    inbox_passes_with_kills::<MysqlServices>("vfy_inbox").await;
}

/// Ctrl-C (SIGINT) in the middle of a run: verify stops its relay, deletes every row it
/// wrote, prints its report marked interrupted and exits 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_run_cleans_up_and_fails() {
    let p = Pipeline::<PgServices>::new("vfy_int", 1, "").await;
    p.init();
    PgServices::grant_canary(&p).await;
    let child = Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args([
            "verify",
            "--json",
            "--spawn",
            "--topic",
            &p.topic,
            "--duration",
            "60s",
        ])
        .arg("--config")
        .arg(&p.config_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start verify");
    // Some rows written and delivered first.
    common::wait_for("verify's rows", Duration::from_secs(30), || async {
        (p.rows().await.len() >= 50).then_some(())
    })
    .await;
    let interrupted = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(interrupted.success());
    let out = child.wait_with_output().expect("verify's output");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let failures = report["findings"]["failures"].to_string();
    assert!(failures.contains("interrupted"), "{failures}");
    assert!(count(&report, "events_committed") >= 50);
    assert!(p.rows().await.is_empty(), "the run's rows are deleted");
    p.cleanup().await;
}
