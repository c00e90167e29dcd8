//! `outboxd verify --inbox --spawn`: the inbox half, end to end. verify runs the inbox as
//! its own child, with the config file plus a source and handlers of its own (a copy of
//! the file, mode 0600, deleted at the end: [`child_config`]): the source `--source` signs with a secret made
//! for the run and keys messages by the body's `key`; each of its message types has a SQL
//! handler that inserts `(message_id, biz_key)` into a scratch table verify creates and
//! drops. Then it posts signed messages to the HTTP ingress at a rate, some of them twice
//! (a sender's redelivery) and after the child was killed (`--faults kill`), and checks:
//! every message stored once (one row each) and DONE, its effect in the scratch table
//! exactly once (the SQL handler runs in the transaction that marks the row DONE), and each
//! key's effects in the order its messages were first acknowledged.
//!
//! The inbox deduplicates by `(message_type, biz_key)` too, so a key's messages each have
//! a type of their own (`<prefix>.<n>`), and the child gets a handler for each.

mod check;
mod child_config;
mod send;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use outboxd_connector::{Connector, InboxStore, OwnMessageState};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use self::check::InboxReport;
use self::send::{Ingress, Sent};
use super::plan::{id_prefix, new_run_id};
use super::relay_child::RelayChild;
use super::{Interrupt, VerifyOptions, ROWS_PER_STATEMENT};
use crate::config::Config;

/// At most this many messages a run (`--rate` × `--duration`).
const MAX_MESSAGES: u64 = 1_000_000;

/// At most this many message types a run (a handler each in the child's config): a key's
/// messages each need one.
const MAX_TYPES: u32 = 10_000;

/// One message of the run.
#[derive(Clone, Debug)]
struct Message {
    key: u32,
    message_id: String,
    body: String,
}

/// Runs the inbox check; returns the exit code.
pub(crate) async fn run<C: Connector>(
    config: &Config,
    connector: &C,
    options: &VerifyOptions,
) -> anyhow::Result<i32> {
    if !options.spawn {
        bail!(
            "verify --inbox runs the inbox itself, with a source and handlers of its own: add \
             --spawn (and stop the running inbox of this config first)"
        );
    }
    if config.inbox.is_none() {
        bail!("this config has no [inbox]: verify --inbox checks the inbox");
    }
    let metrics = (config.metrics.as_ref()).ok_or_else(|| {
        anyhow!("the inbox's HTTP ingress is served on metrics.listen: add [metrics] listen")
    })?;
    let seed = options.seed.unwrap_or_else(|| rand::thread_rng().gen());
    let mut rng = StdRng::seed_from_u64(seed);
    let run = new_run_id();
    let source = options.source.clone();
    let secret = format!("whsec_{}", STANDARD.encode(rand::random::<[u8; 24]>()));
    let (messages, types) = plan(&run, options, &mut rng)?;

    let store = (connector.open_inbox().await).context("verify cannot open the inbox table")?;
    let scratch = format!("outboxd_verify_{run}");
    let statement = (store.create_scratch_table(&scratch).await)
        .context("verify --inbox cannot create its scratch table")?;
    let interrupt = Interrupt::listen()?;
    // From here on the scratch table exists: every path goes through the clean-up below.
    let result = async {
        let child_config = child_config::write_child_config(
            &options.config_path,
            &std::env::temp_dir().join(format!("outboxd-verify-{run}.toml")),
            &source,
            &secret,
            &options.message_type,
            types,
            &statement,
        )?;
        let log = std::env::temp_dir().join(format!("outboxd-verify-{run}.log"));
        let mut relay = RelayChild::start(child_config.path(), log).map_err(|e| anyhow!(e))?;
        let listen = metrics.listen;
        let host = match listen.ip() {
            std::net::IpAddr::V4(ip) if ip.is_unspecified() => "127.0.0.1".to_owned(),
            std::net::IpAddr::V6(ip) if ip.is_unspecified() => "[::1]".to_owned(),
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            ip => ip.to_string(),
        };
        let ingress = Ingress {
            url: format!("http://{host}:{}/v1/inbox/{source}", listen.port()),
            secret: secret.clone(),
            bearer: (metrics.bearer_token.as_ref()).map(|t| t.expose().to_owned()),
        };
        let started = Instant::now();
        let sent = send::send(
            &ingress, &messages, options, &mut relay, &mut rng, &interrupt,
        )
        .await;
        let wrote_for = started.elapsed();
        let rows = match &sent {
            Ok(sent) => {
                wait_until_done(&store, &source, &messages, sent, options, &interrupt).await
            }
            Err(_) => Ok(HashMap::new()),
        };
        let effects = store.scratch_rows(&scratch).await;
        let relay_text = match options.kill_faults {
            true => format!("spawned, killed {} time(s) with SIGKILL", relay.kills),
            false => "spawned".to_owned(),
        };
        let relay_log = relay.log().to_owned();
        relay.stop().await;
        drop(child_config);
        let sent = sent?;
        let findings = check::check(&messages, &sent, &rows?, &effects?);
        Ok::<_, anyhow::Error>((findings, ingress.url, relay_text, relay_log, wrote_for))
    }
    .await;

    let cleanup = cleanup(&store, options, &source, &messages, &scratch).await;
    if result.is_err() {
        // The error is printed by the caller; what was cleaned up (or is left) only here.
        eprintln!("verify: {cleanup}");
    }
    let (mut findings, ingress, relay, relay_log, wrote_for) = result?;
    if interrupt.is_set() {
        findings
            .failures
            .push("interrupted (Ctrl-C or SIGTERM): the run is incomplete".into());
    }
    let report = InboxReport {
        passed: findings.failures.is_empty(),
        run,
        seed,
        source,
        ingress,
        relay,
        relay_log,
        wrote_seconds: super::check::seconds(wrote_for),
        cleanup,
        findings,
    };
    Ok(super::print_report(
        options.json,
        &report,
        &report.text(),
        report.passed,
    ))
}

/// The run's messages, and how many message types they use (the most messages of one
/// key). A key's messages are typed `<prefix>.<n>` with `n` counting them: the inbox
/// keeps one message per type and key.
fn plan(
    run: &str,
    options: &VerifyOptions,
    rng: &mut StdRng,
) -> anyhow::Result<(Vec<Message>, u32)> {
    let total = (options.duration.as_secs_f64() * f64::from(options.rate)).ceil() as u64;
    if total > MAX_MESSAGES {
        bail!("--rate × --duration is {total} messages; at most {MAX_MESSAGES} a run");
    }
    let keys = options.keys;
    let prefix = id_prefix(run);
    let mut per_key = vec![0u32; keys as usize];
    let mut messages = Vec::with_capacity(total as usize);
    for index in 0..total.max(1) {
        let key = rng.gen_range(0..keys);
        let n = per_key[key as usize];
        per_key[key as usize] += 1;
        let message_id = format!("{prefix}{index}");
        // The run id in the key too: a key of an earlier run's leftover rows is another key.
        let body = format!(
            r#"{{"type":"{}.{n}","key":"{run}-k{key}","id":"{message_id}","verify":"outboxd verify run {run}"}}"#,
            options.message_type
        );
        messages.push(Message {
            key,
            message_id,
            body,
        });
    }
    let types = per_key.into_iter().max().unwrap_or(0);
    if types > MAX_TYPES {
        bail!(
            "{types} messages on one key need as many message types (a handler each); at most \
             {MAX_TYPES}: raise --keys or lower --rate × --duration"
        );
    }
    Ok((messages, types))
}

/// Polls the rows until every acknowledged message's row is DONE, or the drain timeout.
async fn wait_until_done<S: InboxStore>(
    store: &S,
    source: &str,
    messages: &[Message],
    sent: &Sent,
    options: &VerifyOptions,
    interrupt: &Interrupt,
) -> anyhow::Result<HashMap<String, OwnMessageState>> {
    let deadline = Instant::now() + options.drain_timeout;
    let ids: Vec<String> = messages.iter().map(|m| m.message_id.clone()).collect();
    let acknowledged: Vec<&str> = (messages.iter().zip(&sent.acknowledged))
        .filter(|(_, at)| at.is_some())
        .map(|(m, _)| m.message_id.as_str())
        .collect();
    loop {
        let mut rows = HashMap::with_capacity(ids.len());
        for chunk in ids.chunks(ROWS_PER_STATEMENT) {
            let states = (store.own_messages(source, chunk).await)
                .context("verify cannot read its inbox rows back")?;
            rows.extend(states.into_iter().map(|s| (s.message_id.clone(), s)));
        }
        let done = (acknowledged.iter()).all(|id| {
            rows.get(*id)
                .is_some_and(|r: &OwnMessageState| r.status == "DONE")
        });
        if done || Instant::now() >= deadline || interrupt.is_set() {
            return Ok(rows);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Deletes the run's rows and drops the scratch table (unless `--keep-rows`); says what
/// it did.
async fn cleanup<S: InboxStore>(
    store: &S,
    options: &VerifyOptions,
    source: &str,
    messages: &[Message],
    scratch: &str,
) -> String {
    if options.keep_rows {
        return format!("rows of source {source} and table {scratch} kept");
    }
    let ids: Vec<String> = messages.iter().map(|m| m.message_id.clone()).collect();
    let mut done = Vec::new();
    let mut deleted = 0;
    for chunk in ids.chunks(ROWS_PER_STATEMENT) {
        match store.delete_own_messages(source, chunk).await {
            Ok(n) => deleted += n,
            Err(e) => {
                done.push(format!("rows not all deleted: {e}"));
                break;
            }
        }
    }
    done.push(format!("{deleted} rows deleted"));
    match store.drop_scratch_table(scratch).await {
        Ok(()) => done.push(format!("table {scratch} dropped")),
        Err(e) => done.push(format!("table {scratch} not dropped: {e}")),
    }
    done.join("; ")
}
