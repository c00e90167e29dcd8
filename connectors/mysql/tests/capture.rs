//! Captures the binlog fixture of the decoder's unit tests from the real server:
//!
//! ```sh
//! eval "$(scripts/services env)"
//! cargo test -p outboxd-mysql --test capture -- --ignored --nocapture
//! ```
//!
//! It recreates `fixture_outbox` in the test database, writes a known sequence of
//! transactions, reads them back through the replication protocol (`mysql_async`'s binlog
//! stream, as outboxd does, registered with a throwaway server_id) and writes every event,
//! re-serialised byte for byte with its CRC32 checked, to
//! `src/log/testdata/mariadb_outbox.hex`, one event per line after a comment naming it.

mod support;

use std::fmt::Write as _;
use std::time::Duration;

use futures_util::StreamExt;
use mysql_async::binlog::BinlogVersion;
use mysql_async::prelude::Queryable;
use mysql_async::BinlogStreamRequest;
use support::Fixture;

#[tokio::test]
#[ignore = "writes src/log/testdata/mariadb_outbox.hex; run by hand against scripts/services"]
async fn capture_mariadb_fixture() {
    let f = Fixture::new("capture");
    let mut sql = f.sql().await;
    sql.query_drop("DROP TABLE IF EXISTS fixture_outbox, fixture_other")
        .await
        .expect("drop");
    let ddl = include_str!("../../../schemas/mysql/outbox.sql")
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("`outbox`", "`fixture_outbox`")
        .replace("`outbox_", "`fixture_outbox_");
    sql.query_drop(ddl).await.expect("create fixture_outbox");
    sql.query_drop("CREATE TABLE fixture_other (id INT PRIMARY KEY, v TEXT)")
        .await
        .expect("create fixture_other");
    let (file, pos): (String, u64) = {
        let row: mysql_async::Row = sql
            .query_first("SHOW MASTER STATUS")
            .await
            .expect("status")
            .expect("binlog on");
        (row.get(0).expect("file"), row.get(1).expect("pos"))
    };

    let insert = |key: &str, seq: u32, topic: &str| {
        format!(
            "INSERT INTO fixture_outbox (message_id, message_type, biz_key, topic, payload, \
             headers, created_at) VALUES ('m-{key}-{seq}', 'order.created', '{key}-{seq}', {topic}, \
             '{{\"total\": 12.5}}', '{{\"trace\": \"abc\", \"n\": 1}}', \
             '2026-05-09 07:30:00.123456')"
        )
    };
    // 1. Two outbox rows in one transaction, the second with a topic.
    sql.query_drop(format!(
        "START TRANSACTION; {}; {}; COMMIT",
        insert("order", 1, "NULL"),
        insert("order", 2, "'orders.special'")
    ))
    .await
    .expect("tx 1");
    // 2. Another table only.
    sql.query_drop("INSERT INTO fixture_other VALUES (1, 'x')")
        .await
        .expect("tx 2");
    // 3. A status write-back (UPDATE rows of the outbox: never events).
    sql.query_drop("UPDATE fixture_outbox SET status = 'SUCCESS' WHERE id = 1")
        .await
        .expect("tx 3");
    // 4. DDL on the outbox, then an insert with the new shape.
    sql.query_drop("ALTER TABLE fixture_outbox ADD COLUMN tenant VARCHAR(32) NULL AFTER id")
        .await
        .expect("ddl");
    sql.query_drop(
        insert("order", 3, "NULL")
            .replace("(message_id,", "(tenant, message_id,")
            .replace("VALUES ('m-", "VALUES ('t1', 'm-"),
    )
    .await
    .expect("tx 4");
    // 5. A non-transactional table in a rolled-back transaction: logged with ROLLBACK.
    sql.query_drop("CREATE TABLE fixture_myisam (id INT) ENGINE = MyISAM")
        .await
        .expect("myisam");
    sql.query_drop(format!(
        "START TRANSACTION; {}; INSERT INTO fixture_myisam VALUES (1); ROLLBACK",
        insert("ghost", 1, "NULL")
    ))
    .await
    .expect("tx 5");

    let mut conn = f.sql().await;
    conn.query_drop("SET @mariadb_slave_capability = 4")
        .await
        .expect("capability");
    let request = BinlogStreamRequest::new(4_000_001)
        .with_filename(file.as_bytes())
        .with_pos(pos)
        .with_non_blocking();
    let mut stream = conn
        .get_binlog_stream(request)
        .await
        .expect("binlog stream");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Captured from {} by tests/capture.rs, starting at {file}:{pos}.\n\
         # One binlog event per line (header, body, CRC32), after a comment with its type,\n\
         # end position and checksum check.",
        server_version(&mut sql).await
    );
    while let Ok(Some(event)) = tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
        let event = event.expect("event");
        let mut bytes = Vec::new();
        event
            .write(BinlogVersion::Version4, &mut bytes)
            .expect("serialise");
        let checksum_ok = event.checksum().map(|c| {
            let alg = event.footer().get_checksum_alg().ok().flatten();
            alg.map(|a| u32::from_le_bytes(c) == event.calc_checksum(a))
        });
        let header = event.header();
        let _ = writeln!(
            out,
            "# type {} end {} checksum {:?}",
            header.event_type_raw(),
            header.log_pos(),
            checksum_ok.flatten()
        );
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let _ = writeln!(out, "{hex}");
    }
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/log/testdata/mariadb_outbox.hex"
    );
    std::fs::write(path, out).expect("write fixture");
    println!("wrote {path}");
    let _ = sql
        .query_drop("DROP TABLE IF EXISTS fixture_outbox, fixture_other, fixture_myisam")
        .await;
}

async fn server_version(conn: &mut mysql_async::Conn) -> String {
    conn.query_first::<String, _>("SELECT VERSION()")
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}
