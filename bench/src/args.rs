//! The bench's command line (every knob of `scripts/bench --help`), the scenario set it
//! names, and the services it reaches, from the environment `scripts/services env` gives.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;

use crate::daemon::Services;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "outboxd-bench",
    about = "Benchmark outboxd against the machine's limits"
)]
pub(crate) struct Args {
    /// The outboxd binary (build it with --release).
    #[arg(long, default_value = "target/release/outboxd")]
    pub(crate) outboxd: PathBuf,
    /// scripts/services, for Kafka's ProducerPerformance.
    #[arg(long, default_value = "scripts/services")]
    pub(crate) services_script: PathBuf,
    /// Where the JSON results go [default: bench/results/latest.json; a soak alone:
    /// bench/results/soak.json; the HTTP scenarios alone: bench/results/http.json].
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// The page whose results section the run rewrites (its scenarios' block, between the
    /// markers); the block it replaces goes to the top of `--history`.
    #[arg(long, default_value = "docs/benchmarks.md")]
    pub(crate) doc: PathBuf,
    /// Where replaced results go, newest first.
    #[arg(long, default_value = "docs/benchmarks-history.md")]
    pub(crate) history: PathBuf,
    /// Leave the doc as it is (a trial run).
    #[arg(long)]
    pub(crate) no_doc: bool,
    /// Writer connections.
    #[arg(long, default_value_t = 4)]
    pub(crate) writers: usize,
    /// Outbox rows per transaction.
    #[arg(long, default_value_t = 10)]
    pub(crate) tx_size: usize,
    /// Bytes of each row's JSON payload.
    #[arg(long, default_value_t = 256)]
    pub(crate) payload_bytes: usize,
    /// Distinct biz_keys.
    #[arg(long, default_value_t = 1000)]
    pub(crate) keys: u64,
    /// Partitions of each bench topic.
    #[arg(long, default_value_t = 3)]
    pub(crate) partitions: i32,
    /// Fixed-rate runs: events per second.
    #[arg(long, default_value_t = 5000.0)]
    pub(crate) rate: f64,
    /// Length of the log-mode fixed-rate run, seconds.
    #[arg(long, default_value_t = 20.0)]
    pub(crate) rate_seconds: f64,
    /// Poll mode's fixed rate, events per second: low enough that poll mode keeps up, so
    /// its latency shows the poll interval and not a growing queue.
    #[arg(long, default_value_t = 1000.0)]
    pub(crate) poll_rate: f64,
    /// Length of the poll-mode and MariaDB fixed-rate runs, seconds.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) poll_seconds: f64,
    /// Backlog drained by pg_recvlogical and by outboxd (log mode); also the record count
    /// of the Kafka limit runs.
    #[arg(long, default_value_t = 200_000)]
    pub(crate) backlog_events: usize,
    /// Backlog drained by outboxd in poll mode.
    #[arg(long, default_value_t = 20_000)]
    pub(crate) poll_backlog_events: usize,
    /// Events written as fast as the writers can, with outboxd running (log mode).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) max_events: usize,
    /// Idle window of the "no query on an idle outbox" check, seconds (the retry
    /// worker's default idle_check is 60 s: keep the window longer).
    #[arg(long, default_value_t = 65.0)]
    pub(crate) idle_seconds: f64,
    /// Backlog drained by outboxd from MariaDB's binlog.
    #[arg(long, default_value_t = 50_000)]
    pub(crate) mariadb_backlog_events: usize,
    /// Records already in the topic when the inbox starts (one in ten a redelivery).
    #[arg(long, default_value_t = 50_000)]
    pub(crate) inbox_backlog_events: usize,
    /// The inbox's fixed rate, records per second (for `poll_seconds`).
    #[arg(long, default_value_t = 1000.0)]
    pub(crate) inbox_rate: f64,
    /// `pgrestart`: rows of the one transaction PostgreSQL is restarted in the middle of.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) fault_tx_events: usize,
    /// `kill9`: the writers' rate, events per second.
    #[arg(long, default_value_t = 2000.0)]
    pub(crate) fault_rate: f64,
    /// `kill9`: how long the writers write, seconds.
    #[arg(long, default_value_t = 20.0)]
    pub(crate) fault_seconds: f64,
    /// `kill9`: seconds between two SIGKILLs of outboxd.
    #[arg(long, default_value_t = 2.0)]
    pub(crate) kill_every: f64,
    /// `ingress-flood`: the relay's fixed rate, events per second, quiet and flooded.
    #[arg(long, default_value_t = 1000.0)]
    pub(crate) flood_rate: f64,
    /// `ingress-flood`: clients sending costly requests to the inbox's HTTP door at once.
    #[arg(long, default_value_t = 50)]
    pub(crate) flood_clients: usize,
    /// `http`: the HTTP endpoint's `concurrency` (requests in flight at once) in every HTTP
    /// scenario, and the bench client's concurrency in the limit run beside the drain.
    #[arg(long, default_value_t = 64)]
    pub(crate) http_concurrency: usize,
    /// `http`: the latency run's rate, events per second (for `rate_seconds`).
    #[arg(long, default_value_t = 1000.0)]
    pub(crate) http_rate: f64,
    /// `http`: how long the receiver holds every request unanswered, seconds.
    #[arg(long, default_value_t = 30.0)]
    pub(crate) http_stall_seconds: f64,
    /// `http`: the writers' rate around and during the stall, events per second.
    #[arg(long, default_value_t = 1000.0)]
    pub(crate) http_stall_rate: f64,
    /// `http`: the backlog drained by the HTTP sink in poll mode.
    #[arg(long, default_value_t = 50_000)]
    pub(crate) http_poll_backlog_events: usize,
    /// `soak`: how long faults are injected, minutes (then the relays drain).
    #[arg(long, default_value_t = 30.0)]
    pub(crate) minutes: f64,
    /// `soak`: events per second of each of the four relays.
    #[arg(long, default_value_t = 100.0)]
    pub(crate) soak_rate: f64,
    /// `soak`: the shortest broker freeze or network black hole, seconds.
    #[arg(long, default_value_t = 3.0)]
    pub(crate) fault_min_seconds: f64,
    /// `soak`: the longest broker freeze or network black hole, seconds.
    #[arg(long, default_value_t = 15.0)]
    pub(crate) fault_max_seconds: f64,
    /// `soak`: a pipeline not streaming this many seconds after a fault's end, beyond the
    /// fault's length, is wedged.
    #[arg(long, default_value_t = 60.0)]
    pub(crate) recovery_budget: f64,
    /// `soak`: a pipeline not streaming this many seconds after a fault's end, beyond the
    /// fault's length, is stuck: its outboxd is killed and started again.
    #[arg(long, default_value_t = 300.0)]
    pub(crate) stuck_limit: f64,
    /// `soak`: at most this many faults.
    #[arg(long, default_value_t = 1000)]
    pub(crate) max_faults: usize,
    /// Scenarios to run, comma-separated: rate,idle,limits,backlog,max,eos,poll,mariadb,inbox;
    /// the fault scenarios pgrestart and kill9, ingress-flood, console (the operator
    /// console's pages on a million rows), soak and the HTTP sink's
    /// `http` (its backlog drain and limit, latency, receiver stall and poll mode; one
    /// alone: http-drain, http-rate, http-stall, http-poll) run only when named.
    #[arg(long, default_value = DEFAULT_SCENARIOS)]
    pub(crate) scenarios: String,
    /// TOML appended to every generated outboxd config, e.g. "[delivery]\nmax_in_flight = 5000"
    /// (a section outboxd's generated config does not already have).
    #[arg(long, default_value = "")]
    pub(crate) config_extra: String,
    /// Drop the bench tables, slots, publications and topics at the end.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) cleanup: bool,
}

/// What `scripts/bench` runs when no scenario is named.
pub(crate) const DEFAULT_SCENARIOS: &str = "rate,idle,limits,backlog,max,eos,poll,mariadb,inbox";

/// Every scenario `--scenarios` may name (the defaults and those run only when named).
pub(crate) const KNOWN_SCENARIOS: &[&str] = &[
    "rate",
    "idle",
    "limits",
    "backlog",
    "max",
    "eos",
    "poll",
    "mariadb",
    "inbox",
    "pgrestart",
    "kill9",
    "ingress-flood",
    "console",
    "soak",
    "http",
    "http-drain",
    "http-rate",
    "http-stall",
    "http-poll",
];

impl Args {
    /// Refuses a `--scenarios` name the bench does not know: it would run nothing.
    pub(crate) fn check_scenarios(&self) -> Result<(), String> {
        let unknown: Vec<&str> = (self.scenarios.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty() && !KNOWN_SCENARIOS.contains(s))
            .collect();
        match unknown.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "unknown scenario(s) {}: --scenarios takes {}",
                unknown.join(", "),
                KNOWN_SCENARIOS.join(", ")
            )),
        }
    }

    pub(crate) fn wants(&self, scenario: &str) -> bool {
        self.scenarios.split(',').any(|s| s.trim() == scenario)
    }

    /// The scenarios named, sorted: `default` for the default list.
    pub(crate) fn scenario_set(&self) -> String {
        let sorted = |list: &str| {
            let mut names: Vec<&str> = list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect();
            names.sort_unstable();
            names.dedup();
            names.join(",")
        };
        let set = sorted(&self.scenarios);
        if set == sorted(DEFAULT_SCENARIOS) {
            "default".to_owned()
        } else {
            set
        }
    }

    pub(crate) fn json_path(&self) -> PathBuf {
        self.json.clone().unwrap_or_else(|| {
            PathBuf::from(match self.scenario_set().as_str() {
                "soak" => "bench/results/soak.json",
                "http" => "bench/results/http.json",
                "console" => "bench/results/console.json",
                _ => "bench/results/latest.json",
            })
        })
    }
}

pub(crate) fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

pub(crate) fn services_from_env() -> anyhow::Result<Services> {
    Ok(Services {
        pg_host: env_or("OUTBOXD_TEST_PG_HOST", "127.0.0.1"),
        pg_port: env_or("OUTBOXD_TEST_PG_PORT", "25432")
            .parse()
            .context("OUTBOXD_TEST_PG_PORT")?,
        pg_user: env_or("OUTBOXD_TEST_PG_USER", "outboxd"),
        pg_password: env_or("OUTBOXD_TEST_PG_PASSWORD", "outboxd"),
        pg_database: env_or("OUTBOXD_TEST_PG_DATABASE", "outboxd"),
        pg_bin: PathBuf::from(env_or("OUTBOXD_PG_BIN", "/usr/lib/postgresql/15/bin")),
        kafka: env_or("OUTBOXD_TEST_KAFKA", "127.0.0.1:29092"),
        mysql_host: env_or("OUTBOXD_TEST_MYSQL_HOST", "127.0.0.1"),
        mysql_port: env_or("OUTBOXD_TEST_MYSQL_PORT", "23306")
            .parse()
            .context("OUTBOXD_TEST_MYSQL_PORT")?,
        mysql_user: env_or("OUTBOXD_TEST_MYSQL_USER", "outboxd"),
        mysql_password: env_or("OUTBOXD_TEST_MYSQL_PASSWORD", "outboxd"),
        mysql_database: env_or("OUTBOXD_TEST_MYSQL_DATABASE", "outboxd"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_scenarios(scenarios: &str) -> Args {
        Args::parse_from(["outboxd-bench", "--scenarios", scenarios])
    }

    #[test]
    fn a_scenario_the_bench_does_not_know_is_refused() {
        assert!(with_scenarios(DEFAULT_SCENARIOS).check_scenarios().is_ok());
        assert!(with_scenarios("soak, http-rate").check_scenarios().is_ok());
        let e = with_scenarios("rate,soka").check_scenarios().unwrap_err();
        assert!(e.contains("soka"), "{e}");
    }
}
