//! The PostgreSQL side of the end-to-end harness: the server started by `scripts/services`
//! (read from `OUTBOXD_TEST_PG_*`), one pipeline per test with its own outbox table,
//! replication slot, publication, topic and config file.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::engine::{random_pad, Engine, Event, Landed, OutboxRow, Pipeline, Writer};
use super::env_or;

/// One test's PostgreSQL pipeline.
pub type TestPipeline = Pipeline<PgServices>;

/// Where PostgreSQL and Kafka are (`scripts/services env` prints these variables).
/// `pg_user` is the test's own (superuser) role for its SQL; outboxd runs as `run_user`,
/// and `init` as `admin_user` (README, "Privileges").
pub struct PgServices {
    pub pg_host: String,
    pub pg_port: u16,
    pub pg_user: String,
    pub pg_password: String,
    pub pg_database: String,
    pub run_user: String,
    pub run_password: String,
    pub admin_user: String,
    pub admin_password: String,
    pub kafka: String,
}

/// `schemas/postgres/grants.sql`, applied by the tests after every `init`.
const GRANTS_SQL: &str = include_str!("../../schemas/postgres/grants.sql");

/// `GRANTS_SQL` for these tables (in `schema`) and role, as psql would run it.
pub fn runtime_grants(
    run_role: &str,
    schema: &str,
    outbox: &str,
    inbox: &str,
    checkpoint: &str,
) -> String {
    let quote = |name: &str| format!("\"{}\"", name.replace('"', "\"\""));
    // Without `-v canary=1`: its block is left out, as psql leaves it out.
    let mut in_canary_block = false;
    let grants = GRANTS_SQL
        .lines()
        .filter(|l| {
            if l.starts_with("\\if :{?canary}") {
                in_canary_block = true;
            } else if in_canary_block && l.starts_with("\\endif") {
                in_canary_block = false;
                return false;
            }
            !in_canary_block && !l.starts_with('\\')
        })
        .collect::<Vec<_>>()
        .join("\n")
        .replace(":\"run_role\"", &quote(run_role))
        .replace(":\"schema\"", &quote(schema))
        .replace(":\"outbox_table\"", &quote(outbox))
        .replace(":\"inbox_table\"", &quote(inbox))
        .replace(":\"checkpoint_table\"", &quote(checkpoint));
    serialized(&grants)
}

/// The grant `schemas/postgres/grants.sql` adds with `-v canary=1`, for `outbox`.
pub fn canary_grant(run_role: &str, schema: &str, outbox: &str) -> String {
    let quote = |name: &str| format!("\"{}\"", name.replace('"', "\"\""));
    let block = GRANTS_SQL
        .split("\\if :{?canary}")
        .nth(1)
        .and_then(|rest| rest.split("\\endif").next())
        .expect("grants.sql has a canary block");
    block
        .replace(":\"run_role\"", &quote(run_role))
        .replace(":\"schema\"", &quote(schema))
        .replace(":\"outbox_table\"", &quote(outbox))
}

impl PgServices {
    pub fn pg_conn_string(&self) -> String {
        format!(
            "host={} port={} user={} password={} dbname={}",
            self.pg_host, self.pg_port, self.pg_user, self.pg_password, self.pg_database
        )
    }
}

/// `INSERT` of one [`Event`] into `table`, with its parameters.
fn insert(table: &str, key: &str, seq: u32, tag: &str) -> (String, [String; 5]) {
    let sql = format!(
        "INSERT INTO \"{table}\" (message_id, message_type, biz_key, payload, headers) \
         VALUES ($1, $2, $3, $4::text::jsonb, $5::text::jsonb)"
    );
    let params = [
        format!("{tag}-{key}-{seq}"),
        format!("order.step{seq}"),
        key.to_owned(),
        format!(r#"{{"key":"{key}","seq":{seq}}}"#),
        format!(r#"{{"seq":"{seq}","trace":"t-{key}"}}"#),
    ];
    (sql, params)
}

impl Engine for PgServices {
    type Writer = PgWriter;

    const NAME: &'static str = "postgres";
    const NAME_PREFIX: &'static str = "";
    const LOG_FILTER: &'static str = "info,outboxd=debug";
    const CHECKPOINT_PREFIX: &'static str = "lsn:";
    const CREATED_AT_SUFFIX: &'static str = "+00";
    const STANDBY_WAITING: &'static [&'static str] = &["retrying"];
    const CHECK_ITEMS: &'static [&'static str] = &[];
    const NULLABLE_MESSAGE_TYPE: &'static str =
        "ALTER TABLE {table} ALTER COLUMN message_type DROP NOT NULL";

    fn from_env() -> Self {
        Self {
            pg_host: env_or("OUTBOXD_TEST_PG_HOST", "127.0.0.1"),
            pg_port: env_or("OUTBOXD_TEST_PG_PORT", "25432")
                .parse()
                .expect("OUTBOXD_TEST_PG_PORT"),
            pg_user: env_or("OUTBOXD_TEST_PG_USER", "outboxd"),
            pg_password: env_or("OUTBOXD_TEST_PG_PASSWORD", "outboxd"),
            pg_database: env_or("OUTBOXD_TEST_PG_DATABASE", "outboxd"),
            run_user: env_or("OUTBOXD_TEST_PG_RUN_USER", "outboxd_run"),
            run_password: env_or("OUTBOXD_TEST_PG_RUN_PASSWORD", "outboxd_run"),
            admin_user: env_or("OUTBOXD_TEST_PG_ADMIN_USER", "outboxd_admin"),
            admin_password: env_or("OUTBOXD_TEST_PG_ADMIN_PASSWORD", "outboxd_admin"),
            kafka: env_or("OUTBOXD_TEST_KAFKA", "127.0.0.1:29092"),
        }
    }

    fn kafka(&self) -> &str {
        &self.kafka
    }

    fn source_section(&self) -> String {
        format!(
            r#"[source]
kind = "postgres"
host = "{}"
port = {}
user = "{}"
password = "{}"
database = "{}"
sslmode = "disable"
status_interval = "1s""#,
            self.pg_host, self.pg_port, self.run_user, self.run_password, self.pg_database
        )
    }

    fn as_admin(&self, config: &str) -> String {
        let login =
            |user: &str, password: &str| format!("user = \"{user}\"\npassword = \"{password}\"\n");
        let run = login(&self.run_user, &self.run_password);
        assert!(config.contains(&run), "the runtime login in:\n{config}");
        config.replacen(&run, &login(&self.admin_user, &self.admin_password), 1)
    }

    async fn grant_runtime(p: &TestPipeline) {
        let sql = runtime_grants(
            &p.services.run_user,
            "public",
            &p.table,
            "inbox",
            "outboxd_checkpoint",
        );
        p.sql().await.batch_execute(&sql).await.expect(&sql);
    }

    async fn grant_canary(p: &TestPipeline) {
        let sql = canary_grant(&p.services.run_user, "public", &p.table);
        p.sql().await.batch_execute(&sql).await.expect(&sql);
    }

    async fn writer(p: &TestPipeline) -> PgWriter {
        PgWriter {
            client: p.sql().await,
            table: p.table.clone(),
        }
    }

    async fn status_counts(p: &TestPipeline) -> HashMap<String, i64> {
        let client = p.sql().await;
        let rows = client
            .query(
                &format!(
                    "SELECT status, count(*) FROM \"{}\" GROUP BY status",
                    p.table
                ),
                &[],
            )
            .await
            .expect("count statuses");
        rows.iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
            .collect()
    }

    async fn rows(p: &TestPipeline) -> BTreeMap<String, OutboxRow> {
        let sql = format!(
            "SELECT message_id, status, retry_count, last_error FROM \"{}\"",
            p.table
        );
        let rows = p.sql().await.query(&sql, &[]).await.expect("rows");
        rows.iter()
            .map(|r| {
                let row = OutboxRow {
                    status: r.get(1),
                    retry_count: r.get(2),
                    last_error: r.get(3),
                };
                (r.get::<_, String>(0), row)
            })
            .collect()
    }

    async fn landed(p: &TestPipeline) -> Vec<Landed> {
        let sql = format!(
            "SELECT kafka_partition, kafka_offset, message_id, sent_at IS NOT NULL FROM \"{}\"",
            p.table
        );
        let rows = p.sql().await.query(&sql, &[]).await.expect("landed");
        rows.iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect()
    }

    async fn checkpoint(p: &TestPipeline) -> Option<String> {
        p.sql()
            .await
            .query_opt(
                "SELECT position FROM outboxd_checkpoint WHERE pipeline = $1",
                &[&p.name],
            )
            .await
            .expect("read checkpoint")
            .map(|r| r.get(0))
    }

    async fn execute(p: &TestPipeline, sql: &str) {
        p.sql().await.batch_execute(sql).await.expect(sql);
    }

    async fn revoke_outbox_update(p: &TestPipeline) {
        let sql = format!(
            "REVOKE UPDATE ON \"{}\" FROM \"{}\"",
            p.table, p.services.run_user
        );
        Self::execute(p, &sql).await;
    }

    async fn execute_as_admin(p: &TestPipeline, sql: &str) {
        // The test's own role may take the admin's identity: the objects are the admin's.
        let admin = p.services.admin_user.replace('"', "\"\"");
        let script = format!("SET ROLE \"{admin}\";\n{sql}\nRESET ROLE;");
        p.sql().await.batch_execute(&script).await.expect(sql);
        Self::grant_runtime(p).await;
    }

    async fn row_id(p: &TestPipeline, message_id: &str) -> i64 {
        let sql = format!("SELECT id FROM \"{}\" WHERE message_id = $1", p.table);
        p.sql()
            .await
            .query_one(&sql, &[&message_id])
            .await
            .expect("row id")
            .get(0)
    }

    async fn hold_checkpoint_row(p: &TestPipeline) -> tokio::sync::oneshot::Sender<()> {
        let client = p.sql().await;
        client
            .batch_execute(&format!(
                "BEGIN; SELECT 1 FROM outboxd_checkpoint WHERE pipeline = '{}' FOR UPDATE",
                p.name
            ))
            .await
            .expect("lock the checkpoint row");
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = released.await;
            let _ = client.batch_execute("ROLLBACK").await;
        });
        release
    }

    async fn cleanup(p: &TestPipeline) {
        let client = p.sql().await;
        let slot = format!("outboxd_{}", p.name);
        let _ = client
            .execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND active_pid IS NOT NULL",
                &[&slot],
            )
            .await;
        // The walsender may take a moment to let go of the slot.
        for _ in 0..50 {
            let dropped = client
                .execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                     WHERE slot_name = $1 AND NOT active",
                    &[&slot],
                )
                .await;
            let remaining = client
                .query_one(
                    "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1",
                    &[&slot],
                )
                .await
                .map(|r| r.get::<_, i64>(0))
                .unwrap_or(0);
            if dropped.is_ok() && remaining == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = client
            .batch_execute(&format!("DROP PUBLICATION IF EXISTS outboxd_{}", p.name))
            .await;
        let _ = client
            .batch_execute(&format!("DROP TABLE IF EXISTS \"{}\"", p.table))
            .await;
    }
}

impl TestPipeline {
    pub async fn sql(&self) -> tokio_postgres::Client {
        let (client, connection) =
            tokio_postgres::connect(&self.services.pg_conn_string(), tokio_postgres::NoTls)
                .await
                .expect("connect to the test PostgreSQL (is `scripts/services start` running?)");
        tokio::spawn(connection);
        client
    }

    /// Inserts one outbox row per (biz_key, seq) in the given client's current context.
    pub async fn insert_events(
        &self,
        client: &tokio_postgres::Client,
        rows: &[(String, u32)],
        run_tag: &str,
    ) {
        for (key, seq) in rows {
            self.insert_event(client, key, *seq, run_tag).await;
        }
    }

    pub async fn insert_event(
        &self,
        client: &tokio_postgres::Client,
        key: &str,
        seq: u32,
        run_tag: &str,
    ) {
        let (sql, [a, b, c, d, e]) = insert(&self.table, key, seq, run_tag);
        client
            .execute(&sql, &[&a, &b, &c, &d, &e])
            .await
            .expect("insert outbox row");
    }
}

/// A PostgreSQL connection writing one pipeline's outbox.
pub struct PgWriter {
    client: tokio_postgres::Client,
    table: String,
}

impl PgWriter {
    async fn transaction(&mut self, events: &[Event], tag: &str, commit: bool) {
        let tx = self.client.transaction().await.expect("begin");
        for (key, seq) in events {
            let (sql, [a, b, c, d, e]) = insert(&self.table, key, *seq, tag);
            tx.execute(&sql, &[&a, &b, &c, &d, &e])
                .await
                .expect("insert outbox row");
        }
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
    }
}

impl Writer for PgWriter {
    async fn commit(&mut self, events: &[Event], tag: &str) {
        self.transaction(events, tag, true).await;
    }

    async fn roll_back(&mut self, events: &[Event], tag: &str) {
        self.transaction(events, tag, false).await;
    }

    async fn insert_padded(
        &mut self,
        message_id: &str,
        key: &str,
        seq: u32,
        topic: &str,
        pad_bytes: usize,
    ) {
        let sql = format!(
            "INSERT INTO \"{}\" (message_id, message_type, biz_key, topic, payload, headers) \
             VALUES ($1, $2, $3, $4, $5::text::jsonb, $6::text::jsonb)",
            self.table
        );
        let payload = format!(r#"{{"seq":{seq},"pad":"{}"}}"#, random_pad(pad_bytes));
        let headers = format!(r#"{{"seq":"{seq}"}}"#);
        let message_type = format!("order.step{seq}");
        self.client
            .execute(
                &sql,
                &[&message_id, &message_type, &key, &topic, &payload, &headers],
            )
            .await
            .expect("insert outbox row");
    }
}

/// Run as one transaction behind an advisory lock: PostgreSQL fails concurrent GRANTs on
/// one object ("tuple concurrently updated"), and parallel tests all grant on the schema.
fn serialized(sql: &str) -> String {
    format!("BEGIN;\nSELECT pg_advisory_xact_lock(7424242);\n{sql}\nCOMMIT;")
}
