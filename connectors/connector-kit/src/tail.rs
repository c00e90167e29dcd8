//! The skeleton of a log-tail task, the same for every engine.
//!
//! An engine's `open` spawns a task that owns the log connection and hands items to the
//! core through a bounded channel ([`channel`]): the [`Inlet`] end sits in the engine's
//! `ChangeStream` (so `next` is cancel-safe), the [`Outlet`] end in the task. When the
//! core falls behind, [`Outlet::emit`] waits for room (backpressure: the task stops
//! reading the log) while it keeps serving the engine's [`Confirmations`] — the
//! positions the core confirms and the timer that reports them to the server (a standby
//! status update, a checkpoint write) — so a session that is only slow is not dropped.
//!
//! The channel is bounded in items and in bytes ([`CHANNEL_BYTES`] of events, counted by
//! [`OutboxEvent::size`](outboxd_connector::OutboxEvent::size)), so what waits between the
//! task and the core stays small whatever the rows weigh; an item larger than the whole
//! budget waits until the channel is empty.
//!
//! Progress (the log moved without outbox rows) is rate-limited to one item per
//! [`PROGRESS_INTERVAL`] and never goes backward; a transaction's position counts as
//! progress already made.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use outboxd_connector::{ChangeItem, ConnectorError, Position};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Items buffered between the log task and the core.
pub const CHANNEL_CAPACITY: usize = 1024;
/// Bytes of events buffered between the log task and the core, as
/// [`OutboxEvent::size`](outboxd_connector::OutboxEvent::size) counts them: one part of a
/// large transaction ([`outboxd_connector::PART_BYTES`]). The count is proportional to
/// the memory, not equal to it (an event's strings and buffers are allocated apart):
/// 16 MiB of them held about 40 MB, most of a million-row transaction's 102 MB peak
/// (docs/benchmarks.md); at 4 MiB the peak is 60 MB, and the drain no slower.
pub const CHANNEL_BYTES: usize = 4 << 20;
/// Progress items are sent at most this often.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// What the log task sends: an item, or the error that ended it.
pub type Item = Result<ChangeItem, ConnectorError>;

/// The receiver has gone (the stream was dropped): the task ends without an error.
#[derive(Debug)]
pub struct Closed;

/// The duties a log task keeps up even while it waits for the core.
pub trait Confirmations {
    /// Resolves when the core confirmed a new position; `Err(Closed)` when the stream
    /// was dropped. Cancel-safe.
    fn changed(&mut self) -> impl Future<Output = Result<(), Closed>> + Send;
    /// Records the confirmation just signalled (typically schedules the timer).
    fn on_confirm(&mut self);
    /// When the timer is next due; `None` while there is nothing to do.
    fn due(&self) -> Option<Instant>;
    /// The timer's work: report the confirmed position to the server.
    fn on_due(&mut self) -> impl Future<Output = Result<(), ConnectorError>> + Send;
}

/// A channel from a log task (the [`Outlet`]) to its stream (the [`Inlet`]); `start` is
/// the position the log is read from, `wrap` makes an engine position a [`Position`].
pub fn channel<P: Ord + Clone>(start: P, wrap: fn(P) -> Position) -> (Outlet<P>, Inlet) {
    let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
    let budget = Arc::new(Semaphore::new(CHANNEL_BYTES));
    let outlet = Outlet {
        tx,
        budget: Arc::clone(&budget),
        last_position: start,
        pending: None,
        last_progress_at: None,
        wrap,
    };
    (
        outlet,
        Inlet {
            rx,
            budget,
            task: None,
        },
    )
}

/// What an item holds against the channel's byte budget.
fn budget_of(item: &ChangeItem) -> u32 {
    let events = match item {
        ChangeItem::Transaction(t) => &t.events,
        ChangeItem::Part(p) => &p.events,
        ChangeItem::Progress(_) => return 0,
    };
    let bytes: usize = events
        .iter()
        .map(outboxd_connector::OutboxEvent::size)
        .sum();
    // At most the whole budget, so that one huge item can pass (alone).
    bytes.min(CHANNEL_BYTES) as u32
}

/// An item in the channel, with the bytes of budget it holds.
type Sent = (Item, u32);

/// The stream's end of the channel. It owns the log task: dropping it stops the task.
#[derive(Debug)]
pub struct Inlet {
    rx: mpsc::Receiver<Sent>,
    budget: Arc<Semaphore>,
    task: Option<JoinHandle<()>>,
}

impl Inlet {
    /// Spawns the log task that feeds this inlet (its future owns the [`Outlet`]).
    pub fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        if let Some(old) = self.task.replace(tokio::spawn(task)) {
            old.abort();
        }
    }

    /// The next item; a transient error with `ended()`'s message when the task is gone.
    /// Cancel-safe (`mpsc::Receiver::recv` is).
    pub async fn next(&mut self, ended: impl FnOnce() -> String) -> Item {
        match self.rx.recv().await {
            Some((item, bytes)) => {
                self.budget.add_permits(bytes as usize);
                item
            }
            None => Err(ConnectorError::transient(ended())),
        }
    }
}

impl Drop for Inlet {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// The task's end of the channel, with the progress bookkeeping.
#[derive(Debug)]
pub struct Outlet<P> {
    tx: mpsc::Sender<Sent>,
    /// Bytes of events the channel may still take.
    budget: Arc<Semaphore>,
    /// Position of the last transaction or progress recorded; never goes backward.
    last_position: P,
    /// A progress position not sent yet because of the rate limit.
    pending: Option<P>,
    last_progress_at: Option<Instant>,
    wrap: fn(P) -> Position,
}

impl<P: Ord + Clone> Outlet<P> {
    /// The log moved to `position` between transactions. Returns the progress item when
    /// it may be sent now; otherwise it waits for [`Outlet::progress_due`].
    pub fn progress(&mut self, position: P) -> Option<ChangeItem> {
        if position <= self.last_position {
            return None;
        }
        self.last_position = position.clone();
        self.pending = Some(position);
        if self.progress_allowed_at() <= Instant::now() {
            return self.take_progress();
        }
        None
    }

    /// A transaction ending at `position` is about to be sent: progress up to it is made.
    pub fn transaction(&mut self, position: &P) {
        if *position > self.last_position {
            self.last_position = position.clone();
        }
        if self.pending.as_ref().is_some_and(|p| p <= position) {
            self.pending = None;
        }
    }

    /// When the pending progress may be sent; `None` when there is none or the log is
    /// inside a transaction (its position is not a boundary).
    pub fn progress_due(&self, in_transaction: bool) -> Option<Instant> {
        (self.pending.is_some() && !in_transaction).then(|| self.progress_allowed_at())
    }

    /// The pending progress item, if any.
    pub fn take_progress(&mut self) -> Option<ChangeItem> {
        self.pending
            .take()
            .map(|p| ChangeItem::Progress((self.wrap)(p)))
    }

    fn progress_allowed_at(&self) -> Instant {
        self.last_progress_at
            .map_or_else(Instant::now, |at| at + PROGRESS_INTERVAL)
    }

    /// Sends `item` to the core, waiting for room in the channel; meanwhile
    /// confirmations keep being recorded and reported. When reporting fails, the item and
    /// then the error are sent (in order) and the task should end.
    pub async fn emit(
        &mut self,
        item: ChangeItem,
        duties: &mut impl Confirmations,
    ) -> Result<(), Closed> {
        if matches!(item, ChangeItem::Progress(_)) {
            self.last_progress_at = Some(Instant::now());
        }
        let bytes = budget_of(&item);
        let mut held = bytes == 0;
        loop {
            let due = duties.due();
            tokio::select! {
                acquired = self.budget.acquire_many(bytes), if !held => {
                    // Released by the inlet when it takes the item.
                    acquired.map_err(|_| Closed)?.forget();
                    held = true;
                }
                permit = self.tx.reserve(), if held => {
                    let permit = permit.map_err(|_| Closed)?;
                    permit.send((Ok(item), bytes));
                    return Ok(());
                }
                changed = duties.changed() => {
                    changed?;
                    duties.on_confirm();
                }
                () = sleep_until_opt(due) => {
                    if let Err(e) = duties.on_due().await {
                        let _ = self.tx.send((Ok(item), if held { bytes } else { 0 })).await;
                        let _ = self.tx.send((Err(e), 0)).await;
                        return Err(Closed);
                    }
                }
            }
        }
    }

    /// Ends the task: hands the error that stopped it to the core (if it still listens).
    pub async fn fail(&self, error: ConnectorError) {
        // The receiver may be gone already; then nobody needs the error.
        let _ = self.tx.send((Err(error), 0)).await;
    }
}

/// Records a position the core confirmed, for the log task to report: only a position
/// past the current one changes the value (and wakes the task); confirmations never go
/// backward. `None < Some(_)`, so an `Option` works for "nothing confirmed yet".
pub fn advance<P: Ord>(confirmed: &watch::Sender<P>, position: P) {
    confirmed.send_if_modified(|current| {
        let forward = position > *current;
        if forward {
            *current = position;
        }
        forward
    });
}

/// Sleeps until `at`; forever when `None` (a `select!` branch that never fires).
pub async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in engine coordinate.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
    struct Lsn(u64);

    fn wrap(lsn: Lsn) -> Position {
        Position::new(u128::from(lsn.0), format!("test:{}", lsn.0))
    }

    struct NoDuties;

    impl Confirmations for NoDuties {
        async fn changed(&mut self) -> Result<(), Closed> {
            std::future::pending().await
        }
        fn on_confirm(&mut self) {}
        fn due(&self) -> Option<Instant> {
            None
        }
        async fn on_due(&mut self) -> Result<(), ConnectorError> {
            Ok(())
        }
    }

    #[test]
    fn confirmations_only_advance() {
        let (tx, rx) = watch::channel(None);
        advance(&tx, Some(Lsn(5)));
        advance(&tx, Some(Lsn(3)));
        assert_eq!(*rx.borrow(), Some(Lsn(5)));
    }

    #[tokio::test]
    async fn progress_is_rate_limited_and_never_goes_back() {
        let (mut outlet, mut inlet) = channel(Lsn(10), wrap);
        assert!(outlet.progress(Lsn(5)).is_none());
        let first = outlet.progress(Lsn(20)).unwrap();
        outlet.emit(first, &mut NoDuties).await.unwrap();
        // Within the interval: held back until due.
        assert!(outlet.progress(Lsn(30)).is_none());
        assert!(outlet.progress_due(true).is_none());
        let due = outlet.progress_due(false).unwrap();
        assert!(due > Instant::now());
        // A transaction past it makes the pending progress moot.
        outlet.transaction(&Lsn(40));
        assert!(outlet.take_progress().is_none());
        let got = inlet.next(|| "ended".into()).await.unwrap();
        assert!(matches!(got, ChangeItem::Progress(p) if p == wrap(Lsn(20))));
        drop(outlet);
        let err = inlet.next(|| "ended".into()).await.unwrap_err();
        assert!(err.is_transient());
    }
}
