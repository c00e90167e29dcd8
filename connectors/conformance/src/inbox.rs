//! The inbox store: insert-or-ignore on both unique keys, claims one message per key in
//! arrival order, outcomes written only under the claim (the SQL handler's statement
//! included), the reaper and the schedule, and the operator's actions.

use std::time::Duration;

use outboxd_connector::{
    ClaimToken, ClaimedMessage, Completed, Connector, InboxMessage, InboxOutcome, InboxStore,
    Ingested, JanitorAction, JanitorRule, ReadMode, ReapPolicy, RetrySelector, TableAdmin,
    TableKind,
};

use crate::support::{initialised, refuses_rule, table_of};
use crate::{Harness, Setup};

/// A message of `key` with id `id` and type `type_`, JSON payload `{"n": <id>}`.
pub fn message(id: &str, type_: &str, key: &str) -> InboxMessage {
    InboxMessage {
        source: "orders".into(),
        message_id: id.into(),
        message_type: type_.into(),
        biz_key: key.into(),
        payload: format!(r#"{{"n": "{id}"}}"#).into_bytes(),
        headers: vec![("trace".into(), format!("t-{id}"))],
        rejected: None,
    }
}

async fn inbox<H: Harness>(h: &H) -> <H::Connector as Connector>::Inbox {
    h.connector().open_inbox().await.expect("open inbox")
}

/// The ids of the stored messages, in order.
pub fn stored(outcomes: &[Ingested]) -> Vec<i64> {
    (outcomes.iter())
        .filter_map(|o| match o {
            Ingested::Stored(id) => Some(*id),
            Ingested::Duplicate => None,
        })
        .collect()
}

fn ids(claimed: &[ClaimedMessage]) -> Vec<&str> {
    claimed.iter().map(|m| m.message_id.as_str()).collect()
}

const DONE: InboxOutcome<'static> = InboxOutcome::Done { statement: None };

/// Either unique key makes a message a duplicate, also of one earlier in the same batch
/// and of one stored by an earlier batch; a rejected message is stored MANUAL_REQUIRED
/// with its reason, never dropped.
pub async fn insert_stores_each_message_once_by_either_key<H: Harness>() {
    let h: H = initialised("ib_dedupe", ReadMode::Poll).await;
    let store = inbox(&h).await;
    assert!(
        store.payload_is_json(),
        "the shipped schema's payload is JSON"
    );

    let same_id = message("m1", "other-type", "other-key");
    let same_type_and_key = message("m9", "created", "k1");
    let batch = [
        message("m1", "created", "k1"),
        same_id.clone(),
        same_type_and_key,
        message("m2", "created", "k2"),
    ];
    let outcomes = store.insert(&batch).await.expect("insert");
    assert!(matches!(outcomes[0], Ingested::Stored(_)), "{outcomes:?}");
    assert_eq!(outcomes[1..3], [Ingested::Duplicate, Ingested::Duplicate]);
    assert!(matches!(outcomes[3], Ingested::Stored(_)), "{outcomes:?}");
    let first = stored(&outcomes);
    assert!(first[0] < first[1], "ids in arrival order: {first:?}");

    let again = store
        .insert(&[message("m2", "created", "k2"), same_id])
        .await
        .expect("redelivery");
    assert_eq!(again, [Ingested::Duplicate, Ingested::Duplicate]);

    // One message id twice in a batch: the first a duplicate by (type, key) of m1, the
    // second new; the outcome of each is its own.
    let reused = store
        .insert(&[message("m7", "created", "k1"), message("m7", "paid", "k7")])
        .await
        .expect("reused id");
    assert_eq!(reused[0], Ingested::Duplicate, "{reused:?}");
    assert!(matches!(reused[1], Ingested::Stored(_)), "{reused:?}");

    let mut bad = message("kafka:orders/0/17", "created", "k3");
    bad.payload = b"not json".to_vec();
    bad.rejected = Some("the record has no message_id header".into());
    let outcomes = store.insert(&[bad]).await.expect("insert rejected");
    let [Ingested::Stored(id)] = outcomes[..] else {
        panic!("a rejected message is stored: {outcomes:?}");
    };
    let row = h.inbox_row(id).await;
    assert_eq!(row.status, "MANUAL_REQUIRED");
    assert_eq!(
        row.last_error.as_deref(),
        Some("the record has no message_id header")
    );
    assert_eq!(h.inbox_row(first[0]).await.status, "PENDING");
    h.cleanup().await;
}

/// One message per key is in flight, in arrival order; other keys flow. A key's later
/// message waits while an earlier one is PROCESSING, FAILED (due or not) or
/// MANUAL_REQUIRED, and is claimed once the earlier one is DONE.
pub async fn claim_takes_one_message_per_key_in_arrival_order<H: Harness>() {
    let h: H = initialised("ib_order", ReadMode::Poll).await;
    let store = inbox(&h).await;
    let batch = [
        message("a1", "t1", "a"),
        message("b1", "t1", "b"),
        message("a2", "t2", "a"),
        message("c1", "t1", "c"),
        message("a3", "t3", "a"),
    ];
    let stored_ids = stored(&store.insert(&batch).await.expect("insert"));

    let first = store.claim(10).await.expect("claim");
    assert_eq!(ids(&first), ["a1", "b1", "c1"], "the first of each key");
    let m = &first[0];
    assert_eq!(
        (
            m.source.as_str(),
            m.message_type.as_str(),
            m.biz_key.as_str()
        ),
        ("orders", "t1", "a")
    );
    let payload: serde_json::Value = serde_json::from_slice(&m.payload).expect("JSON payload");
    assert_eq!(payload, serde_json::json!({"n": "a1"}));
    assert_eq!(m.headers, [("trace".to_owned(), "t-a1".to_owned())]);
    assert_eq!((m.retry_count, m.max_retry_count), (0, 10));
    assert_eq!(h.inbox_row(m.id).await.status, "PROCESSING");
    assert!(
        store.claim(10).await.expect("claim").is_empty(),
        "a2 waits for a1"
    );

    let delay = Duration::from_secs(3600);
    let failed = InboxOutcome::Failed {
        error: "boom",
        retry_delay: delay,
    };
    assert_eq!(
        store.complete(m, failed).await.expect("fail a1"),
        Completed::Written
    );
    assert!(
        store.claim(10).await.expect("claim").is_empty(),
        "a2 waits while a1 is FAILED and not due"
    );
    h.set_inbox(&stored_ids[..1], &Setup::status("FAILED", Some(-1)))
        .await;
    let retry = store.claim(10).await.expect("claim");
    assert_eq!(ids(&retry), ["a1"], "a1 is due again, still before a2");
    assert_eq!(retry[0].retry_count, 1);
    assert_eq!(
        store.complete(&retry[0], DONE).await.expect("done"),
        Completed::Written
    );
    let next = store.claim(10).await.expect("claim");
    assert_eq!(ids(&next), ["a2"]);

    let manual = InboxOutcome::ManualRequired {
        reason: "400 bad request",
    };
    assert_eq!(
        store.complete(&next[0], manual).await.expect("manual"),
        Completed::Written
    );
    assert!(
        store.claim(10).await.expect("claim").is_empty(),
        "a3 waits behind a MANUAL_REQUIRED a2"
    );
    h.cleanup().await;
}

/// Two workers claiming at once never hold two messages of one key.
pub async fn concurrent_claimers_never_share_a_key<H: Harness>() {
    let h: H = initialised("ib_concurrent", ReadMode::Poll).await;
    let (one, two) = (inbox(&h).await, inbox(&h).await);
    let batch: Vec<InboxMessage> = (0..40)
        .map(|n| message(&format!("m{n}"), &format!("t{n}"), &format!("k{}", n % 8)))
        .collect();
    one.insert(&batch).await.expect("insert");

    let (a, b) = tokio::join!(one.claim(5), two.claim(5));
    let mut keys: Vec<String> = (a.expect("one").iter())
        .chain(b.expect("two").iter())
        .map(|m| m.biz_key.clone())
        .collect();
    let claimed = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), claimed, "no key claimed twice: {keys:?}");
    assert!(claimed >= 5, "the workers shared the keys: {claimed}");
    h.cleanup().await;
}

/// The SQL handler's statement commits with DONE, or not at all: a statement that fails
/// leaves the row PROCESSING and nothing applied, and a lost claim runs no statement.
pub async fn the_sql_handler_takes_effect_only_with_done<H: Harness>() {
    let h: H = initialised("ib_sql", ReadMode::Poll).await;
    let store = inbox(&h).await;
    let batch = [
        message("s1", "t", "k1"),
        message("s2", "t", "k2"),
        message("s3", "t", "k3"),
    ];
    store.insert(&batch).await.expect("insert");
    let claimed = store.claim(10).await.expect("claim");
    assert_eq!(ids(&claimed), ["s1", "s2", "s3"]);
    let effects = h.effects_table().await;

    let statement = format!("INSERT INTO {effects} (v) VALUES (:message_id)");
    let done = InboxOutcome::Done {
        statement: Some(&statement),
    };
    assert_eq!(
        store.complete(&claimed[0], done).await.expect("done"),
        Completed::Written
    );
    assert_eq!(h.effects().await, ["s1"]);
    let row = h.inbox_row(claimed[0].id).await;
    assert_eq!(row.status, "DONE");
    assert!(row.sent, "processed_at is set");
    assert!(!row.claimed && row.claim_token.is_none(), "claim cleared");

    let broken = format!("INSERT INTO {effects} (no_such_column) VALUES (:message_id)");
    let outcome = InboxOutcome::Done {
        statement: Some(&broken),
    };
    let failed = store
        .complete(&claimed[1], outcome)
        .await
        .expect("complete");
    let Completed::StatementFailed(error) = failed else {
        panic!("the statement's error is the handler's failure: {failed:?}");
    };
    assert!(error.contains("no_such_column"), "{error}");
    assert_eq!(h.inbox_row(claimed[1].id).await.status, "PROCESSING");
    let failed = InboxOutcome::Failed {
        error: &error,
        retry_delay: Duration::from_secs(1),
    };
    assert_eq!(
        store.complete(&claimed[1], failed).await.expect("fail"),
        Completed::Written
    );
    let row = h.inbox_row(claimed[1].id).await;
    assert_eq!((row.status.as_str(), row.retry_count), ("FAILED", 1));
    assert_eq!(row.last_error.as_deref(), Some(error.as_str()));

    let mut stolen = claimed[2].clone();
    stolen.claim_token = ClaimToken("00000000-0000-0000-0000-000000000000".into());
    let done = InboxOutcome::Done {
        statement: Some(&statement),
    };
    assert_eq!(
        store.complete(&stolen, done).await.expect("lost"),
        Completed::ClaimLost
    );
    assert_eq!(h.effects().await, ["s1"], "no effect without the claim");
    assert_eq!(h.inbox_row(claimed[2].id).await.status, "PROCESSING");
    h.cleanup().await;
}

/// A failed attempt counts and backs off; at `max_retry_count` the row needs an
/// operator. A released claim (shutdown) counts nothing and is due at once.
pub async fn failures_back_off_and_end_in_manual_required<H: Harness>() {
    let h: H = initialised("ib_retry", ReadMode::Poll).await;
    let store = inbox(&h).await;
    let batch = [message("r1", "t", "k1"), message("r2", "t", "k2")];
    let stored_ids = stored(&store.insert(&batch).await.expect("insert"));
    h.set_inbox(
        &stored_ids[..1],
        &Setup {
            retry_count: Some(2),
            max_retry_count: Some(3),
            ..Setup::default()
        },
    )
    .await;
    let claimed = store.claim(10).await.expect("claim");
    let fail = InboxOutcome::Failed {
        error: "503 from the handler",
        retry_delay: Duration::from_secs(60),
    };
    store.complete(&claimed[0], fail).await.expect("fail");
    let row = h.inbox_row(stored_ids[0]).await;
    assert_eq!(
        (row.status.as_str(), row.retry_count),
        ("MANUAL_REQUIRED", 3)
    );

    store.complete(&claimed[1], fail).await.expect("fail");
    let row = h.inbox_row(stored_ids[1]).await;
    assert_eq!((row.status.as_str(), row.retry_count), ("FAILED", 1));
    let due_in = row.next_retry_in.expect("next_retry_time");
    assert!((55.0..=65.0).contains(&due_in), "backoff written: {due_in}");

    h.set_inbox(&stored_ids[1..], &Setup::status("FAILED", Some(-1)))
        .await;
    let again = store.claim(10).await.expect("claim");
    let release = InboxOutcome::Released {
        reason: "shutting down",
    };
    store.complete(&again[0], release).await.expect("release");
    let row = h.inbox_row(stored_ids[1]).await;
    assert_eq!((row.status.as_str(), row.retry_count), ("PENDING", 1));
    assert_eq!(
        ids(&store.claim(10).await.expect("claim")),
        ["r2"],
        "due now"
    );
    h.cleanup().await;
}

/// The reaper returns claims older than the timeout; the schedule names the next due
/// row (not one held back by its key) and the oldest claim.
pub async fn reaper_and_schedule_cover_the_inbox<H: Harness>() {
    let h: H = initialised("ib_reap", ReadMode::Poll).await;
    let store = inbox(&h).await;
    let empty = store.schedule().await.expect("schedule");
    assert_eq!(
        (empty.next_due, empty.oldest_claim),
        (None, None),
        "idle inbox"
    );

    let batch = [message("p1", "t1", "k"), message("p2", "t2", "k")];
    let stored_ids = stored(&store.insert(&batch).await.expect("insert"));
    let schedule = store.schedule().await.expect("schedule");
    assert!(schedule.next_due.is_some() && schedule.oldest_claim.is_none());

    let claimed = store.claim(10).await.expect("claim");
    assert_eq!(ids(&claimed), ["p1"]);
    let schedule = store.schedule().await.expect("schedule");
    assert_eq!(
        schedule.next_due, None,
        "p2 waits for its key, not for time"
    );
    assert!(schedule.oldest_claim.is_some());

    let policy = ReapPolicy {
        claim_timeout: Duration::from_secs(30),
        retry_delay: Duration::from_secs(5),
    };
    let report = store.reap(policy).await.expect("reap");
    assert_eq!(
        (report.failed, report.manual_required),
        (0, 0),
        "not expired"
    );
    h.set_inbox(
        &stored_ids[..1],
        &Setup {
            claimed_ago: Some(60),
            ..Setup::default()
        },
    )
    .await;
    let report = store.reap(policy).await.expect("reap");
    assert_eq!((report.failed, report.manual_required), (1, 0));
    let row = h.inbox_row(stored_ids[0]).await;
    assert_eq!((row.status.as_str(), row.retry_count), ("FAILED", 1));
    assert!(!row.claimed && row.claim_token.is_none());
    assert_eq!(
        store.complete(&claimed[0], DONE).await.expect("late"),
        Completed::ClaimLost,
        "the reaped worker's late outcome is not written"
    );
    h.cleanup().await;
}

/// The operator's actions: counts by status, retry, park (the key waits), resolve (the
/// key is released), and a janitor that never removes a row inside the deduplication
/// window, so a late redelivery is still a duplicate.
pub async fn operator_actions_cover_the_inbox<H: Harness>() {
    let h: H = initialised("ib_admin", ReadMode::Poll).await;
    let store = inbox(&h).await;
    let batch = [
        message("o1", "t1", "a"),
        message("o2", "t2", "a"),
        message("o3", "t1", "b"),
        message("o4", "t1", "c"),
    ];
    let rows = stored(&store.insert(&batch).await.expect("insert"));
    assert_eq!(table_of(&store), TableKind::Inbox);
    let summary = TableAdmin::status_summary(&store).await.expect("status");
    let pending: i64 = (summary.counts.iter())
        .filter(|c| c.status == "PENDING")
        .map(|c| c.rows)
        .sum();
    assert_eq!(pending, 4);
    assert!(summary.oldest_unsent.is_some(), "the oldest PENDING row");

    assert!(store.park_row(rows[0], "bad data").await.expect("park"));
    assert!(
        !store.park_row(rows[0], "again").await.expect("park"),
        "already parked"
    );
    let row = h.inbox_row(rows[0]).await;
    assert_eq!(row.status, "MANUAL_REQUIRED");
    assert_eq!(
        row.last_error.as_deref(),
        Some("parked by operator: bad data")
    );
    assert_eq!(
        ids(&store.claim(10).await.expect("claim")),
        ["o3", "o4"],
        "o2 waits for o1"
    );

    let selector = RetrySelector::Id(rows[0]);
    assert_eq!(store.retry_rows(&selector).await.expect("retry"), 1);
    let row = h.inbox_row(rows[0]).await;
    assert_eq!((row.status.as_str(), row.retry_count), ("FAILED", 0));
    assert!(store
        .resolve_row(rows[0], "fixed by hand")
        .await
        .expect("resolve"));
    let row = h.inbox_row(rows[0]).await;
    assert_eq!(row.status, "DONE");
    assert_eq!(
        row.last_error.as_deref(),
        Some("resolved by operator without handling: fixed by hand")
    );
    assert_eq!(
        ids(&store.claim(10).await.expect("claim")),
        ["o2"],
        "the key is released"
    );

    // Every row DONE and processed an hour ago; o1 and o2 also created two days ago.
    h.set_inbox(&rows, &Setup::status("DONE", None)).await;
    h.set_processed_ago(&rows, 3600).await;
    h.set_inbox(
        &rows[..2],
        &Setup {
            created_ago: Some(2 * 86_400),
            ..Setup::default()
        },
    )
    .await;
    // The outbox's rule (no deduplication window) would cut into it: refused.
    refuses_rule(
        &store,
        &JanitorRule::outbox(Duration::from_secs(60), JanitorAction::Delete),
    )
    .await;
    let window = Duration::from_secs(86_400);
    let rule = JanitorRule::inbox(Duration::from_secs(60), window, JanitorAction::Delete);
    let removed = store.janitor_batch(&rule, 100).await.expect("janitor");
    assert_eq!(removed, 2, "only rows older than the deduplication window");
    let again = store
        .insert(&[message("o3", "t1", "b")])
        .await
        .expect("redelivery");
    assert_eq!(again, [Ingested::Duplicate], "still inside the window");
    h.cleanup().await;
}

/// What `outboxd verify --inbox` needs: its messages read back by source and id (another
/// source's message of the same id is not its), deleted whatever their status, and a
/// scratch table whose SQL handler statement records each effect once, in order.
pub async fn verify_reads_back_its_messages_and_counts_effects<H: Harness>() {
    let h: H = initialised("ib_verify", ReadMode::Poll).await;
    h.grant_create_table().await;
    let store = inbox(&h).await;
    let mut theirs = message("v1", "t0", "other");
    theirs.source = "someone-else".into();
    let batch = [message("v1", "t1", "k"), message("v2", "t2", "k"), theirs];
    store.insert(&batch).await.expect("insert");
    let sent = ["v1", "v2", "v3"].map(String::from).to_vec();

    let scratch = "outboxd_verify_conformance";
    store
        .drop_scratch_table(scratch)
        .await
        .expect("drop a leftover");
    let statement = store
        .create_scratch_table(scratch)
        .await
        .expect("create scratch");
    let claimed = store.claim(10).await.expect("claim");
    assert_eq!(ids(&claimed), ["v1", "v1"], "one per key");
    let mine = claimed
        .iter()
        .find(|m| m.source == "orders")
        .expect("v1 of orders");
    let done = InboxOutcome::Done {
        statement: Some(&statement),
    };
    assert_eq!(
        store.complete(mine, done).await.expect("done"),
        Completed::Written
    );

    let mut states = store.own_messages("orders", &sent).await.expect("read");
    states.sort_by(|a, b| a.message_id.cmp(&b.message_id));
    let seen: Vec<_> = states
        .iter()
        .map(|s| (s.message_id.as_str(), s.status.as_str()))
        .collect();
    assert_eq!(seen, [("v1", "DONE"), ("v2", "PENDING")]);
    assert_eq!(
        store.scratch_rows(scratch).await.expect("effects"),
        [("v1".to_owned(), "k".to_owned())]
    );

    assert_eq!(
        store
            .delete_own_messages("orders", &sent)
            .await
            .expect("delete"),
        2
    );
    assert!(store
        .own_messages("orders", &sent)
        .await
        .expect("read")
        .is_empty());
    let theirs = store
        .own_messages("someone-else", &sent)
        .await
        .expect("read");
    assert_eq!(theirs.len(), 1, "another source's message is left alone");
    store.drop_scratch_table(scratch).await.expect("drop");
    assert!(store.scratch_rows(scratch).await.is_err(), "dropped");
    assert!(store.create_scratch_table("Robert'); DROP").await.is_err());
    h.cleanup().await;
}

/// The operator console's reads of the inbox: pages of one status by keyset, a message in
/// full with its source and headers, and the keys whose later messages wait behind one in
/// trouble.
pub async fn console_reads_the_inbox<H: Harness>() {
    let h: H = initialised("ib_console", ReadMode::Poll).await;
    let store = inbox(&h).await;
    let batch = [
        message("c1", "t1", "a"),
        message("c2", "t2", "a"),
        message("c3", "t1", "b"),
    ];
    let rows = stored(&store.insert(&batch).await.expect("insert"));
    let failed = Setup {
        last_error: Some("handler answered 500".into()),
        retry_count: Some(2),
        ..Setup::status("FAILED", Some(30))
    };
    h.set_inbox(&rows[..1], &failed).await;
    let query = outboxd_connector::RowQuery {
        status: "FAILED".into(),
        limit: 10,
        ..Default::default()
    };
    let page = store.list_rows(&query).await.expect("list");
    assert_eq!(page.len(), 1);
    assert_eq!((page[0].id, page[0].retry_count), (rows[0], 2));
    let pending = outboxd_connector::RowQuery {
        status: "PENDING".into(),
        before_id: Some(rows[2]),
        ..query.clone()
    };
    let page = store.list_rows(&pending).await.expect("pending");
    assert_eq!(page.iter().map(|r| r.id).collect::<Vec<_>>(), [rows[1]]);

    let detail = store
        .row_detail(rows[0], 100)
        .await
        .expect("detail")
        .expect("row");
    assert_eq!(detail.message_id, "c1");
    assert_eq!(detail.source.as_deref(), Some("orders"));
    assert!(detail.payload_preview.contains("c1"), "{detail:?}");
    assert!(!detail.payload_cut, "the whole payload fits: {detail:?}");
    assert!(detail
        .headers
        .as_deref()
        .is_some_and(|h| h.contains("t-c1")));

    let held = store.held_keys(None, 10).await.expect("held");
    assert_eq!(held.len(), 1);
    assert_eq!((held[0].holder.id, held[0].waiting), (rows[0], 1));
    h.cleanup().await;
}
