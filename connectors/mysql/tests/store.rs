//! The MySQL store's statements against a real MariaDB (`scripts/services`): write-back,
//! claims, claimed write-back, reaper, schedule, blocked keys and the operator's actions.

mod support;

use std::time::Duration;

use mysql_async::prelude::Queryable;
use outboxd_connector::{
    ClaimRequest, ClaimScope, ClaimToken, ClaimedWriteBack, Delivered, DeliveryFailure,
    JanitorAction, OutboxAdmin, OutboxStore, ParkedEvent, ReapPolicy, RetrySelector, WriteBack,
};
use support::Fixture;

/// (status, retry_count, next_retry_time set, claim_token set, last_error)
type State = (String, i32, bool, bool, Option<String>);

async fn state(f: &Fixture, id: i64) -> State {
    let mut conn = f.sql().await;
    let row: Option<(String, i32, bool, bool, Option<String>)> = conn
        .query_first(format!(
            "SELECT status, retry_count, next_retry_time IS NOT NULL, claim_token IS NOT NULL, \
             last_error FROM `{}` WHERE id = {id}",
            f.table
        ))
        .await
        .expect("row");
    row.expect("row exists")
}

/// Inserts rows `(key, seq)` and returns their ids.
async fn insert(f: &Fixture, rows: &[(&str, u32)]) -> Vec<i64> {
    let mut conn = f.sql().await;
    let mut ids = Vec::new();
    for (key, seq) in rows {
        conn.query_drop(f.insert_sql(key, *seq, "s"))
            .await
            .expect("insert");
        ids.push(
            conn.last_insert_id()
                .and_then(|id| i64::try_from(id).ok())
                .expect("id"),
        );
    }
    ids
}

async fn exec(f: &Fixture, sql: String) {
    f.sql().await.query_drop(sql).await.expect("statement");
}

fn claim(scope: ClaimScope, strict: bool) -> ClaimRequest {
    ClaimRequest {
        scope,
        limit: 10,
        strict_order: strict,
    }
}

#[tokio::test]
async fn write_back_moves_rows_through_the_state_machine() {
    let f = Fixture::new("so_wb");
    f.connector.init().await.expect("init");
    let store = f.connector.open_store().await.expect("store");
    let ids = insert(&f, &[("a", 1), ("b", 1), ("c", 1), ("d", 1)]).await;
    exec(
        &f,
        format!(
            "UPDATE `{}` SET max_retry_count = 1 WHERE id = {}",
            f.table, ids[3]
        ),
    )
    .await;
    let fail = |id: i64| DeliveryFailure {
        id,
        error: "topic 'x' is not authorised; it's \"bad\"".into(),
        retry_delay: Duration::from_secs(60),
    };
    store
        .write_back(WriteBack {
            delivered: &[Delivered {
                id: ids[0],
                partition: 2,
                offset: 42,
            }],
            failed: &[fail(ids[1]), fail(ids[3])],
            parked: &[ParkedEvent {
                id: ids[2],
                reason: "parked: an earlier event of biz_key c is FAILED".into(),
            }],
            checkpoint: None,
        })
        .await
        .expect("write back");
    assert_eq!(
        state(&f, ids[0]).await,
        ("SUCCESS".into(), 0, false, false, None)
    );
    let (status, retries, due, _, error) = state(&f, ids[1]).await;
    assert_eq!((status.as_str(), retries, due), ("FAILED", 1, true));
    assert_eq!(
        error.as_deref(),
        Some("topic 'x' is not authorised; it's \"bad\"")
    );
    let (status, retries, due, _, error) = state(&f, ids[2]).await;
    assert_eq!((status.as_str(), retries, due), ("FAILED", 0, true));
    assert!(error.unwrap_or_default().starts_with("parked:"));
    assert_eq!(state(&f, ids[3]).await.0, "MANUAL_REQUIRED");
    let mut conn = f.sql().await;
    let landed: Option<(i32, i64, bool)> = conn
        .query_first(format!(
            "SELECT kafka_partition, kafka_offset, sent_at IS NOT NULL FROM `{}` WHERE id = {}",
            f.table, ids[0]
        ))
        .await
        .expect("landed");
    assert_eq!(landed, Some((2, 42, true)));

    // Replayed after a crash: harmless. SUCCESS is not undone, FAILED not counted twice.
    store
        .write_back(WriteBack {
            failed: &[fail(ids[0]), fail(ids[1])],
            ..WriteBack::default()
        })
        .await
        .expect("replay");
    assert_eq!(state(&f, ids[0]).await.0, "SUCCESS");
    assert_eq!(state(&f, ids[1]).await.1, 1);
    f.cleanup().await;
}

#[tokio::test]
async fn claims_skip_locked_rows_and_write_back_only_under_their_token() {
    let f = Fixture::new("so_claim");
    f.connector.init().await.expect("init");
    let store = f.connector.open_store().await.expect("store");
    let ids = insert(&f, &[("k", 1), ("k", 2), ("j", 1)]).await;
    exec(
        &f,
        format!(
            "UPDATE `{}` SET status = 'FAILED', retry_count = 1, \
             next_retry_time = NOW(6) - INTERVAL 1 SECOND WHERE id IN ({}, {})",
            f.table, ids[0], ids[1]
        ),
    )
    .await;

    // Strict: only the earliest row of key k.
    let strict = store
        .claim(claim(ClaimScope::DueFailed, true))
        .await
        .expect("strict claim");
    assert_eq!(strict.len(), 1);
    let claimed = &strict[0];
    assert_eq!(claimed.event.id, ids[0]);
    assert_eq!(claimed.event.retry_count, 1);
    assert_eq!(claimed.event.biz_key, "k");
    assert!(
        claimed.event.created_at.ends_with("+00:00"),
        "{}",
        claimed.event.created_at
    );
    assert_eq!(&claimed.event.payload[..], br#"{"key": "k", "seq": 1}"#);
    assert_eq!(claimed.claim_token.0.len(), 36);
    let (status, _, due, token, _) = state(&f, ids[0]).await;
    assert_eq!((status.as_str(), due, token), ("PROCESSING", true, true));

    // The key is still blocked (PROCESSING): the second row waits; relaxed takes it.
    assert!(store
        .claim(claim(ClaimScope::DueFailed, true))
        .await
        .expect("claim")
        .is_empty());
    let relaxed = store
        .claim(claim(ClaimScope::DueFailed, false))
        .await
        .expect("claim");
    assert_eq!(
        relaxed.iter().map(|c| c.event.id).collect::<Vec<_>>(),
        [ids[1]]
    );

    let schedule = store.retry_schedule().await.expect("schedule");
    assert!(schedule.oldest_claim.is_some());
    let blocked = store.blocked_keys(None).await.expect("blocked");
    assert!(
        blocked.contains("k") && !blocked.contains("j"),
        "{blocked:?}"
    );
    let some = store
        .blocked_keys(Some(&["j".to_owned(), "k".to_owned()]))
        .await
        .expect("blocked");
    assert_eq!(some.len(), 1);

    // A stale token changes nothing; the right one completes.
    let delivered = Delivered {
        id: ids[0],
        partition: 0,
        offset: 7,
    };
    let stale = store
        .complete_claimed(ClaimedWriteBack {
            delivered: &[(delivered.clone(), ClaimToken("not-the-token".into()))],
            failed: &[],
        })
        .await
        .expect("stale");
    assert_eq!(stale, 0);
    let done = store
        .complete_claimed(ClaimedWriteBack {
            delivered: &[(delivered, claimed.claim_token.clone())],
            failed: &[(
                DeliveryFailure {
                    id: ids[1],
                    error: "again".into(),
                    retry_delay: Duration::from_secs(30),
                },
                relaxed[0].claim_token.clone(),
            )],
        })
        .await
        .expect("complete");
    assert_eq!(done, 2);
    assert_eq!(
        state(&f, ids[0]).await,
        ("SUCCESS".into(), 1, false, false, None)
    );
    let (status, retries, due, token, error) = state(&f, ids[1]).await;
    assert_eq!(
        (status.as_str(), retries, due, token),
        ("FAILED", 2, true, false)
    );
    assert_eq!(error.as_deref(), Some("again"));
    f.cleanup().await;
}

#[tokio::test]
async fn poll_claims_take_init_rows_in_key_order() {
    let f = Fixture::new("so_poll");
    f.connector.init().await.expect("init");
    let store = f.connector.open_store().await.expect("store");
    let ids = insert(&f, &[("a", 1), ("a", 2), ("b", 1)]).await;
    let strict = store
        .claim(claim(ClaimScope::NewAndDueFailed, true))
        .await
        .expect("strict poll claim");
    let got: Vec<i64> = strict.iter().map(|c| c.event.id).collect();
    assert_eq!(got, [ids[0], ids[2]], "the first row of each key");
    let relaxed = store
        .claim(claim(ClaimScope::NewAndDueFailed, false))
        .await
        .expect("poll claim");
    assert_eq!(
        relaxed.iter().map(|c| c.event.id).collect::<Vec<_>>(),
        [ids[1]]
    );
    f.cleanup().await;
}

#[tokio::test]
async fn the_reaper_returns_expired_claims() {
    let f = Fixture::new("so_reap");
    f.connector.init().await.expect("init");
    let store = f.connector.open_store().await.expect("store");
    let ids = insert(&f, &[("a", 1), ("b", 1)]).await;
    exec(
        &f,
        format!(
            "UPDATE `{}` SET status = 'PROCESSING', claim_token = UUID(), \
             claimed_at = NOW(6) - INTERVAL 5 MINUTE, next_retry_time = NOW(6), \
             max_retry_count = IF(id = {}, 1, 10) WHERE id IN ({}, {})",
            f.table, ids[1], ids[0], ids[1]
        ),
    )
    .await;
    let report = store
        .reap(ReapPolicy {
            claim_timeout: Duration::from_secs(60),
            retry_delay: Duration::from_secs(1),
        })
        .await
        .expect("reap");
    assert_eq!((report.failed, report.manual_required), (1, 1));
    let (status, retries, due, token, error) = state(&f, ids[0]).await;
    assert_eq!(
        (status.as_str(), retries, due, token),
        ("FAILED", 1, true, false)
    );
    assert!(error.unwrap_or_default().contains("claim expired after 1m"));
    assert_eq!(state(&f, ids[1]).await.0, "MANUAL_REQUIRED");
    let again = store
        .reap(ReapPolicy {
            claim_timeout: Duration::from_secs(60),
            retry_delay: Duration::from_secs(1),
        })
        .await
        .expect("reap");
    assert_eq!((again.failed, again.manual_required), (0, 0));
    f.cleanup().await;
}

#[tokio::test]
async fn operator_actions_change_what_they_say() {
    let f = Fixture::new("so_ops");
    f.connector.init().await.expect("init");
    let store = f.connector.open_store().await.expect("store");
    let ids = insert(&f, &[("a", 1), ("b", 1), ("c", 1), ("d", 1)]).await;
    exec(
        &f,
        format!(
            "UPDATE `{}` SET status = 'MANUAL_REQUIRED', retry_count = 10, \
             next_retry_time = NOW(6) WHERE id = {}",
            f.table, ids[0]
        ),
    )
    .await;
    let summary = store.status_summary().await.expect("summary");
    let count = |status: &str| -> i64 {
        summary
            .counts
            .iter()
            .filter(|c| c.status == status)
            .map(|c| c.rows)
            .sum()
    };
    assert_eq!((count("INIT"), count("MANUAL_REQUIRED")), (3, 1));
    assert!(summary.oldest_unsent.is_some());
    assert!(summary.checkpoint.is_some(), "init recorded one");
    assert!(summary.source_lag_bytes.is_some());

    let retried = store
        .retry_rows(&RetrySelector::Status {
            status: "MANUAL_REQUIRED".into(),
            message_type: None,
        })
        .await
        .expect("retry");
    assert_eq!(retried, 1);
    assert_eq!(state(&f, ids[0]).await.0, "FAILED");
    assert_eq!(state(&f, ids[0]).await.1, 0);
    assert!(store
        .retry_rows(&RetrySelector::Status {
            status: "INIT".into(),
            message_type: None
        })
        .await
        .is_err());

    assert!(store.park_row(ids[1], "bad payload").await.expect("park"));
    let (status, _, due, _, error) = state(&f, ids[1]).await;
    assert_eq!((status.as_str(), due), ("MANUAL_REQUIRED", true));
    assert_eq!(error.as_deref(), Some("parked by operator: bad payload"));
    assert!(store
        .resolve_row(ids[1], "sent by hand")
        .await
        .expect("resolve"));
    assert_eq!(state(&f, ids[1]).await.0, "SUCCESS");
    assert!(!store.resolve_row(ids[1], "again").await.expect("resolve"));

    let init = store.scan_init(0, 10).await.expect("scan");
    assert_eq!(
        init.iter().map(|e| e.id).collect::<Vec<_>>(),
        [ids[2], ids[3]]
    );
    let init = store.scan_init(ids[2], 10).await.expect("scan");
    assert_eq!(init.len(), 1);

    let removed = store
        .janitor_batch(Duration::ZERO, &JanitorAction::Delete, 100)
        .await
        .expect("janitor");
    assert_eq!(removed, 1, "the resolved row, aged from its update");
    let archive = format!("{}_archive", f.table);
    store
        .write_back(WriteBack {
            delivered: &[Delivered {
                id: ids[2],
                partition: 0,
                offset: 1,
            }],
            ..WriteBack::default()
        })
        .await
        .expect("write back");
    let moved = store
        .janitor_batch(
            Duration::ZERO,
            &JanitorAction::Archive(archive.clone()),
            100,
        )
        .await
        .expect("archive");
    assert_eq!(moved, 1);
    let mut conn = f.sql().await;
    let archived: Option<i64> = conn
        .query_first(format!("SELECT COUNT(*) FROM `{archive}`"))
        .await
        .expect("archive count");
    assert_eq!(archived, Some(1));
    let _ = conn.query_drop(format!("DROP TABLE `{archive}`")).await;
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claimers_never_share_a_row() {
    let f = Fixture::new("so_conc");
    f.connector.init().await.expect("init");
    let rows: Vec<(String, u32)> = (0..40).map(|i| (format!("k{i}"), 1)).collect();
    let rows: Vec<(&str, u32)> = rows.iter().map(|(k, s)| (k.as_str(), *s)).collect();
    insert(&f, &rows).await;
    exec(
        &f,
        format!(
            "UPDATE `{}` SET status = 'FAILED', next_retry_time = NOW(6) - INTERVAL 1 SECOND",
            f.table
        ),
    )
    .await;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let store = f.connector.open_store().await.expect("store");
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let claimed = store
                    .claim(ClaimRequest {
                        scope: ClaimScope::DueFailed,
                        limit: 3,
                        strict_order: false,
                    })
                    .await
                    .expect("claim");
                if claimed.is_empty() {
                    return mine;
                }
                mine.extend(claimed.into_iter().map(|c| c.event.id));
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("claimer"));
    }
    let total = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        (total, all.len()),
        (40, 40),
        "every row claimed exactly once"
    );
    f.cleanup().await;
}
