//! What only the MySQL/MariaDB binlog stream does, against a real MariaDB
//! (`scripts/services`): GTIDs riding along, the pipeline lock, DDL mid-stream, progress
//! written to the checkpoint row. The contract's store and stream scenarios run from
//! `tests/conformance.rs`. The connector runs as the runtime user, after `init` as the
//! admin user (README, "Privileges"); the test's own SQL as the test user.

mod support;

use std::time::Duration;

use mysql_async::prelude::Queryable;
use outboxd_connector::{ChangeItem, ChangeStream, Delivered, OutboxStore, WriteBack};
use outboxd_mysql::BinlogPosition;
use support::{next_transaction, Fixture};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_inserts_arrive_once_and_rollbacks_never() {
    let f = Fixture::least_privilege("st_commit");
    let report = f.init().await.expect("init");
    println!("{}", report.join("\n"));
    let store = f.connector.open_store().await.expect("store");
    let mut stream = f.connector.open_stream().await.expect("stream");
    let mut sql = f.sql().await;

    sql.query_drop(format!(
        "START TRANSACTION; {}; {}; COMMIT",
        f.insert_sql("k1", 1, "a"),
        f.insert_sql("k1", 2, "a")
    ))
    .await
    .expect("commit two");
    sql.query_drop(format!(
        "START TRANSACTION; {}; ROLLBACK",
        f.insert_sql("ghost", 1, "r")
    ))
    .await
    .expect("rollback");
    sql.query_drop(f.insert_sql("k2", 1, "b"))
        .await
        .expect("autocommit");

    let first = next_transaction(&mut stream, Duration::from_secs(10)).await;
    assert_eq!(first.events.len(), 2);
    let e = &first.events[0];
    assert_eq!(e.message_id, "a-k1-1");
    assert_eq!(e.biz_key, "k1");
    assert_eq!(&e.key[..], b"k1");
    assert_eq!(e.topic, None);
    assert_eq!(&e.payload[..], br#"{"key": "k1", "seq": 1}"#);
    assert_eq!(e.headers[0].0, "seq");
    assert_eq!(e.retry_count, 0);
    assert_eq!(e.max_retry_count, 10);
    assert!(e.created_at.ends_with("+00:00"), "{}", e.created_at);
    assert!(first.commit_time.is_some());
    let second = next_transaction(&mut stream, Duration::from_secs(10)).await;
    assert_eq!(second.events.len(), 1);
    assert_eq!(
        second.events[0].biz_key, "k2",
        "the rolled-back row never appears"
    );
    assert!(second.commit_position > first.commit_position);
    let b = BinlogPosition::from_position(&second.commit_position).expect("binlog");
    assert!(b.gtid_set.is_some(), "MariaDB GTIDs ride along: {b:?}");

    let delivered: Vec<Delivered> = first
        .events
        .iter()
        .chain(&second.events)
        .enumerate()
        .map(|(i, e)| Delivered {
            table: 0,
            id: e.id,
            partition: 0,
            offset: i as i64,
        })
        .collect();
    store
        .write_back(WriteBack {
            delivered: &delivered,
            checkpoint: Some(&second.commit_position),
            ..WriteBack::default()
        })
        .await
        .expect("write back");
    assert_eq!(
        store.load_checkpoint().await.expect("checkpoint"),
        Some(second.commit_position.clone())
    );
    // Backward never.
    store
        .write_back(WriteBack {
            checkpoint: Some(&first.commit_position),
            ..WriteBack::default()
        })
        .await
        .expect("older checkpoint");
    assert_eq!(
        store.load_checkpoint().await.expect("checkpoint"),
        Some(second.commit_position.clone())
    );
    let statuses: Vec<(String, i64)> = sql
        .query(format!(
            "SELECT status, COUNT(*) FROM `{}` GROUP BY status",
            f.table
        ))
        .await
        .expect("statuses");
    assert_eq!(statuses, [("SUCCESS".to_owned(), 3)]);

    // Our own status updates are not events.
    sql.query_drop(f.insert_sql("k3", 1, "c"))
        .await
        .expect("insert");
    let third = next_transaction(&mut stream, Duration::from_secs(10)).await;
    assert_eq!(third.events[0].biz_key, "k3");
    drop(stream);

    // Reopened, the stream resumes at the checkpoint: k3 again (never confirmed), no k1/k2.
    let mut stream = loop {
        match f.connector.open_stream().await {
            Ok(s) => break s,
            Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(stream.start(), &b, "starts at the checkpoint");
    let again = next_transaction(&mut stream, Duration::from_secs(10)).await;
    assert_eq!(again.events[0].biz_key, "k3");
    assert_eq!(again.commit_position, third.commit_position);
    drop(stream);
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_stream_waits_for_the_lock() {
    let f = Fixture::least_privilege("st_lock");
    f.init().await.expect("init");
    let first = f.connector.open_stream().await.expect("first stream");
    let err = f.connector.open_stream().await.expect_err("second stream");
    let recover = outboxd_connector::Connector::reset_log_position(&f.connector)
        .await
        .expect_err("recover while the pipeline runs");
    assert!(recover.message().contains("stop that outboxd"), "{recover}");
    assert!(err.is_transient(), "{err}");
    assert!(
        err.message()
            .contains("held by another outboxd (connection id"),
        "{err}"
    );
    drop(first);
    // The lock goes with the connection.
    let mut opened = None;
    for _ in 0..100 {
        match f.connector.open_stream().await {
            Ok(s) => {
                opened = Some(s);
                break;
            }
            Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        opened.is_some(),
        "takes over after the first stream is dropped"
    );
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn columns_added_mid_stream_keep_working() {
    let f = Fixture::least_privilege("st_ddl");
    f.init().await.expect("init");
    let mut stream = f.connector.open_stream().await.expect("stream");
    let mut sql = f.sql().await;
    sql.query_drop(f.insert_sql("k", 1, "a"))
        .await
        .expect("insert");
    // The row written before the ALTER is read before it: the stream has seen the table,
    // and the column arrives mid-stream. (Read after the ALTER, the old row's table map
    // could no longer be matched to information_schema without binlog_row_metadata =
    // FULL, which is refused as a definite error: a race the test must not run, CI's load
    // once made the stream lose it.)
    let one = next_transaction(&mut stream, Duration::from_secs(10)).await;
    assert_eq!(one.events[0].message_id, "a-k-1");
    sql.query_drop(format!(
        "ALTER TABLE `{}` ADD COLUMN tenant VARCHAR(32) NULL AFTER id",
        f.table
    ))
    .await
    .expect("alter");
    sql.query_drop(format!(
        "INSERT INTO `{}` (tenant, message_id, message_type, biz_key, payload) \
         VALUES ('t1', 'a-k-2', 'order.step2', 'k', '{{}}')",
        f.table
    ))
    .await
    .expect("insert after alter");
    let two = next_transaction(&mut stream, Duration::from_secs(10)).await;
    assert_eq!(two.events[0].message_id, "a-k-2");
    assert_eq!(&two.events[0].payload[..], b"{}");
    drop(stream);
    f.cleanup().await;
}

/// An online schema change (gh-ost, pt-online-schema-change, or MariaDB's own ALTER)
/// swaps the outbox table by renaming it: for that moment information_schema lists no
/// column of it. A stream that reads the table's columns then waits for it to come back
/// instead of taking "no columns" for a table altered out of recognition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_table_renamed_away_for_a_moment_is_waited_for() {
    let f = Fixture::least_privilege("st_swap");
    f.init().await.expect("init");
    let mut sql = f.sql().await;
    sql.query_drop(f.insert_sql("k", 1, "a"))
        .await
        .expect("insert");
    let (table, away) = (f.table.clone(), format!("{}_away", f.table));
    sql.query_drop(format!("RENAME TABLE `{table}` TO `{away}`"))
        .await
        .expect("rename away");
    // Opened now, the stream reads the row while the table is away.
    let mut stream = f.connector.open_stream().await.expect("stream");
    let back = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        sql.query_drop(format!("RENAME TABLE `{away}` TO `{table}`"))
            .await
            .expect("rename back");
    });
    let one = next_transaction(&mut stream, Duration::from_secs(15)).await;
    assert_eq!(one.events[0].message_id, "a-k-1");
    back.await.expect("renamed back");
    drop(stream);
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_progress_reaches_the_checkpoint_row() {
    let f = Fixture::least_privilege("st_progress");
    f.init().await.expect("init");
    let store = f.connector.open_store().await.expect("store");
    let start = store
        .load_checkpoint()
        .await
        .expect("load")
        .expect("init recorded one");
    let mut stream = f.connector.open_stream().await.expect("stream");
    let mut sql = f.sql().await;
    let other = format!("busy_{}", f.name);
    sql.query_drop(format!(
        "CREATE TABLE `{other}` (id INT PRIMARY KEY, v TEXT)"
    ))
    .await
    .expect("create");
    for i in 0..20 {
        sql.query_drop(format!("INSERT INTO `{other}` VALUES ({i}, 'x')"))
            .await
            .expect("busy insert");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let progress = loop {
        assert!(std::time::Instant::now() < deadline, "no progress item");
        match tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
            Ok(Ok(ChangeItem::Progress(p))) if p > start => break p,
            Ok(Ok(ChangeItem::Transaction(t))) => panic!("no outbox rows were written: {t:?}"),
            Ok(Err(e)) => panic!("{e}"),
            _ => {}
        }
    };
    stream.confirm(&progress).await.expect("confirm");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let now = store.load_checkpoint().await.expect("load").expect("row");
        if now >= progress {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "checkpoint stayed at {now}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(stream);
    let _ = sql.query_drop(format!("DROP TABLE `{other}`")).await;
    f.cleanup().await;
}

/// A checkpoint whose binlog coordinate exists on this server but holds other
/// transactions (a same-named binlog of another server, or one from before `RESET
/// MASTER`), written by an older outboxd, so there is no server identity to compare: the
/// GTID position it counted is not this server's at that coordinate, so the stream and
/// `check` refuse it and name `outboxd recover`. An older checkpoint that matches is
/// accepted, and the next write-back names this server in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_whose_gtids_are_not_this_servers_is_refused() {
    use outboxd_connector::{CheckStatus, Connector, ErrorReason, ReadMode};

    let f = Fixture::least_privilege("st_gtid");
    f.init().await.expect("init");
    let mut sql = f.sql().await;
    sql.query_drop(f.insert_sql("before", 1, "a"))
        .await
        .expect("insert");
    let (file, offset): (String, u64) = sql
        .query_first("SHOW MASTER STATUS")
        .await
        .expect("SHOW MASTER STATUS")
        .map(|row: mysql_async::Row| (row.get(0).expect("file"), row.get(1).expect("offset")))
        .expect("binlog on");
    let gtid: String = sql
        .query_first(format!("SELECT BINLOG_GTID_POS('{file}', {offset})"))
        .await
        .expect("BINLOG_GTID_POS")
        .expect("a row");
    let set_checkpoint = |text: String| {
        format!(
            "UPDATE outboxd_checkpoint SET position = '{text}' WHERE pipeline = '{}'",
            f.name
        )
    };
    // The same coordinate, GTIDs of another history: sequence numbers this server had
    // not reached there.
    let (domain_server, seq) = gtid.rsplit_once('-').expect("a MariaDB GTID position");
    let seq: u64 = seq.parse().expect("sequence number");
    let foreign = format!("binlog:{file}:{offset}:{domain_server}-{}", seq + 7);
    sql.query_drop(set_checkpoint(foreign.clone()))
        .await
        .expect("forge checkpoint");

    let err = f
        .connector
        .open_stream()
        .await
        .expect_err("a stream on a checkpoint whose GTIDs this server does not have there");
    assert!(!err.is_transient(), "{err}");
    assert_eq!(err.reason(), ErrorReason::PositionLost, "{err}");
    assert!(
        err.message().contains("outboxd recover --config <file>"),
        "{err}"
    );
    assert!(
        err.message().contains(&gtid),
        "names what the server has: {err}"
    );
    let report = Connector::check(&f.connector, ReadMode::Log).await;
    assert!(
        report
            .iter()
            .any(|l| l.item == "checkpoint" && l.status == CheckStatus::Fail),
        "{report:#?}"
    );

    // An older outboxd's checkpoint that is this server's: accepted, then rewritten with
    // the server's identity.
    sql.query_drop(set_checkpoint(format!("binlog:{file}:{offset}:{gtid}")))
        .await
        .expect("older checkpoint");
    let store = f.connector.open_store().await.expect("store");
    let mut stream = f.connector.open_stream().await.expect("stream");
    sql.query_drop(f.insert_sql("after", 1, "b"))
        .await
        .expect("insert");
    let txn = next_transaction(&mut stream, Duration::from_secs(10)).await;
    assert_eq!(txn.events[0].biz_key, "after");
    store
        .write_back(WriteBack {
            checkpoint: Some(&txn.commit_position),
            ..WriteBack::default()
        })
        .await
        .expect("write back");
    let text: String = sql
        .query_first(format!(
            "SELECT position FROM outboxd_checkpoint WHERE pipeline = '{}'",
            f.name
        ))
        .await
        .expect("checkpoint")
        .expect("a row");
    let (server_id, domain): (u32, u32) = sql
        .query_first("SELECT @@server_id, @@gtid_domain_id")
        .await
        .expect("identity")
        .expect("a row");
    assert_eq!(
        text,
        format!(
            "{};server_id={server_id};domain={domain}",
            txn.commit_position
        ),
        "the checkpoint names this server"
    );
    drop(stream);
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_lock_holder_is_taken_over_and_its_writes_are_refused() {
    let f = Fixture::least_privilege("st_fence");
    f.init().await.expect("init");
    let first_store = f.connector.open_store().await.expect("first store");
    let mut first = f.connector.open_stream().await.expect("first stream");
    let mut sql = f.sql().await;
    let lock = format!("outboxd:{}", f.name);
    let holder: u64 = sql
        .query_first(format!("SELECT IS_USED_LOCK('{lock}')"))
        .await
        .expect("holder")
        .expect("the first stream holds the lock");

    // The holder's connection dies (as after a network failure the server noticed).
    sql.query_drop(format!("KILL {holder}"))
        .await
        .expect("kill the lock connection");

    // A second outboxd (its own connector) takes over within a bound.
    let second_connector = outboxd_mysql::MysqlConnector::new(
        support::config(),
        &f.name,
        f.connector.layout().clone(),
    )
    .expect("second connector");
    let started = std::time::Instant::now();
    let second = loop {
        match second_connector.open_stream().await {
            Ok(s) => break s,
            Err(e) if e.is_transient() => {
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "no takeover within 10 s: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    println!("taken over after {:?}", started.elapsed());

    // The first one's write-back (status and checkpoint) is refused now…
    let before = first_store
        .load_checkpoint()
        .await
        .expect("load")
        .expect("row");
    let mut later = BinlogPosition::from_position(&before).expect("binlog");
    later.offset += 1_000_000;
    let refused = first_store
        .write_back(WriteBack {
            checkpoint: Some(&later.position()),
            ..WriteBack::default()
        })
        .await
        .expect_err("a write-back of the reader that lost the lock");
    println!("refused: {refused}");
    assert!(refused.message().contains("lock"), "{refused}");
    assert_eq!(
        first_store.load_checkpoint().await.expect("load"),
        Some(before.clone()),
        "the checkpoint did not move"
    );

    // …and its stream notices the lost lock within a bound and ends.
    let deadline = std::time::Instant::now() + Duration::from_secs(8);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match tokio::time::timeout(left, first.next()).await {
            Ok(Err(e)) => {
                println!("first stream ended: {e}");
                break;
            }
            Ok(Ok(_)) => {}
            Err(_) => panic!("the first stream still reads 8 s after losing its lock"),
        }
    }

    // The new holder's own write-back goes through.
    let second_store = second_connector.open_store().await.expect("second store");
    second_store
        .write_back(WriteBack {
            checkpoint: Some(&later.position()),
            ..WriteBack::default()
        })
        .await
        .expect("the holder's write-back");
    assert_eq!(
        second_store.load_checkpoint().await.expect("load"),
        Some(later.position())
    );
    drop(second);
    f.cleanup().await;
}

/// The lock holder's host vanishes (no FIN, no RST: its packets just stop): the server
/// frees the lock after the lock session's short `wait_timeout`, not the server's default
/// (8 hours), and another outboxd takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_of_a_vanished_holder_is_freed_within_a_bound() {
    let f = Fixture::least_privilege("st_vanish");
    f.init().await.expect("init");
    let direct = support::config();
    let proxy = support::Proxy::start((direct.host.clone(), direct.port)).await;
    let proxied = outboxd_mysql::MysqlConnector::new(
        outboxd_mysql::MysqlConfig {
            port: proxy.port,
            ..direct
        },
        &f.name,
        f.connector.layout().clone(),
    )
    .expect("proxied connector");
    let mut first = proxied.open_stream().await.expect("first stream");
    proxy.freeze();

    let started = std::time::Instant::now();
    let bound = Duration::from_secs(45);
    let second = loop {
        match f.connector.open_stream().await {
            Ok(s) => break s,
            Err(e) if e.is_transient() => {
                assert!(
                    started.elapsed() < bound,
                    "the vanished holder still holds the lock after {bound:?}: {e}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    println!("taken over after {:?}", started.elapsed());

    // The frozen side ends too (its pings time out) instead of hanging.
    match tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Err(e) = first.next().await {
                return e;
            }
        }
    })
    .await
    {
        Ok(e) => println!("frozen stream ended: {e}"),
        Err(_) => panic!("the frozen stream hangs"),
    }
    drop(second);
    f.cleanup().await;
}

/// A large transaction that also changed a non-transactional table, then rolled back: none
/// of its outbox rows may come out, not even as parts of a transaction too large to hold
/// whole. MariaDB (row format) logs only the non-transactional change, as its own group;
/// a server that logs the whole group ending in ROLLBACK does not mark it transactional,
/// and such a group is held whole by the decoder (`Group::may_split`), never split.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_rolled_back_transaction_with_a_non_transactional_table_yields_nothing() {
    let f = Fixture::least_privilege("st_myisam");
    f.init().await.expect("init");
    let mut stream = f.connector.open_stream().await.expect("stream");
    let mut sql = f.sql().await;
    let side = format!("{}_side", f.table);
    sql.query_drop(format!(
        "CREATE TABLE `{side}` (id INT PRIMARY KEY) ENGINE = MyISAM"
    ))
    .await
    .expect("a MyISAM table");
    let rows = 2 * outboxd_connector::PART_EVENTS + 7;
    sql.query_drop(format!(
        "START TRANSACTION; \
         INSERT INTO `{outbox}` (message_id, message_type, biz_key, payload) \
         SELECT CONCAT('ghost-', seq), CONCAT('t', seq), CONCAT('g', seq), '{{}}' \
         FROM seq_1_to_{rows}; \
         INSERT INTO `{side}` VALUES (1); \
         ROLLBACK",
        outbox = f.table
    ))
    .await
    .expect("the mixed transaction, rolled back");
    sql.query_drop(f.insert_sql("real", 1, "after"))
        .await
        .expect("a committed row");

    // The first outbox item is the committed row: no part of the ghost transaction.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the committed row never came"
        );
        match tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
            Ok(Ok(ChangeItem::Part(part))) => {
                panic!(
                    "rows of a rolled-back transaction handed over: {:?}",
                    part.events[0].message_id
                )
            }
            Ok(Ok(ChangeItem::Transaction(t))) => {
                let ids: Vec<&str> = t.events.iter().map(|e| e.message_id.as_str()).collect();
                assert_eq!(ids, ["after-real-1"], "only the committed row");
                break;
            }
            Ok(Err(e)) => panic!("{e}"),
            _ => {}
        }
    }
    let _ = sql.query_drop(format!("DROP TABLE `{side}`")).await;
    drop(stream);
    f.cleanup().await;
}
