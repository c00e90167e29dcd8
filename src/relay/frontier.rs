//! The ack frontier: which log position may be confirmed.
//!
//! Every transaction read from the log (and every progress position) takes a slot, in
//! log order, counting its events not yet written back. Events complete in any order
//! (Kafka acknowledges partitions independently), but the position confirmed is always
//! the last one of the **longest prefix** of slots whose every event is written back:
//! confirming past a transaction with an unwritten event could lose it on a crash.
//!
//! A transaction that arrives in parts takes one slot when its first part arrives; the
//! slot has no position, and the frontier cannot pass it, until its end arrives.
//!
//! Pure bookkeeping, no I/O: the session decides when to write back and confirm.

use std::collections::VecDeque;

use outboxd_connector::Position;

/// A log position and how many of its events still await write-back.
struct Slot {
    /// `None` while the transaction's parts are still arriving.
    position: Option<Position>,
    unwritten: usize,
}

/// See the module doc. Slots are addressed by a sequence number that grows by one per
/// slot for the whole session.
#[derive(Default)]
pub(crate) struct AckFrontier {
    /// Positions read and not yet past the frontier, in log order.
    slots: VecDeque<Slot>,
    /// Sequence number of `slots[0]`.
    first_seq: u64,
    /// The last position [`AckFrontier::advance`] returned: checkpoints only move forward.
    checkpoint: Option<Position>,
}

impl AckFrontier {
    /// Queues the position of a transaction with `events` events (0 for progress or for a
    /// transaction already written back); returns its sequence number.
    pub(crate) fn push(&mut self, position: Position, events: usize) -> u64 {
        let seq = self.first_seq + self.slots.len() as u64;
        self.slots.push_back(Slot {
            position: Some(position),
            unwritten: events,
        });
        seq
    }

    /// Queues a transaction whose first part of `events` events arrived; its position
    /// comes with its end ([`AckFrontier::close`]).
    pub(crate) fn open(&mut self, events: usize) -> u64 {
        let seq = self.first_seq + self.slots.len() as u64;
        self.slots.push_back(Slot {
            position: None,
            unwritten: events,
        });
        seq
    }

    /// `events` more events of the open transaction `seq`; with its position when this
    /// is its end.
    pub(crate) fn extend(&mut self, seq: u64, events: usize, end: Option<Position>) {
        if let Some(slot) = self.slot_mut(seq) {
            slot.unwritten += events;
            if end.is_some() {
                slot.position = end;
            }
        }
    }

    /// The position of slot `seq`, while it is queued and known (for logs).
    pub(crate) fn position(&self, seq: u64) -> Option<&Position> {
        seq.checked_sub(self.first_seq)
            .and_then(|i| self.slots.get(i as usize))
            .and_then(|slot| slot.position.as_ref())
    }

    fn slot_mut(&mut self, seq: u64) -> Option<&mut Slot> {
        seq.checked_sub(self.first_seq)
            .and_then(|i| self.slots.get_mut(i as usize))
    }

    /// One event of slot `seq` is written back (or is in the batch about to be).
    pub(crate) fn written(&mut self, seq: u64) {
        // A slot leaves the queue only once all its events are written back, so every
        // event's slot is still queued.
        if let Some(slot) = self.slot_mut(seq) {
            slot.unwritten = slot.unwritten.saturating_sub(1);
        }
    }

    /// Drops the longest fully written prefix and returns its last position when it is
    /// beyond every checkpoint returned before.
    pub(crate) fn advance(&mut self) -> Option<Position> {
        let done = self
            .slots
            .iter()
            .take_while(|s| s.unwritten == 0 && s.position.is_some())
            .count();
        let last = self.slots.drain(..done).next_back();
        self.first_seq += done as u64;
        let position = last?.position?;
        if self.checkpoint.as_ref() >= Some(&position) {
            return None;
        }
        self.checkpoint = Some(position.clone());
        Some(position)
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn lsn(n: u64) -> Position {
        Position::new(u128::from(n), format!("test:{n}"))
    }

    #[test]
    fn confirms_only_past_fully_written_transactions() {
        let mut f = AckFrontier::default();
        let a = f.push(lsn(10), 2);
        let b = f.push(lsn(20), 1);
        f.push(lsn(25), 0);
        f.written(b);
        assert_eq!(f.advance(), None, "10 still has two unwritten events");
        f.written(a);
        assert_eq!(f.advance(), None);
        f.written(a);
        assert_eq!(f.advance(), Some(lsn(25)));
        assert_eq!(f.position(a), None);
        // A progress position equal to the checkpoint is not confirmed twice.
        f.push(lsn(25), 0);
        assert_eq!(f.advance(), None);
    }

    #[test]
    fn a_transaction_in_parts_is_not_passed_until_its_end() {
        let mut f = AckFrontier::default();
        let a = f.push(lsn(10), 1);
        let big = f.open(2);
        f.written(a);
        f.written(big);
        f.written(big);
        assert_eq!(
            f.advance(),
            Some(lsn(10)),
            "every part written, but no end yet"
        );
        f.extend(big, 1, None);
        f.extend(big, 1, Some(lsn(30)));
        f.written(big);
        assert_eq!(f.advance(), None, "one event of the end is unwritten");
        f.written(big);
        assert_eq!(f.advance(), Some(lsn(30)));
    }

    /// Random transactions (some empty: progress), events written back in random order
    /// and random batches: the checkpoint never moves backward, never passes a
    /// transaction with an unwritten event, and reaches the last position at the end.
    #[test]
    fn the_checkpoint_is_the_longest_written_prefix_in_any_completion_order() {
        for seed in 0..2_000u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut f = AckFrontier::default();
            let txs = rng.gen_range(1..40);
            // (seq, position) of each event; unwritten count per position.
            let mut events = Vec::new();
            let mut unwritten = std::collections::BTreeMap::new();
            let mut position = 0;
            for _ in 0..txs {
                let n = if rng.gen_bool(0.2) {
                    0
                } else {
                    rng.gen_range(1..5)
                };
                // Transactions have distinct positions; progress may repeat the last one.
                position += if n == 0 {
                    rng.gen_range(0..2)
                } else {
                    rng.gen_range(1..3)
                };
                let seq = f.push(lsn(position), n);
                *unwritten.entry(position).or_insert(0usize) += n;
                events.extend(std::iter::repeat_n((seq, position), n));
            }
            events.shuffle(&mut rng);
            let mut confirmed: Option<u64> = None;
            let mut check =
                |f: &mut AckFrontier, unwritten: &std::collections::BTreeMap<u64, usize>| {
                    if let Some(p) = f.advance().map(|p| p.gauge()) {
                        assert!(
                            confirmed < Some(p),
                            "seed {seed}: moved from {confirmed:?} to {p}"
                        );
                        let pending = unwritten.range(..=p).any(|(_, n)| *n > 0);
                        assert!(
                            !pending,
                            "seed {seed}: confirmed {p} past an unwritten event"
                        );
                        confirmed = Some(p);
                    }
                };
            check(&mut f, &unwritten);
            while !events.is_empty() {
                let batch = rng.gen_range(1..=events.len().min(6));
                for (seq, p) in events.drain(..batch) {
                    f.written(seq);
                    *unwritten.entry(p).or_default() -= 1;
                }
                check(&mut f, &unwritten);
            }
            assert_eq!(
                confirmed,
                Some(position),
                "seed {seed}: did not reach the end"
            );
        }
    }
}
