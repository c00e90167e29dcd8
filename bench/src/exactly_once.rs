//! `eos`: exactly-once (`delivery.exactly_once = true`) on the standard workload, next to
//! the at-least-once rows of the same run: the fixed rate (latency to the broker's append,
//! CPU) and a backlog drain of `--backlog-events` rows. The bench's consumer reads with
//! librdkafka's default `isolation.level`, `read_committed`, so a record counts once its
//! Kafka transaction is committed; latency is still measured to the record's append time,
//! so the wait until the commit (up to `delivery.transaction_interval`) is not in it.

use std::time::Duration;

use crate::daemon::Source;
use crate::report::Row;
use crate::workload;
use crate::{current_lsn, Bench};

impl Bench {
    /// The fixed rate and a backlog drain, exactly-once.
    pub(crate) async fn exactly_once(&mut self) -> anyhow::Result<Vec<Row>> {
        let extra = exactly_once_config(&self.args.config_extra.replace("\\n", "\n"));
        let mut rows = Vec::new();

        let p = self
            .pipeline_with("rate_eos", Source::PgLog, &extra)
            .await?;
        let label = format!("log (PostgreSQL) @{} ev/s, exactly-once", self.args.rate);
        let (row, daemon) = self.fixed_rate(&p, &label, "re").await?;
        rows.push(row);
        let code = daemon.terminate(Duration::from_secs(60)).await?;
        anyhow::ensure!(code == 0, "outboxd exited with {code} on SIGTERM");

        let p = self
            .pipeline_with("backlog_eos", Source::PgLog, &extra)
            .await?;
        let events = self.args.backlog_events;
        eprintln!("exactly-once: {events} events written with outboxd stopped, then drained");
        let tag = format!("{}be", self.run);
        let lsn0 = current_lsn(&self.sql).await?;
        workload::run(&self.workload(&p, &tag, events, None)).await?;
        let label = "log (PostgreSQL) backlog drain, exactly-once";
        let (row, daemon) = self.drain(&p, events, events, lsn0, label).await?;
        rows.push(row);
        let code = daemon.terminate(Duration::from_secs(60)).await?;
        anyhow::ensure!(code == 0, "outboxd exited with {code} on SIGTERM");
        Ok(rows)
    }
}

/// `extra` (the `--config-extra` TOML) with `exactly_once = true` in its `[delivery]`
/// section, added when it has none (TOML allows a section once).
pub(crate) fn exactly_once_config(extra: &str) -> String {
    if extra.lines().any(|l| l.trim() == "[delivery]") {
        extra
            .lines()
            .map(|l| match l.trim() {
                "[delivery]" => "[delivery]\nexactly_once = true".to_owned(),
                _ => l.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        format!("{extra}\n[delivery]\nexactly_once = true\n")
    }
}

#[cfg(test)]
mod tests {
    use super::exactly_once_config;

    #[test]
    fn exactly_once_joins_the_delivery_section_or_adds_one() {
        assert_eq!(
            exactly_once_config(""),
            "\n[delivery]\nexactly_once = true\n"
        );
        let joined = exactly_once_config("[delivery]\nmax_in_flight = 5000");
        assert_eq!(
            joined,
            "[delivery]\nexactly_once = true\nmax_in_flight = 5000"
        );
    }
}
