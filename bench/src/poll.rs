//! Poll mode (`source.mode = "poll"`): its fixed rate and its backlog drain.

use crate::*;

impl Bench {
    pub(crate) async fn poll_mode(&mut self) -> anyhow::Result<Vec<Row>> {
        let p = self.pipeline("poll", Source::PgPoll).await?;
        let mut rows = Vec::new();
        let events = (self.args.poll_rate * self.args.poll_seconds) as usize;
        let tag = format!("{}p", self.run);
        eprintln!(
            "poll mode, {} events/s for {} s",
            self.args.poll_rate, self.args.poll_seconds
        );
        let consumer = consume::spawn(
            &self.services.kafka,
            &p.topic,
            self.args.partitions,
            events,
            Duration::from_secs_f64(self.args.poll_seconds + 120.0),
        );
        let mut daemon = self.spawn(&p, "poll.log")?;
        if let Err(e) = wait_ready(&mut daemon, p.metrics_port, Duration::from_secs(30)).await {
            anyhow::bail!("{e:#}");
        }
        let lsn0 = current_lsn(&self.sql).await?;
        let written =
            workload::run(&self.workload(&p, &tag, events, Some(self.args.poll_rate))).await?;
        let consumed = join(consumer, &mut daemon).await?;
        wait_all_sent(&self.sql, &p.table, Duration::from_secs(120)).await?;
        let lsn1 = current_lsn(&self.sql).await?;
        let sample = daemon.sample().unwrap_or_default();
        let mut row = Row::from_live(
            &format!("poll (PostgreSQL) @{} ev/s", self.args.poll_rate),
            &tag,
            &written,
            &consumed,
        );
        row.set_process(sample, sample.cpu_seconds, events);
        row.wal_per_event = Some((lsn1 - lsn0) as f64 / events as f64);
        rows.push(row);
        let code = daemon.terminate(Duration::from_secs(60)).await?;
        anyhow::ensure!(code == 0, "outboxd (poll) exited with {code} on SIGTERM");

        let events = self.args.poll_backlog_events;
        eprintln!("poll mode: {events} events written with outboxd stopped, then drained");
        let tag = format!("{}q", self.run);
        let lsn0 = current_lsn(&self.sql).await?;
        workload::run(&self.workload(&p, &tag, events, None)).await?;
        let consumer = consume::spawn_filtered(
            &self.services.kafka,
            &p.topic,
            self.args.partitions,
            events,
            Duration::from_secs(600),
            &tag,
        );
        let start_us = now_micros();
        let mut daemon = self.spawn(&p, "poll-backlog.log")?;
        let consumed = join(consumer, &mut daemon).await?;
        wait_all_sent(&self.sql, &p.table, Duration::from_secs(300)).await?;
        let lsn1 = current_lsn(&self.sql).await?;
        let sample = daemon.sample().unwrap_or_default();
        let mut row = Row::named("poll (PostgreSQL) backlog drain");
        row.events = events;
        row.duplicates = Some(consumed.duplicates);
        let drained_us = (consumed.last_append_ms() * 1000) as u64;
        row.events_per_s =
            Some(events as f64 / (drained_us.saturating_sub(start_us) as f64 / 1e6).max(1e-3));
        row.set_process(sample, sample.cpu_seconds, events);
        row.wal_per_event = Some((lsn1 - lsn0) as f64 / events as f64);
        row.note = "includes start-up".into();
        rows.push(row);
        let code = daemon.terminate(Duration::from_secs(60)).await?;
        anyhow::ensure!(code == 0, "outboxd (poll) exited with {code} on SIGTERM");
        Ok(rows)
    }
}
