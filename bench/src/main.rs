//! `outboxd-bench`: runs outboxd (a release build, as a child process) against a workload
//! of concurrent writers, measures throughput, commit → broker-append latency, peak RSS,
//! CPU and WAL per event, for log and poll mode, and measures the machine's limits beside
//! it: `pg_recvlogical` draining the same WAL, Kafka's producer performance tool; or, named
//! alone, soaks outboxd under faults at random (`soak`). Prints one table, writes JSON, and
//! records the run in docs/benchmarks.md (the results it replaces go to
//! docs/benchmarks-history.md). See docs/benchmarks.md.

mod args;
mod console;
mod consume;
mod daemon;
mod exactly_once;
mod faults;
mod http;
mod http_receiver;
mod idle;
mod inbox;
mod ingress_flood;
mod limits;
mod mariadb;
mod poll;
mod record;
mod report;
mod soak;
mod toxiproxy;
mod workload;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use tokio_postgres::Client;

use crate::args::{env_or, services_from_env, Args};
use crate::consume::Consumed;
use crate::daemon::{BenchPipeline, CpuSnapshot, Daemon, Services, Source};
use crate::report::{Idle, Report, Row};
use crate::workload::{now_micros, Database, Workload, Written};

/// Shared state of one bench run.
struct Bench {
    args: Args,
    services: Services,
    run: String,
    dir: PathBuf,
    sql: Client,
    pipelines: Vec<BenchPipeline>,
    topics: Vec<String>,
    slots: Vec<String>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    args.check_scenarios().map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        args.outboxd.exists(),
        "{} not found: build it with `cargo build --release` (scripts/bench does)",
        args.outboxd.display()
    );
    let services = services_from_env()?;
    let run = format!("{:x}", now_micros() % 0xFF_FFFF);
    let dir = std::env::temp_dir().join(format!("outboxd-bench-{run}"));
    std::fs::create_dir_all(&dir)?;
    let sql = workload::connect(&services.conn_string()).await?;
    let mut bench = Bench {
        args: args.clone(),
        services,
        run,
        dir,
        sql,
        pipelines: Vec::new(),
        topics: Vec::new(),
        slots: Vec::new(),
    };
    let mut report = Report::new(&args, &bench.sql).await;
    eprintln!(
        "bench run {} (logs and configs in {})",
        bench.run,
        bench.dir.display()
    );

    let started = Instant::now();
    let commit = record::commit();
    let result = bench.run_all(&mut report).await;
    if args.cleanup {
        bench.cleanup().await;
    }
    result?;
    let text = report.text();
    print!("{text}");
    let json = args.json_path();
    report.write_json(&json)?;
    eprintln!("JSON written to {}", json.display());
    if !args.no_doc {
        let run = record::Run::describe(&report, started.elapsed(), commit);
        record::record(&args.doc, &args.history, &args.scenario_set(), &run, &text)?;
        eprintln!(
            "results recorded in {} (the ones they replace in {})",
            args.doc.display(),
            args.history.display()
        );
    }
    Ok(())
}

impl Bench {
    async fn run_all(&mut self, report: &mut Report) -> anyhow::Result<()> {
        // 1. Log mode at a fixed rate; then its outbox stays idle while the rest runs.
        let mut idle_task = None;
        if self.args.wants("rate") {
            let (row, daemon, pipeline) = self.log_fixed_rate().await?;
            report.rows.push(row);
            if self.args.wants("idle") {
                let sql = workload::connect(&self.services.conn_string()).await?;
                let seconds = self.args.idle_seconds;
                idle_task = Some(tokio::spawn(idle::idle_check(
                    sql,
                    pipeline.table,
                    daemon,
                    seconds,
                )));
            } else {
                let _ = daemon.terminate(Duration::from_secs(60)).await;
            }
        }
        // 2. The broker's limit.
        if self.args.wants("limits") {
            let pg = report.limits.pg_recvlogical;
            report.limits = self.kafka_limits().await?;
            report.limits.pg_recvlogical = pg;
        }
        // 3. A backlog: pg_recvlogical's limit, then outboxd draining the same WAL; then
        //    writers at full speed with outboxd running.
        if self.args.wants("backlog") || self.args.wants("max") {
            self.log_backlog_and_max(report).await?;
        }
        // 4. Exactly-once on the fixed rate and a backlog.
        if self.args.wants("eos") {
            let rows = self.exactly_once().await;
            report.rows.extend(rows_or_unavailable(
                rows,
                "exactly-once",
                "log (PostgreSQL) exactly-once",
            ));
        }
        // 5. Poll mode.
        if self.args.wants("poll") {
            let rows = self.poll_mode().await;
            report
                .rows
                .extend(rows_or_unavailable(rows, "poll mode", "poll (PostgreSQL)"));
        }
        if self.args.wants("mariadb") {
            match self.mariadb().await {
                Ok((rows, binlog)) => {
                    report.rows.extend(rows);
                    report.limits.mysqlbinlog = binlog;
                }
                Err(e) => {
                    eprintln!("MariaDB: {e:#}");
                    report.rows.push(Row::unavailable(
                        "log (MariaDB)",
                        &format!("not available: {}", last_line(&format!("{e:#}"))),
                    ));
                }
            }
        }
        if self.args.wants("inbox") {
            let rows = self.inbox().await;
            report
                .rows
                .extend(rows_or_unavailable(rows, "inbox", "inbox (PostgreSQL)"));
        }
        if self.args.wants("ingress-flood") {
            let rows = self.ingress_flood().await;
            report.rows.extend(rows_or_unavailable(
                rows,
                "ingress flood",
                "inbox HTTP: ingress flood",
            ));
        }
        if ["http", "http-drain", "http-rate", "http-stall", "http-poll"]
            .iter()
            .any(|s| self.args.wants(s))
        {
            self.http_sink(report).await?;
        }
        for fault in ["pgrestart", "kill9"] {
            if !self.args.wants(fault) {
                continue;
            }
            let result = match fault {
                "pgrestart" => self.pg_restart_mid_drain().await,
                _ => self.kill9_under_load().await,
            };
            match result {
                Ok(row) => report.rows.push(row),
                Err(e) => {
                    eprintln!("{fault}: {e:#}");
                    report.rows.push(Row::unavailable(
                        &format!("fault: {fault}"),
                        &format!("failed: {}", last_line(&format!("{e:#}"))),
                    ));
                }
            }
        }
        if self.args.wants("console") {
            let rows = self.console().await;
            report.rows.extend(rows_or_unavailable(
                rows,
                "console",
                "console: pages on 1,000,000 rows",
            ));
        }
        if self.args.wants("soak") {
            report.soak = Some(self.soak().await?);
        }
        if let Some(task) = idle_task {
            eprintln!("waiting for the idle-window check to finish");
            report.idle = Some(task.await.context("idle check task")??);
        }
        Ok(())
    }

    /// Creates the topic, writes the config, runs `outboxd init`.
    async fn pipeline(&mut self, scenario: &str, source: Source) -> anyhow::Result<BenchPipeline> {
        let extra = self.args.config_extra.replace("\\n", "\n");
        self.pipeline_with(scenario, source, &extra).await
    }

    /// [`Self::pipeline`] with `extra` appended to the config instead of `--config-extra`.
    async fn pipeline_with(
        &mut self,
        scenario: &str,
        source: Source,
        extra: &str,
    ) -> anyhow::Result<BenchPipeline> {
        let services = self.services.clone();
        self.pipeline_via(scenario, source, extra, &services).await
    }

    /// [`Self::pipeline_with`], outboxd reaching the servers at `via` (e.g. through proxies)
    /// where the bench reaches them at `self.services`.
    async fn pipeline_via(
        &mut self,
        scenario: &str,
        source: Source,
        extra: &str,
        via: &Services,
    ) -> anyhow::Result<BenchPipeline> {
        let name = format!("bench_{}_{scenario}", self.run);
        let topic = format!("bench.{}.{scenario}", self.run);
        consume::create_topic(&self.services.kafka, &topic, self.args.partitions).await?;
        self.topics.push(topic.clone());
        let p = BenchPipeline::write(&self.dir, via, &name, &topic, source, extra)?;
        self.pipelines.push(p.clone());
        daemon::outboxd_once(&self.args.outboxd, "init", &p.config).await?;
        if source == Source::PgPoll {
            // Poll mode reads no log: a slot left by `init` would only hold WAL back.
            self.sql
                .execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                     WHERE slot_name = $1",
                    &[&format!("outboxd_{name}")],
                )
                .await?;
        }
        Ok(p)
    }

    fn workload(&self, p: &BenchPipeline, tag: &str, events: usize, rate: Option<f64>) -> Workload {
        Workload {
            db: match p.source {
                Source::Mysql => Database::Mysql(self.services.mysql_url()),
                Source::PgLog | Source::PgPoll => Database::Postgres(self.services.conn_string()),
            },
            table: p.table.clone(),
            writers: self.args.writers,
            tx_size: self.args.tx_size,
            payload_bytes: self.args.payload_bytes,
            keys: self.args.keys,
            events,
            rate,
            tag: tag.to_owned(),
        }
    }

    fn spawn(&self, p: &BenchPipeline, log: &str) -> anyhow::Result<Daemon> {
        Daemon::spawn(&self.args.outboxd, &p.config, self.dir.join(log))
    }

    async fn log_fixed_rate(&mut self) -> anyhow::Result<(Row, Daemon, BenchPipeline)> {
        let p = self.pipeline("rate", Source::PgLog).await?;
        let label = format!("log (PostgreSQL) @{} ev/s", self.args.rate);
        let (row, daemon) = self.fixed_rate(&p, &label, "r").await?;
        Ok((row, daemon, p))
    }

    /// Writers at `--rate` for `--rate-seconds` with outboxd running on `p`; the row is
    /// `label`, the records tagged with the run and `tag`. Returns outboxd still running.
    async fn fixed_rate(
        &mut self,
        p: &BenchPipeline,
        label: &str,
        tag: &str,
    ) -> anyhow::Result<(Row, Daemon)> {
        self.fixed_rate_at(p, label, tag, self.args.rate).await
    }

    /// [`Self::fixed_rate`] at `rate` events per second.
    async fn fixed_rate_at(
        &mut self,
        p: &BenchPipeline,
        label: &str,
        tag: &str,
        rate: f64,
    ) -> anyhow::Result<(Row, Daemon)> {
        let events = (rate * self.args.rate_seconds) as usize;
        let tag = format!("{}{tag}", self.run);
        eprintln!("{label}, for {} s", self.args.rate_seconds);
        let consumer = consume::spawn(
            &self.services.kafka,
            &p.topic,
            self.args.partitions,
            events,
            Duration::from_secs_f64(self.args.rate_seconds + 120.0),
        );
        let mut daemon = self.spawn(p, &format!("{}.log", p.name))?;
        wait_ready(&mut daemon, p.metrics_port, Duration::from_secs(30)).await?;
        let cpu0 = daemon.sample().unwrap_or_default().cpu_seconds;
        let servers0 = CpuSnapshot::take();
        let lsn0 = current_lsn(&self.sql).await?;
        let written = workload::run(&self.workload(p, &tag, events, Some(rate))).await?;
        let consumed = join(consumer, &mut daemon).await?;
        wait_all_sent(&self.sql, &p.table, Duration::from_secs(120)).await?;
        let lsn1 = current_lsn(&self.sql).await?;
        let sample = daemon.sample().unwrap_or_default();
        let mut row = Row::from_live(label, &tag, &written, &consumed);
        row.set_process(sample, sample.cpu_seconds - cpu0, events);
        row.servers = Some(CpuSnapshot::take().per_million_since(&servers0, events));
        row.wal_per_event = Some((lsn1 - lsn0) as f64 / events as f64);
        Ok((row, daemon))
    }

    async fn log_backlog_and_max(&mut self, report: &mut Report) -> anyhow::Result<()> {
        let p = self.pipeline("backlog", Source::PgLog).await?;
        let events = self.args.backlog_events;
        // Two slots from the same start: one read before outboxd drains (the backlog), one
        // after (the backlog and the drain's write-back, as outboxd's walsender decodes them).
        let recv_slot = self
            .create_slot(&format!("bench_recv_{}", self.run))
            .await?;
        let recv_all_slot = self
            .create_slot(&format!("bench_recv_all_{}", self.run))
            .await?;

        eprintln!("backlog: {events} events written with outboxd stopped");
        let tag = format!("{}b", self.run);
        let lsn0 = current_lsn(&self.sql).await?;
        let written = workload::run(&self.workload(&p, &tag, events, None)).await?;
        let endpos = self.mark_end(&p, &format!("{tag}-marker")).await?;
        let lsn_inserted = current_lsn(&self.sql).await?;
        let mut writers = Row::named("writers only (PostgreSQL inserts)");
        writers.events = events;
        writers.events_per_s = Some(events as f64 / written.elapsed.as_secs_f64());
        writers.wal_per_event = Some((lsn_inserted - lsn0) as f64 / events as f64);
        writers.note = format!(
            "{} connections, {} rows per transaction",
            self.args.writers, self.args.tx_size
        );

        eprintln!("pg_recvlogical draining the backlog");
        let (rate, cpu) = self.read_slot(&p, &recv_slot, &endpos, events).await?;
        report.limits.pg_recvlogical = Some(rate);
        report.limits.pg_recvlogical_cpu = Some(cpu);

        eprintln!("outboxd draining the backlog");
        // The marker is one more record.
        let (mut row, mut daemon) = self
            .drain(
                &p,
                events,
                events + 1,
                lsn0,
                "log (PostgreSQL) backlog drain",
            )
            .await?;
        row.is_throughput_run = true;
        self.recvlogical_with_write_back(report, &p, &recv_all_slot, &tag, events)
            .await?;
        if self.args.wants("backlog") {
            report.rows.push(row);
            report.rows.push(writers);
        }

        if self.args.wants("max") {
            let events = self.args.max_events;
            eprintln!(
                "log mode, {events} events as fast as {} writers can",
                self.args.writers
            );
            let tag = format!("{}m", self.run);
            let consumer = consume::spawn_filtered(
                &self.services.kafka,
                &p.topic,
                self.args.partitions,
                events,
                Duration::from_secs(600),
                &tag,
            );
            let cpu0 = daemon.sample().unwrap_or_default().cpu_seconds;
            let servers0 = CpuSnapshot::take();
            let lsn0 = current_lsn(&self.sql).await?;
            let written = workload::run(&self.workload(&p, &tag, events, None)).await?;
            let consumed = join(consumer, &mut daemon).await?;
            wait_all_sent(&self.sql, &p.table, Duration::from_secs(300)).await?;
            let lsn1 = current_lsn(&self.sql).await?;
            let sample = daemon.sample().unwrap_or_default();
            let mut row = Row::from_live(
                "log (PostgreSQL) writers at full speed",
                &tag,
                &written,
                &consumed,
            );
            row.set_process(sample, sample.cpu_seconds - cpu0, events);
            row.servers = Some(CpuSnapshot::take().per_million_since(&servers0, events));
            row.wal_per_event = Some((lsn1 - lsn0) as f64 / events as f64);
            report.rows.push(row);
        }
        let code = daemon.terminate(Duration::from_secs(60)).await?;
        anyhow::ensure!(code == 0, "outboxd exited with {code} on SIGTERM");
        Ok(())
    }

    /// `pg_recvlogical` on `slot` (made before the backlog) to the WAL's end now, once
    /// outboxd has drained the backlog: the inserts and the write-back's updates, which the
    /// walsender decodes and pgoutput drops (the publication publishes inserts only).
    async fn recvlogical_with_write_back(
        &mut self,
        report: &mut Report,
        p: &BenchPipeline,
        slot: &str,
        tag: &str,
        events: usize,
    ) -> anyhow::Result<()> {
        // outboxd, still running, relays this marker too.
        let endpos = self.mark_end(p, &format!("{tag}-marker-after")).await?;
        eprintln!("pg_recvlogical reading the backlog and the write-back");
        let (rate, cpu) = self.read_slot(p, slot, &endpos, events).await?;
        report.limits.pg_recvlogical_with_write_back = Some(rate);
        report.limits.pg_recvlogical_with_write_back_cpu = Some(cpu);
        Ok(())
    }

    /// A logical slot (pgoutput) named `name`, dropped at the end of the run if not before.
    async fn create_slot(&mut self, name: &str) -> anyhow::Result<String> {
        self.sql
            .execute(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                &[&name],
            )
            .await
            .with_context(|| format!("creating the slot {name}"))?;
        self.slots.push(name.to_owned());
        Ok(name.to_owned())
    }

    /// The WAL's end now, then one more transaction on the outbox (`message_id`): the
    /// first record past it, where `pg_recvlogical --endpos` stops.
    async fn mark_end(&self, p: &BenchPipeline, message_id: &str) -> anyhow::Result<String> {
        let endpos: String = self
            .sql
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await?
            .get(0);
        self.sql
            .execute(
                &format!(
                    "INSERT INTO \"{}\" (message_id, message_type, biz_key, payload) \
                     VALUES ($1, 'bench.marker', $1, '{{}}')",
                    p.table
                ),
                &[&message_id],
            )
            .await?;
        Ok(endpos)
    }

    /// `pg_recvlogical` reading `slot` to `endpos`, then the slot dropped: `events` per
    /// second, and the servers' CPU per million of them.
    async fn read_slot(
        &mut self,
        p: &BenchPipeline,
        slot: &str,
        endpos: &str,
        events: usize,
    ) -> anyhow::Result<(f64, CpuSnapshot)> {
        let before = CpuSnapshot::take();
        let elapsed =
            limits::pg_recvlogical(&self.services, slot, &format!("outboxd_{}", p.name), endpos)
                .await?;
        let cpu = CpuSnapshot::take().per_million_since(&before, events);
        self.sql
            .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
            .await?;
        self.slots.retain(|s| s != slot);
        Ok((events as f64 / elapsed.as_secs_f64(), cpu))
    }

    /// outboxd started on `p`, whose backlog of `events` rows (`records` records with any
    /// marker) was written since WAL position `lsn0`, until every record is in Kafka and
    /// every row SUCCESS; events per second from the start of the process to the last
    /// broker append. Returns outboxd still running.
    async fn drain(
        &mut self,
        p: &BenchPipeline,
        events: usize,
        records: usize,
        lsn0: u64,
        label: &str,
    ) -> anyhow::Result<(Row, Daemon)> {
        let consumer = consume::spawn(
            &self.services.kafka,
            &p.topic,
            self.args.partitions,
            records,
            Duration::from_secs(600),
        );
        let start_us = now_micros();
        let servers0 = CpuSnapshot::take();
        let mut daemon = self.spawn(p, &format!("{}.log", p.name))?;
        let consumed = join(consumer, &mut daemon).await?;
        wait_all_sent(&self.sql, &p.table, Duration::from_secs(300)).await?;
        let lsn_sent = current_lsn(&self.sql).await?;
        let sample = daemon.sample().unwrap_or_default();
        let mut row = Row::named(label);
        row.events = events;
        row.duplicates = Some(consumed.duplicates);
        let drained_us = (consumed.last_append_ms() * 1000) as u64;
        row.events_per_s =
            Some(events as f64 / (drained_us.saturating_sub(start_us) as f64 / 1e6).max(1e-3));
        row.set_process(sample, sample.cpu_seconds, events);
        row.servers = Some(CpuSnapshot::take().per_million_since(&servers0, events));
        row.wal_per_event = Some((lsn_sent - lsn0) as f64 / events as f64);
        row.note = format!(
            "includes start-up; {} records missing",
            records.saturating_sub(consumed.records.len())
        );
        Ok((row, daemon))
    }

    async fn cleanup(&mut self) {
        for slot in self.slots.drain(..) {
            let _ = self
                .sql
                .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
                .await;
        }
        for p in self.pipelines.iter().filter(|p| p.source == Source::Mysql) {
            if let Ok(opts) = mysql_async::Opts::from_url(&self.services.mysql_url()) {
                use mysql_async::prelude::Queryable;
                if let Ok(mut conn) = mysql_async::Conn::new(opts).await {
                    let _ = conn
                        .query_drop(format!(
                            "DROP TABLE IF EXISTS `{}`; DELETE FROM outboxd_checkpoint WHERE pipeline = '{}'",
                            p.table, p.name
                        ))
                        .await;
                    let _ = conn.disconnect().await;
                }
            }
        }
        for p in self.pipelines.iter().filter(|p| p.source != Source::Mysql) {
            let slot = format!("outboxd_{}", p.name);
            // A stopped outboxd's walsender may hold the slot a moment longer; a slot left
            // behind would hold WAL forever.
            for _ in 0..50 {
                let _ = self
                    .sql
                    .execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                         WHERE slot_name = $1 AND NOT active",
                        &[&slot],
                    )
                    .await;
                let left = self
                    .sql
                    .query_one(
                        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1",
                        &[&slot],
                    )
                    .await
                    .map_or(0, |r| r.get::<_, i64>(0));
                if left == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let _ = self
                .sql
                .batch_execute(&format!(
                    "DROP PUBLICATION IF EXISTS outboxd_{name}; DROP TABLE IF EXISTS \"{table}\"; \
                     DELETE FROM outboxd_checkpoint WHERE pipeline = '{name}'",
                    name = p.name,
                    table = p.table
                ))
                .await;
        }
        consume::delete_topics(&self.services.kafka, &self.topics).await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The most specific line of an error report (outboxd's own message comes last).
fn last_line(s: &str) -> &str {
    s.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default()
        .trim()
}

/// Waits for the consumer while watching outboxd: if it exits, the run stops with its log.
async fn join(
    handle: std::thread::JoinHandle<anyhow::Result<Consumed>>,
    daemon: &mut Daemon,
) -> anyhow::Result<Consumed> {
    while !handle.is_finished() {
        anyhow::ensure!(
            daemon.is_running(),
            "outboxd exited while the consumer waited:\n{}",
            daemon.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    handle
        .join()
        .map_err(|_| anyhow::anyhow!("consumer thread panicked"))?
}

/// Waits until `/readyz` answers 200.
async fn wait_ready(daemon: &mut Daemon, port: u16, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok((200, _)) = daemon::http_get(port, "/readyz").await {
            return Ok(());
        }
        anyhow::ensure!(
            daemon.is_running(),
            "outboxd exited during start-up:\n{}",
            daemon.log_tail()
        );
        anyhow::ensure!(
            Instant::now() < deadline,
            "outboxd not ready after {timeout:?}:\n{}",
            daemon.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A scenario's rows, or one row saying why it is not available (the error printed), so
/// one scenario's failure does not cost the others.
fn rows_or_unavailable(rows: anyhow::Result<Vec<Row>>, what: &str, label: &str) -> Vec<Row> {
    rows.unwrap_or_else(|e| {
        eprintln!("{what}: {e:#}");
        vec![Row::unavailable(
            label,
            &format!("not available: {}", last_line(&format!("{e:#}"))),
        )]
    })
}

async fn current_lsn(sql: &Client) -> anyhow::Result<u64> {
    let row = sql
        .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint", &[])
        .await?;
    Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
}

/// Waits until no row of `table` is INIT, FAILED or PROCESSING.
async fn wait_all_sent(sql: &Client, table: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let query = format!("SELECT count(*) FROM \"{table}\" WHERE status <> 'SUCCESS'");
    loop {
        let left: i64 = sql.query_one(&query, &[]).await?.get(0);
        if left == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{left} rows of {table} not SUCCESS after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// Used by Row::from_live.
pub(crate) fn latencies_ms(tag: &str, written: &Written, consumed: &Consumed) -> Vec<f64> {
    let mut out: Vec<f64> = consumed
        .records
        .iter()
        .filter_map(|r| {
            let commit = written.commit_of(tag, &r.message_id)?;
            let append = u64::try_from(r.append_ms).ok()? * 1000;
            // The broker's clock has millisecond resolution: an append in the same
            // millisecond as the commit can read as up to 1 ms before it.
            Some(append.saturating_sub(commit) as f64 / 1000.0)
        })
        .collect();
    out.sort_by(|a, b| a.total_cmp(b));
    out
}
