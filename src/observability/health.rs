//! What `/readyz` and `/metrics` ask beyond the pipeline's own counters, and the caches
//! that keep those questions cheap:
//! - Kafka's reachability: a metadata request, at most every [`KAFKA_CHECK`];
//! - the database's status summary (rows by status, oldest unsent row, slot lag): one
//!   query **on scrape**, at most every [`STATUS_CACHE`], on a connection opened at the
//!   first scrape. An outboxd that nobody scrapes sends no query to an idle outbox table,
//!   and a busy scraper costs at most one query per 15 s.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use outboxd_connector::{CheckStatus, Connector, ConnectorError, StatusSummary, TableAdmin};
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::metrics::{self, ScrapeInputs};
use crate::relay::PipelineStats;
use crate::sink::Sink;

/// The database's status summary is queried at most this often.
pub(crate) const STATUS_CACHE: Duration = Duration::from_secs(15);
/// Kafka's reachability is checked at most this often.
pub(crate) const KAFKA_CHECK: Duration = Duration::from_secs(10);
/// How long one reachability check may take.
const KAFKA_CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// The last status query's result, shared by the scrapes it serves.
type StatusResult = Arc<Result<StatusSummary, String>>;

/// The health of one running pipeline, as the endpoint reports it.
pub(crate) struct Health<C: Connector, S: Sink> {
    stats: Arc<PipelineStats>,
    /// The relay's producer; `None` in an inbox-only process, which has no sink to check.
    sink: Option<Arc<S>>,
    /// Exactly-once: the log relay's own (transactional) producer, counted in the
    /// producer queue beside the shared one.
    relay_sink: Option<Arc<S>>,
    /// Whether the sink's reachability gates `/readyz` (Kafka: one cluster the relay
    /// cannot work without). Not the HTTP sink's endpoints: one partner's endpoint down
    /// must not take the process (and an inbox it serves) out of rotation; its rows wait
    /// and `outboxd_http_endpoint_up` says so.
    sink_gates_readiness: bool,
    connector: C,
    /// The SQL connection for status queries, opened on the first scrape, dropped after
    /// an error.
    store: Mutex<Option<C::Store>>,
    status: TtlCache<StatusResult>,
    /// The same for the inbox table, when this process runs an inbox.
    inbox_store: Mutex<Option<C::Inbox>>,
    inbox_status: TtlCache<StatusResult>,
    kafka: TtlCache<Result<(), String>>,
}

impl<C: Connector, S: Sink> Health<C, S> {
    /// Health over the pipeline's counters, its sink and (a copy of) its connector.
    pub(crate) fn new(stats: Arc<PipelineStats>, sink: Option<Arc<S>>, connector: C) -> Self {
        Self {
            stats,
            sink,
            relay_sink: None,
            sink_gates_readiness: true,
            connector,
            store: Mutex::new(None),
            status: TtlCache::new(STATUS_CACHE),
            inbox_store: Mutex::new(None),
            inbox_status: TtlCache::new(STATUS_CACHE),
            kafka: TtlCache::new(KAFKA_CHECK),
        }
    }

    /// Whether the sink's reachability gates `/readyz` and shows as
    /// `outboxd_kafka_reachable` (the Kafka sink: yes; the HTTP sink: no).
    pub(crate) fn sink_gates_readiness(mut self, gates: bool) -> Self {
        self.sink_gates_readiness = gates;
        self
    }

    /// Counts the log relay's own producer too (exactly-once).
    pub(crate) fn with_relay_sink(mut self, relay_sink: Option<Arc<S>>) -> Self {
        self.relay_sink = relay_sink;
        self
    }

    /// `/readyz`: the reason text, `Ok` when the source streams and Kafka is reachable.
    pub(crate) async fn readiness(&self) -> Result<String, String> {
        let streaming = self.stats.streaming.load(Ordering::Relaxed);
        let ready = readiness(streaming, self.kafka_reachable().await);
        match (ready, self.stats.canary.overdue()) {
            (ready, None) => ready,
            (Ok(_), Some(late)) => Err(format!("not ready: {late}\n")),
            (Err(reasons), Some(late)) => Err(format!("{}; {late}\n", reasons.trim_end())),
        }
    }

    /// `/metrics`: every series, in the Prometheus text format.
    pub(crate) async fn metrics(&self) -> String {
        let kafka = self.kafka_reachable().await;
        // Without the relay (no sink) there is no outbox table to count.
        let status = match self.sink {
            Some(_) => Some(self.status.get(self.query_status()).await),
            None => None,
        };
        let inbox_status = match self.stats.inbox.get() {
            Some(_) => Some(self.inbox_status.get(self.query_inbox_status()).await),
            None => None,
        };
        let inputs = ScrapeInputs {
            producer_queue: self.sink.as_ref().map_or(0, |s| s.queue_depth())
                + self.relay_sink.as_ref().map_or(0, |s| s.queue_depth()),
            status: status.as_ref().and_then(|s| s.as_ref().as_ref().ok()),
            status_ok: status.as_ref().map(|s| s.is_ok()),
            inbox_status: inbox_status.as_ref().and_then(|s| s.as_ref().as_ref().ok()),
            kafka_reachable: (self.sink.as_ref())
                .filter(|_| self.sink_gates_readiness)
                .map(|_| kafka.is_ok()),
            endpoints: self.sink.as_ref().and_then(|s| s.endpoint_metrics()),
        };
        metrics::render(&self.stats, &inputs)
    }

    /// The outbox's status summary (cached as for a scrape); `None` without the relay.
    pub(crate) async fn outbox_summary(&self) -> Option<Result<StatusSummary, String>> {
        self.sink.as_ref()?;
        Some((*self.status.get(self.query_status()).await).clone())
    }

    /// The inbox's status summary (cached as for a scrape); `None` without an inbox.
    pub(crate) async fn inbox_summary(&self) -> Option<Result<StatusSummary, String>> {
        self.stats.inbox.get()?;
        Some((*self.inbox_status.get(self.query_inbox_status()).await).clone())
    }

    /// Kafka's reachability, checked at most every [`KAFKA_CHECK`]; `Ok` without a sink.
    async fn kafka_reachable(&self) -> Result<(), String> {
        let Some(sink) = self.sink.as_ref().filter(|_| self.sink_gates_readiness) else {
            return Ok(());
        };
        self.kafka
            .get(async {
                let line = sink.check(KAFKA_CHECK_TIMEOUT).await;
                match line.status {
                    CheckStatus::Fail => Err(line.to_string()),
                    _ => Ok(()),
                }
            })
            .await
    }

    async fn query_status(&self) -> StatusResult {
        summary(
            &self.store,
            self.connector.open_store(),
            async |store: &C::Store| store.status_summary().await,
        )
        .await
    }

    async fn query_inbox_status(&self) -> StatusResult {
        summary(
            &self.inbox_store,
            self.connector.open_inbox(),
            async |store: &C::Inbox| store.status_summary().await,
        )
        .await
    }
}

/// How long a scrape waits for the status connection and query: a slow or locked
/// database makes `outboxd_status_query_up` 0, it never holds the scrape (nor the
/// endpoint's connections) longer.
pub(crate) const STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// One status query on the connection in `slot`, opened with `open` when there is none
/// and dropped after an error or a timeout (the next scrape opens a new one, and the
/// server ends the abandoned query with the connection).
async fn summary<T>(
    slot: &Mutex<Option<T>>,
    open: impl Future<Output = Result<T, ConnectorError>>,
    query: impl AsyncFnOnce(&T) -> Result<StatusSummary, ConnectorError>,
) -> StatusResult {
    let mut slot = slot.lock().await;
    if slot.is_none() {
        match tokio::time::timeout(STATUS_TIMEOUT, open).await {
            Ok(Ok(opened)) => *slot = Some(opened),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "metrics: cannot open the status connection");
                return Arc::new(Err(e.to_string()));
            }
            Err(_) => {
                tracing::warn!(timeout = ?STATUS_TIMEOUT, "metrics: the status connection did not open in time");
                return Arc::new(Err("the status connection timed out".into()));
            }
        }
    }
    let Some(open) = slot.as_ref() else {
        return Arc::new(Err("no status connection".into()));
    };
    match tokio::time::timeout(STATUS_TIMEOUT, query(open)).await {
        Ok(Ok(summary)) => Arc::new(Ok(summary)),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "metrics: status query failed");
            *slot = None;
            Arc::new(Err(e.to_string()))
        }
        Err(_) => {
            tracing::warn!(timeout = ?STATUS_TIMEOUT, "metrics: the status query timed out; its connection is dropped");
            *slot = None;
            Arc::new(Err("the status query timed out".into()))
        }
    }
}

/// Ready when the source streams (log mode: the replication session is open; poll mode:
/// the claim worker runs) and Kafka answered; otherwise the reasons.
fn readiness(streaming: bool, kafka: Result<(), String>) -> Result<String, String> {
    match (streaming, kafka) {
        (true, Ok(())) => Ok("ready: source streaming, Kafka reachable\n".into()),
        (false, kafka) => Err(format!(
            "not ready: the source is not streaming{}\n",
            kafka.err().map_or(String::new(), |e| format!("; {e}"))
        )),
        (true, Err(e)) => Err(format!("not ready: {e}\n")),
    }
}

/// A value computed again at most once per `ttl`. Callers in between get the cached
/// value; callers during a refresh wait for it, so concurrent scrapes cost one query.
struct TtlCache<T> {
    ttl: Duration,
    slot: Mutex<Option<(Instant, T)>>,
}

impl<T: Clone> TtlCache<T> {
    fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            slot: Mutex::new(None),
        }
    }

    /// The cached value, or `refresh`'s when the cache is empty or older than `ttl`.
    async fn get(&self, refresh: impl Future<Output = T>) -> T {
        let mut slot = self.slot.lock().await;
        if let Some((at, value)) = slot.as_ref() {
            if at.elapsed() < self.ttl {
                return value.clone();
            }
        }
        let value = refresh.await;
        *slot = Some((Instant::now(), value.clone()));
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[tokio::test]
    async fn cache_refreshes_only_when_stale() {
        let calls = AtomicU32::new(0);
        let refresh = || async { calls.fetch_add(1, Ordering::Relaxed) };
        let cached = TtlCache::new(Duration::from_secs(3600));
        assert_eq!(cached.get(refresh()).await, 0);
        assert_eq!(cached.get(refresh()).await, 0);
        assert_eq!(calls.load(Ordering::Relaxed), 1);

        let stale = TtlCache::new(Duration::ZERO);
        assert_eq!(stale.get(refresh()).await, 1);
        assert_eq!(stale.get(refresh()).await, 2);
    }

    #[test]
    fn readiness_names_what_is_missing() {
        assert!(readiness(true, Ok(())).is_ok());
        assert_eq!(
            readiness(false, Ok(())),
            Err("not ready: the source is not streaming\n".into())
        );
        assert_eq!(
            readiness(false, Err("kafka: timed out".into())),
            Err("not ready: the source is not streaming; kafka: timed out\n".into())
        );
        assert_eq!(
            readiness(true, Err("kafka: timed out".into())),
            Err("not ready: kafka: timed out\n".into())
        );
    }
}
