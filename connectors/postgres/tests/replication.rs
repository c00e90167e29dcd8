//! The replication connection and the change stream against a real PostgreSQL.
//!
//! Server: `scripts/services start postgres && eval "$(scripts/services env)"`, or any
//! cluster with `wal_level=logical` named by OUTBOXD_TEST_PG_HOST/PORT/USER/PASSWORD/
//! DATABASE (defaults 127.0.0.1, 25432, outboxd, outboxd, outboxd). Each test makes its
//! own table, publication and slot, and drops the slot at the end. The stream runs as the
//! runtime role (OUTBOXD_TEST_PG_RUN_USER/PASSWORD, default outboxd_run) with the grants of
//! `schemas/postgres/grants.sql` (README, "Privileges").
//!
//! `cargo test -p outboxd-postgres --test replication -- --ignored capture` regenerates
//! the pgoutput fixtures in `src/log/testdata/`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use outboxd_connector::{ChangeItem, ChangeStream, ErrorKind, OutboxLayout};
use outboxd_postgres::replication::{ReplicationConnection, ReplicationMessage};
use outboxd_postgres::Lsn;
use outboxd_postgres::{PostgresConfig, PostgresConnector, SslMode};
use tokio::time::{timeout, Instant};

const DEADLINE: Duration = Duration::from_secs(30);

fn env(name: &str, default: &str) -> String {
    std::env::var(format!("OUTBOXD_TEST_PG_{name}")).unwrap_or_else(|_| default.to_owned())
}

fn config(user: &str, password: Option<&str>, sslmode: SslMode) -> PostgresConfig {
    PostgresConfig {
        host: env("HOST", "127.0.0.1"),
        port: env("PORT", "25432").parse().expect("OUTBOXD_TEST_PG_PORT"),
        user: user.to_owned(),
        password: password.map(Into::into),
        password_file: None,
        database: env("DATABASE", "outboxd"),
        sslmode,
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

/// `cfg` allowed to send an MD5 or cleartext password over an unverified channel.
fn insecure(mut cfg: PostgresConfig) -> PostgresConfig {
    cfg.allow_insecure_password = true;
    cfg
}

fn main_config() -> PostgresConfig {
    config(
        &env("USER", "outboxd"),
        Some(&env("PASSWORD", "outboxd")),
        SslMode::Prefer,
    )
}

/// The runtime role of README's "Privileges" (`OUTBOXD_TEST_PG_RUN_*`): what `run` logs
/// in as.
fn run_config() -> PostgresConfig {
    config(
        &env("RUN_USER", "outboxd_run"),
        Some(&env("RUN_PASSWORD", "outboxd_run")),
        SslMode::Prefer,
    )
}

/// The outbox's and checkpoint's lines of `schemas/postgres/grants.sql` for these tables
/// (in `public`) and `run_role`.
fn runtime_grants(run_role: &str, outbox: &str, checkpoint: &str) -> String {
    let quote = |name: &str| format!("\"{}\"", name.replace('"', "\"\""));
    let grants = include_str!("../../../schemas/postgres/grants.sql")
        .lines()
        .filter(|l| !l.starts_with('\\') && !l.contains(":\"inbox_table\""))
        .collect::<Vec<_>>()
        .join("\n")
        .replace(":\"run_role\"", &quote(run_role))
        .replace(":\"schema\"", "public")
        .replace(":\"outbox_table\"", &quote(outbox))
        .replace(":\"checkpoint_table\"", &quote(checkpoint));
    serialized(&grants)
}

/// A name no other test (or earlier run) uses.
fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        nanos % 100_000
    )
}

/// The outbox DDL from `schemas/postgres/outbox.sql`, for table `table`.
fn outbox_ddl(table: &str) -> String {
    let sql = include_str!("../../../schemas/postgres/outbox.sql");
    sql.lines()
        .filter(|l| !l.trim_start().starts_with('\\'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace(":\"outbox_table\"", table)
        .replace(":\"outbox_retry_index\"", &format!("{table}_retry_idx"))
        .replace(
            ":\"outbox_key_retry_index\"",
            &format!("{table}_key_retry_idx"),
        )
}

/// A test's own outbox, publication (of the outbox alone, as `init` makes it) and slot,
/// and another table written in the same transactions. The test's role makes them and
/// writes the rows; the stream runs as the runtime role with the grants of
/// `schemas/postgres/grants.sql` (README, "Privileges").
struct Fixture {
    connector: PostgresConnector,
    sql: tokio_postgres::Client,
    outbox: String,
    other: String,
    slot: String,
}

impl Fixture {
    async fn new(name: &str) -> Self {
        Self::with_payload(name, "jsonb").await
    }

    async fn with_payload(name: &str, payload_type: &str) -> Self {
        let base = unique(name);
        let outbox = format!("{base}_outbox");
        let other = format!("{base}_other");
        let mut cfg = run_config();
        cfg.slot = Some(base.clone());
        cfg.publication = Some(base.clone());
        cfg.status_interval = Duration::from_secs(1);
        // Its own checkpoint table too: the stream reads the checkpoint, and a fresh
        // database has no default one.
        let checkpoint = format!("{base}_checkpoint");
        let layout = OutboxLayout {
            outbox_tables: vec![format!("public.{outbox}")],
            checkpoint_table: format!("public.{checkpoint}"),
            ..OutboxLayout::default()
        };
        let run_role = cfg.user.clone();
        let connector = PostgresConnector::new(cfg, "test", layout).unwrap();
        let own = PostgresConnector::new(main_config(), "test", OutboxLayout::default());
        let sql = own.unwrap().sql_client().await.unwrap();
        let ddl = outbox_ddl(&outbox)
            .replace("payload          jsonb", &format!("payload {payload_type}"));
        sql.batch_execute(&ddl).await.unwrap();
        sql.batch_execute(&format!(
            "CREATE TABLE {checkpoint} (pipeline text PRIMARY KEY, position text NOT NULL, \
                 updated_at timestamptz NOT NULL DEFAULT now());
             CREATE TABLE {other} (id serial PRIMARY KEY, note text);
             CREATE PUBLICATION {base} FOR TABLE {outbox} WITH (publish = 'insert');"
        ))
        .await
        .unwrap();
        sql.batch_execute(&runtime_grants(&run_role, &outbox, &checkpoint))
            .await
            .unwrap();
        sql.query(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&base],
        )
        .await
        .unwrap();
        Self {
            connector,
            sql,
            outbox,
            other,
            slot: base,
        }
    }

    async fn insert(&self, message_id: &str, biz_key: &str) {
        self.sql
            .execute(&self.insert_sql(message_id, biz_key), &[])
            .await
            .unwrap();
    }

    fn insert_sql(&self, message_id: &str, biz_key: &str) -> String {
        format!(
            "INSERT INTO {} (message_id, message_type, biz_key, payload) \
             VALUES ('{message_id}', 'test.{message_id}', '{biz_key}', '{{\"n\": 1}}')",
            self.outbox
        )
    }

    async fn confirmed_flush(&self) -> Lsn {
        let row = self
            .sql
            .query_one(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await
            .unwrap();
        row.get::<_, String>(0).parse().unwrap()
    }

    async fn wait_confirmed_at_least(&self, lsn: Lsn) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let current = self.confirmed_flush().await;
            if current >= lsn {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "confirmed_flush_lsn stuck at {current}, want {lsn}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Drops the slot (waiting until its reader is gone) and the publication and tables.
    async fn cleanup(self, stream: Option<outboxd_postgres::stream::PgChangeStream>) {
        drop(stream);
        let deadline = Instant::now() + DEADLINE;
        loop {
            let r = self
                .sql
                .execute("SELECT pg_drop_replication_slot($1)", &[&self.slot])
                .await;
            match r {
                Ok(_) => break,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("cannot drop slot {}: {e}", self.slot),
            }
        }
        self.sql
            .batch_execute(&format!(
                "DROP PUBLICATION {slot}; DROP TABLE {outbox}; DROP TABLE {other}; \
                 DROP TABLE {slot}_checkpoint;",
                slot = self.slot,
                outbox = self.outbox,
                other = self.other
            ))
            .await
            .unwrap();
    }
}

/// The next transaction, skipping progress items.
async fn next_transaction(
    stream: &mut impl ChangeStream,
) -> outboxd_connector::CommittedTransaction {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, stream.next())
            .await
            .expect("no transaction in time")
            .unwrap()
        {
            ChangeItem::Transaction(t) => return t,
            ChangeItem::Part(p) => panic!("a small transaction came in parts: {p:?}"),
            ChangeItem::Progress(_) => {}
        }
    }
}

#[tokio::test]
async fn committed_inserts_arrive_with_their_fields() {
    let f = Fixture::new("fields").await;
    let mut stream = f.connector.open_stream().await.unwrap();
    f.sql
        .batch_execute(&format!(
            "BEGIN;
             INSERT INTO {t} (message_id, message_type, biz_key, topic, payload, headers)
               VALUES ('a-1', 'order.created', 'order-1', NULL, '{{\"total\": 1}}',
                       '{{\"trace\": \"t1\", \"n\": 2}}');
             INSERT INTO {t} (message_id, message_type, biz_key, topic, payload, retry_count)
               VALUES ('a-2', 'order.paid', 'order-1', 'payments', '[1,2]', 3);
             INSERT INTO {t} (message_id, message_type, biz_key, payload, status)
               VALUES ('a-3', 'order.done', 'order-1', '{{}}', 'SUCCESS');
             COMMIT;",
            t = f.outbox
        ))
        .await
        .unwrap();
    let txn = next_transaction(&mut stream).await;
    assert_eq!(
        txn.events.len(),
        2,
        "the SUCCESS row is not published: {txn:?}"
    );
    let ids: Vec<i64> = f
        .sql
        .query(&format!("SELECT id FROM {} ORDER BY id", f.outbox), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let a = &txn.events[0];
    assert_eq!(a.id, ids[0]);
    assert_eq!(a.message_id, "a-1");
    assert_eq!(a.message_type, "order.created");
    assert_eq!(a.biz_key, "order-1");
    assert_eq!(&a.key[..], b"order-1");
    assert_eq!(a.topic, None);
    assert_eq!(&a.payload[..], br#"{"total": 1}"#);
    let headers: Vec<_> = a
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), std::str::from_utf8(v).unwrap()))
        .collect();
    assert_eq!(
        headers,
        [("n", "2"), ("trace", "t1")],
        "jsonb's own key order"
    );
    assert_eq!(a.retry_count, 0);
    assert_eq!(a.max_retry_count, 10);
    assert!(
        a.created_at.contains('T') && a.created_at.ends_with("+00"),
        "{}",
        a.created_at
    );
    let b = &txn.events[1];
    assert_eq!(b.id, ids[1]);
    assert_eq!(b.topic.as_deref(), Some("payments"));
    assert_eq!(&b.payload[..], b"[1, 2]");
    assert!(b.headers.is_empty());
    assert_eq!(b.retry_count, 3);
    let commit_time = txn.commit_time.unwrap();
    let age = SystemTime::now()
        .duration_since(commit_time)
        .unwrap_or_default();
    assert!(age < Duration::from_secs(60), "commit time {commit_time:?}");
    assert_eq!(a.commit_time, txn.commit_time);
    let lsn = Lsn::from_position(&txn.commit_position).expect("an LSN");
    assert!(lsn > Lsn(0));
    f.cleanup(Some(stream)).await;
}

#[tokio::test]
async fn rolled_back_and_other_tables_yield_only_committed_outbox_rows() {
    let f = Fixture::new("mixed").await;
    let mut stream = f.connector.open_stream().await.unwrap();
    f.sql
        .batch_execute(&format!(
            "BEGIN; {rolled_back}; ROLLBACK;
             BEGIN;
             INSERT INTO {other} (note) VALUES ('before');
             {kept};
             INSERT INTO {other} (note) VALUES ('after');
             COMMIT;",
            rolled_back = f.insert_sql("rolled-back", "k"),
            kept = f.insert_sql("kept", "k"),
            other = f.other,
        ))
        .await
        .unwrap();
    let txn = next_transaction(&mut stream).await;
    let ids: Vec<_> = txn.events.iter().map(|e| e.message_id.as_str()).collect();
    assert_eq!(ids, ["kept"]);
    // Nothing else is pending: a later transaction is the next one seen.
    f.insert("later", "k").await;
    let txn = next_transaction(&mut stream).await;
    assert_eq!(txn.events[0].message_id, "later");
    f.cleanup(Some(stream)).await;
}

#[tokio::test]
async fn idle_outbox_reports_progress_and_confirming_it_moves_the_slot() {
    let f = Fixture::new("progress").await;
    let start = f.confirmed_flush().await;
    let mut stream = f.connector.open_stream().await.unwrap();
    f.sql
        .execute(&format!("INSERT INTO {} (note) VALUES ('x')", f.other), &[])
        .await
        .unwrap();
    let after_write: Lsn = f
        .sql
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get::<_, String>(0)
        .parse()
        .unwrap();
    let deadline = Instant::now() + DEADLINE;
    let progress = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, stream.next())
            .await
            .expect("no progress in time")
            .unwrap()
        {
            ChangeItem::Progress(p) => {
                let lsn = Lsn::from_position(&p).expect("an LSN");
                if lsn >= after_write {
                    break lsn;
                }
            }
            ChangeItem::Transaction(t) => panic!("unexpected {t:?}"),
            ChangeItem::Part(p) => panic!("unexpected {p:?}"),
        }
    };
    assert!(progress > start);
    // Not confirmed yet: the slot must not have moved on its own.
    assert_eq!(f.confirmed_flush().await, start);
    stream.confirm(&progress.position()).await.unwrap();
    f.wait_confirmed_at_least(progress).await;
    f.cleanup(Some(stream)).await;
}

#[tokio::test]
async fn a_backlog_larger_than_the_channel_arrives_in_commit_order() {
    let f = Fixture::new("backlog").await;
    let n = 3000;
    f.sql
        .batch_execute(&format!(
            "DO $$ BEGIN FOR i IN 1..{n} LOOP
               INSERT INTO {t} (message_id, message_type, biz_key, payload)
                 VALUES ('bk-' || i, 'bk', 'k' || i, '{{}}');
               COMMIT;
             END LOOP; END $$",
            t = f.outbox
        ))
        .await
        .unwrap();
    let mut stream = f.connector.open_stream().await.unwrap();
    let mut last = Lsn(0).position();
    for i in 1..=n {
        let txn = next_transaction(&mut stream).await;
        assert_eq!(txn.events.len(), 1);
        assert_eq!(txn.events[0].message_id, format!("bk-{i}"));
        assert!(txn.commit_position > last);
        last = txn.commit_position;
        if i % 1000 == 0 {
            stream.confirm(&last).await.unwrap();
        }
    }
    let lsn = Lsn::from_position(&last).expect("an LSN");
    f.wait_confirmed_at_least(lsn).await;
    f.cleanup(Some(stream)).await;
}

#[tokio::test]
async fn bytea_payload_is_published_as_raw_bytes() {
    let f = Fixture::with_payload("bytea", "bytea").await;
    let mut stream = f.connector.open_stream().await.unwrap();
    f.sql
        .execute(
            &format!(
                "INSERT INTO {} (message_id, message_type, biz_key, payload) \
                 VALUES ('b-1', 'bin', 'k', '\\x00ff7f'::bytea)",
                f.outbox
            ),
            &[],
        )
        .await
        .unwrap();
    let txn = next_transaction(&mut stream).await;
    assert_eq!(&txn.events[0].payload[..], &[0x00, 0xff, 0x7f]);
    f.cleanup(Some(stream)).await;
}

#[tokio::test]
async fn missing_slot_is_definite_and_busy_slot_is_transient() {
    let mut cfg = main_config();
    cfg.slot = Some(unique("missing"));
    let connector = PostgresConnector::new(cfg, "test", OutboxLayout::default()).unwrap();
    let err = connector.open_stream().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Definite);
    assert!(
        err.message().contains("does not exist") && err.message().contains("outboxd init"),
        "{err}"
    );

    let f = Fixture::new("busy").await;
    let stream = f.connector.open_stream().await.unwrap();
    let err = f.connector.open_stream().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    assert!(err.message().contains("in use"), "{err}");
    f.cleanup(Some(stream)).await;
}

#[tokio::test]
async fn dropped_publication_is_definite_and_names_the_fix() {
    let f = Fixture::new("nopub").await;
    f.sql
        .batch_execute(&format!("DROP PUBLICATION {}", f.slot))
        .await
        .unwrap();
    let mut stream = f.connector.open_stream().await.unwrap();
    f.insert("np-1", "k").await;
    let err = loop {
        match timeout(DEADLINE, stream.next())
            .await
            .expect("no error in time")
        {
            Ok(ChangeItem::Progress(_)) => {}
            Ok(other) => panic!("unexpected {other:?}"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), ErrorKind::Definite, "{err}");
    assert!(err.message().contains("outboxd init"), "{err}");
    f.sql
        .batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE {}",
            f.slot, f.outbox
        ))
        .await
        .unwrap();
    f.cleanup(Some(stream)).await;
}

async fn identify(cfg: PostgresConfig) -> bool {
    let mut conn = ReplicationConnection::connect(&cfg).await.unwrap();
    let tls = conn.is_tls();
    let system = conn.identify_system().await.unwrap();
    assert!(system.xlogpos > Lsn(0));
    assert_eq!(system.dbname.as_deref(), Some(cfg.database.as_str()));
    tls
}

#[tokio::test]
async fn scram_md5_and_trust_authentication() {
    let password = env("PASSWORD", "outboxd");
    identify(config(
        &env("USER", "outboxd"),
        Some(&password),
        SslMode::Disable,
    ))
    .await;
    identify(insecure(config(
        "outboxd_md5",
        Some(&password),
        SslMode::Disable,
    )))
    .await;
    identify(config("outboxd_trust", None, SslMode::Disable)).await;

    let err = ReplicationConnection::connect(&config(
        &env("USER", "outboxd"),
        Some("wrong"),
        SslMode::Disable,
    ))
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Definite);
    assert!(err.message().contains("28P01"), "{err}");
    let err =
        ReplicationConnection::connect(&insecure(config("outboxd_md5", None, SslMode::Disable)))
            .await
            .unwrap_err();
    assert!(err.message().contains("password"), "{err}");
}

#[tokio::test]
async fn sslmode_require_uses_tls() {
    let password = env("PASSWORD", "outboxd");
    assert!(
        identify(config(
            &env("USER", "outboxd"),
            Some(&password),
            SslMode::Require
        ))
        .await
    );
    assert!(
        identify(insecure(config(
            "outboxd_md5",
            Some(&password),
            SslMode::Require
        )))
        .await
    );
    assert!(
        !identify(config(
            &env("USER", "outboxd"),
            Some(&password),
            SslMode::Disable
        ))
        .await
    );

    // And the whole stream over TLS.
    let mut f = Fixture::new("tls").await;
    f.connector = {
        let mut cfg = f.connector.config().clone();
        cfg.sslmode = SslMode::Require;
        PostgresConnector::new(cfg, "test", f.connector.layout().clone()).unwrap()
    };
    let mut stream = f.connector.open_stream().await.unwrap();
    f.insert("tls-1", "k").await;
    assert_eq!(
        next_transaction(&mut stream).await.events[0].message_id,
        "tls-1"
    );
    f.cleanup(Some(stream)).await;
}

#[tokio::test]
async fn unreachable_server_is_transient() {
    let mut cfg = main_config();
    cfg.port = 1;
    let err = ReplicationConnection::connect(&cfg).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
}

/// Writes `src/log/testdata/*.hex` from a real server: the raw XLogData payloads of one
/// transaction with two outbox inserts, then of a transaction with an UPDATE, a DELETE and a
/// TRUNCATE.
#[tokio::test]
#[ignore = "regenerates fixtures"]
async fn capture_pgoutput_fixtures() {
    let cfg = main_config();
    let connector = PostgresConnector::new(cfg.clone(), "test", OutboxLayout::default()).unwrap();
    let sql = connector.sql_client().await.unwrap();
    let _ = sql
        .execute("SELECT pg_drop_replication_slot('fixture_slot')", &[])
        .await;
    sql.batch_execute(&format!(
        "DROP PUBLICATION IF EXISTS fixture_pub; DROP TABLE IF EXISTS fixture_outbox; {}
         CREATE PUBLICATION fixture_pub FOR TABLE fixture_outbox;",
        outbox_ddl("fixture_outbox")
    ))
    .await
    .unwrap();
    sql.execute(
        "SELECT pg_create_logical_replication_slot('fixture_slot', 'pgoutput')",
        &[],
    )
    .await
    .unwrap();
    sql.batch_execute(
        "BEGIN;
         INSERT INTO fixture_outbox (message_id, message_type, biz_key, payload, headers)
           VALUES ('m-1', 'order.created', 'order-42', '{\"total\": 12.5}', '{\"trace\": \"abc\"}');
         INSERT INTO fixture_outbox (message_id, message_type, biz_key, topic, payload)
           VALUES ('m-2', 'order.special', 'order-42', 'orders.special', '{}');
         COMMIT;
         UPDATE fixture_outbox SET status = 'SUCCESS' WHERE message_id = 'm-1';
         DELETE FROM fixture_outbox WHERE message_id = 'm-2';
         TRUNCATE fixture_outbox;",
    )
    .await
    .unwrap();

    let conn = ReplicationConnection::connect(&cfg).await.unwrap();
    let mut stream = conn
        .start_logical_replication("fixture_slot", Lsn(0), "fixture_pub")
        .await
        .unwrap();
    let mut transactions: Vec<Vec<bytes::Bytes>> = vec![Vec::new()];
    while transactions.len() <= 2 {
        if let ReplicationMessage::XLogData { data, .. } = stream.recv().await.unwrap() {
            let commit = data.first() == Some(&b'C');
            transactions.last_mut().unwrap().push(data);
            if commit {
                transactions.push(Vec::new());
            }
        }
    }
    drop(stream);
    let hex = |msgs: &[bytes::Bytes]| {
        msgs.iter()
            .map(|m| {
                let h: String = m.iter().map(|b| format!("{b:02x}")).collect();
                format!("{} {h}\n", char::from(m[0]))
            })
            .collect::<String>()
    };
    let header = "# Raw pgoutput (proto_version 1) XLogData payloads captured from PostgreSQL 15\n\
                  # by `cargo test -p outboxd-postgres --test replication -- --ignored capture`:\n\
                  # one message a line, `<tag> <hex>`.\n";
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/log/testdata");
    std::fs::write(
        format!("{dir}/pgoutput_insert_tx.hex"),
        format!("{header}# BEGIN; two INSERTs into fixture_outbox (schemas/postgres/outbox.sql); COMMIT\n{}", hex(&transactions[0])),
    )
    .unwrap();
    std::fs::write(
        format!("{dir}/pgoutput_other.hex"),
        format!(
            "{header}# one transaction: UPDATE, DELETE and TRUNCATE of fixture_outbox\n{}",
            hex(&transactions[1])
        ),
    )
    .unwrap();
    // Wait for the walsender to let go of the slot before dropping it.
    let deadline = Instant::now() + DEADLINE;
    while sql
        .execute("SELECT pg_drop_replication_slot('fixture_slot')", &[])
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sql.batch_execute("DROP PUBLICATION fixture_pub; DROP TABLE fixture_outbox;")
        .await
        .unwrap();
}

/// Run as one transaction behind an advisory lock: PostgreSQL fails concurrent GRANTs on
/// one object ("tuple concurrently updated"), and parallel tests all grant on the schema.
fn serialized(sql: &str) -> String {
    format!("BEGIN;\nSELECT pg_advisory_xact_lock(7424242);\n{sql}\nCOMMIT;")
}

/// A TCP relay to PostgreSQL that can go silent: it keeps both connections open but
/// forwards nothing (a network partition behind a live proxy or NAT, which TCP itself
/// does not notice), and closes them on `close`.
struct SilentRelay {
    port: u16,
    silent: std::sync::Arc<std::sync::atomic::AtomicBool>,
    closed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl SilentRelay {
    async fn start(upstream: (String, u16)) -> Self {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let silent = Arc::new(AtomicBool::new(false));
        let closed = Arc::new(AtomicBool::new(false));
        let (s, c) = (Arc::clone(&silent), Arc::clone(&closed));
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(upstream.clone()).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                for (mut from, mut to) in [
                    (
                        Box::new(client_read) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
                        Box::new(server_write) as Box<dyn tokio::io::AsyncWrite + Unpin + Send>,
                    ),
                    (Box::new(server_read), Box::new(client_write)),
                ] {
                    let (silent, closed) = (Arc::clone(&s), Arc::clone(&c));
                    tokio::spawn(async move {
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        let mut buf = vec![0u8; 16 * 1024];
                        while !closed.load(Ordering::Relaxed) {
                            if silent.load(Ordering::Relaxed) {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                continue;
                            }
                            let read =
                                timeout(Duration::from_millis(50), from.read(&mut buf)).await;
                            match read {
                                Err(_) => continue,
                                Ok(Ok(0)) | Ok(Err(_)) => break,
                                Ok(Ok(n)) => {
                                    if to.write_all(&buf[..n]).await.is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                    });
                }
            }
        });
        Self {
            port,
            silent,
            closed,
        }
    }
}

/// The replication connection goes silent (nothing forwarded either way, TCP still
/// up): the stream notices within `source.silence_timeout` (3 s here), because it asks the
/// server to answer once it has been quiet for a status interval, and fails with a
/// transient error so the relay reconnects. Before, it waited for the server forever.
#[tokio::test]
async fn a_silent_replication_connection_is_noticed_and_is_transient() {
    let f = Fixture::new("silent").await;
    let relay = SilentRelay::start((
        env("HOST", "127.0.0.1"),
        env("PORT", "25432").parse().unwrap(),
    ))
    .await;
    let mut cfg = run_config();
    cfg.host = "127.0.0.1".into();
    cfg.port = relay.port;
    cfg.slot = Some(f.slot.clone());
    cfg.publication = Some(f.slot.clone());
    cfg.status_interval = Duration::from_millis(500);
    cfg.silence_timeout = Duration::from_secs(3);
    let layout = OutboxLayout {
        outbox_tables: vec![format!("public.{}", f.outbox)],
        checkpoint_table: format!("public.{}_checkpoint", f.slot),
        ..OutboxLayout::default()
    };
    let connector = PostgresConnector::new(cfg, "test", layout).unwrap();
    let mut stream = connector.open_stream().await.unwrap();
    f.insert("s-1", "k").await;
    assert_eq!(
        next_transaction(&mut stream).await.events.len(),
        1,
        "the relay forwards"
    );
    // Quiet but alive: more than the silence limit passes with the server answering.
    let quiet = Instant::now();
    while quiet.elapsed() < Duration::from_secs(4) {
        match timeout(Duration::from_millis(500), stream.next()).await {
            Err(_) | Ok(Ok(ChangeItem::Progress(_))) => {}
            Ok(other) => panic!("an idle, live connection: {other:?}"),
        }
    }
    relay.silent.store(true, Ordering::Relaxed);
    let err = loop {
        match timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("the silent connection is noticed within 20 s")
        {
            Ok(ChangeItem::Progress(_)) => continue,
            Ok(other) => panic!("nothing can arrive through a silent relay: {other:?}"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    assert!(err.message().contains("silent"), "{err}");
    drop(stream);
    // Closing the relay's sockets ends the walsender, so the slot can be dropped.
    relay.closed.store(true, Ordering::Relaxed);
    f.cleanup(None).await;
}
