//! The MariaDB side of the end-to-end harness: the server started by `scripts/services`
//! (read from `OUTBOXD_TEST_MYSQL_*`), one pipeline per test with its own outbox table,
//! checkpoint row, lock, server_id, topic and config file.

use std::collections::{BTreeMap, HashMap};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder};
use rand::Rng;

use super::engine::{random_pad, Engine, Event, Landed, OutboxRow, Pipeline, Writer};
use super::env_or;

/// One test's MySQL pipeline.
pub type MysqlPipeline = Pipeline<MysqlServices>;

/// Tests that purge binlogs take this for writing; every other test holds it for reading,
/// so no pipeline of a test running beside them loses the binlog it resumes from.
static BINLOG_FILES: RwLock<()> = RwLock::new(());

pub enum BinlogGuard {
    Shared(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'static, ()>),
}

/// Where the MariaDB (or MySQL) server and Kafka are, and this test's hold on the
/// server's binlog files.
/// `user` is the test's own user for its SQL; outboxd runs as `run_user`, and `init` as
/// `admin_user` (README, "Privileges").
pub struct MysqlServices {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub database: String,
    pub run_user: String,
    pub run_password: String,
    pub admin_user: String,
    pub admin_password: String,
    pub kafka: String,
    _binlog: BinlogGuard,
}

impl MysqlServices {
    fn with_guard(guard: BinlogGuard) -> Self {
        Self {
            host: env_or("OUTBOXD_TEST_MYSQL_HOST", "127.0.0.1"),
            port: env_or("OUTBOXD_TEST_MYSQL_PORT", "23306")
                .parse()
                .expect("OUTBOXD_TEST_MYSQL_PORT"),
            user: env_or("OUTBOXD_TEST_MYSQL_USER", "outboxd"),
            password: env_or("OUTBOXD_TEST_MYSQL_PASSWORD", "outboxd"),
            database: env_or("OUTBOXD_TEST_MYSQL_DATABASE", "outboxd"),
            run_user: env_or("OUTBOXD_TEST_MYSQL_RUN_USER", "outboxd_run"),
            run_password: env_or("OUTBOXD_TEST_MYSQL_RUN_PASSWORD", "outboxd_run"),
            admin_user: env_or("OUTBOXD_TEST_MYSQL_ADMIN_USER", "outboxd_admin"),
            admin_password: env_or("OUTBOXD_TEST_MYSQL_ADMIN_PASSWORD", "outboxd_admin"),
            kafka: env_or("OUTBOXD_TEST_KAFKA", "127.0.0.1:29092"),
            _binlog: guard,
        }
    }

    /// A fresh SQL connection to the test database.
    pub async fn sql(&self) -> Conn {
        let opts = OptsBuilder::default()
            .ip_or_hostname(self.host.clone())
            .tcp_port(self.port)
            .user(Some(self.user.clone()))
            .pass(Some(self.password.clone()))
            .db_name(Some(self.database.clone()))
            .prefer_socket(false);
        Conn::new(opts)
            .await
            .expect("connect to the test MariaDB (is `scripts/services start` running?)")
    }
}

/// `schemas/mysql/grants.sql`, applied by the tests after every `init`.
const GRANTS_SQL: &str = include_str!("../../schemas/mysql/grants.sql");

/// The statements of `GRANTS_SQL` for these tables and user.
pub fn runtime_grants(run_user: &str, outbox: &str, inbox: &str, checkpoint: &str) -> Vec<String> {
    let body: String = GRANTS_SQL
        .lines()
        .filter(|l| !l.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    body.replace("`outbox`", &format!("`{outbox}`"))
        .replace("`inbox`", &format!("`{inbox}`"))
        .replace("`outboxd_checkpoint`", &format!("`{checkpoint}`"))
        .replace("'outboxd_run'", &format!("'{run_user}'"))
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The grant `schemas/mysql/grants.sql` gives (commented) for `[canary]`, for `outbox`.
pub fn canary_grant(run_user: &str, outbox: &str) -> String {
    let line = GRANTS_SQL
        .lines()
        .find_map(|l| l.strip_prefix("-- GRANT INSERT ON `outbox`"))
        .expect("grants.sql has the canary's line");
    format!("GRANT INSERT ON `{outbox}`{line}")
        .replace("'outboxd_run'", &format!("'{run_user}'"))
        .trim_end_matches(';')
        .to_owned()
}

/// `INSERT` of one [`Event`] into `table`.
fn insert_sql(table: &str, key: &str, seq: u32, tag: &str) -> String {
    format!(
        "INSERT INTO `{table}` (message_id, message_type, biz_key, payload, headers) VALUES \
         ('{tag}-{key}-{seq}', 'order.step{seq}', '{key}', \
         '{{\"key\": \"{key}\", \"seq\": {seq}}}', '{{\"seq\": \"{seq}\"}}')"
    )
}

impl Engine for MysqlServices {
    type Writer = MysqlWriter;

    const NAME: &'static str = "mysql";
    const NAME_PREFIX: &'static str = "my_";
    const LOG_FILTER: &'static str = "info,outboxd=debug,outboxd_mysql=debug";
    const CHECKPOINT_PREFIX: &'static str = "binlog:";
    const CREATED_AT_SUFFIX: &'static str = "+00:00";
    const STANDBY_WAITING: &'static [&'static str] =
        &["is held by another outboxd (connection id", "retrying"];
    const CHECK_ITEMS: &'static [&'static str] = &[
        "binlog_format",
        "binlog_row_image",
        "server_id",
        "grants",
        "checkpoint",
    ];
    const NULLABLE_MESSAGE_TYPE: &'static str =
        "ALTER TABLE {table} MODIFY message_type VARCHAR(255) NULL";

    fn from_env() -> Self {
        let guard = BINLOG_FILES.read().unwrap_or_else(|e| e.into_inner());
        Self::with_guard(BinlogGuard::Shared(guard))
    }

    fn kafka(&self) -> &str {
        &self.kafka
    }

    fn source_section(&self) -> String {
        let server_id: u32 = rand::thread_rng().gen_range(10_000..4_000_000);
        format!(
            r#"[source]
kind = "mysql"
host = "{}"
port = {}
user = "{}"
password = "{}"
database = "{}"
server_id = {server_id}
sslmode = "disable"
heartbeat = "1s""#,
            self.host, self.port, self.run_user, self.run_password, self.database
        )
    }

    fn as_admin(&self, config: &str) -> String {
        let login =
            |user: &str, password: &str| format!("user = \"{user}\"\npassword = \"{password}\"\n");
        let run = login(&self.run_user, &self.run_password);
        assert!(config.contains(&run), "the runtime login in:\n{config}");
        config.replacen(&run, &login(&self.admin_user, &self.admin_password), 1)
    }

    async fn grant_runtime(p: &MysqlPipeline) {
        let mut conn = p.sql().await;
        for sql in runtime_grants(
            &p.services.run_user,
            &p.table,
            "inbox",
            "outboxd_checkpoint",
        ) {
            conn.query_drop(&sql).await.expect(&sql);
        }
        let _ = conn.disconnect().await;
    }

    async fn grant_canary(p: &MysqlPipeline) {
        let mut conn = p.sql().await;
        let sql = canary_grant(&p.services.run_user, &p.table);
        conn.query_drop(&sql).await.expect(&sql);
        let _ = conn.disconnect().await;
    }

    async fn writer(p: &MysqlPipeline) -> MysqlWriter {
        MysqlWriter {
            conn: p.sql().await,
            table: p.table.clone(),
        }
    }

    async fn status_counts(p: &MysqlPipeline) -> HashMap<String, i64> {
        let mut conn = p.sql().await;
        let rows: Vec<(String, i64)> = conn
            .query(format!(
                "SELECT status, COUNT(*) FROM `{}` GROUP BY status",
                p.table
            ))
            .await
            .expect("count statuses");
        let _ = conn.disconnect().await;
        rows.into_iter().collect()
    }

    async fn rows(p: &MysqlPipeline) -> BTreeMap<String, OutboxRow> {
        let mut conn = p.sql().await;
        let rows: Vec<(String, String, i32, Option<String>)> = conn
            .query(format!(
                "SELECT message_id, status, retry_count, last_error FROM `{}`",
                p.table
            ))
            .await
            .expect("rows");
        let _ = conn.disconnect().await;
        rows.into_iter()
            .map(|(id, status, retry_count, last_error)| {
                let row = OutboxRow {
                    status,
                    retry_count,
                    last_error,
                };
                (id, row)
            })
            .collect()
    }

    async fn landed(p: &MysqlPipeline) -> Vec<Landed> {
        let mut conn = p.sql().await;
        let landed = conn
            .query(format!(
                "SELECT kafka_partition, kafka_offset, message_id, sent_at IS NOT NULL FROM `{}`",
                p.table
            ))
            .await
            .expect("landed");
        let _ = conn.disconnect().await;
        landed
    }

    async fn checkpoint(p: &MysqlPipeline) -> Option<String> {
        let mut conn = p.sql().await;
        let row: Option<String> = conn
            .query_first(format!(
                "SELECT position FROM outboxd_checkpoint WHERE pipeline = '{}'",
                p.name
            ))
            .await
            .expect("read checkpoint");
        let _ = conn.disconnect().await;
        row
    }

    async fn execute(p: &MysqlPipeline, sql: &str) {
        p.sql().await.query_drop(sql).await.expect(sql);
    }

    async fn revoke_outbox_update(p: &MysqlPipeline) {
        let sql = format!(
            "REVOKE UPDATE ON `{}` FROM '{}'@'%'",
            p.table, p.services.run_user
        );
        Self::execute(p, &sql).await;
    }

    async fn execute_as_admin(p: &MysqlPipeline, sql: &str) {
        // MySQL has no owners: the admin's database-level grants cover what anyone creates.
        Self::execute(p, sql).await;
        Self::grant_runtime(p).await;
    }

    async fn row_id(p: &MysqlPipeline, message_id: &str) -> i64 {
        let mut conn = p.sql().await;
        let id: Option<i64> = conn
            .query_first(format!(
                "SELECT id FROM `{}` WHERE message_id = '{message_id}'",
                p.table
            ))
            .await
            .expect("row id");
        let _ = conn.disconnect().await;
        id.expect("the row exists")
    }

    async fn hold_checkpoint_row(p: &MysqlPipeline) -> tokio::sync::oneshot::Sender<()> {
        let mut conn = p.sql().await;
        conn.query_drop("START TRANSACTION").await.expect("begin");
        conn.query_drop(format!(
            "SELECT 1 FROM outboxd_checkpoint WHERE pipeline = '{}' FOR UPDATE",
            p.name
        ))
        .await
        .expect("lock the checkpoint row");
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = released.await;
            let _ = conn.query_drop("ROLLBACK").await;
            let _ = conn.disconnect().await;
        });
        release
    }

    async fn cleanup(p: &MysqlPipeline) {
        let mut conn = p.sql().await;
        // MySQL keeps a table's grants after the table is dropped.
        let _ = conn
            .query_drop(format!(
                "REVOKE ALL PRIVILEGES ON `{}` FROM '{}'@'%'",
                p.table, p.services.run_user
            ))
            .await;
        let _ = conn
            .query_drop(format!("DROP TABLE IF EXISTS `{}`", p.table))
            .await;
        let _ = conn
            .query_drop(format!(
                "DELETE FROM outboxd_checkpoint WHERE pipeline = '{}'",
                p.name
            ))
            .await;
        let _ = conn.disconnect().await;
    }
}

impl MysqlPipeline {
    /// As [`Pipeline::new`], alone on the server's binlog files (for purge tests).
    pub async fn exclusive(prefix: &str, partitions: i32, extra: &str) -> Self {
        let guard = BINLOG_FILES.write().unwrap_or_else(|e| e.into_inner());
        let services = MysqlServices::with_guard(BinlogGuard::Exclusive(guard));
        Self::on(services, prefix, partitions, extra).await
    }

    /// A fresh SQL connection to the test database.
    pub async fn sql(&self) -> Conn {
        self.services.sql().await
    }

    pub fn insert_sql(&self, key: &str, seq: u32, tag: &str) -> String {
        insert_sql(&self.table, key, seq, tag)
    }

    pub async fn insert_event(&self, conn: &mut Conn, key: &str, seq: u32, tag: &str) {
        conn.query_drop(self.insert_sql(key, seq, tag))
            .await
            .expect("insert outbox row");
    }
}

/// A MariaDB connection writing one pipeline's outbox.
pub struct MysqlWriter {
    conn: Conn,
    table: String,
}

impl MysqlWriter {
    /// One multi-statement round trip: `START TRANSACTION; INSERT …; … <end>`.
    async fn transaction(&mut self, events: &[Event], tag: &str, end: &str) {
        let mut sql = String::from("START TRANSACTION;");
        for (key, seq) in events {
            sql.push_str(&insert_sql(&self.table, key, *seq, tag));
            sql.push(';');
        }
        sql.push_str(end);
        self.conn.query_drop(sql).await.expect("writer transaction");
    }
}

impl Writer for MysqlWriter {
    async fn commit(&mut self, events: &[Event], tag: &str) {
        self.transaction(events, tag, "COMMIT").await;
    }

    async fn roll_back(&mut self, events: &[Event], tag: &str) {
        self.transaction(events, tag, "ROLLBACK").await;
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
            "INSERT INTO `{}` (message_id, message_type, biz_key, topic, payload, headers) \
             VALUES ('{message_id}', 'order.step{seq}', '{key}', '{topic}', \
             '{{\"seq\": {seq}, \"pad\": \"{}\"}}', '{{\"seq\": \"{seq}\"}}')",
            self.table,
            random_pad(pad_bytes)
        );
        self.conn.query_drop(sql).await.expect("insert outbox row");
    }
}
