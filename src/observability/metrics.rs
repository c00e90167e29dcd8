//! The `/metrics` exposition: every series outboxd publishes, through `prometheus-client`
//! in the Prometheus text format 0.0.4.
//!
//! Two kinds of values:
//! - what the pipeline counts as it runs: the plain counters of [`PipelineStats`] and, in
//!   [`PipelineMetrics`], the outcomes by topic and the publish latency histogram, which
//!   are `prometheus-client` metrics updated in place;
//! - what a scrape asks for ([`ScrapeInputs`]): the database's status summary and Kafka's
//!   reachability (both cached by [`super::health`]), the producer's queue depth.
//!
//! [`render`] registers both in a registry made for that scrape and encodes it. The
//! atomics of [`PipelineStats`] are read once there, so the relay's hot path never touches
//! a metrics type. Names, types, labels and help texts are the ones the README lists; a
//! counter is registered without its `_total`, which the encoder appends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outboxd_connector::StatusSummary;
use prometheus_client::encoding::{prometheus_text, EncodeLabelSet};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::endpoint_metrics::EndpointMetrics;
use super::process::ProcessCollector;
use crate::relay::PipelineStats;

/// `Content-Type` of [`render`]'s output.
pub(crate) const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Upper bounds, in seconds, of the publish latency histogram's buckets.
const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// The statuses reported by `outboxd_outbox_rows`, always all of them (0 when absent), so
/// an alert on one of them has a series to look at.
const REPORTED_STATUSES: [&str; 4] = ["INIT", "PROCESSING", "FAILED", "MANUAL_REQUIRED"];

/// Exactly-once: records Kafka acknowledged inside the open transaction, counted as
/// published once it commits ([`PipelineMetrics::committed`]); an aborted one never is.
#[derive(Debug, Default)]
pub struct UncommittedRecords {
    by_topic: HashMap<String, u64>,
    commit_times: Vec<SystemTime>,
    /// Canary rows among them ([`crate::canary`]): delivered once the transaction commits.
    canaries: Vec<String>,
}

impl UncommittedRecords {
    /// A record of `topic`, from a source transaction committed at `commit_time`.
    pub fn add(&mut self, topic: String, commit_time: Option<SystemTime>) {
        *self.by_topic.entry(topic).or_default() += 1;
        self.commit_times.extend(commit_time);
    }

    /// The canary row `message_id` is among them.
    pub fn add_canary(&mut self, message_id: String) {
        self.canaries.push(message_id);
    }

    /// The canary rows among them.
    pub fn canaries(&self) -> &[String] {
        &self.canaries
    }
}

/// The label of the per-topic counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicLabel {
    topic: String,
}

/// A label set of one fixed label, for series whose label values are known in advance.
type FixedLabel = [(&'static str, &'static str); 1];

/// What the pipeline records for metrics beyond its plain counters: outcomes by topic,
/// the commit → acknowledgement latency, the lag, and when the position was last confirmed.
#[derive(Debug)]
pub struct PipelineMetrics {
    published: Family<TopicLabel, Counter>,
    failed: Family<TopicLabel, Counter>,
    /// Both counters of each topic seen so far: a topic shows both series (`failed` at 0
    /// until its first failure), and an event of a known topic costs one lookup by `&str`.
    topics: RwLock<HashMap<String, TopicCounters>>,
    latency: Histogram,
    /// Commit time (µs since the Unix epoch) the end-to-end lag is measured from.
    lag_base_micros: AtomicU64,
    confirmed_at: Mutex<Option<Instant>>,
    /// When the status write-back under way began; `None` between write-backs.
    writeback_since: Mutex<Option<Instant>>,
    /// Topics with series of their own (`metrics.max_topic_series`); later ones count
    /// under [`OTHER_TOPICS`].
    max_topic_series: AtomicUsize,
}

/// The `topic` label of the topics past `metrics.max_topic_series`.
const OTHER_TOPICS: &str = "other";

impl Default for PipelineMetrics {
    fn default() -> Self {
        Self {
            published: Family::default(),
            failed: Family::default(),
            topics: RwLock::default(),
            latency: Histogram::new(LATENCY_BUCKETS),
            lag_base_micros: AtomicU64::new(0),
            confirmed_at: Mutex::new(None),
            writeback_since: Mutex::new(None),
            max_topic_series: AtomicUsize::new(200),
        }
    }
}

impl PipelineMetrics {
    /// Kafka acknowledged a record of `topic` whose transaction committed at `commit_time`.
    pub fn acked(&self, topic: &str, commit_time: Option<SystemTime>) {
        self.count(topic, |c| &c.published, 1);
        if let Some(commit) = commit_time {
            self.published_since(commit);
        }
    }

    /// Exactly-once: a Kafka transaction committed the records of `window`, which are
    /// published (visible to `read_committed` consumers) only now.
    pub fn committed(&self, window: &UncommittedRecords) {
        for (topic, n) in &window.by_topic {
            self.count(topic, |c| &c.published, *n);
        }
        for commit in &window.commit_times {
            self.published_since(*commit);
        }
    }

    /// A record whose source transaction committed at `commit` is published now: the
    /// end-to-end latency, and the base of the lag.
    fn published_since(&self, commit: SystemTime) {
        // A commit clock ahead of ours counts as zero latency.
        let latency = SystemTime::now().duration_since(commit).unwrap_or_default();
        self.latency.observe(latency.as_secs_f64());
        self.lag_base_micros
            .store(unix_micros(commit), Ordering::Relaxed);
    }

    /// Records of `topic` counted as published so far.
    #[cfg(test)]
    pub(crate) fn published_of(&self, topic: &str) -> u64 {
        (self.topics.read().ok())
            .and_then(|topics| topics.get(topic).map(|c| c.published.get()))
            .unwrap_or(0)
    }

    /// A record of `topic` was not delivered (its row becomes FAILED).
    pub fn failed(&self, topic: &str) {
        self.count(topic, |c| &c.failed, 1);
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

    /// How many topics get series of their own (`metrics.max_topic_series`).
    pub fn limit_topic_series(&self, max: usize) {
        self.max_topic_series.store(max, Ordering::Relaxed);
    }

    /// A status write-back begins (`true`) or has ended (`false`).
    pub fn writing_back(&self, under_way: bool) {
        if let Ok(mut since) = self.writeback_since.lock() {
            *since = under_way.then(Instant::now);
        }
    }

    fn count(&self, topic: &str, counter: impl Fn(&TopicCounters) -> &Counter, n: u64) {
        if let Ok(topics) = self.topics.read() {
            if let Some(counters) = topics.get(topic) {
                counter(counters).inc_by(n);
                return;
            }
        }
        let Ok(mut topics) = self.topics.write() else {
            return;
        };
        // Rows choose their topics: past the limit, new topics share one series.
        let topic = if topics.len() >= self.max_topic_series.load(Ordering::Relaxed)
            && !topics.contains_key(topic)
        {
            OTHER_TOPICS
        } else {
            topic
        };
        let counters = topics.entry(topic.to_owned()).or_insert_with(|| {
            let label = TopicLabel {
                topic: topic.to_owned(),
            };
            TopicCounters {
                published: self.published.get_or_create_owned(&label),
                failed: self.failed.get_or_create_owned(&label),
            }
        });
        counter(counters).inc_by(n);
    }

    /// Now minus the commit time of the last acknowledged event while events are in
    /// flight; zero when none is.
    fn lag(&self, in_flight: u64, now: SystemTime) -> Duration {
        match self.lag_base_micros.load(Ordering::Relaxed) {
            base if in_flight > 0 && base > 0 => {
                Duration::from_micros(unix_micros(now).saturating_sub(base))
            }
            _ => Duration::ZERO,
        }
    }
}

/// The two series of one topic (handles into the families).
#[derive(Debug)]
struct TopicCounters {
    published: Counter,
    failed: Counter,
}

fn unix_micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Values of one scrape that come from outside the pipeline's counters.
#[derive(Debug, Default)]
pub(crate) struct ScrapeInputs<'a> {
    /// Records in librdkafka's queue or in flight to the broker.
    pub(crate) producer_queue: i64,
    /// The database's summary, when the last query succeeded.
    pub(crate) status: Option<&'a StatusSummary>,
    /// Whether the last status query succeeded (`None`: not asked yet).
    pub(crate) status_ok: Option<bool>,
    /// The inbox table's summary, when this process runs an inbox and the query worked.
    pub(crate) inbox_status: Option<&'a StatusSummary>,
    /// Result of the last Kafka reachability check (`None`: not checked yet).
    pub(crate) kafka_reachable: Option<bool>,
    /// The HTTP sink's per-endpoint series.
    pub(crate) endpoints: Option<EndpointMetrics>,
}

/// Renders every metric in the Prometheus text format ([`CONTENT_TYPE`]).
pub(crate) fn render(stats: &PipelineStats, inputs: &ScrapeInputs<'_>) -> String {
    let registry = registry(stats, inputs);
    let mut out = String::with_capacity(4096);
    // Writing into a String fails only if an encoder returns an error, which ours never do.
    if let Err(e) = prometheus_text::encode(&mut out, &registry) {
        tracing::warn!(error = %e, "metrics: encoding failed");
    }
    out
}

/// One scrape's registry: the pipeline's live metrics and a snapshot of everything else.
/// Series that have no value yet (no position confirmed, status never queried) are left
/// out rather than shown as 0.
fn registry(stats: &PipelineStats, inputs: &ScrapeInputs<'_>) -> Registry {
    let m = &stats.metrics;
    let now = SystemTime::now();
    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    let in_flight = load(&stats.in_flight);
    let mut r = Registry::default();
    if let Some(inbox) = stats.inbox.get() {
        inbox.register(&mut r);
    }
    if let Some(status) = inputs.inbox_status {
        register_inbox_status(&mut r, status, now);
    }

    r.register(
        "outboxd_events_published",
        "Records acknowledged by Kafka, by topic",
        m.published.clone(),
    );
    r.register(
        "outboxd_events_failed",
        "Records Kafka did not take (their rows became FAILED), by topic",
        m.failed.clone(),
    );
    r.register(
        "outboxd_publish_latency_seconds",
        "From the source transaction's commit to Kafka's acknowledgement of the record",
        m.latency.clone(),
    );
    r.register(
        "outboxd_lag_seconds",
        "Now minus the commit time of the last event Kafka acknowledged, while events are \
         in flight; 0 when none is",
        ConstGauge::new(m.lag(in_flight, now).as_secs_f64()),
    );
    r.register(
        "outboxd_events_in_flight",
        "Events read from the log and not yet written back",
        ConstGauge::new(in_flight),
    );
    r.register(
        "outboxd_transactions",
        "Committed transactions with outbox rows read from the log",
        ConstCounter::new(load(&stats.transactions)),
    );
    r.register(
        "outboxd_events_parked",
        "Events held back behind an earlier failed event of the same key (strict ordering)",
        ConstCounter::new(load(&stats.parked)),
    );
    let retries = Family::<FixedLabel, Counter>::default();
    for (outcome, value) in [
        ("published", load(&stats.retried)),
        ("failed", load(&stats.retry_failed)),
    ] {
        retries.get_or_create(&[("outcome", outcome)]).inc_by(value);
    }
    r.register(
        "outboxd_retries",
        "Publish attempts of rows that had failed before (retry worker or poll mode), by outcome",
        retries,
    );
    let console = stats.console_actions.snapshot();
    if !console.is_empty() {
        let actions = Family::<[(&'static str, &'static str); 2], Counter>::default();
        for (table, action, n) in console {
            actions
                .get_or_create(&[("table", table), ("action", action)])
                .inc_by(n);
        }
        r.register(
            "outboxd_console_actions",
            "Rows changed by an operator in the console, by table and action",
            actions,
        );
    }
    r.register(
        "outboxd_kafka_producer_rebuilds",
        "Kafka producers replaced because records waited with no acknowledgement while a \
         fresh client reached the brokers (a stuck producer)",
        ConstCounter::new(load(&stats.producer_rebuilds)),
    );
    r.register(
        "outboxd_rows_reaped",
        "Rows returned from an abandoned PROCESSING claim by the reaper",
        ConstCounter::new(load(&stats.reaped)),
    );
    r.register(
        "outboxd_producer_queue_depth",
        "Records in the Kafka producer's queue or in flight to the broker",
        ConstGauge::new(inputs.producer_queue),
    );
    r.register(
        "outboxd_source_streaming",
        "1 while the log stream is open",
        flag(stats.streaming.load(Ordering::Relaxed)),
    );
    if let Some(reachable) = inputs.kafka_reachable {
        r.register(
            "outboxd_kafka_reachable",
            "1 if the last cluster metadata request (at most every 10 s) succeeded",
            flag(reachable),
        );
    }

    if let Some(endpoints) = &inputs.endpoints {
        endpoints.register(&mut r);
    }
    if stats.canary.enabled() {
        r.register(
            "outboxd_canary_latency_seconds",
            "Canary rows ([canary]): from writing the row to the sink's acknowledgement",
            stats.canary.latency().clone(),
        );
        r.register(
            "outboxd_canary_last_success_timestamp_seconds",
            "Unix time when the last canary row was acknowledged by the sink (when the \
             canary started, before the first)",
            ConstGauge::new(stats.canary.last_success()),
        );
    }

    let confirmed = stats.confirmed.lock().ok().and_then(|c| c.clone());
    if let Some(position) = confirmed {
        // An integer gauge: an LSN above 2^53 would lose digits as a float.
        r.register(
            "outboxd_checkpoint_position",
            "The last log position confirmed to the source, as a number (PostgreSQL: the LSN)",
            ConstGauge::new(position.gauge()),
        );
    }
    if let Some(at) = m.confirmed_at.lock().ok().and_then(|at| *at) {
        r.register(
            "outboxd_checkpoint_age_seconds",
            "Seconds since the log position was last confirmed",
            ConstGauge::new(at.elapsed().as_secs_f64()),
        );
    }

    let writing_back = m.writeback_since.lock().ok().and_then(|since| *since);
    r.register(
        "outboxd_writeback_wait_seconds",
        "Seconds the status write-back under way has taken (0 between write-backs); it grows \
         while decoded rows are not visible yet (a commit waiting for a synchronous standby) \
         or the outbox rows are locked, and the log position is held meanwhile",
        ConstGauge::new(writing_back.map_or(0.0, |since| since.elapsed().as_secs_f64())),
    );

    if let Some(ok) = inputs.status_ok {
        r.register(
            "outboxd_status_query_up",
            "1 if the last status query on the outbox table succeeded (asked on scrape, \
             at most every 15 s)",
            flag(ok),
        );
    }
    if let Some(status) = inputs.status {
        register_status(&mut r, status, now);
    }

    r.register_collector(Box::new(ProcessCollector));
    r
}

/// The names of one table's status series.
struct TableSeries {
    rows: &'static str,
    rows_help: &'static str,
    statuses: &'static [&'static str],
    oldest: &'static str,
    oldest_help: &'static str,
}

const OUTBOX_SERIES: TableSeries = TableSeries {
    rows: "outboxd_outbox_rows",
    rows_help: "Outbox rows by status (SUCCESS rows are not counted)",
    statuses: &REPORTED_STATUSES,
    oldest: "outboxd_outbox_oldest_unsent_age_seconds",
    oldest_help: "Age of the oldest INIT or FAILED row; 0 when there is none",
};

const INBOX_SERIES: TableSeries = TableSeries {
    rows: "outboxd_inbox_rows",
    rows_help: "Inbox rows by status (DONE rows are not counted)",
    statuses: &["PENDING", "PROCESSING", "FAILED", "MANUAL_REQUIRED"],
    oldest: "outboxd_inbox_oldest_pending_age_seconds",
    oldest_help: "Age of the oldest PENDING, FAILED or PROCESSING inbox row; 0 when there is none",
};

/// Rows by status (every status of `series`, 0 when absent) and the oldest unfinished
/// row's age, from a table's status summary.
fn register_rows(r: &mut Registry, series: &TableSeries, status: &StatusSummary, now: SystemTime) {
    let rows = Family::<FixedLabel, Gauge>::default();
    for wanted in series.statuses {
        let count: i64 = (status.counts.iter())
            .filter(|c| c.status == *wanted)
            .map(|c| c.rows)
            .sum();
        rows.get_or_create(&[("status", wanted)]).set(count);
    }
    r.register(series.rows, series.rows_help, rows);
    let oldest = status.oldest_unsent.map_or(0.0, |t| {
        now.duration_since(t).unwrap_or_default().as_secs_f64()
    });
    r.register(series.oldest, series.oldest_help, ConstGauge::new(oldest));
}

/// The series that come from the database's status summary.
fn register_status(r: &mut Registry, status: &StatusSummary, now: SystemTime) {
    register_rows(r, &OUTBOX_SERIES, status, now);
    if let Some(lag) = status.source_lag_bytes {
        r.register(
            "outboxd_source_lag_bytes",
            "How far the source's log is ahead of the confirmed position (PostgreSQL: \
             the slot's WAL held back)",
            ConstGauge::new(lag),
        );
    }
}

/// The inbox series that come from its status summary.
fn register_inbox_status(r: &mut Registry, status: &StatusSummary, now: SystemTime) {
    register_rows(r, &INBOX_SERIES, status, now);
}

fn flag(on: bool) -> ConstGauge {
    ConstGauge::new(i64::from(on))
}

#[cfg(test)]
mod tests {
    use super::*;
    use outboxd_connector::{Position, StatusCount};

    #[test]
    fn histogram_keeps_its_buckets() {
        let stats = PipelineStats::default();
        for latency in [
            Duration::from_micros(500),
            Duration::from_millis(3),
            Duration::from_secs(1000),
        ] {
            stats.metrics.latency.observe(latency.as_secs_f64());
        }
        let out = render(&stats, &ScrapeInputs::default());
        let name = "outboxd_publish_latency_seconds";
        for line in [
            "# TYPE outboxd_publish_latency_seconds histogram",
            "_bucket{le=\"0.001\"} 1",
            "_bucket{le=\"0.0025\"} 1",
            "_bucket{le=\"0.005\"} 2",
            "_bucket{le=\"1\"} 2",
            "_bucket{le=\"300\"} 2",
            "_bucket{le=\"+Inf\"} 3",
            "_count 3",
        ] {
            let line = match line.strip_prefix('_') {
                Some(suffix) => format!("{name}_{suffix}"),
                None => line.to_owned(),
            };
            assert!(out.lines().any(|l| l == line), "no `{line}` in\n{out}");
        }
        let buckets = out
            .lines()
            .filter(|l| l.starts_with("outboxd_publish_latency_seconds_bucket"))
            .count();
        assert_eq!(buckets, LATENCY_BUCKETS.len() + 1, "{out}");
        let sum: f64 = out
            .lines()
            .find_map(|l| l.strip_prefix("outboxd_publish_latency_seconds_sum "))
            .and_then(|v| v.parse().ok())
            .unwrap_or_default();
        assert!((sum - 1000.0035).abs() < 1e-6, "{sum}");
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
        stats.retried.store(4, Ordering::Relaxed);
        let endpoints = EndpointMetrics::default();
        endpoints.endpoint("orders").answered(Some(204), 0.001);
        endpoints.endpoint("billing").set_up(false);
        if let Ok(mut c) = stats.confirmed.lock() {
            *c = Some(Position::new(0x16_0000_0010, "lsn:16/10"));
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
                inbox_status: None,
                kafka_reachable: Some(true),
                endpoints: Some(endpoints),
            },
        );
        for line in [
            "# TYPE outboxd_http_endpoint_up gauge",
            "outboxd_http_endpoint_up{endpoint=\"orders\"} 1",
            "outboxd_http_endpoint_up{endpoint=\"billing\"} 0",
            "outboxd_http_requests_total{endpoint=\"orders\",class=\"2xx\"} 1",
            "# HELP outboxd_events_published_total Records acknowledged by Kafka, by topic.",
            "# TYPE outboxd_events_published_total counter",
            "outboxd_events_published_total{topic=\"t.\\\"a\\\"\"} 1",
            "outboxd_events_published_total{topic=\"t.b\"} 1",
            "outboxd_events_failed_total{topic=\"t.b\"} 1",
            "outboxd_events_failed_total{topic=\"t.\\\"a\\\"\"} 0",
            "outboxd_publish_latency_seconds_count 1",
            "# TYPE outboxd_retries_total counter",
            "outboxd_retries_total{outcome=\"published\"} 4",
            "outboxd_retries_total{outcome=\"failed\"} 0",
            "# TYPE outboxd_outbox_rows gauge",
            "outboxd_outbox_rows{status=\"MANUAL_REQUIRED\"} 5",
            "outboxd_outbox_rows{status=\"INIT\"} 0",
            "outboxd_source_lag_bytes 4096",
            "outboxd_producer_queue_depth 7",
            "outboxd_checkpoint_position 94489280528",
            "outboxd_kafka_reachable 1",
            "outboxd_status_query_up 1",
            "outboxd_lag_seconds 0.0",
            "# TYPE process_cpu_seconds_total counter",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in\n{text}"
            );
        }
        assert!(text.contains("\noutboxd_checkpoint_age_seconds "));
        assert!(text.contains("\noutboxd_writeback_wait_seconds 0"));
        assert!(text.contains("\noutboxd_outbox_oldest_unsent_age_seconds 6"));
        assert!(text.contains("\nprocess_resident_memory_bytes "));
        // Every sample belongs to a family with HELP and TYPE.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            let base = name
                .trim_end_matches("_bucket")
                .trim_end_matches("_sum")
                .trim_end_matches("_count");
            assert!(
                text.contains(&format!("# TYPE {base} "))
                    || text.contains(&format!("# TYPE {name} ")),
                "no TYPE for {name}"
            );
            assert!(
                text.contains(&format!("# HELP {base} "))
                    || text.contains(&format!("# HELP {name} ")),
                "no HELP for {name}"
            );
        }
    }

    #[test]
    fn topics_past_the_limit_share_one_series() {
        let m = PipelineMetrics::default();
        m.limit_topic_series(2);
        for topic in ["a", "b", "c", "d", "a"] {
            m.acked(topic, None);
        }
        m.failed("e");
        let stats = PipelineStats {
            metrics: m,
            ..PipelineStats::default()
        };
        let text = render(&stats, &ScrapeInputs::default());
        for line in [
            "outboxd_events_published_total{topic=\"a\"} 2",
            "outboxd_events_published_total{topic=\"b\"} 1",
            "outboxd_events_published_total{topic=\"other\"} 2",
            "outboxd_events_failed_total{topic=\"other\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in\n{text}"
            );
        }
        assert!(!text.contains("topic=\"c\""));
    }

    #[test]
    fn series_without_a_value_are_left_out() {
        let text = render(&PipelineStats::default(), &ScrapeInputs::default());
        for absent in [
            "outboxd_kafka_reachable",
            "outboxd_checkpoint_position",
            "outboxd_checkpoint_age_seconds",
            "outboxd_status_query_up",
            "outboxd_outbox_rows",
            "outboxd_source_lag_bytes",
        ] {
            assert!(!text.contains(absent), "{absent} in\n{text}");
        }
        // A failed status query shows as down, without stale row counts.
        let text = render(
            &PipelineStats::default(),
            &ScrapeInputs {
                status_ok: Some(false),
                ..ScrapeInputs::default()
            },
        );
        assert!(
            text.lines().any(|l| l == "outboxd_status_query_up 0"),
            "{text}"
        );
        assert!(!text.contains("outboxd_outbox_rows"), "{text}");
    }

    #[test]
    fn lag_counts_only_while_events_are_in_flight() {
        let stats = PipelineStats::default();
        stats
            .metrics
            .read_while_idle(Some(SystemTime::now() - Duration::from_secs(5)));
        let lag = |stats: &PipelineStats| -> f64 {
            render(stats, &ScrapeInputs::default())
                .lines()
                .find_map(|l| l.strip_prefix("outboxd_lag_seconds ")?.parse().ok())
                .unwrap_or(-1.0)
        };
        assert_eq!(lag(&stats), 0.0);
        stats.in_flight.store(3, Ordering::Relaxed);
        let lag = lag(&stats);
        assert!((5.0..6.0).contains(&lag), "{lag}");
    }
}
