//! Strict ordering's held-back keys: loaded when the session opens, taken in from the
//! table now and then (an operator's `park` of a row not read yet, a failure elsewhere),
//! and released once the claim worker delivered their rows and the table shows none of
//! theirs in trouble.

use std::time::{Duration, Instant};

use outboxd_connector::{ChangeStream, ConnectorError, OutboxStore};

use super::{RunState, Session};
use crate::sink::Sink;

/// The shortest period between two looks at the keys the table holds back (see
/// [`Session::refresh_blocked_keys`]): how soon an operator's `park` reaches a busy relay.
pub(super) const MIN_BLOCKED_REFRESH: Duration = Duration::from_secs(1);

impl<'a, O: OutboxStore, S: Sink> Session<'a, O, S> {
    /// Strict ordering starts from the keys the table says are in trouble.
    pub(in crate::relay) async fn load_blocked_keys(&mut self) -> Result<(), ConnectorError> {
        if self.strict() {
            self.blocked = self
                .ask("the held-back keys", self.store.blocked_keys(None))
                .await?;
            self.blocked_refreshed = Instant::now();
            if !self.blocked.is_empty() {
                tracing::info!(
                    keys = self.blocked.len(),
                    "keys held back by earlier failed events"
                );
            }
        }
        Ok(())
    }

    /// Takes in the keys the table holds back, at most once per refresh period and only
    /// when a transaction is about to be sent: an operator may have parked a row (or
    /// another process failed one) since the session started, and rows of that key read
    /// from now on must wait behind it. An idle outbox costs no query; a busy one one
    /// indexed query per period, and the period grows with the query's cost (at most
    /// 1/20 of the time goes to it). Keys are only added here: one this session blocked
    /// may not be in the table yet, and keys are released by [`Self::release_keys`].
    pub(super) async fn refresh_blocked_keys(&mut self) -> Result<(), ConnectorError> {
        if !self.strict() || self.blocked_refreshed.elapsed() < self.blocked_refresh_every {
            return Ok(());
        }
        let started = Instant::now();
        let in_table = (self.ask("the held-back keys", self.store.blocked_keys(None))).await?;
        self.blocked_refreshed = Instant::now();
        self.blocked_refresh_every = (started.elapsed() * 20).max(MIN_BLOCKED_REFRESH);
        for key in in_table {
            if self.blocked.insert(key.clone()) {
                tracing::info!(
                    biz_key = %key,
                    "key held back: the table shows an earlier event of it not delivered \
                     (parked by an operator or failed elsewhere)"
                );
            }
        }
        Ok(())
    }

    /// Unblocks the keys whose rows the retry worker delivered, once the table shows no
    /// FAILED, PROCESSING or MANUAL_REQUIRED row of theirs. Runs after a write-back, and
    /// only when every row this session parked or failed is in the table (see
    /// [`Self::finish_write`]), so the table's answer is the whole truth.
    pub(super) async fn release_keys(&mut self) -> Result<(), ConnectorError> {
        if self.maybe_released.is_empty() {
            return Ok(());
        }
        let candidates: Vec<String> = self.maybe_released.drain().collect();
        let still_blocked = (self.ask(
            "the held-back keys",
            self.store.blocked_keys(Some(&candidates)),
        ))
        .await?;
        for key in candidates {
            if !still_blocked.contains(&key) {
                tracing::debug!(biz_key = %key, "key released: its earlier events are delivered");
                self.blocked.remove(&key);
            }
        }
        Ok(())
    }

    /// The claim worker delivered a row of `key`: if this session holds the key back, the
    /// next write-back looks whether the table still does (one starts now when no batch
    /// is pending).
    pub(super) async fn on_delivered_key<T: ChangeStream>(
        &mut self,
        key: String,
        stream: &mut T,
        state: &mut RunState<'a>,
    ) {
        if self.blocked.contains(&key) {
            self.maybe_released.insert(key);
            if self.batch_started.is_none() && !self.exactly_once {
                self.flush_or_drain(stream, &mut state.writing, &mut state.stopping_at)
                    .await;
            }
        }
    }
}
