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
//! events arrived in commit order under their key, and the rows show SUCCESS at the
//! position the sink holds; and it reports commit → arrival latency. Exit code 0 only
//! when all of that holds, 1 when a check failed, 2 when verify could not run. It deletes
//! its own rows at the end, whatever happened (by their message ids: never a row it did
//! not write); Ctrl-C or SIGTERM ends a run early, cleaned up, as failed.
//!
//! With `--inbox --spawn` it checks the other half instead ([`inbox`]): signed messages
//! posted to the HTTP ingress, redelivered, each stored once and handled once in order.
//!
//! The modules: [`outbox`] (the relay check's run), [`plan`] (what to write), [`check`]
//! (the checks, pure), [`arrivals`] (what came back), [`kafka_reader`] and
//! [`http_receiver`] (one per sink), [`relay_child`] (`--spawn`), [`report`] (text and
//! JSON), [`progress`], [`inbox`] (`--inbox`).

mod arrivals;
mod check;
mod http_receiver;
mod inbox;
mod kafka_reader;
mod outbox;
mod plan;
mod progress;
mod relay_child;
mod report;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outboxd_connector::Connector;

use crate::config::Config;

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
    /// Delete the run's Kafka topic at the end (only if verify created it).
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

impl VerifyOptions {
    /// What makes no sense whatever the config says.
    fn check(&self) -> Result<(), String> {
        if !(1..=10_000).contains(&self.rate) {
            return Err("--rate must be between 1 and 10000 a second".into());
        }
        if !(1..=100_000).contains(&self.keys) {
            return Err("--keys must be between 1 and 100000".into());
        }
        if !(1..=1_000).contains(&self.max_batch) {
            return Err("--max-batch must be between 1 and 1000".into());
        }
        if self.rollback_percent > 90 {
            return Err("--rollback-percent must be at most 90".into());
        }
        if self.duration.is_zero() || self.duration > Duration::from_secs(24 * 3600) {
            return Err("--duration must be more than 0s and at most 24h".into());
        }
        if self.kill_every < Duration::from_secs(1) {
            return Err("--kill-every must be at least 1s".into());
        }
        let plain = |text: &str| {
            !text.is_empty()
                && text.len() <= 100
                && (text.chars()).all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        };
        if !plain(&self.message_type) || !plain(&self.source) {
            return Err(
                "--message-type and --source must be letters, digits, '.', '_' and '-'".into(),
            );
        }
        Ok(())
    }
}

/// Runs `verify`; returns the exit code: 0 passed, 1 a check failed, 2 verify could not
/// run (the reason on stderr), so a pipeline's defect and a broken set-up differ.
pub(crate) async fn run<C: Connector>(
    config: &Config,
    connector: &C,
    options: &VerifyOptions,
) -> anyhow::Result<i32> {
    let result = match options.check() {
        Err(e) => Err(anyhow::anyhow!(e)),
        Ok(()) if options.inbox => inbox::run(config, connector, options).await,
        Ok(()) => outbox::run(config, connector, options).await,
    };
    result.or_else(|e| {
        eprintln!("error: {e:#}");
        Ok(2)
    })
}

/// Set once Ctrl-C (SIGINT) or SIGTERM arrives: the run stops writing and waiting, stops
/// its child, cleans up and reports itself failed. A second signal exits at once (130),
/// for a clean-up that hangs; what it had not deleted yet stays.
#[derive(Clone, Debug, Default)]
pub(crate) struct Interrupt(Arc<AtomicBool>);

impl Interrupt {
    /// Listens for SIGINT and SIGTERM from now on (the handlers are in place when this
    /// returns, before the first row or child).
    fn listen() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut interrupt_signal = signal(SignalKind::interrupt())?;
        let mut terminate_signal = signal(SignalKind::terminate())?;
        let interrupt = Self::default();
        let flag = interrupt.0.clone();
        tokio::spawn(async move {
            for signals in 0.. {
                tokio::select! {
                    _ = interrupt_signal.recv() => {}
                    _ = terminate_signal.recv() => {}
                }
                if signals > 0 {
                    eprintln!("verify: a second signal: exiting now, without cleaning up");
                    std::process::exit(130);
                }
                eprintln!("verify: interrupted: stopping and cleaning up (again to exit now)");
                flag.store(true, Ordering::SeqCst);
            }
        });
        Ok(interrupt)
    }

    fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Prints `report` as JSON or text; returns the exit code.
fn print_report(json: bool, report: &impl serde::Serialize, text: &str, passed: bool) -> i32 {
    if json {
        match serde_json::to_string_pretty(report) {
            Ok(document) => println!("{document}"),
            Err(e) => eprintln!("error: cannot print the report as JSON: {e}"),
        }
    } else {
        print!("{text}");
    }
    if passed {
        0
    } else {
        1
    }
}
