//! The log tail through [`ChangeStream`]: only committed transactions, in commit order
//! with increasing positions; a reopened stream resumes after what was confirmed; one
//! reader at a time; a lost position is a definite error, never a silent restart.

use std::time::{Duration, Instant};

use outboxd_connector::{
    ChangeItem, ChangeStream, CheckStatus, CommittedTransaction, Connector, ConnectorError,
    Delivered, DeliveryFailure, ErrorKind, ErrorReason, NewOutboxRow, OutboxStore, OwnRowsToDelete,
    ReadMode, TableAdmin, TransactionEnd, TransactionPart, WriteBack, PART_EVENTS,
};

use crate::support::{initialised, open_when_free, store, stored_headers};
use crate::{Harness, NewRow};

const DEADLINE: Duration = Duration::from_secs(30);

/// The next transaction of the stream, skipping progress items, with the rows of its
/// parts (if it came in parts) before its own.
async fn next_transaction<S: ChangeStream>(stream: &mut S) -> CommittedTransaction {
    let (parts, mut txn) = next_transaction_in_parts(stream).await;
    let mut events: Vec<_> = parts.into_iter().flat_map(|p| p.events).collect();
    events.append(&mut txn.events);
    txn.events = events;
    txn
}

/// The next transaction of the stream as it came: its parts, then its end.
async fn next_transaction_in_parts<S: ChangeStream>(
    stream: &mut S,
) -> (Vec<TransactionPart>, CommittedTransaction) {
    let deadline = Instant::now() + DEADLINE;
    let mut parts = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let item = tokio::time::timeout(left, stream.next())
            .await
            .expect("no transaction in time")
            .expect("stream item");
        match item {
            ChangeItem::Transaction(txn) => return (parts, txn),
            ChangeItem::Part(part) => parts.push(part),
            ChangeItem::Progress(_) => {
                assert!(
                    parts.is_empty(),
                    "progress between the parts of a transaction"
                );
            }
        }
    }
}

fn keys(txn: &CommittedTransaction) -> Vec<&str> {
    txn.events.iter().map(|e| e.biz_key.as_str()).collect()
}

/// A rolled-back transaction yields nothing; committed ones arrive whole, in commit
/// order, with their rows in insertion order and increasing commit positions.
pub async fn only_committed_transactions_are_read_in_commit_order<H: Harness>() {
    let h: H = initialised("sm_commit", ReadMode::Log).await;
    let mut stream = open_when_free(|| h.connector().open_stream()).await;
    let first_ids = h.insert(&NewRow::keys(&["k1", "k1"])).await;
    h.insert_rolled_back(&NewRow::keys(&["ghost"])).await;
    let second_ids = h.insert(&NewRow::keys(&["k2"])).await;

    let first = next_transaction(&mut stream).await;
    assert_eq!(keys(&first), ["k1", "k1"], "one transaction, both rows");
    assert_eq!(
        first.events.iter().map(|e| e.id).collect::<Vec<_>>(),
        first_ids
    );
    let e = &first.events[0];
    assert_eq!(&e.key[..], b"k1");
    assert_eq!(&e.payload[..], br#"{"k": 1}"#);
    assert_eq!((e.retry_count, e.max_retry_count), (0, 3));
    assert!(e.created_at.ends_with(H::UTC_OFFSET), "{}", e.created_at);
    assert_eq!(e.headers, stored_headers::<H>());
    assert!(first.commit_time.is_some());
    let second = next_transaction(&mut stream).await;
    assert_eq!(keys(&second), ["k2"], "the rolled-back row never appears");
    assert_eq!(second.events[0].id, second_ids[0]);
    assert!(second.commit_position > first.commit_position);

    // Nothing else is pending: a later transaction is the next one seen.
    h.insert(&NewRow::keys(&["k3"])).await;
    let third = next_transaction(&mut stream).await;
    assert_eq!(keys(&third), ["k3"]);
    assert!(third.commit_position > second.commit_position);
    drop(stream);
    h.cleanup().await;
}

/// A transaction of more than [`PART_EVENTS`] rows arrives in parts of at most that many
/// rows, then its end with the rest and the commit position: every row once, in insertion
/// order; each part says where the transaction begins, after the transaction before it and
/// before its own commit.
pub async fn a_large_transaction_arrives_in_parts<H: Harness>() {
    let h: H = initialised("sm_parts", ReadMode::Log).await;
    let mut stream = open_when_free(|| h.connector().open_stream()).await;
    let before = h.insert(&NewRow::keys(&["small"])).await;
    let rows = 2 * PART_EVENTS + PART_EVENTS / 2;
    let keys: Vec<String> = (0..rows).map(|i| format!("big{}", i % 7)).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let ids = h.insert(&NewRow::keys(&keys)).await;

    let small = next_transaction(&mut stream).await;
    assert_eq!(
        small.events.iter().map(|e| e.id).collect::<Vec<_>>(),
        before
    );
    let (parts, end) = next_transaction_in_parts(&mut stream).await;
    assert!(parts.len() >= 2, "{} parts for {rows} rows", parts.len());
    for part in &parts {
        assert!(!part.events.is_empty() && part.events.len() <= PART_EVENTS);
        assert!(part.begin_position >= small.commit_position);
        assert!(part.begin_position < end.commit_position);
    }
    let read: Vec<i64> = parts
        .iter()
        .flat_map(|p| &p.events)
        .chain(&end.events)
        .map(|e| e.id)
        .collect();
    assert_eq!(read, ids, "every row once, in insertion order");
    assert!(end.commit_position > small.commit_position);
    drop(stream);
    h.cleanup().await;
}

/// After `confirm` reaches the server, a reopened stream starts after the confirmed
/// transaction: the unconfirmed one comes again (at-least-once), the confirmed one not.
pub async fn a_reopened_stream_resumes_after_the_confirmed_position<H: Harness>() {
    let h: H = initialised("sm_resume", ReadMode::Log).await;
    let mut stream = open_when_free(|| h.connector().open_stream()).await;
    h.insert(&NewRow::keys(&["c1"])).await;
    let first = next_transaction(&mut stream).await;
    h.insert(&NewRow::keys(&["c2"])).await;
    let second = next_transaction(&mut stream).await;
    assert_eq!((keys(&first), keys(&second)), (vec!["c1"], vec!["c2"]));

    stream
        .confirm(&first.commit_position)
        .await
        .expect("confirm");
    let deadline = Instant::now() + DEADLINE;
    loop {
        let confirmed = h.confirmed_position().await;
        if confirmed.as_ref() >= Some(&first.commit_position) {
            assert!(
                confirmed.as_ref() < Some(&second.commit_position),
                "never past what was confirmed: {confirmed:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "confirmed position stuck at {confirmed:?}, want {}",
            first.commit_position
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    drop(stream);
    let mut stream = open_when_free(|| h.connector().open_stream()).await;
    let again = next_transaction(&mut stream).await;
    assert_eq!(keys(&again), ["c2"], "c1 was confirmed, c2 was not");
    assert_eq!(again.commit_position, second.commit_position);
    drop(stream);
    h.cleanup().await;
}

/// Rows committed after `init` but before any stream was open, and rows committed while
/// the stream was closed, are read when it opens: the log position is kept, never "now";
/// what was not confirmed may be read again.
pub async fn rows_written_while_no_stream_is_open_are_read_later<H: Harness>() {
    let h: H = initialised("sm_closed", ReadMode::Log).await;
    h.insert(&NewRow::keys(&["early"])).await;
    let mut stream = open_when_free(|| h.connector().open_stream()).await;
    let first = next_transaction(&mut stream).await;
    assert_eq!(keys(&first), ["early"]);
    drop(stream);

    h.insert(&NewRow::keys(&["while-closed"])).await;
    let mut stream = open_when_free(|| h.connector().open_stream()).await;
    // Nothing was confirmed: "early" may come again (at-least-once), then the new row.
    let mut next = next_transaction(&mut stream).await;
    if keys(&next) == ["early"] {
        assert_eq!(next.commit_position, first.commit_position);
        next = next_transaction(&mut stream).await;
    }
    assert_eq!(keys(&next), ["while-closed"]);
    assert!(next.commit_position > first.commit_position);
    drop(stream);
    h.cleanup().await;
}

/// The store's own updates of outbox rows (write-back, operator actions) are not events:
/// after them, the next transaction read is the next insert.
pub async fn status_updates_are_not_events<H: Harness>() {
    let h: H = initialised("sm_updates", ReadMode::Log).await;
    let mut stream = open_when_free(|| h.connector().open_stream()).await;
    let ids = h.insert(&NewRow::keys(&["a", "b", "c"])).await;
    let txn = next_transaction(&mut stream).await;
    assert_eq!(keys(&txn), ["a", "b", "c"]);

    let store = h.connector().open_store().await.expect("store");
    let delivered = [Delivered {
        table: 0,
        id: ids[0],
        partition: 0,
        offset: 1,
    }];
    let failed = [DeliveryFailure {
        table: 0,
        id: ids[1],
        error: "broker down".into(),
        retry_delay: Duration::ZERO,
    }];
    store
        .write_back(WriteBack {
            delivered: &delivered,
            failed: &failed,
            checkpoint: Some(&txn.commit_position),
            ..WriteBack::default()
        })
        .await
        .expect("write back");
    assert!(store.park_row(ids[2], "by hand").await.expect("park"));
    h.insert(&NewRow::keys(&["d"])).await;
    let next = next_transaction(&mut stream).await;
    assert_eq!(keys(&next), ["d"], "no event for the updates");
    drop((stream, store));
    h.cleanup().await;
}

/// While one stream reads, a second is refused with a transient error (the core waits);
/// once the first is gone, the second opens.
pub async fn a_second_reader_is_transient<H: Harness>() {
    let h: H = initialised("sm_busy", ReadMode::Log).await;
    let first = open_when_free(|| h.connector().open_stream()).await;
    let err = match h.connector().open_stream().await {
        Ok(_) => panic!("two readers of one pipeline"),
        Err(e) => e,
    };
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    assert!(
        err.message().contains("in use") || err.message().contains("held by"),
        "{err}"
    );
    drop(first);
    let second = open_when_free(|| h.connector().open_stream()).await;
    drop(second);
    h.cleanup().await;
}

/// When the position to resume from is gone (slot dropped, binlog purged), opening or
/// reading the stream fails with a definite error that names an `outboxd` command to run.
pub async fn a_lost_log_position_is_a_definite_error<H: Harness>() {
    let h: H = initialised("sm_lost", ReadMode::Log).await;
    h.insert(&NewRow::keys(&["before"])).await;
    h.lose_log_position().await;
    let err = first_error(h.connector()).await;
    assert_eq!(err.kind(), ErrorKind::Definite, "{err}");
    assert!(
        err.message().contains("outboxd "),
        "names the command to run: {err}"
    );
    h.cleanup().await;
}

/// A checkpoint row copied from another server (a dump/restore, a migration) names a
/// position of that server's log: opening the stream, `check` and the store's
/// `load_checkpoint` (what the relay skips by) refuse it with a definite error that names
/// `outboxd recover`, and nothing is read or written. After `reset_log_position` (the log
/// half of `recover`) the rows written before are still INIT for the recovery's scan, the
/// stream opens, and a row written then is read, above the new checkpoint.
pub async fn a_checkpoint_from_another_server_is_refused_until_recover<H: Harness>() {
    let h: H = initialised("sm_foreign", ReadMode::Log).await;
    let before = h.insert(&NewRow::keys(&["a", "b"])).await;
    h.carry_checkpoint_from_another_server().await;
    let names_the_fix = |e: &ConnectorError| {
        assert_eq!(e.kind(), ErrorKind::Definite, "{e}");
        assert_eq!(e.reason(), ErrorReason::PositionLost, "{e}");
        assert!(
            e.message().contains("outboxd recover --config <file>"),
            "names the fix: {e}"
        );
    };
    let err = match h.connector().open_stream().await {
        Ok(_) => panic!(
            "the stream opened on a checkpoint another server wrote: what is below it would \
             be skipped"
        ),
        Err(e) => e,
    };
    names_the_fix(&err);
    let report = h.connector().check(ReadMode::Log).await;
    let line = report
        .iter()
        .find(|l| l.item == "checkpoint" && l.status == CheckStatus::Fail)
        .unwrap_or_else(|| panic!("check passes the checkpoint of another server: {report:#?}"));
    let fix = line.fix.as_deref().unwrap_or_default();
    assert!(fix.contains("outboxd recover --config <file>"), "{line}");
    let store = store(&h).await;
    match store.load_checkpoint().await {
        Ok(position) => panic!("the store reads {position:?} as already written back"),
        Err(e) => names_the_fix(&e),
    }
    for id in &before {
        assert_eq!(h.row(*id).await.status, "INIT", "row {id}");
    }

    h.connector()
        .reset_log_position()
        .await
        .expect("reset_log_position after a checkpoint of another server");
    let init: Vec<i64> = store
        .scan_init(0, 0, 100)
        .await
        .expect("scan_init")
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(
        init, before,
        "recover's scan finds every row written before"
    );
    let checkpoint = store
        .load_checkpoint()
        .await
        .expect("the checkpoint recover wrote is this server's");
    let mut stream = open_when_free(|| h.connector().open_stream()).await;
    let after = h.insert(&NewRow::keys(&["c"])).await;
    let txn = next_transaction(&mut stream).await;
    let ids: Vec<i64> = txn.events.iter().map(|e| e.id).collect();
    assert_eq!(ids, after);
    if let Some(checkpoint) = checkpoint {
        assert!(
            txn.commit_position > checkpoint,
            "{} would be skipped as at or below the checkpoint {checkpoint}",
            txn.commit_position
        );
    }
    let report = h.connector().check(ReadMode::Log).await;
    let line = report.iter().find(|l| l.item == "checkpoint");
    assert!(
        line.is_some_and(|l| l.status == CheckStatus::Ok),
        "check after recover: {report:#?}"
    );
    drop(stream);
    h.cleanup().await;
}

/// The error of opening the stream, or else of reading it.
async fn first_error<C: Connector>(connector: &C) -> ConnectorError {
    let mut stream = match connector.open_stream().await {
        Ok(stream) => stream,
        Err(e) => return e,
    };
    let deadline = Instant::now() + DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.next()).await {
            Err(_) => panic!("the stream neither failed nor ended in {DEADLINE:?}"),
            Ok(Ok(ChangeItem::Progress(_))) => {}
            Ok(Ok(ChangeItem::Transaction(t))) => {
                panic!("the stream started afresh and read {t:?}")
            }
            Ok(Ok(ChangeItem::Part(p))) => {
                panic!("the stream started afresh and read {p:?}")
            }
            Ok(Err(e)) => return e,
        }
    }
}

/// The rows outboxd writes into the outbox itself (the canary's, `outboxd verify`'s):
/// a committed transaction of them is read from the log as the application's rows are, a
/// rolled-back one never; they are read back by message id with their status and
/// position, and deleted: only the SUCCESS ones, or all.
pub async fn own_rows_are_written_read_back_and_deleted<H: Harness>() {
    let h: H = initialised("sm_own", ReadMode::Log).await;
    h.grant_insert_on_outbox().await;
    let mut stream = open_when_free(|| h.connector().open_stream()).await;
    let store = store(&h).await;
    let row = |id: &str, key: &str| NewOutboxRow {
        headers: None,
        message_id: id.into(),
        message_type: format!("outboxd.verify.{id}"),
        biz_key: key.into(),
        topic: Some("verify.topic".into()),
        payload: format!(r#"{{"id": "{id}", "quote": "it's"}}"#),
    };
    let written = |rows: Vec<NewOutboxRow>, end| {
        let store = &store;
        async move {
            store
                .insert_rows(&rows, end)
                .await
                .expect("insert own rows")
        }
    };
    written(
        vec![row("own-1", "a"), row("own-2", "a")],
        TransactionEnd::Commit,
    )
    .await;
    written(vec![row("own-ghost", "b")], TransactionEnd::Rollback).await;
    written(vec![row("own-3", "b")], TransactionEnd::Commit).await;

    let first = next_transaction(&mut stream).await;
    let ids: Vec<&str> = first.events.iter().map(|e| e.message_id.as_str()).collect();
    assert_eq!(
        ids,
        ["own-1", "own-2"],
        "one transaction, in insertion order"
    );
    assert_eq!(keys(&first), ["a", "a"]);
    assert_eq!(first.events[0].topic.as_deref(), Some("verify.topic"));
    assert_eq!(
        &first.events[0].payload[..],
        br#"{"id": "own-1", "quote": "it's"}"#
    );
    let second = next_transaction(&mut stream).await;
    let ids: Vec<&str> = second
        .events
        .iter()
        .map(|e| e.message_id.as_str())
        .collect();
    assert_eq!(ids, ["own-3"], "the rolled-back transaction never appears");
    drop(stream);

    let delivered = [Delivered {
        table: 0,
        id: first.events[0].id,
        partition: 1,
        offset: 7,
    }];
    let batch = WriteBack {
        delivered: &delivered,
        failed: &[],
        parked: &[],
        rejected: &[],
        checkpoint: None,
        replace_positions: false,
    };
    store.write_back(batch).await.expect("write back");
    let all: Vec<String> = ["own-1", "own-2", "own-3", "own-ghost"]
        .map(String::from)
        .to_vec();
    let mut states = store.own_rows(&all).await.expect("read own rows");
    states.sort_by(|a, b| a.message_id.cmp(&b.message_id));
    let seen: Vec<_> = states
        .iter()
        .map(|s| (s.message_id.as_str(), s.status.as_str(), s.position))
        .collect();
    assert_eq!(
        seen,
        [
            ("own-1", "SUCCESS", Some((1, 7))),
            ("own-2", "INIT", None),
            ("own-3", "INIT", None),
        ],
        "the rolled-back row does not exist"
    );

    let deleted = (store
        .delete_own_rows(&all, OwnRowsToDelete::Delivered)
        .await)
        .expect("delete delivered own rows");
    assert_eq!(deleted, 1, "only the SUCCESS row");
    let deleted =
        (store.delete_own_rows(&all, OwnRowsToDelete::All).await).expect("delete every own row");
    assert_eq!(deleted, 2);
    assert!(store.own_rows(&all).await.expect("read").is_empty());
    assert!(store.own_rows(&[]).await.expect("read none").is_empty());
    h.cleanup().await;
}
