//! Issue 13, "Debezium outbox drop-in and migration", on PostgreSQL and Kafka: Debezium's
//! outbox table read unchanged (`outbox.layout = "debezium"`), rows inserted and deleted
//! in one transaction (`outbox.rows = "deleted"`: nothing is written back, the position
//! still moves), records shaped as Debezium's Event Router shapes them, and outboxd taking
//! over the replication slot Debezium used, going on from its confirmed position: nothing
//! Debezium had confirmed is sent again, nothing after it is missed.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::postgres::TestPipeline;
use common::{consume_all, create_topic_with, run_outboxd, wait_for, Record};

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// Drops Debezium's slot when a test fails before its own cleanup: a slot left behind
/// holds the server's WAL for good.
struct SlotGuard {
    conn: String,
    slot: String,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let (conn, slot) = (self.conn.clone(), self.slot.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                if let Ok((sql, connection)) =
                    tokio_postgres::connect(&conn, tokio_postgres::NoTls).await
                {
                    tokio::spawn(connection);
                    drop_slot(&sql, &slot).await;
                }
            });
        })
        .join();
    }
}

/// A pipeline over Debezium's outbox table `p.table`, reading through the slot `slot`
/// (created here as Debezium would have created it), with `kafka_extra` added to `[kafka]`.
async fn debezium_pipeline(
    prefix: &str,
    kafka_extra: &str,
) -> (TestPipeline, String, String, SlotGuard) {
    let p = TestPipeline::new(prefix, 1, "").await;
    let slot = format!("debezium_{}", p.name);
    let aggregate = format!("order_{}", p.name);
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let config = config
        .replacen(
            "kind = \"postgres\"",
            &format!("kind = \"postgres\"\nslot = \"{slot}\""),
            1,
        )
        .replacen(
            &format!("table = \"{}\"", p.table),
            &format!("table = \"{}\"\nlayout = \"debezium\"", p.table),
            1,
        )
        // Debezium's routing, `outbox.event.{routing}`, is the layout's default.
        .replacen(
            &format!("topic_template = \"{}\"\n", p.topic),
            kafka_extra,
            1,
        );
    std::fs::write(&p.config_path, config).expect("write config");

    let sql = p.sql().await;
    sql.batch_execute(&format!(
        "CREATE TABLE \"{table}\" (
             id uuid NOT NULL PRIMARY KEY,
             aggregatetype varchar(255) NOT NULL,
             aggregateid varchar(255) NOT NULL,
             type varchar(255) NOT NULL,
             payload jsonb,
             tracingspancontext varchar(256)
         )",
        table = p.table
    ))
    .await
    .expect("Debezium's table");
    // A publication is created by the table's owner: here `init`'s role, as an
    // application's migration would grant it.
    sql.batch_execute(&format!(
        "ALTER TABLE \"{}\" OWNER TO \"{}\"",
        p.table, p.services.admin_user
    ))
    .await
    .expect("owner");
    // A statement of its own: a slot cannot be created in a transaction that wrote.
    sql.execute(
        "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
        &[&slot],
    )
    .await
    .expect("Debezium's slot");
    let guard = SlotGuard {
        conn: p.services.pg_conn_string(),
        slot: slot.clone(),
    };
    create_topic_with(
        &p.services.kafka,
        &format!("outbox.event.{aggregate}"),
        1,
        &[],
    )
    .await;
    (p, slot, aggregate, guard)
}

/// Inserts one Debezium outbox row and deletes it in the same transaction, as Debezium
/// recommends; returns its id.
async fn emit(
    sql: &mut tokio_postgres::Client,
    table: &str,
    aggregate: &str,
    key: &str,
    seq: u32,
    trace: Option<&str>,
) -> String {
    let id: String = sql
        .query_one("SELECT gen_random_uuid()::text", &[])
        .await
        .expect("uuid")
        .get(0);
    let tx = sql.transaction().await.expect("begin");
    tx.execute(
        &format!(
            "INSERT INTO \"{table}\" (id, aggregatetype, aggregateid, type, payload, \
             tracingspancontext) VALUES ($1::text::uuid, $2, $3, $4, $5::text::jsonb, $6)"
        ),
        &[
            &id,
            &aggregate,
            &key,
            &"OrderCreated",
            &format!(r#"{{"key": "{key}", "seq": {seq}}}"#),
            &trace.map(|t| format!("#Thu Dec 03 20:00:00 UTC 2026\ntraceparent={t}\n")),
        ],
    )
    .await
    .expect("insert");
    tx.execute(
        &format!("DELETE FROM \"{table}\" WHERE id = $1::text::uuid"),
        &[&id],
    )
    .await
    .expect("delete");
    tx.commit().await.expect("commit");
    id
}

async fn confirmed_lsn(sql: &tokio_postgres::Client, slot: &str) -> String {
    sql.query_one(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
        &[&slot],
    )
    .await
    .expect("slot")
    .get(0)
}

/// Whether the slot is confirmed at or past `lsn`.
async fn confirmed_past(sql: &tokio_postgres::Client, slot: &str, lsn: &str) -> bool {
    sql.query_one(
        "SELECT confirmed_flush_lsn >= $2::text::pg_lsn FROM pg_replication_slots \
         WHERE slot_name = $1",
        &[&slot, &lsn],
    )
    .await
    .expect("slot")
    .get(0)
}

async fn current_lsn(sql: &tokio_postgres::Client) -> String {
    sql.query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("lsn")
        .get(0)
}

async fn drop_slot(sql: &tokio_postgres::Client, slot: &str) {
    for _ in 0..50 {
        let _ = sql
            .execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND active_pid IS NOT NULL",
                &[&slot],
            )
            .await;
        let _ = sql
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND NOT active",
                &[&slot],
            )
            .await;
        let left: i64 = sql
            .query_one(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .expect("slots")
            .get(0);
        if left == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn by_id(records: &[Record]) -> BTreeMap<String, Vec<&Record>> {
    let mut map: BTreeMap<String, Vec<&Record>> = BTreeMap::new();
    for r in records {
        map.entry(r.headers.get("id").cloned().unwrap_or_default())
            .or_default()
            .push(r);
    }
    map
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debezium_outbox_and_slot_are_taken_over_with_nothing_lost_or_sent_twice() {
    let (p, slot, aggregate, _guard) = debezium_pipeline("dbz", "").await;
    let topic = format!("outbox.event.{aggregate}");
    let mut sql = p.sql().await;
    p.init();

    // What Debezium relayed and confirmed before the switch: not to be sent again.
    let mut before = Vec::new();
    for seq in 1..=5 {
        before.push(emit(&mut sql, &p.table, &aggregate, "k-before", seq, None).await);
    }
    sql.execute(
        "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())",
        &[&slot],
    )
    .await
    .expect("advance the slot as Debezium's confirmations would");
    // Committed after Debezium stopped, before outboxd starts: to be sent.
    let mut after = Vec::new();
    for seq in 1..=5 {
        let key = format!("k{}", seq % 2);
        let trace = (seq == 3).then_some(TRACEPARENT);
        after.push((
            key.clone(),
            emit(&mut sql, &p.table, &aggregate, &key, seq, trace).await,
        ));
    }

    let check = run_outboxd(&p.config_path, &["check"]);
    assert!(
        check.status.success(),
        "outboxd check on Debezium's table:\n{}\n{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let daemon = p.spawn_run("run.log");
    // And while it runs.
    for seq in 6..=10 {
        let key = format!("k{}", seq % 2);
        after.push((
            key.clone(),
            emit(&mut sql, &p.table, &aggregate, &key, seq, None).await,
        ));
    }
    let end = current_lsn(&sql).await;

    let records = consume_all(
        &p.services.kafka,
        &topic,
        1,
        after.len(),
        Duration::from_secs(60),
    );
    let seen = by_id(&records);
    for id in &before {
        assert!(
            !seen.contains_key(id),
            "a row Debezium had confirmed was sent again: {id}"
        );
    }
    for (key, id) in &after {
        let copies = seen
            .get(id)
            .unwrap_or_else(|| panic!("row {id} was not sent"));
        assert_eq!(copies.len(), 1, "row {id} sent {} times", copies.len());
        let r = copies[0];
        assert_eq!(&r.key, key, "the record key is aggregateid");
        assert_eq!(r.headers.get("message_id"), Some(id));
        assert_eq!(
            r.headers.get("message_type").map(String::as_str),
            Some("OrderCreated")
        );
        assert!(
            r.payload.contains(&format!(r#""key": "{key}""#)),
            "{}",
            r.payload
        );
    }
    assert_eq!(records.len(), after.len(), "nothing else on {topic}");
    // Per-key order: each key's seqs arrive as committed.
    for key in ["k0", "k1"] {
        let seqs: Vec<&str> = records
            .iter()
            .filter(|r| r.key == key)
            .map(|r| r.payload.as_str())
            .collect();
        let mut sorted = seqs.clone();
        sorted.sort_by_key(|p| {
            let digits: String = p.chars().filter(char::is_ascii_digit).collect();
            digits.parse::<u64>().unwrap_or(0)
        });
        assert_eq!(seqs, sorted, "key {key} in commit order");
    }
    let traced = &seen[&after[2].1][0];
    assert_eq!(
        traced.headers.get("traceparent").map(String::as_str),
        Some(TRACEPARENT),
        "the trace context of tracingspancontext"
    );
    assert!(
        records
            .iter()
            .filter(|r| r.headers.contains_key("traceparent"))
            .count()
            == 1,
        "rows without a span context carry none"
    );

    // Nothing to write back, yet the slot is confirmed past the last transaction.
    wait_for(
        "the slot confirmed past the last row",
        Duration::from_secs(30),
        || async { confirmed_past(&sql, &slot, &end).await.then_some(()) },
    )
    .await;
    let left: i64 = sql
        .query_one(&format!("SELECT count(*) FROM \"{}\"", p.table), &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(
        left, 0,
        "the application deleted its rows; outboxd wrote none"
    );
    let status = run_outboxd(&p.config_path, &["status"]);
    assert!(!status.status.success());
    assert!(
        String::from_utf8_lossy(&status.stderr).contains("outbox.rows = \"deleted\""),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    println!(
        "slot {slot} confirmed at {}",
        confirmed_lsn(&sql, &slot).await
    );
    drop(daemon);
    drop_slot(&sql, &slot).await;
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_row_that_can_never_be_sent_stops_the_relay_before_it() {
    let (p, slot, aggregate, _guard) = debezium_pipeline("dbzstop", "").await;
    let allowed = format!("outbox.event.{aggregate}");
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let config = config.replacen(
        "[kafka]\n",
        &format!("[kafka]\nallowed_topics = [\"{allowed}\"]\n"),
        1,
    );
    std::fs::write(&p.config_path, config).expect("write config");
    let mut sql = p.sql().await;
    p.init();
    // As Debezium would have: confirmed past the publication's creation (README, the
    // switch from Debezium).
    sql.execute(
        "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())",
        &[&slot],
    )
    .await
    .expect("advance the slot");

    let first = emit(&mut sql, &p.table, &aggregate, "k", 1, None).await;
    let before_bad = current_lsn(&sql).await;
    let bad = emit(&mut sql, &p.table, "secret", "k", 2, None).await;
    let mut daemon = p.spawn_run("run.log");
    let exit = daemon
        .wait_exit(Duration::from_secs(60))
        .expect("run stops by itself");
    assert!(!exit.success());
    let log = daemon.log_text();
    assert!(
        log.contains(&format!("message_id `{bad}` cannot be published")),
        "the row and the reason are named:\n{log}"
    );
    let records = consume_all(&p.services.kafka, &allowed, 1, 1, Duration::from_secs(30));
    assert_eq!(by_id(&records).keys().collect::<Vec<_>>(), vec![&first]);
    // The position stops before the row that was not sent: a restart meets it again.
    let held: bool = sql
        .query_one(
            "SELECT confirmed_flush_lsn <= $2::text::pg_lsn FROM pg_replication_slots \
             WHERE slot_name = $1",
            &[&slot, &before_bad],
        )
        .await
        .expect("slot")
        .get(0);
    assert!(
        held,
        "the slot was confirmed past a row that was never sent"
    );
    drop_slot(&sql, &slot).await;
    p.cleanup().await;
}

/// Inserts one Debezium outbox row into `table` (quoted, qualified) and deletes it in
/// the same transaction `tx`; returns its id.
async fn emit_in(tx: &tokio_postgres::Transaction<'_>, table: &str, key: &str, seq: u32) -> String {
    let id: String = tx
        .query_one("SELECT gen_random_uuid()::text", &[])
        .await
        .expect("uuid")
        .get(0);
    tx.execute(
        &format!(
            "INSERT INTO {table} (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1::text::uuid, 'order', $2, 'OrderCreated', $3::text::jsonb)"
        ),
        &[&id, &key, &format!(r#"{{"seq": {seq}}}"#)],
    )
    .await
    .expect("insert");
    tx.execute(
        &format!("DELETE FROM {table} WHERE id = $1::text::uuid"),
        &[&id],
    )
    .await
    .expect("delete");
    id
}

/// One transaction inserting (and deleting) a row into each `(table index, seq)` of
/// `rows`; returns `(table index, id)` of each.
async fn emit_together(
    sql: &mut tokio_postgres::Client,
    tables: &[String],
    rows: &[(usize, u32)],
) -> Vec<(usize, String)> {
    let tx = sql.transaction().await.expect("begin");
    let mut ids = Vec::new();
    for (table, seq) in rows {
        ids.push((*table, emit_in(&tx, &tables[*table], "k", *seq).await));
    }
    tx.commit().await.expect("commit");
    ids
}

/// Reads `topic` and returns the `id` headers, in order.
fn ids_on(kafka: &str, topic: &str, expected: usize) -> Vec<String> {
    consume_all(kafka, topic, 1, expected, Duration::from_secs(60))
        .iter()
        .map(|r| r.headers.get("id").cloned().unwrap_or_default())
        .collect()
}

/// Several outbox tables in one pipeline (a schema per tenant, a table per bounded
/// context): one slot and one publication read both, `{schema}` and `{table}` route each
/// row to its table's topic, a transaction that writes both tables is relayed whole, and
/// a restart sends nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_outbox_tables_in_one_pipeline_each_row_to_its_tables_topic() {
    let p = TestPipeline::new("tenants", 1, "").await;
    let tenant = format!("tb_{}", p.name);
    let sql = p.sql().await;
    let create = |table: &str| {
        format!(
            "CREATE TABLE {table} (
                 id uuid NOT NULL PRIMARY KEY,
                 aggregatetype varchar(255) NOT NULL,
                 aggregateid varchar(255) NOT NULL,
                 type varchar(255) NOT NULL,
                 payload jsonb,
                 tracingspancontext varchar(256)
             );
             ALTER TABLE {table} OWNER TO \"{admin}\";",
            admin = p.services.admin_user,
        )
    };
    // The harness grants the runtime role its rights on `public.<p.table>`; the second
    // tenant's schema gets the same by hand.
    let tables = [
        format!("\"public\".\"{}\"", p.table),
        format!("\"{tenant}\".\"outboxevent\""),
    ];
    sql.batch_execute(&format!(
        "{}
         CREATE SCHEMA \"{tenant}\" AUTHORIZATION \"{admin}\";
         {}
         GRANT USAGE ON SCHEMA \"{tenant}\" TO \"{run}\";
         GRANT SELECT ON {} TO \"{run}\";",
        create(&tables[0]),
        create(&tables[1]),
        tables[1],
        run = p.services.run_user,
        admin = p.services.admin_user,
    ))
    .await
    .expect("two outbox tables");
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let config = config
        .replacen(
            &format!("table = \"{}\"", p.table),
            &format!(
                "tables = [\"public.{}\", \"{tenant}.outboxevent\"]\nlayout = \"debezium\"",
                p.table
            ),
            1,
        )
        .replacen(
            &format!("topic_template = \"{}\"", p.topic),
            "topic_template = \"{schema}.{table}.{routing}\"",
            1,
        );
    std::fs::write(&p.config_path, config).expect("write config");
    let topics = [
        format!("public.{}.order", p.table),
        format!("{tenant}.outboxevent.order"),
    ];
    for topic in &topics {
        create_topic_with(&p.services.kafka, topic, 1, &[]).await;
    }

    let schema = run_outboxd(&p.config_path, &["schema"]);
    let script = String::from_utf8_lossy(&schema.stdout);
    assert!(
        script.contains(&format!("FOR TABLE {}, {}", tables[0], tables[1])),
        "one publication over both tables:\n{script}"
    );
    p.init();
    let check = run_outboxd(&p.config_path, &["check"]);
    assert!(
        check.status.success(),
        "outboxd check with two outbox tables:\n{}\n{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    // Rows of one table, of the other, and of both in one transaction.
    let mut sql = p.sql().await;
    let mut daemon = p.spawn_run("run.log");
    let mut sent: Vec<(usize, String)> = Vec::new();
    for seq in 1..=6u32 {
        let rows = match seq % 3 {
            0 => vec![(0, seq), (1, seq)],
            1 => vec![(0, seq)],
            _ => vec![(1, seq)],
        };
        sent.extend(emit_together(&mut sql, &tables, &rows).await);
    }
    let of = |table: usize, sent: &[(usize, String)]| -> Vec<String> {
        (sent.iter().filter(|(t, _)| *t == table))
            .map(|(_, id)| id.clone())
            .collect()
    };
    for (table, topic) in topics.iter().enumerate() {
        let want = of(table, &sent);
        let got = ids_on(&p.services.kafka, topic, want.len());
        assert_eq!(
            got, want,
            "table {table}'s rows on {topic}: each once, in commit order"
        );
    }

    // A graceful restart: what was sent is not sent again, what comes after is.
    daemon.terminate();
    sent.extend(emit_together(&mut sql, &tables, &[(1, 7), (0, 7)]).await);
    let daemon = p.spawn_run("run2.log");
    for (table, topic) in topics.iter().enumerate() {
        let want = of(table, &sent);
        let got = ids_on(&p.services.kafka, topic, want.len());
        assert_eq!(
            got, want,
            "after the restart, table {table}: the new row once, no other again"
        );
    }
    drop(daemon);
    p.cleanup().await;
    let _ = sql
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{tenant}\" CASCADE"))
        .await;
}

/// Inserts one Debezium outbox row and keeps it (no delete), with the span context
/// `trace` and in `status` when given (as an application or an operator may); returns its
/// uuid.
async fn insert_kept(
    sql: &tokio_postgres::Client,
    table: &str,
    (aggregate, key, seq): (&str, &str, u32),
    trace: Option<&str>,
    status: Option<&str>,
) -> String {
    let id: String = sql
        .query_one("SELECT gen_random_uuid()::text", &[])
        .await
        .expect("uuid")
        .get(0);
    let payload = format!(r#"{{"key": "{key}", "seq": {seq}}}"#);
    let insert = match status {
        None => format!(
            "INSERT INTO \"{table}\" (id, aggregatetype, aggregateid, type, payload, \
             tracingspancontext) VALUES ($1::text::uuid, $2, $3, 'OrderCreated', \
             $4::text::jsonb, $5)"
        ),
        // A parked row: outboxd's invariant wants next_retry_time set with the status.
        Some(_) => format!(
            "INSERT INTO \"{table}\" (id, aggregatetype, aggregateid, type, payload, \
             tracingspancontext, status, next_retry_time) VALUES ($1::text::uuid, $2, $3, \
             'OrderCreated', $4::text::jsonb, $5, $6, now())"
        ),
    };
    let trace = trace.map(|t| format!("traceparent={t}\n"));
    let status = status.unwrap_or("");
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = match status.is_empty() {
        true => vec![&id, &aggregate, &key, &payload, &trace],
        false => vec![&id, &aggregate, &key, &payload, &trace, &status],
    };
    sql.execute(&insert, &params).await.expect("insert");
    id
}

/// Issue 13, "`init` adds the state-machine columns to such a table when asked": kept rows
/// on Debezium's own table. `check` and `init` name what is missing; `init --add-columns`
/// adds an integer row id and the status columns, the rows already there becoming
/// SUCCESS (not sent); then rows are published from the log with the Event Router's
/// conventions and their status, partition and offset written back, and the retry worker
/// and the operator's `retry` address rows by the added id and publish them the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debezium_table_keeps_its_rows_once_init_adds_the_status_columns() {
    let p = TestPipeline::new("dbzkept", 1, "").await;
    let aggregate = format!("order_{}", p.name);
    let topic = format!("outbox.event.{aggregate}");
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let config = config
        .replacen(
            &format!("table = \"{}\"", p.table),
            &format!(
                "table = \"{}\"\nlayout = \"debezium\"\nrows = \"kept\"",
                p.table
            ),
            1,
        )
        .replacen(&format!("topic_template = \"{}\"\n", p.topic), "", 1);
    std::fs::write(&p.config_path, config).expect("write config");
    let sql = p.sql().await;
    sql.batch_execute(&format!(
        "CREATE TABLE \"{table}\" (
             id uuid NOT NULL PRIMARY KEY,
             aggregatetype varchar(255) NOT NULL,
             aggregateid varchar(255) NOT NULL,
             type varchar(255) NOT NULL,
             payload jsonb,
             tracingspancontext varchar(256)
         );
         ALTER TABLE \"{table}\" OWNER TO \"{admin}\";",
        table = p.table,
        admin = p.services.admin_user
    ))
    .await
    .expect("Debezium's table");
    create_topic_with(&p.services.kafka, &topic, 1, &[]).await;
    // A row from before the switch, kept by the application: not to be sent again.
    let old = insert_kept(&sql, &p.table, (&aggregate, "k-old", 0), None, None).await;

    let text = |out: &std::process::Output| {
        format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let init = p.outboxd(&["init"]);
    assert!(!init.status.success(), "init without --add-columns");
    let said = text(&init);
    assert!(
        said.contains("lacks column(s) outboxd_seq, status") && said.contains("--add-columns"),
        "{said}"
    );
    let schema = text(&p.outboxd(&["schema"]));
    assert!(
        schema.contains("ADD COLUMN IF NOT EXISTS \"outboxd_seq\" bigint"),
        "{schema}"
    );
    let init = p.outboxd(&["init", "--add-columns"]);
    let said = text(&init);
    assert!(init.status.success(), "{said}");
    assert!(
        said.contains("added column(s) outboxd_seq, status"),
        "{said}"
    );
    let check = p.outboxd(&["check"]);
    assert!(check.status.success(), "{}", text(&check));
    let again = p.outboxd(&["init", "--add-columns"]);
    assert!(
        text(&again).contains("has every column outboxd writes"),
        "{}",
        text(&again)
    );
    let old_row = sql
        .query_one(
            &format!(
                "SELECT status, updated_at IS NOT NULL FROM \"{}\" WHERE id = $1::text::uuid",
                p.table
            ),
            &[&old],
        )
        .await
        .expect("old row");
    assert_eq!(
        old_row.get::<_, String>(0),
        "SUCCESS",
        "a row from before is not sent"
    );
    assert!(old_row.get::<_, bool>(1), "the janitor can age it");

    let daemon = p.spawn_run("run.log");
    let mut sent = Vec::new();
    for seq in 1..=6 {
        let key = format!("k{}", seq % 2);
        // Row 3 carries a span context: the log path reads it.
        let trace = (seq == 3).then_some(TRACEPARENT);
        let id = insert_kept(&sql, &p.table, (&aggregate, &key, seq), trace, None).await;
        sent.push((key, id));
    }
    // A parked row, inserted so (the log path leaves rows not inserted as INIT alone),
    // made due by the operator by its added id: the retry worker claims and sends it,
    // reading its span context as the log path would.
    let parked = insert_kept(
        &sql,
        &p.table,
        (&aggregate, "k-parked", 7),
        Some(TRACEPARENT),
        Some("MANUAL_REQUIRED"),
    )
    .await;
    let seq_id: i64 = sql
        .query_one(
            &format!(
                "SELECT outboxd_seq FROM \"{}\" WHERE id = $1::text::uuid",
                p.table
            ),
            &[&parked],
        )
        .await
        .expect("added id")
        .get(0);
    let retry = p.outboxd(&["retry", "--id", &seq_id.to_string()]);
    assert!(retry.status.success(), "{}", text(&retry));
    sent.push(("k-parked".to_owned(), parked.clone()));

    let records = consume_all(
        &p.services.kafka,
        &topic,
        1,
        sent.len(),
        Duration::from_secs(60),
    );
    let seen = by_id(&records);
    assert!(!seen.contains_key(&old), "the row from before was sent");
    for (key, id) in &sent {
        let copies = seen
            .get(id)
            .unwrap_or_else(|| panic!("row {id} was not sent: {}", daemon.log_text()));
        assert_eq!(copies.len(), 1, "row {id} sent {} times", copies.len());
        let r = copies[0];
        assert_eq!(&r.key, key, "the record key is aggregateid");
        assert_eq!(
            r.headers.get("id"),
            Some(id),
            "the Event Router's header `id`"
        );
        assert_eq!(
            r.headers.get("message_type").map(String::as_str),
            Some("OrderCreated")
        );
    }
    assert_eq!(records.len(), sent.len(), "nothing else on {topic}");
    let mut traced: Vec<&str> = records
        .iter()
        .filter(|r| r.headers.get("traceparent").map(String::as_str) == Some(TRACEPARENT))
        .map(|r| r.key.as_str())
        .collect();
    traced.sort_unstable();
    assert_eq!(
        traced,
        ["k-parked", "k1"],
        "the span context of the logged row 3 and of the claimed row"
    );
    for key in ["k0", "k1"] {
        let seqs: Vec<&str> = records
            .iter()
            .filter(|r| r.key == key)
            .map(|r| r.payload.as_str())
            .collect();
        assert_eq!(seqs.len(), 3, "{key}");
        let mut sorted = seqs.clone();
        sorted.sort();
        assert_eq!(seqs, sorted, "key {key} in commit order");
    }

    // Every row's status, partition and offset written back, in its own table.
    let by_offset: BTreeMap<String, i64> = records
        .iter()
        .map(|r| (r.headers["id"].clone(), r.offset))
        .collect();
    let rows = wait_for(
        "every sent row SUCCESS with its offset",
        Duration::from_secs(30),
        || async {
            let rows = sql
                .query(
                    &format!(
                        "SELECT id::text, status, kafka_offset, retry_count FROM \"{}\" \
                         WHERE id <> $1::text::uuid",
                        p.table
                    ),
                    &[&old],
                )
                .await
                .expect("rows");
            let done =
                rows.len() == sent.len() && rows.iter().all(|r| r.get::<_, String>(1) == "SUCCESS");
            done.then_some(rows)
        },
    )
    .await;
    for row in &rows {
        let id: String = row.get(0);
        assert_eq!(
            row.get::<_, Option<i64>>(2),
            by_offset.get(&id).copied(),
            "row {id}'s offset is its record's"
        );
        assert_eq!(row.get::<_, i32>(3), 0, "row {id}: no attempt failed");
    }
    let status = p.outboxd(&["status"]);
    assert!(status.status.success(), "{}", text(&status));
    assert!(text(&status).contains("SUCCESS"), "{}", text(&status));

    drop(daemon);
    p.cleanup().await;
}

/// Debezium's documented outbox table has no `tracingspancontext` (Debezium needs it only
/// with tracing on): `check` passes and says once that events carry no trace context, and
/// `run` relays every row (key `aggregateid`, header `id`, topic
/// `outbox.event.<aggregatetype>`), each key in order. Before, `check` failed ("lacks
/// column(s) tracingspancontext") and `run` stopped at the first event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debeziums_documented_table_without_the_trace_column_works() {
    let (p, slot, aggregate, _guard) = debezium_pipeline("dbznotrace", "").await;
    let topic = format!("outbox.event.{aggregate}");
    let mut sql = p.sql().await;
    sql.batch_execute(&format!(
        "ALTER TABLE \"{}\" DROP COLUMN tracingspancontext",
        p.table
    ))
    .await
    .expect("Debezium's documented table, without the trace column");
    p.init();
    sql.execute(
        "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())",
        &[&slot],
    )
    .await
    .expect("advance the slot");

    let check = run_outboxd(&p.config_path, &["check"]);
    let said = String::from_utf8_lossy(&check.stdout).into_owned();
    assert!(check.status.success(), "check:\n{said}");
    assert_eq!(
        said.matches("no trace column `tracingspancontext`").count(),
        1,
        "said once:\n{said}"
    );
    let daemon = p.spawn_run("run.log");
    let mut sent = Vec::new();
    for seq in 1..=6u32 {
        let key = format!("k{}", seq % 2);
        let id: String = sql
            .query_one("SELECT gen_random_uuid()::text", &[])
            .await
            .expect("uuid")
            .get(0);
        let tx = sql.transaction().await.expect("begin");
        tx.execute(
            &format!(
                "INSERT INTO \"{}\" (id, aggregatetype, aggregateid, type, payload) \
                 VALUES ($1::text::uuid, $2, $3, 'OrderCreated', $4::text::jsonb)",
                p.table
            ),
            &[&id, &aggregate, &key, &format!(r#"{{"seq": {seq}}}"#)],
        )
        .await
        .expect("insert");
        tx.execute(
            &format!("DELETE FROM \"{}\" WHERE id = $1::text::uuid", p.table),
            &[&id],
        )
        .await
        .expect("delete");
        tx.commit().await.expect("commit");
        sent.push((key, id));
    }
    let records = consume_all(
        &p.services.kafka,
        &topic,
        1,
        sent.len(),
        Duration::from_secs(60),
    );
    let seen = by_id(&records);
    for (key, id) in &sent {
        let copies = seen
            .get(id)
            .unwrap_or_else(|| panic!("row {id} was not sent"));
        assert_eq!(&copies[0].key, key, "the record key is aggregateid");
    }
    // Each key's records in the order of their rows.
    for key in ["k0", "k1"] {
        let order: Vec<&String> = records
            .iter()
            .filter(|r| r.key == key)
            .filter_map(|r| r.headers.get("id"))
            .collect();
        let expected: Vec<&String> = sent
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, id)| id)
            .collect();
        assert_eq!(order, expected, "key {key} in order");
    }
    assert!(
        !daemon.log_text().contains("has no column"),
        "{}",
        daemon.log_text()
    );
    drop(daemon);
    drop_slot(&sql, &slot).await;
    p.cleanup().await;
}
