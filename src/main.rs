//! The `outboxd` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use outboxd::admin_cli::{AdminCommand, OutputFormat, DEFAULT_JANITOR_BATCH};
use outboxd::commands::{execute, Command};
use outboxd::config::Config;
use outboxd::observability::otlp::{self, OtlpConfig, OtlpExport};
use outboxd_connector::{RetrySelector, TableKind};

#[derive(Parser)]
#[command(
    name = "outboxd",
    version,
    about = "Transactional outbox and inbox: relays outbox rows from the database log (or by \
             polling the table; PostgreSQL, MySQL/MariaDB) to Kafka or HTTP endpoints, and \
             stores incoming messages (Kafka, HTTP) in an inbox table for handlers, \
             deduplicated"
)]
struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: CliCommand,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum CliCommand {
    /// Create the outbox, inbox and checkpoint tables, the publication and the slot
    /// where missing; says what it created. Safe to run again.
    Init(InitArgs),
    /// Print the DDL `init` would run (schemas, tables, indexes, the publication) with the
    /// configured names, for teams that apply DDL through a migration tool. Connects to
    /// nothing; `init` and `check` accept what it creates.
    Schema(ConfigArg),
    /// Check connectivity and every prerequisite of `run`, one line each, with fixes.
    Check(ConfigArg),
    /// Run what the config turns on until SIGTERM/SIGINT: the outbox relay (to Kafka or
    /// HTTP endpoints), the inbox (its ingress and handlers), or both.
    Run(ConfigArg),
    /// After a lost log position (slot dropped or invalidated, binlog purged): start the
    /// log afresh at the current position and publish every INIT row. Stop `run` first.
    Recover(ConfigArg),
    /// Rows by status and message type, the oldest unsent row, log lag and checkpoint.
    Status(StatusArgs),
    /// Make FAILED or MANUAL_REQUIRED rows due again now (retry_count back to 0).
    /// Exit code 1 when `--id` changed nothing.
    Retry(RetryArgs),
    /// Take one INIT or FAILED row out of automatic retries (MANUAL_REQUIRED), recording
    /// why in last_error. With strict ordering its key's later events keep waiting.
    /// Exit code 1 when the row was not changed.
    Park(RowArgs),
    /// Skip one unsent row for good: SUCCESS without sending, the reason in last_error.
    /// Releases its key's later events. Exit code 1 when the row was not changed.
    Resolve(RowArgs),
    /// Delete (or archive) SUCCESS rows older than a retention, in small batches, each its
    /// own short transaction.
    Janitor(JanitorArgs),
    /// Check the pipeline end to end: write marked synthetic events into the outbox (some
    /// rolled back), read the sink back, and report lost, duplicated and reordered events,
    /// rows not SUCCESS, and latency. Exit code 0 only when nothing is lost or reordered.
    /// Deletes its own rows at the end. See docs/verify.md.
    Verify(VerifyArgs),
}

#[derive(clap::Args)]
struct VerifyArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// How long to write events (e.g. `30s`, `5m`).
    #[arg(long, default_value = "30s", value_parser = humantime_serde::re::humantime::parse_duration)]
    duration: std::time::Duration,
    /// Transactions a second.
    #[arg(long, default_value_t = 50)]
    rate: u32,
    /// Distinct business keys the events are spread over.
    #[arg(long, default_value_t = 16)]
    keys: u32,
    /// Events per transaction: 1 to this many, at random.
    #[arg(long, default_value_t = 4)]
    max_batch: u32,
    /// Percentage of transactions rolled back (their events must never arrive).
    #[arg(long, default_value_t = 10)]
    rollback_percent: u32,
    /// The events' message type prefix (`<prefix>.<n>`).
    #[arg(long, default_value = "outboxd.verify")]
    message_type: String,
    /// The run's own Kafka topic (created when missing), or with [http] the endpoint whose
    /// url verify listens on (plain http on this machine).
    #[arg(long, default_value = "outboxd.verify")]
    topic: String,
    /// Run the relay (`outboxd run`) as verify's own child instead of using one already
    /// running. Stop any other relay of this pipeline first.
    #[arg(long)]
    spawn: bool,
    /// Faults to inject into the spawned relay: `kill` (SIGKILL at random moments, then a
    /// restart). Needs --spawn.
    #[arg(long, value_enum, requires = "spawn")]
    faults: Option<VerifyFaults>,
    /// Mean time between kills with `--faults kill`.
    #[arg(long, default_value = "5s", value_parser = humantime_serde::re::humantime::parse_duration)]
    kill_every: std::time::Duration,
    /// How long to wait after the last write for every event to arrive.
    #[arg(long, default_value = "120s", value_parser = humantime_serde::re::humantime::parse_duration)]
    drain_timeout: std::time::Duration,
    /// Delete the run's Kafka topic at the end, if verify created it.
    #[arg(long)]
    cleanup_topic: bool,
    /// Leave the run's rows in the outbox (to look into a failed run).
    #[arg(long)]
    keep_rows: bool,
    /// Repeat a run's choices of keys, sizes and rollbacks (the report prints the seed).
    #[arg(long)]
    seed: Option<u64>,
    /// Print one JSON document instead of the text report.
    #[arg(long)]
    json: bool,
    /// Check the inbox instead of the outbox relay: post signed messages (some twice) to
    /// the HTTP ingress and check each is stored once and handled once, in its key's
    /// order. Needs --spawn: verify runs the inbox with a source and handlers of its own.
    #[arg(long, requires = "spawn")]
    inbox: bool,
    /// With --inbox: the HTTP source verify posts as (added, with a secret made for the
    /// run, to the config of the inbox it spawns).
    #[arg(long, default_value = "outboxd-verify")]
    source: String,
}

#[derive(Clone, Copy, ValueEnum)]
enum VerifyFaults {
    /// SIGKILL the spawned relay at random moments and start it again.
    Kill,
}

#[derive(clap::Args)]
struct StatusArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Act on the inbox table instead of the outbox.
    #[arg(long)]
    inbox: bool,
    /// The outbox table to act on, when the pipeline has several (`outbox.tables`).
    #[arg(long, conflicts_with = "inbox")]
    table: Option<String>,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("rows").required(true).args(["id", "status"])))]
struct RetryArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Act on the inbox table instead of the outbox.
    #[arg(long)]
    inbox: bool,
    /// The outbox table to act on, when the pipeline has several (`outbox.tables`).
    #[arg(long, conflicts_with = "inbox")]
    table: Option<String>,
    /// The row to retry.
    #[arg(long)]
    id: Option<i64>,
    /// Retry every row in this status.
    #[arg(long, value_parser = ["FAILED", "MANUAL_REQUIRED"])]
    status: Option<String>,
    /// With --status: only rows of this message type.
    #[arg(long = "type", requires = "status", value_name = "MESSAGE_TYPE")]
    message_type: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct RowArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Act on the inbox table instead of the outbox.
    #[arg(long)]
    inbox: bool,
    /// The outbox table to act on, when the pipeline has several (`outbox.tables`).
    #[arg(long, conflicts_with = "inbox")]
    table: Option<String>,
    /// The outbox row id.
    #[arg(long)]
    id: i64,
    /// Why; stored in last_error.
    #[arg(long)]
    reason: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct JanitorArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Act on the inbox table instead of the outbox: DONE rows go, never one younger than
    /// `inbox.dedupe_retention`.
    #[arg(long)]
    inbox: bool,
    /// The outbox table to act on, when the pipeline has several (`outbox.tables`).
    #[arg(long, conflicts_with = "inbox")]
    table: Option<String>,
    /// Retention: SUCCESS rows sent longer ago than this go (e.g. `7d`, `12h`).
    #[arg(long, value_parser = humantime_serde::re::humantime::parse_duration)]
    older_than: std::time::Duration,
    /// Move the rows into this table (created like the outbox when missing) instead of
    /// deleting them.
    #[arg(long)]
    archive_table: Option<String>,
    /// Rows per transaction.
    #[arg(long, default_value_t = DEFAULT_JANITOR_BATCH, value_parser = clap::value_parser!(usize))]
    batch: usize,
    /// Print JSON (progress goes to stderr).
    #[arg(long)]
    json: bool,
}

fn format(json: bool) -> OutputFormat {
    if json {
        OutputFormat::Json
    } else {
        OutputFormat::Text
    }
}

/// The operator commands as library commands, with their config path.
fn admin_command(command: CliCommand) -> Option<(Command, PathBuf, Option<String>)> {
    let (admin, json, inbox, config, table) = match command {
        CliCommand::Status(a) => (AdminCommand::Status, a.json, a.inbox, a.config, a.table),
        CliCommand::Retry(a) => {
            let selector = match (a.id, a.status) {
                (Some(id), _) => RetrySelector::Id(id),
                (None, Some(status)) => RetrySelector::Status {
                    status,
                    message_type: a.message_type,
                },
                // clap requires one of the two.
                (None, None) => return None,
            };
            (
                AdminCommand::Retry(selector),
                a.json,
                a.inbox,
                a.config,
                a.table,
            )
        }
        CliCommand::Park(a) => (
            AdminCommand::Park {
                id: a.id,
                reason: a.reason,
            },
            a.json,
            a.inbox,
            a.config,
            a.table,
        ),
        CliCommand::Resolve(a) => (
            AdminCommand::Resolve {
                id: a.id,
                reason: a.reason,
            },
            a.json,
            a.inbox,
            a.config,
            a.table,
        ),
        CliCommand::Janitor(a) => (
            AdminCommand::Janitor {
                older_than: a.older_than,
                archive_table: a.archive_table,
                batch: a.batch.max(1),
            },
            a.json,
            a.inbox,
            a.config,
            a.table,
        ),
        _ => return None,
    };
    let command = Command::Admin {
        table: if inbox {
            TableKind::Inbox
        } else {
            TableKind::Outbox
        },
        command: admin,
        format: format(json),
    };
    Some((command, config.config, table))
}

#[derive(clap::Args)]
struct InitArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Add the columns outboxd writes (an integer row id, status, retry_count, …) to an
    /// application's outbox table whose rows it keeps (`outbox.layout = "debezium"` or
    /// `[outbox.columns]` with `outbox.rows = "kept"`). Rows already there become SUCCESS:
    /// they are not sent.
    #[arg(long)]
    add_columns: bool,
}

#[derive(clap::Args)]
struct ConfigArg {
    /// Path of the TOML configuration file.
    #[arg(long, short, env = "OUTBOXD_CONFIG")]
    config: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (command, path, table) = match cli.command {
        CliCommand::Init(a) => (
            Command::Init {
                add_columns: a.add_columns,
            },
            a.config.config,
            None,
        ),
        CliCommand::Schema(a) => (Command::Schema, a.config, None),
        CliCommand::Check(a) => (Command::Check, a.config, None),
        CliCommand::Run(a) => (Command::Run, a.config, None),
        CliCommand::Recover(a) => (Command::Recover, a.config, None),
        CliCommand::Verify(a) => (
            Command::Verify(outboxd::verify::VerifyOptions {
                config_path: a.config.config.clone(),
                duration: a.duration,
                rate: a.rate,
                keys: a.keys,
                max_batch: a.max_batch,
                rollback_percent: a.rollback_percent,
                message_type: a.message_type,
                topic: a.topic,
                spawn: a.spawn,
                kill_faults: matches!(a.faults, Some(VerifyFaults::Kill)),
                kill_every: a.kill_every,
                drain_timeout: a.drain_timeout,
                cleanup_topic: a.cleanup_topic,
                keep_rows: a.keep_rows,
                seed: a.seed,
                json: a.json,
                inbox: a.inbox,
                source: a.source,
            }),
            a.config.config,
            None,
        ),
        other => match admin_command(other) {
            Some(command) => command,
            None => {
                eprintln!("error: retry needs --id or --status");
                return ExitCode::from(2);
            }
        },
    };
    let config = match Config::load(&path) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // The outbox's operator commands act on one table.
    let config = match &command {
        Command::Admin {
            table: TableKind::Outbox,
            ..
        } => match config.for_outbox_table(table.as_deref()) {
            Ok(config) => config,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        },
        _ => config,
    };
    // Held to the end: dropping it sends the spans still queued.
    let _otlp = init_logging(cli.log_format, config.otlp.as_ref());
    // One thread runs every task (the log stream, the session, the store's connections,
    // the HTTP endpoints); librdkafka has its own threads and blocking calls go to tokio's
    // blocking pool. outboxd's own work is a fraction of a core even when draining (the
    // database decodes and writes back, the broker stores), and a task handing events to
    // another on a different thread paid a futex wake-up each time: measured on the 2-core
    // bench, the multi-threaded runtime cost more CPU per event at a fixed rate and 10–15
    // MB more peak memory in a drain (glibc's per-thread arenas). docs/benchmarks.md, "One
    // runtime thread".
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // verify's 1 means "a check failed": that it could not run at all is 2.
    let could_not_run = match command {
        Command::Verify(_) => ExitCode::from(2),
        _ => ExitCode::FAILURE,
    };
    match runtime.block_on(execute(command, &config, &path)) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            could_not_run
        }
    }
}

/// Logs to stderr, filtered by `OUTBOXD_LOG`; with `[otlp]`, outboxd's event spans also
/// go to the collector, whatever `OUTBOXD_LOG` says of their level.
fn init_logging(format: LogFormat, otlp: Option<&OtlpConfig>) -> Option<OtlpExport> {
    use tracing_subscriber::layer::{Layer, SubscriberExt};
    use tracing_subscriber::util::SubscriberInitExt;

    let mut filter = tracing_subscriber::EnvFilter::try_from_env("OUTBOXD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt.json().boxed(),
    };
    let (layer, export, failed) = match otlp.map(otlp::start) {
        Some(Ok((layer, export))) => (Some(layer), Some(export), None),
        Some(Err(e)) => (None, None, Some(e)),
        None => (None, None, None),
    };
    if layer.is_some() {
        // One filter for every layer: EnvFilter as a per-layer filter dropped some of the
        // events its directives enable (`info,outboxd=debug` lost an info line).
        if let Ok(spans) = "outboxd::observability::trace_context=info".parse() {
            filter = filter.add_directive(spans);
        }
    }
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(layer)
        .init();
    if let Some(e) = failed {
        tracing::warn!(error = %e, "cannot start the OTLP export thread; spans are not exported");
    }
    export
}
