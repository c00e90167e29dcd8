//! The `outboxd` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use outboxd::commands::{execute, Command};
use outboxd::config::Config;

#[derive(Parser)]
#[command(
    name = "outboxd",
    version,
    about = "Relays transactional outbox rows from the database log to Kafka"
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
    Init(ConfigArg),
    /// Check connectivity and every prerequisite of `run`, one line each, with fixes.
    Check(ConfigArg),
    /// Relay outbox inserts to Kafka until SIGTERM/SIGINT.
    Run(ConfigArg),
    /// After a lost log position (slot dropped or invalidated, binlog purged): start the
    /// log afresh at the current position and publish every INIT row. Stop `run` first.
    Recover(ConfigArg),
}

#[derive(clap::Args)]
struct ConfigArg {
    /// Path of the TOML configuration file.
    #[arg(long, short, env = "OUTBOXD_CONFIG")]
    config: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let (command, path) = match cli.command {
        CliCommand::Init(a) => (Command::Init, a.config),
        CliCommand::Check(a) => (Command::Check, a.config),
        CliCommand::Run(a) => (Command::Run, a.config),
        CliCommand::Recover(a) => (Command::Recover, a.config),
    };
    let config = match Config::load(&path) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(execute(command, &config, &path)) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("OUTBOXD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
