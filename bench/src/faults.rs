//! Fault scenarios: what a crash or a database restart costs in duplicates.
//!
//! - `pgrestart`: one large transaction is written with outboxd stopped; outboxd drains it,
//!   and once a quarter of its rows are SUCCESS the bench restarts PostgreSQL
//!   (`pg_ctl restart -m fast`). The stream breaks mid-transaction; the next session reads
//!   the transaction again. Counted: duplicates in the topic against the events in flight
//!   (sent, not yet written back) just before the restart.
//! - `kill9`: writers at a fixed rate while outboxd is killed with SIGKILL every
//!   `--kill-every` seconds and started again at once. Counted: duplicates per kill, and
//!   that no row is missing.
//!
//! Both end with every row SUCCESS and every row in the topic; a missing one fails the run.

use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::consume;
use crate::daemon::{self, Source};
use crate::report::Row;
use crate::workload::{self, Workload};
use crate::{join, wait_all_sent, wait_ready, Bench};

impl Bench {
    /// PostgreSQL restarted while outboxd drains one large transaction.
    pub(crate) async fn pg_restart_mid_drain(&mut self) -> anyhow::Result<Row> {
        let p = self.pipeline("pgrestart", Source::PgLog).await?;
        let events = self.args.fault_tx_events;
        let tag = format!("{}pr", self.run);
        eprintln!("pgrestart: one transaction of {events} rows written with outboxd stopped");
        let mut load = self.workload(&p, &tag, events, None);
        load.writers = 1;
        load.tx_size = events;
        workload::run(&load).await?;

        let consumer = consume::spawn(
            &self.services.kafka,
            &p.topic,
            self.args.partitions,
            events,
            Duration::from_secs(600),
        );
        let mut daemon = self.spawn(&p, "pgrestart.log")?;
        wait_ready(&mut daemon, p.metrics_port, Duration::from_secs(60)).await?;

        // Restart once a quarter of the rows are written back: the transaction is being
        // delivered, and most of it is still to come.
        let deadline = Instant::now() + Duration::from_secs(300);
        let success_query = format!(
            "SELECT count(*) FROM \"{}\" WHERE status = 'SUCCESS'",
            p.table
        );
        loop {
            let done: i64 = self.sql.query_one(&success_query, &[]).await?.get(0);
            if done as usize >= events / 4 {
                break;
            }
            anyhow::ensure!(
                daemon.is_running(),
                "outboxd exited:\n{}",
                daemon.log_tail()
            );
            anyhow::ensure!(
                Instant::now() < deadline,
                "{done} of {events} rows SUCCESS after 300 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let in_flight = metric(p.metrics_port, "outboxd_events_in_flight").await;
        let written_back: i64 = self.sql.query_one(&success_query, &[]).await?.get(0);
        eprintln!(
            "pgrestart: restarting PostgreSQL with {written_back} rows SUCCESS and {} in flight",
            in_flight.map_or("?".to_owned(), |n| format!("{n:.0}"))
        );
        restart_postgres().await?;
        self.sql = workload::connect(&self.services.conn_string()).await?;

        let consumed = join(consumer, &mut daemon).await?;
        wait_all_sent(&self.sql, &p.table, Duration::from_secs(300)).await?;
        let sample = daemon.sample().unwrap_or_default();
        let code = daemon.terminate(Duration::from_secs(60)).await?;
        anyhow::ensure!(code == 0, "outboxd exited with {code} on SIGTERM");

        let mut row = Row::named("fault: PostgreSQL restart mid-transaction");
        row.events = events;
        row.duplicates = Some(consumed.duplicates);
        row.peak_rss = Some(sample.peak_rss);
        let missing = events.saturating_sub(consumed.records.len());
        anyhow::ensure!(
            missing == 0,
            "pgrestart: {missing} rows never reached Kafka"
        );
        row.note = match in_flight {
            Some(n) if n > 0.0 => format!(
                "{written_back} SUCCESS and {n:.0} in flight at the restart; duplicates = {:.2} % \
                 of those in flight; 0 missing",
                consumed.duplicates as f64 / n * 100.0
            ),
            _ => format!("{written_back} SUCCESS at the restart; 0 missing"),
        };
        Ok(row)
    }

    /// Writers at a fixed rate while outboxd is killed (SIGKILL) and started again.
    pub(crate) async fn kill9_under_load(&mut self) -> anyhow::Result<Row> {
        let p = self.pipeline("kill9", Source::PgLog).await?;
        let rate = self.args.fault_rate;
        let seconds = self.args.fault_seconds;
        let events = (rate * seconds) as usize;
        let every = Duration::from_secs_f64(self.args.kill_every);
        let tag = format!("{}k", self.run);
        eprintln!(
            "kill9: {rate} events/s for {seconds} s, outboxd killed every {:?}",
            every
        );
        let consumer = consume::spawn(
            &self.services.kafka,
            &p.topic,
            self.args.partitions,
            events,
            Duration::from_secs_f64(seconds + 300.0),
        );
        let mut daemon = self.spawn(&p, "kill9-0.log")?;
        wait_ready(&mut daemon, p.metrics_port, Duration::from_secs(60)).await?;
        let load: Workload = self.workload(&p, &tag, events, Some(rate));
        let writers = tokio::spawn(async move { workload::run(&load).await });

        let mut kills = 0usize;
        let mut next_kill = Instant::now() + every;
        while !writers.is_finished() {
            if Instant::now() >= next_kill {
                daemon.kill9().await;
                kills += 1;
                daemon = self.spawn(&p, &format!("kill9-{kills}.log"))?;
                next_kill = Instant::now() + every;
            }
            anyhow::ensure!(
                daemon.is_running(),
                "outboxd exited on its own:\n{}",
                daemon.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        writers.await.context("writer task")??;
        let consumed = join(consumer, &mut daemon).await?;
        wait_all_sent(&self.sql, &p.table, Duration::from_secs(300)).await?;
        let code = daemon.terminate(Duration::from_secs(60)).await?;
        anyhow::ensure!(code == 0, "outboxd exited with {code} on SIGTERM");

        let missing = events.saturating_sub(consumed.records.len());
        anyhow::ensure!(missing == 0, "kill9: {missing} rows never reached Kafka");
        let mut row = Row::named(&format!(
            "fault: kill -9 every {} s @{rate} ev/s",
            self.args.kill_every
        ));
        row.events = events;
        row.duplicates = Some(consumed.duplicates);
        row.note = format!(
            "{kills} kills, {:.1} duplicates per kill; 0 missing",
            consumed.duplicates as f64 / kills.max(1) as f64
        );
        Ok(row)
    }
}

/// One sample of a gauge from outboxd's `/metrics`.
async fn metric(port: u16, name: &str) -> Option<f64> {
    let (_, body) = daemon::http_get(port, "/metrics").await.ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// `pg_ctl restart -m fast` on the cluster in `$OUTBOXD_TEST_PG_DATA`, as its owner
/// (`postgres`; the bench runs as root, as `scripts/services` does); fails when the
/// server has not stopped and started again within 60 s.
pub(crate) async fn restart_postgres() -> anyhow::Result<()> {
    pg_ctl("restart", &["-m", "fast", "-w", "-t", "60", "-s"]).await
}

/// `pg_ctl stop -m immediate`: a shutdown that waits for no client.
pub(crate) async fn stop_postgres_at_once() -> anyhow::Result<()> {
    pg_ctl("stop", &["-m", "immediate", "-w", "-t", "60", "-s"]).await
}

async fn pg_ctl(command: &str, options: &[&str]) -> anyhow::Result<()> {
    let data = std::env::var("OUTBOXD_TEST_PG_DATA")
        .context("OUTBOXD_TEST_PG_DATA (from `scripts/services env`) names the cluster")?;
    let bin =
        std::env::var("OUTBOXD_PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".to_owned());
    let mut pg_ctl = tokio::process::Command::new("runuser");
    pg_ctl
        .args(["-u", "postgres", "--"])
        .arg(format!("{bin}/pg_ctl"))
        .args([command, "-D", &data])
        .args(options);
    if command != "stop" {
        // The server's log stays where scripts/services puts it (beside the data directory).
        let log = std::path::Path::new(&data)
            .with_file_name("log")
            .join("postgres.log");
        pg_ctl.arg("-l").arg(log);
    }
    let status = pg_ctl
        .current_dir("/")
        .status()
        .await
        .with_context(|| format!("running pg_ctl {command}"))?;
    anyhow::ensure!(status.success(), "pg_ctl {command} failed: {status}");
    Ok(())
}
