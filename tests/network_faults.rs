//! Network faults between outboxd and the real servers (issue 26): outboxd's connections go
//! through a Toxiproxy proxy (`tests/common/toxiproxy.rs`, the `toxiproxy` service of
//! `scripts/services`) while writers keep committing outbox rows straight to the database
//! (never through the proxy). The proxy then black-holes the traffic (a `timeout` toxic:
//! every byte dropped, no connection closed), resets every connection (`reset_peer`), or is
//! cut (disabled: connections closed, new ones refused) for about ten seconds, and is
//! healed. At the end, in the same outboxd process (never restarted): every row is in
//! Kafka (read back straight from the broker), each key's events in commit order (a replay
//! may repeat a suffix), every row SUCCESS, and `/readyz` ready again.
//!
//! Database faults put both of outboxd's connections behind the proxy (the source's
//! `host`/`port` are the proxy's): the replication or binlog stream and the SQL store. The
//! Kafka fault uses the broker's PROXIED listener (`scripts/services`), which advertises the
//! proxy's address, so every connection outboxd's producer makes stays behind the proxy.
//!
//! Each test has its own pipeline and proxy; all traffic is on loopback. Kafka's proxy has
//! the one address the broker advertises, so a single test uses it (two runs of this binary
//! at once on one machine would take it from each other).
//!
//! Run: `scripts/services start all` (Toxiproxy among them), `eval "$(scripts/services
//! env)"`, `cargo test --test network_faults -- --nocapture` (each test prints its rows,
//! duplicates, when `/readyz` noticed the fault, how long the recovery took, and outboxd's
//! warnings).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::engine::{Engine, Pipeline, Writer};
use common::mysql::MysqlServices;
use common::postgres::PgServices;
use common::scenarios::{assert_every_event_in_key_order, FAST_FAILURES};
use common::toxiproxy::{Proxy, Stream, Toxic, Toxiproxy};
use common::{free_port, http_get, metrics_section, Record};

/// How long a fault lasts.
const FAULT: Duration = Duration::from_secs(10);
/// Writers keep writing this long after the fault is lifted.
const AFTER: Duration = Duration::from_secs(3);
/// How long outboxd may take, once the fault is lifted, to have every row SUCCESS.
const RECOVERY: Duration = Duration::from_secs(45);

const WRITERS: usize = 2;
const KEYS_PER_WRITER: usize = 4;
/// A writer's pause between rounds (one single-row transaction per key each round).
const ROUND_PAUSE: Duration = Duration::from_millis(40);
/// Writers stop by themselves after this many rounds (about 80 s at the pace above).
const MAX_ROUNDS: u32 = 2_000;

/// How long the fault is held.
#[derive(Clone, Copy, Debug)]
enum Hold {
    /// [`FAULT`].
    Fixed,
    /// Until `/readyz` is not ready, which must happen within [`NOTICED_WITHIN`].
    UntilNoticed,
}

/// How soon outboxd must notice a silent source (`/readyz` not ready), [`Hold::UntilNoticed`].
const NOTICED_WITHIN: Duration = Duration::from_secs(30);

/// What happens to the proxy.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// `timeout` toxics (0: never closing) both ways: every byte dropped.
    BlackHole,
    /// `reset_peer` both ways: every connection reset at its next byte, new ones at once.
    ResetPeer,
    /// The proxy disabled: its connections closed, new ones refused.
    Cut,
    /// `latency` toxics both ways: every chunk delayed [`SLOW_MS`] (± a fifth), a slow link
    /// that still answers.
    Slow,
}

/// The delay of [`Fault::Slow`], each way.
const SLOW_MS: u64 = 250;

impl Fault {
    fn apply(self, proxy: &Proxy) {
        match self {
            Fault::BlackHole => {
                proxy.add_both(Toxic::BLACK_HOLE);
            }
            Fault::ResetPeer => {
                proxy.add_both(Toxic::ResetPeer { ms: 0 });
            }
            Fault::Cut => proxy.set_enabled(false),
            Fault::Slow => {
                proxy.add_both(Toxic::Latency {
                    ms: SLOW_MS,
                    jitter_ms: SLOW_MS / 5,
                });
            }
        }
    }

    fn lift(self, proxy: &Proxy) {
        match self {
            Fault::BlackHole | Fault::ResetPeer | Fault::Slow => proxy.heal(),
            Fault::Cut => proxy.set_enabled(true),
        }
    }
}

/// Writers committing one row per key per round, straight to the database, until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<u32>>,
}

impl Load {
    async fn start<E: Engine>(p: &Pipeline<E>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let mut writer = p.writer().await;
            let stop = Arc::clone(&stop);
            tasks.push(tokio::spawn(async move {
                let mut rounds = 0;
                while rounds < MAX_ROUNDS && !stop.load(Ordering::Relaxed) {
                    rounds += 1;
                    for k in 0..KEYS_PER_WRITER {
                        writer.commit(&[(key(w, k), rounds)], "nf").await;
                    }
                    tokio::time::sleep(ROUND_PAUSE).await;
                }
                rounds
            }));
        }
        Self { stop, tasks }
    }

    /// Stops the writers; each one's rounds (every key of writer `w` has events
    /// `1..=rounds[w]`).
    async fn finish(self) -> Vec<u32> {
        self.stop.store(true, Ordering::Relaxed);
        let mut rounds = Vec::new();
        for task in self.tasks {
            rounds.push(task.await.expect("writer"));
        }
        rounds
    }
}

fn key(w: usize, k: usize) -> String {
    format!("w{w}-k{k}")
}

/// Every event of every writer's keys, first occurrences in commit order; the number of
/// records sent more than once.
fn assert_delivered_in_key_order(records: &[Record], rounds: &[u32]) -> usize {
    let mut duplicates = 0;
    for (w, rounds) in rounds.iter().enumerate() {
        let prefix = format!("w{w}-");
        let own: Vec<Record> = records
            .iter()
            .filter(|r| r.key.starts_with(&prefix))
            .cloned()
            .collect();
        duplicates += assert_every_event_in_key_order(&own, KEYS_PER_WRITER, *rounds);
    }
    duplicates
}

/// `/readyz`'s status, 0 when nothing answers.
async fn readyz(port: u16) -> u16 {
    match tokio::time::timeout(Duration::from_secs(3), http_get(port, "/readyz")).await {
        Ok(Some((status, _))) => status,
        _ => 0,
    }
}

/// What one fault did, printed by each test.
struct Timings {
    /// From the fault to the first `/readyz` that was not 200, if any.
    not_ready_after: Option<Duration>,
    /// From lifting the fault to every row SUCCESS.
    recovered_after: Duration,
    rows: usize,
    duplicates: usize,
    /// outboxd's warnings and errors, the first few.
    warnings: Vec<String>,
}

/// The common course: `p` is set up with `[metrics]` on `metrics_port` and its config
/// already points outboxd at `proxy`. Runs outboxd, the load, the fault (held as `hold`
/// says), then checks the end state.
async fn fault_under_load<E: Engine>(
    p: &Pipeline<E>,
    metrics_port: u16,
    proxy: &Proxy,
    fault: Fault,
    hold: Hold,
) -> Timings {
    let mut daemon = p.spawn_run("run.log");
    common::wait_for("/readyz 200", Duration::from_secs(30), || async {
        (readyz(metrics_port).await == 200).then_some(())
    })
    .await;

    let load = Load::start(p).await;
    common::wait_for(
        "rows published before the fault",
        Duration::from_secs(30),
        || async { (p.success_count().await >= 50).then_some(()) },
    )
    .await;

    // The fault, /readyz watched meanwhile.
    let at_fault = p.success_count().await;
    fault.apply(proxy);
    let faulted = Instant::now();
    let mut not_ready_after = None;
    let mut success_settled = None;
    loop {
        let held = faulted.elapsed();
        match hold {
            Hold::Fixed if held >= FAULT => break,
            Hold::UntilNoticed if not_ready_after.is_some() => break,
            Hold::UntilNoticed => assert!(
                held < NOTICED_WITHIN,
                "/readyz still ready {held:?} into a {fault:?} of the {} source (outboxd \
                 noticed nothing)",
                E::NAME
            ),
            Hold::Fixed => {}
        }
        if not_ready_after.is_none() && readyz(metrics_port).await != 200 {
            not_ready_after = Some(faulted.elapsed());
        }
        if success_settled.is_none() && faulted.elapsed() >= Duration::from_secs(3) {
            success_settled = Some(p.success_count().await);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let at_lift = p.success_count().await;
    // Nothing is written back through a faulted proxy once what was in flight settled:
    // else outboxd is not behind the proxy and the test proves nothing. (A slow link
    // still carries the write-backs.)
    if let Some(settled) = success_settled.filter(|_| !matches!(fault, Fault::Slow)) {
        assert_eq!(
            settled, at_lift,
            "rows became SUCCESS during the {fault:?} ({at_fault} at the fault): is outboxd \
             behind the proxy?"
        );
    }
    fault.lift(proxy);
    let lifted = Instant::now();
    tokio::time::sleep(AFTER).await;
    let rounds = load.finish().await;
    let total = rounds.iter().sum::<u32>() as usize * KEYS_PER_WRITER;
    assert!(
        total as i64 > at_lift + 100,
        "rows written during and after the fault ({total} in all, {at_lift} SUCCESS at the \
         lift)"
    );

    // Every row SUCCESS, in the same process.
    let deadline = Instant::now() + RECOVERY;
    loop {
        let counts = p.status_counts().await;
        if counts.get("SUCCESS").copied() == Some(total as i64) && counts.len() == 1 {
            break;
        }
        assert!(
            daemon.is_running(),
            "outboxd exited after the {fault:?}:\n{}",
            daemon.log_text()
        );
        assert!(
            Instant::now() < deadline,
            "{fault:?}: {total} rows written, not all SUCCESS {RECOVERY:?} after the fault was \
             lifted: {counts:?}; /readyz {}",
            readyz(metrics_port).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let recovered_after = lifted.elapsed();
    common::wait_for(
        "/readyz 200 after the fault",
        Duration::from_secs(30),
        || async { (readyz(metrics_port).await == 200).then_some(()) },
    )
    .await;
    assert!(daemon.is_running(), "the same outboxd process streams on");

    let records = p.consume(total, Duration::from_secs(60));
    let duplicates = assert_delivered_in_key_order(&records, &rounds);
    assert_eq!(records.len(), total + duplicates);
    assert!(
        daemon.terminate().success(),
        "graceful stop exits 0:\n{}",
        daemon.log_text()
    );
    let warnings = daemon
        .log_text()
        .lines()
        .map(without_ansi_colors)
        .filter(|l| (l.contains(" WARN ") || l.contains(" ERROR ")) && !l.contains("holds secrets"))
        .take(12)
        .collect();
    Timings {
        not_ready_after,
        recovered_after,
        rows: total,
        duplicates,
        warnings,
    }
}

/// `line` without the ANSI colour sequences (`ESC [ … m`) of outboxd's text log.
fn without_ansi_colors(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| *c == 'm');
        } else {
            plain.push(c);
        }
    }
    plain
}

fn report<E: Engine>(what: &str, t: &Timings) {
    println!(
        "{} {what}: {} rows, {} duplicates; /readyz not ready {} after the fault; every \
         row SUCCESS {:.1} s after it was lifted",
        E::NAME,
        t.rows,
        t.duplicates,
        t.not_ready_after
            .map_or("never".to_owned(), |d| format!("{:.1} s", d.as_secs_f64())),
        t.recovered_after.as_secs_f64()
    );
    for line in &t.warnings {
        println!("  {line}");
    }
}

/// `config` with the source's `port = <from>` (the first, in `[source]`) made `to`.
fn point_source_at(p_config: &std::path::Path, from: u16, to: u16) {
    let config = std::fs::read_to_string(p_config).expect("read config");
    let before = format!("\nport = {from}\n");
    assert!(config.contains(&before), "the source port in:\n{config}");
    let config = config.replacen(&before, &format!("\nport = {to}\n"), 1);
    std::fs::write(p_config, config).expect("write config");
}

/// The database's silence noticed in seconds rather than minutes: each store call of the
/// relay bounded by `delivery.store_timeout`.
const NOTICE_SILENCE: &str = "\n[delivery]\nstore_timeout = \"5s\"\n";

/// The delivery mode of a database fault's pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    AtLeastOnce,
    /// Kafka transactions with the log position: read back `read_committed`, no row may
    /// come twice.
    ExactlyOnce,
}

impl Mode {
    /// The `[delivery]` section: the database's silence noticed in seconds, and the mode.
    fn delivery(self) -> String {
        match self {
            Mode::AtLeastOnce => NOTICE_SILENCE.to_owned(),
            Mode::ExactlyOnce => {
                format!("{NOTICE_SILENCE}exactly_once = true\ntransaction_interval = \"50ms\"\n")
            }
        }
    }

    /// Checks what the mode promises of the records read back.
    fn check(self, what: &str, timings: &Timings) {
        if self == Mode::ExactlyOnce {
            assert_eq!(
                timings.duplicates, 0,
                "{what}: read_committed sees each row once"
            );
        }
    }
}

/// A PostgreSQL pipeline whose outboxd reaches the server through a proxy, under `fault`.
async fn postgres_fault(fault: Fault, hold: Hold, mode: Mode, prefix: &str) {
    let toxiproxy = Toxiproxy::from_env();
    let port = free_port();
    let extra = format!("{}{}", metrics_section(port), mode.delivery());
    let p = Pipeline::<PgServices>::new(prefix, 3, &extra).await;
    p.init();
    let upstream = format!("{}:{}", p.services.pg_host, p.services.pg_port);
    let proxy = toxiproxy.proxy(&format!("nf_{}", p.name), &upstream);
    point_source_at(&p.config_path, p.services.pg_port, proxy.port);
    // A silent replication connection noticed after 4 s (the test config asks for an
    // answer after 1 s of quiet, `status_interval`) rather than the default 2 minutes.
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    assert!(config.contains("status_interval = \"1s\""), "{config}");
    let port_line = format!("\nport = {}\n", proxy.port);
    let config = config.replacen(
        &port_line,
        &format!("{port_line}silence_timeout = \"4s\"\n"),
        1,
    );
    std::fs::write(&p.config_path, config).expect("write config");
    let timings = fault_under_load(&p, port, &proxy, fault, hold).await;
    report::<PgServices>(&format!("{fault:?}, {mode:?}"), &timings);
    mode.check(&format!("{fault:?}"), &timings);
    drop(proxy);
    p.cleanup().await;
}

/// The same on MariaDB: the binlog stream and the SQL store through the proxy.
async fn mariadb_fault(fault: Fault, hold: Hold, mode: Mode, prefix: &str) {
    let toxiproxy = Toxiproxy::from_env();
    let port = free_port();
    let extra = format!("{}{}", metrics_section(port), mode.delivery());
    let p = Pipeline::<MysqlServices>::new(prefix, 3, &extra).await;
    p.init();
    let upstream = format!("{}:{}", p.services.host, p.services.port);
    let proxy = toxiproxy.proxy(&format!("nf_{}", p.name), &upstream);
    point_source_at(&p.config_path, p.services.port, proxy.port);
    let timings = fault_under_load(&p, port, &proxy, fault, hold).await;
    report::<MysqlServices>(&format!("{fault:?}, {mode:?}"), &timings);
    mode.check(&format!("{fault:?}"), &timings);
    drop(proxy);
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_black_holed_under_load_loses_nothing_and_streams_again() {
    postgres_fault(Fault::BlackHole, Hold::Fixed, Mode::AtLeastOnce, "nfpgbh").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connections_reset_under_load_lose_nothing_and_stream_again() {
    postgres_fault(Fault::ResetPeer, Hold::Fixed, Mode::AtLeastOnce, "nfpgrst").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_cut_for_ten_seconds_under_load_loses_nothing_and_streams_again() {
    postgres_fault(Fault::Cut, Hold::Fixed, Mode::AtLeastOnce, "nfpgcut").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_black_holed_under_load_loses_nothing_and_streams_again() {
    mariadb_fault(Fault::BlackHole, Hold::Fixed, Mode::AtLeastOnce, "nfmybh").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_connections_reset_under_load_lose_nothing_and_stream_again() {
    mariadb_fault(Fault::ResetPeer, Hold::Fixed, Mode::AtLeastOnce, "nfmyrst").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_cut_for_ten_seconds_under_load_loses_nothing_and_streams_again() {
    mariadb_fault(Fault::Cut, Hold::Fixed, Mode::AtLeastOnce, "nfmycut").await;
}

/// A black hole that lasts: outboxd must notice the silent database (`/readyz` not ready)
/// within [`NOTICED_WITHIN`] while it lasts, and recover once it ends. On MariaDB the
/// check of the connection that holds the pipeline's lock gets no answer and the session
/// ends; its drain's write-back through the silent store connection gets none either and
/// is abandoned after `delivery.store_timeout`. On PostgreSQL the silent replication
/// connection is noticed after `source.silence_timeout`, then the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_black_hole_is_noticed_while_it_lasts() {
    mariadb_fault(
        Fault::BlackHole,
        Hold::UntilNoticed,
        Mode::AtLeastOnce,
        "nfmyseen",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_black_hole_is_noticed_while_it_lasts() {
    postgres_fault(
        Fault::BlackHole,
        Hold::UntilNoticed,
        Mode::AtLeastOnce,
        "nfpgseen",
    )
    .await;
}

/// Exactly-once through a black-holed database: the Kafka transactions and the write-back
/// resume on new connections, and a `read_committed` reader sees every row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_black_holed_under_exactly_once_sends_nothing_twice() {
    postgres_fault(Fault::BlackHole, Hold::Fixed, Mode::ExactlyOnce, "nfpgeos").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_black_holed_under_exactly_once_sends_nothing_twice() {
    mariadb_fault(Fault::BlackHole, Hold::Fixed, Mode::ExactlyOnce, "nfmyeos").await;
}

/// Exactly-once with the database's connections reset, or cut, then slowed: the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reset_cut_and_slow_under_exactly_once_send_nothing_twice() {
    for (fault, prefix) in [
        (Fault::ResetPeer, "nfpgeorst"),
        (Fault::Cut, "nfpgeocut"),
        (Fault::Slow, "nfpgeoslow"),
    ] {
        postgres_fault(fault, Hold::Fixed, Mode::ExactlyOnce, prefix).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_reset_cut_and_slow_under_exactly_once_send_nothing_twice() {
    for (fault, prefix) in [
        (Fault::ResetPeer, "nfmyeorst"),
        (Fault::Cut, "nfmyeocut"),
        (Fault::Slow, "nfmyeoslow"),
    ] {
        mariadb_fault(fault, Hold::Fixed, Mode::ExactlyOnce, prefix).await;
    }
}

/// A slow link (every chunk delayed a quarter second each way) for [`FAULT`] under load:
/// slower, nothing lost, nothing reordered, no session given up for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_slow_link_under_load_loses_nothing() {
    postgres_fault(Fault::Slow, Hold::Fixed, Mode::AtLeastOnce, "nfpgslow").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_slow_link_under_load_loses_nothing() {
    mariadb_fault(Fault::Slow, Hold::Fixed, Mode::AtLeastOnce, "nfmyslow").await;
}

/// Kafka black-holed, its connections reset, cut, then slowed, each for [`FAULT`] under
/// load, strict ordering (the default), with a producer timeout five times shorter than
/// the fault: every connection outboxd's producer makes goes through the proxy in front of
/// the broker's PROXIED listener. Each fault at least once, then exactly-once (Kafka
/// transactions with the log position, read back `read_committed`: not a record twice).
/// One test for all: the broker advertises one proxied address, which two tests at once
/// would take from each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_faults_under_load_keep_every_key_in_order_in_both_delivery_modes() {
    let toxiproxy = Toxiproxy::from_env();
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let listen = env("OUTBOXD_TEST_KAFKA_PROXIED", "127.0.0.1:29096");
    let upstream = env("OUTBOXD_TEST_KAFKA_PROXIED_UPSTREAM", "127.0.0.1:29095");
    let proxy = toxiproxy.proxy_at("outboxd_test_kafka", &listen, &upstream);

    for fault in [Fault::BlackHole, Fault::ResetPeer, Fault::Cut, Fault::Slow] {
        for (mode, delivery) in [
            ("at least once", ""),
            (
                "exactly-once",
                "\n[delivery]\nexactly_once = true\ntransaction_interval = \"50ms\"\n",
            ),
        ] {
            let port = free_port();
            let extra = format!("{FAST_FAILURES}{}{delivery}", metrics_section(port));
            let prefix = format!("nfk{}", if delivery.is_empty() { "a" } else { "e" });
            let p = Pipeline::<PgServices>::new(&prefix, 3, &extra).await;
            let config = std::fs::read_to_string(&p.config_path).expect("read config");
            let direct = format!("bootstrap_servers = \"{}\"", p.services.kafka);
            assert!(config.contains(&direct), "{config}");
            let config = config
                .replacen(&direct, &format!("bootstrap_servers = \"{listen}\""), 1)
                .replacen("message_timeout = \"10s\"", "message_timeout = \"2s\"", 1);
            std::fs::write(&p.config_path, config).expect("write config");
            p.init();

            let timings = fault_under_load(&p, port, &proxy, fault, Hold::Fixed).await;
            report::<PgServices>(&format!("Kafka {fault:?}, {mode}"), &timings);
            if !delivery.is_empty() {
                assert_eq!(
                    timings.duplicates, 0,
                    "{fault:?}: read_committed sees each row once"
                );
            }
            p.cleanup().await;
        }
    }
    drop(proxy);
}

/// The helper itself, on a loopback echo server: each toxic does what the tests rely on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_helper_applies_each_toxic() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let echo_port = free_port();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", echo_port))
        .await
        .expect("bind");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let toxiproxy = Toxiproxy::from_env();
    assert!(
        toxiproxy.version().starts_with("v2."),
        "{}",
        toxiproxy.version()
    );
    let proxy = toxiproxy.proxy("nf_helper", &format!("127.0.0.1:{echo_port}"));

    // One round trip through the proxy: the echo, or what went wrong.
    let round_trip = |port: u16, bytes: usize| async move {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(&vec![b'x'; bytes]).await?;
        let mut got = vec![0u8; bytes];
        tokio::time::timeout(Duration::from_secs(2), stream.read_exact(&mut got))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no echo"))??;
        Ok::<_, std::io::Error>(())
    };
    round_trip(proxy.port, 10)
        .await
        .expect("a clean proxy echoes");

    let names = proxy.add_both(Toxic::BLACK_HOLE);
    assert_eq!(names, ["timeout_upstream", "timeout_downstream"]);
    let err = round_trip(proxy.port, 10).await.expect_err("a black hole");
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
    proxy.heal();
    assert!(proxy.toxics().is_empty());
    round_trip(proxy.port, 10).await.expect("healed");

    proxy.add(Toxic::ResetPeer { ms: 0 }, Stream::Upstream);
    let err = round_trip(proxy.port, 10).await.expect_err("reset");
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof
        ),
        "{err}"
    );
    proxy.heal();

    let latency = proxy.add(
        Toxic::Latency {
            ms: 300,
            jitter_ms: 0,
        },
        Stream::Downstream,
    );
    let started = Instant::now();
    round_trip(proxy.port, 10).await.expect("a slow echo");
    assert!(started.elapsed() >= Duration::from_millis(300));
    proxy.remove(&latency);

    proxy.add(Toxic::LimitData { bytes: 100 }, Stream::Downstream);
    round_trip(proxy.port, 100).await.expect("100 bytes pass");
    round_trip(proxy.port, 200)
        .await
        .expect_err("the connection closed after 100 bytes");
    proxy.heal();

    proxy.set_enabled(false);
    let err = round_trip(proxy.port, 10).await.expect_err("cut");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    proxy.set_enabled(true);
    round_trip(proxy.port, 10).await.expect("enabled again");
}
