//! Shared set-up of the connector's tests: the MariaDB (or MySQL) started by
//! `scripts/services`, read from `OUTBOXD_TEST_MYSQL_*`, names unique per test.

#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder};
use outboxd_conformance::services::env_or;
use outboxd_connector::{ChangeItem, ChangeStream, Connector, OutboxLayout, ReadMode};
use outboxd_mysql::{MysqlConfig, MysqlConnector, SslMode};

pub fn config() -> MysqlConfig {
    MysqlConfig {
        host: env_or("OUTBOXD_TEST_MYSQL_HOST", "127.0.0.1"),
        port: env_or("OUTBOXD_TEST_MYSQL_PORT", "23306")
            .parse()
            .expect("OUTBOXD_TEST_MYSQL_PORT"),
        user: env_or("OUTBOXD_TEST_MYSQL_USER", "outboxd"),
        password: Some(env_or("OUTBOXD_TEST_MYSQL_PASSWORD", "outboxd").into()),
        password_file: None,
        database: env_or("OUTBOXD_TEST_MYSQL_DATABASE", "outboxd"),
        server_id: 1000 + rand_u32() % 1_000_000,
        sslmode: SslMode::Disable,
        sslrootcert: None,
        sslcert: None,
        sslkey: None,
        allow_insecure_password: false,
        connect_timeout: Duration::from_secs(10),
        heartbeat: Duration::from_secs(1),
    }
}

/// `config` logging in as the user of `OUTBOXD_TEST_MYSQL_<ROLE>_USER` and `…_PASSWORD`
/// (`ADMIN`, `RUN`; defaults `outboxd_<role>` for both): README's "Privileges".
pub fn as_role(config: &MysqlConfig, role: &str) -> MysqlConfig {
    let default = format!("outboxd_{}", role.to_lowercase());
    let var = |name: &str| env_or(&format!("OUTBOXD_TEST_MYSQL_{role}_{name}"), &default);
    MysqlConfig {
        user: var("USER"),
        password: Some(var("PASSWORD").into()),
        ..config.clone()
    }
}

/// `schemas/mysql/grants.sql`, what the administrator runs after `init`.
const GRANTS_SQL: &str = include_str!("../../../../schemas/mysql/grants.sql");

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
    /// Under [`Fixture::least_privilege`]: the admin user's connector (runs `init`) and
    /// the runtime user's name (`connector` logs in as it).
    roles: Option<(MysqlConnector, String)>,
}

impl Fixture {
    pub fn new(prefix: &str) -> Self {
        let name = format!("{prefix}_{}", rand_u32() % 1_000_000);
        let table = format!("outbox_{name}");
        let layout = OutboxLayout {
            outbox_tables: vec![table.clone()],
            ..OutboxLayout::default()
        };
        let connector = MysqlConnector::new(config(), &name, layout).expect("connector");
        Self {
            connector,
            name,
            table,
            roles: None,
        }
    }

    /// As [`Fixture::new`], run as README's "Privileges" says: [`Fixture::init`] as the
    /// admin user, then `schemas/mysql/grants.sql`; `connector` as the runtime user.
    pub fn least_privilege(prefix: &str) -> Self {
        let mut f = Self::new(prefix);
        let layout = f.connector.layout().clone();
        let connector = |role| {
            let config = as_role(f.connector.config(), role);
            MysqlConnector::new(config, &f.name, layout.clone()).expect("connector")
        };
        let (run, admin) = (connector("RUN"), connector("ADMIN"));
        let run_user = run.config().user.clone();
        f.connector = run;
        f.roles = Some((admin, run_user));
        f
    }

    /// `init` (log mode) as the admin user, then the runtime user's grants on this
    /// fixture's tables; under [`Fixture::new`], `init` of `connector`.
    pub async fn init(&self) -> Result<Vec<String>, outboxd_connector::ConnectorError> {
        self.init_for(ReadMode::Log).await
    }

    /// [`Fixture::init`] for `mode`.
    pub async fn init_for(
        &self,
        mode: ReadMode,
    ) -> Result<Vec<String>, outboxd_connector::ConnectorError> {
        let Some((admin, run_user)) = &self.roles else {
            return Connector::init(&self.connector, mode).await;
        };
        let report = Connector::init(admin, mode).await?;
        let layout = self.connector.layout();
        let mut conn = self.sql().await;
        for sql in runtime_grants(
            run_user,
            &self.table,
            &layout.inbox_table,
            &layout.checkpoint_table,
        ) {
            conn.query_drop(&sql).await.expect(&sql);
        }
        Ok(report)
    }

    /// The test's own connection (the test user of `OUTBOXD_TEST_MYSQL_USER`, whoever the
    /// connector logs in as).
    pub async fn sql(&self) -> Conn {
        let c = self.connector.config();
        let own = config();
        let opts = OptsBuilder::default()
            .ip_or_hostname(c.host.clone())
            .tcp_port(c.port)
            .user(Some(own.user))
            .pass(own.password.as_ref().map(|p| p.expose().to_owned()))
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
        if let Some((_, run_user)) = &self.roles {
            // MySQL keeps a table's grants after the table is dropped.
            let revoke = format!(
                "REVOKE ALL PRIVILEGES ON `{}` FROM '{run_user}'@'%'",
                self.table
            );
            let _ = conn.query_drop(revoke).await;
        }
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
    // A large transaction comes in parts: their rows, then the end's.
    let mut rows = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let item = tokio::time::timeout(left, stream.next())
            .await
            .expect("timed out waiting for a transaction")
            .expect("stream item");
        match item {
            ChangeItem::Transaction(mut txn) => {
                rows.append(&mut txn.events);
                txn.events = rows;
                return txn;
            }
            ChangeItem::Part(mut part) => rows.append(&mut part.events),
            ChangeItem::Progress(_) => {}
        }
    }
}

/// A loopback TCP proxy to the test server that a test can freeze: bytes stop moving both
/// ways and the sockets stay open, as when the host of one side vanished.
pub struct Proxy {
    pub port: u16,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    pub async fn start(upstream: (String, u16)) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a proxy port");
        let port = listener.local_addr().expect("proxy address").port();
        let frozen = Arc::new(AtomicBool::new(false));
        let flag = frozen.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(upstream.clone()).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                for (mut from, mut to) in [
                    (
                        Box::new(cr) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
                        Box::new(sw) as Box<dyn tokio::io::AsyncWrite + Unpin + Send>,
                    ),
                    (Box::new(sr), Box::new(cw)),
                ] {
                    let flag = flag.clone();
                    tokio::spawn(async move {
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = from.read(&mut buf).await.unwrap_or(0);
                            while flag.load(Ordering::SeqCst) {
                                // Frozen: hold the bytes and the sockets (a close on
                                // one side is not passed on either), forever.
                                tokio::time::sleep(Duration::from_secs(3600)).await;
                            }
                            if n == 0 || to.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    });
                }
            }
        });
        Self { port, frozen }
    }

    /// From now on nothing passes, and nothing is closed.
    pub fn freeze(&self) {
        self.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
