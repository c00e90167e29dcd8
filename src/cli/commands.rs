//! The CLI's commands, generic over the connector: `main.rs` parses arguments and picks
//! the connector for `source.kind`; everything else happens here.

use std::sync::Arc;
use std::time::Duration;

use std::path::Path;

use outboxd_connector::{
    CheckLine, CheckStatus, ClaimScope, ConfiguredConnector, Connector, ReadMode, RowLifecycle,
    TableKind,
};
use tokio::sync::{mpsc, watch, Notify};

use super::admin::{self, AdminCommand, AdminContext, OutputFormat};
use super::recover::recover;
use crate::claims::{run_worker, watch_retries, WorkerSettings};
use crate::config::{Config, Ordering as KeyOrdering, SourceMode, DEFAULT_IDLE_CHECK};
use crate::engines::WithEngine;
use crate::inbox::{self, Handlers, InboxStats, Ingest};
use crate::observability;
use crate::relay::{self, PipelineError, PipelineSettings, PipelineStats, RetryLink};
use crate::sink::http::HttpSink;
use crate::sink::kafka::KafkaSink;
use crate::sink::AnySink;
use crate::sink::Sink;

/// A command of the CLI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Create tables, publication and slot; with `add_columns`, first add the columns
    /// outboxd writes to an application's outbox table (`init --add-columns`).
    Init {
        /// `--add-columns`.
        add_columns: bool,
    },
    /// Print the DDL `init` would run, for a migration tool; connects to nothing.
    Schema,
    /// Check every prerequisite of `run`.
    Check,
    /// Relay until SIGTERM/SIGINT.
    Run,
    /// Start the log afresh and publish every INIT row (after a lost slot or binlog).
    Recover,
    /// Write synthetic events through the pipeline and check what the sink delivered.
    Verify(crate::verify::VerifyOptions),
    /// An operator command (`status`, `retry`, `park`, `resolve`, `janitor`) on the outbox
    /// or, with `--inbox`, the inbox table, printed as text or JSON.
    Admin {
        /// The table acted on.
        table: TableKind,
        /// What to do.
        command: AdminCommand,
        /// How the result is printed.
        format: OutputFormat,
    },
}

/// Runs `command` with the connector that `config.source` names. Returns the process
/// exit code.
///
/// `config_path` is only used in messages: errors that name a command to run (for
/// example `outboxd recover --config <file>`) get the real path.
pub async fn execute(command: Command, config: &Config, config_path: &Path) -> anyhow::Result<i32> {
    execute_with_handlers(command, config, config_path, Handlers::default()).await
}

/// [`execute`] for a program that embeds outboxd: `handlers` (its own [`Handler`]s, see
/// `examples/inbox_handler.rs`) take precedence over the configured ones of the same
/// message type.
///
/// [`Handler`]: crate::inbox::Handler
pub async fn execute_with_handlers(
    command: Command,
    config: &Config,
    config_path: &Path,
    handlers: Handlers,
) -> anyhow::Result<i32> {
    let work = Execute {
        command,
        config,
        handlers,
    };
    let result = config
        .source
        .engine
        .with_connector(&config.pipeline.name, config.layout(), work)
        .await
        .map_err(anyhow::Error::from)
        .and_then(|result| result);
    result.map_err(|e| {
        anyhow::anyhow!(e
            .to_string()
            .replace("<file>", &config_path.display().to_string()))
    })
}

/// A command, handed to the engine registry to run with the configured connector.
struct Execute<'a> {
    command: Command,
    config: &'a Config,
    handlers: Handlers,
}

impl WithEngine for Execute<'_> {
    type Output = anyhow::Result<i32>;

    async fn run<C: ConfiguredConnector>(self, connector: C) -> anyhow::Result<i32> {
        execute_with(self.command, self.config, &connector, self.handlers).await
    }
}

async fn execute_with<C: Connector + Clone + 'static>(
    command: Command,
    config: &Config,
    connector: &C,
    handlers: Handlers,
) -> anyhow::Result<i32> {
    match command {
        Command::Init { add_columns } => {
            if add_columns {
                for line in connector.add_columns().await? {
                    println!("{line}");
                }
            }
            for line in connector.init(read_mode(config)).await? {
                println!("{line}");
            }
            Ok(0)
        }
        Command::Schema => {
            print!("{}", connector.schema(read_mode(config)));
            Ok(0)
        }
        Command::Check => check(config, connector).await,
        Command::Verify(options) => crate::verify::run(config, connector, &options).await,
        // Boxed: the relay's and the inbox's futures together nest deeper than the
        // compiler's default query depth allows for one unboxed future.
        Command::Run => {
            for warning in &config.warnings {
                tracing::warn!(fix = %warning.fix, "{}", warning.message);
            }
            // Exactly-once: the log relay gets a transactional producer of its own; the
            // claim worker, the endpoint and the inbox keep the ordinary one.
            if !config.relays_outbox() {
                let no_sink: Option<Arc<AnySink>> = None;
                return Box::pin(run(config, connector, no_sink, None, handlers)).await;
            }
            let relay_sink = match config.delivery.exactly_once {
                true => Some(AnySink::Kafka(
                    open_kafka(config)?
                        .transactional(&config.kafka)
                        .map_err(anyhow::Error::msg)?,
                )),
                false => None,
            };
            Box::pin(run(
                config,
                connector,
                Some(Arc::new(open_sink(config)?)),
                relay_sink,
                handlers,
            ))
            .await
        }
        Command::Recover => {
            if !config.relays_outbox() {
                anyhow::bail!(
                    "this config runs no outbox relay (no [outbox] or sink section): recover \
                     restarts the relay's log position, and there is none"
                );
            }
            recover(config, connector, &open_sink(config)?).await
        }
        Command::Admin {
            table: TableKind::Outbox,
            command,
            format,
        } => {
            if !config.relays_outbox() {
                anyhow::bail!(
                    "this config runs no outbox relay (no [outbox] or [kafka] section): \
                     add --inbox to act on the inbox table"
                );
            }
            if config.outbox.rows() == RowLifecycle::Deleted {
                anyhow::bail!(
                    "outbox.rows = \"deleted\": the outbox rows carry no status, so there is \
                     nothing for status, retry, park, resolve or janitor to act on; \
                     `outboxd_*` metrics and the log show what the relay does"
                );
            }
            // Row ids are per table: an operator command acts on one (the CLI narrows the
            // config to the table `--table` names, `Config::for_outbox_table`).
            if config.outbox.layout().has_several_tables() {
                config.for_outbox_table(None).map_err(anyhow::Error::msg)?;
            }
            let store = connector.open_store().await?;
            let context = AdminContext {
                pipeline: config.pipeline.name.clone(),
                table: config.outbox.layout().outbox_table().to_owned(),
                dedupe_window: None,
            };
            admin::run(&store, &context, &command, format).await
        }
        Command::Admin {
            table: TableKind::Inbox,
            command,
            format,
        } => {
            let store = connector.open_inbox().await?;
            let window = (config.inbox.as_ref())
                .map_or_else(crate::inbox::config::default_retention, |i| {
                    i.dedupe_retention
                });
            let context = AdminContext {
                pipeline: config.pipeline.name.clone(),
                table: config.outbox.layout().inbox_table,
                dedupe_window: Some(window),
            };
            admin::run(&store, &context, &command, format).await
        }
    }
}

/// The one place the sink is chosen: `[http]` or `[kafka]`.
fn open_sink(config: &Config) -> Result<AnySink, anyhow::Error> {
    match &config.http {
        Some(http) => {
            let strict = config.pipeline.ordering == crate::config::Ordering::Strict;
            let tables = config.outbox.layout().outbox_tables;
            HttpSink::new(http, &config.pipeline.name, strict, &tables)
                .map(AnySink::Http)
                .map_err(anyhow::Error::msg)
        }
        None => open_kafka(config).map(AnySink::Kafka),
    }
}

fn open_kafka(config: &Config) -> Result<KafkaSink, anyhow::Error> {
    let strict = config.pipeline.ordering == crate::config::Ordering::Strict;
    KafkaSink::new(
        &config.kafka,
        &config.pipeline.name,
        strict,
        config.delivery.max_in_flight_bytes,
    )
    .and_then(|sink| sink.for_tables(&config.outbox.layout().outbox_tables))
    .map_err(anyhow::Error::msg)
}

fn read_mode(config: &Config) -> ReadMode {
    match config.source.mode {
        SourceMode::Log => ReadMode::Log,
        SourceMode::Poll => ReadMode::Poll,
    }
}

async fn check<C: Connector>(config: &Config, connector: &C) -> anyhow::Result<i32> {
    let mut report = vec![CheckLine::ok("config", "valid")];
    report.extend(
        (config.warnings.iter()).map(|w| CheckLine::warn("config file", &w.message, &w.fix)),
    );
    report.extend(connector.check(read_mode(config)).await);
    if config.inbox.is_some() {
        report.push(match connector.open_inbox().await {
            Ok(_) => CheckLine::ok("inbox table", &config.outbox.inbox_table),
            Err(e) => CheckLine::fail("inbox table", e.to_string(), "run `outboxd init`"),
        });
    }
    if !config.relays_outbox() {
        return print_report(&report);
    }
    match open_sink(config) {
        Ok(sink) => {
            report.push(sink.check(Duration::from_secs(5)).await);
            if !config.sends_to_kafka() {
                return print_report(&report);
            }
            report.push(crate::sink::kafka::security_line(&config.kafka.options));
            if config.delivery.exactly_once {
                report.push(
                    crate::sink::kafka::exactly_once_line(&config.kafka, &config.pipeline.name)
                        .await,
                );
            }
        }
        Err(e) => report.push(CheckLine::fail(
            if config.sends_to_kafka() {
                "kafka"
            } else {
                "http"
            },
            e.to_string(),
            "fix the sink's section ([kafka] or [http])",
        )),
    }
    print_report(&report)
}

/// Prints `check`'s lines and a verdict; 1 when a line failed.
fn print_report(report: &[CheckLine]) -> anyhow::Result<i32> {
    for line in report {
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

/// `shared_sink` is the endpoint's too: its routes own (a share of) what they use.
async fn run<C: Connector + Clone + 'static, S: Sink + 'static>(
    config: &Config,
    connector: &C,
    shared_sink: Option<Arc<S>>,
    relay_sink: Option<S>,
    custom_handlers: Handlers,
) -> anyhow::Result<i32> {
    let stats = Arc::new(PipelineStats::default());
    let metrics = config.metrics.clone().unwrap_or_default();
    stats.metrics.limit_topic_series(metrics.max_topic_series);
    let (stop, shutdown) = watch::channel(false);
    let stop = Arc::new(stop);
    if let Some(canary) = config.canary.as_ref().filter(|_| shared_sink.is_some()) {
        stats.canary.enable(canary.clone());
    }
    let canary_shutdown = shutdown.clone();
    tokio::spawn(stop_on_signals(Arc::clone(&stop)));
    // When one half fails for good, the other half stops too.
    let stop_on_error = |result: Result<(), PipelineError>| {
        if result.is_err() {
            stop.send_replace(true);
        }
        result
    };

    let strict = config.pipeline.ordering == KeyOrdering::Strict;
    let (keys_tx, keys_rx) = mpsc::unbounded_channel();
    let wake = Arc::new(Notify::new());
    let listener = match &config.metrics {
        Some(metrics) => {
            let listener = observability::bind(metrics.listen)
                .await
                .map_err(anyhow::Error::msg)?;
            tracing::info!(listen = %metrics.listen, "serving /metrics, /healthz and /readyz");
            Some(listener)
        }
        None => None,
    };
    let relay_sink = relay_sink.map(Arc::new);
    let health = Arc::new(
        observability::Health::new(Arc::clone(&stats), shared_sink.clone(), connector.clone())
            .with_relay_sink(relay_sink.clone())
            .sink_gates_readiness(config.sends_to_kafka()),
    );
    let inbox_shutdown = shutdown.clone();
    let outbox = async {
        // Present exactly when the relay runs (see `execute_with`).
        let Some(sink) = shared_sink.as_deref() else {
            return Ok(());
        };
        match config.source.mode {
            SourceMode::Log => {
                let settings = PipelineSettings {
                    delivery: config.delivery.clone(),
                    retry: config.retry.clone(),
                    ordering: config.pipeline.ordering,
                    stall_warning: config.sink_timeout(),
                    stuck_after: relay::stuck_after(config.sink_timeout()),
                    rows: config.outbox.rows(),
                };
                let worker_settings = WorkerSettings {
                    retry: config.retry.clone(),
                    scope: ClaimScope::DueFailed,
                    batch_size: config.retry.batch_size,
                    // Unset: sleep until woken where the engine can notify, else poll.
                    idle_check: config.retry.idle_check.or(if connector.notifies_retries() {
                        None
                    } else {
                        Some(DEFAULT_IDLE_CHECK)
                    }),
                    strict_order: strict,
                    delivery_timeout: config.sink_timeout(),
                    store_timeout: config.delivery.store_timeout,
                };
                let mut link = RetryLink {
                    wake_worker: Arc::clone(&wake),
                    delivered_keys: keys_rx,
                };
                let log_shutdown = shutdown.clone();
                let log = async {
                    let shutdown = log_shutdown;
                    stop_on_error(
                        relay::run(
                            connector,
                            relay_sink.as_deref().unwrap_or(sink),
                            &settings,
                            &stats,
                            &mut link,
                            shutdown,
                        )
                        .await,
                    )
                };
                if config.outbox.rows() == RowLifecycle::Deleted {
                    // No row to retry or reap: the log relay is all there is.
                    drop((wake, keys_tx));
                    return log.await;
                }
                let notified = Arc::clone(&wake);
                let notifications = watch_retries(connector, &notified, shutdown.clone());
                let retries = async {
                    stop_on_error(
                        run_worker(
                            connector,
                            sink,
                            worker_settings,
                            &stats,
                            wake,
                            keys_tx,
                            shutdown,
                        )
                        .await,
                    )
                };
                let (log, retries, ()) = tokio::join!(log, retries, notifications);
                log.and(retries)
            }
            SourceMode::Poll => {
                tracing::info!(interval = ?config.poll.interval, "poll mode: claiming INIT and due FAILED rows");
                let worker_settings = WorkerSettings {
                    retry: config.retry.clone(),
                    scope: ClaimScope::NewAndDueFailed,
                    batch_size: config.poll.batch_size,
                    idle_check: Some(config.poll.interval),
                    strict_order: strict,
                    delivery_timeout: config.sink_timeout(),
                    store_timeout: config.delivery.store_timeout,
                };
                run_worker(
                    connector,
                    sink,
                    worker_settings,
                    &stats,
                    wake,
                    keys_tx,
                    shutdown,
                )
                .await
            }
        }
    };
    // The inbox, when configured: its HTTP route joins the endpoint, its workers and
    // Kafka ingress run beside the relay, and a definite failure of either stops both.
    let mut router = observability::router(Arc::clone(&health));

    let inbox = match &config.inbox {
        Some(inbox) => {
            let handlers = Handlers::from_config(&inbox.handlers)
                .map_err(anyhow::Error::msg)?
                .merged(custom_handlers);
            if handlers.longest_timeout() >= inbox.claim_timeout {
                anyhow::bail!(
                    "inbox.claim_timeout ({:?}) must be longer than the longest handler call \
                     ({:?}): otherwise the reaper hands a message to another worker while it is \
                     still being handled",
                    inbox.claim_timeout,
                    handlers.longest_timeout()
                );
            }
            if handlers.is_empty() {
                anyhow::bail!(
                    "[inbox] has no handler: add [inbox.handlers.default] (kind = \"webhook\" or \"sql\") or one per message type"
                );
            }
            let inbox_stats = Arc::new(InboxStats::default());
            let _ = stats.inbox.set(Arc::clone(&inbox_stats));
            let ingest = Arc::new(Ingest::new(connector.clone(), inbox_stats));
            if let Some(http) = &inbox.http {
                let routes =
                    inbox::http::routes(Arc::clone(&ingest), http).map_err(anyhow::Error::msg)?;
                router = router.merge(routes);
                tracing::info!("serving POST /v1/inbox/{{source}}");
            }
            Some((ingest, handlers))
        }
        None => None,
    };
    if !config.relays_outbox() {
        // No log session to wait for and no sink to reach: /readyz answers ready while
        // the inbox runs (a definite failure of the inbox stops the process).
        stats
            .streaming
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let inbox_work = async {
        let Some((ingest, handlers)) = &inbox else {
            return Ok(());
        };
        let result = inbox::run(connector, ingest, handlers, config, inbox_shutdown)
            .await
            .map_err(PipelineError::from);
        stop_on_error(result)
    };
    let canary = crate::canary::run(
        connector,
        &stats.canary,
        &stats.streaming,
        &config.pipeline.name,
        config.delivery.store_timeout,
        canary_shutdown,
    );
    let work = async {
        let (outbox, inbox, ()) =
            tokio::join!(Box::pin(outbox), Box::pin(inbox_work), Box::pin(canary));
        outbox.and(inbox)
    };
    // The endpoint answers while the pipeline runs, drain included.
    let token = config.metrics.as_ref().and_then(|m| m.bearer_token.clone());
    let mut router = observability::require_bearer(router, token);
    // Merged after the bearer layer, which so never covers it: the console signs its
    // operators in itself (a browser cannot send the bearer header).
    if let Some(console) = &config.console {
        let Some(token) = console.token.clone() else {
            anyhow::bail!("[console] needs its own credential: set console.token_file");
        };
        let outbox_table = config.relays_outbox() && config.outbox.layout().tracks_status();
        let setup = crate::console::ConsoleSetup {
            pipeline: config.pipeline.name.clone(),
            relays_outbox: config.relays_outbox(),
            outbox_table,
            runs_inbox: config.inbox.is_some(),
            strict_order: strict,
            sink: if config.sends_to_kafka() {
                "Kafka"
            } else {
                "HTTP"
            },
            token,
            config: console.clone(),
        };
        router = router.merge(crate::console::routes(
            setup,
            Arc::clone(&health),
            Arc::clone(&stats),
            connector.clone(),
        ));
        tracing::info!("serving the operator console at /ui");
    }
    let result = observability::serve_while(listener, router, work).await;
    if let Some(sink) = &shared_sink {
        sink.flush(Duration::from_secs(5)).await;
    }
    result?;
    tracing::info!(
        published = stats.published.load(std::sync::atomic::Ordering::Relaxed),
        retried = stats.retried.load(std::sync::atomic::Ordering::Relaxed),
        failed = stats.failed.load(std::sync::atomic::Ordering::Relaxed),
        parked = stats.parked.load(std::sync::atomic::Ordering::Relaxed),
        "stopped cleanly"
    );
    Ok(0)
}

/// First SIGTERM/SIGINT: graceful stop (drain, write back, checkpoint). Second: exit now.
async fn stop_on_signals(stop: Arc<watch::Sender<bool>>) {
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
    stop.send_replace(true);
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::warn!("second signal: exiting without draining");
    std::process::exit(130);
}
