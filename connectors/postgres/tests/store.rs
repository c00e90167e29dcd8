//! The PostgreSQL outbox store against a real server: status transitions, idempotent
//! replay, a checkpoint that never moves backward, HOT SUCCESS write-backs; claims (SKIP
//! LOCKED, strict per-key order, poll mode), claim-token write-backs, the reaper, parked
//! rows, the retry schedule, blocked keys, and the plans of the statements that must stay
//! cheap on a large table.

mod support_store;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use bytes::Bytes;
use outboxd_connector::{
    ClaimRequest, ClaimScope, ClaimedEvent, ClaimedWriteBack, Delivered, DeliveryFailure,
    OutboxStore, ParkedEvent, Position, ReapPolicy, ReapReport, WriteBack,
};
use support_store::Fixture;

async fn initialised(prefix: &str) -> Fixture {
    let fx = Fixture::new(prefix).await;
    fx.connector.init().await.expect("init");
    fx
}

struct RowState {
    status: String,
    retry_count: i32,
    last_error: Option<String>,
    /// Seconds from now to next_retry_time.
    retry_in: Option<f64>,
    sent: bool,
    partition: Option<i32>,
    offset: Option<i64>,
}

async fn row(fx: &Fixture, id: i64) -> RowState {
    let sql = format!(
        "SELECT status, retry_count, last_error, \
         extract(epoch FROM next_retry_time - now())::float8, sent_at IS NOT NULL, \
         kafka_partition, kafka_offset FROM {} WHERE id = $1",
        fx.outbox()
    );
    let r = fx.client.query_one(&sql, &[&id]).await.expect("read row");
    RowState {
        status: r.get(0),
        retry_count: r.get(1),
        last_error: r.get(2),
        retry_in: r.get(3),
        sent: r.get(4),
        partition: r.get(5),
        offset: r.get(6),
    }
}

#[tokio::test]
async fn write_back_moves_rows_through_the_state_machine() {
    let fx = initialised("st_sm").await;
    let ids = fx.insert_rows(3, 3).await;
    let manual = fx.insert_rows(1, 1).await[0];
    let store = fx.connector.open_store().await.expect("open store");

    let delivered = [Delivered {
        id: ids[0],
        partition: 2,
        offset: 42,
    }];
    let failed = [
        DeliveryFailure {
            id: ids[1],
            error: "broker down".into(),
            retry_delay: Duration::from_secs(30),
        },
        DeliveryFailure {
            id: manual,
            error: "é".repeat(5000),
            retry_delay: Duration::from_millis(1500),
        },
    ];
    let batch = WriteBack {
        delivered: &delivered,
        failed: &failed,
        parked: &[],
        checkpoint: None,
    };
    store.write_back(batch).await.expect("write back");

    let ok = row(&fx, ids[0]).await;
    assert_eq!(ok.status, "SUCCESS");
    assert!(ok.sent);
    assert_eq!((ok.partition, ok.offset), (Some(2), Some(42)));
    assert_eq!(
        (ok.retry_count, ok.last_error, ok.retry_in),
        (0, None, None)
    );

    let failed_row = row(&fx, ids[1]).await;
    assert_eq!(failed_row.status, "FAILED");
    assert_eq!(failed_row.retry_count, 1);
    assert_eq!(failed_row.last_error.as_deref(), Some("broker down"));
    let due = failed_row.retry_in.expect("next_retry_time set");
    assert!(
        (25.0..=31.0).contains(&due),
        "next retry in {due}s, expected ~30s"
    );
    assert!(!failed_row.sent);

    let manual_row = row(&fx, manual).await;
    assert_eq!(manual_row.status, "MANUAL_REQUIRED");
    assert_eq!(manual_row.retry_count, 1);
    assert_eq!(manual_row.last_error.map(|e| e.chars().count()), Some(2000));

    let untouched = row(&fx, ids[2]).await;
    assert_eq!(
        (untouched.status.as_str(), untouched.retry_count),
        ("INIT", 0)
    );

    // Replaying the same batch (after a crash) changes nothing.
    store.write_back(batch).await.expect("replay");
    let again = row(&fx, ids[0]).await;
    assert_eq!(
        (again.status.as_str(), again.partition, again.offset),
        ("SUCCESS", Some(2), Some(42))
    );
    let again = row(&fx, ids[1]).await;
    assert_eq!((again.status.as_str(), again.retry_count), ("FAILED", 1));
    let again = row(&fx, manual).await;
    assert_eq!(
        (again.status.as_str(), again.retry_count),
        ("MANUAL_REQUIRED", 1)
    );

    // A FAILED row delivered later becomes SUCCESS and leaves the retry index;
    // a MANUAL_REQUIRED row stays for the operator; a late SUCCESS is not undone by a FAILED.
    let delivered = [
        Delivered {
            id: ids[1],
            partition: 0,
            offset: 7,
        },
        Delivered {
            id: manual,
            partition: 0,
            offset: 8,
        },
    ];
    let late_failure = [DeliveryFailure {
        id: ids[0],
        error: "late".into(),
        retry_delay: Duration::from_secs(1),
    }];
    store
        .write_back(WriteBack {
            delivered: &delivered,
            failed: &late_failure,
            parked: &[],
            checkpoint: None,
        })
        .await
        .expect("second write back");
    let retried = row(&fx, ids[1]).await;
    assert_eq!(retried.status, "SUCCESS");
    assert_eq!(
        (retried.retry_count, retried.last_error, retried.retry_in),
        (1, None, None)
    );
    assert_eq!(retried.offset, Some(7));
    assert_eq!(row(&fx, manual).await.status, "MANUAL_REQUIRED");
    let first = row(&fx, ids[0]).await;
    assert_eq!(
        (first.status.as_str(), first.retry_count, first.offset),
        ("SUCCESS", 0, Some(42))
    );

    // Delivered and failed in one batch: delivered wins.
    let both = ids[2];
    let d = [Delivered {
        id: both,
        partition: 1,
        offset: 1,
    }];
    let f = [DeliveryFailure {
        id: both,
        error: "x".into(),
        retry_delay: Duration::ZERO,
    }];
    store
        .write_back(WriteBack {
            delivered: &d,
            failed: &f,
            parked: &[],
            checkpoint: None,
        })
        .await
        .expect("both");
    assert_eq!(row(&fx, both).await.status, "SUCCESS");

    // An empty batch is a no-op.
    store
        .write_back(WriteBack::default())
        .await
        .expect("empty batch");
}

#[tokio::test]
async fn checkpoint_never_moves_backward_and_commits_with_statuses() {
    let fx = initialised("st_ck").await;
    let store = fx.connector.open_store().await.expect("open store");
    assert_eq!(store.load_checkpoint().await.expect("load"), None);

    let at = |s: &str| s.parse::<Position>().expect("position");
    let ids = fx.insert_rows(1, 3).await;
    let delivered = [Delivered {
        id: ids[0],
        partition: 0,
        offset: 1,
    }];
    let p9 = at("lsn:9/FFFFFF00");
    store
        .write_back(WriteBack {
            delivered: &delivered,
            failed: &[],
            parked: &[],
            checkpoint: Some(&p9),
        })
        .await
        .expect("write back");
    assert_eq!(
        store.load_checkpoint().await.expect("load"),
        Some(p9.clone())
    );
    assert_eq!(row(&fx, ids[0]).await.status, "SUCCESS");

    // Backward: ignored. "lsn:10/0" sorts before "lsn:9/…" as text, so this also shows the
    // comparison is by LSN.
    for older in ["lsn:0/16B3748", "lsn:9/FFFFFEFF"] {
        let older = at(older);
        store
            .write_back(WriteBack {
                checkpoint: Some(&older),
                ..WriteBack::default()
            })
            .await
            .expect("older checkpoint");
        assert_eq!(
            store.load_checkpoint().await.expect("load"),
            Some(p9.clone())
        );
    }
    let p10 = at("lsn:10/0");
    store
        .write_back(WriteBack {
            checkpoint: Some(&p10),
            ..WriteBack::default()
        })
        .await
        .expect("newer checkpoint");
    assert_eq!(
        store.load_checkpoint().await.expect("load"),
        Some(p10.clone())
    );
    // The same position again is fine.
    store
        .write_back(WriteBack {
            checkpoint: Some(&p10),
            ..WriteBack::default()
        })
        .await
        .expect("same checkpoint");
    assert_eq!(store.load_checkpoint().await.expect("load"), Some(p10));

    // A second store (a restarted outboxd) reads the same checkpoint.
    let reopened = fx.connector.open_store().await.expect("reopen");
    assert_eq!(
        reopened.load_checkpoint().await.expect("load"),
        Some(at("lsn:10/0"))
    );
}

#[tokio::test]
async fn open_store_without_tables_is_a_definite_error() {
    let fx = support_store::Fixture::new("st_nt").await;
    let err = fx.connector.open_store().await.expect_err("no tables yet");
    assert!(!err.is_transient(), "{err}");
    assert!(err.to_string().contains("outboxd init"), "{err}");
}

#[tokio::test]
async fn success_write_back_is_a_hot_update() {
    let fx = initialised("st_hot").await;
    let ids = fx.insert_rows(2000, 10).await;
    let store = fx.connector.open_store().await.expect("open store");
    for (n, id) in ids.iter().enumerate() {
        let offset = i64::try_from(n).expect("small");
        let d = [Delivered {
            id: *id,
            partition: 0,
            offset,
        }];
        let position: Position = format!("lsn:0/{:X}", 0x100_0000 + n).parse().expect("lsn");
        store
            .write_back(WriteBack {
                delivered: &d,
                failed: &[],
                parked: &[],
                checkpoint: Some(&position),
            })
            .await
            .expect("write back");
    }
    // Closing the store's connection makes its backend flush its statistics.
    drop(store);

    let (schema, table) = (fx.schema.clone(), "outbox");
    let deadline = Instant::now() + Duration::from_secs(60);
    let (updates, hot) = loop {
        fx.client
            .batch_execute("SELECT pg_stat_clear_snapshot()")
            .await
            .expect("clear");
        let r = fx
            .client
            .query_one(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables \
                 WHERE schemaname = $1 AND relname = $2",
                &[&schema, &table],
            )
            .await
            .expect("stats");
        let (updates, hot): (i64, i64) = (r.get(0), r.get(1));
        if updates >= 2000 || Instant::now() > deadline {
            break (updates, hot);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        updates >= 2000,
        "statistics show {updates} updates of 2000 after 60s"
    );
    assert!(
        hot > 0,
        "none of {updates} SUCCESS write-backs was a HOT update"
    );
    eprintln!("{hot} of {updates} SUCCESS write-backs were HOT");
    let success: i64 = fx
        .client
        .query_one(
            &format!(
                "SELECT count(*) FROM {} WHERE status = 'SUCCESS'",
                fx.outbox()
            ),
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(success, 2000);
}

fn due_failed(limit: usize, strict_order: bool) -> ClaimRequest {
    ClaimRequest {
        scope: ClaimScope::DueFailed,
        limit,
        strict_order,
    }
}

fn poll(limit: usize, strict_order: bool) -> ClaimRequest {
    ClaimRequest {
        scope: ClaimScope::NewAndDueFailed,
        limit,
        strict_order,
    }
}

fn ids_of(claimed: &[ClaimedEvent]) -> Vec<i64> {
    claimed.iter().map(|c| c.event.id).collect()
}

/// `(status, retry_count, claim_token IS NOT NULL, claimed_at IS NOT NULL,
/// next_retry_time IS NOT NULL, last_error)` of a row.
async fn claim_state(fx: &Fixture, id: i64) -> (String, i32, bool, bool, bool, Option<String>) {
    let sql = format!(
        "SELECT status, retry_count, claim_token IS NOT NULL, claimed_at IS NOT NULL, \
         next_retry_time IS NOT NULL, last_error FROM {} WHERE id = $1",
        fx.outbox()
    );
    let r = fx.client.query_one(&sql, &[&id]).await.expect("row");
    (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5))
}

#[tokio::test]
async fn claim_takes_due_failed_rows_in_id_order_and_builds_events_like_the_stream() {
    let fx = initialised("st_claim").await;
    let ids = fx.insert_keyed(&["a", "b", "c", "d"]).await;
    fx.set_status(&ids[..2], "FAILED", Some("-1 second")).await;
    fx.set_status(&ids[2..3], "FAILED", Some("1 hour")).await; // not due
    let store = fx.connector.open_store().await.expect("open store");

    let claimed = store.claim(due_failed(10, false)).await.expect("claim");
    assert_eq!(
        ids_of(&claimed),
        ids[..2],
        "due FAILED rows only, in id order"
    );
    let e = &claimed[0].event;
    assert_eq!(e.biz_key, "a");
    assert_eq!(&e.key[..], b"a");
    assert_eq!(
        &e.payload[..],
        br#"{"k": 1}"#,
        "jsonb text, as the stream sends it"
    );
    assert_eq!(
        e.headers,
        vec![
            ("n".to_owned(), Bytes::from_static(b"7")),
            ("trace".to_owned(), Bytes::from_static(b"abc")),
        ]
    );
    assert_eq!(
        (e.retry_count, e.max_retry_count, e.commit_time),
        (0, 3, None)
    );
    let (date, time) = e.created_at.split_once('T').expect("ISO 8601 with T");
    assert_eq!(date.len(), 10, "{}", e.created_at);
    assert!(
        time.ends_with("+00"),
        "UTC like the stream: {}",
        e.created_at
    );
    assert_ne!(claimed[0].claim_token, claimed[1].claim_token);

    let (status, _, token, claimed_at, next, _) = claim_state(&fx, ids[0]).await;
    assert_eq!(status, "PROCESSING");
    assert!(
        token && claimed_at && next,
        "claim recorded, row stays in the retry index"
    );
    assert!(store
        .claim(due_failed(10, false))
        .await
        .expect("again")
        .is_empty());
    assert_eq!(
        fx.status(ids[3]).await,
        "INIT",
        "the retry claim never takes INIT rows"
    );
}

#[tokio::test]
async fn concurrent_claimers_skip_locked_rows_and_never_share_one() {
    let fx = initialised("st_skip").await;
    let ids = fx.insert_rows(300, 10).await;
    fx.set_status(&ids, "FAILED", Some("-1 second")).await;

    // A row locked by another transaction is skipped, not waited for.
    let mut other = fx.env.client().await;
    let tx = other.transaction().await.expect("tx");
    tx.execute(
        &format!("SELECT 1 FROM {} WHERE id = $1 FOR UPDATE", fx.outbox()),
        &[&ids[0]],
    )
    .await
    .expect("lock");
    let store = fx.connector.open_store().await.expect("open store");
    let started = Instant::now();
    let first = tokio::time::timeout(Duration::from_secs(5), store.claim(due_failed(1, false)))
        .await
        .expect("claim does not wait for a locked row")
        .expect("claim");
    assert_eq!(ids_of(&first), [ids[1]], "locked row skipped");
    assert!(started.elapsed() < Duration::from_secs(5));
    tx.rollback().await.expect("rollback");

    // Four claimers racing: every row claimed exactly once.
    let stores = futures_util::future::try_join_all((0..4).map(|_| fx.connector.open_store()))
        .await
        .expect("stores");
    let rounds = stores.iter().map(|s| async move {
        let mut mine = Vec::new();
        loop {
            let got = s.claim(due_failed(7, false)).await.expect("claim");
            if got.is_empty() {
                return mine;
            }
            mine.extend(ids_of(&got));
        }
    });
    let per_claimer = futures_util::future::join_all(rounds).await;
    let mut all: Vec<i64> = per_claimer.iter().flatten().copied().collect();
    let total = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(total, all.len(), "a row was claimed twice");
    let mut expected = ids[2..].to_vec();
    expected.push(ids[0]);
    expected.sort_unstable();
    assert_eq!(all, expected);
    assert!(
        per_claimer.iter().filter(|c| !c.is_empty()).count() > 1,
        "claims were spread over claimers: {:?}",
        per_claimer.iter().map(Vec::len).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn strict_claim_takes_only_the_earliest_row_of_each_blocked_key() {
    let fx = initialised("st_strict").await;
    let ids = fx.insert_keyed(&["a", "a", "b", "c", "c", "a"]).await;
    let (a1, a2, b1, c1, c2, a3) = (ids[0], ids[1], ids[2], ids[3], ids[4], ids[5]);
    fx.set_status(&[a1, a2, a3, b1, c2], "FAILED", Some("-1 second"))
        .await;
    fx.set_status(&[c1], "MANUAL_REQUIRED", Some("-1 hour"))
        .await;
    let store = fx.connector.open_store().await.expect("open store");

    let first = store.claim(due_failed(100, true)).await.expect("claim");
    assert_eq!(
        ids_of(&first),
        [a1, b1],
        "c2 waits behind MANUAL_REQUIRED c1"
    );
    // a2 is still held back: a1 is PROCESSING now.
    assert!(store
        .claim(due_failed(100, true))
        .await
        .expect("claim")
        .is_empty());

    let done = [(
        Delivered {
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
        })
        .await
        .expect("complete");
    assert_eq!(n, 1);
    let next = store.claim(due_failed(100, true)).await.expect("claim");
    assert_eq!(ids_of(&next), [a2], "released in id order, one at a time");

    // Relaxed: everything due, blocked or not.
    let relaxed = store.claim(due_failed(100, false)).await.expect("claim");
    assert_eq!(ids_of(&relaxed), [c2, a3]);
}

#[tokio::test]
async fn poll_claim_takes_init_and_due_failed_rows_in_key_order() {
    let fx = Fixture::new("st_poll").await;
    fx.connector.init_with(true).await.expect("init poll mode");
    let ids = fx.insert_keyed(&["k", "l", "m", "k", "m", "n"]).await;
    let (k1, l1, m1, k2, m2, n1) = (ids[0], ids[1], ids[2], ids[3], ids[4], ids[5]);
    fx.set_status(&[m1], "FAILED", Some("-1 second")).await;
    let store = fx.connector.open_store().await.expect("open store");

    let n2 = fx.insert_keyed(&["n"]).await[0];
    let strict = store.claim(poll(100, true)).await.expect("claim");
    assert_eq!(
        ids_of(&strict),
        [k1, l1, m1, n1],
        "one row per key, the earliest"
    );
    let rest = store.claim(poll(100, false)).await.expect("claim");
    assert_eq!(ids_of(&rest), [k2, m2, n2]);
    let (status, _, _, _, next, _) = claim_state(&fx, k2).await;
    assert_eq!(status, "PROCESSING");
    assert!(next, "a row claimed from INIT is in the retry index too");
}

#[tokio::test]
async fn strict_poll_claim_waits_for_an_earlier_row_locked_elsewhere() {
    let fx = Fixture::new("st_poll_lock").await;
    fx.connector.init_with(true).await.expect("init poll mode");
    let ids = fx.insert_keyed(&["k", "k", "j"]).await;
    let mut other = fx.env.client().await;
    let tx = other.transaction().await.expect("tx");
    tx.execute(
        &format!("SELECT 1 FROM {} WHERE id = $1 FOR UPDATE", fx.outbox()),
        &[&ids[0]],
    )
    .await
    .expect("lock");
    let store = fx.connector.open_store().await.expect("open store");
    let strict = store.claim(poll(100, true)).await.expect("claim");
    assert_eq!(
        ids_of(&strict),
        [ids[2]],
        "k's second row waits for its first"
    );
    let relaxed = store.claim(poll(100, false)).await.expect("claim");
    assert_eq!(ids_of(&relaxed), [ids[1]], "relaxed takes it");
    tx.rollback().await.expect("rollback");
}

#[tokio::test]
async fn complete_claimed_writes_only_where_the_claim_still_holds() {
    let fx = initialised("st_complete").await;
    let ids = fx.insert_keyed(&["a", "b", "c", "d"]).await;
    fx.set_status(&ids, "FAILED", Some("-1 second")).await;
    // d is on its last attempt (max_retry_count 3).
    fx.client
        .execute(
            &format!("UPDATE {} SET retry_count = 2 WHERE id = $1", fx.outbox()),
            &[&ids[3]],
        )
        .await
        .expect("retry_count");
    let store = fx.connector.open_store().await.expect("open store");
    let claimed = store.claim(due_failed(10, false)).await.expect("claim");
    assert_eq!(ids_of(&claimed), ids);
    let token = |i: usize| claimed[i].claim_token.clone();

    // b's claim is lost: reaped and claimed again by someone else.
    fx.client
        .execute(
            &format!(
                "UPDATE {} SET claim_token = gen_random_uuid() WHERE id = $1",
                fx.outbox()
            ),
            &[&ids[1]],
        )
        .await
        .expect("steal");
    let delivered = [
        (
            Delivered {
                id: ids[0],
                partition: 3,
                offset: 33,
            },
            token(0),
        ),
        (
            Delivered {
                id: ids[1],
                partition: 3,
                offset: 34,
            },
            token(1),
        ),
    ];
    let failure = |i: usize| DeliveryFailure {
        id: ids[i],
        error: format!("broker says no to {i}"),
        retry_delay: Duration::from_secs(60),
    };
    let failed = [(failure(2), token(2)), (failure(3), token(3))];
    let n = store
        .complete_claimed(ClaimedWriteBack {
            delivered: &delivered,
            failed: &failed,
        })
        .await
        .expect("complete");
    assert_eq!(n, 3, "the lost claim is not written");

    let ok = row(&fx, ids[0]).await;
    assert_eq!(
        (
            ok.status.as_str(),
            ok.partition,
            ok.offset,
            ok.retry_in,
            ok.sent
        ),
        ("SUCCESS", Some(3), Some(33), None, true)
    );
    let (_, _, token_left, claimed_left, _, _) = claim_state(&fx, ids[0]).await;
    assert!(!token_left && !claimed_left, "claim cleared");
    assert_eq!(
        fx.status(ids[1]).await,
        "PROCESSING",
        "the newer claim is untouched"
    );
    let retry = row(&fx, ids[2]).await;
    assert_eq!((retry.status.as_str(), retry.retry_count), ("FAILED", 1));
    assert!(retry.retry_in.is_some_and(|s| (50.0..=61.0).contains(&s)));
    assert_eq!(retry.last_error.as_deref(), Some("broker says no to 2"));
    let manual = row(&fx, ids[3]).await;
    assert_eq!(
        (manual.status.as_str(), manual.retry_count),
        ("MANUAL_REQUIRED", 3)
    );
    assert!(
        manual.retry_in.is_some(),
        "manual rows keep next_retry_time"
    );

    // Replaying the same write-back changes nothing.
    let again = store
        .complete_claimed(ClaimedWriteBack {
            delivered: &delivered,
            failed: &failed,
        })
        .await
        .expect("replay");
    assert_eq!(again, 0);
}

#[tokio::test]
async fn reaper_returns_expired_claims_to_failed_or_manual_required() {
    let fx = initialised("st_reap").await;
    let ids = fx.insert_keyed(&["a", "b", "c"]).await;
    fx.set_status(&ids, "FAILED", Some("-1 second")).await;
    fx.client
        .execute(
            &format!("UPDATE {} SET retry_count = 2 WHERE id = $1", fx.outbox()),
            &[&ids[1]],
        )
        .await
        .expect("retry_count");
    let store = fx.connector.open_store().await.expect("open store");
    let claimed = store.claim(due_failed(10, false)).await.expect("claim");
    assert_eq!(claimed.len(), 3);
    // a and b were claimed ten minutes ago by a worker that died; c is fresh.
    fx.client
        .execute(
            &format!(
                "UPDATE {} SET claimed_at = now() - interval '10 minutes' WHERE id = ANY($1)",
                fx.outbox()
            ),
            &[&&ids[..2]],
        )
        .await
        .expect("age claims");
    let policy = ReapPolicy {
        claim_timeout: Duration::from_secs(300),
        retry_delay: Duration::from_secs(30),
    };
    let schedule = store.retry_schedule().await.expect("schedule");
    assert!(schedule.oldest_claim.is_some());
    let report = store.reap(policy).await.expect("reap");
    assert_eq!(
        report,
        ReapReport {
            failed: 1,
            manual_required: 1
        }
    );
    let (status, retries, token, claimed_at, next, error) = claim_state(&fx, ids[0]).await;
    assert_eq!(
        (status.as_str(), retries, token, claimed_at, next),
        ("FAILED", 1, false, false, true)
    );
    assert_eq!(
        error.as_deref(),
        Some("claim expired after 5m (worker stopped while publishing)")
    );
    assert_eq!(fx.status(ids[1]).await, "MANUAL_REQUIRED");
    assert_eq!(
        fx.status(ids[2]).await,
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
        })
        .await
        .expect("late write-back");
    assert_eq!(n, 0);
    assert_eq!(fx.status(ids[0]).await, "FAILED");
}

#[tokio::test]
async fn parked_rows_become_failed_and_due_with_the_reason() {
    let fx = initialised("st_park").await;
    let ids = fx.insert_keyed(&["a", "a", "b"]).await;
    fx.set_status(&ids[2..], "SUCCESS", None).await;
    let store = fx.connector.open_store().await.expect("open store");
    let parked = [
        ParkedEvent {
            id: ids[1],
            reason: "parked: an earlier event of biz_key a is FAILED".into(),
        },
        ParkedEvent {
            id: ids[2],
            reason: "too late".into(),
        },
    ];
    let failed = [DeliveryFailure {
        id: ids[0],
        error: "topic missing".into(),
        retry_delay: Duration::from_secs(10),
    }];
    store
        .write_back(WriteBack {
            delivered: &[],
            failed: &failed,
            parked: &parked,
            checkpoint: None,
        })
        .await
        .expect("write back");
    let p = row(&fx, ids[1]).await;
    assert_eq!((p.status.as_str(), p.retry_count), ("FAILED", 0));
    assert!(
        p.retry_in.is_some_and(|s| s <= 0.5),
        "due at once: {:?}",
        p.retry_in
    );
    assert_eq!(
        p.last_error.as_deref(),
        Some("parked: an earlier event of biz_key a is FAILED")
    );
    assert_eq!(
        fx.status(ids[2]).await,
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
}

#[tokio::test]
async fn blocked_keys_and_retry_schedule_read_the_rows_in_trouble() {
    let fx = initialised("st_blocked").await;
    let ids = fx.insert_keyed(&["a", "b", "c", "d", "e"]).await;
    let store = fx.connector.open_store().await.expect("open store");
    let schedule = store.retry_schedule().await.expect("schedule");
    assert_eq!((schedule.next_due, schedule.oldest_claim), (None, None));
    assert!(store.blocked_keys(None).await.expect("blocked").is_empty());

    fx.set_status(&ids[0..1], "FAILED", Some("20 seconds"))
        .await;
    fx.set_status(&ids[1..2], "FAILED", Some("10 seconds"))
        .await;
    fx.set_status(&ids[2..3], "MANUAL_REQUIRED", Some("-1 day"))
        .await;
    fx.set_status(&ids[3..4], "SUCCESS", None).await;
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
        .duration_since(std::time::SystemTime::now())
        .map_or(0.0, |d| d.as_secs_f64());
    assert!((8.0..=10.5).contains(&in_secs), "next due in {in_secs}s");
    assert_eq!(schedule.oldest_claim, None, "MANUAL_REQUIRED is never due");
}

/// With 20,000 SUCCESS rows and a few in trouble, the statements the retry worker runs
/// all the time use the partial indexes, never a sequential scan of the outbox.
#[tokio::test]
async fn hot_statements_use_the_partial_indexes_on_a_large_table() {
    let fx = Fixture::new("st_explain").await;
    fx.connector.init_with(true).await.expect("init");
    fx.client
        .batch_execute(&format!(
            "INSERT INTO {0} (message_id, message_type, biz_key, payload, status, sent_at) \
             SELECT 'm-' || g, 'order.created', 'k-' || g, '{{}}', 'SUCCESS', now() \
             FROM generate_series(1, 20000) g; \
             INSERT INTO {0} (message_id, message_type, biz_key, payload, status, next_retry_time) \
             SELECT 'f-' || g, 'order.failed', 'k-' || (g * 7), '{{}}', \
             (ARRAY['FAILED', 'PROCESSING', 'MANUAL_REQUIRED'])[1 + g % 3], now() \
             FROM generate_series(1, 30) g; \
             INSERT INTO {0} (message_id, message_type, biz_key, payload) \
             SELECT 'i-' || g, 'order.new', 'k-' || g, '{{}}' FROM generate_series(1, 20) g; \
             ANALYZE {0}",
            fx.outbox()
        ))
        .await
        .expect("fill");
    let store = fx.connector.open_store().await.expect("open store");
    let plans = store.explain_hot_statements().await.expect("explain");
    assert_eq!(plans.len(), 6);
    for (name, plan) in &plans {
        eprintln!("-- {name}\n{plan}\n");
        assert!(
            !plan.contains("Seq Scan on outbox"),
            "{name} scans the table:\n{plan}"
        );
        assert!(
            plan.contains("outbox_retry_due_idx") || plan.contains("outbox_key_retry_idx"),
            "{name} uses neither partial index:\n{plan}"
        );
    }
    let plan = |name: &str| {
        plans
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.clone())
            .unwrap_or_default()
    };
    assert!(plan("retry claim").contains("outbox_retry_due_idx"));
    assert!(plan("strict retry claim").contains("outbox_key_retry_idx"));
    assert!(plan("blocked keys").contains("outbox_key_retry_idx"));
    assert!(plan("strict poll claim").contains("outbox_poll_idx"));
}

/// The log can hand over a commit a moment before the committing session makes it
/// visible: the write-back waits for such rows instead of leaving them INIT behind a
/// checkpoint that already passed them.
#[tokio::test]
async fn write_back_waits_for_rows_of_a_commit_not_visible_yet() {
    let fx = initialised("st_visible").await;
    let store = fx.connector.open_store().await.expect("open store");
    let mut writer = fx.env.client().await;
    let tx = writer.transaction().await.expect("tx");
    let id: i64 = tx
        .query_one(
            &format!(
                "INSERT INTO {} (message_id, message_type, biz_key, payload) \
                 VALUES ('late', 't', 'k', '{{}}') RETURNING id",
                fx.outbox()
            ),
            &[],
        )
        .await
        .expect("insert")
        .get(0);
    let delivered = [Delivered {
        id,
        partition: 0,
        offset: 5,
    }];
    let position: Position = "lsn:0/2000".parse().expect("lsn");
    let write_back = store.write_back(WriteBack {
        delivered: &delivered,
        checkpoint: Some(&position),
        ..WriteBack::default()
    });
    let commit_later = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        tx.commit().await.expect("commit");
    };
    let (written, ()) = tokio::join!(write_back, commit_later);
    written.expect("write back");
    assert_eq!(fx.status(id).await, "SUCCESS");
    assert_eq!(store.load_checkpoint().await.expect("load"), Some(position));

    // A row that never shows up (deleted) holds the write-back only briefly.
    let gone = [Delivered {
        id: id + 1_000_000,
        partition: 0,
        offset: 6,
    }];
    let started = Instant::now();
    store
        .write_back(WriteBack {
            delivered: &gone,
            ..WriteBack::default()
        })
        .await
        .expect("write back of a missing row");
    assert!(started.elapsed() < Duration::from_secs(5));
}
