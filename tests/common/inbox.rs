//! One test's inbox on PostgreSQL (`Inbox`): its own schema, topic, consumer group and
//! config, `init` as the admin role and the runtime role's grants, as README's
//! "Privileges" says; and the raw HTTP `post` the ingress tests send with.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::engine::Engine;
use super::postgres::{runtime_grants, PgServices};
use super::{free_port, metrics_section, spawn_outboxd, wait_for, Daemon};

pub fn kafka() -> String {
    PgServices::from_env().kafka
}

/// One test's inbox on PostgreSQL: its own schema (the application's, holding its effects
/// table and outboxd's tables), topic, consumer group and config.
pub struct Inbox {
    pub services: PgServices,
    pub schema: String,
    pub topic: String,
    pub port: u16,
    pub dir: std::path::PathBuf,
    /// The runtime role's config: `run` and the operator commands.
    pub config: std::path::PathBuf,
}

/// The test's own (superuser) connection: the application's and the administrator's set-up,
/// and reading what outboxd wrote.
pub async fn pg() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(
        &PgServices::from_env().pg_conn_string(),
        tokio_postgres::NoTls,
    )
    .await
    .expect("connect to the test PostgreSQL (scripts/services start)");
    tokio::spawn(connection);
    client
}

/// `name` as a PostgreSQL identifier.
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl Inbox {
    /// Writes the config (`[inbox]` and handlers in `inbox_toml`), runs `init` as the admin
    /// role and gives the runtime role its grants: `schemas/postgres/grants.sql` on
    /// outboxd's tables, and INSERT on the effects table (with USAGE on its `bigserial`
    /// sequence) for the SQL handler, as the application would.
    pub async fn new(prefix: &str, inbox_toml: &str) -> Self {
        let services = PgServices::from_env();
        let suffix: u32 = rand::random::<u32>() % 900_000 + 100_000;
        let name = format!("{prefix}_{suffix}");
        let schema = format!("ib_{name}");
        let topic = format!("inbox.{name}");
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("outboxd-inbox-{name}"));
        std::fs::create_dir_all(&dir).expect("test dir");
        let (admin, run) = (ident(&services.admin_user), ident(&services.run_user));
        let sql = pg().await;
        // The application's schema and table; the admin may create outboxd's tables there.
        sql.batch_execute(&format!(
            "CREATE SCHEMA {schema}; \
             GRANT USAGE, CREATE ON SCHEMA {schema} TO {admin}; \
             CREATE TABLE {schema}.effects (n bigserial PRIMARY KEY, message_id text, biz_key text, payload jsonb)"
        ))
        .await
        .expect("schema");
        super::create_topic_with(&kafka(), &topic, 2, &[]).await;
        let inbox_toml = inbox_toml
            .replacen("[inbox]\n", "[inbox]\ntable = \"{schema}.inbox\"\n", 1)
            .replacen(
                "[inbox.kafka]\n",
                &format!("[inbox.kafka]\nbootstrap_servers = \"{}\"\n", kafka()),
                1,
            )
            .replace("{schema}", &schema)
            .replace("{topic}", &topic)
            .replace("{name}", &name);
        // An inbox-only process: the database and [inbox], nothing of the relay's.
        let config = format!(
            r#"
{source}

[retry]
base = "300ms"
cap = "2s"
jitter = "0ms"
{metrics}
{inbox_toml}
"#,
            source = services.source_section(),
            metrics = metrics_section(port),
        );
        let path = dir.join("outboxd.toml");
        std::fs::write(&path, &config).expect("config");
        let admin_path = dir.join("outboxd-admin.toml");
        std::fs::write(&admin_path, services.as_admin(&config)).expect("admin config");
        super::init_outboxd(&admin_path);
        // `-v inbox_only=1`: the grants on the inbox table alone.
        let grants = runtime_grants(
            &services.run_user,
            &schema,
            "outbox",
            "inbox",
            "outboxd_checkpoint",
        );
        let grants: String = (grants.lines())
            .filter(|l| !l.contains("\"outbox\"") && !l.contains("\"outboxd_checkpoint\""))
            .map(|l| format!("{l}\n"))
            .collect();
        sql.batch_execute(&grants).await.expect(&grants);
        sql.batch_execute(&format!(
            "GRANT INSERT ON {schema}.effects TO {run}; \
             GRANT USAGE ON SEQUENCE {schema}.effects_n_seq TO {run}"
        ))
        .await
        .expect("the SQL handler's grants");
        Self {
            services,
            schema,
            topic,
            port,
            dir,
            config: path,
        }
    }

    pub fn run(&self, log: &str) -> Daemon {
        spawn_outboxd(&self.config, &self.dir.join(log), "info,outboxd=debug")
    }

    /// `(message_id, status, retry_count)` of every inbox row, in id order.
    pub async fn rows(&self) -> Vec<(String, String, i32)> {
        let sql = format!(
            "SELECT message_id, status, retry_count FROM {}.inbox ORDER BY id",
            self.schema
        );
        let rows = pg().await.query(&sql, &[]).await.expect("inbox rows");
        rows.iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }

    /// `message_id` of every effect of the SQL handler, in order.
    pub async fn effects(&self) -> Vec<String> {
        let sql = format!("SELECT message_id FROM {}.effects ORDER BY n", self.schema);
        let rows = pg().await.query(&sql, &[]).await.expect("effects");
        rows.iter().map(|r| r.get(0)).collect()
    }

    /// Waits until outboxd answers HTTP.
    pub async fn wait_ready(&self) {
        let port = self.port;
        wait_for("the endpoint", Duration::from_secs(30), || async move {
            super::http_get(port, "/healthz").await.map(|_| ())
        })
        .await;
    }

    /// Runs `sql` as the admin role (the owner of outboxd's tables).
    pub async fn as_admin(&self, sql: &str) {
        let admin = ident(&self.services.admin_user);
        let script = format!("SET ROLE {admin};\n{sql};\nRESET ROLE;");
        pg().await.batch_execute(&script).await.expect(sql);
    }

    /// Waits until `n` inbox rows are DONE and older than `dedupe_retention` (1 s), then
    /// runs `outboxd janitor --inbox --older-than 1s --json` with `args` as the runtime
    /// role: its report.
    pub async fn janitor(&self, n: i64, args: &[&str]) -> serde_json::Value {
        let old = format!(
            "SELECT count(*) FROM {}.inbox WHERE status = 'DONE' \
             AND processed_at < now() - interval '1 second' \
             AND created_at < now() - interval '1 second'",
            self.schema
        );
        wait_for("rows past the window", Duration::from_secs(30), || async {
            let row = pg().await.query_one(&old, &[]).await.expect("old rows");
            (row.get::<_, i64>(0) == n).then_some(())
        })
        .await;
        let mut command = vec!["janitor", "--inbox", "--older-than", "1s", "--json"];
        command.extend_from_slice(args);
        let out = super::run_outboxd(&self.config, &command);
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("janitor JSON")
    }

    pub async fn cleanup(&self) {
        let _ = pg()
            .await
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema))
            .await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `POST path` with `headers` and `body`: (status, body).
pub async fn post(port: u16, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    // A server refusing early may close before the whole body is written.
    let _ = stream.write_all(body).await;
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply).await;
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = reply.split_once("\r\n\r\n").map(|(_, b)| b.to_owned());
    (status, body.unwrap_or_default())
}
