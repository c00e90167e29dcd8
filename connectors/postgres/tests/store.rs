//! What only the PostgreSQL outbox store does, against a real server: HOT SUCCESS
//! write-backs, the plans of the statements that must stay cheap on a large table, and
//! the wait for rows of a commit the log handed over before it became visible.
//!
//! The contract's store scenarios (state machine, replay, checkpoint, claims, tokens,
//! reaper, parked rows, schedule, blocked keys) run from `tests/conformance.rs`. The
//! store runs as the runtime role, after `init` as the admin role (README, "Privileges").

mod support_store;

use std::time::{Duration, Instant};

use outboxd_connector::{Delivered, OutboxStore, ReadMode, WriteBack};
use outboxd_postgres::Lsn;
use support_store::Fixture;

/// A fixture whose store runs as the runtime role, after `init` as the admin role.
async fn initialised(prefix: &str) -> Fixture {
    let fx = Fixture::least_privilege(prefix).await;
    fx.init(ReadMode::Log).await.expect("init");
    fx
}

#[tokio::test]
async fn success_write_back_is_a_hot_update() {
    let fx = initialised("st_hot").await;
    let ids = fx.insert_rows(2000, 10).await;
    let store = fx.connector.open_store().await.expect("open store");
    for (n, id) in ids.iter().enumerate() {
        let offset = i64::try_from(n).expect("small");
        let d = [Delivered {
            table: 0,
            id: *id,
            partition: 0,
            offset,
        }];
        let position = Lsn(0x100_0000 + u64::try_from(n).expect("small")).position();
        store
            .write_back(WriteBack {
                delivered: &d,
                failed: &[],
                parked: &[],
                rejected: &[],
                checkpoint: Some(&position),
                replace_positions: false,
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

/// With 20,000 SUCCESS rows and a few in trouble, the statements the retry worker runs
/// all the time use the partial indexes, never a sequential scan of the outbox.
#[tokio::test]
async fn hot_statements_use_the_partial_indexes_on_a_large_table() {
    let fx = Fixture::least_privilege("st_explain").await;
    fx.init(ReadMode::Poll).await.expect("init");
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
        table: 0,
        id,
        partition: 0,
        offset: 5,
    }];
    let position = Lsn(0x2000).position();
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
        table: 0,
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

/// A write-back whose future is dropped half-way (here: while it waits for a row that
/// never shows up) commits nothing, and the store's next operations do not run inside its
/// abandoned transaction: they see the checkpoint before it and commit their own.
/// (Several worker threads: should a transaction stay open, the store's connection task
/// must still run to close it while the fixture's cleanup blocks on its locks.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_back_dropped_half_way_commits_nothing_and_the_store_goes_on() {
    let fx = initialised("st_dropped").await;
    let ids = fx.insert_rows(1, 1).await;
    let store = fx.connector.open_store().await.expect("open store");
    let first = Lsn(0x3000).position();
    store
        .write_back(WriteBack {
            checkpoint: Some(&first),
            ..WriteBack::default()
        })
        .await
        .expect("write back the first checkpoint");

    let gone = [Delivered {
        table: 0,
        id: ids[0] + 1_000_000,
        partition: 0,
        offset: 1,
    }];
    let abandoned = Lsn(0x4000).position();
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        store.write_back(WriteBack {
            delivered: &gone,
            checkpoint: Some(&abandoned),
            ..WriteBack::default()
        }),
    )
    .await;
    assert!(
        dropped.is_err(),
        "the write-back should still be waiting for the missing row: {dropped:?}"
    );
    assert_eq!(
        store.load_checkpoint().await.expect("load"),
        Some(first),
        "the dropped write-back's checkpoint must not be seen"
    );

    let delivered = [Delivered {
        table: 0,
        id: ids[0],
        partition: 0,
        offset: 2,
    }];
    let next = Lsn(0x5000).position();
    store
        .write_back(WriteBack {
            delivered: &delivered,
            checkpoint: Some(&next),
            ..WriteBack::default()
        })
        .await
        .expect("write back after the dropped one");
    assert_eq!(fx.status(ids[0]).await, "SUCCESS");
    drop(store);
    let reopened = fx.connector.open_store().await.expect("reopen store");
    assert_eq!(
        reopened.load_checkpoint().await.expect("load"),
        Some(next),
        "the write-back after the dropped one is committed"
    );
}
