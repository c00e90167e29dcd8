//! `source.slot_failover` against a real server. From PostgreSQL 17 on, `init` and
//! `recover` create the slot with `failover = true` and `check` names a slot made without
//! it, with a fix that works; below 17, `init`, `recover` and `check` refuse the option
//! before changing anything. And a real failover: a throwaway primary and a standby that
//! synchronizes slots (from `OUTBOXD_PG_BIN`, 17 or later), the primary killed, the
//! standby promoted, outboxd reading on from its copy of the slot. `scripts/test` runs
//! this file on 15 (the workspace run), 18 and 13, so both sides are exercised.

mod support_store;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use outboxd_connector::{
    ChangeItem, ChangeStream, CheckLine, CheckReport, CheckStatus, CommittedTransaction, Connector,
    OutboxLayout, ReadMode,
};
use outboxd_postgres::replication::ReplicationConnection;
use outboxd_postgres::{Lsn, PostgresConnector};
use support_store::{Fixture, PgEnv};
use tokio::time::timeout;

/// The fixture's connector with `source.slot_failover = true`.
fn with_failover(fx: &Fixture) -> PostgresConnector {
    let mut config = fx.connector.config().clone();
    config.slot_failover = true;
    PostgresConnector::new(config, &fx.slot, fx.connector.layout().clone()).expect("valid names")
}

async fn server_version(fx: &Fixture) -> i32 {
    fx.client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .expect("server version")
        .get(0)
}

/// `pg_replication_slots.failover` of the fixture's slot (17 and later), `None` when the
/// slot does not exist.
async fn slot_failover(fx: &Fixture) -> Option<bool> {
    fx.client
        .query_opt(
            "SELECT failover FROM pg_replication_slots WHERE slot_name = $1",
            &[&fx.slot],
        )
        .await
        .expect("pg_replication_slots")
        .map(|row| row.get(0))
}

async fn slot_exists(fx: &Fixture) -> bool {
    fx.client
        .query_opt(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
            &[&fx.slot],
        )
        .await
        .expect("pg_replication_slots")
        .is_some()
}

fn line<'a>(report: &'a CheckReport, item: &str) -> &'a CheckLine {
    report
        .iter()
        .find(|l| l.item == item)
        .unwrap_or_else(|| panic!("no `{item}` line in\n{}", render(report)))
}

fn render(report: &CheckReport) -> String {
    let lines: Vec<String> = report.iter().map(ToString::to_string).collect();
    lines.join("\n")
}

#[tokio::test]
async fn the_slot_is_created_with_failover_from_17_on_and_refused_below() {
    let fx = Fixture::new("fo_init").await;
    let connector = with_failover(&fx);
    let version = server_version(&fx).await;

    if version < 170_000 {
        let err = Connector::init(&connector, ReadMode::Log)
            .await
            .expect_err("slot_failover below 17");
        assert!(!err.is_transient(), "{err}");
        let message = err.to_string();
        assert!(
            message.contains("source.slot_failover")
                && message.contains("17 or later")
                && message.contains("source.slot_failover = false"),
            "{message}"
        );
        // Refused before anything was made.
        let outbox: bool = fx
            .client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&fx.outbox()])
            .await
            .expect("lookup")
            .get(0);
        assert!(
            !outbox,
            "init created tables although it refused the option"
        );
        assert!(!slot_exists(&fx).await);

        let report = Connector::check(&connector, ReadMode::Log).await;
        let failover = line(&report, "slot failover");
        assert_eq!(failover.status, CheckStatus::Fail, "{}", render(&report));
        assert!(
            failover.fix.as_deref().unwrap_or_default().contains("17"),
            "{}",
            render(&report)
        );

        // recover refuses too, and leaves the existing slot alone.
        Connector::init(&fx.connector, ReadMode::Log)
            .await
            .expect("init without failover");
        let err = connector
            .reset_log_position()
            .await
            .expect_err("recover with slot_failover below 17");
        assert!(err.to_string().contains("source.slot_failover"), "{err}");
        assert!(
            slot_exists(&fx).await,
            "recover dropped the slot it could not remake"
        );
        return;
    }

    let created = Connector::init(&connector, ReadMode::Log)
        .await
        .expect("init");
    let text = created.join("\n");
    assert!(
        text.contains(&format!(
            "created replication slot {} (pgoutput, failover)",
            fx.slot
        )),
        "{text}"
    );
    assert_eq!(slot_failover(&fx).await, Some(true));

    // No standby here: synchronized_standby_slots is empty, which check warns about.
    let report = Connector::check(&connector, ReadMode::Log).await;
    let failover = line(&report, "slot failover");
    assert_eq!(failover.status, CheckStatus::Warn, "{}", render(&report));
    assert!(
        failover.detail.contains("synchronized_standby_slots"),
        "{}",
        render(&report)
    );
    assert!(
        Connector::schema(&connector, ReadMode::Log).contains("failover => true"),
        "{}",
        Connector::schema(&connector, ReadMode::Log)
    );
}

#[tokio::test]
async fn a_slot_made_without_failover_is_named_by_check_with_a_fix_that_works() {
    let fx = Fixture::new("fo_fix").await;
    if server_version(&fx).await < 170_000 {
        eprintln!("skipped: failover slots need PostgreSQL 17 or later");
        return;
    }
    Connector::init(&fx.connector, ReadMode::Log)
        .await
        .expect("init without failover");
    assert_eq!(slot_failover(&fx).await, Some(false));

    let connector = with_failover(&fx);
    let report = Connector::check(&connector, ReadMode::Log).await;
    let failover = line(&report, "slot failover");
    assert_eq!(failover.status, CheckStatus::Fail, "{}", render(&report));
    assert!(
        failover.detail.contains("without failover"),
        "{}",
        render(&report)
    );
    let fix = failover.fix.clone().unwrap_or_default();
    let alter = format!("ALTER_REPLICATION_SLOT {} (FAILOVER true)", fx.slot);
    assert!(fix.contains(&alter), "{fix}");

    // init leaves the slot alone and says so.
    let again = Connector::init(&connector, ReadMode::Log)
        .await
        .expect("init again");
    assert!(
        again.iter().any(|l| l.contains("without failover")),
        "{again:?}"
    );

    // The fix check gives, over a replication connection.
    let mut replication = ReplicationConnection::connect(connector.config())
        .await
        .expect("replication connection");
    replication
        .simple_query(&alter)
        .await
        .expect("ALTER_REPLICATION_SLOT");
    assert_eq!(slot_failover(&fx).await, Some(true));
    let report = Connector::check(&connector, ReadMode::Log).await;
    assert_ne!(
        line(&report, "slot failover").status,
        CheckStatus::Fail,
        "{}",
        render(&report)
    );

    // recover makes the slot again, with failover.
    fx.client
        .query("SELECT pg_drop_replication_slot($1)", &[&fx.slot])
        .await
        .expect("drop the slot");
    Connector::init(&fx.connector, ReadMode::Log)
        .await
        .expect("a slot without failover again");
    assert_eq!(slot_failover(&fx).await, Some(false));
    let said = connector.reset_log_position().await.expect("recover");
    assert!(said.contains("(pgoutput, failover)"), "{said}");
    assert_eq!(slot_failover(&fx).await, Some(true));
}

/// A throwaway cluster from `OUTBOXD_PG_BIN` in a directory of its own, stopped and
/// removed when dropped.
struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl Cluster {
    fn new(bin: &Path, name: &str) -> Self {
        let dir = std::env::temp_dir().join(support_store::unique(name));
        std::fs::create_dir_all(&dir).expect("temp dir");
        if is_root() {
            run(Command::new("chown").arg("postgres:postgres").arg(&dir));
        }
        let port = outboxd_conformance::ports::free_loopback_port();
        Self {
            bin: bin.to_owned(),
            dir,
            port,
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// `bin/<program>`, as the postgres user when we are root (initdb refuses root).
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    /// Appends `settings` (and this cluster's port and sockets) to postgresql.conf.
    fn configure(&self, settings: &[String]) {
        let mut conf = format!(
            "\nport = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             fsync = off\n",
            self.port,
            self.dir.display()
        );
        for s in settings {
            conf.push_str(s);
            conf.push('\n');
        }
        let path = self.data().join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path).expect("postgresql.conf");
        text.push_str(&conf);
        std::fs::write(&path, text).expect("write postgresql.conf");
    }

    fn start(&self) {
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.join("log"))
            .args(["-w", "start"]));
    }

    fn env(&self) -> PgEnv {
        PgEnv {
            host: "127.0.0.1".into(),
            port: self.port,
            user: "postgres".into(),
            password: String::new(),
            database: "postgres".into(),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn run(command: &mut Command) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The major version of `bin/postgres`.
fn major(bin: &Path) -> u32 {
    let out = Command::new(bin.join("postgres"))
        .arg("--version")
        .output()
        .expect("postgres --version");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .last()
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("a version in `{text}`"))
}

/// Polls `query` (one boolean) on `client` until it is true.
async fn wait_true(client: &tokio_postgres::Client, query: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let row = client.query_opt(query, &[]).await.expect(query);
        if row.is_some_and(|r| r.get::<_, Option<bool>>(0) == Some(true)) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The next transaction, skipping progress items.
async fn next_transaction(stream: &mut impl ChangeStream) -> CommittedTransaction {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, stream.next())
            .await
            .expect("no transaction in time")
            .expect("stream")
        {
            ChangeItem::Transaction(t) => return t,
            ChangeItem::Part(p) => panic!("a small transaction came in parts: {p:?}"),
            ChangeItem::Progress(_) => {}
        }
    }
}

fn ids(t: &CommittedTransaction) -> Vec<&str> {
    t.events.iter().map(|e| e.message_id.as_str()).collect()
}

const INSERT: &str = "INSERT INTO outbox (message_id, message_type, biz_key, payload) \
                      VALUES ($1, 'order.created', $1, '{}')";

/// The whole point of the option: a primary with a standby that synchronizes slots fails
/// over, and outboxd reads on from the promoted standby's copy of the slot, nothing lost.
/// Needs `OUTBOXD_PG_BIN` of PostgreSQL 17 or later (scripts/test: the 18 run); skipped
/// otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_survives_a_failover_to_a_standby_that_syncs_slots() {
    let Ok(bin) = std::env::var("OUTBOXD_PG_BIN") else {
        eprintln!("skipped: set OUTBOXD_PG_BIN to a PostgreSQL 17+ bin directory");
        return;
    };
    let bin = PathBuf::from(bin);
    if major(&bin) < 17 {
        eprintln!("skipped: failover slots need PostgreSQL 17 or later");
        return;
    }

    // The primary, with a physical slot for the standby.
    let primary = Cluster::new(&bin, "outboxd_fo_primary");
    run(primary
        .command("initdb")
        .arg("-D")
        .arg(primary.data())
        .args(["-U", "postgres", "-A", "trust", "--no-sync"]));
    primary.configure(&["wal_level = logical".into()]);
    primary.start();
    let on_primary = primary.env().client().await;
    on_primary
        .batch_execute("SELECT pg_create_physical_replication_slot('standby1', true)")
        .await
        .expect("physical slot");

    // The standby: a copy of the data directory between pg_backup_start and
    // pg_backup_stop (no pg_basebackup in every build), streaming from the slot above.
    let standby = Cluster::new(&bin, "outboxd_fo_standby");
    on_primary
        .batch_execute("SELECT pg_backup_start('outboxd failover test', true)")
        .await
        .expect("pg_backup_start");
    run(Command::new("cp")
        .arg("-a")
        .arg(primary.data())
        .arg(standby.data()));
    let row = on_primary
        .query_one("SELECT labelfile FROM pg_backup_stop(true)", &[])
        .await
        .expect("pg_backup_stop");
    let label: String = row.get(0);
    for leftover in ["postmaster.pid", "postmaster.opts"] {
        let _ = std::fs::remove_file(standby.data().join(leftover));
    }
    for dir in ["pg_replslot", "pg_wal"] {
        for entry in std::fs::read_dir(standby.data().join(dir)).expect(dir) {
            let path = entry.expect("entry").path();
            if path.is_dir() && path.file_name().is_some_and(|n| n != "archive_status") {
                std::fs::remove_dir_all(&path).expect("remove");
            } else if path.is_file() {
                std::fs::remove_file(&path).expect("remove");
            }
        }
    }
    std::fs::write(standby.data().join("backup_label"), label).expect("backup_label");
    std::fs::write(standby.data().join("standby.signal"), "").expect("standby.signal");
    standby.configure(&[
        format!(
            "primary_conninfo = 'host=127.0.0.1 port={} user=postgres dbname=postgres'",
            primary.port
        ),
        "primary_slot_name = 'standby1'".into(),
        "hot_standby_feedback = on".into(),
        "sync_replication_slots = on".into(),
    ]);
    if is_root() {
        run(Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(standby.data()));
    }
    standby.start();
    for sql in [
        "ALTER SYSTEM SET synchronized_standby_slots = 'standby1'",
        "SELECT pg_reload_conf()",
    ] {
        on_primary.batch_execute(sql).await.expect(sql);
    }

    // outboxd's slot, with failover, and a row written before the failover.
    let mut config = primary.env().config();
    config.slot_failover = true;
    config.status_interval = Duration::from_secs(1);
    let layout = OutboxLayout::default();
    let connector =
        PostgresConnector::new(config.clone(), "fo", layout.clone()).expect("connector");
    Connector::init(&connector, ReadMode::Log)
        .await
        .expect("init");
    let slot = connector.slot();
    on_primary
        .execute(INSERT, &[&"before-failover"])
        .await
        .expect("insert");
    // Published and confirmed: the slot moves past it (its catalog_xmin too, which the
    // standby's copy waits for before it is kept).
    let mut stream = connector.open_stream().await.expect("stream");
    let t = next_transaction(&mut stream).await;
    assert_eq!(ids(&t), ["before-failover"]);
    stream.confirm(&t.commit_position).await.expect("confirm");
    let confirmed = Lsn::from_position(&t.commit_position).expect("lsn");
    wait_true(
        &on_primary,
        &format!(
            "SELECT confirmed_flush_lsn >= '{confirmed}' FROM pg_replication_slots \
             WHERE slot_name = '{slot}'"
        ),
        "the confirmation on the primary",
    )
    .await;

    // The standby's copy of the slot is ready, and it has the row.
    let on_standby = standby.env().client().await;
    let ready = format!(
        "SELECT synced AND NOT temporary AND NOT conflicting \
         AND confirmed_flush_lsn >= '{confirmed}' FROM pg_replication_slots \
         WHERE slot_name = '{slot}'"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // The slot's catalog_xmin moves only as the stream decodes a running-xacts
        // record past what was confirmed: log one, and confirm the progress reported.
        on_primary
            .batch_execute("SELECT pg_log_standby_snapshot()")
            .await
            .expect("pg_log_standby_snapshot");
        if let Ok(item) = timeout(Duration::from_millis(300), stream.next()).await {
            match item.expect("stream") {
                ChangeItem::Progress(p) => stream.confirm(&p).await.expect("confirm"),
                other => panic!("unexpected {other:?}"),
            }
        }
        let row = on_standby
            .query_opt(&ready, &[])
            .await
            .expect("slot on standby");
        if row.is_some_and(|r| r.get::<_, Option<bool>>(0) == Some(true)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the standby did not synchronize slot {slot} in time; its log:\n{}",
            std::fs::read_to_string(standby.dir.join("log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_true(
        &on_standby,
        "SELECT count(*) = 1 FROM outbox WHERE message_id = 'before-failover'",
        "the row on the standby",
    )
    .await;

    // The primary dies; the standby is promoted.
    drop(stream);
    drop(on_primary);
    run(primary
        .command("pg_ctl")
        .arg("-D")
        .arg(primary.data())
        .args(["-m", "immediate", "-w", "stop"]));
    run(standby
        .command("pg_ctl")
        .arg("-D")
        .arg(standby.data())
        .args(["-w", "promote"]));
    wait_true(
        &on_standby,
        "SELECT NOT pg_is_in_recovery()",
        "the promotion",
    )
    .await;

    // outboxd pointed at the new primary: the slot is there, and reading goes on from it.
    config.port = standby.port;
    let connector = PostgresConnector::new(config, "fo", layout).expect("connector");
    let report = Connector::check(&connector, ReadMode::Log).await;
    assert_eq!(
        line(&report, "replication slot").status,
        CheckStatus::Ok,
        "{}",
        render(&report)
    );
    assert_ne!(
        line(&report, "slot failover").status,
        CheckStatus::Fail,
        "{}",
        render(&report)
    );
    let mut stream = connector
        .open_stream()
        .await
        .expect("stream after failover");
    // It goes on past what was confirmed before the failover: the next row only.
    on_standby
        .execute(INSERT, &[&"after-failover"])
        .await
        .expect("insert on the new primary");
    assert_eq!(
        ids(&next_transaction(&mut stream).await),
        ["after-failover"]
    );
}
