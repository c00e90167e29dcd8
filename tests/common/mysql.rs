//! The MariaDB side of the end-to-end harness: the server started by `scripts/services`
//! (read from `OUTBOXD_TEST_MYSQL_*`), one pipeline per test with its own outbox table,
//! checkpoint row, lock, server_id, topic and config file.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Output;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder};
use rand::Rng;

use super::{
    alter_topic, create_topic_with, env_or, init_outboxd, run_outboxd, spawn_outboxd, Daemon,
};

/// Tests that purge binlogs take this for writing; every other test holds it for reading,
/// so no pipeline of a test running beside them loses the binlog it resumes from.
static BINLOG_FILES: RwLock<()> = RwLock::new(());

pub enum BinlogGuard {
    Shared(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'static, ()>),
}

/// Where the MariaDB (or MySQL) server and Kafka are.
pub struct MysqlServices {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub database: String,
    pub kafka: String,
}

impl MysqlServices {
    pub fn from_env() -> Self {
        Self {
            host: env_or("OUTBOXD_TEST_MYSQL_HOST", "127.0.0.1"),
            port: env_or("OUTBOXD_TEST_MYSQL_PORT", "33306")
                .parse()
                .expect("OUTBOXD_TEST_MYSQL_PORT"),
            user: env_or("OUTBOXD_TEST_MYSQL_USER", "outboxd"),
            password: env_or("OUTBOXD_TEST_MYSQL_PASSWORD", "outboxd"),
            database: env_or("OUTBOXD_TEST_MYSQL_DATABASE", "outboxd"),
            kafka: env_or("OUTBOXD_TEST_KAFKA", "127.0.0.1:39092"),
        }
    }
}

/// One test's MySQL pipeline.
pub struct MysqlPipeline {
    pub services: MysqlServices,
    pub name: String,
    pub table: String,
    pub topic: String,
    pub partitions: i32,
    pub config_path: PathBuf,
    pub dir: PathBuf,
    _guard: BinlogGuard,
}

impl MysqlPipeline {
    /// Creates the topic and writes the config; `extra` is appended to the TOML.
    pub async fn new(prefix: &str, partitions: i32, extra: &str) -> Self {
        let guard = BINLOG_FILES.read().unwrap_or_else(|e| e.into_inner());
        Self::with_guard(prefix, partitions, extra, BinlogGuard::Shared(guard)).await
    }

    /// As [`MysqlPipeline::new`], alone on the server's binlog files (for purge tests).
    pub async fn exclusive(prefix: &str, partitions: i32, extra: &str) -> Self {
        let guard = BINLOG_FILES.write().unwrap_or_else(|e| e.into_inner());
        Self::with_guard(prefix, partitions, extra, BinlogGuard::Exclusive(guard)).await
    }

    async fn with_guard(prefix: &str, partitions: i32, extra: &str, guard: BinlogGuard) -> Self {
        let services = MysqlServices::from_env();
        let suffix: u32 = rand::thread_rng().gen_range(100_000..999_999);
        let server_id: u32 = rand::thread_rng().gen_range(10_000..4_000_000);
        let name = format!("my_{prefix}_{suffix}");
        let table = format!("outbox_{name}");
        let topic = format!("it.{name}");
        let dir = std::env::temp_dir().join(format!("outboxd-it-{name}"));
        std::fs::create_dir_all(&dir).expect("create test dir");
        let config_path = dir.join("outboxd.toml");
        let config = format!(
            r#"
[pipeline]
name = "{name}"

[source]
kind = "mysql"
host = "{host}"
port = {port}
user = "{user}"
password = "{password}"
database = "{database}"
server_id = {server_id}
sslmode = "disable"
heartbeat = "1s"

[outbox]
table = "{table}"
checkpoint_table = "outboxd_checkpoint"

[kafka]
bootstrap_servers = "{kafka}"
topic_template = "{topic}"
message_timeout = "10s"
{extra}
"#,
            host = services.host,
            port = services.port,
            user = services.user,
            password = services.password,
            database = services.database,
            kafka = services.kafka,
        );
        std::fs::write(&config_path, config).expect("write config");
        let pipeline = Self {
            services,
            name,
            table,
            topic,
            partitions,
            config_path,
            dir,
            _guard: guard,
        };
        pipeline.create_topic(&pipeline.topic, partitions).await;
        pipeline
    }

    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        create_topic_with(&self.services.kafka, topic, partitions, &[]).await;
    }

    /// Changes one topic-level config.
    pub async fn alter_topic(&self, topic: &str, key: &str, value: &str) {
        alter_topic(&self.services.kafka, topic, key, value).await;
    }

    /// Creates a topic with topic-level configs such as `max.message.bytes`.
    pub async fn create_topic_with(&self, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
        create_topic_with(&self.services.kafka, topic, partitions, configs).await;
    }

    /// A fresh SQL connection to the test database.
    pub async fn sql(&self) -> Conn {
        let s = &self.services;
        let opts = OptsBuilder::default()
            .ip_or_hostname(s.host.clone())
            .tcp_port(s.port)
            .user(Some(s.user.clone()))
            .pass(Some(s.password.clone()))
            .db_name(Some(s.database.clone()))
            .prefer_socket(false);
        Conn::new(opts)
            .await
            .expect("connect to the test MariaDB (is `scripts/services start` running?)")
    }

    /// Runs an outboxd subcommand to completion.
    pub fn outboxd(&self, args: &[&str]) -> Output {
        run_outboxd(&self.config_path, args)
    }

    pub fn init(&self) {
        init_outboxd(&self.config_path);
    }

    /// Starts `outboxd run` in the background; its log goes to `<dir>/<log_name>`.
    pub fn spawn_run(&self, log_name: &str) -> Daemon {
        let filter = "info,outboxd=debug,outboxd_mysql=debug";
        spawn_outboxd(&self.config_path, &self.dir.join(log_name), filter)
    }

    pub fn insert_sql(&self, key: &str, seq: u32, tag: &str) -> String {
        format!(
            "INSERT INTO `{}` (message_id, message_type, biz_key, payload, headers) VALUES \
             ('{tag}-{key}-{seq}', 'order.step{seq}', '{key}', \
             '{{\"key\": \"{key}\", \"seq\": {seq}}}', '{{\"seq\": \"{seq}\"}}')",
            self.table
        )
    }

    pub async fn insert_event(&self, conn: &mut Conn, key: &str, seq: u32, tag: &str) {
        conn.query_drop(self.insert_sql(key, seq, tag))
            .await
            .expect("insert outbox row");
    }

    /// Rows by status.
    pub async fn status_counts(&self) -> HashMap<String, i64> {
        let mut conn = self.sql().await;
        let rows: Vec<(String, i64)> = conn
            .query(format!(
                "SELECT status, COUNT(*) FROM `{}` GROUP BY status",
                self.table
            ))
            .await
            .expect("count statuses");
        let _ = conn.disconnect().await;
        rows.into_iter().collect()
    }

    /// `message_id` → (status, retry_count, last_error).
    pub async fn rows(&self) -> HashMap<String, (String, i32, Option<String>)> {
        let mut conn = self.sql().await;
        let rows: Vec<(String, String, i32, Option<String>)> = conn
            .query(format!(
                "SELECT message_id, status, retry_count, last_error FROM `{}`",
                self.table
            ))
            .await
            .expect("rows");
        let _ = conn.disconnect().await;
        rows.into_iter()
            .map(|(id, status, retries, error)| (id, (status, retries, error)))
            .collect()
    }

    pub async fn success_count(&self) -> i64 {
        self.status_counts()
            .await
            .get("SUCCESS")
            .copied()
            .unwrap_or(0)
    }

    /// The pipeline's checkpoint row.
    pub async fn checkpoint(&self) -> Option<String> {
        let mut conn = self.sql().await;
        let row: Option<String> = conn
            .query_first(format!(
                "SELECT position FROM outboxd_checkpoint WHERE pipeline = '{}'",
                self.name
            ))
            .await
            .expect("read checkpoint");
        let _ = conn.disconnect().await;
        row
    }

    /// Drops what the test created on the server side.
    pub async fn cleanup(&self) {
        let mut conn = self.sql().await;
        let _ = conn
            .query_drop(format!("DROP TABLE IF EXISTS `{}`", self.table))
            .await;
        let _ = conn
            .query_drop(format!(
                "DELETE FROM outboxd_checkpoint WHERE pipeline = '{}'",
                self.name
            ))
            .await;
        let _ = conn.disconnect().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
