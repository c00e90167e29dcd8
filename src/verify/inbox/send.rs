//! The sender `verify --inbox` plays: signed Standard Webhooks POSTs to the inbox's HTTP
//! ingress, in order at the rate, some twice, each tried again until it is answered 200
//! (as a sender does while the inbox is down), with the spawned inbox killed meanwhile
//! under `--faults kill`.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use rand::rngs::StdRng;
use rand::Rng;

use super::Message;
use crate::verify::relay_child::RelayChild;
use crate::verify::{Interrupt, VerifyOptions};

/// One request waits at most this long for its answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(15);

/// Where and how to post.
pub(super) struct Ingress {
    /// `http://<metrics.listen>/v1/inbox/<source>`.
    pub(super) url: String,
    /// The run's signing secret.
    pub(super) secret: String,
    /// `metrics.bearer_token`, which guards the endpoint's every route but `/healthz`.
    pub(super) bearer: Option<String>,
}

/// What sending found.
pub(super) struct Sent {
    /// Per message, when it was first answered 200 (None: never).
    pub(super) acknowledged: Vec<Option<Instant>>,
    /// Requests sent, redeliveries and tries after no answer included.
    pub(super) requests: u64,
    /// Redeliveries answered `"duplicate": true`.
    pub(super) duplicates_acknowledged: u64,
    /// POST → 200 of each message's first acknowledgement, in milliseconds.
    pub(super) ack_ms: Vec<f64>,
}

/// Posts every message, in order, at the rate, trying each again until it is answered
/// (the child may be down: killed, or starting); about one in five is posted again right
/// after (a sender's redelivery).
pub(super) async fn send(
    ingress: &Ingress,
    messages: &[Message],
    options: &VerifyOptions,
    relay: &mut RelayChild,
    rng: &mut StdRng,
    interrupt: &Interrupt,
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
    let kill_every = options.kill_every;
    let next_kill = |rng: &mut StdRng| Instant::now() + kill_every.mul_f64(rng.gen_range(0.5..1.5));
    let mut kill_at = next_kill(rng);
    let give_up = Instant::now() + options.duration + options.drain_timeout;
    let redeliver: Vec<bool> = (0..messages.len())
        .map(|_| rng.gen_range(0..5) == 0)
        .collect();
    for (index, message) in messages.iter().enumerate() {
        tick.tick().await;
        if options.kill_faults && Instant::now() >= kill_at {
            relay.kill_and_restart().await.map_err(|e| anyhow!(e))?;
            kill_at = next_kill(rng);
        }
        let copies = if redeliver[index] { 2 } else { 1 };
        for copy in 0..copies {
            loop {
                if Instant::now() >= give_up || interrupt.is_set() {
                    return Ok(sent);
                }
                if let Some(status) = relay.exited() {
                    bail!(
                        "the inbox verify started exited by itself ({status}); its log {}:\n{}",
                        relay.log().display(),
                        relay.log_tail(20)
                    );
                }
                sent.requests += 1;
                let posted = Instant::now();
                match post(&client, ingress, message).await? {
                    Answer::Stored { duplicate } => {
                        if sent.acknowledged[index].is_none() {
                            sent.acknowledged[index] = Some(Instant::now());
                            sent.ack_ms.push(posted.elapsed().as_secs_f64() * 1000.0);
                        }
                        if duplicate && copy > 0 {
                            sent.duplicates_acknowledged += 1;
                        }
                        break;
                    }
                    Answer::Refused(status, body) => bail!(
                        "the inbox refused message {} with {status}: {body}",
                        message.message_id
                    ),
                    // Down (killed, starting) or busy: the sender tries again.
                    Answer::Unavailable => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
    }
    Ok(sent)
}

enum Answer {
    Stored {
        duplicate: bool,
    },
    Refused(u16, String),
    /// No connection, no answer in time, or 503: tried again.
    Unavailable,
}

/// One POST. An error only for what trying again cannot change (a request that cannot be
/// built or signed).
async fn post(
    client: &Client<HttpConnector, Full<Bytes>>,
    ingress: &Ingress,
    message: &Message,
) -> anyhow::Result<Answer> {
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let signature = crate::webhooks::signature::sign(
        &ingress.secret,
        &message.message_id,
        timestamp,
        message.body.as_bytes(),
    )
    .map_err(|e| anyhow!("cannot sign: {e}"))?;
    let mut request = hyper::Request::post(&ingress.url)
        .header("content-type", "application/json")
        .header("webhook-id", &message.message_id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature);
    if let Some(token) = &ingress.bearer {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request
        .body(Full::new(Bytes::from(message.body.clone())))
        .map_err(|e| anyhow!("cannot make the request to {}: {e}", ingress.url))?;
    let Ok(Ok(response)) = tokio::time::timeout(ANSWER_TIMEOUT, client.request(request)).await
    else {
        return Ok(Answer::Unavailable);
    };
    let status = response.status().as_u16();
    let Ok(Ok(body)) = tokio::time::timeout(ANSWER_TIMEOUT, response.into_body().collect()).await
    else {
        return Ok(Answer::Unavailable);
    };
    let body = body.to_bytes();
    Ok(match status {
        200 => {
            let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            Answer::Stored {
                duplicate: answer["duplicate"] == serde_json::Value::Bool(true),
            }
        }
        503 => Answer::Unavailable,
        _ => Answer::Refused(
            status,
            String::from_utf8_lossy(&body).chars().take(300).collect(),
        ),
    })
}
