//! Prometheus metrics in the text exposition format (version 0.0.4), written by hand: a
//! dozen series do not need a metrics library.
//!
//! Two kinds of values:
//! - what the pipeline counts as it runs ([`PipelineStats`], [`PipelineMetrics`]): atomics
//!   and one short mutex per acknowledgement, no allocation once a topic has been seen;
//! - what only the database knows (rows by status, oldest unsent row, slot lag), asked
//!   through [`OutboxAdmin::status_summary`] **on scrape** and cached for
//!   [`STATUS_CACHE`], so an outboxd that nobody scrapes sends no query to the outbox
//!   table while it is idle, and a busy scraper costs at most one query per 15 s.
//!
//! Kafka reachability for `/readyz` is a metadata request cached for [`KAFKA_CHECK`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outboxd_connector::{Connector, OutboxAdmin, Position, StatusSummary};

use crate::http::{Response, Routes};
use crate::relay::PipelineStats;
use crate::sink::Sink;

/// The database's status summary is queried at most this often.
pub const STATUS_CACHE: Duration = Duration::from_secs(15);
/// Kafka's reachability is checked at most this often.
pub const KAFKA_CHECK: Duration = Duration::from_secs(10);
/// How long one reachability check may take.
const KAFKA_CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// Upper bounds, in seconds, of the publish latency histogram's buckets.
const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// The statuses reported by `outboxd_outbox_rows`, always all of them (0 when absent), so
/// an alert on one of them has a series to look at.
const REPORTED_STATUSES: [&str; 4] = ["INIT", "PROCESSING", "FAILED", "MANUAL_REQUIRED"];

/// A histogram with fixed buckets; observations are lock-free.
#[derive(Debug)]
struct Histogram {
    /// Observations per bucket (not cumulative); the last one is `+Inf`.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    fn observe(&self, value: Duration) {
        let seconds = value.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(value.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        header(out, name, "histogram", help);
        let mut cumulative = 0;
        for (i, bucket) in self.buckets.iter().enumerate() {
            cumulative += bucket.load(Ordering::Relaxed);
            match LATENCY_BUCKETS.get(i) {
                Some(bound) => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
                }
            }
        }
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {}", self.count.load(Ordering::Relaxed));
    }
}

/// Per-topic event counts.
#[derive(Debug, Default, Clone, Copy)]
struct TopicCounts {
    published: u64,
    failed: u64,
}

/// What the pipeline records for metrics beyond its plain counters: outcomes by topic,
/// the commit → acknowledgement latency, the lag, and when the position was last confirmed.
#[derive(Debug, Default)]
pub struct PipelineMetrics {
    topics: Mutex<BTreeMap<String, TopicCounts>>,
    latency: Histogram,
    /// Commit time (µs since the Unix epoch) the end-to-end lag is measured from.
    lag_base_micros: AtomicU64,
    confirmed_at: Mutex<Option<Instant>>,
}

impl PipelineMetrics {
    /// Kafka acknowledged a record of `topic` whose transaction committed at `commit_time`.
    pub fn acked(&self, topic: &str, commit_time: Option<SystemTime>) {
        self.count(topic, |c| c.published += 1);
        if let Some(commit) = commit_time {
            let now = SystemTime::now();
            // A commit clock ahead of ours counts as zero latency.
            self.latency
                .observe(now.duration_since(commit).unwrap_or_default());
            self.lag_base_micros
                .store(unix_micros(commit), Ordering::Relaxed);
        }
    }

    /// A record of `topic` was not delivered (its row becomes FAILED).
    pub fn failed(&self, topic: &str) {
        self.count(topic, |c| c.failed += 1);
    }

    /// A transaction was read from the log while nothing was in flight: the lag is
    /// measured from its commit until the next acknowledgement.
    pub fn read_while_idle(&self, commit_time: Option<SystemTime>) {
        if let Some(commit) = commit_time {
            self.lag_base_micros
                .store(unix_micros(commit), Ordering::Relaxed);
        }
    }

    /// The log position was confirmed to the source just now.
    pub fn confirmed(&self) {
        if let Ok(mut at) = self.confirmed_at.lock() {
            *at = Some(Instant::now());
        }
    }

    fn count(&self, topic: &str, update: impl FnOnce(&mut TopicCounts)) {
        let Ok(mut topics) = self.topics.lock() else {
            return;
        };
        match topics.get_mut(topic) {
            Some(counts) => update(counts),
            None => {
                let mut counts = TopicCounts::default();
                update(&mut counts);
                topics.insert(topic.to_owned(), counts);
            }
        }
    }
}

fn unix_micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The log position as one number: the LSN on PostgreSQL; on MySQL/MariaDB the binlog
/// file's sequence number in the high 32 bits and the offset in the low 32 bits, so the
/// number grows as the position does.
pub fn position_number(position: &Position) -> u64 {
    match position {
        Position::Lsn(lsn) => lsn.0,
        Position::Binlog(b) => {
            let file: u64 = b
                .file
                .rsplit('.')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            (file << 32) | (b.offset & 0xFFFF_FFFF)
        }
    }
}

/// Values of one scrape that come from outside the pipeline's counters.
#[derive(Debug, Default)]
pub struct ScrapeInputs<'a> {
    /// Records in librdkafka's queue or in flight to the broker.
    pub producer_queue: i64,
    /// The database's summary, when the last query succeeded.
    pub status: Option<&'a StatusSummary>,
    /// Whether the last status query succeeded (`None`: not asked yet).
    pub status_ok: Option<bool>,
    /// Result of the last Kafka reachability check (`None`: not checked yet).
    pub kafka_reachable: Option<bool>,
}

/// Renders every metric.
pub fn render(stats: &PipelineStats, inputs: &ScrapeInputs<'_>) -> String {
    let mut out = String::with_capacity(4096);
    let m = &stats.metrics;
    let now = SystemTime::now();

    let topics = m.topics.lock().map(|t| t.clone()).unwrap_or_default();
    header(
        &mut out,
        "outboxd_events_published_total",
        "counter",
        "Records acknowledged by Kafka, by topic.",
    );
    for (topic, counts) in &topics {
        let _ = writeln!(
            out,
            "outboxd_events_published_total{{topic=\"{}\"}} {}",
            escape_label(topic),
            counts.published
        );
    }
    header(
        &mut out,
        "outboxd_events_failed_total",
        "counter",
        "Records Kafka did not take (their rows became FAILED), by topic.",
    );
    for (topic, counts) in &topics {
        let _ = writeln!(
            out,
            "outboxd_events_failed_total{{topic=\"{}\"}} {}",
            escape_label(topic),
            counts.failed
        );
    }
    m.latency.render(
        &mut out,
        "outboxd_publish_latency_seconds",
        "From the source transaction's commit to Kafka's acknowledgement of the record.",
    );

    let in_flight = stats.in_flight.load(Ordering::Relaxed);
    let lag = match m.lag_base_micros.load(Ordering::Relaxed) {
        base if in_flight > 0 && base > 0 => (unix_micros(now).saturating_sub(base)) as f64 / 1e6,
        _ => 0.0,
    };
    gauge(
        &mut out,
        "outboxd_lag_seconds",
        "Now minus the commit time of the last event Kafka acknowledged, while events are \
         in flight; 0 when none is.",
        lag,
    );
    gauge(
        &mut out,
        "outboxd_events_in_flight",
        "Events read from the log and not yet written back.",
        in_flight as f64,
    );
    counter(
        &mut out,
        "outboxd_transactions_total",
        "Committed transactions with outbox rows read from the log.",
        stats.transactions.load(Ordering::Relaxed),
    );
    counter(
        &mut out,
        "outboxd_events_parked_total",
        "Events held back behind an earlier failed event of the same key (strict ordering).",
        stats.parked.load(Ordering::Relaxed),
    );
    header(
        &mut out,
        "outboxd_retries_total",
        "counter",
        "Publish attempts of rows that had failed before (retry worker or poll mode), by outcome.",
    );
    for (outcome, value) in [
        ("published", stats.retried.load(Ordering::Relaxed)),
        ("failed", stats.retry_failed.load(Ordering::Relaxed)),
    ] {
        let _ = writeln!(
            out,
            "outboxd_retries_total{{outcome=\"{outcome}\"}} {value}"
        );
    }
    counter(
        &mut out,
        "outboxd_rows_reaped_total",
        "Rows returned from an abandoned PROCESSING claim by the reaper.",
        stats.reaped.load(Ordering::Relaxed),
    );
    gauge(
        &mut out,
        "outboxd_producer_queue_depth",
        "Records in the Kafka producer's queue or in flight to the broker.",
        inputs.producer_queue as f64,
    );
    gauge(
        &mut out,
        "outboxd_source_streaming",
        "1 while the log stream is open.",
        bool_value(stats.streaming.load(Ordering::Relaxed)),
    );
    if let Some(reachable) = inputs.kafka_reachable {
        gauge(
            &mut out,
            "outboxd_kafka_reachable",
            "1 if the last cluster metadata request (at most every 10 s) succeeded.",
            bool_value(reachable),
        );
    }

    let confirmed = stats.confirmed.lock().ok().and_then(|c| c.clone());
    if let Some(position) = confirmed {
        // Written as an integer: an LSN above 2^53 would lose digits as a float.
        header(
            &mut out,
            "outboxd_checkpoint_position",
            "gauge",
            "The last log position confirmed to the source, as a number (PostgreSQL: the LSN).",
        );
        let _ = writeln!(
            out,
            "outboxd_checkpoint_position {}",
            position_number(&position)
        );
    }
    if let Some(at) = m.confirmed_at.lock().ok().and_then(|at| *at) {
        gauge(
            &mut out,
            "outboxd_checkpoint_age_seconds",
            "Seconds since the log position was last confirmed.",
            at.elapsed().as_secs_f64(),
        );
    }

    if let Some(ok) = inputs.status_ok {
        gauge(
            &mut out,
            "outboxd_status_query_up",
            "1 if the last status query on the outbox table succeeded (asked on scrape, \
             at most every 15 s).",
            bool_value(ok),
        );
    }
    if let Some(status) = inputs.status {
        header(
            &mut out,
            "outboxd_outbox_rows",
            "gauge",
            "Outbox rows by status (SUCCESS rows are not counted).",
        );
        for wanted in REPORTED_STATUSES {
            let rows: i64 = status
                .counts
                .iter()
                .filter(|c| c.status == wanted)
                .map(|c| c.rows)
                .sum();
            let _ = writeln!(out, "outboxd_outbox_rows{{status=\"{wanted}\"}} {rows}");
        }
        let oldest = status.oldest_unsent.map_or(0.0, |t| {
            now.duration_since(t).unwrap_or_default().as_secs_f64()
        });
        gauge(
            &mut out,
            "outboxd_outbox_oldest_unsent_age_seconds",
            "Age of the oldest INIT or FAILED row; 0 when there is none.",
            oldest,
        );
        if let Some(lag) = status.source_lag_bytes {
            gauge(
                &mut out,
                "outboxd_source_lag_bytes",
                "How far the source's log is ahead of the confirmed position (PostgreSQL: \
                 the slot's WAL held back).",
                lag as f64,
            );
        }
    }

    if let Some(process) = ProcessStats::read_self() {
        gauge(
            &mut out,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            process.rss_bytes as f64,
        );
        header(
            &mut out,
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time spent, in seconds.",
        );
        let _ = writeln!(out, "process_cpu_seconds_total {}", process.cpu_seconds);
    }
    out
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    header(out, name, "gauge", help);
    let _ = writeln!(out, "{name} {value}");
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    header(out, name, "counter", help);
    let _ = writeln!(out, "{name} {value}");
}

fn bool_value(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// Escapes a label value: backslash, double quote and newline.
fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Resident memory and CPU time of this process, from `/proc/self`.
#[derive(Debug, Clone, Copy)]
struct ProcessStats {
    rss_bytes: u64,
    cpu_seconds: f64,
}

impl ProcessStats {
    /// Linux's USER_HZ, the unit of `utime`/`stime` in `/proc/<pid>/stat`: 100 on every
    /// mainstream architecture.
    const TICKS_PER_SECOND: f64 = 100.0;

    fn read_self() -> Option<Self> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let rss_kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name, which is in parentheses and may hold spaces.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some(Self {
            rss_bytes: rss_kib * 1024,
            cpu_seconds: (utime + stime) as f64 / Self::TICKS_PER_SECOND,
        })
    }
}

/// A cached result and when it was taken.
struct Cached<T> {
    at: Instant,
    value: T,
}

/// Serves `/metrics`, `/healthz` and `/readyz` for one running pipeline.
pub struct Exporter<'a, C: Connector, S: Sink> {
    stats: &'a PipelineStats,
    publisher: &'a S,
    connector: &'a C,
    /// The SQL connection for status queries, opened on the first scrape, dropped after
    /// an error.
    store: tokio::sync::Mutex<Option<C::Store>>,
    status: tokio::sync::Mutex<Option<Cached<Result<StatusSummary, String>>>>,
    kafka: tokio::sync::Mutex<Option<Cached<Result<(), String>>>>,
}

impl<'a, C: Connector, S: Sink> Exporter<'a, C, S> {
    /// An exporter over the pipeline's counters, its producer and its connector.
    pub fn new(stats: &'a PipelineStats, publisher: &'a S, connector: &'a C) -> Self {
        Self {
            stats,
            publisher,
            connector,
            store: tokio::sync::Mutex::new(None),
            status: tokio::sync::Mutex::new(None),
            kafka: tokio::sync::Mutex::new(None),
        }
    }

    async fn metrics(&self) -> Response {
        let kafka = self.kafka_reachable().await;
        let mut status_cache = self.status.lock().await;
        let stale = status_cache
            .as_ref()
            .is_none_or(|c| c.at.elapsed() >= STATUS_CACHE);
        if stale {
            let value = self.query_status().await;
            *status_cache = Some(Cached {
                at: Instant::now(),
                value,
            });
        }
        let status = status_cache.as_ref().map(|c| &c.value);
        let inputs = ScrapeInputs {
            producer_queue: self.publisher.queue_depth(),
            status: status.and_then(|s| s.as_ref().ok()),
            status_ok: status.map(|s| s.is_ok()),
            kafka_reachable: Some(kafka.is_ok()),
        };
        Response::ok(
            "text/plain; version=0.0.4; charset=utf-8",
            render(self.stats, &inputs),
        )
    }

    async fn query_status(&self) -> Result<StatusSummary, String> {
        let mut store = self.store.lock().await;
        if store.is_none() {
            let opened = self.connector.open_store().await.map_err(|e| {
                tracing::warn!(error = %e, "metrics: cannot open the status connection");
                e.to_string()
            })?;
            *store = Some(opened);
        }
        let Some(open) = store.as_ref() else {
            return Err("no status connection".into());
        };
        match open.status_summary().await {
            Ok(summary) => Ok(summary),
            Err(e) => {
                tracing::warn!(error = %e, "metrics: status query failed");
                *store = None;
                Err(e.to_string())
            }
        }
    }

    /// Kafka's reachability, checked at most every [`KAFKA_CHECK`].
    async fn kafka_reachable(&self) -> Result<(), String> {
        let mut cache = self.kafka.lock().await;
        if let Some(cached) = cache.as_ref().filter(|c| c.at.elapsed() < KAFKA_CHECK) {
            return cached.value.clone();
        }
        let line = self.publisher.check(KAFKA_CHECK_TIMEOUT).await;
        let value = match line.status {
            outboxd_connector::CheckStatus::Fail => Err(line.to_string()),
            _ => Ok(()),
        };
        *cache = Some(Cached {
            at: Instant::now(),
            value: value.clone(),
        });
        value
    }

    async fn ready(&self) -> Response {
        let streaming = self.stats.streaming.load(Ordering::Relaxed);
        let kafka = self.kafka_reachable().await;
        match (streaming, kafka) {
            (true, Ok(())) => Response::text(200, "ready: source streaming, Kafka reachable\n"),
            (false, kafka) => Response::text(
                503,
                format!(
                    "not ready: the source is not streaming{}\n",
                    kafka.err().map_or(String::new(), |e| format!("; {e}"))
                ),
            ),
            (true, Err(e)) => Response::text(503, format!("not ready: {e}\n")),
        }
    }
}

impl<C: Connector, S: Sink> Routes for Exporter<'_, C, S> {
    async fn respond(&self, path: &str) -> Response {
        match path {
            "/metrics" => self.metrics().await,
            "/healthz" => Response::text(200, "ok\n"),
            "/readyz" => self.ready().await,
            _ => Response::text(404, "not found; try /metrics, /healthz or /readyz\n"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outboxd_connector::{BinlogPosition, Lsn, StatusCount};

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(1000));
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "help");
        assert!(out.contains("x_seconds_bucket{le=\"0.001\"} 1\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"0.005\"} 2\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"300\"} 2\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_seconds_count 3\n"), "{out}");
        assert!(out.contains("x_seconds_sum 1000.0035\n"), "{out}");
    }

    #[test]
    fn rendering_names_every_series() {
        let stats = PipelineStats::default();
        stats.metrics.acked(
            "t.\"a\"",
            Some(SystemTime::now() - Duration::from_millis(20)),
        );
        stats.metrics.acked("t.b", None);
        stats.metrics.failed("t.b");
        stats.metrics.confirmed();
        if let Ok(mut c) = stats.confirmed.lock() {
            *c = Some(Position::Lsn(Lsn(0x16_0000_0010)));
        }
        let summary = StatusSummary {
            counts: vec![
                StatusCount {
                    status: "MANUAL_REQUIRED".into(),
                    message_type: "a".into(),
                    rows: 2,
                },
                StatusCount {
                    status: "MANUAL_REQUIRED".into(),
                    message_type: "b".into(),
                    rows: 3,
                },
            ],
            oldest_unsent: Some(SystemTime::now() - Duration::from_secs(60)),
            checkpoint: None,
            source_lag_bytes: Some(4096),
        };
        let text = render(
            &stats,
            &ScrapeInputs {
                producer_queue: 7,
                status: Some(&summary),
                status_ok: Some(true),
                kafka_reachable: Some(true),
            },
        );
        for line in [
            "outboxd_events_published_total{topic=\"t.\\\"a\\\"\"} 1",
            "outboxd_events_published_total{topic=\"t.b\"} 1",
            "outboxd_events_failed_total{topic=\"t.b\"} 1",
            "outboxd_publish_latency_seconds_count 1",
            "outboxd_outbox_rows{status=\"MANUAL_REQUIRED\"} 5",
            "outboxd_outbox_rows{status=\"INIT\"} 0",
            "outboxd_source_lag_bytes 4096",
            "outboxd_producer_queue_depth 7",
            "outboxd_checkpoint_position 94489280528",
            "outboxd_kafka_reachable 1",
            "outboxd_lag_seconds 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in\n{text}"
            );
        }
        assert!(text.contains("outboxd_checkpoint_age_seconds "));
        assert!(text.contains("outboxd_outbox_oldest_unsent_age_seconds 6"));
        assert!(text.contains("process_resident_memory_bytes "));
        // Every series has HELP and TYPE.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            let base = name
                .trim_end_matches("_bucket")
                .trim_end_matches("_sum")
                .trim_end_matches("_count");
            assert!(
                text.contains(&format!("# TYPE {base} ")),
                "no TYPE for {name}"
            );
        }
    }

    #[test]
    fn lag_counts_only_while_events_are_in_flight() {
        let stats = PipelineStats::default();
        stats
            .metrics
            .read_while_idle(Some(SystemTime::now() - Duration::from_secs(5)));
        stats.in_flight.store(3, Ordering::Relaxed);
        let text = render(&stats, &ScrapeInputs::default());
        let lag: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("outboxd_lag_seconds "))
            .and_then(|v| v.parse().ok())
            .unwrap_or_default();
        assert!((5.0..6.0).contains(&lag), "{lag}");
    }

    #[test]
    fn positions_become_growing_numbers() {
        assert_eq!(position_number(&Position::Lsn(Lsn(42))), 42);
        let binlog = |file: &str, offset| {
            position_number(&Position::Binlog(BinlogPosition {
                file: file.into(),
                offset,
                gtid_set: None,
            }))
        };
        assert!(binlog("mysql-bin.000002", 4) > binlog("mysql-bin.000001", 9_000_000));
        assert_eq!(binlog("mysql-bin.000001", 4), (1 << 32) | 4);
    }
}
