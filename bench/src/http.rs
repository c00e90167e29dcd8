//! The HTTP sink (`[http]` instead of `[kafka]`), against the bench's own receiver on
//! loopback (`http_receiver.rs`, which answers 200 at once), one endpoint:
//!
//! - *backlog drain*: `backlog_events` rows written with outboxd stopped (PostgreSQL, log
//!   mode, at least once), then outboxd started: events/s = rows ÷ (last first arrival at
//!   the receiver − start of the process), start-up included. Beside it the limit: the
//!   bench's keep-alive client sending as many requests of the same size, as many at once
//!   as the endpoint's `concurrency`, to the same receiver.
//! - *@rate*: writers at `http_rate` events/s for `rate_seconds` with outboxd running;
//!   latency = the writer's clock right after the commit → the receiver's on arrival.
//! - *receiver stalled*: writers at `http_stall_rate`; after 5 s the receiver holds every
//!   request unanswered for `http_stall_seconds`, then answers again; the writers stop
//!   5 s later. Everything must arrive, in per-key order, and outboxd's peak RSS stay low.
//! - *poll mode*: `http_poll_backlog_events` rows drained with `outbox.mode = "poll"`.
//!
//! Every row checks what the receiver got: distinct `webhook-id`s against the rows
//! written (nothing lost, nothing unknown), and per-key order.

use std::time::{Duration, Instant};

use crate::http_receiver::{self, Received, Receiver};
use crate::report::Latency;
use crate::*;

/// `[http.endpoints.default]`'s settings.
struct HttpEndpoint<'a> {
    url: &'a str,
    concurrency: usize,
}

impl Bench {
    /// The four HTTP scenarios (those named: `http` is all of them); each failure is a row
    /// saying why, the others go on.
    pub(crate) async fn http_sink(&mut self, report: &mut Report) -> anyhow::Result<()> {
        let receiver = Receiver::start()?;
        let all = self.args.wants("http");
        if all || self.args.wants("http-drain") {
            let rows = self.http_drain(&receiver, report).await;
            report.rows.extend(rows_or_unavailable(
                rows,
                "http drain",
                "http (PostgreSQL) backlog drain",
            ));
        }
        if all || self.args.wants("http-rate") {
            let rows = self.http_rate(&receiver).await.map(|r| vec![r]);
            report.rows.extend(rows_or_unavailable(
                rows,
                "http rate",
                "http (PostgreSQL) @",
            ));
        }
        if all || self.args.wants("http-stall") {
            let rows = self.http_stall(&receiver).await.map(|r| vec![r]);
            report.rows.extend(rows_or_unavailable(
                rows,
                "http stall",
                "http (PostgreSQL) receiver stalled",
            ));
        }
        if all || self.args.wants("http-poll") {
            let rows = self.http_poll(&receiver).await.map(|r| vec![r]);
            report.rows.extend(rows_or_unavailable(
                rows,
                "http poll",
                "http poll (PostgreSQL) backlog drain",
            ));
        }
        Ok(())
    }

    /// Table, config (`[http]`, one endpoint at the receiver) and `init` of one scenario.
    async fn http_pipeline(
        &mut self,
        scenario: &str,
        source: Source,
        endpoint: &HttpEndpoint<'_>,
    ) -> anyhow::Result<BenchPipeline> {
        let name = format!("bench_{}_{scenario}", self.run);
        let table = format!("outbox_{name}");
        let metrics_port = daemon::free_port()?;
        let s = &self.services;
        let mode = match source {
            Source::PgPoll => "mode = \"poll\"\n",
            _ => "",
        };
        let extra = self.args.config_extra.replace("\\n", "\n");
        let text = format!(
            r#"[pipeline]
name = "{name}"

[source]
kind = "postgres"
host = "{host}"
port = {port}
user = "{user}"
password = "{password}"
database = "{database}"
sslmode = "disable"

[outbox]
table = "{table}"
{mode}
[http]

[http.endpoints.default]
url = "{url}"
concurrency = {concurrency}

[metrics]
listen = "127.0.0.1:{metrics_port}"
{extra}
"#,
            host = s.pg_host,
            port = s.pg_port,
            user = s.pg_user,
            password = s.pg_password,
            database = s.pg_database,
            url = endpoint.url,
            concurrency = endpoint.concurrency,
        );
        let config = self.dir.join(format!("{name}.toml"));
        std::fs::write(&config, text)?;
        let p = BenchPipeline {
            name: name.clone(),
            table,
            topic: String::new(),
            config,
            metrics_port,
            source,
        };
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

    /// The endpoint's URL and `concurrency`.
    fn http_endpoint(&self, receiver: &Receiver) -> (String, usize) {
        (receiver.url(), self.args.http_concurrency)
    }

    /// The backlog drain to one endpoint, and the limit beside it.
    async fn http_drain(
        &mut self,
        receiver: &Receiver,
        report: &mut Report,
    ) -> anyhow::Result<Vec<Row>> {
        let (url, concurrency) = self.http_endpoint(receiver);
        let endpoint = HttpEndpoint {
            url: &url,
            concurrency,
        };
        let p = self
            .http_pipeline("http_drain", Source::PgLog, &endpoint)
            .await?;
        let events = self.args.backlog_events;

        eprintln!(
            "http: the limit, {events} requests from the bench's keep-alive client, \
             {concurrency} at a time"
        );
        let limit_tag = format!("{}L", self.run);
        // Warm-up (connections opened, the receiver's allocations made), not counted.
        http_receiver::drive(
            &url,
            (events / 10).min(20_000),
            concurrency,
            self.args.payload_bytes,
            &format!("{}W", self.run),
        )
        .await?;
        let _ = receiver.take();
        let rate = http_receiver::drive(
            &url,
            events,
            concurrency,
            self.args.payload_bytes,
            &limit_tag,
        )
        .await?;
        let (got, _) = receiver.take();
        anyhow::ensure!(
            got.distinct_with(&limit_tag) == events && got.bad == 0,
            "the limit run: the receiver got {} distinct of {events} requests ({} bad)",
            got.distinct_with(&limit_tag),
            got.bad
        );
        report.limits.http_client = Some(rate);
        report.limits.http_concurrency = Some(concurrency);

        eprintln!("http: backlog of {events} events written with outboxd stopped, then drained");
        let tag = format!("{}h", self.run);
        let lsn0 = current_lsn(&self.sql).await?;
        let written = workload::run(&self.workload(&p, &tag, events, None)).await?;
        let start_us = now_micros();
        let servers0 = CpuSnapshot::take();
        let mut daemon = self.spawn(&p, "http-drain.log")?;
        wait_received(
            receiver,
            &tag,
            events,
            &mut daemon,
            Duration::from_secs(600),
        )
        .await?;
        wait_all_sent(&self.sql, &p.table, Duration::from_secs(300)).await?;
        let lsn1 = current_lsn(&self.sql).await?;
        let sample = daemon.sample().unwrap_or_default();
        let (got, _) = receiver.take();
        let mut row = Row::named(&format!(
            "http (PostgreSQL) backlog drain, concurrency {concurrency}"
        ));
        row.events = events;
        row.events_per_s = Some(
            events as f64 / (got.last_at_us().saturating_sub(start_us) as f64 / 1e6).max(1e-3),
        );
        row.set_process(sample, sample.cpu_seconds, events);
        row.servers = Some(CpuSnapshot::take().per_million_since(&servers0, events));
        row.wal_per_event = Some((lsn1 - lsn0) as f64 / events as f64);
        row.is_http_drain = true;
        row.http = Some(verify(&got, &tag, &written));
        row.note = format!("includes start-up; {}", describe(&got, &tag, &written));
        stop(daemon).await?;
        Ok(vec![row])
    }

    /// Commit → receiver latency at a fixed rate.
    async fn http_rate(&mut self, receiver: &Receiver) -> anyhow::Result<Row> {
        let (url, concurrency) = self.http_endpoint(receiver);
        let endpoint = HttpEndpoint {
            url: &url,
            concurrency,
        };
        let p = self
            .http_pipeline("http_rate", Source::PgLog, &endpoint)
            .await?;
        let rate = self.args.http_rate;
        let events = (rate * self.args.rate_seconds) as usize;
        let tag = format!("{}k", self.run);
        eprintln!("http: {rate} events/s for {} s", self.args.rate_seconds);
        let mut daemon = self.spawn(&p, "http-rate.log")?;
        wait_ready(&mut daemon, p.metrics_port, Duration::from_secs(30)).await?;
        let _ = receiver.take();
        let cpu0 = daemon.sample().unwrap_or_default().cpu_seconds;
        let servers0 = CpuSnapshot::take();
        let written = workload::run(&self.workload(&p, &tag, events, Some(rate))).await?;
        wait_received(
            receiver,
            &tag,
            events,
            &mut daemon,
            Duration::from_secs(120),
        )
        .await?;
        wait_all_sent(&self.sql, &p.table, Duration::from_secs(120)).await?;
        let sample = daemon.sample().unwrap_or_default();
        let (got, _) = receiver.take();
        let mut latencies: Vec<f64> = (got.first.iter())
            .filter_map(|a| {
                let commit = written.commit_of(&tag, &a.message_id)?;
                // The writer notes its clock once the commit has returned: a request can
                // arrive before that.
                Some(a.at_us.saturating_sub(commit) as f64 / 1000.0)
            })
            .collect();
        latencies.sort_by(f64::total_cmp);
        let mut row = Row::named(&format!("http (PostgreSQL) @{rate} ev/s"));
        row.events = events;
        let span_us = got.last_at_us().saturating_sub(written.first_commit) as f64;
        row.events_per_s = Some(events as f64 / (span_us / 1e6).max(1e-3));
        row.latency = Latency::from_sorted(&latencies);
        row.set_process(sample, sample.cpu_seconds - cpu0, events);
        row.servers = Some(CpuSnapshot::take().per_million_since(&servers0, events));
        row.http = Some(verify(&got, &tag, &written));
        let offered = events as f64 / written.elapsed.as_secs_f64();
        row.note = format!(
            "writers committed {offered:.0} ev/s; {}",
            describe(&got, &tag, &written)
        );
        stop(daemon).await?;
        Ok(row)
    }

    /// The receiver holds every request for `http_stall_seconds` while writers write.
    async fn http_stall(&mut self, receiver: &Receiver) -> anyhow::Result<Row> {
        let (url, concurrency) = self.http_endpoint(receiver);
        let endpoint = HttpEndpoint {
            url: &url,
            concurrency,
        };
        let p = self
            .http_pipeline("http_stall", Source::PgLog, &endpoint)
            .await?;
        let (lead, tail) = (5.0, 5.0);
        let stall = self.args.http_stall_seconds;
        let rate = self.args.http_stall_rate;
        let events = (rate * (lead + stall + tail)) as usize;
        let tag = format!("{}s", self.run);
        eprintln!(
            "http: {rate} events/s for {} s, the receiver holding every request for {stall} s \
             of them",
            lead + stall + tail
        );
        let mut daemon = self.spawn(&p, "http-stall.log")?;
        wait_ready(&mut daemon, p.metrics_port, Duration::from_secs(30)).await?;
        let _ = receiver.take();
        let workload = self.workload(&p, &tag, events, Some(rate));
        let writers = tokio::spawn(async move { workload::run(&workload).await });
        tokio::time::sleep(Duration::from_secs_f64(lead)).await;
        receiver.stall(true);
        let stalled_at = Instant::now();
        while stalled_at.elapsed() < Duration::from_secs_f64(stall) {
            anyhow::ensure!(
                daemon.is_running(),
                "outboxd exited while the receiver stalled:\n{}",
                daemon.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        receiver.stall(false);
        let answered_again_us = now_micros();
        let written = writers.await.context("writer task")??;
        let received = wait_received(
            receiver,
            &tag,
            events,
            &mut daemon,
            Duration::from_secs(600),
        )
        .await;
        let sample = daemon.sample().unwrap_or_default();
        let (got, held) = receiver.take();
        // Rows held back by the stall have backoffs and a probe to wait for: the table
        // is SUCCESS a little after the receiver has every event.
        let sent = wait_all_sent(&self.sql, &p.table, Duration::from_secs(300)).await;
        let mut row = Row::named(&format!(
            "http (PostgreSQL) receiver stalled {stall:.0} s @{rate} ev/s"
        ));
        row.events = events;
        row.set_process(sample, sample.cpu_seconds, events);
        let mut check = verify(&got, &tag, &written);
        check.all_success = sent.is_ok();
        row.http = Some(check);
        row.duplicates = Some(got.duplicates);
        let after = got.last_at_us().saturating_sub(answered_again_us) as f64 / 1e6;
        // What outboxd said: its circuit breaker opening and closing.
        let log = std::fs::read_to_string(&daemon.log).unwrap_or_default();
        let down = log.matches("is taken for down").count();
        let up = log.matches("the endpoint answers again").count();
        row.note = match (&received, &sent) {
            (Ok(()), Ok(())) => format!(
                "{held} requests held at most; endpoint taken for down {down}×, up again {up}×; \
                 every event in {after:.1} s after the receiver answered again, all rows \
                 SUCCESS; {}",
                describe(&got, &tag, &written)
            ),
            _ => format!(
                "NOT all delivered: {}{}",
                describe(&got, &tag, &written),
                sent.err()
                    .map(|e| format!("; {}", last_line(&format!("{e:#}"))))
                    .unwrap_or_default()
            ),
        };
        stop(daemon).await?;
        Ok(row)
    }

    /// A backlog drained in poll mode.
    async fn http_poll(&mut self, receiver: &Receiver) -> anyhow::Result<Row> {
        let (url, concurrency) = self.http_endpoint(receiver);
        let endpoint = HttpEndpoint {
            url: &url,
            concurrency,
        };
        let p = self
            .http_pipeline("http_poll", Source::PgPoll, &endpoint)
            .await?;
        let events = self.args.http_poll_backlog_events;
        eprintln!("http, poll mode: {events} events written with outboxd stopped, then drained");
        let tag = format!("{}o", self.run);
        let lsn0 = current_lsn(&self.sql).await?;
        let written = workload::run(&self.workload(&p, &tag, events, None)).await?;
        let _ = receiver.take();
        let start_us = now_micros();
        let servers0 = CpuSnapshot::take();
        let mut daemon = self.spawn(&p, "http-poll.log")?;
        wait_received(
            receiver,
            &tag,
            events,
            &mut daemon,
            Duration::from_secs(600),
        )
        .await?;
        wait_all_sent(&self.sql, &p.table, Duration::from_secs(300)).await?;
        let lsn1 = current_lsn(&self.sql).await?;
        let sample = daemon.sample().unwrap_or_default();
        let (got, _) = receiver.take();
        let mut row = Row::named(&format!(
            "http poll (PostgreSQL) backlog drain, concurrency {concurrency}"
        ));
        row.events = events;
        row.events_per_s = Some(
            events as f64 / (got.last_at_us().saturating_sub(start_us) as f64 / 1e6).max(1e-3),
        );
        row.set_process(sample, sample.cpu_seconds, events);
        row.servers = Some(CpuSnapshot::take().per_million_since(&servers0, events));
        row.wal_per_event = Some((lsn1 - lsn0) as f64 / events as f64);
        row.http = Some(verify(&got, &tag, &written));
        row.note = format!(
            "includes start-up; poll.batch_size 500; {}",
            describe(&got, &tag, &written)
        );
        stop(daemon).await?;
        Ok(row)
    }
}

/// What a scenario's receiver got, against what was written.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HttpCheck {
    /// Rows written.
    pub(crate) written: usize,
    /// Of them, distinct ids the receiver got.
    pub(crate) delivered: usize,
    /// Ids the receiver got that were never written (should be 0).
    pub(crate) unknown: usize,
    /// Per-key order violations (first sightings of one key and writer out of commit
    /// order).
    pub(crate) order_violations: usize,
    /// Requests the receiver refused (no `webhook-id`, unreadable body).
    pub(crate) bad: usize,
    /// Every row of the table SUCCESS at the end.
    pub(crate) all_success: bool,
}

impl HttpCheck {
    pub(crate) fn lost(&self) -> usize {
        self.written.saturating_sub(self.delivered)
    }

    pub(crate) fn ok(&self) -> bool {
        self.lost() == 0
            && self.unknown == 0
            && self.order_violations == 0
            && self.bad == 0
            && self.all_success
    }
}

fn verify(got: &Received, tag: &str, written: &Written) -> HttpCheck {
    // The receiver is taken afresh before each scenario: every id it got should be one
    // of the rows written.
    let known = (got.first.iter())
        .filter(|a| written.commit_of(tag, &a.message_id).is_some())
        .count();
    HttpCheck {
        written: written.events,
        delivered: known,
        unknown: got.first.len() - known,
        order_violations: got.order_violations(tag),
        bad: got.bad,
        all_success: true,
    }
}

fn describe(got: &Received, tag: &str, written: &Written) -> String {
    let check = verify(got, tag, written);
    format!(
        "received {} distinct of {} written ({} lost, {} unknown), {} duplicates, \
         {} per-key order violations",
        check.delivered,
        check.written,
        check.lost(),
        check.unknown,
        got.duplicates,
        check.order_violations
    )
}

/// Waits until the receiver has `events` distinct ids of `tag`, while watching outboxd.
async fn wait_received(
    receiver: &Receiver,
    tag: &str,
    events: usize,
    daemon: &mut Daemon,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let got = receiver.distinct_with(tag);
        if got >= events {
            return Ok(());
        }
        anyhow::ensure!(
            daemon.is_running(),
            "outboxd exited with {got} of {events} events received:\n{}",
            daemon.log_tail()
        );
        anyhow::ensure!(
            Instant::now() < deadline,
            "{got} of {events} events received after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn stop(daemon: Daemon) -> anyhow::Result<()> {
    let code = daemon.terminate(Duration::from_secs(60)).await?;
    anyhow::ensure!(code == 0, "outboxd exited with {code} on SIGTERM");
    Ok(())
}
