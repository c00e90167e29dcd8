//! End-to-end: Debezium's outbox table on MariaDB (`outbox.layout = "debezium"`, rows the
//! application deletes in the transaction that inserts them) → binlog → outboxd → Kafka,
//! routed as Debezium's Event Router routes (`outbox.event.<aggregatetype>`), on the real
//! servers started by `scripts/services`, through the real `outboxd` binary.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use common::mysql::MysqlPipeline;
use common::{consume_all, topic_exists, wait_for, Record};
use mysql_async::prelude::Queryable;

/// The `tracingspancontext` of the traced row, as Debezium's Java properties text.
const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// One row of Debezium's outbox that a test writes.
#[derive(Debug)]
struct DbzRow {
    id: String,
    aggregatetype: String,
    aggregateid: String,
    kind: String,
    payload: String,
    tracing: Option<String>,
}

impl DbzRow {
    /// Row number `seq` (its commit order) of key `aggregateid`, routed by `aggregatetype`.
    fn new(aggregatetype: &str, aggregateid: &str, seq: u32) -> Self {
        Self {
            id: uuid(),
            aggregatetype: aggregatetype.to_owned(),
            aggregateid: aggregateid.to_owned(),
            kind: format!("OrderStep{seq}"),
            payload: format!("{{\"key\": \"{aggregateid}\", \"seq\": {seq}}}"),
            tracing: None,
        }
    }

    fn insert_sql(&self, table: &str) -> String {
        let tracing = self
            .tracing
            .as_ref()
            .map_or_else(|| "NULL".to_owned(), |t| format!("'{t}'"));
        format!(
            "INSERT INTO `{table}` (id, aggregatetype, aggregateid, type, payload, \
             tracingspancontext) VALUES ('{}', '{}', '{}', '{}', '{}', {tracing})",
            self.id, self.aggregatetype, self.aggregateid, self.kind, self.payload
        )
    }

    fn delete_sql(&self, table: &str) -> String {
        format!("DELETE FROM `{table}` WHERE id = '{}'", self.id)
    }
}

/// A random (version 4) uuid in its 36-character text form.
fn uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// How a transaction deletes what it inserted.
#[derive(Clone, Copy)]
enum Deletes {
    /// Each row right after its insert.
    EachAfterItsInsert,
    /// Every row at the end, in one statement.
    AllAtTheEnd,
}

/// Inserts `rows` and deletes them again in one transaction, and commits it: the
/// application's side of Debezium's outbox pattern.
async fn commit_and_delete(
    conn: &mut mysql_async::Conn,
    table: &str,
    rows: &[DbzRow],
    how: Deletes,
) {
    let mut sql = String::from("START TRANSACTION;");
    for row in rows {
        sql.push_str(&row.insert_sql(table));
        sql.push(';');
        if let Deletes::EachAfterItsInsert = how {
            sql.push_str(&row.delete_sql(table));
            sql.push(';');
        }
    }
    if let Deletes::AllAtTheEnd = how {
        let ids: Vec<String> = rows.iter().map(|r| format!("'{}'", r.id)).collect();
        sql.push_str(&format!(
            "DELETE FROM `{table}` WHERE id IN ({});",
            ids.join(", ")
        ));
    }
    sql.push_str("COMMIT");
    conn.query_drop(sql)
        .await
        .expect("insert-and-delete transaction");
}

/// Rewrites the pipeline's config for Debezium's table: `layout = "debezium"` (rows
/// `deleted` by default), no `topic_template` (so Debezium's `outbox.event.{routing}`
/// applies), and `kafka_extra` lines added to `[kafka]`.
fn debezium_config(p: &MysqlPipeline, kafka_extra: &str) {
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let template = format!("topic_template = \"{}\"\n", p.topic);
    assert!(
        config.contains(&template),
        "the template line in:\n{config}"
    );
    let config = config.replace(&template, "").replace(
        "checkpoint_table = \"outboxd_checkpoint\"\n",
        "checkpoint_table = \"outboxd_checkpoint\"\nlayout = \"debezium\"\n",
    );
    let config = config.replace(
        "message_timeout = \"10s\"\n",
        &format!("message_timeout = \"10s\"\n{kafka_extra}"),
    );
    assert!(
        config.contains("layout = \"debezium\"") && !config.contains("topic_template"),
        "{config}"
    );
    std::fs::write(&p.config_path, config).expect("write config");
}

/// Creates Debezium's outbox table (the application's, made before `outboxd init`) under
/// the pipeline's table name, with `id` of type `id_type` and `payload` of `payload_type`.
async fn create_debezium_table(p: &MysqlPipeline, id_type: &str, payload_type: &str) {
    let sql = format!(
        "CREATE TABLE `{}` (\
           id {id_type} NOT NULL, \
           aggregatetype VARCHAR(255) NOT NULL, \
           aggregateid VARCHAR(255) NOT NULL, \
           type VARCHAR(255) NOT NULL, \
           payload {payload_type}, \
           tracingspancontext VARCHAR(256) NULL, \
           PRIMARY KEY (id))",
        p.table
    );
    p.sql().await.query_drop(&sql).await.expect(&sql);
}

/// `outboxd init` (as the admin, then the runtime grants), which must leave the
/// application's table as it is.
fn init_keeping_the_table(p: &MysqlPipeline) {
    let out = p.outboxd(&["init"]);
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "outboxd init failed:\n{said}");
    assert!(
        !said.contains(&format!("created table {}", p.table)),
        "init creates no outbox table with rows = \"deleted\":\n{said}"
    );
}

async fn outbox_row_count(p: &MysqlPipeline) -> i64 {
    let mut conn = p.sql().await;
    let count: Option<i64> = conn
        .query_first(format!("SELECT COUNT(*) FROM `{}`", p.table))
        .await
        .expect("count outbox rows");
    let _ = conn.disconnect().await;
    count.unwrap_or_default()
}

/// `(file, offset)` of a checkpoint `binlog:<file>:<offset>[:<gtid>][;…]`.
fn binlog_position(checkpoint: &str) -> (String, u64) {
    let position = checkpoint
        .strip_prefix("binlog:")
        .unwrap_or_else(|| panic!("a binlog checkpoint: {checkpoint}"));
    let position = position.split(';').next().unwrap_or_default();
    let mut parts = position.split(':');
    let file = parts.next().unwrap_or_default().to_owned();
    let offset = parts
        .next()
        .and_then(|o| o.parse().ok())
        .unwrap_or_else(|| panic!("an offset in the checkpoint {checkpoint}"));
    (file, offset)
}

/// The server's current binlog `(file, offset)`.
async fn master_position(p: &MysqlPipeline) -> (String, u64) {
    let mut conn = p.sql().await;
    let row: mysql_async::Row = conn
        .query_first("SHOW MASTER STATUS")
        .await
        .expect("master status")
        .expect("the binlog is on");
    let _ = conn.disconnect().await;
    (row.get(0).expect("file"), row.get(1).expect("offset"))
}

/// The records of `topic` (one partition each of `partitions`) keyed by their `id` header.
fn by_id(records: &[Record]) -> HashMap<String, Vec<&Record>> {
    let mut by_id: HashMap<String, Vec<&Record>> = HashMap::new();
    for r in records {
        let id = r.headers.get("id").cloned().unwrap_or_default();
        by_id.entry(id).or_default().push(r);
    }
    by_id
}

/// Rows inserted and deleted in one transaction while `outboxd run` runs all reach
/// `outbox.event.<aggregatetype>`, each once, in per-key commit order, read as Debezium's
/// Event Router reads them (key = aggregateid, headers `id`, `message_id`, `message_type`,
/// value = payload, `tracingspancontext` as `traceparent`). The table stays empty, the
/// checkpoint row still moves past the rows, and `outboxd status` refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_debezium_rows_reach_the_event_router_topic_in_key_order() {
    let p = MysqlPipeline::new("dbz", 3, "").await;
    debezium_config(&p, "");
    let aggregatetype = format!("order_{}", p.name);
    let topic = format!("outbox.event.{aggregatetype}");
    p.create_topic(&topic, 3).await;
    create_debezium_table(&p, "CHAR(36)", "JSON").await;
    init_keeping_the_table(&p);
    let initial = p
        .checkpoint()
        .await
        .expect("init records the starting binlog position");

    let mut daemon = p.spawn_run("run.log");
    let keys = ["order-1", "order-2", "order-3"];
    let mut committed: Vec<DbzRow> = Vec::new();
    let mut conn = p.sql().await;
    let mut seq = 0;
    let mut last_start = binlog_position(&initial);
    for txn in 0..6 {
        let mut rows = Vec::new();
        // Five transactions of four rows, and the traced row alone in the fourth.
        let count = if txn == 3 { 1 } else { 4 };
        for _ in 0..count {
            seq += 1;
            let mut row = DbzRow::new(&aggregatetype, keys[seq as usize % keys.len()], seq);
            if txn == 3 {
                row.tracing = Some(format!("traceparent={TRACEPARENT}"));
            }
            rows.push(row);
        }
        let how = if txn % 2 == 0 {
            Deletes::EachAfterItsInsert
        } else {
            Deletes::AllAtTheEnd
        };
        last_start = master_position(&p).await;
        commit_and_delete(&mut conn, &p.table, &rows, how).await;
        committed.extend(rows);
    }
    let _ = conn.disconnect().await;
    assert_eq!(committed.len(), 21);

    let records = consume_all(
        p.services.kafka.as_str(),
        &topic,
        3,
        committed.len(),
        Duration::from_secs(60),
    );
    assert!(
        daemon.is_running(),
        "run keeps running:\n{}",
        daemon.log_text()
    );
    let ids = by_id(&records);
    assert_eq!(
        records.len(),
        committed.len(),
        "every row once, nothing else:\n{records:#?}\n{}",
        daemon.log_text()
    );
    for row in &committed {
        let found = ids.get(&row.id).map(Vec::as_slice).unwrap_or_default();
        assert_eq!(found.len(), 1, "row {} once: {found:#?}", row.id);
        let r = found[0];
        assert_eq!(r.key, row.aggregateid, "key = aggregateid: {r:#?}");
        assert_eq!(r.payload, row.payload, "value = payload: {r:#?}");
        assert_eq!(r.headers.get("message_id"), Some(&row.id), "{r:#?}");
        assert_eq!(r.headers.get("message_type"), Some(&row.kind), "{r:#?}");
        assert_eq!(r.headers.get("biz_key"), Some(&row.aggregateid), "{r:#?}");
        match &row.tracing {
            Some(_) => assert_eq!(
                r.headers.get("traceparent").map(String::as_str),
                Some(TRACEPARENT),
                "the traced row's traceparent: {r:#?}"
            ),
            None => assert!(
                !r.headers.contains_key("traceparent"),
                "no traceparent on an untraced row: {r:#?}"
            ),
        }
    }

    // Per key, partition-offset order is commit order.
    let mut sorted: Vec<&Record> = records.iter().collect();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut partition_of: HashMap<String, i32> = HashMap::new();
    for r in sorted {
        seen.entry(r.key.clone())
            .or_default()
            .push(r.headers["id"].clone());
        let partition = *partition_of.entry(r.key.clone()).or_insert(r.partition);
        assert_eq!(partition, r.partition, "one partition per key: {r:#?}");
    }
    let mut expected: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for row in &committed {
        expected
            .entry(row.aggregateid.clone())
            .or_default()
            .push(row.id.clone());
    }
    assert_eq!(seen, expected, "each key's records in commit order");

    // The application deleted every row; outboxd wrote nothing to the outbox, and its
    // checkpoint row still moved past the last transaction.
    assert_eq!(outbox_row_count(&p).await, 0, "the outbox is empty");
    let initial_position = binlog_position(&initial);
    let moved = wait_for(
        "the checkpoint past the last transaction",
        Duration::from_secs(30),
        || async {
            let now = p.checkpoint().await?;
            let position = binlog_position(&now);
            (position > last_start).then_some(now)
        },
    )
    .await;
    assert!(
        binlog_position(&moved) > initial_position,
        "{moved} is past {initial}"
    );

    let status = p.outboxd(&["status"]);
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&status.stdout),
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(!status.status.success(), "status refuses:\n{said}");
    assert!(said.contains("outbox.rows = \"deleted\""), "{said}");

    assert!(
        daemon.terminate().success(),
        "a graceful stop:\n{}",
        daemon.log_text()
    );
    p.cleanup().await;
}

/// With `kafka.allowed_topics`, a row whose aggregatetype routes elsewhere cannot be
/// published and has no row to mark: `outboxd run` stops by itself, non-zero, before it
/// (the rows committed before it were delivered, none after it, no topic created), and
/// stops there again when started again: it never skips.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_routed_outside_the_allowed_topics_stops_the_relay_before_it() {
    let p = MysqlPipeline::new("dbzallow", 1, "").await;
    let allowed = format!("order_{}", p.name);
    let forbidden = format!("audit_{}", p.name);
    let allowed_topic = format!("outbox.event.{allowed}");
    let forbidden_topic = format!("outbox.event.{forbidden}");
    debezium_config(&p, &format!("allowed_topics = [\"{allowed_topic}\"]\n"));
    p.create_topic(&allowed_topic, 1).await;
    create_debezium_table(&p, "VARCHAR(36)", "LONGTEXT").await;
    init_keeping_the_table(&p);

    let mut daemon = p.spawn_run("run-1.log");
    let mut conn = p.sql().await;
    let before: Vec<DbzRow> = (1..=3)
        .map(|seq| DbzRow::new(&allowed, "order-1", seq))
        .collect();
    commit_and_delete(
        &mut conn,
        &p.table,
        &before[..2],
        Deletes::EachAfterItsInsert,
    )
    .await;
    commit_and_delete(&mut conn, &p.table, &before[2..], Deletes::AllAtTheEnd).await;
    let refused = DbzRow::new(&forbidden, "order-1", 4);
    commit_and_delete(
        &mut conn,
        &p.table,
        std::slice::from_ref(&refused),
        Deletes::AllAtTheEnd,
    )
    .await;
    let after = DbzRow::new(&allowed, "order-1", 5);
    commit_and_delete(
        &mut conn,
        &p.table,
        std::slice::from_ref(&after),
        Deletes::AllAtTheEnd,
    )
    .await;
    let _ = conn.disconnect().await;

    let status = daemon
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("outboxd run keeps running:\n{}", daemon.log_text()));
    let log = daemon.log_text();
    assert!(!status.success(), "run exits non-zero: {status}\n{log}");
    assert!(log.contains("cannot be published"), "{log}");
    assert!(
        log.contains(&refused.id),
        "the log names the refused row {}:\n{log}",
        refused.id
    );

    let records = consume_all(
        p.services.kafka.as_str(),
        &allowed_topic,
        1,
        before.len(),
        Duration::from_secs(30),
    );
    let ids = by_id(&records);
    for row in &before {
        assert_eq!(
            ids.get(&row.id).map(Vec::len),
            Some(1),
            "row {} committed before the refused one was delivered once:\n{records:#?}\n{log}",
            row.id
        );
    }
    assert!(
        !ids.contains_key(&after.id),
        "nothing after the refused row was sent: {records:#?}"
    );
    assert!(
        !topic_exists(p.services.kafka.as_str(), &forbidden_topic),
        "no topic was created for the refused row"
    );

    // Started again, it stops at the same row: the position never passed it.
    let mut again = p.spawn_run("run-2.log");
    let status = again
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("outboxd run keeps running:\n{}", again.log_text()));
    let log = again.log_text();
    assert!(
        !status.success(),
        "run exits non-zero again: {status}\n{log}"
    );
    assert!(
        log.contains("cannot be published") && log.contains(&refused.id),
        "{log}"
    );
    let records = consume_all(
        p.services.kafka.as_str(),
        &allowed_topic,
        1,
        before.len(),
        Duration::from_secs(10),
    );
    assert!(
        !by_id(&records).contains_key(&after.id),
        "still nothing after the refused row: {records:#?}"
    );
    p.cleanup().await;
}

/// Several outbox tables in one pipeline (a table per bounded context): one binlog stream
/// reads both, `{table}` routes each row to its table's topic, a transaction that writes
/// both is relayed whole, and a restart sends nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_outbox_tables_in_one_pipeline_each_row_to_its_tables_topic() {
    let p = MysqlPipeline::new("dbztables", 1, "").await;
    debezium_config(&p, "");
    let second = format!("{}_b", p.table);
    let tables = [p.table.clone(), second.clone()];
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let config = config
        .replacen(
            &format!("table = \"{}\"\n", p.table),
            &format!("tables = [\"{}\", \"{second}\"]\n", p.table),
            1,
        )
        .replacen(
            "message_timeout = \"10s\"\n",
            "message_timeout = \"10s\"\ntopic_template = \"{table}.{routing}\"\n",
            1,
        );
    assert!(config.contains("tables = ["), "{config}");
    std::fs::write(&p.config_path, config).expect("write config");
    create_debezium_table(&p, "CHAR(36)", "JSON").await;
    let mut conn = p.sql().await;
    let like = format!("CREATE TABLE `{second}` LIKE `{}`", p.table);
    conn.query_drop(&like).await.expect(&like);
    let grant = format!(
        "GRANT SELECT ON `{second}` TO '{}'@'%'",
        p.services.run_user
    );
    conn.query_drop(&grant).await.expect(&grant);
    let aggregatetype = format!("order_{}", p.name);
    let topics: Vec<String> = tables
        .iter()
        .map(|t| format!("{t}.{aggregatetype}"))
        .collect();
    for topic in &topics {
        p.create_topic(topic, 1).await;
    }
    init_keeping_the_table(&p);
    let check = p.outboxd(&["check"]);
    assert!(
        check.status.success(),
        "outboxd check with two outbox tables:\n{}\n{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    // One transaction per step: rows of one table, of the other, or of both.
    let mut sent: Vec<(usize, String)> = Vec::new();
    let step = |seq: u32, sent: &mut Vec<(usize, String)>| {
        let rows: Vec<(usize, DbzRow)> = match seq % 3 {
            0 => vec![(0, seq), (1, seq)],
            1 => vec![(0, seq)],
            _ => vec![(1, seq)],
        }
        .into_iter()
        .map(|(t, s)| (t, DbzRow::new(&aggregatetype, "k", s)))
        .collect();
        let mut sql = String::from("START TRANSACTION;");
        for (t, row) in &rows {
            sql.push_str(&format!(
                "{};{};",
                row.insert_sql(&tables[*t]),
                row.delete_sql(&tables[*t])
            ));
            sent.push((*t, row.id.clone()));
        }
        sql + "COMMIT"
    };
    let ids_on = |topic: &str, expected: usize| -> Vec<String> {
        consume_all(
            p.services.kafka.as_str(),
            topic,
            1,
            expected,
            Duration::from_secs(60),
        )
        .iter()
        .map(|r| r.headers.get("id").cloned().unwrap_or_default())
        .collect()
    };
    let mut daemon = p.spawn_run("run.log");
    for seq in 1..=6 {
        let sql = step(seq, &mut sent);
        conn.query_drop(&sql).await.expect(&sql);
    }
    let of = |table: usize, sent: &[(usize, String)]| -> Vec<String> {
        (sent.iter().filter(|(t, _)| *t == table))
            .map(|(_, id)| id.clone())
            .collect()
    };
    for (table, topic) in topics.iter().enumerate() {
        let want = of(table, &sent);
        assert_eq!(
            ids_on(topic, want.len()),
            want,
            "table {table}'s rows on {topic}: each once, in commit order\n{}",
            daemon.log_text()
        );
    }

    // A graceful restart: what was sent is not sent again, what comes after is.
    assert!(daemon.terminate().success(), "{}", daemon.log_text());
    let sql = step(3, &mut sent);
    conn.query_drop(&sql).await.expect(&sql);
    let mut daemon = p.spawn_run("run2.log");
    for (table, topic) in topics.iter().enumerate() {
        let want = of(table, &sent);
        assert_eq!(
            ids_on(topic, want.len()),
            want,
            "after the restart, table {table}: the new row once, no other again"
        );
    }
    assert!(daemon.terminate().success(), "{}", daemon.log_text());
    let _ = conn
        .query_drop(format!(
            "REVOKE ALL PRIVILEGES ON `{second}` FROM '{}'@'%'",
            p.services.run_user
        ))
        .await;
    let _ = conn
        .query_drop(format!("DROP TABLE IF EXISTS `{second}`"))
        .await;
    let _ = conn.disconnect().await;
    p.cleanup().await;
}

/// Issue 13, "`init` adds the state-machine columns to such a table when asked", on
/// MariaDB: kept rows on Debezium's own table. `init` names what is missing;
/// `init --add-columns` adds an auto-increment row id and the status columns, the row
/// already there becoming SUCCESS (not sent); then rows are published from the binlog with
/// the Event Router's conventions and their status and offset written back, and the
/// operator's `retry` and the retry worker address a row by the added id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debezium_table_keeps_its_rows_once_init_adds_the_status_columns() {
    let p = MysqlPipeline::new("dbzkept", 1, "").await;
    debezium_config(&p, "");
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let config = config.replace(
        "layout = \"debezium\"\n",
        "layout = \"debezium\"\nrows = \"kept\"\n",
    );
    std::fs::write(&p.config_path, config).expect("write config");
    let aggregatetype = format!("order_{}", p.name);
    let topic = format!("outbox.event.{aggregatetype}");
    p.create_topic(&topic, 1).await;
    create_debezium_table(&p, "CHAR(36)", "JSON").await;
    let mut conn = p.sql().await;
    // A row from before the switch, kept by the application: not to be sent again.
    let old = DbzRow::new(&aggregatetype, "k-old", 0);
    conn.query_drop(old.insert_sql(&p.table))
        .await
        .expect("old row");

    let text = |out: &std::process::Output| {
        format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let init = p.outboxd(&["init"]);
    assert!(!init.status.success(), "init without --add-columns");
    assert!(
        text(&init).contains("lacks column(s) outboxd_seq, status")
            && text(&init).contains("--add-columns"),
        "{}",
        text(&init)
    );
    let schema = text(&p.outboxd(&["schema"]));
    assert!(
        schema.contains("ADD COLUMN `outboxd_seq` BIGINT NOT NULL AUTO_INCREMENT"),
        "{schema}"
    );
    let init = p.outboxd(&["init", "--add-columns"]);
    assert!(init.status.success(), "{}", text(&init));
    assert!(
        text(&init).contains("added column(s) outboxd_seq, status"),
        "{}",
        text(&init)
    );
    let check = p.outboxd(&["check"]);
    assert!(check.status.success(), "{}", text(&check));
    let again = p.outboxd(&["init", "--add-columns"]);
    assert!(
        text(&again).contains("has every column outboxd writes"),
        "{}",
        text(&again)
    );
    let status_of = |id: &str| format!("SELECT status FROM `{}` WHERE id = '{id}'", p.table);
    let old_status: Option<String> = conn.query_first(status_of(&old.id)).await.expect("old");
    assert_eq!(
        old_status.as_deref(),
        Some("SUCCESS"),
        "a row from before is not sent"
    );

    let daemon = p.spawn_run("run.log");
    let mut sent: Vec<DbzRow> = Vec::new();
    for seq in 1..=6 {
        let row = DbzRow::new(&aggregatetype, &format!("k{}", seq % 2), seq);
        conn.query_drop(row.insert_sql(&p.table))
            .await
            .expect("insert");
        sent.push(row);
    }
    // A parked row, inserted so (the log path leaves rows not inserted as INIT alone),
    // made due by the operator by its added id: the retry worker claims and sends it.
    let parked = DbzRow::new(&aggregatetype, "k-parked", 7);
    conn.query_drop(format!(
        "{}; UPDATE `{}` SET status = 'MANUAL_REQUIRED', next_retry_time = NOW(6) \
         WHERE id = '{}'",
        parked.insert_sql(&p.table),
        p.table,
        parked.id
    ))
    .await
    .expect("parked row");
    let seq_id: Option<i64> = conn
        .query_first(format!(
            "SELECT outboxd_seq FROM `{}` WHERE id = '{}'",
            p.table, parked.id
        ))
        .await
        .expect("added id");
    let seq_id = seq_id.expect("the row has an id").to_string();
    let retry = p.outboxd(&["retry", "--id", &seq_id]);
    assert!(retry.status.success(), "{}", text(&retry));
    sent.push(parked);

    let records = consume_all(
        &p.services.kafka,
        &topic,
        1,
        sent.len(),
        Duration::from_secs(60),
    );
    let seen = by_id(&records);
    assert!(!seen.contains_key(&old.id), "the row from before was sent");
    for row in &sent {
        let copies = seen
            .get(&row.id)
            .unwrap_or_else(|| panic!("row {} was not sent: {}", row.id, daemon.log_text()));
        assert_eq!(
            copies.len(),
            1,
            "row {} sent {} times",
            row.id,
            copies.len()
        );
        assert_eq!(
            copies[0].key, row.aggregateid,
            "the record key is aggregateid"
        );
        assert_eq!(
            copies[0].headers.get("message_type"),
            Some(&row.kind),
            "the row's type"
        );
    }
    assert_eq!(records.len(), sent.len(), "nothing else on {topic}");
    for key in ["k0", "k1"] {
        let seqs: Vec<&str> = records
            .iter()
            .filter(|r| r.key == key)
            .map(|r| r.payload.as_str())
            .collect();
        let mut sorted = seqs.clone();
        sorted.sort();
        assert_eq!(seqs.len(), 3, "{key}");
        assert_eq!(seqs, sorted, "key {key} in commit order");
    }

    // Every row's status and offset written back in its own table.
    let offsets: BTreeMap<String, i64> = records
        .iter()
        .map(|r| (r.headers["id"].clone(), r.offset))
        .collect();
    let table = p.table.clone();
    let old_id = old.id.clone();
    let rows: Vec<(String, String, Option<i64>)> = wait_for(
        "every sent row SUCCESS with its offset",
        Duration::from_secs(30),
        || {
            let (table, old_id) = (table.clone(), old_id.clone());
            let conn = p.sql();
            async move {
                let rows: Vec<(String, String, Option<i64>)> = conn
                    .await
                    .query(format!(
                        "SELECT id, status, kafka_offset FROM `{table}` WHERE id <> '{old_id}'"
                    ))
                    .await
                    .expect("rows");
                let done = rows.len() == 7 && rows.iter().all(|r| r.1 == "SUCCESS");
                done.then_some(rows)
            }
        },
    )
    .await;
    for (id, _, offset) in &rows {
        assert_eq!(
            *offset,
            offsets.get(id).copied(),
            "row {id}'s offset is its record's"
        );
    }
    let status = p.outboxd(&["status"]);
    assert!(status.status.success(), "{}", text(&status));

    drop(daemon);
    let _ = conn.disconnect().await;
    p.cleanup().await;
}
