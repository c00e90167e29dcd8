//! `outboxd verify --inbox --spawn`: the inbox half, end to end. verify runs the inbox as
//! its own child, with the config file plus a source and handlers of its own (a copy of
//! the file, mode 0600, deleted at the end): the source `--source` signs with a secret made
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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use outboxd_connector::{Connector, InboxStore, OwnMessageState};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::relay_child::RelayChild;
use super::VerifyOptions;
use crate::config::Config;

/// Rows read back or deleted per statement.
const ROWS_PER_STATEMENT: usize = 500;

/// One message of the run.
#[derive(Clone, Debug)]
struct Message {
    key: u32,
    message_id: String,
    body: String,
}

/// What the checks found.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct InboxFindings {
    pub(crate) messages: u64,
    /// Requests sent, redeliveries and retries after a refusal included.
    pub(crate) requests: u64,
    /// Redeliveries the ingress answered `"duplicate": true`.
    pub(crate) duplicates_acknowledged: u64,
    /// Messages never acknowledged with 200.
    pub(crate) unacknowledged: u64,
    /// Acknowledged messages with no row.
    pub(crate) lost: u64,
    pub(crate) lost_examples: Vec<String>,
    /// Rows not DONE by the end.
    pub(crate) not_done: u64,
    pub(crate) not_done_examples: Vec<String>,
    /// Messages whose effect is missing, or there more than once.
    pub(crate) effects_missing: u64,
    pub(crate) effects_repeated: u64,
    /// Effects of a key out of the order its messages were acknowledged.
    pub(crate) order_violations: u64,
    pub(crate) order_examples: Vec<String>,
    /// POST → 200, in milliseconds (the message is durably stored when it is answered).
    pub(crate) ack_p50_ms: f64,
    pub(crate) ack_p99_ms: f64,
    pub(crate) failures: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
struct InboxReport {
    passed: bool,
    run: String,
    seed: u64,
    source: String,
    ingress: String,
    relay: String,
    relay_log: PathBuf,
    wrote_seconds: f64,
    cleanup: String,
    findings: InboxFindings,
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
    let listen = (config.metrics.as_ref()).map(|m| m.listen).ok_or_else(|| {
        anyhow!("the inbox's HTTP ingress is served on metrics.listen: add [metrics] listen")
    })?;
    let seed = options.seed.unwrap_or_else(|| rand::thread_rng().gen());
    let mut rng = StdRng::seed_from_u64(seed);
    let run = format!("{:08x}", rng.gen::<u32>());
    let source = options.source.clone();
    let secret = format!("whsec_{}", STANDARD.encode(rng.gen::<[u8; 24]>()));
    let messages = plan(&run, options, &mut rng);
    let types = messages.iter().map(|m| m.1).max().map_or(0, |n| n + 1);
    let messages: Vec<Message> = messages.into_iter().map(|(m, _)| m).collect();

    let store = connector
        .open_inbox()
        .await
        .context("verify cannot open the inbox table")?;
    let scratch = format!("outboxd_verify_{run}");
    let statement = store
        .create_scratch_table(&scratch)
        .await
        .context("verify --inbox cannot create its scratch table")?;
    let child_config = std::env::temp_dir().join(format!("outboxd-verify-{run}.toml"));
    let result = async {
        write_child_config(
            &options.config_path,
            &child_config,
            &source,
            &secret,
            &options.message_type,
            types,
            &statement,
        )?;
        let log = std::env::temp_dir().join(format!("outboxd-verify-{run}.log"));
        let mut relay = RelayChild::start(&child_config, log).map_err(|e| anyhow!(e))?;
        let host = match listen.ip().is_unspecified() {
            true => "127.0.0.1".to_owned(),
            false => listen.ip().to_string(),
        };
        let host = if listen.is_ipv6() && !listen.ip().is_unspecified() {
            format!("[{host}]")
        } else {
            host
        };
        let ingress = format!("http://{host}:{}/v1/inbox/{source}", listen.port());
        let started = Instant::now();
        let sent = send(&ingress, &secret, &messages, options, &mut relay, &mut rng).await;
        let wrote_for = started.elapsed();
        let ids: Vec<String> = messages.iter().map(|m| m.message_id.clone()).collect();
        let rows = match &sent {
            Ok(_) => wait_until_done(&store, &source, &ids, options).await,
            Err(_) => Ok(HashMap::new()),
        };
        let effects = store.scratch_rows(&scratch).await;
        let relay_text = match options.kill_faults {
            true => format!("spawned, killed {} time(s) with SIGKILL", relay.kills),
            false => "spawned".to_owned(),
        };
        let relay_log = relay.log().to_owned();
        relay.stop().await;
        let sent = sent?;
        let findings = check(&messages, &sent, &rows?, &effects?);
        Ok::<_, anyhow::Error>((findings, ingress, relay_text, relay_log, wrote_for))
    }
    .await;

    // Clean up whatever happened.
    let ids: Vec<String> = messages.iter().map(|m| m.message_id.clone()).collect();
    let mut cleanup = Vec::new();
    if options.keep_rows {
        cleanup.push(format!("rows and table {scratch} kept"));
    } else {
        let mut deleted = 0;
        for chunk in ids.chunks(ROWS_PER_STATEMENT) {
            match store.delete_own_messages(&source, chunk).await {
                Ok(n) => deleted += n,
                Err(e) => cleanup.push(format!("rows not all deleted: {e}")),
            }
        }
        cleanup.push(format!("{deleted} rows deleted"));
        match store.drop_scratch_table(&scratch).await {
            Ok(()) => cleanup.push(format!("table {scratch} dropped")),
            Err(e) => cleanup.push(format!("table {scratch} not dropped: {e}")),
        }
    }
    let _ = std::fs::remove_file(&child_config);
    let (findings, ingress, relay, relay_log, wrote_for) = result?;

    let report = InboxReport {
        passed: findings.failures.is_empty(),
        run,
        seed,
        source,
        ingress,
        relay,
        relay_log,
        wrote_seconds: super::check::seconds(wrote_for),
        cleanup: cleanup.join("; "),
        findings,
    };
    if options.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.text());
    }
    Ok(if report.passed { 0 } else { 1 })
}

/// The run's messages, each with its type number (its key's count so far).
fn plan(run: &str, options: &VerifyOptions, rng: &mut StdRng) -> Vec<(Message, u32)> {
    let total = (options.duration.as_secs_f64() * f64::from(options.rate)).ceil() as u64;
    let keys = options.keys.max(1);
    let mut per_key = vec![0u32; keys as usize];
    (0..total.max(1))
        .map(|index| {
            let key = rng.gen_range(0..keys);
            let n = per_key[key as usize];
            per_key[key as usize] += 1;
            let message_id = format!("outboxd-verify-{run}-{index}");
            let body = format!(
                r#"{{"type":"{}.{n}","key":"k{key}","id":"{message_id}","verify":"outboxd verify run {run}"}}"#,
                options.message_type
            );
            (
                Message {
                    key,
                    message_id,
                    body,
                },
                n,
            )
        })
        .collect()
}

/// The config file with the run's source and handlers added, written to `to` (0600: it
/// holds whatever secrets the file holds).
fn write_child_config(
    from: &Path,
    to: &Path,
    source: &str,
    secret: &str,
    prefix: &str,
    types: u32,
    statement: &str,
) -> anyhow::Result<()> {
    use toml::{Table, Value};
    let text =
        std::fs::read_to_string(from).with_context(|| format!("cannot read {}", from.display()))?;
    let mut config: Table = text.parse().context("the config file is not TOML")?;
    fn table<'a>(parent: &'a mut Table, key: &str) -> anyhow::Result<&'a mut Table> {
        parent
            .entry(key)
            .or_insert_with(|| Value::Table(Table::new()))
            .as_table_mut()
            .ok_or_else(|| anyhow!("`{key}` in the config file is not a table"))
    }
    let inbox = table(&mut config, "inbox")?;
    let http = table(inbox, "http")?;
    let secrets = table(http, "secrets")?;
    secrets.insert(
        source.into(),
        Value::Array(vec![Value::String(secret.into())]),
    );
    let sources = table(http, "sources")?;
    let mut own = Table::new();
    own.insert("key_field".into(), Value::String("key".into()));
    sources.insert(source.into(), Value::Table(own));
    let handlers = table(inbox, "handlers")?;
    for n in 0..types {
        let mut handler = Table::new();
        handler.insert("kind".into(), Value::String("sql".into()));
        handler.insert("statement".into(), Value::String(statement.into()));
        handler.insert(
            "sources".into(),
            Value::Array(vec![Value::String(source.into())]),
        );
        handlers.insert(format!("{prefix}.{n}"), Value::Table(handler));
    }
    let text = toml::to_string(&config).context("cannot write the child's config")?;
    Config::parse(&text).map_err(|e| anyhow!("the child's config is refused: {e}"))?;
    let mut file = std::fs::File::options();
    file.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut file, 0o600);
    let mut file = file
        .open(to)
        .with_context(|| format!("cannot write {}", to.display()))?;
    std::io::Write::write_all(&mut file, text.as_bytes())
        .with_context(|| format!("cannot write {}", to.display()))?;
    Ok(())
}

/// What sending found: per message, when it was first acknowledged (None: never).
struct Sent {
    acknowledged: Vec<Option<Instant>>,
    requests: u64,
    duplicates_acknowledged: u64,
    ack_ms: Vec<f64>,
}

/// Posts every message, in order, at the rate, retrying each until it is acknowledged
/// (the child may be down: killed, or starting); about one in five is posted again
/// right after (a sender's redelivery).
async fn send(
    ingress: &str,
    secret: &str,
    messages: &[Message],
    options: &VerifyOptions,
    relay: &mut RelayChild,
    rng: &mut StdRng,
) -> anyhow::Result<Sent> {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let mut sent = Sent {
        acknowledged: vec![None; messages.len()],
        requests: 0,
        duplicates_acknowledged: 0,
        ack_ms: Vec::new(),
    };
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(options.rate)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut kill_at = Instant::now() + options.kill_every;
    let give_up = Instant::now() + options.duration + options.drain_timeout;
    for (index, message) in messages.iter().enumerate() {
        tick.tick().await;
        if options.kill_faults && Instant::now() >= kill_at {
            relay.kill_and_restart().await.map_err(|e| anyhow!(e))?;
            kill_at = Instant::now() + options.kill_every.mul_f64(rng.gen_range(0.5..1.5));
        }
        let copies = if rng.gen_range(0..5) == 0 { 2 } else { 1 };
        for copy in 0..copies {
            loop {
                if let Some(status) = relay.exited() {
                    bail!(
                        "the inbox verify started exited by itself ({status}); its log {}:\n{}",
                        relay.log().display(),
                        relay.log_tail(20)
                    );
                }
                if Instant::now() >= give_up {
                    return Ok(sent);
                }
                sent.requests += 1;
                let posted = Instant::now();
                match post(&client, ingress, secret, message).await {
                    Ok(Answer::Stored { duplicate }) => {
                        if sent.acknowledged[index].is_none() {
                            sent.acknowledged[index] = Some(Instant::now());
                            sent.ack_ms.push(posted.elapsed().as_secs_f64() * 1000.0);
                        }
                        if duplicate && copy > 0 {
                            sent.duplicates_acknowledged += 1;
                        }
                        break;
                    }
                    Ok(Answer::Refused(status, body)) => bail!(
                        "the inbox refused message {} with {status}: {body}",
                        message.message_id
                    ),
                    // Down (killed, starting) or busy: the sender tries again.
                    Ok(Answer::Unavailable) | Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
    }
    Ok(sent)
}

enum Answer {
    Stored { duplicate: bool },
    Refused(u16, String),
    Unavailable,
}

async fn post(
    client: &Client<HttpConnector, Full<Bytes>>,
    ingress: &str,
    secret: &str,
    message: &Message,
) -> Result<Answer, String> {
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let signature = crate::webhooks::signature::sign(
        secret,
        &message.message_id,
        timestamp,
        message.body.as_bytes(),
    )?;
    let request = hyper::Request::post(ingress)
        .header("content-type", "application/json")
        .header("webhook-id", &message.message_id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(Full::new(Bytes::from(message.body.clone())))
        .map_err(|e| e.to_string())?;
    let response = tokio::time::timeout(Duration::from_secs(15), client.request(request))
        .await
        .map_err(|_| "no answer in 15 s".to_owned())?
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = tokio::time::timeout(Duration::from_secs(15), response.into_body().collect())
        .await
        .map_err(|_| "no body in 15 s".to_owned())?
        .map_err(|e| e.to_string())?
        .to_bytes();
    let text = String::from_utf8_lossy(&body).into_owned();
    Ok(match status {
        200 => Answer::Stored {
            duplicate: text.contains("\"duplicate\":true") || text.contains("\"duplicate\": true"),
        },
        503 => Answer::Unavailable,
        _ => Answer::Refused(status, text.chars().take(300).collect()),
    })
}

/// Polls the rows until every message's row is DONE, or the drain timeout.
async fn wait_until_done<S: InboxStore>(
    store: &S,
    source: &str,
    ids: &[String],
    options: &VerifyOptions,
) -> anyhow::Result<HashMap<String, OwnMessageState>> {
    let deadline = Instant::now() + options.drain_timeout;
    loop {
        let mut rows = HashMap::with_capacity(ids.len());
        for chunk in ids.chunks(ROWS_PER_STATEMENT) {
            let states = (store.own_messages(source, chunk).await)
                .context("verify cannot read its inbox rows back")?;
            rows.extend(states.into_iter().map(|s| (s.message_id.clone(), s)));
        }
        let done = rows.len() == ids.len() && rows.values().all(|r| r.status == "DONE");
        if done || Instant::now() >= deadline {
            return Ok(rows);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn check(
    messages: &[Message],
    sent: &Sent,
    rows: &HashMap<String, OwnMessageState>,
    effects: &[(String, String)],
) -> InboxFindings {
    let mut f = InboxFindings {
        messages: messages.len() as u64,
        requests: sent.requests,
        duplicates_acknowledged: sent.duplicates_acknowledged,
        ..InboxFindings::default()
    };
    let mut effect_count: HashMap<&str, u64> = HashMap::new();
    for (message_id, _) in effects {
        *effect_count.entry(message_id.as_str()).or_default() += 1;
    }
    let index_of: HashMap<&str, usize> = (messages.iter().enumerate())
        .map(|(i, m)| (m.message_id.as_str(), i))
        .collect();
    for (i, message) in messages.iter().enumerate() {
        let Some(_) = sent.acknowledged[i] else {
            f.unacknowledged += 1;
            continue;
        };
        match rows.get(&message.message_id) {
            None => {
                f.lost += 1;
                if f.lost_examples.len() < 5 {
                    f.lost_examples.push(message.message_id.clone());
                }
                continue;
            }
            Some(row) if row.status != "DONE" => {
                f.not_done += 1;
                if f.not_done_examples.len() < 5 {
                    f.not_done_examples.push(format!(
                        "{}: {} (retry_count {})",
                        row.message_id, row.status, row.retry_count
                    ));
                }
            }
            Some(_) => {}
        }
        match effect_count
            .get(message.message_id.as_str())
            .copied()
            .unwrap_or(0)
        {
            0 => f.effects_missing += 1,
            1 => {}
            _ => f.effects_repeated += 1,
        }
    }
    // Per key, effects in the order the messages were acknowledged (= stored, = index).
    // A repeated effect is counted above, not again here: only each one's first.
    let mut highest: HashMap<u32, usize> = HashMap::new();
    let mut first_seen = std::collections::HashSet::new();
    for (message_id, _) in effects {
        let Some(&i) = index_of.get(message_id.as_str()) else {
            continue;
        };
        if !first_seen.insert(i) {
            continue;
        }
        let key = messages[i].key;
        let top = highest.entry(key).or_insert(i);
        if i < *top {
            f.order_violations += 1;
            if f.order_examples.len() < 5 {
                f.order_examples.push(format!(
                    "key k{key}: message {i} handled after message {top}"
                ));
            }
        } else {
            *top = i;
        }
    }
    let mut ack = sent.ack_ms.clone();
    ack.sort_by(f64::total_cmp);
    let at = |q: f64| {
        ack.get(((ack.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
    };
    f.ack_p50_ms = at(0.5).unwrap_or(0.0);
    f.ack_p99_ms = at(0.99).unwrap_or(0.0);

    let mut failures = Vec::new();
    let mut fail = |n: u64, what: &str| {
        if n > 0 {
            failures.push(format!("{n} {what}"));
        }
    };
    fail(f.unacknowledged, "message(s) never acknowledged");
    fail(f.lost, "acknowledged message(s) with no row");
    fail(f.not_done, "row(s) not DONE");
    fail(f.effects_missing, "message(s) without their effect");
    fail(
        f.effects_repeated,
        "message(s) whose effect happened more than once",
    );
    fail(f.order_violations, "effect(s) out of their key's order");
    f.failures = failures;
    f
}

impl InboxReport {
    fn text(&self) -> String {
        let f = &self.findings;
        let mut lines = vec![
            format!(
                "outboxd verify --inbox: run {} (seed {}), source {} at {}",
                self.run, self.seed, self.source, self.ingress
            ),
            format!("  inbox       {}", self.relay),
            format!("  inbox log   {}", self.relay_log.display()),
            format!(
                "  sent        {} messages in {} s, {} requests ({} redeliveries answered duplicate)",
                f.messages, self.wrote_seconds, f.requests, f.duplicates_acknowledged
            ),
            format!(
                "  stored      {} never acknowledged, {} acknowledged without a row, {} not DONE",
                f.unacknowledged, f.lost, f.not_done
            ),
        ];
        lines.extend(
            f.lost_examples
                .iter()
                .map(|id| format!("    lost      {id}")),
        );
        lines.extend(f.not_done_examples.iter().map(|e| format!("    {e}")));
        lines.push(format!(
            "  effects     {} missing, {} more than once",
            f.effects_missing, f.effects_repeated
        ));
        lines.push(format!(
            "  order       {} effect(s) out of their key's order",
            f.order_violations
        ));
        lines.extend(f.order_examples.iter().map(|e| format!("    {e}")));
        lines.push(format!(
            "  latency     POST → 200 (stored) p50 {:.1} ms, p99 {:.1} ms",
            f.ack_p50_ms, f.ack_p99_ms
        ));
        lines.push(format!("  cleanup     {}", self.cleanup));
        lines.push(match self.passed {
            true => "PASSED".into(),
            false => format!("FAILED: {}", f.failures.join("; ")),
        });
        lines.join("\n") + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Run = (
        Vec<Message>,
        Sent,
        HashMap<String, OwnMessageState>,
        Vec<(String, String)>,
    );

    /// Six messages over keys 0 and 1 (message i on key i % 2), all acknowledged, DONE,
    /// each effect once in order.
    fn healthy() -> Run {
        let messages: Vec<Message> = (0..6)
            .map(|i| Message {
                key: i % 2,
                message_id: format!("m{i}"),
                body: String::new(),
            })
            .collect();
        let sent = Sent {
            acknowledged: vec![Some(Instant::now()); 6],
            requests: 7,
            duplicates_acknowledged: 1,
            ack_ms: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        };
        let rows = (messages.iter())
            .map(|m| {
                let state = OwnMessageState {
                    message_id: m.message_id.clone(),
                    status: "DONE".into(),
                    retry_count: 0,
                };
                (m.message_id.clone(), state)
            })
            .collect();
        let effects = (messages.iter())
            .map(|m| (m.message_id.clone(), format!("k{}", m.key)))
            .collect();
        (messages, sent, rows, effects)
    }

    #[test]
    fn a_healthy_inbox_passes() {
        let (messages, sent, rows, effects) = healthy();
        let f = check(&messages, &sent, &rows, &effects);
        assert!(f.failures.is_empty(), "{:?}", f.failures);
        assert_eq!((f.messages, f.requests, f.duplicates_acknowledged), (6, 7, 1));
    }

    #[test]
    fn an_effect_twice_a_missing_one_and_a_swapped_pair_are_each_counted() {
        let (messages, sent, mut rows, mut effects) = healthy();
        effects.push(("m1".into(), "k1".into())); // handled twice
        effects.retain(|(id, _)| id != "m5"); // never handled
        effects.swap(0, 2); // m2 before m0, both of key 0
        rows.get_mut("m3").unwrap().status = "MANUAL_REQUIRED".into();
        rows.remove("m4");
        let f = check(&messages, &sent, &rows, &effects);
        assert_eq!(
            (f.effects_repeated, f.effects_missing, f.order_violations, f.not_done, f.lost),
            (1, 1, 1, 1, 1)
        );
        assert_eq!(f.order_examples, ["key k0: message 0 handled after message 2"]);
        assert_eq!(f.failures.len(), 5, "{:?}", f.failures);
    }
}
