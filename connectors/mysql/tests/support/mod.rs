//! Shared set-up of the connector's tests: the MariaDB (or MySQL) started by
//! `scripts/services`, read from `OUTBOXD_TEST_MYSQL_*`, names unique per test.

#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder};
use outboxd_connector::{ChangeItem, ChangeStream, OutboxLayout};
use outboxd_mysql::{MysqlConfig, MysqlConnector, SslMode};

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

pub fn config() -> MysqlConfig {
    MysqlConfig {
        host: env_or("OUTBOXD_TEST_MYSQL_HOST", "127.0.0.1"),
        port: env_or("OUTBOXD_TEST_MYSQL_PORT", "33306")
            .parse()
            .expect("OUTBOXD_TEST_MYSQL_PORT"),
        user: env_or("OUTBOXD_TEST_MYSQL_USER", "outboxd"),
        password: Some(env_or("OUTBOXD_TEST_MYSQL_PASSWORD", "outboxd")),
        database: env_or("OUTBOXD_TEST_MYSQL_DATABASE", "outboxd"),
        server_id: 1000 + rand_u32() % 1_000_000,
        sslmode: SslMode::Disable,
        connect_timeout: Duration::from_secs(10),
        heartbeat: Duration::from_secs(1),
    }
}

pub fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish() as u32
}

/// A connector with its own pipeline, outbox and checkpoint rows.
pub struct Fixture {
    pub connector: MysqlConnector,
    pub name: String,
    pub table: String,
}

impl Fixture {
    pub fn new(prefix: &str) -> Self {
        let name = format!("{prefix}_{}", rand_u32() % 1_000_000);
        let table = format!("outbox_{name}");
        let layout = OutboxLayout {
            outbox_table: table.clone(),
            ..OutboxLayout::default()
        };
        let connector = MysqlConnector::new(config(), &name, layout).expect("connector");
        Self {
            connector,
            name,
            table,
        }
    }

    pub async fn sql(&self) -> Conn {
        let c = self.connector.config();
        let opts = OptsBuilder::default()
            .ip_or_hostname(c.host.clone())
            .tcp_port(c.port)
            .user(Some(c.user.clone()))
            .pass(c.password.clone())
            .db_name(Some(c.database.clone()))
            .prefer_socket(false);
        Conn::new(opts)
            .await
            .expect("connect to the test MariaDB (is `scripts/services start` running?)")
    }

    /// `INSERT` of one outbox row (not committed by itself inside a transaction).
    pub fn insert_sql(&self, key: &str, seq: u32, tag: &str) -> String {
        format!(
            "INSERT INTO `{}` (message_id, message_type, biz_key, payload, headers) VALUES \
             ('{tag}-{key}-{seq}', 'order.step{seq}', '{key}', '{{\"key\": \"{key}\", \"seq\": {seq}}}', \
             '{{\"seq\": \"{seq}\", \"trace\": \"t-{key}\"}}')",
            self.table
        )
    }

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
    }
}

/// The next transaction of the stream, skipping progress, within `timeout`.
pub async fn next_transaction<S: ChangeStream>(
    stream: &mut S,
    timeout: Duration,
) -> outboxd_connector::CommittedTransaction {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let item = tokio::time::timeout(left, stream.next())
            .await
            .expect("timed out waiting for a transaction")
            .expect("stream item");
        if let ChangeItem::Transaction(txn) = item {
            return txn;
        }
    }
}
