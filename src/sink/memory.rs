//! An in-memory sink for unit tests of the core: records what it was sent, fails chosen
//! ids or keys with a chosen [`FailureKind`], and can hold deliveries until the test
//! completes them, in whatever order the test picks. Transactional (exactly-once), it
//! keeps records invisible until a commit, and a failed record dooms the open transaction
//! as in Kafka. The sink conformance suite (`sink/conformance/`) holds it to what the real
//! sinks do: per-key order, failure kinds, recover, and a `flush` that waits for held
//! deliveries.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use outboxd_connector::{CheckLine, OutboxEvent, Position};
use tokio::sync::oneshot;

use crate::sink::{CommittedPosition, FailureKind, Receipt, Sink, SinkFailure, SinkResult};

/// See the module doc.
#[derive(Default)]
pub(crate) struct MemorySink {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    sent: Vec<OutboxEvent>,
    fail_ids: HashMap<i64, FailureKind>,
    fail_keys: HashMap<String, FailureKind>,
    /// Every record fails with this kind (a destination nobody answers at).
    fail_all: Option<FailureKind>,
    hold: bool,
    /// Every send fails [`FailureKind::Fatal`] until [`Sink::recover`].
    fatal: bool,
    recoveries: usize,
    /// Held deliveries by row id, with the outcome they will get.
    held: BTreeMap<i64, (oneshot::Sender<SinkResult>, SinkResult)>,
    /// Ids of the records the destination took (their `Ok` released), in that order.
    delivered: Vec<i64>,
    next_offset: i64,
    /// Exactly-once: records go into an open transaction that only a commit makes
    /// visible; a new [`Sink::committed_position`] or [`Sink::abort`] aborts it.
    transactional: bool,
    uncommitted: Vec<i64>,
    /// Exactly-once: a record of the open transaction failed, which (as in Kafka) leaves
    /// that transaction nothing but an abort: its commit fails.
    doomed: bool,
    committed: Vec<i64>,
    committed_position: Option<CommittedPosition>,
    /// Every commit's position, in order.
    commits: Vec<Position>,
    /// Commits fail (the transaction coordinator is away) while set.
    fail_commits: bool,
    /// A fresh client reaches the destination ([`Sink::destination_healthy`]).
    unreachable: bool,
    rebuilds: usize,
    /// Runs once, at the next take-over, before this sink's instance fences the old one:
    /// what that instance still did in between.
    before_fencing: Option<Box<dyn FnOnce() + Send>>,
}

impl MemorySink {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A transactional sink (exactly-once): see [`MemorySink::committed_ids`].
    pub(crate) fn transactional() -> Self {
        let sink = Self::default();
        sink.state().transactional = true;
        sink
    }

    /// Ids of the records of committed transactions, in send order: what a
    /// `read_committed` consumer would see.
    pub(crate) fn committed_ids(&self) -> Vec<i64> {
        self.state().committed.clone()
    }

    /// The position the last commit recorded.
    pub(crate) fn last_committed_position(&self) -> Option<Position> {
        self.state().committed_position.clone().map(|c| c.position)
    }

    /// The position of every commit, in order.
    pub(crate) fn commit_positions(&self) -> Vec<Position> {
        self.state().commits.clone()
    }

    /// The checkpoint the last commit recorded.
    pub(crate) fn last_committed_checkpoint(&self) -> Option<Position> {
        self.state()
            .committed_position
            .clone()
            .and_then(|c| c.checkpoint)
    }

    /// The record of row `id` fails with `kind`.
    pub(crate) fn fail_id(&self, id: i64, kind: FailureKind) {
        self.state().fail_ids.insert(id, kind);
    }

    /// Every record of `key` fails with `kind`.
    pub(crate) fn fail_key(&self, key: &str, kind: FailureKind) {
        self.state().fail_keys.insert(key.to_owned(), kind);
    }

    /// Every record fails with `kind`, as against a destination nobody answers at.
    pub(crate) fn fail_all(&self, kind: FailureKind) {
        self.state().fail_all = Some(kind);
    }

    /// Exactly-once: commits fail while `fail` (records stay uncommitted).
    pub(crate) fn fail_commits(&self, fail: bool) {
        self.state().fail_commits = fail;
    }

    /// Records fail no more (the topic was created, the broker fixed).
    pub(crate) fn heal(&self) {
        let mut state = self.state();
        state.fail_ids.clear();
        state.fail_keys.clear();
        state.fail_all = None;
    }

    /// From now on every send fails fatally, as a librdkafka producer does after a fatal
    /// error, until the sink is recovered.
    pub(crate) fn turn_fatal(&self) {
        self.state().fatal = true;
    }

    /// A fresh client cannot reach the destination while set: see
    /// [`Sink::destination_healthy`].
    pub(crate) fn set_unreachable(&self, unreachable: bool) {
        self.state().unreachable = unreachable;
    }

    /// Exactly-once: `last_words` runs at the next [`Sink::committed_position`], before
    /// the fencing, as the commit a fenced instance still made in between.
    pub(crate) fn before_fencing(&self, last_words: impl FnOnce() + Send + 'static) {
        self.state().before_fencing = Some(Box::new(last_words));
    }

    /// Exactly-once: the transaction a (fenced) instance committed last.
    pub(crate) fn set_committed_position(&self, committed: CommittedPosition) {
        self.state().committed_position = Some(committed);
    }

    /// How often [`Sink::rebuild`] rebuilt the sink.
    pub(crate) fn rebuilds(&self) -> usize {
        self.state().rebuilds
    }

    /// How often [`Sink::recover`] rebuilt the sink.
    pub(crate) fn recoveries(&self) -> usize {
        self.state().recoveries
    }

    /// From now on, deliveries wait for [`MemorySink::complete`] instead of resolving at
    /// once.
    pub(crate) fn hold(&self) {
        self.state().hold = true;
    }

    /// Resolves the held delivery of row `id`; false when none is held.
    pub(crate) fn complete(&self, id: i64) -> bool {
        let mut state = self.state();
        match state.held.remove(&id) {
            Some((tx, result)) => {
                if result.is_ok() {
                    state.delivered.push(id);
                }
                let _ = tx.send(result);
                true
            }
            None => false,
        }
    }

    /// Ids of the deliveries held, ascending.
    pub(crate) fn held(&self) -> Vec<i64> {
        self.state().held.keys().copied().collect()
    }

    /// Ids of the records the destination took, in that order: sent while not holding, or
    /// held and then completed, with a receipt (whether or not anyone still waited).
    pub(crate) fn delivered_ids(&self) -> Vec<i64> {
        self.state().delivered.clone()
    }

    /// Ids of every record sent, in send order.
    pub(crate) fn sent_ids(&self) -> Vec<i64> {
        self.state().sent.iter().map(|e| e.id).collect()
    }
}

/// A delivery of the memory sink.
pub(crate) struct MemoryDelivery(oneshot::Receiver<SinkResult>);

impl Future for MemoryDelivery {
    type Output = SinkResult;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<SinkResult> {
        Pin::new(&mut self.0).poll(cx).map(|r| {
            r.unwrap_or_else(|_| {
                Err(SinkFailure {
                    kind: FailureKind::Fatal,
                    error: "the memory sink dropped the record".into(),
                    retry_after: None,
                })
            })
        })
    }
}

impl Sink for MemorySink {
    type Delivery = MemoryDelivery;

    async fn send(&self, event: &OutboxEvent) -> MemoryDelivery {
        let mut state = self.state();
        let failure = state
            .fail_ids
            .get(&event.id)
            .or_else(|| state.fail_keys.get(&event.biz_key))
            .copied()
            .or(state.fail_all)
            .or(state.fatal.then_some(FailureKind::Fatal));
        let result = match failure {
            Some(kind) => Err(SinkFailure {
                kind,
                error: format!("memory sink: {kind:?} failure of row {}", event.id),
                retry_after: None,
            }),
            None => {
                state.next_offset += 1;
                Ok(Receipt {
                    partition: 0,
                    offset: state.next_offset,
                })
            }
        };
        state.sent.push(event.clone());
        if state.transactional {
            match result {
                Ok(_) => state.uncommitted.push(event.id),
                Err(_) => state.doomed = true,
            }
        }
        let (tx, rx) = oneshot::channel();
        if state.hold {
            state.held.insert(event.id, (tx, result));
        } else {
            if result.is_ok() {
                state.delivered.push(event.id);
            }
            let _ = tx.send(result);
        }
        MemoryDelivery(rx)
    }

    fn destination(&self, event: &OutboxEvent) -> String {
        format!("memory.{}", event.message_type)
    }

    fn transactional(&self) -> bool {
        self.state().transactional
    }

    async fn committed_position(&self) -> Result<Option<CommittedPosition>, SinkFailure> {
        let last_words = self.state().before_fencing.take();
        if let Some(last_words) = last_words {
            last_words();
        }
        let mut state = self.state();
        state.uncommitted.clear();
        state.doomed = false;
        Ok(state.committed_position.clone())
    }

    async fn commit(&self, committed: &CommittedPosition) -> Result<(), SinkFailure> {
        let mut state = self.state();
        if state.fail_commits {
            return Err(SinkFailure {
                kind: FailureKind::Fatal,
                error: "memory sink: the commit failed".into(),
                retry_after: None,
            });
        }
        if state.doomed {
            return Err(SinkFailure {
                kind: FailureKind::Fatal,
                error: "memory sink: a record of the transaction failed; it can only be aborted"
                    .into(),
                retry_after: None,
            });
        }
        let records = std::mem::take(&mut state.uncommitted);
        state.committed.extend(records);
        state.commits.push(committed.position.clone());
        state.committed_position = Some(committed.clone());
        Ok(())
    }

    async fn abort(&self) {
        let mut state = self.state();
        state.uncommitted.clear();
        state.doomed = false;
    }

    /// Waits until no delivery is held (the test completes them), up to `deadline`.
    async fn flush(&self, deadline: Duration) {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let held = !self.state().held.is_empty();
            if !held || tokio::time::Instant::now() >= until {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn check(&self, _timeout: Duration) -> CheckLine {
        CheckLine::ok("memory", "in-memory sink")
    }

    fn queue_depth(&self) -> i64 {
        self.state().held.len() as i64
    }

    async fn destination_healthy(&self, _timeout: Duration) -> Result<bool, String> {
        // A real look takes a moment (a fresh client, a metadata request): so does this
        // one, on tokio's clock, so the relay's timing of its looks is tested with it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(!self.state().unreachable)
    }

    /// As a purged librdkafka producer: every held delivery fails Fatal, and deliveries
    /// resolve at once again.
    async fn rebuild(&self) -> Result<(), String> {
        let mut state = self.state();
        state.rebuilds += 1;
        state.hold = false;
        for (_, (tx, _)) in std::mem::take(&mut state.held) {
            let _ = tx.send(Err(SinkFailure {
                kind: FailureKind::Fatal,
                error: "memory sink: rebuilt before the record was acknowledged".into(),
                retry_after: None,
            }));
        }
        Ok(())
    }

    async fn recover(&self) -> Result<bool, String> {
        let mut state = self.state();
        let was_fatal = std::mem::take(&mut state.fatal);
        state.recoveries += usize::from(was_fatal);
        Ok(was_fatal)
    }
}
