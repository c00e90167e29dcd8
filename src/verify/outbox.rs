//! The relay check of `verify`: write the plan's transactions, read the sink back, wait
//! for the rows, check, clean up, report (see the module above). Whatever happens once
//! the first row is written (an error, a relay that exits, Ctrl-C), the run's rows are
//! deleted and the child stopped before verify returns.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use outboxd_connector::{
    ColumnNames, Connector, OutboxStore, OwnRowState, OwnRowsToDelete, RowLifecycle, TransactionEnd,
};
use rand::Rng;

use super::arrivals::Arrivals;
use super::check::{self, Outcome, Promise, WrittenEvent};
use super::plan::{id_prefix, new_run_id, Plan, PlanSettings};
use super::progress::Progress;
use super::relay_child::RelayChild;
use super::report::{Report, RunFacts, Transactions};
use super::{http_receiver, kafka_reader, Interrupt, VerifyOptions, ROWS_PER_STATEMENT};
use crate::config::{Config, Ordering as KeyOrdering};

/// Transient write errors in a row for this long end the run (the database is away).
const GIVE_UP_WRITING_AFTER: Duration = Duration::from_secs(30);

/// The reader of the configured sink: it stops when dropped.
enum Reader {
    Kafka(#[allow(dead_code, reason = "held: it stops when dropped")] kafka_reader::KafkaReader),
    Http(#[allow(dead_code, reason = "held: it stops when dropped")] http_receiver::HttpReceiver),
}

/// Runs the relay check; returns the exit code.
pub(super) async fn run<C: Connector>(
    config: &Config,
    connector: &C,
    options: &VerifyOptions,
) -> anyhow::Result<i32> {
    check_config(config, options)?;
    let promise = Promise {
        exactly_once: config.delivery.exactly_once,
        strict_order: config.pipeline.ordering == KeyOrdering::Strict,
        rows_kept: config.outbox.rows() == RowLifecycle::Kept,
        sink_positions: config.sends_to_kafka(),
    };
    let seed = options.seed.unwrap_or_else(|| rand::thread_rng().gen());
    let run = new_run_id();
    let mut plan = Plan::new(
        PlanSettings {
            message_type: options.message_type.clone(),
            topic: options.topic.clone(),
            keys: options.keys,
            max_batch: options.max_batch,
            rollback_percent: options.rollback_percent,
            seed,
        },
        run.clone(),
    );
    let prefix = id_prefix(&run);
    let store = (connector.open_store().await).context("verify cannot open the outbox")?;
    let arrivals = Arc::new(Arrivals::default());
    let (reader, topic_created) = start_reader(config, options, &run, &prefix, &arrivals).await?;
    let interrupt = Interrupt::listen()?;
    let mut relay = match options.spawn {
        true => {
            let log = std::env::temp_dir().join(format!("outboxd-verify-{run}.log"));
            Some(RelayChild::start(&options.config_path, log).map_err(|e| anyhow!(e))?)
        }
        false => None,
    };
    let progress = Progress::new(options.json);
    let started = Instant::now();

    // From here on the run's rows exist: every path goes through the clean-up below.
    let mut written = Vec::new();
    let mut transactions = Transactions::default();
    let mut run_ctx = RunContext {
        options,
        relay: relay.as_mut(),
        arrivals: &arrivals,
        progress: &progress,
        interrupt: &interrupt,
        relay_died: None,
    };
    let wrote = write(
        &store,
        &mut plan,
        &mut run_ctx,
        &mut written,
        &mut transactions,
    )
    .await;
    let wrote_for = started.elapsed();
    let rows = match &wrote {
        Ok(()) => drain(&store, &written, &mut run_ctx, promise).await,
        Err(_) => Ok(HashMap::new()),
    };
    let drained_for = started.elapsed().saturating_sub(wrote_for);
    let relay_died = run_ctx.relay_died.take();
    let relay_log = relay.as_ref().map(|r| r.log().to_owned());
    let kills = relay.as_ref().map_or(0, |r| r.kills);
    if let Some(relay) = relay.as_mut() {
        relay.stop().await;
    }
    drop(reader);
    progress.finish();
    let cleanup = cleanup(config, options, &store, &written, &run, topic_created).await;
    if wrote.is_err() || rows.is_err() {
        // The error is printed by the caller; what was cleaned up (or is left) only here.
        eprintln!("verify: {cleanup}");
    }
    wrote?;
    let rows = rows?;
    if let Some(reason) = reader_error(&arrivals) {
        bail!(reason);
    }

    let mut findings = check::check(&written, &arrivals.copies(), &rows, promise);
    let bad_signatures = arrivals.bad_signatures();
    if bad_signatures > 0 {
        findings.failures.push(format!(
            "{bad_signatures} request(s) refused: missing or wrong webhook signature"
        ));
    }
    if findings.delivered == 0 && findings.events_committed > 0 && !options.spawn {
        findings.failures.push(
            "nothing arrived: is `outboxd run` running with this config? (or let verify run \
             it: --spawn)"
                .into(),
        );
    }
    if let Some(died) = relay_died {
        findings.failures.push(died);
    }
    if interrupt.is_set() {
        findings
            .failures
            .push("interrupted (Ctrl-C or SIGTERM): the run is incomplete".into());
    }
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
    Ok(super::print_report(
        options.json,
        &report,
        &report.text(),
        report.passed,
    ))
}

/// The reader's fatal error (it cannot read the run's topic at all), if any: a set-up to
/// fix, not a pipeline that lost everything.
fn reader_error(arrivals: &Arrivals) -> Option<String> {
    arrivals.reader_error()
}

/// What makes a relay check impossible with this config, found before anything is written.
fn check_config(config: &Config, options: &VerifyOptions) -> anyhow::Result<()> {
    if !config.relays_outbox() {
        bail!(
            "this config runs no outbox relay ([outbox] with [kafka] or [http]): verify \
             checks the relay's delivery (--inbox checks the inbox)"
        );
    }
    if config.outbox.layout().columns != ColumnNames::default() {
        bail!(
            "verify writes the columns of outboxd's own outbox table (schemas/*/outbox.sql), \
             its topic column among them; with outbox.columns or the Debezium layout it \
             cannot route its events to a topic of their own"
        );
    }
    if let Some(why) = config.own_route_refusal(&options.topic) {
        bail!("--topic `{}`: {why}", options.topic);
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
        return Ok((Reader::Http(receiver), false));
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
    Ok((Reader::Kafka(reader), created))
}

/// What the writing and waiting share.
struct RunContext<'a> {
    options: &'a VerifyOptions,
    relay: Option<&'a mut RelayChild>,
    arrivals: &'a Arrivals,
    progress: &'a Progress,
    interrupt: &'a Interrupt,
    /// Why the spawned relay exited by itself while verify waited, if it did.
    relay_died: Option<String>,
}

impl RunContext<'_> {
    /// An error when the spawned relay exited by itself.
    fn relay_alive(&mut self) -> anyhow::Result<()> {
        let Some(relay) = self.relay.as_deref_mut() else {
            return Ok(());
        };
        match relay.exited() {
            Some(status) => bail!(
                "the relay verify started exited by itself ({status}); its log {}:\n{}",
                relay.log().display(),
                relay.log_tail(20)
            ),
            None => Ok(()),
        }
    }
}

/// Writes transactions at the rate for the duration (killing the child meanwhile with
/// `--faults kill`), into `written` as it goes (so the clean-up knows every row, whatever
/// stops the writing).
async fn write<S: OutboxStore>(
    store: &S,
    plan: &mut Plan,
    ctx: &mut RunContext<'_>,
    written: &mut Vec<WrittenEvent>,
    transactions: &mut Transactions,
) -> anyhow::Result<()> {
    let options = ctx.options;
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(options.rate)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let next_kill = |from: Instant| {
        let factor = rand::thread_rng().gen_range(0.5..1.5);
        from + options.kill_every.mul_f64(factor)
    };
    let mut kill_at = next_kill(started);
    let mut failing_since: Option<Instant> = None;
    while started.elapsed() < options.duration && !ctx.interrupt.is_set() {
        tick.tick().await;
        if ctx.interrupt.is_set() {
            break;
        }
        ctx.relay_alive()?;
        if let Some(relay) = ctx.relay.as_deref_mut() {
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
            Ok(()) | Err(_) if rollback => Outcome::RolledBack,
            Ok(()) => Outcome::Committed,
            Err(e) if e.is_transient() => {
                // The answer was lost: the table tells later whether it committed.
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= GIVE_UP_WRITING_AFTER {
                    // Known to the clean-up first: it may have committed.
                    written.extend(events.into_iter().map(|event| WrittenEvent {
                        event,
                        outcome: Outcome::Unknown,
                        committed_at: None,
                    }));
                    bail!("verify cannot write into the outbox for 30 s: {e}");
                }
                Outcome::Unknown
            }
            Err(e) => bail!(
                "verify cannot write into the outbox: {e} (the role of the config needs INSERT \
                 on the outbox table, as `[canary]` does: see docs/verify.md)"
            ),
        };
        if outcome != Outcome::Unknown {
            failing_since = None;
        }
        transactions.total += 1;
        transactions.rolled_back += u64::from(outcome == Outcome::RolledBack);
        let committed_at = (outcome != Outcome::RolledBack).then(Instant::now);
        written.extend(events.into_iter().map(|event| WrittenEvent {
            event,
            outcome,
            committed_at,
        }));
        let kills = ctx.relay.as_deref().filter(|_| options.kill_faults);
        ctx.progress.show(|| {
            format!(
                "writing {:.0}/{:.0} s: {} events written, {} arrived{}",
                started.elapsed().as_secs_f64(),
                options.duration.as_secs_f64(),
                written.len(),
                ctx.arrivals.distinct(),
                kills.map_or(String::new(), |r| format!(
                    ", relay killed {} time(s)",
                    r.kills
                ))
            )
        });
    }
    Ok(())
}

/// Waits until every committed event (an unknown commit whose row exists included)
/// arrived and, with rows kept, its row shows SUCCESS (with Kafka: at the position of a
/// copy that arrived), or the drain timeout; returns the rows as they are then.
async fn drain<S: OutboxStore>(
    store: &S,
    written: &[WrittenEvent],
    ctx: &mut RunContext<'_>,
    promise: Promise,
) -> anyhow::Result<HashMap<String, OwnRowState>> {
    let deadline = Instant::now() + ctx.options.drain_timeout;
    // A commit whose answer was lost took effect if its row exists: wait for it too.
    let unknown: Vec<String> = (written.iter())
        .filter(|w| w.outcome == Outcome::Unknown)
        .map(|w| w.event.message_id.clone())
        .collect();
    let took_effect = read_rows(store, &unknown).await?;
    let expected: Vec<&WrittenEvent> = (written.iter())
        .filter(|w| {
            w.outcome == Outcome::Committed || took_effect.contains_key(&w.event.message_id)
        })
        .collect();
    loop {
        let missing = (expected.iter())
            .filter(|w| !ctx.arrivals.has(w.event.index))
            .count();
        ctx.progress.show(|| {
            format!(
                "waiting for the last events: {missing} of {} not arrived yet",
                expected.len()
            )
        });
        let unreadable = ctx.arrivals.reader_error().is_some();
        if missing == 0 || unreadable || Instant::now() >= deadline || ctx.interrupt.is_set() {
            break;
        }
        if let Err(e) = ctx.relay_alive() {
            ctx.relay_died = Some(format!("{e:#}"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The write-back follows the sink's acknowledgement by a moment, and the consumer
    // may read a copy sent again a moment after its row names it: read the rows again
    // until every delivered one shows SUCCESS at a copy's position, or the deadline.
    let ids: Vec<String> = written.iter().map(|w| w.event.message_id.clone()).collect();
    loop {
        let rows = read_rows(store, &ids).await?;
        // Each event's copies' positions, once a round (not a scan of every copy per event).
        let mut positions: HashMap<u64, Vec<Option<(i32, i64)>>> = HashMap::new();
        for copy in ctx.arrivals.copies() {
            positions.entry(copy.index).or_default().push(copy.position);
        }
        let settled = !promise.rows_kept
            || (expected.iter()).all(|w| {
                let Some(copies) = positions.get(&w.event.index) else {
                    return true; // not arrived: nothing to settle
                };
                rows.get(&w.event.message_id).is_some_and(|row| {
                    row.status == "SUCCESS"
                        && (!promise.sink_positions || copies.contains(&row.position))
                })
            });
        let relay_died = ctx.relay_died.is_some();
        if settled || relay_died || Instant::now() >= deadline || ctx.interrupt.is_set() {
            return Ok(rows);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn read_rows<S: OutboxStore>(
    store: &S,
    ids: &[String],
) -> anyhow::Result<HashMap<String, OwnRowState>> {
    let mut rows = HashMap::with_capacity(ids.len());
    for chunk in ids.chunks(ROWS_PER_STATEMENT) {
        let states = (store.own_rows(chunk).await).context("verify cannot read its rows back")?;
        rows.extend(states.into_iter().map(|s| (s.message_id.clone(), s)));
    }
    Ok(rows)
}

/// Deletes the run's rows (and its topic with `--cleanup-topic`, if verify created it);
/// says what it did.
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
                    done.push(format!(
                        "rows not all deleted ({e}): delete the rows whose message_id starts \
                         with outboxd-verify-{run}-"
                    ));
                    break;
                }
            }
        }
        done.push(format!("{deleted} rows deleted"));
    }
    let topic = &options.topic;
    match (
        config.sends_to_kafka(),
        topic_created,
        options.cleanup_topic,
    ) {
        (true, true, true) => match kafka_reader::delete_topic(&config.kafka, topic).await {
            Ok(()) => done.push(format!("topic {topic} deleted")),
            Err(e) => done.push(e),
        },
        (true, true, false) => done.push(format!(
            "topic {topic} created (--cleanup-topic deletes it)"
        )),
        (true, false, true) => done.push(format!(
            "topic {topic} kept: verify did not create it, so --cleanup-topic leaves it"
        )),
        _ => {}
    }
    done.join("; ")
}
