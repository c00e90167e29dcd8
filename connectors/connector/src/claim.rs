use std::time::{Duration, SystemTime};

use crate::{Delivered, DeliveryFailure, OutboxEvent};

/// Proof that this worker holds a row's claim: every write-back of a claimed row is
/// `… WHERE id = ? AND claim_token = ?`, so a worker that lost its claim (reaped, or
/// re-claimed by another) cannot overwrite the newer state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClaimToken(pub String);

/// A row claimed by this worker: now PROCESSING with `claimed_at` and a fresh token.
#[derive(Clone, Debug)]
pub struct ClaimedEvent {
    /// The row as an event (with its current `retry_count`).
    pub event: OutboxEvent,
    /// The token written with the claim.
    pub claim_token: ClaimToken,
}

/// Which rows a claim takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimScope {
    /// FAILED rows whose `next_retry_time` is due (the retry worker).
    DueFailed,
    /// INIT rows as well as due FAILED rows (poll mode, where the log is not available).
    NewAndDueFailed,
}

/// A claim: `… ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED` in one short transaction.
#[derive(Clone, Copy, Debug)]
pub struct ClaimRequest {
    /// Which rows.
    pub scope: ClaimScope,
    /// At most this many rows.
    pub limit: usize,
    /// Strict per-key order: claim a row only when no row of the same `biz_key` with a
    /// lower id is FAILED, PROCESSING or MANUAL_REQUIRED (or, in poll mode, INIT), so a
    /// key's events leave in id order, one at a time while the key is in trouble.
    pub strict_order: bool,
}

/// The outcome of claimed rows, written back only where the claim still holds.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClaimedWriteBack<'a> {
    /// Acknowledged rows → SUCCESS, claim cleared.
    pub delivered: &'a [(Delivered, ClaimToken)],
    /// Failed rows → FAILED (retry_count + 1, next_retry_time by backoff, last_error) or
    /// MANUAL_REQUIRED at max_retry_count, claim cleared.
    pub failed: &'a [(DeliveryFailure, ClaimToken)],
    /// Rows whose attempt does not count (the sink itself failed, not the row) → FAILED,
    /// due now, `retry_count` unchanged, `last_error` = the reason, claim cleared.
    pub released: &'a [(ParkedEvent, ClaimToken)],
    /// Rows that cannot become events ([`crate::OutboxEvent::rejected`]) →
    /// MANUAL_REQUIRED with the reason, `retry_count` unchanged, claim cleared.
    pub rejected: &'a [(ParkedEvent, ClaimToken)],
}

impl ClaimedWriteBack<'_> {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.delivered.is_empty()
            && self.failed.is_empty()
            && self.released.is_empty()
            && self.rejected.is_empty()
    }

    /// `"2 delivered, 1 failed and 0 released claimed rows"`, for messages.
    pub fn describe(&self) -> String {
        format!(
            "{} delivered, {} failed, {} released and {} rejected claimed rows",
            self.delivered.len(),
            self.failed.len(),
            self.released.len(),
            self.rejected.len()
        )
    }
}

/// A row written back with a reason and no attempt counted: parked (FAILED, due now) by
/// the log path under strict ordering (an earlier event of its `biz_key` is FAILED,
/// PROCESSING or MANUAL_REQUIRED); released (FAILED, due now) by the claim worker when
/// the sink failed rather than the row; rejected (MANUAL_REQUIRED) when the row cannot
/// become an event at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParkedEvent {
    /// Outbox row id.
    pub id: i64,
    /// The row's outbox table ([`crate::OutboxEvent::table`]).
    pub table: u16,
    /// Stored in `last_error`, e.g. "parked: an earlier event of biz_key o-7 is FAILED".
    pub reason: String,
}

/// What the reaper did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// PROCESSING rows returned to FAILED.
    pub failed: u64,
    /// PROCESSING rows that reached max_retry_count and became MANUAL_REQUIRED.
    pub manual_required: u64,
}

/// When the retry worker next has something to do, from the rows themselves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetrySchedule {
    /// Earliest `next_retry_time` of a FAILED row.
    pub next_due: Option<SystemTime>,
    /// Earliest `claimed_at` of a PROCESSING row (the reaper's next candidate).
    pub oldest_claim: Option<SystemTime>,
}

/// Settings of a reap: how long a claim may last and how long a reaped row waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReapPolicy {
    /// A PROCESSING row claimed longer ago than this is considered abandoned.
    pub claim_timeout: Duration,
    /// `next_retry_time = now + retry_delay` for reaped rows.
    pub retry_delay: Duration,
}
