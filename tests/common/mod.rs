//! Shared harness of the end-to-end tests: real PostgreSQL, MariaDB and Kafka started by
//! `scripts/services`, the real `outboxd` binary, names unique per test so tests run in
//! parallel. Nothing here is mocked. `engine.rs` is the pipeline fixture over an engine
//! (`postgres.rs`, `mysql.rs`); `scenarios.rs` the end-to-end cases every engine passes.

#![allow(dead_code, unreachable_pub)]

pub mod engine;
pub mod inbox;
pub mod mysql;
pub mod postgres;
pub mod scenarios;
pub mod toxiproxy;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::TopicPartitionList;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// Polls `condition` until it returns `Some` or `timeout` passes.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut condition: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = condition().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn kafka_admin(kafka: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", kafka)
        .create()
        .expect("admin client")
}

/// Whether the cluster has `topic` (asked without creating it).
pub fn topic_exists(kafka: &str, topic: &str) -> bool {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka)
        .set("allow.auto.create.topics", "false")
        .create()
        .expect("metadata client");
    let metadata = consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("cluster metadata");
    metadata.topics().iter().any(|t| t.name() == topic)
}

/// Creates a topic with topic-level configs such as `max.message.bytes`.
pub async fn create_topic_with(
    kafka: &str,
    topic: &str,
    partitions: i32,
    configs: &[(&str, &str)],
) {
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for (key, value) in configs {
        new = new.set(key, value);
    }
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = kafka_admin(kafka)
        .create_topics([&new], &options)
        .await
        .expect("create topic");
    for result in results {
        if let Err((topic, code)) = result {
            panic!("creating topic {topic}: {code:?}");
        }
    }
}

/// Changes one topic-level config.
pub async fn alter_topic(kafka: &str, topic: &str, key: &str, value: &str) {
    let change = AlterConfig::new(ResourceSpecifier::Topic(topic)).set(key, value);
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = kafka_admin(kafka)
        .alter_configs([&change], &options)
        .await
        .expect("alter topic");
    for result in results {
        if let Err((resource, code)) = result {
            panic!("altering {resource:?}: {code:?}");
        }
    }
}

/// Runs an outboxd subcommand on `config` to completion.
pub fn run_outboxd(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args(args)
        .arg("--config")
        .arg(config)
        .env("OUTBOXD_LOG", "info")
        .output()
        .expect("run outboxd")
}

/// `outboxd init`, which must succeed.
pub fn init_outboxd(config: &Path) {
    let out = run_outboxd(config, &["init"]);
    assert!(
        out.status.success(),
        "outboxd init failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `future` to completion on a runtime of its own in another thread: async set-up
/// (the runtime role's grants) from a test's synchronous helpers, whatever runtime the
/// calling test is on.
pub fn block_on_thread<F: std::future::Future + Send>(future: F) -> F::Output
where
    F::Output: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime")
                    .block_on(future)
            })
            .join()
            .expect("set-up thread")
    })
}

/// Starts `outboxd run` on `config` in the background, logging to `log` with `filter`.
pub fn spawn_outboxd(config: &Path, log: &Path, filter: &str) -> Daemon {
    let file = std::fs::File::create(log).expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args(["run", "--config"])
        .arg(config)
        .env("OUTBOXD_LOG", filter)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("spawn outboxd run");
    Daemon {
        child: Some(child),
        log: log.to_path_buf(),
    }
}

/// A running `outboxd run`; killed on drop.
pub struct Daemon {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Daemon {
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
        }
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("daemon already stopped");
        let pid = child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill -TERM");
        child.wait().expect("wait for outboxd")
    }

    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process's peak resident memory so far (`VmHWM`), in KiB; `None` once stopped.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let pid = self.child.as_ref()?.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
    }
}

impl Drop for Daemon {
    /// Kills the daemon; when the test is failing, prints the end of its log first, so a
    /// failure in CI shows what the daemon did (its log file is in a temporary directory
    /// gone with the machine).
    fn drop(&mut self) {
        if std::thread::panicking() {
            let text = self.log_text();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(60)..];
            eprintln!(
                "--- the last {} lines of {} ---\n{}\n---",
                tail.len(),
                self.log.display(),
                tail.join("\n")
            );
        }
        self.kill9();
    }
}

/// One consumed record.
#[derive(Clone, Debug)]
pub struct Record {
    pub key: String,
    pub payload: String,
    pub partition: i32,
    pub offset: i64,
    pub headers: HashMap<String, String>,
}

/// Reads every partition of `topic` from the beginning until `expected` records (or
/// more) have been seen and the topic has been quiet for `settle`, or `timeout` passes.
pub fn consume_all(
    kafka: &str,
    topic: &str,
    partitions: i32,
    expected: usize,
    timeout: Duration,
) -> Vec<Record> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka)
        .set(
            "group.id",
            format!("it-{topic}-{}", rand::thread_rng().gen::<u32>()),
        )
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions {
        assignment
            .add_partition_offset(topic, p, rdkafka::Offset::Beginning)
            .expect("assignment");
    }
    consumer.assign(&assignment).expect("assign");
    let deadline = Instant::now() + timeout;
    let settle = Duration::from_millis(1500);
    let mut last_record = Instant::now();
    let mut records = Vec::new();
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let mut headers = HashMap::new();
                if let Some(h) = m.headers() {
                    for header in h.iter() {
                        let value = header
                            .value
                            .map(|v| String::from_utf8_lossy(v).into_owned());
                        headers.insert(header.key.to_owned(), value.unwrap_or_default());
                    }
                }
                records.push(Record {
                    key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                    payload: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                    partition: m.partition(),
                    offset: m.offset(),
                    headers,
                });
                last_record = Instant::now();
            }
            // librdkafka reports a broker connection that drops (or a broker just back
            // from a pause) as an error event and reconnects by itself: keep reading. The
            // caller checks what was read.
            Some(Err(rdkafka::error::KafkaError::MessageConsumption(code)))
                if matches!(
                    code,
                    rdkafka::types::RDKafkaErrorCode::AllBrokersDown
                        | rdkafka::types::RDKafkaErrorCode::BrokerTransportFailure
                ) =>
            {
                eprintln!("consumer: {code} (transient, reading on)");
            }
            Some(Err(e)) => panic!("consumer error: {e}"),
            None => {
                if records.len() >= expected && last_record.elapsed() > settle {
                    break;
                }
            }
        }
    }
    records
}

/// The `seq` header of each key's records, in partition-offset order.
pub fn seqs_by_key(records: &[Record]) -> std::collections::BTreeMap<String, Vec<u32>> {
    let mut sorted: Vec<&Record> = records.iter().collect();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    let mut by_key: std::collections::BTreeMap<String, Vec<u32>> = Default::default();
    for r in sorted {
        let seq = r
            .headers
            .get("seq")
            .and_then(|s| s.parse().ok())
            .expect("seq header");
        by_key.entry(r.key.clone()).or_default().push(seq);
    }
    by_key
}

/// Kafka's Java client `murmur2` (the default partitioner's hash), written from its
/// published algorithm, to check that outboxd puts keys where Java would.
pub fn java_murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let length = data.len() as u32;
    let mut h: u32 = SEED ^ length;
    let chunks = data.chunks_exact(4);
    let tail = chunks.remainder();
    for chunk in chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    match tail.len() {
        3 => {
            h ^= u32::from(tail[2]) << 16;
            h ^= u32::from(tail[1]) << 8;
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        2 => {
            h ^= u32::from(tail[1]) << 8;
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        1 => {
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        _ => {}
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Java's default partitioner picks for a keyed record.
pub fn java_partition(key: &str, partitions: i32) -> i32 {
    (java_murmur2(key.as_bytes()) & 0x7fff_ffff) % partitions
}

/// A loopback port for a daemon's HTTP endpoint that no other test of this run is given
/// (see `outboxd_conformance::ports` for why not `bind(0)`).
pub use outboxd_conformance::ports::free_loopback_port as free_port;

/// The `[metrics]` section that serves the endpoint on `127.0.0.1:<port>`.
pub fn metrics_section(port: u16) -> String {
    format!("\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n")
}

/// `GET path` on `127.0.0.1:port`: (status, body), or `None` while nothing answers.
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.ok()?;
    let status = reply.split(' ').nth(1)?.parse().ok()?;
    let body = reply.split_once("\r\n\r\n")?.1.to_owned();
    Some((status, body))
}

/// The value of the first sample of `name` (with exactly these labels, `""` for none) in a
/// Prometheus text exposition.
pub fn metric_value(exposition: &str, name: &str, labels: &str) -> Option<f64> {
    let series = format!("{name}{labels} ");
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
}

/// Signals without waiting, for tests of the shutdown sequence.
impl Daemon {
    /// Sends `signal` (e.g. `"TERM"`) and returns at once.
    pub fn send_signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("daemon already stopped");
        Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()
            .expect("kill");
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(child) = &mut self.child {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Some(status);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}
