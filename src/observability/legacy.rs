//! TEMPORARY: the hand-written exporter of before, kept only to diff its output with the
//! prometheus-client one in a test. Deleted in the next commit.
#![allow(dead_code, unreachable_pub)]
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

use outboxd_connector::{Position, StatusSummary};

use crate::relay::PipelineStats;

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
pub fn render(stats: &PipelineStats, m: &PipelineMetrics, inputs: &ScrapeInputs<'_>) -> String {
    let mut out = String::with_capacity(4096);
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

#[cfg(test)]
mod diff {
    use std::collections::BTreeMap;

    use outboxd_connector::{Lsn, StatusCount};

    use super::*;
    use crate::observability::metrics as new;

    /// Family name → (type, help), and series (name with sorted labels) → value.
    type Parsed = (BTreeMap<String, (String, String)>, BTreeMap<String, f64>);

    fn parse(text: &str) -> Parsed {
        let (mut families, mut samples) = (BTreeMap::new(), BTreeMap::new());
        let mut help = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, text) = rest.split_once(' ').unwrap();
                help.insert(name.to_owned(), text.to_owned());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                families.insert(name.to_owned(), (kind.to_owned(), help[name].clone()));
            } else {
                let (series, value) = line.rsplit_once(' ').unwrap();
                let (name, labels) = match series.split_once('{') {
                    Some((name, labels)) => {
                        let mut labels: Vec<&str> =
                            labels.trim_end_matches('}').split(',').collect();
                        labels.sort();
                        (name, labels.join(","))
                    }
                    None => (series, String::new()),
                };
                samples.insert(format!("{name}{{{labels}}}"), value.parse().unwrap());
            }
        }
        (families, samples)
    }

    /// The same inputs through the old hand-written renderer and the prometheus-client
    /// one: identical families (name, type, help), identical series, equal values (time-
    /// and process-dependent ones within a margin).
    #[test]
    fn prometheus_client_output_matches_the_hand_written_one() {
        let stats = PipelineStats::default();
        let old = PipelineMetrics::default();
        let commit = SystemTime::now() - Duration::from_millis(20);
        for (topic, commit) in [
            ("t.\"a\"", Some(commit)),
            ("t.b", None),
            ("t.b", Some(commit)),
        ] {
            stats.metrics.acked(topic, commit);
            old.acked(topic, commit);
        }
        stats.metrics.failed("t.b");
        old.failed("t.b");
        stats.metrics.read_while_idle(Some(commit));
        old.read_while_idle(Some(commit));
        stats.metrics.confirmed();
        old.confirmed();
        for (counter, value) in [
            (&stats.published, 3),
            (&stats.failed, 1),
            (&stats.transactions, 5),
            (&stats.in_flight, 2),
            (&stats.parked, 6),
            (&stats.retried, 7),
            (&stats.retry_failed, 8),
            (&stats.reaped, 9),
        ] {
            counter.store(value, Ordering::Relaxed);
        }
        stats.streaming.store(true, Ordering::Relaxed);
        *stats.confirmed.lock().unwrap() = Some(Position::Lsn(Lsn(0x16_0000_0010)));
        let summary = StatusSummary {
            counts: vec![
                StatusCount {
                    status: "FAILED".into(),
                    message_type: "a".into(),
                    rows: 2,
                },
                StatusCount {
                    status: "SUCCESS".into(),
                    message_type: "b".into(),
                    rows: 3,
                },
            ],
            oldest_unsent: Some(SystemTime::now() - Duration::from_secs(60)),
            checkpoint: None,
            source_lag_bytes: Some(4096),
        };
        let cases = [
            (Some(&summary), Some(true), Some(true)),
            (None, Some(false), Some(false)),
            (None, None, None),
        ];
        for (status, status_ok, kafka_reachable) in cases {
            let old_text = render(
                &stats,
                &old,
                &ScrapeInputs {
                    producer_queue: 11,
                    status,
                    status_ok,
                    kafka_reachable,
                },
            );
            let new_text = new::render(
                &stats,
                &new::ScrapeInputs {
                    producer_queue: 11,
                    status,
                    status_ok,
                    kafka_reachable,
                },
            );
            let (old_families, old_samples) = parse(&old_text);
            let (new_families, new_samples) = parse(&new_text);
            assert_eq!(old_families, new_families, "\n{old_text}\n---\n{new_text}");
            assert_eq!(
                old_samples.keys().collect::<Vec<_>>(),
                new_samples.keys().collect::<Vec<_>>(),
                "\n{old_text}\n---\n{new_text}"
            );
            for (series, old_value) in &old_samples {
                let new_value = new_samples[series];
                let margin = if series.starts_with("process_") {
                    // Measured twice, a moment apart.
                    old_value.abs() * 0.2 + 1.0
                } else if series.contains("_seconds") {
                    0.5
                } else {
                    0.0
                };
                assert!(
                    (old_value - new_value).abs() <= margin,
                    "{series}: {old_value} before, {new_value} now"
                );
            }
            eprintln!("{new_text}");
        }
    }
}
