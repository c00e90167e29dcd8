//! What the soak keeps of each relay and each fault: the writers' and the reader's
//! progress, the processes it runs (and kills), and the faults it injects.

use super::*;

/// Where the writers stand, and what the bench's reader has seen: shared by the writers,
/// the reader thread and the fault loop.
#[derive(Debug)]
pub(super) struct Progress {
    /// Per writer: the next transaction it begins.
    pub(super) begun: Vec<AtomicUsize>,
    /// Per writer: one past the highest transaction seen in Kafka.
    pub(super) seen_upto: Vec<AtomicUsize>,
    /// Distinct records seen in Kafka.
    pub(super) unique: AtomicUsize,
    /// Transactions given up after repeated failures (not in the outbox).
    pub(super) abandoned: AtomicUsize,
}

impl Progress {
    pub(super) fn new() -> Self {
        let zeros = || (0..WRITERS).map(|_| AtomicUsize::new(0)).collect();
        Self {
            begun: zeros(),
            seen_upto: zeros(),
            unique: AtomicUsize::new(0),
            abandoned: AtomicUsize::new(0),
        }
    }

    /// Per writer, the first transaction begun from now on.
    pub(super) fn snapshot(&self) -> Vec<usize> {
        self.begun
            .iter()
            .map(|b| b.load(Ordering::SeqCst))
            .collect()
    }

    /// Kafka holds a record of a transaction begun at or after `snapshot`.
    pub(super) fn streams_past(&self, snapshot: &[usize]) -> bool {
        (self.seen_upto.iter().zip(snapshot))
            .any(|(seen, snap)| seen.load(Ordering::SeqCst) > *snap)
    }
}

/// What the waits for streaming need of the soak.
pub(super) struct Watch<'a> {
    pub(super) relays: &'a [Relay],
    pub(super) inbox_table: &'a str,
    pub(super) bin: PathBuf,
    pub(super) dir: PathBuf,
}

/// One relay of the soak.
pub(super) struct Relay {
    pub(super) label: String,
    pub(super) exactly_once: bool,
    pub(super) p: BenchPipeline,
    pub(super) tag: String,
    pub(super) progress: Arc<Progress>,
}

/// An outboxd of the soak, started again whenever it is killed, wedged or exits.
pub(super) struct Proc {
    pub(super) name: String,
    pub(super) config: PathBuf,
    pub(super) port: u16,
    pub(super) daemon: Option<Daemon>,
    pub(super) starts: usize,
    pub(super) exits: usize,
    pub(super) kills: usize,
}

impl Proc {
    pub(super) fn start(
        &mut self,
        bin: &std::path::Path,
        dir: &std::path::Path,
    ) -> anyhow::Result<()> {
        let log = dir.join(format!("{}-{}.log", self.name, self.starts));
        self.daemon = Some(Daemon::spawn(bin, &self.config, log)?);
        self.starts += 1;
        Ok(())
    }

    /// `kill -9`, then started again; `fault`: counted as one of the soak's kills (not a
    /// wedge's restart).
    pub(super) async fn kill9_and_start(
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
    pub(super) fn restart_if_exited(
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
pub(super) enum Kind {
    Kill9,
    BrokerFreeze,
    PostgresRestart,
    MariadbRestart,
    PostgresBlackHole,
    MariadbBlackHole,
    KafkaBlackHole,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
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
    pub(super) fn draw(rng: &mut impl Rng) -> Self {
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
pub(super) struct Fault {
    pub(super) kind: Kind,
    /// What was killed, for `kill -9`.
    pub(super) target: String,
    /// What went otherwise than planned.
    pub(super) note: String,
    pub(super) started: Instant,
    pub(super) ended: Instant,
    pub(super) length: Duration,
    /// Streaming again later than this after the end is a wedge.
    pub(super) budget: Duration,
    /// Per pipeline it touched (relays by index, the inbox as `relays.len()`): when it
    /// streamed again after the fault's end, `None` for a wedge.
    pub(super) recovered: Vec<(usize, Option<Duration>)>,
}

impl Fault {
    pub(super) fn goal(&self) -> Duration {
        self.length * 2 + Duration::from_secs(5)
    }

    /// `at` (a pipeline's time to streaming again) is a wedge: later than the budget, or
    /// never (stuck: killed and started again).
    pub(super) fn wedged(&self, at: Option<Duration>) -> bool {
        at.is_none_or(|at| at > self.budget)
    }

    pub(super) fn touched(&self, pipeline: usize) -> bool {
        self.recovered.iter().any(|(p, _)| *p == pipeline)
    }
}
