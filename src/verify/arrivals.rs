//! What the sink delivered to `verify`: every copy of every event of the run, in the
//! order it arrived, shared by the reader (a Kafka consumer thread, or the HTTP
//! receiver's tasks) and the run, which reads it for progress and the checks.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use super::check::Arrival;

#[derive(Debug, Default)]
pub(crate) struct Arrivals {
    state: Mutex<State>,
    /// Requests refused for a missing or wrong signature (HTTP).
    bad_signatures: AtomicU64,
    /// Why the reader cannot read the run's topic at all, once it knows.
    reader_error: Mutex<Option<String>>,
}

#[derive(Debug, Default)]
struct State {
    copies: Vec<Arrival>,
    distinct: HashSet<u64>,
}

impl Arrivals {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a copy of event `index`, arrived now (with Kafka: where, under which key).
    pub(crate) fn record(
        &self,
        index: u64,
        position: Option<(i32, i64)>,
        record_key: Option<Vec<u8>>,
    ) {
        let mut state = self.state();
        state.distinct.insert(index);
        state.copies.push(Arrival {
            index,
            at: Instant::now(),
            position,
            record_key,
        });
    }

    /// Whether event `index` has arrived.
    pub(crate) fn has(&self, index: u64) -> bool {
        self.state().distinct.contains(&index)
    }

    /// How many distinct events arrived.
    pub(crate) fn distinct(&self) -> usize {
        self.state().distinct.len()
    }

    /// Every copy so far, in arrival order.
    pub(crate) fn copies(&self) -> Vec<Arrival> {
        self.state().copies.clone()
    }

    pub(crate) fn refuse_signature(&self) {
        self.bad_signatures.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn bad_signatures(&self) -> u64 {
        self.bad_signatures.load(Ordering::Relaxed)
    }

    /// The reader gives up: it cannot read the run's topic at all.
    pub(crate) fn reader_failed(&self, reason: String) {
        let mut error =
            (self.reader_error.lock()).unwrap_or_else(std::sync::PoisonError::into_inner);
        error.get_or_insert(reason);
    }

    pub(crate) fn reader_error(&self) -> Option<String> {
        (self.reader_error.lock())
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}
