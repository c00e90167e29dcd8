//! The outbox found by its configured name the way the server finds it, by `init`,
//! `check` and the replication stream alike: an unqualified name through the
//! database's `search_path`, a schema-qualified one, a quoted mixed-case one. Each test
//! writes rows, opens the stream and asserts they come out as events before any
//! progress past them (progress is what the core confirms to the slot).
//!
//! Each test has its own database (so it may set `search_path` and use schema `app`
//! without touching other tests), slot and publication; all are dropped at the end,
//! also after a panic. Server: `scripts/services start postgres` and
//! `eval "$(scripts/services env)"`.

mod support_store;

use std::time::Duration;

use outboxd_connector::{ChangeItem, ChangeStream, CheckStatus, ErrorKind, OutboxLayout};
use outboxd_postgres::stream::PgChangeStream;
use outboxd_postgres::PostgresConnector;
use support_store::{unique, PgEnv};
use tokio::time::{timeout, Instant};
use tokio_postgres::Client;

const DEADLINE: Duration = Duration::from_secs(30);

/// An LSN as a number, from PostgreSQL's `16/B374D848` or a position's `lsn:16/B374D848`
/// (read from text, so the test does not depend on how positions are typed).
fn lsn(text: &str) -> u64 {
    let text = text.strip_prefix("lsn:").unwrap_or(text);
    let (hi, lo) = text
        .split_once('/')
        .unwrap_or_else(|| panic!("not an LSN: {text}"));
    let half =
        |h: &str| u64::from_str_radix(h, 16).unwrap_or_else(|_| panic!("not an LSN: {text}"));
    half(hi) << 32 | half(lo)
}

/// A database of its own, with a slot and publication named after it.
struct Db {
    /// The cluster's test database, where this one is created and dropped.
    admin_env: PgEnv,
    env: PgEnv,
    name: String,
    client: Client,
}

impl Db {
    async fn new(prefix: &str) -> Self {
        let admin_env = PgEnv::from_env();
        let admin = admin_env.client().await;
        let name = unique(prefix);
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .expect("create database");
        let mut env = admin_env.clone();
        env.database = name.clone();
        let client = env.client().await;
        Self {
            admin_env,
            env,
            name,
            client,
        }
    }

    /// Sets the database's `search_path`, read by connections opened after this, so the
    /// test's own connection is opened again.
    async fn set_search_path(&mut self, path: &str) {
        self.client
            .batch_execute(&format!(
                "ALTER DATABASE \"{}\" SET search_path = {path}",
                self.name
            ))
            .await
            .expect("set search_path");
        self.client = self.env.client().await;
    }

    /// A connector whose outbox is configured as `outbox_table`.
    fn connector(&self, outbox_table: &str) -> PostgresConnector {
        let mut config = self.env.config();
        config.slot = Some(self.name.clone());
        config.publication = Some(self.name.clone());
        config.status_interval = Duration::from_secs(1);
        let layout = OutboxLayout::with_tables(outbox_table, "inbox", "outboxd_checkpoint");
        PostgresConnector::new(config, "names", layout).expect("valid names")
    }

    /// The outbox DDL of `schemas/postgres/outbox.sql` for `table` (as SQL writes it).
    async fn create_outbox(&self, table: &str, index_stem: &str) {
        let sql = include_str!("../../../schemas/postgres/outbox.sql");
        let ddl = sql
            .lines()
            .filter(|l| !l.trim_start().starts_with('\\'))
            .collect::<Vec<_>>()
            .join("\n")
            .replace(":\"outbox_table\"", table)
            .replace(
                ":\"outbox_retry_index\"",
                &format!("\"{index_stem}_retry_due_idx\""),
            )
            .replace(
                ":\"outbox_key_retry_index\"",
                &format!("\"{index_stem}_key_retry_idx\""),
            );
        self.client.batch_execute(&ddl).await.expect("outbox DDL");
    }

    /// `pg_current_wal_lsn()`, as text.
    async fn current_lsn(&self) -> String {
        let row = self
            .client
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .unwrap();
        row.get(0)
    }

    /// Waits until no reader holds the slot (a dropped stream's walsender has gone).
    async fn wait_slot_released(&self) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let row = self
                .client
                .query_one(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                    &[&self.name],
                )
                .await
                .unwrap();
            if !row.get::<_, bool>(0) {
                return;
            }
            assert!(Instant::now() < deadline, "slot {} still in use", self.name);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn confirmed_flush(&self) -> u64 {
        let row = self
            .client
            .query_one(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.name],
            )
            .await
            .unwrap();
        lsn(&row.get::<_, String>(0))
    }

    /// Inserts rows `ids` into `table` (as SQL writes it) in one transaction.
    async fn insert(&self, table: &str, ids: &[&str]) {
        let mut sql = String::from("BEGIN;");
        for id in ids {
            sql.push_str(&format!(
                "INSERT INTO {table} (message_id, message_type, biz_key, payload) \
                 VALUES ('{id}', 'names.{id}', 'k-{id}', '{{}}');"
            ));
        }
        sql.push_str("COMMIT;");
        self.client.batch_execute(&sql).await.expect("insert");
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let (admin_env, env, name) = (self.admin_env.clone(), self.env.clone(), self.name.clone());
        support_store::clean_up_from_drop(async move {
            // A logical slot is dropped from its own database, and keeps the database from
            // being dropped until it is.
            let client = env.client().await;
            support_store::drop_slot(&client, &name).await;
            drop(client);
            let _ = admin_env
                .client()
                .await
                .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .await;
        });
    }
}

/// `init` and `check` pass for `connector`.
async fn init_and_check(connector: &PostgresConnector) {
    let created = connector.init().await.expect("init");
    let report = connector.check().await;
    let text: Vec<String> = report.iter().map(ToString::to_string).collect();
    assert!(
        report.iter().all(|l| l.status != CheckStatus::Fail),
        "check after init:\n{}\n(init said: {created:?})",
        text.join("\n")
    );
}

/// Inserts rows `ids` into `table` (as the application writes it), opens the stream and
/// asserts they arrive as one transaction, before any progress past them.
async fn assert_rows_arrive(db: &Db, connector: &PostgresConnector, table: &str, ids: &[&str]) {
    let slot_before = db.confirmed_flush().await;
    db.insert(table, ids).await;
    let after_insert = db.current_lsn().await;
    let mut stream = connector.open_stream().await.expect("open stream");
    let deadline = Instant::now() + DEADLINE;
    let txn = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, stream.next())
            .await
            .unwrap_or_else(|_| panic!("rows {ids:?} of {table} not streamed in {DEADLINE:?}"))
            .expect("stream")
        {
            ChangeItem::Transaction(txn) => break txn,
            ChangeItem::Part(part) => panic!("a few rows came in parts: {part:?}"),
            ChangeItem::Progress(position) => {
                assert!(
                    lsn(&position.to_string()) < lsn(&after_insert),
                    "progress to {position}, past the rows {ids:?} committed into {table} before \
                     {after_insert}, without their events: the core would confirm them unseen \
                     and they would stay INIT"
                );
            }
        }
    };
    let got: Vec<&str> = txn.events.iter().map(|e| e.message_id.as_str()).collect();
    assert_eq!(got, ids);
    assert_eq!(
        db.confirmed_flush().await,
        slot_before,
        "nothing confirmed yet"
    );
    stream.confirm(&txn.commit_position).await.unwrap();
    drop(stream);
    db.wait_slot_released().await;
}

#[tokio::test]
async fn outbox_in_another_schema_found_through_search_path() {
    let mut db = Db::new("names_sp").await;
    db.client
        .batch_execute("CREATE SCHEMA app")
        .await
        .expect("schema");
    db.create_outbox("app.outbox", "outbox").await;
    db.set_search_path("app, public").await;
    let connector = db.connector("outbox");
    init_and_check(&connector).await;
    // The application writes it as its own search_path finds it.
    assert_rows_arrive(&db, &connector, "outbox", &["sp-1", "sp-2"]).await;
}

#[tokio::test]
async fn schema_qualified_outbox() {
    let db = Db::new("names_qual").await;
    let connector = db.connector("app.outbox");
    init_and_check(&connector).await;
    assert_rows_arrive(&db, &connector, "app.outbox", &["q-1", "q-2"]).await;
}

#[tokio::test]
async fn bare_mixed_case_names_are_taken_as_written() {
    // `init` creates "Sales"."OutBox" for this, as for every configured name.
    let db = Db::new("names_bare").await;
    let connector = db.connector("Sales.OutBox");
    init_and_check(&connector).await;
    assert_rows_arrive(&db, &connector, "\"Sales\".\"OutBox\"", &["b-1"]).await;
}

#[tokio::test]
async fn quoted_mixed_case_outbox() {
    let db = Db::new("names_quoted").await;
    db.create_outbox("\"OutBox\"", "OutBox").await;
    let connector = db.connector("\"OutBox\"");
    init_and_check(&connector).await;
    assert_rows_arrive(&db, &connector, "\"OutBox\"", &["mc-1", "mc-2"]).await;
}

#[tokio::test]
async fn quoted_schema_and_table_with_a_dot_and_upper_case() {
    let db = Db::new("names_dotted").await;
    let connector = db.connector("\"My.App\".\"OutBox\"");
    init_and_check(&connector).await;
    assert_rows_arrive(&db, &connector, "\"My.App\".\"OutBox\"", &["d-1"]).await;
}

#[tokio::test]
async fn a_table_in_the_publication_that_is_not_the_outbox_stops_the_stream() {
    let db = Db::new("names_foreign").await;
    let connector = db.connector("outbox");
    init_and_check(&connector).await;
    db.client
        .batch_execute(&format!(
            "CREATE TABLE orders (id serial PRIMARY KEY, note text);
             ALTER PUBLICATION \"{}\" ADD TABLE orders;",
            db.name
        ))
        .await
        .expect("add a table to the publication");
    let slot_before = db.confirmed_flush().await;
    db.client
        .batch_execute("INSERT INTO orders (note) VALUES ('not an event')")
        .await
        .unwrap();
    let after_insert = db.current_lsn().await;
    let mut stream: PgChangeStream = connector.open_stream().await.expect("open stream");
    let err = loop {
        match timeout(DEADLINE, stream.next())
            .await
            .expect("no error in time")
        {
            Ok(ChangeItem::Progress(position)) => assert!(
                lsn(&position.to_string()) < lsn(&after_insert),
                "progress to {position}, past the insert into `orders` at {after_insert}, \
                 instead of an error"
            ),
            Ok(other) => panic!("unexpected {other:?}"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), ErrorKind::Definite, "{err}");
    let message = err.message();
    assert!(message.contains(&db.name), "names the publication: {err}");
    assert!(message.contains("public.orders"), "names the table: {err}");
    assert!(message.contains("public.outbox"), "names the outbox: {err}");
    drop(stream);
    db.wait_slot_released().await;
    assert_eq!(db.confirmed_flush().await, slot_before);
}
