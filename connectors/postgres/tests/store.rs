//! The PostgreSQL outbox store against a real server: status transitions, idempotent
//! replay, a checkpoint that never moves backward, and HOT SUCCESS write-backs.

mod support_store;

use std::time::{Duration, Instant};

use outboxd_connector::{Delivered, DeliveryFailure, OutboxStore, Position, WriteBack};
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
