//! The inbox: Kafka → outboxd's inbox on PostgreSQL → a no-op SQL handler (`SELECT 1`,
//! run in the transaction that marks each message DONE).
//!
//! - Backlog: `inbox_backlog_events` records already in the topic, one in ten a
//!   redelivery of the record before it; outboxd starts and ingests them. Ingest rate =
//!   records read (duplicates included) / time until every unique message is stored;
//!   handled rate = unique messages / time until every one is DONE.
//! - Fixed rate: `inbox_rate` records/s for `poll_seconds`; latency = the broker's append
//!   time (the topic uses LogAppendTime; the producer's delivery report carries it) → the
//!   row's `processed_at`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::stream::{FuturesUnordered, StreamExt};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

use crate::daemon::{self, Daemon};
use crate::report::{Latency, Row};
use crate::{consume, wait_ready, Bench};

/// Records in flight to the broker at once while producing.
const PRODUCE_WINDOW: usize = 5000;

impl Bench {
    /// Both inbox runs; each its own table, topic and outboxd.
    pub(crate) async fn inbox(&mut self) -> anyhow::Result<Vec<Row>> {
        let backlog = self.inbox_backlog().await?;
        let rate = self.inbox_fixed_rate().await?;
        Ok(vec![backlog, rate])
    }

    /// Topic, table and config of one inbox run; `init` done.
    async fn inbox_setup(&mut self, scenario: &str) -> anyhow::Result<InboxRun> {
        let topic = format!("bench.{}.{scenario}", self.run);
        consume::create_topic(&self.services.kafka, &topic, self.args.partitions).await?;
        self.topics.push(topic.clone());
        let services = self.services.clone();
        self.inbox_on(scenario, &topic, &services, ("", "")).await
    }

    /// An inbox of its own (tables, config, `init` done) reading `topic`, reaching the
    /// servers at `s`; `extra`: more lines of its `[inbox]` section, and sections appended.
    pub(crate) async fn inbox_on(
        &self,
        scenario: &str,
        topic: &str,
        s: &crate::daemon::Services,
        (inbox_keys, sections): (&str, &str),
    ) -> anyhow::Result<InboxRun> {
        let name = format!("bench_{}_{scenario}", self.run);
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let text = format!(
            r#"[source]
kind = "postgres"
host = "{}"
port = {}
user = "{}"
password = "{}"
database = "{}"
sslmode = "disable"

[metrics]
listen = "127.0.0.1:{port}"

[inbox]
table = "inbox_{name}"
workers = 16
{inbox_keys}

[inbox.kafka]
bootstrap_servers = "{}"
topics = ["{topic}"]
group_id = "{name}"

[inbox.handlers.default]
kind = "sql"
statement = "SELECT 1"
{sections}
"#,
            s.pg_host, s.pg_port, s.pg_user, s.pg_password, s.pg_database, s.kafka
        );
        let config = self.dir.join(format!("{name}.toml"));
        std::fs::write(&config, text)?;
        daemon::outboxd_once(&self.args.outboxd, "init", &config).await?;
        Ok(InboxRun {
            name,
            topic: topic.to_owned(),
            port,
            config,
        })
    }

    async fn inbox_backlog(&mut self) -> anyhow::Result<Row> {
        let run = self.inbox_setup("inbox_backlog").await?;
        let records = self.args.inbox_backlog_events;
        eprintln!("inbox: producing a backlog of {records} records (one in ten a redelivery)");
        let producer = producer(&self.services.kafka)?;
        let mut unique = 0usize;
        let mut sends = FuturesUnordered::new();
        for n in 0..records {
            // Every tenth record repeats the one before it: a redelivery.
            let id = if n % 10 == 9 { n - 1 } else { n };
            if id == n {
                unique += 1;
            }
            sends.push(send(&producer, &run.topic, id, self.args.payload_bytes));
            if sends.len() >= PRODUCE_WINDOW {
                sends.next().await.transpose()?;
            }
        }
        while let Some(sent) = sends.next().await {
            sent?;
        }

        let mut daemon = Daemon::spawn(
            &self.args.outboxd,
            &run.config,
            self.dir.join("inbox_backlog.log"),
        )?;
        let started = Instant::now();
        let cpu0 = daemon.sample().unwrap_or_default().cpu_seconds;
        let (mut first_at, mut stored_at, mut done_at) = (None, None, None);
        let counts = format!(
            "SELECT count(*), count(*) FILTER (WHERE status = 'DONE') FROM inbox_{}",
            run.name
        );
        let mut peak = daemon.sample().unwrap_or_default();
        while done_at.is_none() {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(600),
                "inbox backlog not handled in 10 minutes:\n{}",
                daemon.log_tail()
            );
            anyhow::ensure!(
                daemon.is_running(),
                "outboxd exited:\n{}",
                daemon.log_tail()
            );
            let row = self.sql.query_one(&counts, &[]).await?;
            let (rows, done): (i64, i64) = (row.get(0), row.get(1));
            if first_at.is_none() && rows > 0 {
                first_at = Some(started.elapsed());
            }
            if stored_at.is_none() && rows as usize >= unique {
                stored_at = Some(started.elapsed());
            }
            if done as usize >= unique {
                done_at = Some(started.elapsed());
            }
            if let Some(sample) = daemon.sample() {
                peak = sample;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let cpu = peak.cpu_seconds - cpu0;
        let _ = daemon.terminate(Duration::from_secs(30)).await;
        let (first, stored, done) = (
            first_at.unwrap_or_default().as_secs_f64(),
            stored_at.unwrap_or_default().as_secs_f64(),
            done_at.unwrap_or_default().as_secs_f64(),
        );
        let mut row = Row::named("inbox ingest backlog (Kafka → PostgreSQL inbox)");
        row.events = records;
        // From the first row stored (the consumer group's join before it is start-up, not
        // ingest) to the last; the table is polled every 50 ms.
        row.events_per_s = Some(records as f64 / (stored - first).max(0.05));
        row.set_process(peak, cpu, records);
        row.duplicates = Some(records - unique);
        row.note = format!(
            "first row stored {first:.1}s after start (group join), all {unique} unique by \
             {stored:.1}s; all DONE by {done:.1}s = {:.0} handled/s",
            unique as f64 / (done - first).max(1e-3)
        );
        self.drop_inbox_tables(&run.name).await;
        Ok(row)
    }

    async fn inbox_fixed_rate(&mut self) -> anyhow::Result<Row> {
        let run = self.inbox_setup("inbox_rate").await?;
        let rate = self.args.inbox_rate;
        let events = (rate * self.args.poll_seconds) as usize;
        let mut daemon = Daemon::spawn(
            &self.args.outboxd,
            &run.config,
            self.dir.join("inbox_rate.log"),
        )?;
        wait_ready(&mut daemon, run.port, Duration::from_secs(30)).await?;
        // The consumer group's first join takes a few seconds: send a first record and
        // wait for it, so the timed run measures steady state.
        let producer = producer(&self.services.kafka)?;
        send(&producer, &run.topic, usize::MAX, self.args.payload_bytes).await?;
        let first = format!(
            "SELECT count(*) FROM inbox_{} WHERE status = 'DONE'",
            run.name
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.sql.query_one(&first, &[]).await?.get::<_, i64>(0) < 1 {
            anyhow::ensure!(
                Instant::now() < deadline,
                "inbox not consuming:\n{}",
                daemon.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!("inbox: {rate} records/s for {} s", self.args.poll_seconds);
        let cpu0 = daemon.sample().unwrap_or_default().cpu_seconds;
        let started = Instant::now();
        let mut appended: HashMap<String, i64> = HashMap::with_capacity(events);
        let mut sends = FuturesUnordered::new();
        for n in 0..events {
            let due = started + Duration::from_secs_f64(n as f64 / rate);
            loop {
                let now = Instant::now();
                if now >= due {
                    break;
                }
                tokio::select! {
                    Some(sent) = sends.next(), if !sends.is_empty() => {
                        let (id, ms) = sent?;
                        appended.insert(id, ms);
                    }
                    () = tokio::time::sleep(due - now) => {}
                }
            }
            sends.push(send(&producer, &run.topic, n, self.args.payload_bytes));
        }
        while let Some(sent) = sends.next().await {
            let (id, ms) = sent?;
            appended.insert(id, ms);
        }
        let done_sql = format!(
            "SELECT message_id, (extract(epoch FROM processed_at) * 1000)::float8, \
             (extract(epoch FROM created_at) * 1000)::float8 FROM inbox_{} \
             WHERE status = 'DONE' AND message_id <> $1",
            run.name
        );
        let sentinel = id_of(usize::MAX);
        let deadline = Instant::now() + Duration::from_secs(120);
        let rows = loop {
            let rows = self.sql.query(&done_sql, &[&sentinel]).await?;
            if rows.len() >= events || Instant::now() > deadline {
                break rows;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let sample = daemon.sample().unwrap_or_default();
        let _ = daemon.terminate(Duration::from_secs(30)).await;
        let mut latencies = Vec::with_capacity(rows.len());
        let (mut to_stored, mut to_done) = (Vec::new(), Vec::new());
        for r in &rows {
            let id: String = r.get(0);
            let (done, stored): (f64, f64) = (r.get(1), r.get(2));
            if let Some(append) = appended.get(&id) {
                latencies.push(done - *append as f64);
                to_stored.push(stored - *append as f64);
                to_done.push(done - stored);
            }
        }
        for v in [&mut latencies, &mut to_stored, &mut to_done] {
            v.sort_by(f64::total_cmp);
        }
        let part = |v: &[f64]| {
            Latency::from_sorted(v).map_or("-".into(), |l| {
                format!("p50 {:.1} / p99 {:.1} ms", l.p50, l.p99)
            })
        };
        let mut row = Row::named(&format!("inbox @{rate} msg/s: append → DONE"));
        row.events = events;
        row.events_per_s = Some(events as f64 / started.elapsed().as_secs_f64());
        row.latency = Latency::from_sorted(&latencies);
        row.set_process(sample, sample.cpu_seconds - cpu0, events);
        row.note = format!(
            "no-op SQL handler; {} of {events} DONE within 2 min; append → stored {}, stored → \
             DONE {}",
            latencies.len(),
            part(&to_stored),
            part(&to_done)
        );
        self.drop_inbox_tables(&run.name).await;
        Ok(row)
    }

    pub(crate) async fn drop_inbox_tables(&self, name: &str) {
        let _ = self
            .sql
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS inbox_{name}, outbox_{name}; \
                 DELETE FROM outboxd_checkpoint WHERE pipeline = '{name}'"
            ))
            .await;
    }
}

pub(crate) struct InboxRun {
    pub(crate) name: String,
    topic: String,
    pub(crate) port: u16,
    pub(crate) config: std::path::PathBuf,
}

fn producer(kafka: &str) -> anyhow::Result<FutureProducer> {
    ClientConfig::new()
        .set("bootstrap.servers", kafka)
        .set("linger.ms", "2")
        .set("message.timeout.ms", "30000")
        .create()
        .context("creating the bench producer")
}

fn id_of(n: usize) -> String {
    format!("m-{n}")
}

/// Sends record `n` as outboxd's relay would; returns its id and the broker's append time
/// in milliseconds.
async fn send(
    producer: &FutureProducer,
    topic: &str,
    n: usize,
    payload_bytes: usize,
) -> anyhow::Result<(String, i64)> {
    let id = id_of(n);
    let key = format!("k-{}", n % 1000);
    let pad = "x".repeat(payload_bytes.saturating_sub(24));
    let payload = format!(r#"{{"n": {}, "pad": "{pad}"}}"#, n % 1_000_000_000);
    let message_type = format!("t-{n}");
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "message_id",
            value: Some(&id),
        })
        .insert(Header {
            key: "message_type",
            value: Some(&message_type),
        })
        .insert(Header {
            key: "biz_key",
            value: Some(&key),
        });
    let record = FutureRecord::to(topic)
        .key(&key)
        .payload(&payload)
        .headers(headers);
    let delivery = producer
        .send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| anyhow::anyhow!("producing: {e}"))?;
    Ok((id, delivery.timestamp.to_millis().unwrap_or(0)))
}
