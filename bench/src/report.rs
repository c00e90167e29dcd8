//! The results: one table on stdout, the targets checked under it, and JSON.

use std::path::Path;

use serde_json::{json, Value};
use tokio_postgres::Client;

use crate::consume::Consumed;
use crate::daemon::{CpuSnapshot, ProcSample};
use crate::http::HttpCheck;
use crate::soak::SoakReport;
use crate::workload::Written;
use crate::Args;

/// Latency percentiles, milliseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Latency {
    pub(crate) samples: usize,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    pub(crate) max: f64,
}

impl Latency {
    /// From sorted samples.
    pub(crate) fn from_sorted(sorted: &[f64]) -> Option<Self> {
        let at = |q: f64| {
            let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
            sorted[i]
        };
        (!sorted.is_empty()).then(|| Self {
            samples: sorted.len(),
            p50: at(0.50),
            p99: at(0.99),
            p999: at(0.999),
            max: sorted[sorted.len() - 1],
        })
    }
}

/// One line of the table.
#[derive(Debug, Clone, Default)]
pub(crate) struct Row {
    pub(crate) name: String,
    pub(crate) events: usize,
    pub(crate) events_per_s: Option<f64>,
    pub(crate) latency: Option<Latency>,
    pub(crate) peak_rss: Option<u64>,
    pub(crate) cpu_per_million: Option<f64>,
    pub(crate) wal_per_event: Option<f64>,
    pub(crate) duplicates: Option<usize>,
    /// CPU seconds per million events of PostgreSQL and the Kafka broker in this phase.
    pub(crate) servers: Option<CpuSnapshot>,
    pub(crate) note: String,
    /// The backlog drain: compared with the limits.
    pub(crate) is_throughput_run: bool,
    /// The MariaDB backlog drain: compared with the binlog's own pair of limits
    /// ([`Limits::lower_binlog`]).
    pub(crate) is_binlog_drain: bool,
    /// The HTTP sink's backlog drain: compared with the bench client's requests/s
    /// ([`Limits::http_client`]).
    pub(crate) is_http_drain: bool,
    /// An HTTP scenario: what its receiver got, against what was written.
    pub(crate) http: Option<HttpCheck>,
    pub(crate) unavailable: bool,
}

impl Row {
    pub(crate) fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            ..Self::default()
        }
    }

    pub(crate) fn unavailable(name: &str, why: &str) -> Self {
        Self {
            name: name.to_owned(),
            note: why.to_owned(),
            unavailable: true,
            ..Self::default()
        }
    }

    /// A run with outboxd relaying while the writers write.
    pub(crate) fn from_live(name: &str, tag: &str, written: &Written, consumed: &Consumed) -> Self {
        let latencies = crate::latencies_ms(tag, written, consumed);
        let span_us = (consumed.last_append_ms() * 1000) as f64 - written.first_commit as f64;
        let missing = written.events.saturating_sub(latencies.len());
        let offered = written.events as f64 / written.elapsed.as_secs_f64();
        Self {
            name: name.to_owned(),
            events: written.events,
            events_per_s: Some(written.events as f64 / (span_us / 1e6).max(1e-3)),
            latency: Latency::from_sorted(&latencies),
            duplicates: Some(consumed.duplicates),
            note: format!("writers committed {offered:.0} ev/s; {missing} records missing"),
            ..Self::default()
        }
    }

    /// Server CPU of a limit run; the tool's own CPU (a child of the bench) goes in the
    /// CPU-s/M column.
    pub(crate) fn set_servers(&mut self, cpu: Option<CpuSnapshot>) {
        if let Some(cpu) = cpu {
            self.servers = Some(cpu);
            if cpu.children > 0.0 {
                self.cpu_per_million = Some(cpu.children);
            }
        }
    }

    pub(crate) fn set_process(&mut self, sample: ProcSample, cpu_seconds: f64, events: usize) {
        self.peak_rss = Some(sample.peak_rss);
        self.cpu_per_million = Some(cpu_seconds / events as f64 * 1e6);
    }
}

/// The machine's limits, events/s.
#[derive(Debug, Clone, Default)]
pub(crate) struct Limits {
    pub(crate) pg_recvlogical: Option<f64>,
    pub(crate) pg_recvlogical_cpu: Option<CpuSnapshot>,
    /// `pg_recvlogical` reading, from the same start, the backlog's WAL and what outboxd's
    /// drain wrote after it (the SUCCESS write-back, the checkpoint): what outboxd's own
    /// walsender decodes. Its inserts only are `pg_recvlogical`; the difference is the
    /// server's cost of decoding the write-back, which pgoutput then drops.
    pub(crate) pg_recvlogical_with_write_back: Option<f64>,
    pub(crate) pg_recvlogical_with_write_back_cpu: Option<CpuSnapshot>,
    pub(crate) kafka_producer_performance: Option<f64>,
    pub(crate) kafka_producer_performance_cpu: Option<CpuSnapshot>,
    pub(crate) kafka_producer_performance_summary: String,
    pub(crate) kafka_rdkafka_keyed: Option<f64>,
    pub(crate) kafka_rdkafka_keyed_cpu: Option<CpuSnapshot>,
    /// `mysqlbinlog --read-from-remote-server --verbose` reading the MariaDB backlog's
    /// binlog to /dev/null, events/s.
    pub(crate) mysqlbinlog: Option<f64>,
    /// The bench's keep-alive HTTP client driving the bench's receiver, requests/s: the
    /// HTTP sink's limit.
    pub(crate) http_client: Option<f64>,
    /// Its requests at once (the endpoint's `concurrency` in the drain).
    pub(crate) http_concurrency: Option<usize>,
}

impl Limits {
    /// The lower of what PostgreSQL hands out and what Kafka takes.
    pub(crate) fn lower(&self) -> Option<f64> {
        match (self.pg_recvlogical, self.kafka_producer_performance) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The lower of what the binlog hands out (`mysqlbinlog`) and what Kafka takes.
    pub(crate) fn lower_binlog(&self) -> Option<f64> {
        match (self.mysqlbinlog, self.kafka_producer_performance) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The idle-outbox check.
#[derive(Debug, Clone)]
pub(crate) struct Idle {
    pub(crate) window_seconds: f64,
    pub(crate) scans: i64,
    pub(crate) updates: i64,
    pub(crate) exit_code: i32,
}

pub(crate) struct Report {
    pub(crate) machine: Value,
    settings: Value,
    pub(crate) rows: Vec<Row>,
    pub(crate) limits: Limits,
    pub(crate) idle: Option<Idle>,
    pub(crate) soak: Option<SoakReport>,
}

/// The distribution's name (`PRETTY_NAME` of /etc/os-release).
fn os_name() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_owned())
        })
        .unwrap_or_default()
}

fn read_field(path: &str, key: &str) -> String {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_default()
}

impl Report {
    pub(crate) async fn new(args: &Args, sql: &Client) -> Self {
        let pg_version: String = sql
            .query_one("SHOW server_version", &[])
            .await
            .map(|r| r.get(0))
            .unwrap_or_default();
        let machine = json!({
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "cpu_model": read_field("/proc/cpuinfo", "model name"),
            "memory": read_field("/proc/meminfo", "MemTotal"),
            "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
            "os": os_name(),
            "postgresql": pg_version,
        });
        let settings = json!({
            "writers": args.writers,
            "tx_size": args.tx_size,
            "payload_bytes": args.payload_bytes,
            "keys": args.keys,
            "partitions": args.partitions,
            "rate": args.rate,
            "rate_seconds": args.rate_seconds,
            "poll_rate": args.poll_rate,
            "poll_seconds": args.poll_seconds,
            "mariadb_backlog_events": args.mariadb_backlog_events,
            "backlog_events": args.backlog_events,
            "poll_backlog_events": args.poll_backlog_events,
            "max_events": args.max_events,
            "idle_seconds": args.idle_seconds,
            "http_concurrency": args.http_concurrency,
            "http_rate": args.http_rate,
            "http_stall_seconds": args.http_stall_seconds,
            "http_stall_rate": args.http_stall_rate,
            "http_poll_backlog_events": args.http_poll_backlog_events,
        });
        Self {
            machine,
            settings,
            rows: Vec::new(),
            limits: Limits::default(),
            idle: None,
            soak: None,
        }
    }

    fn limit_rows(&self) -> Vec<Row> {
        let mut rows = Vec::new();
        if let Some(rate) = self.limits.pg_recvlogical {
            let mut row = Row::named("limit: pg_recvlogical (pgoutput → /dev/null)");
            row.events_per_s = Some(rate);
            row.set_servers(self.limits.pg_recvlogical_cpu);
            row.note = "same backlog, same publication".into();
            rows.push(row);
        }
        if let Some(rate) = self.limits.pg_recvlogical_with_write_back {
            let mut row = Row::named("info: pg_recvlogical, backlog + write-back");
            row.events_per_s = Some(rate);
            row.set_servers(self.limits.pg_recvlogical_with_write_back_cpu);
            let share = self
                .limits
                .pg_recvlogical
                .map(|alone| format!("{:.2} of the limit; ", rate / alone))
                .unwrap_or_default();
            row.note = format!("{share}the backlog's WAL and the drain's updates");
            rows.push(row);
        }
        if let Some(rate) = self.limits.kafka_producer_performance {
            let mut row = Row::named("limit: Kafka ProducerPerformance");
            row.events_per_s = Some(rate);
            row.set_servers(self.limits.kafka_producer_performance_cpu);
            row.note = "acks=all, idempotent, lz4, linger 10 ms; payload + 100 B".into();
            rows.push(row);
        }
        if let Some(rate) = self.limits.mysqlbinlog {
            let mut row = Row::named("limit: mysqlbinlog (binlog → /dev/null)");
            row.events_per_s = Some(rate);
            row.note = "--read-from-remote-server --verbose, the MariaDB backlog's binlog".into();
            rows.push(row);
        }
        if let Some(rate) = self.limits.http_client {
            let mut row = Row::named("limit: HTTP keep-alive client → receiver");
            row.events_per_s = Some(rate);
            row.note = format!(
                "hyper-util pooled client, {} requests at once, the sink's headers, same body \
                 size; requests/s",
                self.limits.http_concurrency.unwrap_or(0)
            );
            rows.push(row);
        }
        if let Some(rate) = self.limits.kafka_rdkafka_keyed {
            let mut row = Row::named("info: rdkafka keyed producer");
            row.events_per_s = Some(rate);
            row.set_servers(self.limits.kafka_rdkafka_keyed_cpu);
            row.note = "outboxd's producer settings, keys and headers".into();
            rows.push(row);
        }
        rows
    }

    fn ratio(&self, row: &Row) -> Option<f64> {
        if row.is_http_drain {
            return Some(row.events_per_s? / self.limits.http_client?);
        }
        if row.is_binlog_drain {
            return Some(row.events_per_s? / self.limits.lower_binlog()?);
        }
        if !row.is_throughput_run {
            return None;
        }
        Some(row.events_per_s? / self.limits.lower()?)
    }

    /// The table and the targets, as printed and as recorded in the doc; a soak's tables
    /// instead when it ran alone.
    pub(crate) fn text(&self) -> String {
        use std::fmt::Write as _;
        let mut t = String::new();
        if let Some(soak) = &self.soak {
            if self.rows.is_empty() {
                return soak.text();
            }
        }
        let opt =
            |v: Option<f64>, digits: usize| v.map_or("-".to_owned(), |v| format!("{v:.digits$}"));
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "{:<46} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7} {:>8} {:>8} {:>7} {:>7} {:>6}  note",
            "scenario",
            "events",
            "events/s",
            "p50 ms",
            "p99 ms",
            "p999 ms",
            "max ms",
            "RSS MB",
            "CPU-s/M",
            "PG CPU/M",
            "Kafka/M",
            "WAL B/e",
            "×limit"
        );
        for row in self.rows.iter().chain(self.limit_rows().iter()) {
            if row.unavailable {
                let _ = writeln!(t, "{:<46} {}", row.name, row.note);
                continue;
            }
            let l = row.latency;
            let _ = writeln!(
            t,
                "{:<46} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7} {:>8} {:>8} {:>7} {:>7} {:>6}  {}",
                row.name,
                if row.events > 0 {
                    row.events.to_string()
                } else {
                    "-".into()
                },
                opt(row.events_per_s, 0),
                opt(l.map(|l| l.p50), 1),
                opt(l.map(|l| l.p99), 1),
                opt(l.map(|l| l.p999), 1),
                opt(l.map(|l| l.max), 1),
                opt(row.peak_rss.map(|b| b as f64 / 1048576.0), 1),
                opt(row.cpu_per_million, 1),
                opt(row.servers.map(|c| c.postgres), 1),
                opt(row.servers.map(|c| c.kafka), 1),
                opt(row.wal_per_event, 0),
                opt(self.ratio(row), 2),
                row.note
            );
        }
        let _ = writeln!(t);
        for (target, verdict) in self.targets() {
            let _ = writeln!(t, "{verdict:<8} {target}");
        }
        if let Some(soak) = &self.soak {
            let _ = writeln!(t);
            t.push_str(&soak.text());
        }
        t
    }

    /// (target, PASS / MISS / n/a with the figure).
    fn targets(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let verdict = |ok: bool| if ok { "PASS" } else { "MISS" }.to_owned();
        let drain = self.rows.iter().find(|r| r.is_throughput_run);
        match (drain.and_then(|r| self.ratio(r)), self.limits.lower()) {
            (Some(ratio), Some(lower)) => out.push((
                format!("throughput ≥ 0.8 × the lower limit ({lower:.0} ev/s): {ratio:.2}"),
                verdict(ratio >= 0.8),
            )),
            _ => out.push(("throughput ≥ 0.8 × the lower limit".into(), "n/a".into())),
        }
        let binlog = self.rows.iter().find(|r| r.is_binlog_drain);
        if let (Some(ratio), Some(lower)) = (
            binlog.and_then(|r| self.ratio(r)),
            self.limits.lower_binlog(),
        ) {
            out.push((
                format!("MariaDB throughput ≥ 0.8 × its lower limit ({lower:.0} ev/s): {ratio:.2}"),
                verdict(ratio >= 0.8),
            ));
        }
        let log_rate = self
            .rows
            .iter()
            .find(|r| r.name.starts_with("log (PostgreSQL) @"));
        match log_rate.and_then(|r| r.latency) {
            Some(l) => out.push((
                format!("log-mode p99 ≤ 50 ms at the fixed rate: {:.1} ms", l.p99),
                verdict(l.p99 <= 50.0),
            )),
            None => out.push((
                "log-mode p99 ≤ 50 ms at the fixed rate".into(),
                "n/a".into(),
            )),
        }
        let rss = self.rows.iter().filter_map(|r| r.peak_rss).max();
        match rss {
            Some(rss) => out.push((
                format!("peak RSS ≤ 64 MB: {:.1} MB", rss as f64 / 1048576.0),
                verdict(rss <= 64 * 1024 * 1024),
            )),
            None => out.push(("peak RSS ≤ 64 MB".into(), "n/a".into())),
        }
        match &self.idle {
            Some(idle) => out.push((
                format!(
                    "no query on the idle outbox in log mode: {} scans, {} updates in {:.0} s",
                    idle.scans, idle.updates, idle.window_seconds
                ),
                verdict(idle.scans == 0 && idle.updates == 0),
            )),
            None => out.push((
                "no query on the idle outbox in log mode".into(),
                "n/a".into(),
            )),
        }
        let poll = self
            .rows
            .iter()
            .find(|r| r.name.starts_with("poll (PostgreSQL) @"))
            .and_then(|r| r.latency);
        match (log_rate.and_then(|r| r.latency), poll) {
            (Some(log), Some(poll)) => {
                let ratio = poll.p50 / log.p50.max(0.001);
                out.push((
                    format!(
                        "log-mode p50 ≥ 20× lower than poll mode's: {:.1} ms vs {:.1} ms ({ratio:.0}×)",
                        log.p50, poll.p50
                    ),
                    verdict(ratio >= 20.0),
                ));
            }
            _ => out.push((
                "log-mode p50 ≥ 20× lower than poll mode's".into(),
                "n/a".into(),
            )),
        }
        out.extend(self.http_targets());
        let ingest = (self.rows.iter())
            .find(|r| r.name.starts_with("inbox ingest backlog") && !r.unavailable)
            .and_then(|r| r.events_per_s);
        match ingest {
            Some(rate) => out.push((
                format!("inbox ingest from Kafka ≥ 20,000 rows/s: {rate:.0}"),
                verdict(rate >= 20_000.0),
            )),
            None => out.push((
                "inbox ingest from Kafka ≥ 20,000 rows/s".into(),
                "n/a".into(),
            )),
        }
        let inbox_rate = (self.rows.iter())
            .find(|r| r.name.starts_with("inbox @"))
            .and_then(|r| r.latency);
        match inbox_rate {
            Some(l) => out.push((
                format!(
                    "inbox p99 append → DONE ≤ 50 ms at the fixed rate: {:.1} ms",
                    l.p99
                ),
                verdict(l.p99 <= 50.0),
            )),
            None => out.push((
                "inbox p99 append → DONE ≤ 50 ms at the fixed rate".into(),
                "n/a".into(),
            )),
        }
        out
    }

    /// The HTTP sink's targets, when an HTTP scenario ran.
    fn http_targets(&self) -> Vec<(String, String)> {
        let verdict = |ok: bool| if ok { "PASS" } else { "MISS" }.to_owned();
        let http: Vec<&Row> = (self.rows.iter())
            .filter(|r| r.name.starts_with("http "))
            .collect();
        let mut out = Vec::new();
        if http.is_empty() {
            return out;
        }
        let drain = http.iter().find(|r| r.is_http_drain);
        match (drain.and_then(|r| self.ratio(r)), self.limits.http_client) {
            (Some(ratio), Some(limit)) => out.push((
                format!("HTTP drain ≥ 0.6 × the HTTP limit ({limit:.0} req/s): {ratio:.2}"),
                verdict(ratio >= 0.6),
            )),
            _ => out.push(("HTTP drain ≥ 0.6 × the HTTP limit".into(), "n/a".into())),
        }
        match drain.and_then(|r| r.events_per_s) {
            Some(rate) => out.push((
                format!("HTTP drain ≥ 20,000 events/s: {rate:.0}"),
                verdict(rate >= 20_000.0),
            )),
            None => out.push(("HTTP drain ≥ 20,000 events/s".into(), "n/a".into())),
        }
        let rate = http
            .iter()
            .find(|r| r.name.starts_with("http (PostgreSQL) @"));
        match rate.and_then(|r| r.latency) {
            Some(l) => out.push((
                format!(
                    "HTTP p99 commit → receiver ≤ 25 ms at the fixed rate: {:.1} ms",
                    l.p99
                ),
                verdict(l.p99 <= 25.0),
            )),
            None => out.push((
                "HTTP p99 commit → receiver ≤ 25 ms at the fixed rate".into(),
                "n/a".into(),
            )),
        }
        let measured: Vec<&&Row> = http.iter().filter(|r| r.peak_rss.is_some()).collect();
        match measured.iter().max_by_key(|r| r.peak_rss) {
            Some(top) => {
                let rss = top.peak_rss.unwrap_or(0);
                let all = measured.len() == http.len();
                out.push((
                    format!(
                        "HTTP peak RSS ≤ 64 MB in every HTTP scenario: {:.1} MB ({}){}",
                        rss as f64 / 1048576.0,
                        top.name,
                        if all { "" } else { "; a scenario did not run" }
                    ),
                    verdict(all && rss <= 64 * 1024 * 1024),
                ));
            }
            None => out.push((
                "HTTP peak RSS ≤ 64 MB in every HTTP scenario".into(),
                "n/a".into(),
            )),
        }
        let stall = http.iter().find(|r| r.name.contains("receiver stalled"));
        match stall.and_then(|r| r.http) {
            Some(c) => out.push((
                format!(
                    "HTTP: everything delivered after the receiver's stall: {} of {}",
                    c.delivered, c.written
                ),
                verdict(c.ok()),
            )),
            None => out.push((
                "HTTP: everything delivered after the receiver's stall".into(),
                "n/a".into(),
            )),
        }
        let checks: Vec<HttpCheck> = http.iter().filter_map(|r| r.http).collect();
        let lost: usize = checks.iter().map(HttpCheck::lost).sum();
        let order: usize = checks.iter().map(|c| c.order_violations).sum();
        let unknown: usize = checks.iter().map(|c| c.unknown + c.bad).sum();
        out.push((
            format!(
                "HTTP: nothing lost, out of order or unknown at the receiver: {lost} lost, \
                 {order} order violations, {unknown} unknown in {} scenarios",
                checks.len()
            ),
            verdict(checks.len() == http.len() && checks.iter().all(HttpCheck::ok)),
        ));
        out
    }

    pub(crate) fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .chain(self.limit_rows().iter())
            .map(|r| {
                json!({
                    "scenario": r.name,
                    "available": !r.unavailable,
                    "events": r.events,
                    "events_per_s": r.events_per_s,
                    "latency_ms": r.latency.map(|l| json!({
                        "samples": l.samples, "p50": l.p50, "p99": l.p99, "p999": l.p999, "max": l.max,
                    })),
                    "peak_rss_bytes": r.peak_rss,
                    "cpu_seconds_per_million_events": r.cpu_per_million,
                    "postgres_cpu_seconds_per_million_events": r.servers.map(|c| c.postgres),
                    "kafka_broker_cpu_seconds_per_million_events": r.servers.map(|c| c.kafka),
                    "wal_bytes_per_event": r.wal_per_event,
                    "duplicates": r.duplicates,
                    "ratio_to_lower_limit": self.ratio(r),
                    "http_receiver": r.http.map(|c| json!({
                        "written": c.written, "delivered": c.delivered, "lost": c.lost(),
                        "unknown": c.unknown, "order_violations": c.order_violations,
                        "refused": c.bad, "all_rows_success": c.all_success,
                    })),
                    "note": r.note,
                })
            })
            .collect();
        let targets: Vec<Value> = self
            .targets()
            .into_iter()
            .map(|(target, verdict)| json!({"target": target, "verdict": verdict}))
            .collect();
        let doc = json!({
            "machine": self.machine,
            "settings": self.settings,
            "rows": rows,
            "limits": {
                "pg_recvlogical_events_per_s": self.limits.pg_recvlogical,
                "pg_recvlogical_with_write_back_events_per_s": self.limits.pg_recvlogical_with_write_back,
                "kafka_producer_performance_events_per_s": self.limits.kafka_producer_performance,
                "kafka_producer_performance_summary": self.limits.kafka_producer_performance_summary,
                "kafka_rdkafka_keyed_events_per_s": self.limits.kafka_rdkafka_keyed,
                "mysqlbinlog_events_per_s": self.limits.mysqlbinlog,
                "http_client_requests_per_s": self.limits.http_client,
                "http_client_concurrency": self.limits.http_concurrency,
                "lower_binlog": self.limits.lower_binlog(),
                "lower": self.limits.lower(),
            },
            "idle": self.idle.as_ref().map(|i| json!({
                "window_seconds": i.window_seconds, "scans": i.scans, "updates": i.updates,
                "exit_code": i.exit_code,
            })),
            "targets": targets,
            "soak": self.soak.as_ref().map(SoakReport::json),
        });
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")?;
        Ok(())
    }
}
