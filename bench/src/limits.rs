//! The machine's limits, measured beside outboxd: how fast PostgreSQL hands out the log
//! (`pg_recvlogical` with pgoutput to /dev/null) and how fast the broker takes records
//! (Kafka's `ProducerPerformance`, and a keyed rdkafka producer with outboxd's settings).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use tokio::process::Command;

use crate::consume;
use crate::daemon::{CpuSnapshot, Services};
use crate::report::Limits;

/// Streams the slot `slot` with pgoutput (publication `publication`) to /dev/null until
/// the first record past `endpos`, and returns how long that took.
pub(crate) async fn pg_recvlogical(
    services: &Services,
    slot: &str,
    publication: &str,
    endpos: &str,
) -> anyhow::Result<Duration> {
    let bin = services.pg_bin.join("pg_recvlogical");
    let started = Instant::now();
    let out = Command::new(&bin)
        .args(["-h", &services.pg_host, "-p", &services.pg_port.to_string()])
        .args(["-U", &services.pg_user, "-d", &services.pg_database])
        .args(["--slot", slot, "--start", "--no-loop", "--endpos", endpos])
        .args(["-o", "proto_version=1", "-o"])
        .arg(format!("publication_names={publication}"))
        .args(["-f", "/dev/null"])
        .env("PGPASSWORD", &services.pg_password)
        .output()
        .await
        .with_context(|| format!("running {}", bin.display()))?;
    let elapsed = started.elapsed();
    anyhow::ensure!(
        out.status.success(),
        "pg_recvlogical failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(elapsed)
}

/// MariaDB's (or MySQL's) binlog reader, `mysqlbinlog --read-from-remote-server
/// --verbose` (which decodes every row event), from `file`:`position` to the end of the
/// last binlog, to /dev/null: the binlog's side of the limit, read as a replica reads
/// it. Returns how long it took.
pub(crate) async fn mysqlbinlog(
    services: &Services,
    file: &str,
    position: u64,
) -> anyhow::Result<Duration> {
    let bin = ["mariadb-binlog", "mysqlbinlog"]
        .into_iter()
        .find(|b| which(b))
        .context("neither mariadb-binlog nor mysqlbinlog is installed")?;
    let started = Instant::now();
    let out = Command::new(bin)
        .arg("--read-from-remote-server")
        .arg(format!("--host={}", services.mysql_host))
        .arg(format!("--port={}", services.mysql_port))
        .arg(format!("--user={}", services.mysql_user))
        .arg(format!("--start-position={position}"))
        .args(["--to-last-log", "--verbose", file])
        .env("MYSQL_PWD", &services.mysql_password)
        .stdout(std::process::Stdio::null())
        .output()
        .await
        .with_context(|| format!("running {bin}"))?;
    let elapsed = started.elapsed();
    anyhow::ensure!(
        out.status.success(),
        "{bin} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(elapsed)
}

/// Whether `program` is on the PATH.
fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// Kafka's own `ProducerPerformance` with outboxd's producer settings; records/s.
pub(crate) async fn producer_performance(
    services_script: &Path,
    kafka: &str,
    topic: &str,
    records: usize,
    record_size: usize,
) -> anyhow::Result<(f64, String)> {
    let out = Command::new(services_script)
        .args(["kafka-tool", "org.apache.kafka.tools.ProducerPerformance"])
        .args(["--topic", topic, "--num-records", &records.to_string()])
        .args([
            "--record-size",
            &record_size.to_string(),
            "--throughput",
            "-1",
        ])
        .arg("--producer-props")
        .arg(format!("bootstrap.servers={kafka}"))
        .args([
            "acks=all",
            "enable.idempotence=true",
            "compression.type=lz4",
            "linger.ms=10",
        ])
        .output()
        .await
        .with_context(|| format!("running {} kafka-tool", services_script.display()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    anyhow::ensure!(
        out.status.success(),
        "ProducerPerformance failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The summary is the last line: "N records sent, X records/sec (Y MB/sec), …".
    let summary = text
        .lines()
        .rev()
        .find(|l| l.contains("records/sec"))
        .context("no summary line from ProducerPerformance")?
        .to_owned();
    let rate = summary
        .split(", ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .context("cannot parse the ProducerPerformance summary")?;
    Ok((rate, summary))
}

/// An rdkafka producer with outboxd's settings (idempotent, acks=all, lz4, linger 10 ms,
/// murmur2), keyed over `keys` keys, with the four headers outboxd adds; records/s.
pub(crate) async fn rdkafka_keyed(
    kafka: &str,
    topic: &str,
    records: usize,
    payload_bytes: usize,
    keys: u64,
) -> anyhow::Result<f64> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("compression.type", "lz4")
        .set("linger.ms", "10")
        .set("partitioner", "murmur2_random")
        .create()?;
    let payload = format!(
        "{{\"pad\":\"{}\"}}",
        "x".repeat(payload_bytes.saturating_sub(10))
    );
    let started = Instant::now();
    let mut pending = Vec::with_capacity(records.min(100_000));
    let mut acked = 0usize;
    for i in 0..records {
        let key = format!("key-{}", (i as u64).wrapping_mul(0x9E37_79B9) % keys.max(1));
        let id = format!("limit-{i}");
        let headers = OwnedHeaders::new_with_capacity(4)
            .insert(Header {
                key: "message_id",
                value: Some(id.as_bytes()),
            })
            .insert(Header {
                key: "message_type",
                value: Some("bench.event".as_bytes()),
            })
            .insert(Header {
                key: "biz_key",
                value: Some(key.as_bytes()),
            })
            .insert(Header {
                key: "created_at",
                value: Some("2026-01-01T00:00:00.000000+00:00".as_bytes()),
            });
        let mut record = FutureRecord::to(topic)
            .key(key.as_bytes())
            .payload(payload.as_bytes())
            .headers(headers);
        loop {
            match producer.send_result(record) {
                Ok(future) => {
                    pending.push(future);
                    break;
                }
                Err((_, returned)) => {
                    record = returned;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
        if pending.len() >= 100_000 {
            for f in pending.drain(..) {
                acked += usize::from(matches!(f.await, Ok(Ok(_))));
            }
        }
    }
    for f in pending.drain(..) {
        acked += usize::from(matches!(f.await, Ok(Ok(_))));
    }
    let elapsed = started.elapsed();
    producer.flush(Duration::from_secs(10))?;
    anyhow::ensure!(
        acked == records,
        "only {acked} of {records} records acknowledged"
    );
    Ok(records as f64 / elapsed.as_secs_f64())
}

impl crate::Bench {
    pub(crate) async fn kafka_limits(&mut self) -> anyhow::Result<Limits> {
        let records = self.args.backlog_events;
        // Key and the four headers outboxd adds come to about 100 bytes per record.
        let record_size = self.args.payload_bytes + 100;
        let ppt = format!("bench.{}.limit_ppt", self.run);
        consume::create_topic(&self.services.kafka, &ppt, self.args.partitions).await?;
        self.topics.push(ppt.clone());
        eprintln!("Kafka ProducerPerformance, {records} records of {record_size} bytes");
        let before = CpuSnapshot::take();
        let (java, summary) = producer_performance(
            &self.args.services_script,
            &self.services.kafka,
            &ppt,
            records,
            record_size,
        )
        .await?;
        let java_cpu = CpuSnapshot::take().per_million_since(&before, records);
        let keyed = format!("bench.{}.limit_rdk", self.run);
        consume::create_topic(&self.services.kafka, &keyed, self.args.partitions).await?;
        self.topics.push(keyed.clone());
        eprintln!("rdkafka keyed producer, {records} records");
        let before = CpuSnapshot::take();
        let rdkafka = rdkafka_keyed(
            &self.services.kafka,
            &keyed,
            records,
            self.args.payload_bytes,
            self.args.keys,
        )
        .await?;
        let rdkafka_cpu = CpuSnapshot::take().per_million_since(&before, records);
        Ok(Limits {
            kafka_producer_performance: Some(java),
            kafka_producer_performance_cpu: Some(java_cpu),
            kafka_rdkafka_keyed_cpu: Some(rdkafka_cpu),
            kafka_producer_performance_summary: summary,
            kafka_rdkafka_keyed: Some(rdkafka),
            ..Limits::default()
        })
    }
}
