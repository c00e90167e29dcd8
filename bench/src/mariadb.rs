//! The binlog connector on MariaDB: a fixed rate and a backlog drain, with
//! `mysqlbinlog`'s own read of the same binlog as the limit.

use crate::*;

impl Bench {
    /// MariaDB in log mode (binlog): the fixed rate, then a backlog, with `mysqlbinlog`
    /// reading the backlog's binlog first (the binlog's limit, events/s).
    pub(crate) async fn mariadb(&mut self) -> anyhow::Result<(Vec<Row>, Option<f64>)> {
        let url = self.services.mysql_url();
        let p = self.pipeline("maria", Source::Mysql).await?;
        let mut rows = Vec::new();
        let events = (self.args.rate * self.args.poll_seconds) as usize;
        let tag = format!("{}d", self.run);
        eprintln!(
            "MariaDB log mode, {} events/s for {} s",
            self.args.rate, self.args.poll_seconds
        );
        let consumer = consume::spawn(
            &self.services.kafka,
            &p.topic,
            self.args.partitions,
            events,
            Duration::from_secs_f64(self.args.poll_seconds + 120.0),
        );
        let mut daemon = self.spawn(&p, "maria.log")?;
        wait_ready(&mut daemon, p.metrics_port, Duration::from_secs(30)).await?;
        let cpu0 = daemon.sample().unwrap_or_default().cpu_seconds;
        let written = workload::run(&self.workload(&p, &tag, events, Some(self.args.rate))).await?;
        let consumed = join(consumer, &mut daemon).await?;
        wait_all_sent_mysql(&url, &p.table, Duration::from_secs(120)).await?;
        let sample = daemon.sample().unwrap_or_default();
        let mut row = Row::from_live(
            &format!("log (MariaDB) @{} ev/s", self.args.rate),
            &tag,
            &written,
            &consumed,
        );
        row.set_process(sample, sample.cpu_seconds - cpu0, events);
        rows.push(row);
        let code = daemon.terminate(Duration::from_secs(60)).await?;
        anyhow::ensure!(code == 0, "outboxd (MariaDB) exited with {code} on SIGTERM");

        let events = self.args.mariadb_backlog_events;
        eprintln!("MariaDB: {events} events written with outboxd stopped, then drained");
        let tag = format!("{}e", self.run);
        let (file, position) = binlog_position(&url).await?;
        workload::run(&self.workload(&p, &tag, events, None)).await?;
        let binlog = match limits::mysqlbinlog(&self.services, &file, position).await {
            Ok(took) => Some(events as f64 / took.as_secs_f64().max(1e-3)),
            Err(e) => {
                eprintln!("mysqlbinlog limit: {e:#}");
                None
            }
        };
        let consumer = consume::spawn_filtered(
            &self.services.kafka,
            &p.topic,
            self.args.partitions,
            events,
            Duration::from_secs(600),
            &tag,
        );
        let start_us = now_micros();
        let mut daemon = self.spawn(&p, "maria-backlog.log")?;
        let consumed = join(consumer, &mut daemon).await?;
        wait_all_sent_mysql(&url, &p.table, Duration::from_secs(300)).await?;
        let sample = daemon.sample().unwrap_or_default();
        let mut row = Row::named("log (MariaDB) backlog drain");
        row.is_binlog_drain = true;
        row.events = events;
        row.duplicates = Some(consumed.duplicates);
        let drained_us = (consumed.last_append_ms() * 1000) as u64;
        row.events_per_s =
            Some(events as f64 / (drained_us.saturating_sub(start_us) as f64 / 1e6).max(1e-3));
        row.set_process(sample, sample.cpu_seconds, events);
        row.note = "includes start-up".into();
        rows.push(row);
        let code = daemon.terminate(Duration::from_secs(60)).await?;
        anyhow::ensure!(code == 0, "outboxd (MariaDB) exited with {code} on SIGTERM");
        Ok((rows, binlog))
    }
}

/// As [`wait_all_sent`], on MariaDB.
/// The server's current binlog file and position (`SHOW MASTER STATUS`).
pub(crate) async fn binlog_position(url: &str) -> anyhow::Result<(String, u64)> {
    use mysql_async::prelude::Queryable;
    let mut conn = mysql_async::Conn::new(mysql_async::Opts::from_url(url)?).await?;
    let row: Option<mysql_async::Row> = conn.query_first("SHOW MASTER STATUS").await?;
    let _ = conn.disconnect().await;
    let row = row.context("SHOW MASTER STATUS returned nothing: is the binlog on?")?;
    let file: String = row.get(0).context("binlog file")?;
    let position: u64 = row.get(1).context("binlog position")?;
    Ok((file, position))
}

pub(crate) async fn wait_all_sent_mysql(
    url: &str,
    table: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    use mysql_async::prelude::Queryable;
    let mut conn = mysql_async::Conn::new(mysql_async::Opts::from_url(url)?).await?;
    let deadline = Instant::now() + timeout;
    let query = format!("SELECT COUNT(*) FROM `{table}` WHERE status <> 'SUCCESS'");
    loop {
        let left: Option<i64> = conn.query_first(&query).await?;
        if left == Some(0) {
            let _ = conn.disconnect().await;
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{left:?} rows of {table} not SUCCESS after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
