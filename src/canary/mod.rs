//! The canary (`[canary]`): a live end-to-end check of a running relay. Every interval it
//! writes one row into the outbox through the database, in a transaction of its own, as
//! the application does (its own `message_type`, routed by `canary.topic`), and measures
//! how long until the sink acknowledges it. Every process may look alive while nothing is
//! delivered (a frozen broker, a wedged producer, a replication slot that stopped
//! advancing); the canary notices, because its own row does not arrive:
//!
//! - `outboxd_canary_latency_seconds`: insert → acknowledgement of each canary;
//! - `outboxd_canary_last_success_timestamp_seconds`: when the last one arrived;
//! - `/readyz` fails once none arrived for `unready_after` intervals (from the start, or
//!   from the last one), so an orchestrator can restart the wedged process.
//!
//! The relay tells [`Canary::delivered`] of every acknowledged event; while no canary is
//! on its way that is one atomic load. A delivered canary's row is deleted once it shows
//! SUCCESS (the next round), so the outbox does not fill with them.

pub mod config;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outboxd_connector::{Connector, NewOutboxRow, OutboxStore, OwnRowsToDelete, TransactionEnd};
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

pub use config::CanaryConfig;

/// The record header that marks a canary (its row's `headers` column carries it).
pub const CANARY_HEADER: &str = "outboxd-canary";

/// Upper bounds, in seconds, of the canary latency histogram's buckets.
const LATENCY_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Delivered canary rows not deleted yet, at most: past it the oldest is forgotten (and
/// left to the janitor), so a table that refuses deletes cannot grow this list.
const MAX_UNDELETED: usize = 64;

/// What the canary shares with the relay (which reports deliveries) and with `/metrics`
/// and `/readyz` (which read its state). Inert until [`Canary::enable`].
#[derive(Debug)]
pub struct Canary {
    settings: OnceLock<CanaryConfig>,
    /// Canaries are on their way: the relay's deliveries are compared with them.
    waiting: AtomicBool,
    /// The canaries on their way, each with when it was written. One arriving late (after
    /// later ones were written) still counts; one is given up after `unready_after`
    /// intervals.
    outstanding: Mutex<HashMap<String, Instant>>,
    /// Arrived canaries whose rows are to be deleted (once SUCCESS).
    arrived_ids: Mutex<Vec<String>>,
    arrived: Notify,
    /// What `/readyz` counts from: when the source first streamed, then the last arrival.
    since: Mutex<Option<Instant>>,
    /// Unix time in milliseconds of the last arrival; the canary's start before the first.
    last_success_ms: AtomicU64,
    latency: Histogram,
}

impl Default for Canary {
    fn default() -> Self {
        Self {
            settings: OnceLock::new(),
            waiting: AtomicBool::new(false),
            outstanding: Mutex::new(HashMap::new()),
            arrived_ids: Mutex::new(Vec::new()),
            arrived: Notify::new(),
            since: Mutex::new(None),
            last_success_ms: AtomicU64::new(0),
            latency: Histogram::new(LATENCY_BUCKETS),
        }
    }
}

/// Now as Unix milliseconds.
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Canary {
    /// Turns the canary on with `settings` (once; later calls change nothing).
    pub fn enable(&self, settings: CanaryConfig) {
        let _ = self.settings.set(settings);
        self.start_grace();
        self.last_success_ms.store(unix_ms(), Ordering::Relaxed);
    }

    /// `/readyz` counts `unready_after` from now: the source streams (a relay that is
    /// still connecting is not ready anyway, and must not be found late for it).
    fn start_grace(&self) {
        *lock(&self.since) = Some(Instant::now());
    }

    /// Whether the canary is on.
    pub fn enabled(&self) -> bool {
        self.settings.get().is_some()
    }

    /// Whether `message_id` is a canary on its way (exactly-once counts it delivered only
    /// once its Kafka transaction commits).
    pub fn expects(&self, message_id: &str) -> bool {
        self.waiting.load(Ordering::Acquire) && lock(&self.outstanding).contains_key(message_id)
    }

    /// The relay acknowledged the event `message_id`. Cheap unless a canary is on its way.
    pub fn delivered(&self, message_id: &str) {
        if !self.waiting.load(Ordering::Acquire) {
            return;
        }
        let mut outstanding = lock(&self.outstanding);
        let Some(written) = outstanding.remove(message_id) else {
            return;
        };
        self.waiting
            .store(!outstanding.is_empty(), Ordering::Release);
        drop(outstanding);
        self.latency.observe(written.elapsed().as_secs_f64());
        *lock(&self.since) = Some(Instant::now());
        self.last_success_ms.store(unix_ms(), Ordering::Relaxed);
        lock(&self.arrived_ids).push(message_id.to_owned());
        self.arrived.notify_waiters();
    }

    /// `/readyz`: why the process is not ready, when no canary arrived for
    /// `unready_after` intervals.
    pub fn overdue(&self) -> Option<String> {
        let settings = self.settings.get()?;
        let since = (*lock(&self.since))?;
        let quiet = since.elapsed();
        (quiet > settings.unready_after()).then(|| {
            format!(
                "no canary delivered for {}s (canary.unready_after = {} intervals of {:?}): \
                 events are not getting through",
                quiet.as_secs(),
                settings.unready_after,
                settings.interval
            )
        })
    }

    /// The latency histogram (`/metrics`).
    pub(crate) fn latency(&self) -> &Histogram {
        &self.latency
    }

    /// Unix time in seconds of the last arrival (the canary's start before the first).
    pub(crate) fn last_success(&self) -> f64 {
        self.last_success_ms.load(Ordering::Relaxed) as f64 / 1000.0
    }

    /// A canary is written now.
    fn expect(&self, message_id: String) {
        lock(&self.outstanding).insert(message_id, Instant::now());
        self.waiting.store(true, Ordering::Release);
    }

    /// The canary `message_id` was not written after all: not waited for.
    fn forget(&self, message_id: &str) {
        let mut outstanding = lock(&self.outstanding);
        outstanding.remove(message_id);
        self.waiting
            .store(!outstanding.is_empty(), Ordering::Release);
    }

    /// Gives up the canaries written longer than `age` ago; their ids.
    fn give_up_older_than(&self, age: Duration) -> Vec<String> {
        let mut outstanding = lock(&self.outstanding);
        let late: Vec<String> = (outstanding.iter())
            .filter(|(_, written)| written.elapsed() > age)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &late {
            outstanding.remove(id);
        }
        self.waiting
            .store(!outstanding.is_empty(), Ordering::Release);
        late
    }

    /// The arrived canaries whose rows are still to be deleted.
    fn take_arrived(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.arrived_ids))
    }

    /// Waits until the canary `message_id` arrives, or `deadline`. Whether it arrived.
    async fn arrival(&self, message_id: &str, deadline: Instant) -> bool {
        loop {
            let arrived = self.arrived.notified();
            if !lock(&self.outstanding).contains_key(message_id) {
                return true;
            }
            tokio::select! {
                () = arrived => {}
                () = tokio::time::sleep_until(deadline) => {
                    return !lock(&self.outstanding).contains_key(message_id);
                }
            }
        }
    }
}

/// `future`, unless `shutdown` comes first (`None`).
async fn or_stop<T>(
    shutdown: &mut watch::Receiver<bool>,
    future: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        value = future => Some(value),
        _ = shutdown.wait_for(|stop| *stop) => None,
    }
}

/// Writes one canary every interval until `shutdown`, on a connection of its own (opened
/// again after an error), from when the source first streams (`streaming`);
/// `store_timeout` bounds each database call.
pub async fn run<C: Connector>(
    connector: &C,
    canary: &Canary,
    streaming: &AtomicBool,
    pipeline: &str,
    store_timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(settings) = canary.settings.get() else {
        return;
    };
    let until_streaming = async {
        while !streaming.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    if or_stop(&mut shutdown, until_streaming).await.is_none() {
        return;
    }
    canary.start_grace();
    tracing::info!(
        interval = ?settings.interval,
        unready_after = ?settings.unready_after(),
        "canary: one row through the outbox every interval"
    );
    let mut store: Option<C::Store> = None;
    let mut undeleted: Vec<String> = Vec::new();
    let mut sequence: u64 = 0;
    let mut ticks = tokio::time::interval(settings.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if or_stop(&mut shutdown, ticks.tick()).await.is_none() {
            return;
        }
        for late in canary.give_up_older_than(settings.unready_after()) {
            tracing::warn!(message_id = %late, "canary: given up, not delivered in canary.unready_after intervals");
            // Its row goes too, once (if ever) it shows SUCCESS.
            undeleted.push(late);
        }
        if store.is_none() {
            let opened =
                crate::reconnect::answered(store_timeout, "opening", connector.open_store());
            match or_stop(&mut shutdown, opened).await {
                None => return,
                Some(Ok(opened)) => store = Some(opened),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "canary: cannot open a database connection");
                    continue;
                }
            }
        }
        let Some(open) = store.as_ref() else { continue };
        // Rows of arrived canaries, SUCCESS by now (or at a later round): deleted, so the
        // outbox keeps none.
        undeleted.extend(canary.take_arrived());
        let mut kept = Vec::new();
        for message_id in std::mem::take(&mut undeleted) {
            let deleting = crate::reconnect::answered(
                store_timeout,
                "deleting a canary row",
                open.delete_own_rows(
                    std::slice::from_ref(&message_id),
                    OwnRowsToDelete::Delivered,
                ),
            );
            match or_stop(&mut shutdown, deleting).await {
                None => return,
                Some(Ok(deleted)) if deleted > 0 => {}
                Some(Ok(_)) => kept.push(message_id),
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "canary: cannot delete a delivered canary row");
                    kept.push(message_id);
                }
            }
        }
        // A row that never shows SUCCESS (an operator changed it) is left to the janitor.
        let excess = kept.len().saturating_sub(MAX_UNDELETED);
        undeleted = kept.split_off(excess);

        sequence += 1;
        let row = canary_row(settings, pipeline, sequence);
        let message_id = row.message_id.clone();
        canary.expect(message_id.clone());
        let writing = crate::reconnect::answered(
            store_timeout,
            "writing a canary row",
            open.insert_rows(std::slice::from_ref(&row), TransactionEnd::Commit),
        );
        match or_stop(&mut shutdown, writing).await {
            None => return,
            Some(Ok(())) => {}
            Some(Err(e)) => {
                tracing::warn!(error = %e, "canary: cannot write the canary row");
                // A call left unanswered may have committed: it is still waited for (and
                // given up in time); a refusal did not.
                if !e.is_transient() {
                    canary.forget(&message_id);
                }
                store = None;
                continue;
            }
        }
        // Wait for it until the next canary is due; a late one still counts when it comes.
        let waited = canary.arrival(&message_id, Instant::now() + settings.interval);
        match or_stop(&mut shutdown, waited).await {
            None => return,
            Some(true) => {}
            Some(false) => tracing::warn!(
                message_id = %message_id,
                interval = ?settings.interval,
                "canary: the canary row is not delivered within the interval"
            ),
        }
    }
}

/// The row of canary number `sequence`: its message id and key unique to this process
/// and moment (outboxd's table allows one event of a type per key).
fn canary_row(settings: &CanaryConfig, pipeline: &str, sequence: u64) -> NewOutboxRow {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let message_id = format!(
        "canary-{pipeline}-{}-{}-{sequence}",
        std::process::id(),
        now.as_millis()
    );
    let written_at = jiff::Timestamp::try_from(SystemTime::now())
        .map(|t| t.to_string())
        .unwrap_or_default();
    NewOutboxRow {
        biz_key: message_id.clone(),
        message_type: settings.message_type.clone(),
        topic: settings.topic.clone(),
        payload: serde_json::json!({
            "canary": sequence,
            "pipeline": pipeline,
            "written_at": written_at,
        })
        .to_string(),
        // Marks the record: an inbox that reads the canary's topic anyway acknowledges it
        // without storing it (`inbox/kafka.rs`), so no handler ever sees a canary.
        headers: Some(format!(r#"{{"{CANARY_HEADER}":"1"}}"#)),
        message_id,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enabled(interval_ms: u64) -> Canary {
        let canary = Canary::default();
        canary.enable(CanaryConfig {
            interval: Duration::from_millis(interval_ms),
            ..CanaryConfig::default()
        });
        canary
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_fails_after_unready_after_intervals_without_a_canary_and_recovers() {
        let canary = enabled(1000);
        assert_eq!(canary.overdue(), None, "a fresh canary has its grace");
        tokio::time::advance(Duration::from_millis(4100)).await;
        let late = canary.overdue().expect("4 intervals without a canary");
        assert!(late.contains("no canary delivered for 4s"), "{late}");

        let started = canary.last_success();
        canary.expect("m-1".into());
        canary.expect("m-2".into());
        canary.delivered("m-0");
        assert!(
            canary.overdue().is_some(),
            "another event is not the canary"
        );
        tokio::time::advance(Duration::from_millis(30)).await;
        canary.delivered("m-1");
        assert_eq!(
            canary.overdue(),
            None,
            "a canary written before the last counts"
        );
        assert!(canary.last_success() >= started);
        assert!(canary.expects("m-2") && !canary.expects("m-1"));
        assert_eq!(canary.take_arrived(), ["m-1"]);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(canary.give_up_older_than(Duration::from_secs(4)), ["m-2"]);
        assert!(!canary.expects("m-2"));
        let mut text = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("c", "c", canary.latency().clone());
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("c_count 1"), "{text}");
        assert!(text.contains("c_bucket{le=\"0.05\"} 1"), "{text}");
        assert!(text.contains("c_bucket{le=\"0.025\"} 0"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_ends_at_the_arrival_or_the_deadline() {
        let canary = enabled(1000);
        canary.expect("m-1".into());
        let deadline = Instant::now() + Duration::from_secs(1);
        assert!(!canary.arrival("m-1", deadline).await, "nothing arrived");
        canary.expect("m-2".into());
        let waiting = canary.arrival("m-2", Instant::now() + Duration::from_secs(1));
        let arriving = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            canary.delivered("m-2");
        };
        let (arrived, ()) = tokio::join!(waiting, arriving);
        assert!(arrived);
    }

    #[test]
    fn a_disabled_canary_is_never_overdue() {
        let canary = Canary::default();
        canary.expect("m".into());
        canary.delivered("m");
        assert_eq!(canary.overdue(), None);
        assert!(!canary.enabled());
    }
}
