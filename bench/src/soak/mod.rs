//! `soak`: faults at random for `--minutes`, on four relays and an inbox at once.
//!
//! Four pipelines relay at `--soak-rate` events/s each: PostgreSQL and MariaDB, each at
//! least once and with `delivery.exactly_once = true`. An inbox on PostgreSQL receives the
//! first one's topic. Every outboxd reaches its database and Kafka through Toxiproxy (a
//! proxy per database, and the broker's PROXIED listener); the writers and the bench's own
//! reader go straight to the servers. Each writer owns its keys and commits one
//! transaction at a time, learning, after an error, whether it went in (the outbox is the
//! record of what was written), so each key's events are committed in the order of their
//! `message_id`s: `<tag>-<writer>-<transaction>-<row>`.
//!
//! One fault at a time, chosen at random, then a pause of a few seconds:
//! - `kill -9` of one outboxd (a relay or the inbox), started again at once;
//! - the broker frozen (SIGSTOP, then SIGCONT);
//! - PostgreSQL restarted (`pg_ctl restart -m fast`) or MariaDB (`scripts/services stop`,
//!   then `start`);
//! - PostgreSQL's, MariaDB's or Kafka's proxy black-holed (a `timeout` toxic both ways:
//!   every byte dropped, nothing closed).
//!
//! Freezes and black holes last `--fault-min-seconds` to `--fault-max-seconds`; a restart
//! lasts as long as it takes. After a fault ends, a relay streams again when Kafka holds a
//! record of a transaction its writers began after the end (in log mode that also means
//! everything before it was read); the inbox, when it has handled everything its topic
//! held at the end. The goal is within 2 × the fault's length + 5 s; past the fault's
//! length + `--recovery-budget` it is a wedge; past the length + `--stuck-limit` it is
//! stuck, and that outboxd is killed and started again so the soak goes on.
//!
//! At the end the writers stop, the relays drain, and the counts are taken: events written
//! (rows in each outbox), delivered, lost, duplicates (each counted against the last fault
//! that touched its pipeline before it was seen), per-key order violations (a record seen
//! for the first time after a later one of its key), and the inbox's rows. Kafka is read
//! with `read_committed`: an exactly-once pipeline's aborted records are not counted.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rand::Rng;
use rdkafka::message::Message;
use serde_json::{json, Value};

use crate::daemon::{self, BenchPipeline, Daemon, Services, Source};
use crate::exactly_once::exactly_once_config;
use crate::toxiproxy::{Proxy, Toxic, Toxiproxy};
use crate::workload::{self, Workload, Writer};
use crate::{consume, faults, wait_ready, Bench};

/// Writers per relay; each owns [`KEYS_PER_WRITER`] keys.
const WRITERS: usize = 2;
const KEYS_PER_WRITER: usize = 50;
/// Rows per transaction (the writer's keys in turn).
const TX_ROWS: usize = 5;
/// How long a writer waits for one statement before it counts as failed.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(15);
/// The pause between two faults, seconds (at random in this range).
const PAUSE: (f64, f64) = (2.0, 8.0);
/// The inbox's own timeouts for a killed process, shortened from the defaults (a claim
/// 2 min, the consumer group's session 45 s): its claims hold their keys (a key's next
/// message waits for the one before), and the group hands the partitions to the new
/// process only once the old member's session expired. With the defaults a `kill -9` of
/// the inbox stops it for two minutes by design; the soak looks for what is not by design.
const INBOX_TIMEOUTS: (&str, &str) = (
    "claim_timeout = \"10s\"",
    "[inbox.kafka.options]\n\"session.timeout.ms\" = \"10000\"",
);
/// Between faults, how soon every relay must stream what is written from then on.
const STEADY: Duration = Duration::from_secs(5);
/// How long the bench's reader may read nothing before it is made anew (four relays write
/// 400 events/s: silence is a fault's, or a stuck consumer's).
const READER_SILENCE: Duration = Duration::from_secs(3);
/// At the end: how long the relays and the inbox may take to deliver what was written.
const DRAIN: Duration = Duration::from_secs(300);

mod pipelines;
mod report;
mod traffic;
mod watch;

use pipelines::*;
pub(crate) use report::SoakReport;
use report::*;
use traffic::*;

impl Bench {
    pub(crate) async fn soak(&mut self) -> anyhow::Result<SoakReport> {
        let args = self.args.clone();
        let deadline = Instant::now() + Duration::from_secs_f64(args.minutes * 60.0);
        let kafka_pid = daemon::kafka_pid().context(
            "the broker's pid file (scripts/services start kafka) is needed to freeze it",
        )?;
        std::env::var("OUTBOXD_TEST_PG_DATA").context(
            "OUTBOXD_TEST_PG_DATA (from `scripts/services env`) names the cluster to restart",
        )?;
        let toxiproxy = Toxiproxy {
            api: crate::env_or("OUTBOXD_TEST_TOXIPROXY", "127.0.0.1:28474"),
        };
        std::net::TcpStream::connect(&toxiproxy.api).with_context(|| {
            format!(
                "Toxiproxy's API at {} (scripts/services start toxiproxy)",
                toxiproxy.api
            )
        })?;
        // outboxd's way to the servers: a proxy for each.
        let s = self.services.clone();
        let pg_proxy = toxiproxy.proxy("soak_pg", &format!("{}:{}", s.pg_host, s.pg_port));
        let my_proxy = toxiproxy.proxy(
            "soak_mariadb",
            &format!("{}:{}", s.mysql_host, s.mysql_port),
        );
        let kafka_listen = crate::env_or("OUTBOXD_TEST_KAFKA_PROXIED", "127.0.0.1:29096");
        let kafka_proxy = toxiproxy.proxy_at(
            "outboxd_test_kafka",
            &kafka_listen,
            &crate::env_or("OUTBOXD_TEST_KAFKA_PROXIED_UPSTREAM", "127.0.0.1:29095"),
        );
        let via = Services {
            pg_port: pg_proxy.port,
            mysql_port: my_proxy.port,
            kafka: kafka_listen,
            ..s.clone()
        };

        let extra = args.config_extra.replace("\\n", "\n");
        let mut relays = Vec::new();
        for (i, (source, exactly_once)) in [
            (Source::PgLog, false),
            (Source::Mysql, false),
            (Source::PgLog, true),
            (Source::Mysql, true),
        ]
        .into_iter()
        .enumerate()
        {
            let config = match exactly_once {
                true => exactly_once_config(&extra),
                false => extra.clone(),
            };
            let p = self
                .pipeline_via(&format!("soak{i}"), source, &config, &via)
                .await?;
            relays.push(Relay {
                label: format!(
                    "{}, {}",
                    if source == Source::Mysql {
                        "MariaDB"
                    } else {
                        "PostgreSQL"
                    },
                    if exactly_once {
                        "exactly-once"
                    } else {
                        "at least once"
                    }
                ),
                exactly_once,
                p,
                tag: format!("{}s{i}", self.run),
                progress: Arc::new(Progress::new()),
            });
        }
        let inbox_run = self
            .inbox_on("soak_inbox", &relays[0].p.topic, &via, INBOX_TIMEOUTS)
            .await?;
        let inbox_table = format!("inbox_{}", inbox_run.name);
        let result = self
            .soak_run(
                &args,
                deadline,
                kafka_pid,
                &relays,
                &inbox_run,
                &inbox_table,
                [&pg_proxy, &my_proxy, &kafka_proxy],
            )
            .await;
        // Whatever happened, the servers run again for whoever comes next.
        for service in ["postgres", "mariadb"] {
            if let Err(e) = services(&args.services_script, "start", service).await {
                eprintln!("soak: {e:#}");
            }
        }
        if let Ok(sql) = workload::connect(&self.services.conn_string()).await {
            self.sql = sql;
        }
        self.drop_inbox_tables(&inbox_run.name).await;
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn soak_run(
        &mut self,
        args: &crate::Args,
        deadline: Instant,
        kafka_pid: u32,
        relays: &[Relay],
        inbox_run: &crate::inbox::InboxRun,
        inbox_table: &str,
        [pg_proxy, my_proxy, kafka_proxy]: [&Proxy; 3],
    ) -> anyhow::Result<SoakReport> {
        let started = Instant::now();
        let bin = args.outboxd.clone();
        let dir = self.dir.clone();
        let inbox = relays.len();
        let mut procs: Vec<Proc> = relays
            .iter()
            .map(|r| Proc {
                name: r.p.name.clone(),
                config: r.p.config.clone(),
                port: r.p.metrics_port,
                daemon: None,
                starts: 0,
                exits: 0,
                kills: 0,
            })
            .collect();
        procs.push(Proc {
            name: inbox_run.name.clone(),
            config: inbox_run.config.clone(),
            port: inbox_run.port,
            daemon: None,
            starts: 0,
            exits: 0,
            kills: 0,
        });
        for proc in &mut procs {
            proc.start(&bin, &dir)?;
        }
        for proc in &mut procs {
            let d = proc.daemon.as_mut().context("started")?;
            wait_ready(d, proc.port, Duration::from_secs(60)).await?;
        }

        // The reader, then the writers.
        let stop_reading = Arc::new(AtomicBool::new(false));
        let reader = {
            let kafka = self.services.kafka.clone();
            let group = format!("bench-soak-{}", self.run);
            let topics: Vec<String> = relays.iter().map(|r| r.p.topic.clone()).collect();
            let watched: Vec<(String, Arc<Progress>)> = relays
                .iter()
                .map(|r| (r.tag.clone(), Arc::clone(&r.progress)))
                .collect();
            let (partitions, stop) = (args.partitions, Arc::clone(&stop_reading));
            std::thread::spawn(move || read(&kafka, &group, &topics, partitions, &watched, &stop))
        };
        let stop_writing = Arc::new(AtomicBool::new(false));
        let mut writers = Vec::new();
        for r in relays {
            let load = self.workload(&r.p, &r.tag, 0, Some(args.soak_rate));
            for w in 0..WRITERS {
                let (load, progress) = (load.clone(), Arc::clone(&r.progress));
                let stop = Arc::clone(&stop_writing);
                writers.push(tokio::spawn(async move {
                    steady_writer(load, w, &progress, &stop).await;
                }));
            }
        }
        eprintln!(
            "soak: {} relays at {} events/s each and an inbox, faults at random until {:.1} min",
            relays.len(),
            args.soak_rate,
            args.minutes
        );
        // Every pipeline streams before the first fault.
        let warm = Instant::now() + Duration::from_secs(120);
        while relays
            .iter()
            .any(|r| r.progress.unique.load(Ordering::SeqCst) == 0)
        {
            anyhow::ensure!(Instant::now() < warm, "the relays did not start streaming");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        let mut rng = rand::thread_rng();
        let mut faults: Vec<Fault> = Vec::new();
        let mut watch = Watch {
            relays,
            inbox_table,
            bin: bin.clone(),
            dir: dir.clone(),
        };
        while Instant::now() < deadline && faults.len() < args.max_faults {
            for proc in &mut procs {
                proc.restart_if_exited(&bin, &dir)?;
            }
            let kind = Kind::draw(&mut rng);
            let hold = Duration::from_secs_f64(rng.gen_range(
                args.fault_min_seconds..=args.fault_max_seconds.max(args.fault_min_seconds),
            ));
            let (mut target, mut note) = (String::new(), String::new());
            let all: Vec<usize> = (0..=inbox).collect();
            let on = |source: Source| -> Vec<usize> {
                (relays.iter().enumerate())
                    .filter(|(_, r)| (r.p.source == Source::Mysql) == (source == Source::Mysql))
                    .map(|(i, _)| i)
                    .collect()
            };
            let fault_start = Instant::now();
            let affected: Vec<usize> = match kind {
                Kind::Kill9 => {
                    let i = rng.gen_range(0..procs.len());
                    target = procs[i].name.clone();
                    procs[i].kill9_and_start(&bin, &dir, true).await?;
                    vec![i]
                }
                Kind::BrokerFreeze => {
                    let frozen = Frozen::stop(kafka_pid)?;
                    tokio::time::sleep(hold).await;
                    drop(frozen);
                    all
                }
                Kind::PostgresRestart => {
                    if let Err(e) = faults::restart_postgres().await {
                        // A fast shutdown waits for every walsender to have its WAL
                        // confirmed: a client that never confirms holds it.
                        note = format!(
                            "{e:#} (a fast shutdown not done in 60 s); stopped with -m \
                             immediate and started"
                        );
                        eprintln!("soak: {note}");
                        if let Err(e) = faults::stop_postgres_at_once().await {
                            eprintln!("soak: {e:#}");
                        }
                        services(&args.services_script, "start", "postgres").await?;
                    }
                    self.sql = workload::connect(&self.services.conn_string()).await?;
                    [on(Source::PgLog), vec![inbox]].concat()
                }
                Kind::MariadbRestart => {
                    services(&args.services_script, "stop", "mariadb").await?;
                    services(&args.services_script, "start", "mariadb").await?;
                    on(Source::Mysql)
                }
                Kind::PostgresBlackHole | Kind::MariadbBlackHole | Kind::KafkaBlackHole => {
                    let (proxy, affected) = match kind {
                        Kind::PostgresBlackHole => {
                            (pg_proxy, [on(Source::PgLog), vec![inbox]].concat())
                        }
                        Kind::MariadbBlackHole => (my_proxy, on(Source::Mysql)),
                        _ => (kafka_proxy, all),
                    };
                    proxy.add_both(Toxic::BLACK_HOLE);
                    tokio::time::sleep(hold).await;
                    proxy.heal();
                    affected
                }
            };
            let ended = Instant::now();
            let length = ended - fault_start;
            eprintln!(
                "soak: {:>6.1} s  {}{} for {:.1} s",
                started.elapsed().as_secs_f64(),
                kind.name(),
                if target.is_empty() {
                    String::new()
                } else {
                    format!(" ({target})")
                },
                length.as_secs_f64()
            );
            // What each touched pipeline must show to be streaming again.
            let snapshots: Vec<Vec<usize>> = relays.iter().map(|r| r.progress.snapshot()).collect();
            let inbox_target = relays[0].progress.unique.load(Ordering::SeqCst);
            let budget = length + Duration::from_secs_f64(args.recovery_budget);
            let limit =
                length + Duration::from_secs_f64(args.stuck_limit.max(args.recovery_budget));
            let recovered = self
                .wait_streaming(
                    &mut watch,
                    &mut procs,
                    &affected,
                    &snapshots,
                    inbox_target,
                    limit,
                    true,
                )
                .await?;
            for (i, at) in &recovered {
                match at {
                    Some(d) if *d > budget => eprintln!(
                        "soak:          WEDGE: {} streamed again only {:.1} s after the end",
                        procs[*i].name,
                        d.as_secs_f64()
                    ),
                    Some(d) if *d > length * 2 + Duration::from_secs(5) => eprintln!(
                        "soak:          {} streamed again {:.1} s after the end (goal missed)",
                        procs[*i].name,
                        d.as_secs_f64()
                    ),
                    _ => {}
                }
            }
            faults.push(Fault {
                kind,
                target,
                note,
                started: fault_start,
                ended,
                length,
                budget,
                recovered,
            });
            let pause = Duration::from_secs_f64(rng.gen_range(PAUSE.0..PAUSE.1));
            tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
            self.steady(&mut watch, &mut procs, relays, &mut faults, args)
                .await?;
        }

        self.steady(&mut watch, &mut procs, relays, &mut faults, args)
            .await?;
        // The end: writers stop, everything written is delivered.
        eprintln!(
            "soak: {} faults; writers stopping, the relays draining",
            faults.len()
        );
        stop_writing.store(true, Ordering::SeqCst);
        for w in writers {
            w.await.context("writer task")?;
        }
        let mut written = Vec::new();
        for r in relays {
            written.push(self.outbox_rows(&r.p).await?);
        }
        let drain_until = Instant::now() + DRAIN;
        loop {
            for proc in &mut procs {
                proc.restart_if_exited(&bin, &dir)?;
            }
            let relays_done = relays
                .iter()
                .zip(&written)
                .all(|(r, n)| r.progress.unique.load(Ordering::SeqCst) >= *n);
            let inbox_done = relays_done
                && self.inbox_done(inbox_table).await
                    >= relays[0].progress.unique.load(Ordering::SeqCst);
            if inbox_done || Instant::now() > drain_until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // A second more for late duplicates, then the reader stops.
        tokio::time::sleep(Duration::from_secs(2)).await;
        stop_reading.store(true, Ordering::SeqCst);
        let delivered = reader
            .join()
            .map_err(|_| anyhow::anyhow!("the soak's reader panicked"))??;
        let (inbox_rows, inbox_done) = self.inbox_counts(inbox_table).await?;
        for proc in &mut procs {
            if let Some(d) = proc.daemon.take() {
                let code = d.terminate(Duration::from_secs(60)).await?;
                if code != 0 {
                    eprintln!("soak: {} exited with {code} on SIGTERM", proc.name);
                }
            }
        }

        let mut report = SoakReport {
            minutes: args.minutes,
            rate: args.soak_rate,
            fault_seconds: (args.fault_min_seconds, args.fault_max_seconds),
            budget_seconds: args.recovery_budget,
            stuck_seconds: args.stuck_limit.max(args.recovery_budget),
            elapsed: started.elapsed(),
            ..SoakReport::default()
        };
        let longest = |pipeline: usize| {
            faults
                .iter()
                .filter_map(|f| {
                    let (_, at) = f.recovered.iter().find(|(p, _)| *p == pipeline)?;
                    Some(((*at)?, f.length, f.kind))
                })
                .max_by_key(|(at, _, _)| *at)
        };
        let wedges = |pipeline: usize| {
            (faults.iter())
                .flat_map(|f| f.recovered.iter().map(move |(p, at)| (f, *p, *at)))
                .filter(|(f, p, at)| *p == pipeline && f.wedged(*at))
                .count()
        };
        let stuck = |pipeline: usize| {
            (faults.iter().flat_map(|f| &f.recovered))
                .filter(|(p, at)| *p == pipeline && at.is_none())
                .count()
        };
        for (i, (r, d)) in relays.iter().zip(&delivered).enumerate() {
            report.relays.push(RelayResult {
                label: r.label.clone(),
                exactly_once: r.exactly_once,
                written: written[i],
                delivered: r.progress.unique.load(Ordering::SeqCst),
                duplicates: d.duplicates.len(),
                order_violations: d.order_violations,
                wedges: wedges(i),
                stuck: stuck(i),
                exits: procs[i].exits,
                kills: procs[i].kills,
                abandoned: r.progress.abandoned.load(Ordering::SeqCst),
                longest: longest(i),
                examples: d.examples.clone(),
            });
        }
        report.inbox = InboxResult {
            unique_in_topic: relays[0].progress.unique.load(Ordering::SeqCst),
            rows: inbox_rows,
            done: inbox_done,
            wedges: wedges(inbox),
            stuck: stuck(inbox),
            exits: procs[inbox].exits,
            kills: procs[inbox].kills,
            longest: longest(inbox),
        };
        // Each duplicate against the last fault that touched its pipeline before it.
        let mut by_kind: BTreeMap<Kind, (usize, usize)> = BTreeMap::new();
        for (i, (r, d)) in relays.iter().zip(&delivered).enumerate() {
            for seen in &d.duplicates {
                let fault = faults
                    .iter()
                    .rev()
                    .find(|f| f.started <= *seen && f.touched(i));
                if let Some(f) = fault {
                    let entry = by_kind.entry(f.kind).or_default();
                    match r.exactly_once {
                        true => entry.1 += 1,
                        false => entry.0 += 1,
                    }
                }
            }
        }
        let mut kinds: Vec<Kind> = faults.iter().map(|f| f.kind).collect();
        kinds.sort();
        kinds.dedup();
        for kind in kinds {
            let of_kind: Vec<&Fault> = faults.iter().filter(|f| f.kind == kind).collect();
            let (dup_alo, dup_eos) = by_kind.get(&kind).copied().unwrap_or_default();
            report.faults.push(FaultRow {
                kind,
                count: of_kind.len(),
                min_length: of_kind.iter().map(|f| f.length).min().unwrap_or_default(),
                max_length: of_kind.iter().map(|f| f.length).max().unwrap_or_default(),
                duplicates_at_least_once: dup_alo,
                duplicates_exactly_once: dup_eos,
                longest: of_kind
                    .iter()
                    .flat_map(|f| {
                        f.recovered
                            .iter()
                            .filter_map(|(_, at)| Some(((*at)?, f.length)))
                    })
                    .max_by_key(|(at, _)| *at),
                within_goal: of_kind
                    .iter()
                    .filter(|f| {
                        (f.recovered.iter()).all(|(_, at)| at.is_some_and(|at| at <= f.goal()))
                    })
                    .count(),
                wedges: of_kind
                    .iter()
                    .map(|f| f.recovered.iter().filter(|(_, at)| f.wedged(*at)).count())
                    .sum(),
                stuck: of_kind
                    .iter()
                    .flat_map(|f| &f.recovered)
                    .filter(|(_, at)| at.is_none())
                    .count(),
            });
        }
        report.notes = (faults.iter().filter(|f| !f.note.is_empty()))
            .map(|f| {
                format!(
                    "{} at {:.1} s: {}",
                    f.kind.name(),
                    (f.started - started).as_secs_f64(),
                    f.note
                )
            })
            .collect();
        let names: Vec<String> = procs.iter().map(|p| p.name.clone()).collect();
        report.log = faults
            .iter()
            .map(|f| {
                json!({
                    "at_seconds": (f.started - started).as_secs_f64(),
                    "kind": f.kind.name(),
                    "target": f.target,
                    "note": f.note,
                    "length_seconds": f.length.as_secs_f64(),
                    "streaming_again_seconds": f.recovered.iter().map(|(p, at)| {
                        (names[*p].clone(), json!(at.map(|d| d.as_secs_f64())))
                    }).collect::<serde_json::Map<_, _>>(),
                })
            })
            .collect();
        Ok(report)
    }
}

/// The broker, frozen until dropped (an error or a panic resumes it too).
struct Frozen(u32);

impl Frozen {
    fn stop(pid: u32) -> anyhow::Result<Self> {
        anyhow::ensure!(
            daemon::signal(pid, "-STOP"),
            "kill -STOP {pid} (the broker)"
        );
        Ok(Self(pid))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if !daemon::signal(self.0, "-CONT") {
            eprintln!(
                "soak: kill -CONT {} failed: the broker may still be frozen",
                self.0
            );
        }
    }
}

/// `scripts/services <step> <service>` (`stop`, `start`).
async fn services(script: &std::path::Path, step: &str, service: &str) -> anyhow::Result<()> {
    let out = tokio::process::Command::new(script)
        .args([step, service])
        .output()
        .await
        .with_context(|| format!("running {} {step} {service}", script.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} {step} {service}: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
