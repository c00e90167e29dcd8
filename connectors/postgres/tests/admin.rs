//! `init`, `check`, the NOTIFY of the operator's `retry` and `resolve`, poll mode's init
//! and the slot reset of `recover`, against a real server.
//!
//! What the operator's actions do to the rows (`status`, `retry`, `park`, `resolve`,
//! `janitor`, the INIT scan) is a conformance scenario: `tests/conformance.rs`.

mod support_store;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use outboxd_connector::{
    ChangeStream, CheckLine, CheckReport, CheckStatus, ReadMode, RetrySelector, TableAdmin,
};
use outboxd_postgres::retry_channel;
use support_store::{unique, Fixture, PgEnv};
use tokio_postgres::{AsyncMessage, NoTls};

fn line<'a>(report: &'a CheckReport, item: &str) -> &'a CheckLine {
    report
        .iter()
        .find(|l| l.item == item)
        .unwrap_or_else(|| panic!("no `{item}` line in\n{}", render(report)))
}

fn render(report: &CheckReport) -> String {
    report
        .iter()
        .map(|l| l.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

fn assert_fail(report: &CheckReport, item: &str, fix_contains: &str) {
    let l = line(report, item);
    assert_eq!(l.status, CheckStatus::Fail, "{}", render(report));
    let fix = l.fix.as_deref().unwrap_or_default();
    assert!(
        fix.contains(fix_contains),
        "fix of `{item}` lacks `{fix_contains}`: {fix}"
    );
}

fn assert_no_fail(report: &CheckReport) {
    assert!(
        report.iter().all(|l| l.status != CheckStatus::Fail),
        "{}",
        render(report)
    );
}

#[tokio::test]
async fn init_creates_everything_and_is_idempotent() {
    // init as the admin role, check as the runtime role (README, "Privileges").
    let fx = Fixture::least_privilege("ad_init").await;
    let created = fx.init(ReadMode::Log).await.expect("init");
    let text = created.join("\n");
    let layout = fx.connector.layout();
    for expected in [
        format!("created schema {}", fx.schema),
        format!("created table {}", layout.outbox_table()),
        format!("created table {}", layout.inbox_table),
        format!("created table {}", layout.checkpoint_table),
        format!("created publication {}", fx.connector.publication()),
        format!("created replication slot {}", fx.connector.slot()),
    ] {
        assert!(
            text.contains(&expected),
            "`{expected}` missing from:\n{text}"
        );
    }

    let again = fx.admin.init().await.expect("second init");
    assert_eq!(again.len(), 5, "{again:?}");
    assert!(
        again.iter().all(|l| l.contains("nothing to do")),
        "{again:?}"
    );

    let report = fx.connector.check().await;
    eprintln!("{text}\n{}\n{}", again.join("\n"), render(&report));
    assert_no_fail(&report);
    for item in [
        "connection",
        "wal_level",
        "role",
        "outbox table",
        "outbox payload",
        "outbox indexes",
        "publication",
        "replication slot",
        "slot lag",
        "slot reader",
        "checkpoint table",
    ] {
        assert_eq!(
            line(&report, item).status,
            CheckStatus::Ok,
            "{}",
            render(&report)
        );
    }

    // The index the schema ships keeps the SUCCESS write-back HOT; one on status does not.
    fx.client
        .batch_execute(&format!(
            "CREATE INDEX ON {} (id) WHERE status = 'INIT'",
            fx.outbox()
        ))
        .await
        .expect("bad index");
    let report = fx.connector.check().await;
    assert_eq!(
        line(&report, "outbox indexes").status,
        CheckStatus::Warn,
        "{}",
        render(&report)
    );
}

#[tokio::test]
async fn check_reports_each_missing_object_with_its_fix() {
    let fx = Fixture::new("ad_miss").await;
    let report = fx.connector.check().await;
    assert_eq!(line(&report, "connection").status, CheckStatus::Ok);
    assert_fail(&report, "outbox table", "outboxd init");
    assert_fail(&report, "publication", "CREATE PUBLICATION");
    assert_fail(
        &report,
        "replication slot",
        "pg_create_logical_replication_slot",
    );
    assert_fail(&report, "checkpoint table", "outboxd init");

    fx.connector.init().await.expect("init");
    assert_no_fail(&fx.connector.check().await);

    // Missing publication.
    let publication = fx.connector.publication();
    fx.client
        .batch_execute(&format!("DROP PUBLICATION \"{publication}\""))
        .await
        .expect("drop");
    let report = fx.connector.check().await;
    assert_fail(&report, "publication", "CREATE PUBLICATION");
    assert_eq!(line(&report, "replication slot").status, CheckStatus::Ok);

    // A publication that also streams updates: check fails, init refuses and says how to fix.
    fx.client
        .batch_execute(&format!(
            "CREATE PUBLICATION \"{publication}\" FOR TABLE {}",
            fx.outbox()
        ))
        .await
        .expect("publication for all operations");
    let report = fx.connector.check().await;
    assert_fail(&report, "publication", "publish = 'insert'");
    let err = fx
        .connector
        .init()
        .await
        .expect_err("init must refuse the publication");
    assert!(!err.is_transient());
    assert!(err.to_string().contains("publish = 'insert'"), "{err}");
    fx.client
        .batch_execute(&format!(
            "ALTER PUBLICATION \"{publication}\" SET (publish = 'insert')"
        ))
        .await
        .expect("fix publication");
    assert_no_fail(&fx.connector.check().await);

    // Missing slot.
    fx.client
        .execute("SELECT pg_drop_replication_slot($1)", &[&fx.slot])
        .await
        .expect("drop slot");
    let report = fx.connector.check().await;
    assert_fail(&report, "replication slot", "outboxd init");
    assert_eq!(line(&report, "publication").status, CheckStatus::Ok);

    // Missing outbox table (and the slot is recreated by init meanwhile).
    fx.connector.init().await.expect("init recreates the slot");
    fx.client
        .batch_execute(&format!("DROP TABLE {}", fx.outbox()))
        .await
        .expect("drop table");
    let report = fx.connector.check().await;
    assert_fail(&report, "outbox table", "outboxd init");
}

#[tokio::test]
async fn check_reports_a_missing_column() {
    let fx = Fixture::new("ad_col").await;
    fx.connector.init().await.expect("init");
    fx.client
        .batch_execute(&format!(
            "ALTER TABLE {} DROP COLUMN kafka_offset",
            fx.outbox()
        ))
        .await
        .expect("drop column");
    let report = fx.connector.check().await;
    assert_fail(&report, "outbox table", "ADD COLUMN");
    assert!(line(&report, "outbox table")
        .detail
        .contains("kafka_offset"));
}

/// A throwaway PostgreSQL cluster in a temp dir owned by the `postgres` OS user (when the
/// tests run as root), stopped and removed on drop, also after a panic.
struct TempCluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl TempCluster {
    fn start(bin: &Path, settings: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(unique("outboxd_pg"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let port = outboxd_conformance::ports::free_loopback_port();
        let cluster = Self {
            bin: bin.to_owned(),
            dir,
            port,
        };
        if is_root() {
            run(Command::new("chown")
                .arg("postgres:postgres")
                .arg(&cluster.dir));
        }
        let data = cluster.dir.join("data");
        run(cluster.command("initdb").arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
        ]));
        let mut options = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off",
            cluster.dir.display()
        );
        for s in settings {
            options.push_str(&format!(" -c {s}"));
        }
        run(cluster
            .command("pg_ctl")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(cluster.dir.join("log"))
            .args(["-o", &options, "-w", "start"]));
        cluster
    }

    /// `bin/<program>`, run as the postgres user when we are root (initdb refuses root).
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

impl Drop for TempCluster {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
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

/// Needs `OUTBOXD_PG_BIN` (e.g. /usr/lib/postgresql/15/bin); skipped without it.
#[tokio::test]
async fn wal_level_replica_is_reported_and_init_refuses() {
    let Ok(bin) = std::env::var("OUTBOXD_PG_BIN") else {
        eprintln!("skipped: set OUTBOXD_PG_BIN to a directory with initdb and pg_ctl");
        return;
    };
    let cluster = TempCluster::start(Path::new(&bin), &["wal_level=replica"]);
    let fx = Fixture::with_env(cluster.env(), "ad_wal").await;

    let report = fx.connector.check().await;
    assert_fail(&report, "wal_level", "wal_level = logical");
    assert!(line(&report, "wal_level").detail.contains("replica"));

    let err = fx
        .connector
        .init()
        .await
        .expect_err("init needs wal_level=logical");
    assert!(!err.is_transient(), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("wal_level") && message.contains("restart PostgreSQL"),
        "{message}"
    );
    // Nothing was created before the refusal.
    let exists: bool = fx
        .client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&fx.outbox()])
        .await
        .expect("lookup")
        .get(0);
    assert!(
        !exists,
        "init created tables although it could not create the slot"
    );
    drop(fx);
    drop(cluster);
}

/// A fixture whose connector runs as the runtime role, after `init` as the admin role.
async fn initialised(prefix: &str) -> Fixture {
    let fx = Fixture::least_privilege(prefix).await;
    fx.init(ReadMode::Log).await.expect("init");
    fx
}

/// A connection that LISTENs on `channel`; notifications arrive on the receiver.
async fn listen(
    env: &PgEnv,
    channel: &str,
) -> (
    tokio_postgres::Client,
    tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
) {
    let conn_str = format!(
        "host={} port={} user={} password={} dbname={}",
        env.host, env.port, env.user, env.password, env.database
    );
    let (client, mut connection) = tokio_postgres::connect(&conn_str, NoTls)
        .await
        .expect("connect");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = futures_util::StreamExt::next(&mut messages).await {
            if let AsyncMessage::Notification(n) = message {
                let _ = tx.send(n);
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN \"{}\"", channel.replace('"', "\"\"")))
        .await
        .expect("listen");
    (client, rx)
}

/// `retry` and `resolve` wake a running daemon through NOTIFY on the pipeline's channel,
/// only when they changed a row. (What they do to the rows: the conformance scenarios
/// `retry_makes_rows_due_again` and `park_and_resolve_record_the_operator_reason`.)
#[tokio::test]
async fn retry_and_resolve_notify_the_daemon() {
    let fx = initialised("ad_notify").await;
    let ids = fx.insert_keyed(&["a", "b", "c"]).await;
    fx.set_status(&ids[..1], "MANUAL_REQUIRED", Some("-1 hour"))
        .await;
    let store = fx.connector.open_store().await.expect("store");
    let channel = retry_channel(fx.connector.pipeline());
    let (_listener, mut notes) = listen(&fx.env, &channel).await;

    assert_eq!(
        store
            .retry_rows(&RetrySelector::Id(ids[0]))
            .await
            .expect("retry"),
        1
    );
    let note = tokio::time::timeout(Duration::from_secs(10), notes.recv())
        .await
        .expect("NOTIFY arrives")
        .expect("listener alive");
    assert_eq!(
        (note.channel(), note.payload()),
        (channel.as_str(), "retry")
    );

    // Nothing changed: no notification.
    assert_eq!(
        store
            .retry_rows(&RetrySelector::Id(ids[1]))
            .await
            .expect("retry INIT"),
        0
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        notes.try_recv().is_err(),
        "no notification without a change"
    );

    assert!(store
        .resolve_row(ids[2], "sent by hand")
        .await
        .expect("resolve"));
    let note = tokio::time::timeout(Duration::from_secs(10), notes.recv())
        .await
        .expect("NOTIFY on resolve")
        .expect("listener");
    assert_eq!(note.payload(), "resolve");
    assert!(!store
        .resolve_row(ids[2], "again")
        .await
        .expect("resolve again"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        notes.try_recv().is_err(),
        "no notification without a change"
    );
}

async fn restart_lsn(client: &tokio_postgres::Client, slot: &str) -> Option<String> {
    client
        .query_opt(
            "SELECT restart_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .expect("slot")
        .map(|r| r.get(0))
}

#[tokio::test]
async fn reset_log_position_recreates_the_slot_unless_it_is_in_use() {
    let fx = initialised("ad_reset").await;
    let slot = fx.connector.slot();
    let before = restart_lsn(&fx.client, &slot).await.expect("slot exists");
    fx.insert_rows(3, 10).await; // WAL moves on

    // While a reader holds the slot: refused, nothing changed.
    let mut stream = fx.connector.open_stream().await.expect("stream");
    let err = fx
        .connector
        .reset_log_position()
        .await
        .expect_err("slot in use");
    assert!(!err.is_transient(), "{err}");
    assert!(
        err.message().contains("stop the running outboxd first"),
        "{err}"
    );
    let _ = tokio::time::timeout(Duration::from_millis(200), stream.next()).await;
    drop(stream);

    // Once free (the server notices the closed reader shortly): dropped and created.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let said = loop {
        match fx.connector.reset_log_position().await {
            Ok(said) => break said,
            Err(e) if std::time::Instant::now() < deadline => {
                assert!(e.message().contains("in use"), "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("slot still in use after 20s: {e}"),
        }
    };
    assert!(
        said.contains(&format!("dropped replication slot {slot}")),
        "{said}"
    );
    assert!(
        said.contains(&format!("created replication slot {slot} (pgoutput) at ")),
        "{said}"
    );
    let after = restart_lsn(&fx.client, &slot).await.expect("slot again");
    let lsn = |s: &str| s.parse::<outboxd_postgres::Lsn>().expect("lsn");
    assert!(lsn(&after) > lsn(&before), "{before} -> {after}");

    // A missing slot is simply created.
    fx.client
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await
        .expect("drop slot");
    let said = fx.connector.reset_log_position().await.expect("reset");
    assert!(said.contains("did not exist"), "{said}");
    assert!(restart_lsn(&fx.client, &slot).await.is_some());

    // A missing publication needs a role that may create it (CREATE on the database,
    // owner of the outbox): the runtime role's recover is refused, the admin's creates it
    // (README, "Privileges").
    fx.client
        .batch_execute(&format!(
            "DROP PUBLICATION \"{}\"",
            fx.connector.publication()
        ))
        .await
        .expect("drop publication");
    let err = fx
        .connector
        .reset_log_position()
        .await
        .expect_err("the runtime role creates no publication");
    assert!(
        err.message().contains("creating publication")
            && err.message().contains("permission denied"),
        "{err}"
    );
    let said = fx.admin.reset_log_position().await.expect("reset as admin");
    assert!(said.contains("created publication"), "{said}");
    assert!(restart_lsn(&fx.client, &slot).await.is_some());
    fx.connector
        .open_stream()
        .await
        .expect("the new slot streams");
}

#[tokio::test]
async fn poll_mode_init_creates_the_poll_index_and_no_slot() {
    let fx = Fixture::new("ad_poll").await;
    let said = fx.connector.init_with(true).await.expect("init").join("\n");
    assert!(said.contains("created index outbox_poll_idx"), "{said}");
    assert!(
        said.contains("no publication or replication slot"),
        "{said}"
    );
    let slot: Option<tokio_postgres::Row> = fx
        .client
        .query_opt(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
            &[&fx.connector.slot()],
        )
        .await
        .expect("slots");
    assert!(slot.is_none());
    let again = fx.connector.init_with(true).await.expect("init").join("\n");
    assert!(again.contains("index outbox_poll_idx: exists"), "{again}");
    let store = fx.connector.open_store().await.expect("store");
    let summary = store.status_summary().await.expect("summary");
    assert_eq!(summary.source_lag_bytes, None, "no slot, no lag");
}

/// Issue 10, case 2: with a synchronous standby, the walsender decodes a commit before
/// the committing session makes it visible (it waits for the standby first). The
/// write-back must not give up on such a row and write the checkpoint past it: it waits
/// while the commit waits, and writes the row SUCCESS once it is visible. Needs
/// `OUTBOXD_PG_BIN`; skipped without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_whose_commit_waits_for_a_standby_is_waited_for_not_skipped() {
    use outboxd_connector::{ChangeItem, Delivered, OutboxStore, WriteBack};

    let Ok(bin) = std::env::var("OUTBOXD_PG_BIN") else {
        eprintln!("skipped: set OUTBOXD_PG_BIN to a directory with initdb and pg_ctl");
        return;
    };
    // A standby that never connects; only the writer's session asks to wait for it.
    let cluster = TempCluster::start(
        Path::new(&bin),
        &[
            "wal_level=logical",
            "synchronous_standby_names=never_connects",
            "synchronous_commit=local",
        ],
    );
    let fx = Fixture::with_env(cluster.env(), "ad_sync").await;
    fx.connector.init().await.expect("init");
    let mut stream = fx.connector.open_stream().await.expect("stream");
    let store = fx.connector.open_store().await.expect("store");

    let writer = cluster.env().client().await;
    let insert = format!(
        "SET synchronous_commit = on; \
         INSERT INTO {} (message_id, message_type, biz_key, payload) \
         VALUES ('sync-1', 'order.created', 'k', '{{}}')",
        fx.outbox()
    );
    let commit = tokio::spawn(async move { writer.batch_execute(&insert).await });

    let txn = loop {
        match tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("the commit is decoded while it waits for the standby")
            .expect("stream")
        {
            ChangeItem::Transaction(txn) => break txn,
            ChangeItem::Part(part) => panic!("one row came in parts: {part:?}"),
            ChangeItem::Progress(_) => {}
        }
    };
    let id = txn.events[0].id;
    let delivered = [Delivered {
        table: 0,
        id,
        partition: 0,
        offset: 7,
    }];
    let position = txn.commit_position.clone();
    let write_back = store.write_back(WriteBack {
        delivered: &delivered,
        checkpoint: Some(&position),
        ..WriteBack::default()
    });
    tokio::pin!(write_back);
    // Well past the 2 s the write-back used to wait before giving the row up.
    let early = tokio::time::timeout(Duration::from_secs(5), &mut write_back).await;
    assert!(
        early.is_err(),
        "the write-back finished while the row was not visible: {early:?}"
    );
    assert!(
        !commit.is_finished(),
        "the commit still waits for the standby"
    );

    // The writer stops waiting: the commit, already durable locally, becomes visible.
    fx.client
        .execute(
            "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
            &[],
        )
        .await
        .expect("cancel the wait");
    tokio::time::timeout(Duration::from_secs(20), &mut write_back)
        .await
        .expect("the write-back finishes once the row is visible")
        .expect("write-back");
    let _ = commit.await;
    assert_eq!(fx.status(id).await, "SUCCESS");
}
