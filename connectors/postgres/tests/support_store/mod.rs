//! Shared by tests/store.rs, tests/admin.rs and tests/conformance.rs: a uniquely named
//! set of tables, publication and slot on the test PostgreSQL (`OUTBOXD_TEST_PG_*`, see
//! `scripts/services env`), removed again when the fixture is dropped, also after a panic.
//! [`Fixture::least_privilege`] runs the connector as README's "Privileges" says: `init`
//! as the admin role (`OUTBOXD_TEST_PG_ADMIN_*`), then `schemas/postgres/grants.sql`, and
//! everything else as the runtime role (`OUTBOXD_TEST_PG_RUN_*`); the test's own SQL
//! (`client`) stays with the test's role.
#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outboxd_connector::{Connector, ConnectorError, OutboxLayout, ReadMode};
use outboxd_postgres::{PostgresConfig, PostgresConnector, SslMode};
use tokio_postgres::{Client, NoTls};

/// Where the test server is.
#[derive(Clone, Debug)]
pub struct PgEnv {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub database: String,
}

impl PgEnv {
    pub fn from_env() -> Self {
        let var = |name: &str, default: &str| {
            std::env::var(format!("OUTBOXD_TEST_PG_{name}")).unwrap_or_else(|_| default.into())
        };
        Self {
            host: var("HOST", "127.0.0.1"),
            port: var("PORT", "25432")
                .parse()
                .expect("OUTBOXD_TEST_PG_PORT is a port number"),
            user: var("USER", "outboxd"),
            password: var("PASSWORD", "outboxd"),
            database: var("DATABASE", "outboxd"),
        }
    }

    /// The same server, logged in as the role of `OUTBOXD_TEST_PG_<ROLE>_USER` and
    /// `…_PASSWORD` (`ADMIN`, `RUN`; defaults: `outboxd_<role>` for both).
    pub fn role(&self, role: &str) -> Self {
        let default = format!("outboxd_{}", role.to_lowercase());
        let var = |name: &str| {
            std::env::var(format!("OUTBOXD_TEST_PG_{role}_{name}"))
                .unwrap_or_else(|_| default.clone())
        };
        Self {
            user: var("USER"),
            password: var("PASSWORD"),
            ..self.clone()
        }
    }

    pub fn config(&self) -> PostgresConfig {
        PostgresConfig {
            host: self.host.clone(),
            port: self.port,
            user: self.user.clone(),
            password: Some(self.password.clone().into()),
            password_file: None,
            database: self.database.clone(),
            sslmode: SslMode::Disable,
            sslrootcert: None,
            sslcert: None,
            sslkey: None,
            allow_insecure_password: false,
            slot: None,
            publication: None,
            slot_failover: false,
            status_interval: Duration::from_secs(10),
            silence_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
        }
    }

    pub async fn client(&self) -> Client {
        let mut config = tokio_postgres::Config::new();
        config
            .host(&self.host)
            .port(self.port)
            .user(&self.user)
            .password(&self.password)
            .dbname(&self.database);
        let (client, connection) = config.connect(NoTls).await.unwrap_or_else(|e| {
            panic!(
                "cannot connect to the test PostgreSQL at {}:{} ({e}); start it with \
                 `scripts/services start postgres` and `eval \"$(scripts/services env)\"`",
                self.host, self.port
            )
        });
        tokio::spawn(connection);
        client
    }
}

/// A name no other test (or test run) uses: lower-case, digits and `_`.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{nanos:x}_{n}", std::process::id())
}

/// `schemas/postgres/grants.sql`, what the administrator runs after `init`.
const GRANTS_SQL: &str = include_str!("../../../../schemas/postgres/grants.sql");

/// `GRANTS_SQL` for the tables in `schema` (with their default names) and `run_role`, as
/// psql would run it.
pub fn runtime_grants(run_role: &str, schema: &str) -> String {
    let quote = |name: &str| format!("\"{}\"", name.replace('"', "\"\""));
    let grants = GRANTS_SQL
        .lines()
        .filter(|l| !l.starts_with('\\'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace(":\"run_role\"", &quote(run_role))
        .replace(":\"schema\"", &quote(schema))
        .replace(":\"outbox_table\"", "outbox")
        .replace(":\"inbox_table\"", "inbox")
        .replace(":\"checkpoint_table\"", "outboxd_checkpoint");
    serialized(&grants)
}

/// One test's schema (holding outbox, inbox and checkpoint tables), publication and slot.
pub struct Fixture {
    pub env: PgEnv,
    pub schema: String,
    pub slot: String,
    /// What the test exercises: under [`Fixture::least_privilege`] the runtime role's.
    pub connector: PostgresConnector,
    /// What runs `init`: under [`Fixture::least_privilege`] the admin role's, else
    /// `connector` again.
    pub admin: PostgresConnector,
    /// The runtime role, under [`Fixture::least_privilege`].
    pub run_role: Option<String>,
    pub client: Client,
}

impl Fixture {
    pub async fn new(prefix: &str) -> Self {
        Self::with_env(PgEnv::from_env(), prefix).await
    }

    /// As [`Fixture::new`], the connector logged in as the runtime role and `init`
    /// ([`Fixture::init`]) run as the admin role.
    pub async fn least_privilege(prefix: &str) -> Self {
        let env = PgEnv::from_env();
        let (admin, run) = (env.role("ADMIN"), env.role("RUN"));
        let mut fx = Self::with_env(env, prefix).await;
        fx.connector = fx.connector_for(&run);
        fx.admin = fx.connector_for(&admin);
        fx.run_role = Some(run.user);
        fx
    }

    /// A connector to this fixture's tables, slot and publication logging in from `env`.
    fn connector_for(&self, env: &PgEnv) -> PostgresConnector {
        let mut config = env.config();
        config.slot = Some(self.slot.clone());
        config.publication = Some(self.slot.clone());
        PostgresConnector::new(config, &self.slot, self.layout()).expect("valid names")
    }

    fn layout(&self) -> OutboxLayout {
        let schema = &self.schema;
        OutboxLayout {
            outbox_tables: vec![format!("{schema}.outbox")],
            inbox_table: format!("{schema}.inbox"),
            checkpoint_table: format!("{schema}.outboxd_checkpoint"),
            key_column: "biz_key".into(),
            ..OutboxLayout::default()
        }
    }

    /// `init` for `mode` as `admin`, then (under [`Fixture::least_privilege`]) the runtime
    /// role's grants of `schemas/postgres/grants.sql`, run by the test's role.
    pub async fn init(&self, mode: ReadMode) -> Result<Vec<String>, ConnectorError> {
        let report = Connector::init(&self.admin, mode).await?;
        if let Some(run_role) = &self.run_role {
            let grants = runtime_grants(run_role, &self.schema);
            self.client.batch_execute(&grants).await.expect(&grants);
        }
        Ok(report)
    }

    pub async fn with_env(env: PgEnv, prefix: &str) -> Self {
        let name = unique(prefix);
        let schema = format!("t_{name}");
        let layout = OutboxLayout {
            outbox_tables: vec![format!("{schema}.outbox")],
            inbox_table: format!("{schema}.inbox"),
            checkpoint_table: format!("{schema}.outboxd_checkpoint"),
            key_column: "biz_key".into(),
            ..OutboxLayout::default()
        };
        let mut config = env.config();
        config.slot = Some(name.clone());
        config.publication = Some(name.clone());
        let connector = PostgresConnector::new(config, &name, layout).expect("valid names");
        let admin = connector.clone();
        let client = env.client().await;
        Self {
            env,
            schema,
            slot: name,
            connector,
            admin,
            run_role: None,
            client,
        }
    }

    /// `"t_…"."outbox"`.
    pub fn outbox(&self) -> String {
        format!("\"{}\".outbox", self.schema)
    }

    pub fn checkpoint_table(&self) -> String {
        format!("\"{}\".outboxd_checkpoint", self.schema)
    }

    /// Inserts `n` outbox rows and returns their ids.
    pub async fn insert_rows(&self, n: i32, max_retry_count: i32) -> Vec<i64> {
        let sql = format!(
            "INSERT INTO {} (message_id, message_type, biz_key, payload, max_retry_count) \
             SELECT 'm-' || gen_random_uuid(), 'order.created', 'k-' || gen_random_uuid(), \
             jsonb_build_object('n', g), $2 FROM generate_series(1, $1) g RETURNING id",
            self.outbox()
        );
        let rows = self
            .client
            .query(&sql, &[&n, &max_retry_count])
            .await
            .expect("insert rows");
        let mut ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        ids.sort_unstable();
        ids
    }
}

impl Fixture {
    /// Inserts one INIT row per entry of `keys`, in order (each with its own message type,
    /// so a key may repeat under UNIQUE (message_type, biz_key)); returns their ids.
    pub async fn insert_keyed(&self, keys: &[&str]) -> Vec<i64> {
        let sql = format!(
            "INSERT INTO {} (message_id, message_type, biz_key, payload, headers, max_retry_count) \
             VALUES ('m-' || gen_random_uuid(), 't-' || gen_random_uuid(), $1, \
             '{{\"k\": 1}}', '{{\"trace\": \"abc\", \"n\": 7}}', 3) RETURNING id",
            self.outbox()
        );
        let mut ids = Vec::new();
        for key in keys {
            let row = self.client.query_one(&sql, &[key]).await.expect("insert");
            ids.push(row.get(0));
        }
        ids
    }

    /// Sets `status` of `ids`, with `next_retry_time = now() + <interval>` when given
    /// (e.g. `"-1 second"`), as outboxd would have left them.
    pub async fn set_status(&self, ids: &[i64], status: &str, retry_in: Option<&str>) {
        let next = match retry_in {
            Some(interval) => format!("now() + interval '{interval}'"),
            None => "NULL".into(),
        };
        let sql = format!(
            "UPDATE {} SET status = $2, next_retry_time = {next} WHERE id = ANY($1)",
            self.outbox()
        );
        self.client
            .execute(&sql, &[&ids, &status])
            .await
            .expect("set status");
    }

    pub async fn status(&self, id: i64) -> String {
        let sql = format!("SELECT status FROM {} WHERE id = $1", self.outbox());
        self.client
            .query_one(&sql, &[&id])
            .await
            .expect("status")
            .get(0)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let (env, schema, slot) = (self.env.clone(), self.schema.clone(), self.slot.clone());
        clean_up_from_drop(async move {
            let client = env.client().await;
            drop_slot(&client, &slot).await;
            let _ = client
                .batch_execute(&format!("DROP PUBLICATION IF EXISTS \"{slot}\""))
                .await;
            let _ = client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                .await;
        });
    }
}

/// Runs async cleanup from a sync `Drop` (also during a panic): on a thread with its own
/// runtime, since the test's runtime may be the one blocked in the drop.
pub fn clean_up_from_drop(cleanup: impl std::future::Future<Output = ()> + Send + 'static) {
    let thread = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(cleanup);
        }
    });
    let _ = thread.join();
}

/// Drops replication slot `slot`, ending its reader first: a stream a test left open (or
/// a panicking test left behind) is stuck while the cleanup thread blocks the test's
/// runtime, and an active slot cannot be dropped. Gives up after 10 s.
pub async fn drop_slot(client: &tokio_postgres::Client, slot: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let _ = client
            .execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND active",
                &[&slot],
            )
            .await;
        let dropped = client
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE slot_name = $1",
                &[&slot],
            )
            .await;
        // An active slot (a stream still closing) cannot be dropped yet.
        if dropped.is_ok() || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Run as one transaction behind an advisory lock: PostgreSQL fails concurrent GRANTs on
/// one object ("tuple concurrently updated"), and parallel tests all grant on the schema.
fn serialized(sql: &str) -> String {
    format!("BEGIN;\nSELECT pg_advisory_xact_lock(7424242);\n{sql}\nCOMMIT;")
}
