//! The CLI's commands, generic over the connector: `main.rs` parses arguments and picks
//! the connector for `source.kind`; everything else happens here.

use std::sync::Arc;
use std::time::Duration;

use outboxd_connector::{CheckLine, CheckStatus, Connector};
use outboxd_postgres::PostgresConnector;
use tokio::sync::watch;

use crate::config::{Config, SourceConfig};
use crate::kafka::Publisher;
use crate::pipeline::{self, PipelineSettings, PipelineStats};

/// A command of the CLI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Create tables, publication and slot.
    Init,
    /// Check every prerequisite of `run`.
    Check,
    /// Relay until SIGTERM/SIGINT.
    Run,
}

/// Runs `command` with the connector that `config.source` names. Returns the process
/// exit code.
pub async fn execute(command: Command, config: &Config) -> anyhow::Result<i32> {
    match &config.source {
        SourceConfig::Postgres(pg) => {
            let connector =
                PostgresConnector::new(pg.clone(), &config.pipeline.name, config.outbox.layout())?;
            execute_with(command, config, &connector).await
        }
    }
}

async fn execute_with<C: Connector>(
    command: Command,
    config: &Config,
    connector: &C,
) -> anyhow::Result<i32> {
    match command {
        Command::Init => {
            for line in connector.init().await? {
                println!("{line}");
            }
            Ok(0)
        }
        Command::Check => check(config, connector).await,
        Command::Run => run(config, connector).await,
    }
}

async fn check<C: Connector>(config: &Config, connector: &C) -> anyhow::Result<i32> {
    let mut report = vec![CheckLine::ok("config", "valid")];
    report.extend(connector.check().await);
    match Publisher::new(&config.kafka, &config.pipeline.name) {
        Ok(publisher) => report.push(publisher.check(Duration::from_secs(5)).await),
        Err(e) => report.push(CheckLine::fail("kafka", e, "fix the [kafka] section")),
    }
    for line in &report {
        println!("{line}");
    }
    let failures = report
        .iter()
        .filter(|l| l.status == CheckStatus::Fail)
        .count();
    if failures > 0 {
        println!("{failures} check(s) failed");
        return Ok(1);
    }
    println!("all checks passed");
    Ok(0)
}

async fn run<C: Connector>(config: &Config, connector: &C) -> anyhow::Result<i32> {
    let publisher =
        Publisher::new(&config.kafka, &config.pipeline.name).map_err(anyhow::Error::msg)?;
    let settings = PipelineSettings {
        delivery: config.delivery.clone(),
        retry: config.retry.clone(),
    };
    let stats = Arc::new(PipelineStats::default());
    let (stop, shutdown) = watch::channel(false);
    tokio::spawn(stop_on_signals(stop));

    let result = pipeline::run(connector, &publisher, &settings, &stats, shutdown).await;
    publisher.flush(Duration::from_secs(5));
    result?;
    tracing::info!(
        published = stats.published.load(std::sync::atomic::Ordering::Relaxed),
        failed = stats.failed.load(std::sync::atomic::Ordering::Relaxed),
        "stopped cleanly"
    );
    Ok(0)
}

/// First SIGTERM/SIGINT: graceful stop (drain, write back, checkpoint). Second: exit now.
async fn stop_on_signals(stop: watch::Sender<bool>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop outboxd with SIGKILL");
        return;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::info!("signal received: stopping (send it again to exit at once)");
    let _ = stop.send(true);
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::warn!("second signal: exiting without draining");
    std::process::exit(130);
}
