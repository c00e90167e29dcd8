//! Claims and their write-back: `FOR UPDATE SKIP LOCKED` in id order, strict per-key
//! order, poll mode, claim tokens, the reaper, rows parked by strict ordering, blocked
//! keys and the retry schedule.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use outboxd_connector::{
    ClaimToken, ClaimedWriteBack, Delivered, DeliveryFailure, OutboxStore, ParkedEvent, ReadMode,
    ReapPolicy, ReapReport, WriteBack,
};

use crate::support::{due_failed, ids_of, initialised, poll, store, stored_headers};
use crate::{Harness, NewRow, Setup};

/// Due FAILED rows only, in id order, as events built like the stream's; the claim is
/// recorded (PROCESSING, token, claimed_at, still in the retry index) and not taken twice.
pub async fn claim_takes_due_failed_rows_in_id_order<H: Harness>() {
    let h: H = initialised("cl_due", ReadMode::Log).await;
    let ids = h.insert(&NewRow::keys(&["a", "b", "c", "d"])).await;
    h.set(
        &ids[..2],
        &Setup {
            retry_count: Some(1),
            ..Setup::status("FAILED", Some(-1))
        },
    )
    .await;
    h.set(&ids[2..3], &Setup::status("FAILED", Some(3600)))
        .await; // not due
    let store = store(&h).await;

    let claimed = store.claim(due_failed(10, false)).await.expect("claim");
    assert_eq!(
        ids_of(&claimed),
        ids[..2],
        "due FAILED rows only, in id order"
    );
    let e = &claimed[0].event;
    assert_eq!(e.biz_key, "a");
    assert_eq!(&e.key[..], b"a");
    assert_eq!(&e.payload[..], br#"{"k": 1}"#, "the payload as stored");
    assert_eq!(
        e.headers,
        stored_headers::<H>(),
        "in the stored object's order"
    );
    assert_eq!(
        (e.retry_count, e.max_retry_count, e.commit_time),
        (1, 3, None),
        "the attempts so far"
    );
    let (date, time) = e.created_at.split_once('T').expect("ISO 8601 with T");
    assert_eq!(date.len(), 10, "{}", e.created_at);
    assert!(
        time.ends_with(H::UTC_OFFSET),
        "UTC like the stream: {}",
        e.created_at
    );
    assert_ne!(claimed[0].claim_token, claimed[1].claim_token);
    let token = &claimed[0].claim_token.0;
    assert!(
        token.len() == 36 && token.chars().all(|c| c == '-' || c.is_ascii_hexdigit()),
        "a UUID: {token}"
    );

    let row = h.row(ids[0]).await;
    assert_eq!(row.status, "PROCESSING");
    assert_eq!(
        row.claim_token.as_deref(),
        Some(claimed[0].claim_token.0.as_str())
    );
    assert!(
        row.claimed && row.next_retry_in.is_some(),
        "claim recorded, row stays in the retry index"
    );
    assert!(store
        .claim(due_failed(10, false))
        .await
        .expect("again")
        .is_empty());
    assert_eq!(
        h.row(ids[3]).await.status,
        "INIT",
        "the retry claim never takes INIT rows"
    );
    drop(store);
    h.cleanup().await;
}

/// A row locked by another transaction is skipped, not waited for; four claimers racing
/// claim every row exactly once between them.
pub async fn concurrent_claimers_skip_locked_rows_and_never_share_one<H: Harness>() {
    let h: H = initialised("cl_skip", ReadMode::Log).await;
    let keys: Vec<String> = (0..120).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let ids = h.insert(&NewRow::keys(&keys)).await;
    h.set(&ids, &Setup::status("FAILED", Some(-1))).await;

    let lock = h.lock_row(ids[0]).await;
    let store = store(&h).await;
    let first = tokio::time::timeout(Duration::from_secs(5), store.claim(due_failed(1, false)))
        .await
        .expect("claim does not wait for a locked row")
        .expect("claim");
    assert_eq!(ids_of(&first), [ids[1]], "locked row skipped");
    h.unlock(lock).await;

    drop(store);

    let per_claimer = race_claimers(&h, 4, 7).await;
    let mut all: Vec<i64> = per_claimer.iter().flatten().copied().collect();
    let total = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(total, all.len(), "a row was claimed twice");
    let mut expected = ids[2..].to_vec();
    expected.push(ids[0]);
    expected.sort_unstable();
    assert_eq!(all, expected, "every row claimed");
    h.cleanup().await;
}

/// Claimers racing share the work: a claim skips only the rows other claims took, so
/// while one claimer's transaction is open the others still find due rows (a claim that
/// locked every due row it scanned would leave them empty-handed).
pub async fn concurrent_claimers_share_the_due_rows<H: Harness>() {
    let h: H = initialised("cl_share", ReadMode::Log).await;
    let keys: Vec<String> = (0..120).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let ids = h.insert(&NewRow::keys(&keys)).await;
    h.set(&ids, &Setup::status("FAILED", Some(-1))).await;
    let per_claimer = race_claimers(&h, 4, 7).await;
    let total: usize = per_claimer.iter().map(Vec::len).sum();
    assert_eq!(total, ids.len(), "every row claimed once");
    assert!(
        per_claimer.iter().filter(|c| !c.is_empty()).count() > 1,
        "claims were spread over claimers: {:?}",
        per_claimer.iter().map(Vec::len).collect::<Vec<_>>()
    );
    h.cleanup().await;
}

/// `claimers` stores claiming `limit` due FAILED rows at a time, concurrently, each until
/// its claim comes back empty; the ids each one claimed.
async fn race_claimers<H: Harness>(h: &H, claimers: usize, limit: usize) -> Vec<Vec<i64>> {
    let stores = futures_util::future::try_join_all(
        (0..claimers).map(|_| outboxd_connector::Connector::open_store(h.connector())),
    )
    .await
    .expect("stores");
    let rounds = stores.iter().map(|s| async move {
        let mut mine = Vec::new();
        loop {
            let got = s.claim(due_failed(limit, false)).await.expect("claim");
            if got.is_empty() {
                return mine;
            }
            mine.extend(ids_of(&got));
        }
    });
    futures_util::future::join_all(rounds).await
}

/// Strict: one row per key, and none of a key whose earlier row is PROCESSING or
/// MANUAL_REQUIRED; released in id order once the earlier row is SUCCESS. Relaxed takes
/// everything due.
pub async fn strict_claim_takes_only_the_earliest_row_of_each_blocked_key<H: Harness>() {
    let h: H = initialised("cl_strict", ReadMode::Log).await;
    let ids = h
        .insert(&NewRow::keys(&["a", "a", "b", "c", "c", "a"]))
        .await;
    let (a1, a2, b1, c1, c2, a3) = (ids[0], ids[1], ids[2], ids[3], ids[4], ids[5]);
    h.set(&[a1, a2, a3, b1, c2], &Setup::status("FAILED", Some(-1)))
        .await;
    h.set(&[c1], &Setup::status("MANUAL_REQUIRED", Some(-3600)))
        .await;
    let store = store(&h).await;

    let first = store.claim(due_failed(100, true)).await.expect("claim");
    assert_eq!(
        ids_of(&first),
        [a1, b1],
        "c2 waits behind MANUAL_REQUIRED c1"
    );
    assert!(
        store
            .claim(due_failed(100, true))
            .await
            .expect("claim")
            .is_empty(),
        "a2 is held back while a1 is PROCESSING"
    );

    let done = [(
        Delivered {
            table: 0,
            id: a1,
            partition: 0,
            offset: 1,
        },
        first[0].claim_token.clone(),
    )];
    let n = store
        .complete_claimed(ClaimedWriteBack {
            delivered: &done,
            failed: &[],
            released: &[],
            rejected: &[],
        })
        .await
        .expect("complete");
    assert_eq!(n, 1);
    let next = store.claim(due_failed(100, true)).await.expect("claim");
    assert_eq!(ids_of(&next), [a2], "released in id order, one at a time");

    let relaxed = store.claim(due_failed(100, false)).await.expect("claim");
    assert_eq!(ids_of(&relaxed), [c2, a3], "relaxed: everything due");
    drop(store);
    h.cleanup().await;
}

/// Poll mode claims INIT rows as well as due FAILED ones; strict takes the earliest row
/// of each key; a row claimed from INIT enters the retry index.
pub async fn poll_claim_takes_init_and_due_failed_rows_in_key_order<H: Harness>() {
    let h: H = initialised("cl_poll", ReadMode::Poll).await;
    let ids = h
        .insert(&NewRow::keys(&["k", "l", "m", "k", "m", "n"]))
        .await;
    let (k1, l1, m1, k2, m2, n1) = (ids[0], ids[1], ids[2], ids[3], ids[4], ids[5]);
    h.set(&[m1], &Setup::status("FAILED", Some(-1))).await;
    let store = store(&h).await;

    let n2 = h.insert(&NewRow::keys(&["n"])).await[0];
    let strict = store.claim(poll(100, true)).await.expect("claim");
    assert_eq!(
        ids_of(&strict),
        [k1, l1, m1, n1],
        "one row per key, the earliest"
    );
    let rest = store.claim(poll(100, false)).await.expect("claim");
    assert_eq!(ids_of(&rest), [k2, m2, n2]);
    let row = h.row(k2).await;
    assert_eq!(row.status, "PROCESSING");
    assert!(
        row.next_retry_in.is_some(),
        "a row claimed from INIT is in the retry index too"
    );
    drop(store);
    h.cleanup().await;
}

/// Strict poll mode does not take a key's second row while its first is locked by
/// another claimer (it may be about to fail); relaxed does.
pub async fn strict_poll_claim_waits_for_an_earlier_row_locked_elsewhere<H: Harness>() {
    let h: H = initialised("cl_plock", ReadMode::Poll).await;
    let ids = h.insert(&NewRow::keys(&["k", "k", "j"])).await;
    let lock = h.lock_row(ids[0]).await;
    let store = store(&h).await;
    let strict = store.claim(poll(100, true)).await.expect("claim");
    assert_eq!(
        ids_of(&strict),
        [ids[2]],
        "k's second row waits for its first"
    );
    let relaxed = store.claim(poll(100, false)).await.expect("claim");
    assert_eq!(ids_of(&relaxed), [ids[1]], "relaxed takes it");
    h.unlock(lock).await;
    drop(store);
    h.cleanup().await;
}

/// The write-back of claimed rows applies only under the row's current token: a lost
/// claim (stolen, or a made-up token) is not written; SUCCESS clears the claim; FAILED
/// counts the attempt; MANUAL_REQUIRED at max_retry_count; a replay writes nothing.
pub async fn complete_claimed_writes_only_where_the_claim_still_holds<H: Harness>() {
    let h: H = initialised("cl_tok", ReadMode::Log).await;
    let ids = h.insert(&NewRow::keys(&["a", "b", "c", "d"])).await;
    h.set(&ids, &Setup::status("FAILED", Some(-1))).await;
    // d is on its last attempt (max_retry_count 3).
    h.set(
        &ids[3..],
        &Setup {
            retry_count: Some(2),
            ..Setup::default()
        },
    )
    .await;
    let store = store(&h).await;
    let claimed = store.claim(due_failed(10, false)).await.expect("claim");
    assert_eq!(ids_of(&claimed), ids);
    let token = |i: usize| claimed[i].claim_token.clone();

    // A made-up token changes nothing.
    let stale = store
        .complete_claimed(ClaimedWriteBack {
            delivered: &[(
                Delivered {
                    table: 0,
                    id: ids[0],
                    partition: 0,
                    offset: 1,
                },
                ClaimToken("00000000-0000-4000-8000-000000000000".into()),
            )],
            failed: &[],
            released: &[],
            rejected: &[],
        })
        .await
        .expect("stale token");
    assert_eq!(stale, 0);
    assert_eq!(h.row(ids[0]).await.status, "PROCESSING");

    // b's claim is lost: reaped and claimed again by someone else.
    let newer = "6f1c1c62-1111-4a1a-9a1a-5e1f00000001";
    h.set(
        &ids[1..2],
        &Setup {
            claim_token: Some(newer.into()),
            ..Setup::default()
        },
    )
    .await;
    let delivered = [
        (
            Delivered {
                table: 0,
                id: ids[0],
                partition: 3,
                offset: 33,
            },
            token(0),
        ),
        (
            Delivered {
                table: 0,
                id: ids[1],
                partition: 3,
                offset: 34,
            },
            token(1),
        ),
    ];
    let failure = |i: usize| DeliveryFailure {
        table: 0,
        id: ids[i],
        error: format!("broker says no to {i}"),
        retry_delay: Duration::from_secs(60),
    };
    let failed = [(failure(2), token(2)), (failure(3), token(3))];
    let n = store
        .complete_claimed(ClaimedWriteBack {
            delivered: &delivered,
            failed: &failed,
            released: &[],
            rejected: &[],
        })
        .await
        .expect("complete");
    assert_eq!(n, 3, "the lost claim is not written");

    let ok = h.row(ids[0]).await;
    assert_eq!(
        (
            ok.status.as_str(),
            ok.partition,
            ok.offset,
            ok.next_retry_in,
            ok.sent
        ),
        ("SUCCESS", Some(3), Some(33), None, true)
    );
    assert!(ok.claim_token.is_none() && !ok.claimed, "claim cleared");
    let lost = h.row(ids[1]).await;
    assert_eq!(
        (lost.status.as_str(), lost.claim_token.as_deref()),
        ("PROCESSING", Some(newer)),
        "the newer claim is untouched"
    );
    let retry = h.row(ids[2]).await;
    assert_eq!((retry.status.as_str(), retry.retry_count), ("FAILED", 1));
    assert!(retry
        .next_retry_in
        .is_some_and(|s| (50.0..=61.0).contains(&s)));
    assert_eq!(retry.last_error.as_deref(), Some("broker says no to 2"));
    assert!(
        retry.claim_token.is_none() && !retry.claimed,
        "claim cleared"
    );
    let manual = h.row(ids[3]).await;
    assert_eq!(
        (manual.status.as_str(), manual.retry_count),
        ("MANUAL_REQUIRED", 3)
    );
    assert!(
        manual.next_retry_in.is_some(),
        "manual rows keep next_retry_time"
    );

    // Replaying the same write-back changes nothing.
    let again = store
        .complete_claimed(ClaimedWriteBack {
            delivered: &delivered,
            failed: &failed,
            released: &[],
            rejected: &[],
        })
        .await
        .expect("replay");
    assert_eq!(again, 0);
    drop(store);
    h.cleanup().await;
}

/// A released claim (the sink failed, not the row) goes back to FAILED, due now, with its
/// attempt uncounted and the reason, only where the claim still holds.
pub async fn released_claims_keep_their_attempt_count<H: Harness>() {
    let h: H = initialised("cl_rel", ReadMode::Log).await;
    let ids = h.insert(&NewRow::keys(&["a", "b"])).await;
    h.set(&ids, &Setup::status("FAILED", Some(-1))).await;
    // a is on its last attempt (max_retry_count 3): a counted failure would end it.
    h.set(
        &ids[..1],
        &Setup {
            retry_count: Some(2),
            ..Setup::default()
        },
    )
    .await;
    let store = store(&h).await;
    let claimed = store.claim(due_failed(10, false)).await.expect("claim");
    assert_eq!(ids_of(&claimed), ids);
    let released = [(
        ParkedEvent {
            table: 0,
            id: ids[0],
            reason: "the producer failed; sent again".into(),
        },
        claimed[0].claim_token.clone(),
    )];
    let stale = [(
        ParkedEvent {
            table: 0,
            id: ids[1],
            reason: "not mine".into(),
        },
        ClaimToken("00000000-0000-4000-8000-000000000000".into()),
    )];
    let n = store
        .complete_claimed(ClaimedWriteBack {
            delivered: &[],
            failed: &[],
            released: &[released[0].clone(), stale[0].clone()],
            rejected: &[],
        })
        .await
        .expect("release");
    assert_eq!(n, 1, "only the claim still held is released");
    let row = h.row(ids[0]).await;
    assert_eq!(
        (row.status.as_str(), row.retry_count),
        ("FAILED", 2),
        "the attempt is not counted"
    );
    assert!(row.next_retry_in.is_some_and(|s| s <= 1.0), "due now");
    assert_eq!(
        row.last_error.as_deref(),
        Some("the producer failed; sent again")
    );
    assert!(row.claim_token.is_none() && !row.claimed, "claim cleared");
    assert_eq!(h.row(ids[1]).await.status, "PROCESSING", "stale token");
    let again = store
        .claim(due_failed(10, false))
        .await
        .expect("claim again");
    assert_eq!(ids_of(&again), [ids[0]], "due again at once");
    drop(store);
    h.cleanup().await;
}

/// PROCESSING rows claimed longer ago than the timeout go back to FAILED with the
/// reason (or to MANUAL_REQUIRED at max_retry_count); live claims stay; the late worker
/// of a reaped row cannot write over it.
pub async fn reaper_returns_expired_claims_to_failed_or_manual_required<H: Harness>() {
    let h: H = initialised("cl_reap", ReadMode::Log).await;
    let ids = h.insert(&NewRow::keys(&["a", "b", "c"])).await;
    h.set(&ids, &Setup::status("FAILED", Some(-1))).await;
    h.set(
        &ids[1..2],
        &Setup {
            retry_count: Some(2),
            ..Setup::default()
        },
    )
    .await;
    let store = store(&h).await;
    let claimed = store.claim(due_failed(10, false)).await.expect("claim");
    assert_eq!(claimed.len(), 3);
    // a and b were claimed ten minutes ago by a worker that died; c is fresh.
    h.set(
        &ids[..2],
        &Setup {
            claimed_ago: Some(600),
            ..Setup::default()
        },
    )
    .await;
    let policy = ReapPolicy {
        claim_timeout: Duration::from_secs(300),
        retry_delay: Duration::from_secs(30),
    };
    let schedule = store.retry_schedule().await.expect("schedule");
    let oldest = schedule.oldest_claim.expect("a claim");
    let age = SystemTime::now().duration_since(oldest).unwrap_or_default();
    assert!(age >= Duration::from_secs(590), "oldest claim {age:?} ago");

    let report = store.reap(policy).await.expect("reap");
    assert_eq!(
        report,
        ReapReport {
            failed: 1,
            manual_required: 1
        }
    );
    let a = h.row(ids[0]).await;
    assert_eq!((a.status.as_str(), a.retry_count), ("FAILED", 1));
    assert!(a.claim_token.is_none() && !a.claimed, "claim cleared");
    assert!(
        a.next_retry_in.is_some_and(|s| (20.0..=31.0).contains(&s)),
        "due after retry_delay: {:?}",
        a.next_retry_in
    );
    assert_eq!(a.last_error, Some(policy.reaped_reason()));
    assert_eq!(
        a.last_error.as_deref(),
        Some("claim expired after 5m (worker stopped while publishing)")
    );
    let b = h.row(ids[1]).await;
    assert_eq!((b.status.as_str(), b.retry_count), ("MANUAL_REQUIRED", 3));
    assert_eq!(
        h.row(ids[2]).await.status,
        "PROCESSING",
        "a live claim is left alone"
    );
    assert_eq!(
        store.reap(policy).await.expect("reap again"),
        ReapReport::default()
    );

    // The late worker of a cannot write over the reaped row.
    let late = [(
        Delivered {
            table: 0,
            id: ids[0],
            partition: 0,
            offset: 9,
        },
        claimed[0].claim_token.clone(),
    )];
    let n = store
        .complete_claimed(ClaimedWriteBack {
            delivered: &late,
            failed: &[],
            released: &[],
            rejected: &[],
        })
        .await
        .expect("late write-back");
    assert_eq!(n, 0);
    assert_eq!(h.row(ids[0]).await.status, "FAILED");
    drop(store);
    h.cleanup().await;
}

/// Rows parked by the log path become FAILED, due now, `retry_count` unchanged, with the
/// reason; only INIT rows are parked; the key is blocked and strict claims wait for the
/// earlier failed row.
pub async fn parked_rows_become_failed_and_due_with_the_reason<H: Harness>() {
    let h: H = initialised("cl_park", ReadMode::Log).await;
    let ids = h.insert(&NewRow::keys(&["a", "a", "b"])).await;
    h.set(&ids[2..], &Setup::status("SUCCESS", None)).await;
    let store = store(&h).await;
    let parked = [
        ParkedEvent {
            table: 0,
            id: ids[1],
            reason: "parked: an earlier event of biz_key a is FAILED".into(),
        },
        ParkedEvent {
            table: 0,
            id: ids[2],
            reason: "too late".into(),
        },
    ];
    let failed = [DeliveryFailure {
        table: 0,
        id: ids[0],
        error: "topic missing".into(),
        retry_delay: Duration::from_secs(10),
    }];
    store
        .write_back(WriteBack {
            delivered: &[],
            failed: &failed,
            parked: &parked,
            rejected: &[],
            checkpoint: None,
            replace_positions: false,
        })
        .await
        .expect("write back");
    let p = h.row(ids[1]).await;
    assert_eq!((p.status.as_str(), p.retry_count), ("FAILED", 0));
    assert!(
        p.next_retry_in.is_some_and(|s| s <= 0.5),
        "due at once: {:?}",
        p.next_retry_in
    );
    assert_eq!(
        p.last_error.as_deref(),
        Some("parked: an earlier event of biz_key a is FAILED")
    );
    assert_eq!(
        h.row(ids[2]).await.status,
        "SUCCESS",
        "only INIT rows are parked"
    );
    assert_eq!(
        store.blocked_keys(None).await.expect("blocked"),
        HashSet::from(["a".to_owned()])
    );
    // Strict: the parked row waits for the failed one even though it is due first.
    let strict = store.claim(due_failed(10, true)).await.expect("claim");
    assert!(strict.is_empty(), "{:?}", ids_of(&strict));
    drop(store);
    h.cleanup().await;
}

/// A row that cannot become an event, seen in the log, becomes MANUAL_REQUIRED with the
/// reason and due (so it holds its key back), no attempt counted, only while INIT; a
/// claimed one likewise, only where the claim still holds.
pub async fn rejected_rows_need_an_operator_and_hold_their_key<H: Harness>() {
    let h: H = initialised("cl_rej", ReadMode::Log).await;
    let ids = h.insert(&NewRow::keys(&["a", "a", "b", "c"])).await;
    h.set(&ids[2..3], &Setup::status("SUCCESS", None)).await;
    h.set(&ids[3..4], &Setup::status("FAILED", Some(-1))).await;
    let store = store(&h).await;
    let reason = |i: usize| ParkedEvent {
        table: 0,
        id: ids[i],
        reason: format!("cannot be published: column `message_type` of row {i} is NULL"),
    };
    store
        .write_back(WriteBack {
            rejected: &[reason(0), reason(2)],
            ..WriteBack::default()
        })
        .await
        .expect("write back");
    let r = h.row(ids[0]).await;
    assert_eq!((r.status.as_str(), r.retry_count), ("MANUAL_REQUIRED", 0));
    assert_eq!(
        r.last_error.as_deref(),
        Some("cannot be published: column `message_type` of row 0 is NULL")
    );
    assert!(
        r.next_retry_in.is_some(),
        "visible to the blocked-key look-ups"
    );
    assert_eq!(h.row(ids[2]).await.status, "SUCCESS", "only INIT rows");
    assert_eq!(
        store
            .blocked_keys(Some(&["a".to_owned()]))
            .await
            .expect("blocked"),
        HashSet::from(["a".to_owned()])
    );

    let claimed = store.claim(due_failed(10, false)).await.expect("claim");
    assert_eq!(ids_of(&claimed), [ids[3]]);
    let n = store
        .complete_claimed(ClaimedWriteBack {
            rejected: &[(reason(3), claimed[0].claim_token.clone())],
            ..ClaimedWriteBack::default()
        })
        .await
        .expect("reject claimed");
    assert_eq!(n, 1);
    let c = h.row(ids[3]).await;
    assert_eq!((c.status.as_str(), c.retry_count), ("MANUAL_REQUIRED", 0));
    assert!(c.claim_token.is_none() && !c.claimed, "claim cleared");
    assert!(c.last_error.is_some_and(|e| e.contains("row 3")));
    drop(store);
    h.cleanup().await;
}

/// Blocked keys are those with a FAILED, PROCESSING or MANUAL_REQUIRED row (of all keys
/// or of the keys asked about); the schedule's next due time is the earliest FAILED
/// row's, never a MANUAL_REQUIRED one's.
pub async fn blocked_keys_and_retry_schedule_read_the_rows_in_trouble<H: Harness>() {
    let h: H = initialised("cl_block", ReadMode::Log).await;
    let ids = h
        .insert(&NewRow::keys(&["a", "b", "c", "d", "e", "f"]))
        .await;
    let store = store(&h).await;
    let schedule = store.retry_schedule().await.expect("schedule");
    assert_eq!((schedule.next_due, schedule.oldest_claim), (None, None));
    assert!(store.blocked_keys(None).await.expect("blocked").is_empty());

    h.set(&ids[0..1], &Setup::status("FAILED", Some(20))).await;
    h.set(&ids[1..2], &Setup::status("FAILED", Some(10))).await;
    h.set(&ids[2..3], &Setup::status("MANUAL_REQUIRED", Some(-86400)))
        .await;
    h.set(&ids[3..4], &Setup::status("SUCCESS", None)).await;
    let keys = |k: &[&str]| k.iter().map(|s| (*s).to_owned()).collect::<HashSet<_>>();
    assert_eq!(
        store.blocked_keys(None).await.expect("all"),
        keys(&["a", "b", "c"])
    );
    let some: Vec<String> = ["b", "d", "e", "zz"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    assert_eq!(
        store.blocked_keys(Some(&some)).await.expect("some"),
        keys(&["b"])
    );
    assert!(store
        .blocked_keys(Some(&[]))
        .await
        .expect("none")
        .is_empty());

    let schedule = store.retry_schedule().await.expect("schedule");
    let due = schedule.next_due.expect("a FAILED row");
    let in_secs = due
        .duration_since(SystemTime::now())
        .map_or(0.0, |d| d.as_secs_f64());
    assert!((8.0..=10.5).contains(&in_secs), "next due in {in_secs}s");
    assert_eq!(schedule.oldest_claim, None, "MANUAL_REQUIRED is never due");

    // A claim shows up as the oldest claim and blocks its key.
    h.set(&ids[4..5], &Setup::status("FAILED", Some(-1))).await;
    let claimed = store.claim(due_failed(10, false)).await.expect("claim");
    assert_eq!(ids_of(&claimed), [ids[4]]);
    let schedule = store.retry_schedule().await.expect("schedule");
    assert!(schedule.oldest_claim.is_some(), "the PROCESSING row");
    assert!(store
        .blocked_keys(None)
        .await
        .expect("blocked")
        .contains("e"));
    drop(store);
    h.cleanup().await;
}
