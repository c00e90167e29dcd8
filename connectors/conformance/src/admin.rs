//! The operator's actions on the outbox through its [`TableAdmin`]: status, retry, park,
//! resolve, janitor; and the INIT scan of `recover` ([`OutboxStore::scan_init`]). Each
//! changes only the rows it says, and says why in `last_error`. The inbox's
//! `TableAdmin` runs in [`crate::inbox::operator_actions_cover_the_inbox`].

use std::time::{Duration, SystemTime};

use outboxd_connector::{
    JanitorAction, JanitorRule, OutboxStore, ReadMode, RetrySelector, TableAdmin, TableKind,
    WriteBack,
};

use crate::support::{initialised, refuses_rule, store, table_of};
use crate::{Harness, NewRow, Setup};

/// Counts by status and type, the oldest unsent row's age, the source lag (log mode),
/// and the checkpoint with the time it was written.
pub async fn status_summary_counts_rows_and_reads_the_checkpoint<H: Harness>() {
    let h: H = initialised("ad_status", ReadMode::Log).await;
    let rows: Vec<NewRow> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|k| NewRow::keyed(k).typed("order.created"))
        .collect();
    let ids = h.insert(&rows).await;
    h.set(&ids[..2], &Setup::status("SUCCESS", None)).await;
    h.set(&ids[2..3], &Setup::status("MANUAL_REQUIRED", Some(-3600)))
        .await;
    h.set(
        &ids[3..4],
        &Setup {
            created_ago: Some(3600),
            ..Setup::default()
        },
    )
    .await;
    let store = store(&h).await;
    let summary = store.status_summary().await.expect("summary");
    let count = |status: &str| {
        summary
            .counts
            .iter()
            .filter(|c| c.status == status)
            .map(|c| c.rows)
            .sum::<i64>()
    };
    assert_eq!(
        (count("INIT"), count("SUCCESS"), count("MANUAL_REQUIRED")),
        (2, 2, 1)
    );
    assert!(summary
        .counts
        .iter()
        .all(|c| c.message_type == "order.created"));
    let age = summary
        .oldest_unsent
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .expect("oldest unsent");
    assert!(
        (3500..3700).contains(&age.as_secs()),
        "oldest INIT row is an hour old: {age:?}"
    );
    assert!(summary.source_lag_bytes.is_some(), "log mode reads the lag");
    assert_eq!(
        summary.checkpoint.map(|(at, _)| at),
        store.load_checkpoint().await.expect("load"),
        "the checkpoint init left (none, or where the log stood)"
    );

    let position = h.positions()[0].clone();
    store
        .write_back(WriteBack {
            checkpoint: Some(&position),
            ..WriteBack::default()
        })
        .await
        .expect("checkpoint");
    let summary = store.status_summary().await.expect("summary");
    let (at, written) = summary.checkpoint.expect("checkpoint");
    assert_eq!(at, position);
    let written_ago = SystemTime::now()
        .duration_since(written)
        .unwrap_or_default();
    assert!(written_ago < Duration::from_secs(60), "{written_ago:?}");
    drop(store);
    h.cleanup().await;
}

/// `retry` by id or by status and type: FAILED, due now, `retry_count` 0, claim clear,
/// the last error kept; other rows untouched; INIT cannot be retried.
pub async fn retry_makes_rows_due_again<H: Harness>() {
    let h: H = initialised("ad_retry", ReadMode::Log).await;
    let ids = h.insert(&NewRow::keys(&["a", "b", "c", "d", "e"])).await;
    h.set(&ids[..3], &Setup::status("MANUAL_REQUIRED", Some(-3600)))
        .await;
    h.set(&ids[3..4], &Setup::status("FAILED", Some(3600)))
        .await;
    h.set(
        &ids[2..3],
        &Setup {
            retry_count: Some(3),
            last_error: Some("broker said no".into()),
            message_type: Some("special".into()),
            ..Setup::default()
        },
    )
    .await;
    let store = store(&h).await;

    // One row by id.
    let n = store
        .retry_rows(&RetrySelector::Id(ids[3]))
        .await
        .expect("retry");
    assert_eq!(n, 1);
    let d = h.row(ids[3]).await;
    assert_eq!((d.status.as_str(), d.retry_count), ("FAILED", 0));
    assert!(
        d.next_retry_in.is_some_and(|s| s <= 1.0),
        "due now: {:?}",
        d.next_retry_in
    );
    assert!(d.claim_token.is_none() && !d.claimed);

    // By status and type.
    let selector = |t: Option<&str>| RetrySelector::Status {
        status: "MANUAL_REQUIRED".into(),
        message_type: t.map(str::to_owned),
    };
    assert_eq!(
        store
            .retry_rows(&selector(Some("special")))
            .await
            .expect("retry"),
        1
    );
    let c = h.row(ids[2]).await;
    assert_eq!((c.status.as_str(), c.retry_count), ("FAILED", 0));
    assert_eq!(
        c.last_error.as_deref(),
        Some("broker said no"),
        "the last error stays"
    );
    assert_eq!(store.retry_rows(&selector(None)).await.expect("retry"), 2);
    assert_eq!(store.retry_rows(&selector(None)).await.expect("retry"), 0);
    assert_eq!(h.row(ids[0]).await.status, "FAILED");
    assert_eq!(h.row(ids[4]).await.status, "INIT");

    // INIT rows are not retried.
    assert_eq!(
        store
            .retry_rows(&RetrySelector::Id(ids[4]))
            .await
            .expect("retry"),
        0
    );
    assert_eq!(h.row(ids[4]).await.status, "INIT");
    let bad = RetrySelector::Status {
        status: "INIT".into(),
        message_type: None,
    };
    let err = store
        .retry_rows(&bad)
        .await
        .expect_err("INIT is not retried");
    assert!(
        !err.is_transient() && err.message().contains("FAILED and MANUAL_REQUIRED"),
        "{err}"
    );
    drop(store);
    h.cleanup().await;
}

/// `park` takes an unsent row out of retries (MANUAL_REQUIRED, blocking its key, with the
/// operator's reason); `resolve` skips a row for good (SUCCESS without a Kafka position,
/// key released). Neither touches a SUCCESS row or a missing one.
pub async fn park_and_resolve_record_the_operator_reason<H: Harness>() {
    let h: H = initialised("ad_park", ReadMode::Log).await;
    let ids = h.insert(&NewRow::keys(&["a", "a", "b", "c"])).await;
    h.set(&ids[3..], &Setup::status("SUCCESS", None)).await;
    let store = store(&h).await;

    assert!(store
        .park_row(ids[0], "customer deleted")
        .await
        .expect("park"));
    let a = h.row(ids[0]).await;
    assert_eq!(a.status, "MANUAL_REQUIRED");
    assert!(
        a.next_retry_in.is_some(),
        "parked rows stay in the retry index"
    );
    assert_eq!(
        a.last_error.as_deref(),
        Some("parked by operator: customer deleted")
    );
    assert!(
        !store.park_row(ids[3], "x").await.expect("park SUCCESS"),
        "SUCCESS is final"
    );
    assert!(!store.park_row(ids[0], "x").await.expect("park again"));
    let blocked = store.blocked_keys(None).await.expect("blocked");
    assert!(
        blocked.contains("a"),
        "strict ordering holds back a: {blocked:?}"
    );

    assert!(store
        .resolve_row(ids[0], "sent by hand")
        .await
        .expect("resolve"));
    let a = h.row(ids[0]).await;
    assert_eq!(
        (
            a.status.as_str(),
            a.next_retry_in,
            a.claim_token.as_deref(),
            a.sent
        ),
        ("SUCCESS", None, None, false)
    );
    assert_eq!(
        a.last_error.as_deref(),
        Some("resolved by operator without sending: sent by hand")
    );
    assert!(store.blocked_keys(None).await.expect("blocked").is_empty());
    assert!(!store
        .resolve_row(ids[0], "again")
        .await
        .expect("resolve again"));
    // An INIT row can be resolved too (skipped for good).
    assert!(store
        .resolve_row(ids[2], "obsolete")
        .await
        .expect("resolve INIT"));
    assert_eq!(h.row(ids[2]).await.status, "SUCCESS");
    assert_eq!(h.row(ids[1]).await.status, "INIT", "only the named row");
    assert!(!store
        .resolve_row(i64::MAX, "none")
        .await
        .expect("no such row"));
    assert!(!store.park_row(i64::MAX, "none").await.expect("no such row"));
    drop(store);
    h.cleanup().await;
}

/// The janitor removes SUCCESS rows older than the retention (a resolved row ages from
/// its last update), in batches, archiving them with their ids when asked; unsent rows
/// are never removed.
pub async fn janitor_deletes_or_archives_old_success_rows<H: Harness>() {
    let h: H = initialised("ad_jan", ReadMode::Log).await;
    let keys: Vec<String> = (0..11).map(|i| format!("j{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let ids = h.insert(&NewRow::keys(&keys)).await;
    let (old, recent, resolved, unsent) = (&ids[..7], &ids[7..9], ids[9], ids[10]);
    let day = 86_400;
    h.set(
        old,
        &Setup {
            status: Some("SUCCESS"),
            sent_ago: Some(Some(10 * day)),
            ..Setup::default()
        },
    )
    .await;
    h.set(
        recent,
        &Setup {
            status: Some("SUCCESS"),
            sent_ago: Some(Some(0)),
            ..Setup::default()
        },
    )
    .await;
    h.set(
        &[resolved],
        &Setup {
            status: Some("SUCCESS"),
            sent_ago: Some(None),
            updated_ago: Some(10 * day),
            ..Setup::default()
        },
    )
    .await;
    h.set(
        &[unsent],
        &Setup {
            created_ago: Some(30 * day),
            ..Setup::default()
        },
    )
    .await;
    let store = store(&h).await;
    assert_eq!(table_of(&store), TableKind::Outbox);
    let week = Duration::from_secs(7 * 86_400);

    // The inbox's rule (with a deduplication window) is not the outbox's.
    refuses_rule(
        &store,
        &JanitorRule::inbox(Duration::ZERO, week, JanitorAction::Delete),
    )
    .await;
    assert_eq!(h.row(old[0]).await.status, "SUCCESS");

    // Archive: 3 + 3 + 2 (the resolved row ages from its update), then 0.
    let archive = JanitorRule::outbox(week, JanitorAction::Archive(h.archive_table().await));
    let mut batches = Vec::new();
    loop {
        let n = store.janitor_batch(&archive, 3).await.expect("janitor");
        batches.push(n);
        if n == 0 || batches.len() > 10 {
            break;
        }
    }
    assert_eq!(batches, [3, 3, 2, 0]);
    let mut expected = old.to_vec();
    expected.push(resolved);
    assert_eq!(h.archived_ids().await, expected, "archived with their ids");
    assert_eq!(h.row(recent[0]).await.status, "SUCCESS", "recent rows stay");

    // Delete: nothing old is left; with a zero retention the recent ones go.
    let delete = |older_than| JanitorRule::outbox(older_than, JanitorAction::Delete);
    assert_eq!(
        store
            .janitor_batch(&delete(week), 100)
            .await
            .expect("delete"),
        0
    );
    assert_eq!(
        store
            .janitor_batch(&delete(Duration::ZERO), 100)
            .await
            .expect("delete"),
        2
    );
    assert_eq!(
        h.row(unsent).await.status,
        "INIT",
        "unsent rows are never deleted"
    );
    drop(store);
    h.cleanup().await;
}

/// `recover`'s scan pages through INIT rows after an id, in id order, as events.
pub async fn scan_init_pages_through_init_rows_in_id_order<H: Harness>() {
    let h: H = initialised("ad_scan", ReadMode::Log).await;
    let ids = h.insert(&NewRow::keys(&["a", "b", "c", "d", "e"])).await;
    h.set(&ids[1..2], &Setup::status("SUCCESS", None)).await;
    h.set(&ids[3..4], &Setup::status("FAILED", Some(3600)))
        .await;
    let store = store(&h).await;
    let page = store.scan_init(0, 0, 2).await.expect("scan");
    assert_eq!(
        page.iter().map(|e| e.id).collect::<Vec<_>>(),
        [ids[0], ids[2]]
    );
    assert_eq!(page[0].biz_key, "a");
    assert_eq!(&page[0].payload[..], br#"{"k": 1}"#);
    let next = store.scan_init(0, ids[2], 2).await.expect("scan");
    assert_eq!(next.iter().map(|e| e.id).collect::<Vec<_>>(), [ids[4]]);
    assert!(store
        .scan_init(0, ids[4], 2)
        .await
        .expect("scan")
        .is_empty());
    drop(store);
    h.cleanup().await;
}

/// The operator console's reads of the outbox: pages of one status newest first by
/// keyset, filtered by type, key and error text; one row in full with a bounded payload
/// preview; and each key strict ordering holds, with the row holding it and how many
/// rows wait behind it.
pub async fn console_reads_pages_rows_and_held_keys<H: Harness>() {
    let h: H = initialised("ad_console", ReadMode::Log).await;
    let ids = h
        .insert(&[
            NewRow::keyed("a").typed("t1"),
            NewRow::keyed("a").typed("t2"),
            NewRow::keyed("a").typed("t3"),
            NewRow::keyed("b").typed("t1"),
            NewRow::keyed("c").typed("t1"),
            NewRow::keyed("d").typed("t1"),
            NewRow::keyed("d").typed("t2"),
            NewRow::keyed("e").typed("t1"),
        ])
        .await;
    // a: the first row waits for an operator, the next two are parked behind it; b failed
    // with a timeout; c was sent.
    let manual = Setup {
        last_error: Some("refused: record too large".into()),
        retry_count: Some(3),
        ..Setup::status("MANUAL_REQUIRED", Some(0))
    };
    h.set(&ids[..1], &manual).await;
    let parked = Setup {
        last_error: Some("parked: an earlier event of biz_key `a` is not delivered yet".into()),
        ..Setup::status("FAILED", Some(0))
    };
    h.set(&ids[1..3], &parked).await;
    let timed_out = Setup {
        last_error: Some("timed out waiting for Kafka".into()),
        retry_count: Some(1),
        ..Setup::status("FAILED", Some(60))
    };
    h.set(&ids[3..4], &timed_out).await;
    h.set(&ids[4..5], &Setup::status("SUCCESS", None)).await;
    // d: a retry under way comes before the row parked behind it, and holds the key; e:
    // only a retry under way, nothing in trouble, no key held.
    h.set(&ids[5..6], &Setup::status("PROCESSING", Some(30)))
        .await;
    h.set(&ids[6..7], &parked).await;
    h.set(&ids[7..8], &Setup::status("PROCESSING", Some(30)))
        .await;
    let store = store(&h).await;

    let page = |status: &str| outboxd_connector::RowQuery {
        status: status.into(),
        limit: 2,
        ..Default::default()
    };
    let listed = |rows: Vec<outboxd_connector::RowSummary>| -> Vec<i64> {
        rows.iter().map(|r| r.id).collect()
    };
    let first = store.list_rows(&page("FAILED")).await.expect("list");
    assert_eq!(listed(first.clone()), [ids[6], ids[3]], "newest first");
    let first = store
        .list_rows(&outboxd_connector::RowQuery {
            before_id: Some(ids[6]),
            ..page("FAILED")
        })
        .await
        .expect("list");
    assert_eq!(
        listed(first.clone()),
        [ids[3], ids[2]],
        "then the older ones"
    );
    assert_eq!(first[0].biz_key, "b");
    assert_eq!(first[0].retry_count, 1);
    assert_eq!(
        first[0].last_error.as_deref(),
        Some("timed out waiting for Kafka")
    );
    let due = first[0]
        .next_retry_time
        .expect("a FAILED row is due sometime");
    assert!(due > SystemTime::now(), "due in a minute: {due:?}");
    assert!(first[0].created_at.is_some() && first[0].updated_at.is_some());
    let next = outboxd_connector::RowQuery {
        before_id: Some(ids[2]),
        ..page("FAILED")
    };
    assert_eq!(
        listed(store.list_rows(&next).await.expect("page 2")),
        [ids[1]]
    );
    let by_key = outboxd_connector::RowQuery {
        biz_key: Some("a".into()),
        limit: 10,
        ..page("FAILED")
    };
    assert_eq!(
        listed(store.list_rows(&by_key).await.expect("key")),
        [ids[2], ids[1]]
    );
    let by_error = outboxd_connector::RowQuery {
        error_contains: Some("Kafka".into()),
        message_type: Some("t1".into()),
        limit: 10,
        ..page("FAILED")
    };
    assert_eq!(
        listed(store.list_rows(&by_error).await.expect("error")),
        [ids[3]]
    );
    let none = outboxd_connector::RowQuery {
        error_contains: Some("kafka".into()),
        limit: 10,
        ..page("FAILED")
    };
    assert!(
        store.list_rows(&none).await.expect("case").is_empty(),
        "the error filter is case-sensitive"
    );
    let manual_rows = store
        .list_rows(&page("MANUAL_REQUIRED"))
        .await
        .expect("manual");
    assert_eq!(listed(manual_rows), [ids[0]]);
    assert!(
        store.list_rows(&page("DONE")).await.is_err(),
        "the outbox has no DONE"
    );

    let detail = store
        .row_detail(ids[0], 4)
        .await
        .expect("detail")
        .expect("row");
    assert_eq!(detail.summary.status, "MANUAL_REQUIRED");
    assert_eq!(detail.summary.retry_count, 3);
    assert!(!detail.message_id.is_empty());
    assert_eq!(detail.payload_preview.chars().count(), 4, "{detail:?}");
    assert!(detail.payload_bytes > 4, "{detail:?}");
    assert!(
        detail.payload_cut,
        "a preview of 4 characters is cut: {detail:?}"
    );
    assert!(
        detail
            .headers
            .as_deref()
            .is_some_and(|h| h.contains("trace")),
        "{detail:?}"
    );
    assert_eq!(detail.sink_position, None);
    assert!(store
        .row_detail(i64::MAX, 100)
        .await
        .expect("none")
        .is_none());

    let held = store.held_keys(None, 10).await.expect("held");
    let summary: Vec<(&str, i64, i64)> = held
        .iter()
        .map(|k| (k.holder.biz_key.as_str(), k.holder.id, k.waiting))
        .collect();
    assert_eq!(
        summary,
        [("a", ids[0], 2), ("b", ids[3], 0), ("d", ids[5], 1)],
        "d is held by its retry under way; e holds nothing"
    );
    let after = store.held_keys(Some("a"), 1).await.expect("held after a");
    assert_eq!(after.len(), 1, "one page of one key");
    assert_eq!(after[0].holder.biz_key, "b");
    drop(store);
    h.cleanup().await;
}
