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

/// Where the writers stand, and what the bench's reader has seen: shared by the writers,
/// the reader thread and the fault loop.
#[derive(Debug)]
struct Progress {
    /// Per writer: the next transaction it begins.
    begun: Vec<AtomicUsize>,
    /// Per writer: one past the highest transaction seen in Kafka.
    seen_upto: Vec<AtomicUsize>,
    /// Distinct records seen in Kafka.
    unique: AtomicUsize,
    /// Transactions given up after repeated failures (not in the outbox).
    abandoned: AtomicUsize,
}

impl Progress {
    fn new() -> Self {
        let zeros = || (0..WRITERS).map(|_| AtomicUsize::new(0)).collect();
        Self {
            begun: zeros(),
            seen_upto: zeros(),
            unique: AtomicUsize::new(0),
            abandoned: AtomicUsize::new(0),
        }
    }

    /// Per writer, the first transaction begun from now on.
    fn snapshot(&self) -> Vec<usize> {
        self.begun
            .iter()
            .map(|b| b.load(Ordering::SeqCst))
            .collect()
    }

    /// Kafka holds a record of a transaction begun at or after `snapshot`.
    fn streams_past(&self, snapshot: &[usize]) -> bool {
        (self.seen_upto.iter().zip(snapshot))
            .any(|(seen, snap)| seen.load(Ordering::SeqCst) > *snap)
    }
}

/// What the waits for streaming need of the soak.
struct Watch<'a> {
    relays: &'a [Relay],
    inbox_table: &'a str,
    bin: PathBuf,
    dir: PathBuf,
}

/// One relay of the soak.
struct Relay {
    label: String,
    exactly_once: bool,
    p: BenchPipeline,
    tag: String,
    progress: Arc<Progress>,
}

/// An outboxd of the soak, started again whenever it is killed, wedged or exits.
struct Proc {
    name: String,
    config: PathBuf,
    port: u16,
    daemon: Option<Daemon>,
    starts: usize,
    exits: usize,
    kills: usize,
}

impl Proc {
    fn start(&mut self, bin: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<()> {
        let log = dir.join(format!("{}-{}.log", self.name, self.starts));
        self.daemon = Some(Daemon::spawn(bin, &self.config, log)?);
        self.starts += 1;
        Ok(())
    }

    /// `kill -9`, then started again; `fault`: counted as one of the soak's kills (not a
    /// wedge's restart).
    async fn kill9_and_start(
        &mut self,
        bin: &std::path::Path,
        dir: &std::path::Path,
        fault: bool,
    ) -> anyhow::Result<()> {
        if let Some(d) = self.daemon.take() {
            d.kill9().await;
        }
        self.kills += usize::from(fault);
        self.start(bin, dir)
    }

    /// Started again if it exited on its own; true if it had.
    fn restart_if_exited(
        &mut self,
        bin: &std::path::Path,
        dir: &std::path::Path,
    ) -> anyhow::Result<bool> {
        let exited = self.daemon.as_mut().is_none_or(|d| !d.is_running());
        if exited {
            if let Some(d) = &self.daemon {
                eprintln!("soak: {} exited on its own:\n{}", self.name, d.log_tail());
            }
            self.exits += 1;
            self.start(bin, dir)?;
        }
        Ok(exited)
    }
}

/// The kinds of fault, as the report names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Kind {
    Kill9,
    BrokerFreeze,
    PostgresRestart,
    MariadbRestart,
    PostgresBlackHole,
    MariadbBlackHole,
    KafkaBlackHole,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Kill9 => "kill -9 of one outboxd",
            Kind::BrokerFreeze => "broker frozen (SIGSTOP)",
            Kind::PostgresRestart => "PostgreSQL restarted",
            Kind::MariadbRestart => "MariaDB restarted",
            Kind::PostgresBlackHole => "PostgreSQL black-holed",
            Kind::MariadbBlackHole => "MariaDB black-holed",
            Kind::KafkaBlackHole => "Kafka black-holed",
        }
    }

    /// One at random: the four kinds of the soak equally likely, then the target.
    fn draw(rng: &mut impl Rng) -> Self {
        match rng.gen_range(0..4) {
            0 => Kind::Kill9,
            1 => Kind::BrokerFreeze,
            2 if rng.gen_bool(0.5) => Kind::PostgresRestart,
            2 => Kind::MariadbRestart,
            _ => [
                Kind::PostgresBlackHole,
                Kind::MariadbBlackHole,
                Kind::KafkaBlackHole,
            ][rng.gen_range(0..3)],
        }
    }
}

/// One fault as it happened.
#[derive(Debug)]
struct Fault {
    kind: Kind,
    /// What was killed, for `kill -9`.
    target: String,
    /// What went otherwise than planned.
    note: String,
    started: Instant,
    ended: Instant,
    length: Duration,
    /// Streaming again later than this after the end is a wedge.
    budget: Duration,
    /// Per pipeline it touched (relays by index, the inbox as `relays.len()`): when it
    /// streamed again after the fault's end, `None` for a wedge.
    recovered: Vec<(usize, Option<Duration>)>,
}

impl Fault {
    fn goal(&self) -> Duration {
        self.length * 2 + Duration::from_secs(5)
    }

    /// `at` (a pipeline's time to streaming again) is a wedge: later than the budget, or
    /// never (stuck: killed and started again).
    fn wedged(&self, at: Option<Duration>) -> bool {
        at.is_none_or(|at| at > self.budget)
    }

    fn touched(&self, pipeline: usize) -> bool {
        self.recovered.iter().any(|(p, _)| *p == pipeline)
    }
}

/// What the bench's reader saw of one relay's topic.
#[derive(Debug, Default)]
struct Delivered {
    /// When each duplicate was seen.
    duplicates: Vec<Instant>,
    /// First sightings of a record after a later record of its key.
    order_violations: usize,
    examples: Vec<String>,
}

/// The settings and results of a soak, for the table, the JSON and the doc.
#[derive(Debug, Default)]
pub(crate) struct SoakReport {
    minutes: f64,
    rate: f64,
    fault_seconds: (f64, f64),
    budget_seconds: f64,
    stuck_seconds: f64,
    elapsed: Duration,
    relays: Vec<RelayResult>,
    inbox: InboxResult,
    faults: Vec<FaultRow>,
    /// Every fault: (kind, target, length, per pipeline touched: name and recovery).
    log: Vec<Value>,
    /// What went otherwise than planned, with when.
    notes: Vec<String>,
}

#[derive(Debug, Default)]
struct RelayResult {
    label: String,
    exactly_once: bool,
    written: usize,
    delivered: usize,
    duplicates: usize,
    order_violations: usize,
    wedges: usize,
    stuck: usize,
    exits: usize,
    kills: usize,
    abandoned: usize,
    longest: Option<(Duration, Duration, Kind)>,
    examples: Vec<String>,
}

#[derive(Debug, Default)]
struct InboxResult {
    unique_in_topic: usize,
    rows: usize,
    done: usize,
    wedges: usize,
    stuck: usize,
    exits: usize,
    kills: usize,
    longest: Option<(Duration, Duration, Kind)>,
}

#[derive(Debug)]
struct FaultRow {
    kind: Kind,
    count: usize,
    min_length: Duration,
    max_length: Duration,
    duplicates_at_least_once: usize,
    duplicates_exactly_once: usize,
    /// (recovery, the fault's length).
    longest: Option<(Duration, Duration)>,
    within_goal: usize,
    wedges: usize,
    stuck: usize,
}

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

    /// Waits until each of `pipelines` streams again: a relay when Kafka holds a record of
    /// a transaction begun at or after its `snapshots`, the inbox when it has handled
    /// `inbox_target` messages; each one's time from now, `None` for one still not
    /// streaming after `limit` (with `stuck`, its outboxd is then killed and started
    /// again). An outboxd that exits meanwhile is started again at once (and counted): its
    /// time includes that.
    #[allow(clippy::too_many_arguments)]
    async fn wait_streaming(
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
    async fn steady(
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
    async fn outbox_rows(&self, p: &BenchPipeline) -> anyhow::Result<usize> {
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
    async fn inbox_counts(&self, table: &str) -> anyhow::Result<(usize, usize)> {
        let sql = format!("SELECT count(*), count(*) FILTER (WHERE status = 'DONE') FROM {table}");
        let row = self.sql.query_one(&sql, &[]).await?;
        let (rows, done): (i64, i64) = (row.get(0), row.get(1));
        Ok((rows as usize, done as usize))
    }

    /// The inbox's DONE rows; 0 while PostgreSQL does not answer (the bench's connection
    /// is made anew after a restart).
    async fn inbox_done(&mut self, table: &str) -> usize {
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

/// One writer of a relay until `stop`: a transaction of [`TX_ROWS`] rows of its own keys
/// at its share of the rate; after an error, on a new connection, whether the transaction
/// went in, and if not the same transaction again (so a key's events are committed in
/// order, each once).
async fn steady_writer(load: Workload, writer: usize, progress: &Progress, stop: &AtomicBool) {
    let payload = format!(
        "{{\"pad\":\"{}\"}}",
        "x".repeat(load.payload_bytes.saturating_sub(10))
    );
    let per_writer = load.rate.unwrap_or(100.0) / WRITERS as f64;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(TX_ROWS as f64 / per_writer));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut db: Option<Writer> = None;
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let tx = progress.begun[writer].fetch_add(1, Ordering::SeqCst);
        let ids: Vec<String> = (0..TX_ROWS)
            .map(|i| format!("{}-{writer}-{tx}-{i}", load.tag))
            .collect();
        let keys: Vec<String> = (0..TX_ROWS)
            .map(|i| format!("w{writer}-k{}", (tx * TX_ROWS + i) % KEYS_PER_WRITER))
            .collect();
        let mut failures = 0;
        loop {
            let inserted = match db.as_mut() {
                Some(conn) => {
                    tokio::time::timeout(STATEMENT_TIMEOUT, conn.insert(&ids, &keys, &payload))
                        .await
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("timed out")))
                }
                None => Err(anyhow::anyhow!("not connected")),
            };
            if inserted.is_ok() {
                break;
            }
            failures += 1;
            // The outcome is unknown: ask a new connection.
            db = None;
            let Some(mut conn) = connect_until(&load, stop).await else {
                return;
            };
            let went_in =
                tokio::time::timeout(STATEMENT_TIMEOUT, conn.contains(&load.table, &ids[0]))
                    .await
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("timed out")));
            match went_in {
                Ok(true) => {
                    db = Some(conn);
                    break;
                }
                Ok(false) if failures >= 100 => {
                    progress.abandoned.fetch_add(1, Ordering::SeqCst);
                    db = Some(conn);
                    break;
                }
                Ok(false) => db = Some(conn),
                // Asked again on the next connection, before any new insert.
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

/// A writer's connection, tried every 100 ms until it opens or `stop`.
async fn connect_until(load: &Workload, stop: &AtomicBool) -> Option<Writer> {
    loop {
        if let Ok(Ok(conn)) = tokio::time::timeout(STATEMENT_TIMEOUT, Writer::open(load)).await {
            return Some(conn);
        }
        if stop.load(Ordering::SeqCst) {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The bench's reader of the relays' topics, until `stop`: per relay (by topic), the
/// distinct records and the progress of each writer in `watched`, the duplicates and
/// when they were seen, and per key whether the first sightings come in commit order.
fn read(
    kafka: &str,
    group: &str,
    topics: &[String],
    partitions: i32,
    watched: &[(String, Arc<Progress>)],
    stop: &AtomicBool,
) -> anyhow::Result<Vec<Delivered>> {
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let mut consumer = consume::from_beginning(kafka, group, &names, partitions)?;
    // Per topic and partition, the next offset to read: where a new consumer starts.
    let mut next: HashMap<(usize, i32), i64> = HashMap::new();
    let mut last_message = Instant::now();
    let mut out: Vec<Delivered> = topics.iter().map(|_| Delivered::default()).collect();
    let mut seen: Vec<HashSet<(usize, usize, usize)>> =
        topics.iter().map(|_| HashSet::new()).collect();
    // Per relay and key: the latest (transaction, row) seen.
    let mut latest: Vec<HashMap<Vec<u8>, (usize, usize)>> =
        topics.iter().map(|_| HashMap::new()).collect();
    while !stop.load(Ordering::SeqCst) {
        // A silent consumer is made anew where it was: after a broker freeze a consumer
        // was seen to read nothing more while the topics grew.
        if last_message.elapsed() > READER_SILENCE {
            let mut assignment = rdkafka::TopicPartitionList::new();
            for (r, topic) in topics.iter().enumerate() {
                for p in 0..partitions {
                    let offset = next
                        .get(&(r, p))
                        .map_or(rdkafka::Offset::Beginning, |o| rdkafka::Offset::Offset(*o));
                    assignment.add_partition_offset(topic, p, offset)?;
                }
            }
            eprintln!(
                "soak reader: nothing read for {READER_SILENCE:?}; a new consumer from {} offsets",
                next.len()
            );
            drop(consumer);
            consumer = consume::from(kafka, group, &assignment)?;
            last_message = Instant::now();
        }
        let m = match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                eprintln!("soak reader: {e}");
                continue;
            }
            None => continue,
        };
        last_message = Instant::now();
        let Some(r) = topics.iter().position(|t| t == m.topic()) else {
            continue;
        };
        next.insert((r, m.partition()), m.offset() + 1);
        let (tag, progress) = &watched[r];
        let Some(id) = consume::message_id(&m) else {
            continue;
        };
        let Some((writer, tx, row)) = parse_id(&id, tag) else {
            continue;
        };
        if !seen[r].insert((writer, tx, row)) {
            out[r].duplicates.push(Instant::now());
            continue;
        }
        progress.unique.fetch_add(1, Ordering::SeqCst);
        if let Some(upto) = progress.seen_upto.get(writer) {
            upto.fetch_max(tx + 1, Ordering::SeqCst);
        }
        let key = m.key().unwrap_or_default().to_vec();
        let last = latest[r].entry(key).or_insert((tx, row));
        if (tx, row) < *last {
            out[r].order_violations += 1;
            if out[r].examples.len() < 5 {
                out[r].examples.push(format!(
                    "{id} first seen after {tag}-{writer}-{}-{} of its key",
                    last.0, last.1
                ));
            }
        } else {
            *last = (tx, row);
        }
    }
    Ok(out)
}

/// (writer, transaction, row) of `<tag>-<writer>-<transaction>-<row>`.
fn parse_id(id: &str, tag: &str) -> Option<(usize, usize, usize)> {
    let mut parts = id.strip_prefix(tag)?.strip_prefix('-')?.split('-');
    let mut next = || parts.next()?.parse().ok();
    Some((next()?, next()?, next()?))
}

impl SoakReport {
    /// The soak's tables and verdicts, as printed and as recorded in the doc.
    pub(crate) fn text(&self) -> String {
        use std::fmt::Write as _;
        let secs = |d: Duration| format!("{:.1}", d.as_secs_f64());
        let mut t = String::new();
        let _ = writeln!(
            t,
            "soak: {:.1} min ({:.1} min with the drain), {} relays at {} events/s each \
             ({WRITERS} writers of {KEYS_PER_WRITER} keys, {TX_ROWS}-row transactions) and an \
             inbox; freezes and black holes of {}–{} s; wedge = not streaming {} s after a \
             fault's end plus its length, stuck = not after {} s (then killed and started again)",
            self.minutes,
            self.elapsed.as_secs_f64() / 60.0,
            self.relays.len(),
            self.rate,
            self.fault_seconds.0,
            self.fault_seconds.1,
            self.budget_seconds,
            self.stuck_seconds
        );
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "{:<28} {:>8} {:>9} {:>5} {:>6} {:>6} {:>6} {:>5} {:>5} {:>5}  longest to streaming again",
            "pipeline", "written", "delivered", "lost", "dups", "order", "wedges", "stuck", "exits", "kills"
        );
        let longest = |l: Option<(Duration, Duration, Kind)>| {
            l.map_or("-".to_owned(), |(at, length, kind)| {
                format!("{} s after {} ({} s)", secs(at), kind.name(), secs(length))
            })
        };
        for r in &self.relays {
            let _ = writeln!(
                t,
                "{:<28} {:>8} {:>9} {:>5} {:>6} {:>6} {:>6} {:>5} {:>5} {:>5}  {}",
                r.label,
                r.written,
                r.delivered,
                r.written.saturating_sub(r.delivered),
                r.duplicates,
                r.order_violations,
                r.wedges,
                r.stuck,
                r.exits,
                r.kills,
                longest(r.longest)
            );
        }
        let i = &self.inbox;
        let _ = writeln!(
            t,
            "{:<28} {:>8} {:>9} {:>5} {:>6} {:>6} {:>6} {:>5} {:>5} {:>5}  {}",
            "inbox (PostgreSQL's first)",
            i.unique_in_topic,
            i.done,
            i.unique_in_topic.saturating_sub(i.done),
            i.rows.saturating_sub(i.unique_in_topic),
            "-",
            i.wedges,
            i.stuck,
            i.exits,
            i.kills,
            longest(i.longest)
        );
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "{:<26} {:>6} {:>11} {:>9} {:>9}  {:<30} {:>12} {:>6} {:>5}",
            "fault",
            "count",
            "length s",
            "dups ALO",
            "dups EOS",
            "longest to streaming again",
            "within goal",
            "wedges",
            "stuck"
        );
        for f in &self.faults {
            let _ = writeln!(
                t,
                "{:<26} {:>6} {:>11} {:>9} {:>9}  {:<30} {:>12} {:>6} {:>5}",
                f.kind.name(),
                f.count,
                format!("{}–{}", secs(f.min_length), secs(f.max_length)),
                f.duplicates_at_least_once,
                f.duplicates_exactly_once,
                f.longest.map_or("-".to_owned(), |(at, length)| format!(
                    "{} s (a {} s fault)",
                    secs(at),
                    secs(length)
                )),
                format!("{} of {}", f.within_goal, f.count),
                f.wedges,
                f.stuck
            );
        }
        let _ = writeln!(t);
        for (target, verdict) in self.verdicts() {
            let _ = writeln!(t, "{verdict:<8} {target}");
        }
        for note in &self.notes {
            let _ = writeln!(t, "note: {note}");
        }
        for r in &self.relays {
            for e in &r.examples {
                let _ = writeln!(t, "order: {}: {e}", r.label);
            }
        }
        t
    }

    fn verdicts(&self) -> Vec<(String, &'static str)> {
        let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
        let lost: usize = (self.relays.iter())
            .map(|r| r.written.saturating_sub(r.delivered))
            .sum();
        let unhandled = self.inbox.unique_in_topic.saturating_sub(self.inbox.done);
        let order: usize = self.relays.iter().map(|r| r.order_violations).sum();
        let wedges: usize = self.relays.iter().map(|r| r.wedges).sum::<usize>() + self.inbox.wedges;
        let stuck: usize = self.relays.iter().map(|r| r.stuck).sum::<usize>() + self.inbox.stuck;
        let eos_dups: usize = (self.relays.iter().filter(|r| r.exactly_once))
            .map(|r| r.duplicates)
            .sum();
        let count: usize = self.faults.iter().map(|f| f.count).sum();
        let within: usize = self.faults.iter().map(|f| f.within_goal).sum();
        let exits: usize = self.relays.iter().map(|r| r.exits).sum::<usize>() + self.inbox.exits;
        vec![
            (format!("no event lost by the relays: {lost}"), verdict(lost == 0)),
            (
                format!("the inbox handled every message of its topic: {unhandled} left"),
                verdict(unhandled == 0),
            ),
            (
                format!("no per-key order violation: {order}"),
                verdict(order == 0),
            ),
            (format!("no wedge: {wedges}"), verdict(wedges == 0)),
            (
                format!("none stuck (killed to go on): {stuck}"),
                verdict(stuck == 0),
            ),
            (
                format!("no outboxd exit on its own: {exits}"),
                verdict(exits == 0),
            ),
            (
                format!("exactly-once: no duplicate read_committed: {eos_dups}"),
                verdict(eos_dups == 0),
            ),
            (
                format!(
                    "streaming again within 2 × the fault's length + 5 s: {within} of {count} faults"
                ),
                verdict(within == count),
            ),
        ]
    }

    pub(crate) fn json(&self) -> Value {
        let secs = |d: Duration| d.as_secs_f64();
        let longest = |l: &Option<(Duration, Duration, Kind)>| {
            l.map(|(at, length, kind)| {
                json!({"seconds": secs(at), "fault": kind.name(), "fault_length_seconds": secs(length)})
            })
        };
        json!({
            "minutes": self.minutes,
            "elapsed_seconds": secs(self.elapsed),
            "rate_per_relay": self.rate,
            "writers_per_relay": WRITERS,
            "keys_per_writer": KEYS_PER_WRITER,
            "rows_per_transaction": TX_ROWS,
            "fault_seconds": [self.fault_seconds.0, self.fault_seconds.1],
            "recovery_budget_seconds": self.budget_seconds,
            "stuck_limit_seconds": self.stuck_seconds,
            "relays": self.relays.iter().map(|r| json!({
                "pipeline": r.label,
                "exactly_once": r.exactly_once,
                "written": r.written,
                "delivered": r.delivered,
                "lost": r.written.saturating_sub(r.delivered),
                "duplicates": r.duplicates,
                "order_violations": r.order_violations,
                "order_examples": r.examples,
                "wedges": r.wedges,
                "stuck": r.stuck,
                "exits": r.exits,
                "kills": r.kills,
                "transactions_abandoned": r.abandoned,
                "longest_to_streaming_again": longest(&r.longest),
            })).collect::<Vec<_>>(),
            "inbox": {
                "unique_in_topic": self.inbox.unique_in_topic,
                "rows": self.inbox.rows,
                "done": self.inbox.done,
                "missing": self.inbox.unique_in_topic.saturating_sub(self.inbox.done),
                "wedges": self.inbox.wedges,
                "stuck": self.inbox.stuck,
                "exits": self.inbox.exits,
                "kills": self.inbox.kills,
                "longest_to_caught_up": longest(&self.inbox.longest),
            },
            "faults": self.faults.iter().map(|f| json!({
                "fault": f.kind.name(),
                "count": f.count,
                "min_length_seconds": secs(f.min_length),
                "max_length_seconds": secs(f.max_length),
                "duplicates_at_least_once": f.duplicates_at_least_once,
                "duplicates_exactly_once": f.duplicates_exactly_once,
                "longest_to_streaming_again_seconds": f.longest.map(|(at, _)| secs(at)),
                "longest_fault_length_seconds": f.longest.map(|(_, l)| secs(l)),
                "within_goal": f.within_goal,
                "wedges": f.wedges,
                "stuck": f.stuck,
            })).collect::<Vec<_>>(),
            "verdicts": self.verdicts().into_iter().map(|(t, v)| json!({"target": t, "verdict": v})).collect::<Vec<_>>(),
            "log": self.log,
            "notes": self.notes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::parse_id;

    #[test]
    fn a_message_id_names_writer_transaction_and_row() {
        assert_eq!(parse_id("a1s0-1-42-3", "a1s0"), Some((1, 42, 3)));
        assert_eq!(parse_id("a1s1-1-42-3", "a1s0"), None);
        assert_eq!(parse_id("a1s0-x-42-3", "a1s0"), None);
    }
}
