//! The status write-back against a real MariaDB (`scripts/services`) where its size
//! matters: a write-back larger than the server's `max_allowed_packet` must still commit,
//! as one transaction, instead of failing (and being retried) forever. The connector runs
//! as the runtime user, after `init` as the admin user (README, "Privileges").

mod support;

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use outboxd_connector::{OutboxStore, ParkedEvent, WriteBack};
use support::{next_transaction, Fixture};

const ROWS: usize = 100_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_transaction_larger_than_max_allowed_packet_is_written_back() {
    let f = Fixture::least_privilege("wb_large");
    f.init().await.expect("init");
    let store = f.connector.open_store().await.expect("store");
    let mut stream = f.connector.open_stream().await.expect("stream");
    let mut sql = f.sql().await;
    let max_packet: u64 = sql
        .query_first("SELECT @@max_allowed_packet")
        .await
        .expect("max_allowed_packet")
        .expect("a value");

    // The key is blocked by a FAILED row; then one transaction adds ROWS rows to it.
    let key = "order-large-parked-1";
    sql.query_drop(format!(
        "INSERT INTO `{}` (message_id, message_type, biz_key, payload, status, next_retry_time) \
         VALUES ('blocker', 'order.step0', '{key}', '{{}}', 'FAILED', NOW(6) + INTERVAL 1 HOUR)",
        f.table
    ))
    .await
    .expect("the blocking FAILED row");
    sql.query_drop(format!(
        "INSERT INTO `{}` (message_id, message_type, biz_key, payload) \
         SELECT CONCAT('big-', seq), CONCAT('order.step', seq), '{key}', '{{}}' FROM seq_1_to_{ROWS}",
        f.table
    ))
    .await
    .expect("one transaction of many rows");

    let txn = next_transaction(&mut stream, Duration::from_secs(120)).await;
    assert_eq!(txn.events.len(), ROWS, "the INIT rows of the transaction");
    // What the relay writes for a row parked behind its key.
    let parked: Vec<ParkedEvent> = txn
        .events
        .iter()
        .map(|e| ParkedEvent {
            table: 0,
            id: e.id,
            reason: format!(
                "parked: an earlier event of biz_key `{}` is not delivered yet (strict ordering)",
                e.biz_key
            ),
        })
        .collect();
    let text: usize = parked.iter().map(|p| p.reason.len() * 2 + 30).sum();
    assert!(
        text as u64 > max_packet,
        "the test needs a write-back over max_allowed_packet ({max_packet}): ~{text} bytes"
    );

    let started = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(300),
        store.write_back(WriteBack {
            parked: &parked,
            checkpoint: Some(&txn.commit_position),
            ..WriteBack::default()
        }),
    )
    .await
    .expect("the write-back finishes");
    if let Err(e) = &result {
        panic!("write-back of {ROWS} parked rows failed: {e}");
    }
    println!("{ROWS} parked rows written back in {:?}", started.elapsed());

    let statuses: Vec<(String, u64)> = sql
        .query(format!(
            "SELECT status, COUNT(*) FROM `{}` WHERE message_id LIKE 'big-%' GROUP BY status",
            f.table
        ))
        .await
        .expect("statuses");
    assert_eq!(
        statuses,
        [("FAILED".to_owned(), ROWS as u64)],
        "nothing stuck INIT"
    );
    let (parked_ok,): (u64,) = sql
        .query_first(format!(
            "SELECT COUNT(*) FROM `{}` WHERE message_id LIKE 'big-%' AND retry_count = 0 \
             AND next_retry_time IS NOT NULL AND last_error LIKE 'parked: an earlier event%'",
            f.table
        ))
        .await
        .expect("parked rows")
        .expect("a count");
    assert_eq!(
        parked_ok as usize, ROWS,
        "written as the parked path writes"
    );
    assert_eq!(
        store.load_checkpoint().await.expect("checkpoint"),
        Some(txn.commit_position.clone()),
        "the checkpoint advanced with the rows"
    );
    drop(stream);
    f.cleanup().await;
}
