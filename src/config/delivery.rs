//! `[delivery]`: in-flight bounds, write-back batching, shutdown, exactly-once.

use std::time::Duration;

use serde::Deserialize;

/// `[delivery]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeliveryConfig {
    /// Records handed to Kafka and not yet acknowledged, at most. Reading the log pauses
    /// at this bound.
    pub max_in_flight: usize,
    /// Bytes of events (payload, key, headers) read and not yet written back, at most:
    /// reading the log pauses at this bound, inside a large transaction too (its rows
    /// arrive in parts). The Kafka producer's local queue is bounded by the same figure
    /// (`queue.buffering.max.kbytes`, unless set in `[kafka.options]`).
    pub max_in_flight_bytes: usize,
    /// Acknowledged rows written back in one statement, at most.
    pub writeback_batch: usize,
    /// How long an acknowledged row may wait for its batch to fill.
    #[serde(with = "humantime_serde")]
    pub writeback_interval: Duration,
    /// How long one database call of the log relay (a write-back, a look-up of held-back
    /// or delivered rows, the checkpoint) may go unanswered before the relay takes the
    /// connection for dead and starts a new session: a database behind a network black
    /// hole or frozen answers nothing, and no TCP timeout notices it through a proxy.
    #[serde(with = "humantime_serde")]
    pub store_timeout: Duration,
    /// On SIGTERM/SIGINT, how long in-flight deliveries may take to finish.
    #[serde(with = "humantime_serde")]
    pub shutdown_deadline: Duration,
    /// Exactly-once into Kafka (log mode): records go out in Kafka transactions that
    /// also carry the log position they reach (`kafka.positions_topic`), so a
    /// `read_committed` consumer sees each row once across crashes. See README.
    pub exactly_once: bool,
    /// Exactly-once: how long a Kafka transaction stays open before it is committed (at
    /// the next database transaction boundary). Longer: fewer commits, more latency.
    #[serde(with = "humantime_serde")]
    pub transaction_interval: Duration,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        Self {
            max_in_flight: 10_000,
            max_in_flight_bytes: 64 << 20,
            writeback_batch: 1_000,
            writeback_interval: Duration::from_millis(5),
            store_timeout: Duration::from_secs(60),
            shutdown_deadline: Duration::from_secs(30),
            exactly_once: false,
            transaction_interval: Duration::from_millis(100),
        }
    }
}
