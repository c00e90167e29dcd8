//! The claim path of [`super::MemoryStore`], as the engines' statements do it
//! (`connectors/postgres/src/store/sql.rs` is the reference): `… ORDER BY id LIMIT n FOR
//! UPDATE SKIP LOCKED` over due FAILED rows (and INIT rows in poll mode), strict per-key
//! order judged on the rows as they were before the claim (one statement's snapshot),
//! claim tokens, the reaper, the retry schedule and the blocked keys, all read from the
//! rows in trouble (`next_retry_time` set).
//!
//! One difference, allowed by the contract (a claim may return fewer rows): a strict
//! poll claim here finds each key's first INIT row among all INIT rows, where PostgreSQL
//! looks only in a window of the lowest INIT ids (`store/claims.rs`,
//! `POLL_WINDOW_FACTOR` × the limit), so a key flooding that window costs the engine
//! rows it does not cost the twin.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, SystemTime};

use outboxd_connector::{
    ClaimRequest, ClaimScope, ClaimToken, ClaimedEvent, ClaimedWriteBack, ConnectorError,
    ReapPolicy, ReapReport, RetrySchedule,
};

use super::database::{uuid, Database, Row, State};

/// Claims rows in one statement; see [`outboxd_connector::OutboxStore::claim`].
pub(super) async fn claim(
    db: &Database,
    request: ClaimRequest,
) -> Result<Vec<ClaimedEvent>, ConnectorError> {
    db.claim_calls.fetch_add(1, SeqCst);
    while db.silent_claims.load(SeqCst) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The round trip to the server: claimers running side by side on one task take
    // turns, as their statements would interleave on a server (without it the first of
    // them would claim every row before the others ran once).
    tokio::task::yield_now().await;
    let mut state = db.state();
    state.outbox()?;
    let poll = request.scope == ClaimScope::NewAndDueFailed;
    let now = SystemTime::now();
    // Strict order, per key: the lowest id in trouble and the lowest INIT id, as the
    // statement's snapshot shows them (a row claimed by this statement still counts as
    // it was). A lower row locked by another transaction is read all the same.
    let mut first_blocking: HashMap<&str, i64> = HashMap::new();
    let mut first_init: HashMap<&str, i64> = HashMap::new();
    if request.strict_order {
        for (id, row) in &state.rows {
            if row.blocks() {
                first_blocking.entry(&row.biz_key).or_insert(*id);
            }
            if row.status == "INIT" {
                first_init.entry(&row.biz_key).or_insert(*id);
            }
        }
    }
    let held = |id: i64, row: &Row| {
        let before = |first: &HashMap<&str, i64>| {
            first
                .get(row.biz_key.as_str())
                .is_some_and(|lower| *lower < id)
        };
        request.strict_order && (before(&first_blocking) || (poll && before(&first_init)))
    };
    let chosen: Vec<i64> = state
        .rows
        .iter()
        .filter(|(id, _)| !state.locked.contains(*id))
        .filter(|(_, row)| match row.status {
            "FAILED" => row.next_retry_time.is_some_and(|due| due <= now),
            "INIT" => poll,
            _ => false,
        })
        .filter(|(id, row)| !held(**id, row))
        .take(request.limit)
        .map(|(id, _)| *id)
        .collect();
    let mut claimed = Vec::with_capacity(chosen.len());
    for id in chosen {
        let Some(row) = state.rows.get_mut(&id) else {
            continue;
        };
        let token = uuid();
        row.status = "PROCESSING";
        row.claimed_at = Some(now);
        row.claim_token = Some(token.clone());
        // In the retry index too: the reaper and the schedule find it, and it blocks
        // its key.
        row.next_retry_time = row.next_retry_time.or(Some(now));
        claimed.push(ClaimedEvent {
            event: row.event(id, None),
            claim_token: ClaimToken(token),
        });
    }
    Ok(claimed)
}

/// Writes back claimed rows, each only while its token holds; see
/// [`outboxd_connector::OutboxStore::complete_claimed`].
pub(super) fn complete(db: &Database, batch: ClaimedWriteBack<'_>) -> Result<u64, ConnectorError> {
    let mut state = db.state();
    if batch.is_empty() {
        return Ok(0);
    }
    state.outbox()?;
    let now = SystemTime::now();
    let mut updated = 0;
    for (d, token) in batch.delivered {
        if let Some(row) = take_claim(&mut state.rows, d.id, token, &mut updated) {
            row.deliver(d.partition, d.offset, now);
        }
    }
    for (f, token) in batch.failed {
        if let Some(row) = take_claim(&mut state.rows, f.id, token, &mut updated) {
            row.fail(&f.error, f.retry_delay, now);
        }
    }
    let released = batch.released.iter().map(|r| (r, "FAILED"));
    let rejected = batch.rejected.iter().map(|r| (r, "MANUAL_REQUIRED"));
    for ((r, token), status) in released.chain(rejected) {
        if let Some(row) = take_claim(&mut state.rows, r.id, token, &mut updated) {
            row.set_aside(status, &r.reason, now);
        }
    }
    Ok(updated)
}

/// The row of `id` while `token` holds its claim (`… WHERE id = ? AND claim_token = ?
/// AND status = 'PROCESSING'`), the claim cleared and counted in `updated`.
fn take_claim<'a>(
    rows: &'a mut BTreeMap<i64, Row>,
    id: i64,
    token: &ClaimToken,
    updated: &mut u64,
) -> Option<&'a mut Row> {
    let row = rows.get_mut(&id).filter(|r| {
        r.status == "PROCESSING" && r.claim_token.as_deref() == Some(token.0.as_str())
    })?;
    row.unclaim();
    *updated += 1;
    Some(row)
}

/// Returns abandoned claims to FAILED or MANUAL_REQUIRED; see
/// [`outboxd_connector::OutboxStore::reap`]. Rows another transaction locks are skipped.
pub(super) fn reap(db: &Database, policy: ReapPolicy) -> Result<ReapReport, ConnectorError> {
    let mut state = db.state();
    state.outbox()?;
    let now = SystemTime::now();
    let expired_before = now.checked_sub(policy.claim_timeout);
    let reason = policy.reaped_reason();
    let mut report = ReapReport::default();
    let State { rows, locked, .. } = &mut *state;
    for (id, row) in rows {
        let expired = (row.claimed_at.zip(expired_before)).is_some_and(|(at, limit)| at < limit);
        if row.status != "PROCESSING" || row.next_retry_time.is_none() || !expired {
            continue;
        }
        if locked.contains(id) {
            continue;
        }
        row.fail(&reason, policy.retry_delay, now);
        row.unclaim();
        if row.status == "FAILED" {
            report.failed += 1;
        } else {
            report.manual_required += 1;
        }
    }
    Ok(report)
}

/// The earliest due FAILED row and the oldest claim; see
/// [`outboxd_connector::OutboxStore::retry_schedule`].
pub(super) fn schedule(db: &Database) -> Result<RetrySchedule, ConnectorError> {
    let state = db.state();
    state.outbox()?;
    let earliest = |status: &str, time: fn(&Row) -> Option<SystemTime>| {
        (state.rows.values())
            .filter(|r| r.status == status && r.next_retry_time.is_some())
            .filter_map(time)
            .min()
    };
    Ok(RetrySchedule {
        next_due: earliest("FAILED", |r| r.next_retry_time),
        oldest_claim: earliest("PROCESSING", |r| r.claimed_at),
    })
}

/// Of `keys` (all when `None`), those with a row in trouble; see
/// [`outboxd_connector::OutboxStore::blocked_keys`].
pub(super) fn blocked_keys(
    db: &Database,
    keys: Option<&[String]>,
) -> Result<HashSet<String>, ConnectorError> {
    let state = db.state();
    state.outbox()?;
    Ok((state.rows.values())
        .filter(|r| r.blocks())
        .filter(|r| keys.is_none_or(|keys| keys.contains(&r.biz_key)))
        .map(|r| r.biz_key.clone())
        .collect())
}
