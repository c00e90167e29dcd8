//! The whole pattern across two databases, both directions: an outbox on one engine,
//! relayed to Kafka by one outboxd, received by a second outboxd into the inbox of the
//! other engine, whose SQL handler applies each event's effect. Each outboxd is killed -9
//! once while events flow; every event's effect must exist exactly once. Both sides run
//! as README's "Privileges" says: `init` as the admin role, `run` as the runtime role with
//! the grants of `schemas/<engine>/grants.sql` and INSERT on the handler's table.

mod common;

use std::time::Duration;

use common::engine::{Engine, Event, Pipeline, Writer};
use common::mysql::{self, MysqlServices};
use common::postgres::{self, PgServices};
use common::{spawn_outboxd, wait_for};
use mysql_async::prelude::Queryable;

/// The database of the receiving side, through its own client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Receiver {
    Postgres,
    Mariadb,
}

impl Receiver {
    async fn execute(self, sql: &str) {
        match self {
            Receiver::Postgres => {
                let services = PgServices::from_env();
                let (client, connection) =
                    tokio_postgres::connect(&services.pg_conn_string(), tokio_postgres::NoTls)
                        .await
                        .expect("connect to PostgreSQL");
                tokio::spawn(connection);
                client.batch_execute(sql).await.expect(sql);
            }
            Receiver::Mariadb => {
                let mut conn = MysqlServices::from_env().sql().await;
                conn.query_drop(sql).await.expect(sql);
            }
        }
    }

    /// One row of integers.
    async fn integers(self, sql: &str) -> Vec<i64> {
        match self {
            Receiver::Postgres => {
                let services = PgServices::from_env();
                let (client, connection) =
                    tokio_postgres::connect(&services.pg_conn_string(), tokio_postgres::NoTls)
                        .await
                        .expect("connect to PostgreSQL");
                tokio::spawn(connection);
                let row = client.query_one(sql, &[]).await.expect(sql);
                (0..row.len()).map(|i| row.get::<_, i64>(i)).collect()
            }
            Receiver::Mariadb => {
                let mut conn = MysqlServices::from_env().sql().await;
                let row: mysql_async::Row = conn.query_first(sql).await.expect(sql).expect("a row");
                (0..row.len())
                    .map(|i| row.get::<i64, usize>(i).expect("an integer"))
                    .collect()
            }
        }
    }

    /// The receiving side's `[source]`, logging in as the runtime role.
    fn source_section(self) -> String {
        match self {
            Receiver::Postgres => PgServices::from_env().source_section(),
            Receiver::Mariadb => MysqlServices::from_env().source_section(),
        }
    }

    /// `config` logging in as the admin role instead, for `init`.
    fn as_admin(self, config: &str) -> String {
        match self {
            Receiver::Postgres => PgServices::from_env().as_admin(config),
            Receiver::Mariadb => MysqlServices::from_env().as_admin(config),
        }
    }

    /// What the administrator does after `init`: the runtime role's grants of
    /// `schemas/<engine>/grants.sql` on `<outbox, inbox, checkpoint>`, and what the
    /// application gives it for the SQL handler: INSERT on its `effects` table.
    /// The runtime grants of the inbox table alone (`grants.sql`'s inbox line).
    async fn grant_inbox_runtime(self, inbox: &str, effects: &str) {
        match self {
            Receiver::Postgres => {
                let s = PgServices::from_env();
                let grants =
                    postgres::runtime_grants(&s.run_user, "public", "outbox", inbox, "ckpt");
                let grants: String = (grants.lines())
                    .filter(|l| !l.contains("\"outbox\"") && !l.contains("\"ckpt\""))
                    .map(|l| format!("{l}\n"))
                    .collect();
                self.execute(&grants).await;
                let grant = format!("GRANT INSERT ON {effects} TO \"{}\"", s.run_user);
                self.execute(&grant).await;
            }
            Receiver::Mariadb => {
                let s = MysqlServices::from_env();
                for grant in mysql::runtime_grants(&s.run_user, "outbox", inbox, "ckpt") {
                    if !grant.contains("`outbox`") && !grant.contains("`ckpt`") {
                        self.execute(&grant).await;
                    }
                }
                let grant = format!("GRANT INSERT ON `{effects}` TO '{}'@'%'", s.run_user);
                self.execute(&grant).await;
            }
        }
    }

    /// Drops `table`; on MariaDB also the runtime user's grants on it, which would outlive
    /// the table.
    async fn drop_table(self, table: &str) {
        if self == Receiver::Mariadb {
            let s = MysqlServices::from_env();
            let revoke = format!(
                "REVOKE ALL PRIVILEGES ON `{table}` FROM '{}'@'%'",
                s.run_user
            );
            let mut conn = s.sql().await;
            let _ = conn.query_drop(revoke).await;
        }
        self.execute(&format!("DROP TABLE IF EXISTS {table}")).await;
    }
}

/// How the events go from the relay to the inbox.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    /// The relay's Kafka sink; the inbox consumes the topic.
    Kafka,
    /// The relay's HTTP sink (envelope, signed) POSTs to the inbox's HTTP ingress: no
    /// Kafka on the way.
    Http,
}

/// The Standard Webhooks secret the HTTP relay signs with and the inbox verifies.
const CHAIN_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// `config`'s `[kafka]` section replaced by an `[http]` sink that POSTs to `port`'s inbox
/// source `orders`.
fn send_over_http(config_path: &std::path::Path, port: u16) {
    let config = std::fs::read_to_string(config_path).expect("read config");
    let start = config.find("\n[kafka]\n").expect("a [kafka] section");
    let end = config[start..]
        .find("message_timeout = \"10s\"\n")
        .map(|i| start + i + "message_timeout = \"10s\"\n".len())
        .expect("the harness's [kafka] section");
    let http = format!(
        "\n[http]\nbody = \"envelope\"\ntimeout = \"3s\"\n\
         [http.endpoints.default]\nurl = \"http://127.0.0.1:{port}/v1/inbox/orders\"\n\
         secrets = [\"{CHAIN_SECRET}\"]\nopen_after = 3\n"
    );
    let config = format!("{}{http}{}", &config[..start], &config[end..]);
    std::fs::write(config_path, config).expect("write config");
}

/// Relays `Src`'s outbox into `receiver`'s inbox `via` Kafka or HTTP; kills each outboxd
/// midway (the relay twice over HTTP).
async fn events_cross_once_with_both_killed<Src: Engine>(
    receiver: Receiver,
    via: Via,
    prefix: &str,
) {
    let relay = Pipeline::<Src>::new(prefix, 2, "").await;
    let inbox_port = common::free_port();
    if via == Via::Http {
        send_over_http(&relay.config_path, inbox_port);
    }
    relay.init();
    // Over Kafka the relay starts first (the topic holds what the inbox has not read);
    // over HTTP once the inbox answers.
    let mut relay_daemon = (via == Via::Kafka).then(|| relay.spawn_run("relay-1.log"));

    let name = format!("in_{}", relay.name);
    let effects = format!("effects_{name}");
    receiver
        .execute(&format!(
            "CREATE TABLE {effects} (message_id VARCHAR(255) NOT NULL, biz_key VARCHAR(255) NOT NULL)"
        ))
        .await;
    let config = relay.dir.join("inbox.toml");
    std::fs::write(
        &config,
        format!(
            r#"
{source}

[retry]
base = "200ms"
cap = "1s"
jitter = "0ms"

[inbox]
table = "inbox_{name}"
workers = 4
claim_timeout = "5s"
idle_check = "500ms"

{ingress}

[inbox.handlers.default]
kind = "sql"
statement = "INSERT INTO {effects} (message_id, biz_key) VALUES (:message_id, :biz_key)"
"#,
            source = receiver.source_section(),
            ingress = match via {
                Via::Kafka => format!(
                    "[inbox.kafka]\nbootstrap_servers = \"{}\"\ntopics = [\"{}\"]\n\
                     group_id = \"it-{name}\"\n",
                    relay.services.kafka(),
                    relay.topic
                ),
                Via::Http => format!(
                    "{}[inbox.http.secrets]\norders = [\"{CHAIN_SECRET}\"]\n\
                     [inbox.http.sources.orders]\nkey_field = \"key\"\n",
                    common::metrics_section(inbox_port)
                ),
            },
        ),
    )
    .expect("inbox config");
    let admin_config = relay.dir.join("inbox-admin.toml");
    let text = std::fs::read_to_string(&config).expect("inbox config");
    std::fs::write(&admin_config, receiver.as_admin(&text)).expect("admin config");
    // An inbox-only process (the database and [inbox], nothing of the relay's): `init`
    // creates its inbox table alone, `check` and `schema` look at it alone, and the
    // runtime role needs grants on it alone.
    let inbox = format!("inbox_{name}");
    let init = common::run_outboxd(&admin_config, &["init"]);
    let said = String::from_utf8_lossy(&init.stdout).into_owned();
    assert!(
        init.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 2, "{said}");
    assert_eq!(lines[0], format!("created table {inbox}"), "{said}");
    assert!(
        lines[1].starts_with("inbox only: no outbox relay"),
        "{said}"
    );
    let schema = common::run_outboxd(&admin_config, &["schema"]);
    let script = String::from_utf8_lossy(&schema.stdout).into_owned();
    assert!(
        script.contains("inbox only") && script.contains(&inbox),
        "{script}"
    );
    assert!(!script.to_lowercase().contains("outbox_"), "{script}");
    receiver.grant_inbox_runtime(&inbox, &effects).await;
    let check = common::run_outboxd(&config, &["check"]);
    let report = String::from_utf8_lossy(&check.stdout).into_owned();
    assert!(check.status.success(), "{report}");
    assert!(report.contains("] inbox table"), "{report}");
    let relay_lines = [
        "] kafka",
        "] replication",
        "] binlog",
        "] outbox",
        "] checkpoint",
    ];
    assert!(
        !report
            .lines()
            .any(|l| relay_lines.iter().any(|r| l.contains(r))),
        "{report}"
    );
    let mut inbox_daemon = spawn_outboxd(
        &config,
        &relay.dir.join("inbox-1.log"),
        "info,outboxd=debug",
    );
    let mut relay_daemon = match relay_daemon.take() {
        Some(daemon) => daemon,
        None => {
            wait_for("the inbox's /readyz", Duration::from_secs(30), || async {
                let ready = common::http_get(inbox_port, "/readyz").await;
                ready.filter(|(status, _)| *status == 200).map(|_| ())
            })
            .await;
            relay.spawn_run("relay-1.log")
        }
    };

    let mut writer = relay.writer().await;
    let total: u32 = 300;
    let keys = 15;
    let mut written = 0;
    for batch in 0..30u32 {
        let events: Vec<Event> = (0..10u32)
            .map(|i| {
                let n = batch * 10 + i;
                (format!("k{}", n % keys), n)
            })
            .collect();
        writer.commit(&events, "x").await;
        written += events.len() as u32;
        if batch == 10 || (via == Via::Http && batch == 25) {
            relay_daemon.kill9();
            relay_daemon = relay.spawn_run(&format!("relay-{batch}.log"));
        }
        if batch == 20 {
            inbox_daemon.kill9();
            inbox_daemon = spawn_outboxd(
                &config,
                &relay.dir.join("inbox-2.log"),
                "info,outboxd=debug",
            );
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert_eq!(written, total);

    let done = format!("SELECT count(*) FROM inbox_{name} WHERE status = 'DONE'");
    wait_for("every event handled", Duration::from_secs(120), || async {
        let n = receiver.integers(&done).await[0];
        (n == i64::from(total)).then_some(())
    })
    .await;
    let counts = receiver
        .integers(&format!(
            "SELECT count(*), count(DISTINCT message_id) FROM {effects}"
        ))
        .await;
    assert_eq!(
        counts,
        [i64::from(total), i64::from(total)],
        "each effect exactly once"
    );
    let rows = receiver
        .integers(&format!("SELECT count(*) FROM inbox_{name}"))
        .await;
    assert_eq!(rows, [i64::from(total)], "each message stored once");

    assert!(
        inbox_daemon.terminate().success(),
        "{}",
        inbox_daemon.log_text()
    );
    assert!(
        relay_daemon.terminate().success(),
        "{}",
        relay_daemon.log_text()
    );
    for table in [&effects, &inbox] {
        receiver.drop_table(table).await;
    }
    relay.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outbox_to_mariadb_inbox_exactly_once_across_kill_9() {
    events_cross_once_with_both_killed::<PgServices>(Receiver::Mariadb, Via::Kafka, "xdb_pg").await;
}

/// The pattern on databases alone: PostgreSQL's outbox POSTed by the HTTP sink (signed
/// Standard Webhooks, the envelope) to a MariaDB inbox's HTTP ingress, no Kafka between;
/// the relay killed twice and the inbox once under load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outbox_over_http_to_mariadb_inbox_exactly_once_across_kill_9() {
    events_cross_once_with_both_killed::<PgServices>(Receiver::Mariadb, Via::Http, "xhttp_pg")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_outbox_to_postgres_inbox_exactly_once_across_kill_9() {
    events_cross_once_with_both_killed::<MysqlServices>(Receiver::Postgres, Via::Kafka, "xdb_my")
        .await;
}
