//! How the soak watches the relays between and after faults: streaming again, steady
//! before the next fault, and the rows of each outbox and of the inbox.

use super::*;

impl Bench {
    /// Waits until each of `pipelines` streams again: a relay when Kafka holds a record of
    /// a transaction begun at or after its `snapshots`, the inbox when it has handled
    /// `inbox_target` messages; each one's time from now, `None` for one still not
    /// streaming after `limit` (with `stuck`, its outboxd is then killed and started
    /// again). An outboxd that exits meanwhile is started again at once (and counted): its
    /// time includes that.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn wait_streaming(
        &mut self,
        watch: &mut Watch<'_>,
        procs: &mut [Proc],
        pipelines: &[usize],
        snapshots: &[Vec<usize>],
        inbox_target: usize,
        limit: Duration,
        stuck: bool,
    ) -> anyhow::Result<Vec<(usize, Option<Duration>)>> {
        let from = Instant::now();
        let inbox = watch.relays.len();
        let mut out: Vec<(usize, Option<Duration>)> =
            pipelines.iter().map(|i| (*i, None)).collect();
        let mut next_inbox_look = Instant::now();
        while out.iter().any(|(_, r)| r.is_none()) && from.elapsed() < limit {
            for proc in procs.iter_mut() {
                proc.restart_if_exited(&watch.bin, &watch.dir)?;
            }
            for (i, at) in out.iter_mut().filter(|(_, r)| r.is_none()) {
                let done = if *i == inbox {
                    if Instant::now() < next_inbox_look {
                        continue;
                    }
                    next_inbox_look = Instant::now() + Duration::from_millis(250);
                    self.inbox_done(watch.inbox_table).await >= inbox_target
                } else {
                    watch.relays[*i].progress.streams_past(&snapshots[*i])
                };
                if done {
                    *at = Some(from.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for (i, _) in out.iter().filter(|(_, at)| stuck && at.is_none()) {
            let proc = &mut procs[*i];
            eprintln!(
                "soak:          STUCK: {} not streaming {:.0} s on; killed and started \
                 again:\n{}",
                proc.name,
                limit.as_secs_f64(),
                proc.daemon
                    .as_ref()
                    .map(Daemon::log_tail)
                    .unwrap_or_default()
            );
            proc.kill9_and_start(&watch.bin, &watch.dir, false).await?;
        }
        Ok(out)
    }

    /// Between faults: every relay streams what is written from now on within
    /// [`STEADY`]. One that does not (it streamed again after the last fault that touched
    /// it, then stopped) is waited for, and that fault's time to streaming again for it
    /// becomes the time from its end to now.
    pub(super) async fn steady(
        &mut self,
        watch: &mut Watch<'_>,
        procs: &mut [Proc],
        relays: &[Relay],
        faults: &mut [Fault],
        args: &crate::Args,
    ) -> anyhow::Result<()> {
        let checked = Instant::now();
        let snapshots: Vec<Vec<usize>> = relays.iter().map(|r| r.progress.snapshot()).collect();
        let all: Vec<usize> = (0..relays.len()).collect();
        let limit = Duration::from_secs_f64(args.stuck_limit.max(args.recovery_budget));
        let quick = self
            .wait_streaming(watch, procs, &all, &snapshots, 0, STEADY, false)
            .await?;
        let slow: Vec<usize> = (quick.iter().filter(|(_, at)| at.is_none()))
            .map(|(i, _)| *i)
            .collect();
        if slow.is_empty() {
            return Ok(());
        }
        let late = self
            .wait_streaming(
                watch,
                procs,
                &slow,
                &snapshots,
                0,
                limit.saturating_sub(STEADY),
                true,
            )
            .await?;
        for (i, at) in late {
            let Some(fault) = faults.iter_mut().rev().find(|f| f.touched(i)) else {
                continue;
            };
            let since_end = at.map(|at| checked.duration_since(fault.ended) + STEADY + at);
            eprintln!(
                "soak:          STALL: {} stopped streaming after the {} that ended {:.1} s \
                 before; {}",
                procs[i].name,
                fault.kind.name(),
                checked.duration_since(fault.ended).as_secs_f64(),
                since_end.map_or("stuck".to_owned(), |d| format!(
                    "streaming again {:.1} s after that fault's end",
                    d.as_secs_f64()
                ))
            );
            if let Some((_, recovered)) = fault.recovered.iter_mut().find(|(p, _)| *p == i) {
                *recovered = since_end;
            }
        }
        Ok(())
    }

    /// Rows in `p`'s outbox: what the writers committed.
    pub(super) async fn outbox_rows(&self, p: &BenchPipeline) -> anyhow::Result<usize> {
        let n: i64 = match p.source {
            Source::Mysql => {
                use mysql_async::prelude::Queryable;
                let opts = mysql_async::Opts::from_url(&self.services.mysql_url())?;
                let mut conn = mysql_async::Conn::new(opts).await?;
                let n = conn
                    .query_first(format!("SELECT count(*) FROM `{}`", p.table))
                    .await?
                    .unwrap_or(0);
                let _ = conn.disconnect().await;
                n
            }
            Source::PgLog | Source::PgPoll => {
                let sql = format!("SELECT count(*) FROM \"{}\"", p.table);
                self.sql.query_one(&sql, &[]).await?.get(0)
            }
        };
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// The inbox's rows and those DONE.
    pub(super) async fn inbox_counts(&self, table: &str) -> anyhow::Result<(usize, usize)> {
        let sql = format!("SELECT count(*), count(*) FILTER (WHERE status = 'DONE') FROM {table}");
        let row = self.sql.query_one(&sql, &[]).await?;
        let (rows, done): (i64, i64) = (row.get(0), row.get(1));
        Ok((rows as usize, done as usize))
    }

    /// The inbox's DONE rows; 0 while PostgreSQL does not answer (the bench's connection
    /// is made anew after a restart).
    pub(super) async fn inbox_done(&mut self, table: &str) -> usize {
        match self.inbox_counts(table).await {
            Ok((_, done)) => done,
            Err(_) => {
                if let Ok(sql) = workload::connect(&self.services.conn_string()).await {
                    self.sql = sql;
                }
                0
            }
        }
    }
}
