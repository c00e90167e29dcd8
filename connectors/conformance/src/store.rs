//! [`OutboxStore::write_back`] and the checkpoint: the status state machine, idempotent
//! replay, `last_error` truncation, and a checkpoint that commits with its batch and never
//! moves backward.

use std::time::Duration;

use outboxd_connector::{
    Connector, Delivered, DeliveryFailure, OutboxStore, ParkedEvent, ReadMode, RowId, WriteBack,
    LAST_ERROR_MAX_CHARS,
};

use crate::support::{initialised, store};
use crate::{Harness, NewRow, Setup, Table};

/// SUCCESS with where the record landed; FAILED with `retry_count + 1`, the error and
/// the next retry time; MANUAL_REQUIRED at `max_retry_count`; a replayed batch changes
/// nothing; a late failure never undoes a SUCCESS; delivered wins over failed in one
/// batch.
pub async fn write_back_moves_rows_through_the_state_machine<H: Harness>() {
    let h: H = initialised("wb_sm", ReadMode::Log).await;
    let ids = h.insert(&NewRow::keys(&["a", "b", "c"])).await;
    let manual = h.insert(&[NewRow::keyed("d").max_retries(1)]).await[0];
    let store = store(&h).await;

    let quoted = "topic 'x' is not authorised; it's \"bad\"";
    let delivered = [Delivered {
        table: 0,
        id: ids[0],
        partition: 2,
        offset: 42,
    }];
    let failed = [
        DeliveryFailure {
            table: 0,
            id: ids[1],
            error: quoted.into(),
            retry_delay: Duration::from_secs(30),
        },
        DeliveryFailure {
            table: 0,
            id: manual,
            error: "é".repeat(5000),
            retry_delay: Duration::from_millis(1500),
        },
    ];
    let batch = WriteBack {
        delivered: &delivered,
        failed: &failed,
        parked: &[],
        rejected: &[],
        checkpoint: None,
        replace_positions: false,
    };
    store.write_back(batch).await.expect("write back");

    let ok = h.row(ids[0]).await;
    assert_eq!(ok.status, "SUCCESS");
    assert!(ok.sent);
    assert_eq!((ok.partition, ok.offset), (Some(2), Some(42)));
    assert_eq!(
        (ok.retry_count, ok.last_error, ok.next_retry_in),
        (0, None, None)
    );

    let failed_row = h.row(ids[1]).await;
    assert_eq!(
        (failed_row.status.as_str(), failed_row.retry_count),
        ("FAILED", 1)
    );
    assert_eq!(failed_row.last_error.as_deref(), Some(quoted));
    let due = failed_row.next_retry_in.expect("next_retry_time set");
    assert!(
        (25.0..=31.0).contains(&due),
        "next retry in {due}s, expected ~30s"
    );
    assert!(!failed_row.sent);

    let manual_row = h.row(manual).await;
    assert_eq!(manual_row.status, "MANUAL_REQUIRED");
    assert_eq!(manual_row.retry_count, 1);
    assert_eq!(
        manual_row.last_error.map(|e| e.chars().count()),
        Some(LAST_ERROR_MAX_CHARS),
        "last_error is cut on a character boundary"
    );

    let untouched = h.row(ids[2]).await;
    assert_eq!(
        (untouched.status.as_str(), untouched.retry_count),
        ("INIT", 0)
    );

    // Replaying the same batch (after a crash) changes nothing.
    store.write_back(batch).await.expect("replay");
    let again = h.row(ids[0]).await;
    assert_eq!(
        (again.status.as_str(), again.partition, again.offset),
        ("SUCCESS", Some(2), Some(42))
    );
    let again = h.row(ids[1]).await;
    assert_eq!((again.status.as_str(), again.retry_count), ("FAILED", 1));
    let again = h.row(manual).await;
    assert_eq!(
        (again.status.as_str(), again.retry_count),
        ("MANUAL_REQUIRED", 1)
    );

    // A FAILED row delivered later becomes SUCCESS and leaves the retry index; so does a
    // MANUAL_REQUIRED row (parked by an operator while its record was on its way: it is
    // in Kafka, so SUCCESS is the truth); a late failure does not undo a SUCCESS.
    let delivered = [
        Delivered {
            table: 0,
            id: ids[1],
            partition: 0,
            offset: 7,
        },
        Delivered {
            table: 0,
            id: manual,
            partition: 0,
            offset: 8,
        },
    ];
    let late_failure = [DeliveryFailure {
        table: 0,
        id: ids[0],
        error: "late".into(),
        retry_delay: Duration::from_secs(1),
    }];
    store
        .write_back(WriteBack {
            delivered: &delivered,
            failed: &late_failure,
            parked: &[],
            rejected: &[],
            checkpoint: None,
            replace_positions: false,
        })
        .await
        .expect("second write back");
    let retried = h.row(ids[1]).await;
    assert_eq!(retried.status, "SUCCESS");
    assert_eq!(
        (
            retried.retry_count,
            retried.last_error,
            retried.next_retry_in
        ),
        (1, None, None)
    );
    assert_eq!(retried.offset, Some(7));
    let manual_row = h.row(manual).await;
    assert_eq!(
        (manual_row.status.as_str(), manual_row.offset),
        ("SUCCESS", Some(8))
    );
    let first = h.row(ids[0]).await;
    assert_eq!(
        (first.status.as_str(), first.retry_count, first.offset),
        ("SUCCESS", 0, Some(42))
    );

    // Delivered and failed in one batch: delivered wins.
    let both = ids[2];
    let d = [Delivered {
        table: 0,
        id: both,
        partition: 1,
        offset: 1,
    }];
    let f = [DeliveryFailure {
        table: 0,
        id: both,
        error: "x".into(),
        retry_delay: Duration::ZERO,
    }];
    store
        .write_back(WriteBack {
            delivered: &d,
            failed: &f,
            parked: &[],
            rejected: &[],
            checkpoint: None,
            replace_positions: false,
        })
        .await
        .expect("both");
    assert_eq!(h.row(both).await.status, "SUCCESS");

    // An empty batch is a no-op.
    store
        .write_back(WriteBack::default())
        .await
        .expect("empty batch");
    drop(store);
    h.cleanup().await;
}

/// Exactly-once's resend: a row already SUCCESS keeps its position when a write-back is
/// replayed (at least once: its first record is in Kafka), and takes the new one with
/// `replace_positions` (its first record's Kafka transaction aborted, and it was sent
/// again).
pub async fn a_success_row_takes_a_new_position_only_when_its_first_was_aborted<H: Harness>() {
    let h: H = initialised("wb_replace", ReadMode::Log).await;
    let store = store(&h).await;
    let ids = h.insert(&[NewRow::keyed("k")]).await;
    let first = [Delivered {
        table: 0,
        id: ids[0],
        partition: 0,
        offset: 5,
    }];
    let again = [Delivered {
        offset: 9,
        ..first[0].clone()
    }];
    for (rows, replace) in [(&first, false), (&again, false)] {
        store
            .write_back(WriteBack {
                delivered: rows,
                replace_positions: replace,
                ..WriteBack::default()
            })
            .await
            .expect("write back");
    }
    let row = h.row(ids[0]).await;
    assert_eq!((row.status.as_str(), row.offset), ("SUCCESS", Some(5)));
    store
        .write_back(WriteBack {
            delivered: &again,
            replace_positions: true,
            ..WriteBack::default()
        })
        .await
        .expect("write back the resent row");
    let row = h.row(ids[0]).await;
    assert_eq!(
        (row.status.as_str(), row.offset),
        ("SUCCESS", Some(9)),
        "the resent record's position"
    );
    drop(store);
    h.cleanup().await;
}

/// Exactly-once's write-back of a window read again after its Kafka transaction aborted:
/// a row the table shows SUCCESS there was written so before a commit that never
/// happened, so with `replace_positions` a park, a failure or a rejection takes it (and
/// its position, which names an aborted record, goes); at least once, SUCCESS is the
/// truth and they do not. Rows in other states (FAILED, PROCESSING, MANUAL_REQUIRED) are
/// not taken either way, and a replay changes nothing.
pub async fn exactly_once_parks_and_fails_a_success_row_of_an_aborted_transaction<H: Harness>() {
    let h: H = initialised("wb_aborted", ReadMode::Log).await;
    let store = store(&h).await;
    let ids = h.insert(&NewRow::keys(&["k", "k", "k"])).await;
    let (parked, failed, rejected) = (ids[0], ids[1], ids[2]);
    let last_attempt = h.insert(&[NewRow::keyed("m").max_retries(1)]).await[0];
    let others = h.insert(&NewRow::keys(&["x", "y", "z"])).await;
    h.set(&others[..1], &Setup::status("FAILED", Some(600)))
        .await;
    h.set(&others[1..2], &Setup::status("PROCESSING", None))
        .await;
    h.set(&others[2..], &Setup::status("MANUAL_REQUIRED", None))
        .await;

    let shown: Vec<Delivered> = [parked, failed, rejected, last_attempt]
        .iter()
        .zip(10..)
        .map(|(&id, offset)| Delivered {
            table: 0,
            id,
            partition: 1,
            offset,
        })
        .collect();
    store
        .write_back(WriteBack {
            delivered: &shown,
            replace_positions: true,
            ..WriteBack::default()
        })
        .await
        .expect("the aborted window's write-back");
    let failures: Vec<DeliveryFailure> = [failed, last_attempt]
        .iter()
        .map(|&id| DeliveryFailure {
            table: 0,
            id,
            error: "refused".into(),
            retry_delay: Duration::from_secs(30),
        })
        .collect();
    let note = |id| ParkedEvent {
        table: 0,
        id,
        reason: format!("note {id}"),
    };
    let parks: Vec<ParkedEvent> = std::iter::once(parked)
        .chain(others.iter().copied())
        .map(note)
        .collect();
    let rejections = [note(rejected)];
    let batch = |replace_positions| WriteBack {
        failed: &failures,
        parked: &parks,
        rejected: &rejections,
        replace_positions,
        ..WriteBack::default()
    };

    // At least once: SUCCESS stays.
    store.write_back(batch(false)).await.expect("at least once");
    for (&id, offset) in [parked, failed, rejected, last_attempt].iter().zip(10..) {
        let row = h.row(id).await;
        assert_eq!(
            (row.status.as_str(), row.offset),
            ("SUCCESS", Some(offset)),
            "row {id}"
        );
    }

    // Exactly-once, twice (the second a replay).
    for _ in 0..2 {
        store.write_back(batch(true)).await.expect("exactly-once");
        let row = h.row(parked).await;
        assert_eq!(
            (row.status.as_str(), row.retry_count, row.last_error.clone()),
            ("FAILED", 0, Some(format!("note {parked}"))),
            "parked"
        );
        let due = row.next_retry_in.expect("due");
        assert!(due <= 1.0, "a parked row is due now, not in {due}s");
        let row = h.row(failed).await;
        assert_eq!(
            (
                row.status.as_str(),
                row.retry_count,
                row.last_error.as_deref()
            ),
            ("FAILED", 1, Some("refused")),
            "failed"
        );
        let due = row.next_retry_in.expect("due");
        assert!((25.0..=31.0).contains(&due), "next retry in {due}s");
        let row = h.row(last_attempt).await;
        assert_eq!(
            (row.status.as_str(), row.retry_count),
            ("MANUAL_REQUIRED", 1),
            "failed at its last attempt"
        );
        let row = h.row(rejected).await;
        assert_eq!(
            (row.status.as_str(), row.retry_count, row.last_error.clone()),
            ("MANUAL_REQUIRED", 0, Some(format!("note {rejected}"))),
            "rejected"
        );
        for id in [parked, failed, rejected, last_attempt] {
            let row = h.row(id).await;
            assert_eq!(
                (row.sent, row.partition, row.offset),
                (false, None, None),
                "row {id} no longer names the aborted record"
            );
        }
        for (&id, status) in others
            .iter()
            .zip(["FAILED", "PROCESSING", "MANUAL_REQUIRED"])
        {
            let row = h.row(id).await;
            assert_eq!(
                (row.status.as_str(), row.last_error),
                (status, None),
                "row {id} is not taken"
            );
        }
    }
    drop(store);
    h.cleanup().await;
}

/// What a session reading transactions again asks: the highest SUCCESS id (none in an
/// empty or undelivered table), and which of some ids are SUCCESS already — whatever their
/// other rows' statuses, and however many ids are asked at once.
pub async fn delivered_rows_are_found_for_a_transaction_read_again<H: Harness>() {
    let h: H = initialised("wb_again", ReadMode::Log).await;
    let store = store(&h).await;
    assert_eq!(store.highest_delivered_id().await.expect("highest"), None);
    let keys: Vec<String> = (0..1500).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let ids = h.insert(&NewRow::keys(&keys)).await;
    assert_eq!(store.highest_delivered_id().await.expect("highest"), None);

    // Every other row of the first 1,200 delivered; one failed; the rest INIT.
    let delivered: Vec<Delivered> = ids[..1200]
        .iter()
        .step_by(2)
        .map(|id| Delivered {
            table: 0,
            id: *id,
            partition: 0,
            offset: *id,
        })
        .collect();
    let failed = [DeliveryFailure {
        table: 0,
        id: ids[1],
        error: "x".into(),
        retry_delay: Duration::from_secs(60),
    }];
    store
        .write_back(WriteBack {
            delivered: &delivered,
            failed: &failed,
            ..WriteBack::default()
        })
        .await
        .expect("write back");

    assert_eq!(
        store.highest_delivered_id().await.expect("highest"),
        Some(ids[1198])
    );
    let rows: Vec<RowId> = ids.iter().map(|&id| RowId { table: 0, id }).collect();
    let found = store.delivered_among(&rows).await.expect("delivered among");
    let expected: std::collections::HashSet<RowId> = delivered
        .iter()
        .map(|d| RowId { table: 0, id: d.id })
        .collect();
    assert_eq!(found, expected);
    assert!(store.delivered_among(&[]).await.expect("no ids").is_empty());
    drop(store);
    h.cleanup().await;
}

/// The checkpoint is written with the statuses of its batch (both or neither), ordered as
/// positions (not as text), never moved backward, and read back by a new store.
pub async fn checkpoint_commits_with_the_batch_and_never_moves_backward<H: Harness>() {
    let h: H = initialised("wb_ck", ReadMode::Log).await;
    let [p0, p1, p2, p3] = h.positions();
    let store = store(&h).await;
    if let Some(start) = store.load_checkpoint().await.expect("load") {
        assert!(start < p0, "init's checkpoint {start} is before {p0}");
    }

    let ids = h.insert(&NewRow::keys(&["a"])).await;
    let delivered = [Delivered {
        table: 0,
        id: ids[0],
        partition: 0,
        offset: 1,
    }];
    store
        .write_back(WriteBack {
            delivered: &delivered,
            checkpoint: Some(&p1),
            ..WriteBack::default()
        })
        .await
        .expect("write back");
    assert_eq!(
        store.load_checkpoint().await.expect("load"),
        Some(p1.clone())
    );
    assert_eq!(h.row(ids[0]).await.status, "SUCCESS");
    // The same rows again (a transaction read again after a restart): no status to
    // write, the first record's position kept, and the checkpoint still moves.
    let again = [Delivered {
        offset: 7,
        ..delivered[0].clone()
    }];
    store
        .write_back(WriteBack {
            delivered: &again,
            checkpoint: Some(&p2),
            ..WriteBack::default()
        })
        .await
        .expect("write back rows already SUCCESS");
    assert_eq!(
        store.load_checkpoint().await.expect("load"),
        Some(p2.clone())
    );
    let row = h.row(ids[0]).await;
    assert_eq!((row.status.as_str(), row.offset), ("SUCCESS", Some(1)));

    for older in [&p0, &p1] {
        store
            .write_back(WriteBack {
                checkpoint: Some(older),
                ..WriteBack::default()
            })
            .await
            .expect("older checkpoint");
        assert_eq!(
            store.load_checkpoint().await.expect("load"),
            Some(p2.clone()),
            "{older} is before {p2}: ignored"
        );
    }
    // A batch that fails commits nothing: neither its statuses nor its checkpoint,
    // whichever of its statements fails.
    let more = h.insert(&NewRow::keys(&["b"])).await;
    let delivered = [Delivered {
        table: 0,
        id: more[0],
        partition: 0,
        offset: 2,
    }];
    for table in [Table::Outbox, Table::Checkpoint] {
        h.hide_table(table, true).await;
        let failed = store
            .write_back(WriteBack {
                delivered: &delivered,
                checkpoint: Some(&p3),
                ..WriteBack::default()
            })
            .await;
        h.hide_table(table, false).await;
        assert!(
            failed.is_err(),
            "a write-back without the {table:?} table succeeded"
        );
        let reopened = h.connector().open_store().await.expect("reopen");
        assert_eq!(
            reopened.load_checkpoint().await.expect("load"),
            Some(p2.clone()),
            "the checkpoint of a failed batch ({table:?} missing) is not written"
        );
        assert_eq!(
            h.row(more[0]).await.status,
            "INIT",
            "the statuses of a failed batch ({table:?} missing) are not written"
        );
    }

    store
        .write_back(WriteBack {
            checkpoint: Some(&p3),
            ..WriteBack::default()
        })
        .await
        .expect("newer checkpoint");
    assert_eq!(
        store.load_checkpoint().await.expect("load"),
        Some(p3.clone())
    );
    // The same position again is fine.
    store
        .write_back(WriteBack {
            checkpoint: Some(&p3),
            ..WriteBack::default()
        })
        .await
        .expect("same checkpoint");
    assert_eq!(
        store.load_checkpoint().await.expect("load"),
        Some(p3.clone())
    );

    // A second store (a restarted outboxd) reads the same checkpoint.
    let reopened = h.connector().open_store().await.expect("reopen");
    assert_eq!(reopened.load_checkpoint().await.expect("load"), Some(p3));
    drop((store, reopened));
    h.cleanup().await;
}

/// Before `init`, opening the store is a definite error that says to run it.
pub async fn open_store_without_tables_is_a_definite_error<H: Harness>() {
    let h = H::create("wb_nt").await;
    let err = match h.connector().open_store().await {
        Ok(_) => panic!("a store opened without tables"),
        Err(e) => e,
    };
    assert!(!err.is_transient(), "{err}");
    assert!(err.to_string().contains("outboxd init"), "{err}");
    h.cleanup().await;
}
