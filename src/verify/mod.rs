//! `outboxd verify`: an end-to-end check of the configured pipeline, run by an operator
//! against the real database and sink before going live (or at any time, without faults).
//!
//! It writes marked synthetic events into the configured outbox as an application would
//! (several keys, several events per key, transactions of one to a few rows, some rolled
//! back), at a given rate for a given time, through the relay that is already running or
//! (`--spawn`) one it runs as its child, which `--faults kill` kills with SIGKILL at
//! random moments and starts again. It reads the sink back itself: a `read_committed`
//! Kafka consumer of the run's own topic, or with `[http]` a receiver on the address of
//! the run's own endpoint. Then it checks ([`check`]) that every committed event arrived,
//! no rolled-back one did, duplicates are within the delivery mode's promise, each key's
//! events arrived in commit order, and the rows show SUCCESS at the position the sink
//! holds; and it reports commit → arrival latency. Exit code 0 only when all of that
//! holds. It deletes its own rows at the end (by their message ids: never a row it did
//! not write), and its topic with `--cleanup-topic`.
//!
//! With `--inbox --spawn` it checks the other half instead ([`inbox`]): signed messages
//! posted to the HTTP ingress, redelivered, each stored once and handled once in order.
//!
//! The modules: [`plan`] (what to write), [`check`] (the checks, pure), [`arrivals`]
//! (what came back), [`kafka_reader`] and [`http_receiver`] (one per sink),
//! [`relay_child`] (`--spawn`), [`report`] (text and JSON), [`inbox`] (`--inbox`).

mod arrivals;
mod check;
mod http_receiver;
mod inbox;
mod kafka_reader;
mod plan;
mod relay_child;
mod report;

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use outboxd_connector::{Connector, OutboxStore, OwnRowsToDelete, RowLifecycle, TransactionEnd};
use rand::Rng;

use self::arrivals::Arrivals;
use self::check::{Outcome, Promise, WrittenEvent};
use self::plan::{id_prefix, Plan, PlanSettings};
use self::relay_child::RelayChild;
use self::report::{Report, RunFacts};
use crate::config::{Config, Ordering as KeyOrdering};

/// Rows read back or deleted per statement.
const ROWS_PER_STATEMENT: usize = 500;

/// What `verify` is to do, from the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyOptions {
    /// The config file, for the relay `--spawn` runs.
    pub config_path: PathBuf,
    /// How long to write.
    pub duration: Duration,
    /// Transactions per second.
    pub rate: u32,
    /// Distinct business keys.
    pub keys: u32,
    /// At most this many events per transaction.
    pub max_batch: u32,
    /// Percentage of transactions rolled back.
    pub rollback_percent: u32,
    /// The events' message type prefix.
    pub message_type: String,
    /// The run's Kafka topic, or with `[http]` its endpoint.
    pub topic: String,
    /// Run the relay as a child.
    pub spawn: bool,
    /// Kill the child with SIGKILL at random moments (needs `spawn`).
    pub kill_faults: bool,
    /// Mean time between kills.
    pub kill_every: Duration,
    /// How long to wait, after the last write, for everything to arrive.
    pub drain_timeout: Duration,
    /// Delete the run's Kafka topic at the end.
    pub cleanup_topic: bool,
    /// Leave the run's rows in the outbox (to look into a failed run).
    pub keep_rows: bool,
    /// Repeat a run's choices.
    pub seed: Option<u64>,
    /// Print JSON instead of text.
    pub json: bool,
    /// Check the inbox instead of the outbox relay (`--inbox`, with `spawn`).
    pub inbox: bool,
    /// `--inbox`: the HTTP source verify posts as (added to the child's config).
    pub source: String,
}

/// The reader of the configured sink (a [`kafka_reader::KafkaReader`] or an
/// [`http_receiver::HttpReceiver`]): it stops when dropped.
type Reader = Box<dyn Send>;

/// Runs `verify`; returns the exit code (0: passed, 1: failed).
pub(crate) async fn run<C: Connector>(
    config: &Config,
    connector: &C,
    options: &VerifyOptions,
) -> anyhow::Result<i32> {
    if options.inbox {
        return inbox::run(config, connector, options).await;
    }
    check_options(config, options)?;
    let promise = Promise {
        exactly_once: config.delivery.exactly_once,
        strict_order: config.pipeline.ordering == KeyOrdering::Strict,
        rows_kept: config.outbox.rows() == RowLifecycle::Kept,
        sink_positions: config.sends_to_kafka(),
    };
    let seed = options.seed.unwrap_or_else(|| rand::thread_rng().gen());
    let mut plan = Plan::new(PlanSettings {
        message_type: options.message_type.clone(),
        topic: options.topic.clone(),
        keys: options.keys,
        max_batch: options.max_batch,
        rollback_percent: options.rollback_percent,
        seed,
    });
    let run = plan.run().to_owned();
    let prefix = id_prefix(&run);
    let store = connector
        .open_store()
        .await
        .context("verify cannot open the outbox")?;

    let arrivals = Arc::new(Arrivals::default());
    let (reader, topic_created) = start_reader(config, options, &run, &prefix, &arrivals).await?;
    let mut relay = match options.spawn {
        true => {
            let log = std::env::temp_dir().join(format!("outboxd-verify-{run}.log"));
            Some(RelayChild::start(&options.config_path, log).map_err(|e| anyhow!(e))?)
        }
        false => None,
    };
    let progress = Progress::new(options.json);
    let started = Instant::now();

    let written = write(
        &store,
        &mut plan,
        options,
        relay.as_mut(),
        &arrivals,
        &progress,
    )
    .await;
    let Written {
        events: written,
        transactions,
    } = match written {
        Ok(written) => written,
        Err(e) => {
            if let Some(relay) = relay.as_mut() {
                relay.stop().await;
            }
            return Err(e);
        }
    };
    let wrote_for = started.elapsed();
    let rows = drain(
        &store,
        &written,
        options,
        relay.as_mut(),
        &arrivals,
        &progress,
        promise,
    )
    .await;
    let drained_for = started.elapsed() - wrote_for;
    let relay_log = relay.as_ref().map(|r| r.log().to_owned());
    let kills = relay.as_ref().map_or(0, |r| r.kills);
    if let Some(relay) = relay.as_mut() {
        relay.stop().await;
    }
    drop(reader);
    progress.finish();
    let rows = rows?;

    let mut findings = check::check(&written, &arrivals.copies(), &rows, promise);
    let bad_signatures = arrivals.bad_signatures();
    if bad_signatures > 0 {
        findings.failures.push(format!(
            "{bad_signatures} request(s) refused: missing or wrong webhook signature"
        ));
    }
    let cleanup = cleanup(config, options, &store, &written, &run, topic_created).await;
    let report = Report::new(
        RunFacts {
            run,
            seed,
            pipeline: config.pipeline.name.clone(),
            source: config.source.engine.kind().to_owned(),
            sink: if config.sends_to_kafka() {
                "kafka"
            } else {
                "http"
            }
            .to_owned(),
            topic: options.topic.clone(),
            relay: match (options.spawn, options.kill_faults) {
                (false, _) => "already running".to_owned(),
                (true, false) => "spawned".to_owned(),
                (true, true) => format!("spawned, killed {kills} time(s) with SIGKILL"),
            },
            relay_log,
            transactions,
            wrote_seconds: check::seconds(wrote_for),
            drained_seconds: check::seconds(drained_for),
            bad_signatures,
            cleanup,
        },
        promise,
        findings,
    );
    if options.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.text());
    }
    Ok(if report.passed { 0 } else { 1 })
}

/// What makes a run impossible, found before anything is written.
fn check_options(config: &Config, options: &VerifyOptions) -> anyhow::Result<()> {
    if !config.relays_outbox() {
        bail!(
            "this config runs no outbox relay ([outbox] with [kafka] or [http]): verify \
             checks the relay's delivery"
        );
    }
    if config.outbox.layout().columns.topic.is_none() {
        bail!(
            "verify routes its events to their own topic (or endpoint) through the outbox's \
             topic column, which this layout has none of (outbox.columns)"
        );
    }
    if let Some(why) = config.own_route_refusal(&options.topic) {
        bail!("--topic `{}`: {why}", options.topic);
    }
    if !(1..=10_000).contains(&options.rate) {
        bail!("--rate must be between 1 and 10000 transactions a second");
    }
    if options.keys == 0 || options.max_batch == 0 || options.rollback_percent > 90 {
        bail!("--keys and --max-batch must be at least 1, --rollback-percent at most 90");
    }
    if options.duration.is_zero() {
        bail!("--duration must be more than 0s");
    }
    Ok(())
}

async fn start_reader(
    config: &Config,
    options: &VerifyOptions,
    run: &str,
    prefix: &str,
    arrivals: &Arc<Arrivals>,
) -> anyhow::Result<(Reader, bool)> {
    if let Some(http) = &config.http {
        let endpoint = (http.endpoints.get(&options.topic))
            .ok_or_else(|| anyhow!("--topic `{}` is not an endpoint", options.topic))?;
        let address = http_receiver::listen_address(&endpoint.url).map_err(|e| anyhow!(e))?;
        let secrets = (endpoint.secrets.iter())
            .map(|s| crate::webhooks::signature::Secret::parse(s.expose()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow!("the endpoint's secrets: {e}"))?;
        let receiver =
            http_receiver::HttpReceiver::start(address, secrets, prefix.into(), arrivals.clone())
                .await
                .map_err(|e| anyhow!(e))?;
        return Ok((Box::new(receiver), false));
    }
    let created = kafka_reader::ensure_topic(&config.kafka, &options.topic)
        .await
        .map_err(|e| anyhow!(e))?;
    let reader = kafka_reader::KafkaReader::start(
        &config.kafka,
        run,
        &options.topic,
        prefix.into(),
        arrivals.clone(),
    )
    .await
    .map_err(|e| anyhow!(e))?;
    Ok((Box::new(reader), created))
}

/// What [`write`] wrote.
struct Written {
    /// Every event, with how its transaction ended.
    events: Vec<WrittenEvent>,
    /// Transactions written, and of them rolled back.
    transactions: (u64, u64),
}

/// Writes transactions at the rate for the duration (killing the child meanwhile with
/// `--faults kill`).
async fn write<S: OutboxStore>(
    store: &S,
    plan: &mut Plan,
    options: &VerifyOptions,
    mut relay: Option<&mut RelayChild>,
    arrivals: &Arrivals,
    progress: &Progress,
) -> anyhow::Result<Written> {
    let started = Instant::now();
    let mut transactions = (0, 0);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(options.rate)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let next_kill = |from: Instant| {
        let factor = rand::thread_rng().gen_range(0.5..1.5);
        from + options.kill_every.mul_f64(factor)
    };
    let mut kill_at = next_kill(started);
    let mut written: Vec<WrittenEvent> = Vec::new();
    let mut unknown_streak = 0;
    while started.elapsed() < options.duration {
        tick.tick().await;
        if let Some(relay) = relay.as_deref_mut() {
            if let Some(status) = relay.exited() {
                bail!(
                    "the relay verify started exited by itself ({status}); its log {}:\n{}",
                    relay.log().display(),
                    relay.log_tail(20)
                );
            }
            if options.kill_faults && Instant::now() >= kill_at {
                relay.kill_and_restart().await.map_err(|e| anyhow!(e))?;
                kill_at = next_kill(Instant::now());
            }
        }
        let (rows, events, rollback) = plan.next_transaction();
        let end = match rollback {
            true => TransactionEnd::Rollback,
            false => TransactionEnd::Commit,
        };
        let outcome = match store.insert_rows(&rows, end).await {
            Ok(()) if rollback => Outcome::RolledBack,
            Ok(()) => Outcome::Committed,
            Err(e) if e.is_transient() => {
                // The answer was lost: the table tells at the end whether it committed.
                unknown_streak += 1;
                if unknown_streak >= 20 {
                    bail!("verify cannot write into the outbox: {e}");
                }
                Outcome::Unknown
            }
            Err(e) => bail!(
                "verify cannot write into the outbox: {e} (the role of the config needs INSERT \
                 on the outbox table, as `[canary]` does: see docs/verify.md)"
            ),
        };
        if outcome != Outcome::Unknown {
            unknown_streak = 0;
        }
        transactions.0 += 1;
        transactions.1 += u64::from(outcome == Outcome::RolledBack);
        let committed_at = (outcome != Outcome::RolledBack).then(Instant::now);
        written.extend(events.into_iter().map(|event| WrittenEvent {
            event,
            outcome,
            committed_at,
        }));
        progress.show(|| {
            format!(
                "writing {:.0}/{:.0} s: {} events written, {} arrived{}",
                started.elapsed().as_secs_f64(),
                options.duration.as_secs_f64(),
                written.len(),
                arrivals.distinct(),
                relay.as_deref().filter(|_| options.kill_faults).map_or(
                    String::new(),
                    |r| format!(", relay killed {} time(s)", r.kills)
                )
            )
        });
    }
    Ok(Written {
        events: written,
        transactions,
    })
}

/// Waits until every committed event arrived and (rows kept) its row shows SUCCESS, or
/// the drain timeout; returns the rows as they are then.
async fn drain<S: OutboxStore>(
    store: &S,
    written: &[WrittenEvent],
    options: &VerifyOptions,
    mut relay: Option<&mut RelayChild>,
    arrivals: &Arrivals,
    progress: &Progress,
    promise: Promise,
) -> anyhow::Result<HashMap<String, outboxd_connector::OwnRowState>> {
    let deadline = Instant::now() + options.drain_timeout;
    let expected: Vec<&WrittenEvent> = written
        .iter()
        .filter(|w| w.outcome == Outcome::Committed)
        .collect();
    loop {
        let missing = expected
            .iter()
            .filter(|w| !arrivals.has(w.event.index))
            .count();
        progress.show(|| {
            format!(
                "waiting for the last events: {missing} of {} not arrived yet",
                expected.len()
            )
        });
        if missing == 0 || Instant::now() >= deadline {
            break;
        }
        if let Some(relay) = relay.as_deref_mut() {
            if let Some(status) = relay.exited() {
                tracing::warn!(%status, log = %relay.log().display(), "the relay verify started exited by itself");
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The write-back follows the sink's acknowledgement by a moment: read the rows again
    // until every delivered one shows SUCCESS, or the deadline.
    let ids: Vec<String> = written.iter().map(|w| w.event.message_id.clone()).collect();
    loop {
        let rows = read_rows(store, &ids).await?;
        let settled = !promise.rows_kept
            || expected
                .iter()
                .filter(|w| arrivals.has(w.event.index))
                .all(|w| {
                    rows.get(&w.event.message_id)
                        .is_some_and(|r| r.status == "SUCCESS")
                });
        if settled || Instant::now() >= deadline {
            return Ok(rows);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn read_rows<S: OutboxStore>(
    store: &S,
    ids: &[String],
) -> anyhow::Result<HashMap<String, outboxd_connector::OwnRowState>> {
    let mut rows = HashMap::with_capacity(ids.len());
    for chunk in ids.chunks(ROWS_PER_STATEMENT) {
        let states = (store.own_rows(chunk).await).context("verify cannot read its rows back")?;
        rows.extend(states.into_iter().map(|s| (s.message_id.clone(), s)));
    }
    Ok(rows)
}

/// Deletes the run's rows (and topic with `--cleanup-topic`); says what it did.
async fn cleanup<S: OutboxStore>(
    config: &Config,
    options: &VerifyOptions,
    store: &S,
    written: &[WrittenEvent],
    run: &str,
    topic_created: bool,
) -> String {
    let mut done = Vec::new();
    if options.keep_rows {
        done.push(format!("rows kept (message ids outboxd-verify-{run}-*)"));
    } else {
        let ids: Vec<String> = (written.iter())
            .filter(|w| w.outcome != Outcome::RolledBack)
            .map(|w| w.event.message_id.clone())
            .collect();
        let mut deleted = 0;
        for chunk in ids.chunks(ROWS_PER_STATEMENT) {
            match store.delete_own_rows(chunk, OwnRowsToDelete::All).await {
                Ok(n) => deleted += n,
                Err(e) => {
                    done.push(format!("rows not all deleted: {e}"));
                    break;
                }
            }
        }
        done.push(format!("{deleted} rows deleted"));
    }
    if options.cleanup_topic && config.sends_to_kafka() {
        match kafka_reader::delete_topic(&config.kafka, &options.topic).await {
            Ok(()) => done.push(format!("topic {} deleted", options.topic)),
            Err(e) => done.push(e),
        }
    } else if topic_created {
        done.push(format!(
            "topic {} created (--cleanup-topic deletes it)",
            options.topic
        ));
    }
    done.join("; ")
}

/// One progress line on stderr: rewritten in place on a terminal, every 5 s otherwise;
/// none with `--json`.
struct Progress {
    terminal: bool,
    quiet: bool,
    last: std::sync::Mutex<Option<Instant>>,
}

impl Progress {
    fn new(quiet: bool) -> Self {
        Self {
            terminal: std::io::stderr().is_terminal(),
            quiet,
            last: std::sync::Mutex::new(None),
        }
    }

    fn show(&self, line: impl FnOnce() -> String) {
        if self.quiet {
            return;
        }
        let every = if self.terminal {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(5)
        };
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.is_some_and(|at| at.elapsed() < every) {
            return;
        }
        *last = Some(Instant::now());
        if self.terminal {
            eprint!("\r\x1b[2K{}", line());
        } else {
            eprintln!("verify: {}", line());
        }
    }

    fn finish(&self) {
        if self.terminal && !self.quiet {
            eprint!("\r\x1b[2K");
        }
    }
}
