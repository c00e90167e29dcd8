//! `init`, `check`, the operator's actions (`status`, `retry`, `park`, `resolve`,
//! `janitor`, the INIT scan) and the slot reset of `recover`, against a real server.

mod support_store;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use outboxd_connector::{
    ChangeStream, CheckLine, CheckReport, CheckStatus, JanitorAction, OutboxAdmin, OutboxStore,
    Position, RetrySelector, WriteBack,
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
    let fx = Fixture::new("ad_init").await;
    let created = fx.connector.init().await.expect("init");
    let text = created.join("\n");
    let layout = fx.connector.layout();
    for expected in [
        format!("created schema {}", fx.schema),
        format!("created table {}", layout.outbox_table),
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

    let again = fx.connector.init().await.expect("second init");
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
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
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

async fn initialised(prefix: &str) -> Fixture {
    let fx = Fixture::new(prefix).await;
    fx.connector.init().await.expect("init");
    fx
}

/// `(status, retry_count, next_retry_time IS NOT NULL, claim_token IS NULL, last_error,
/// sent_at IS NOT NULL)`.
async fn state(fx: &Fixture, id: i64) -> (String, i32, bool, bool, Option<String>, bool) {
    let sql = format!(
        "SELECT status, retry_count, next_retry_time IS NOT NULL, claim_token IS NULL, \
         last_error, sent_at IS NOT NULL FROM {} WHERE id = $1",
        fx.outbox()
    );
    let r = fx.client.query_one(&sql, &[&id]).await.expect("row");
    (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5))
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

#[tokio::test]
async fn retry_makes_rows_due_again_and_notifies_the_daemon() {
    let fx = initialised("ad_retry").await;
    let ids = fx.insert_keyed(&["a", "b", "c", "d", "e"]).await;
    fx.set_status(&ids[..3], "MANUAL_REQUIRED", Some("-1 hour"))
        .await;
    fx.set_status(&ids[3..4], "FAILED", Some("1 hour")).await;
    fx.client
        .execute(
            &format!(
                "UPDATE {} SET retry_count = 3, last_error = 'broker said no', \
                 message_type = 'special' WHERE id = $1",
                fx.outbox()
            ),
            &[&ids[2]],
        )
        .await
        .expect("type");
    let store = fx.connector.open_store().await.expect("store");
    let channel = retry_channel(fx.connector.pipeline());
    let (_listener, mut notes) = listen(&fx.env, &channel).await;

    // One row by id.
    assert_eq!(
        store
            .retry_rows(&RetrySelector::Id(ids[3]))
            .await
            .expect("retry"),
        1
    );
    let (status, retries, next, unclaimed, _, _) = state(&fx, ids[3]).await;
    assert_eq!(
        (status.as_str(), retries, next, unclaimed),
        ("FAILED", 0, true, true)
    );
    let note = tokio::time::timeout(Duration::from_secs(10), notes.recv())
        .await
        .expect("NOTIFY arrives")
        .expect("listener alive");
    assert_eq!(
        (note.channel(), note.payload()),
        (channel.as_str(), "retry")
    );

    // By status and type.
    let selector = |t: Option<&str>| RetrySelector::Status {
        status: "MANUAL_REQUIRED".into(),
        message_type: t.map(str::to_owned),
    };
    assert_eq!(
        store
            .retry_rows(&selector(Some("special")))
            .await
            .expect("retry"),
        1
    );
    let (status, retries, _, _, error, _) = state(&fx, ids[2]).await;
    assert_eq!((status.as_str(), retries), ("FAILED", 0));
    assert_eq!(
        error.as_deref(),
        Some("broker said no"),
        "the last error stays"
    );
    assert_eq!(store.retry_rows(&selector(None)).await.expect("retry"), 2);
    assert_eq!(store.retry_rows(&selector(None)).await.expect("retry"), 0);
    assert_eq!(fx.status(ids[4]).await, "INIT");

    // Nothing changed: no notification. INIT rows are not retried.
    while notes.try_recv().is_ok() {}
    assert_eq!(
        store
            .retry_rows(&RetrySelector::Id(ids[4]))
            .await
            .expect("retry"),
        0
    );
    let bad = RetrySelector::Status {
        status: "INIT".into(),
        message_type: None,
    };
    let err = store
        .retry_rows(&bad)
        .await
        .expect_err("INIT is not retried");
    assert!(
        !err.is_transient() && err.message().contains("FAILED and MANUAL_REQUIRED"),
        "{err}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        notes.try_recv().is_err(),
        "no notification without a change"
    );
}

#[tokio::test]
async fn park_and_resolve_record_the_operator_reason() {
    let fx = initialised("ad_park").await;
    let ids = fx.insert_keyed(&["a", "a", "b", "c"]).await;
    fx.set_status(&ids[3..], "SUCCESS", None).await;
    let store = fx.connector.open_store().await.expect("store");
    let channel = retry_channel(fx.connector.pipeline());
    let (_listener, mut notes) = listen(&fx.env, &channel).await;

    assert!(store
        .park_row(ids[0], "customer deleted")
        .await
        .expect("park"));
    let (status, _, next, _, error, _) = state(&fx, ids[0]).await;
    assert_eq!(status, "MANUAL_REQUIRED");
    assert!(next, "parked rows stay in the partial indexes");
    assert_eq!(
        error.as_deref(),
        Some("parked by operator: customer deleted")
    );
    assert!(
        !store.park_row(ids[3], "x").await.expect("park SUCCESS"),
        "SUCCESS is final"
    );
    assert!(!store.park_row(ids[0], "x").await.expect("park again"));
    // Strict ordering now holds back a's later events.
    let blocked = store.blocked_keys(None).await.expect("blocked");
    assert!(blocked.contains("a"), "{blocked:?}");

    assert!(store
        .resolve_row(ids[0], "sent by hand")
        .await
        .expect("resolve"));
    let (status, _, next, unclaimed, error, sent) = state(&fx, ids[0]).await;
    assert_eq!(
        (status.as_str(), next, unclaimed, sent),
        ("SUCCESS", false, true, false)
    );
    assert_eq!(
        error.as_deref(),
        Some("resolved by operator without sending: sent by hand")
    );
    assert!(store.blocked_keys(None).await.expect("blocked").is_empty());
    let note = tokio::time::timeout(Duration::from_secs(10), notes.recv())
        .await
        .expect("NOTIFY on resolve")
        .expect("listener");
    assert_eq!(note.payload(), "resolve");
    assert!(!store
        .resolve_row(ids[0], "again")
        .await
        .expect("resolve again"));
    // An INIT row can be resolved too (skipped for good).
    assert!(store
        .resolve_row(ids[2], "obsolete")
        .await
        .expect("resolve INIT"));
    assert_eq!(fx.status(ids[2]).await, "SUCCESS");
    assert!(!store
        .resolve_row(i64::MAX, "none")
        .await
        .expect("no such row"));
}

#[tokio::test]
async fn janitor_deletes_or_archives_old_success_rows_in_batches() {
    let fx = initialised("ad_janitor").await;
    let old = fx.insert_rows(7, 10).await;
    let recent = fx.insert_rows(2, 10).await;
    let resolved = fx.insert_rows(1, 10).await;
    let unsent = fx.insert_rows(1, 10).await;
    let table = fx.outbox();
    fx.client
        .batch_execute(&format!(
            "UPDATE {table} SET status = 'SUCCESS', sent_at = now() - interval '10 days' \
             WHERE id BETWEEN {} AND {};
             UPDATE {table} SET status = 'SUCCESS', sent_at = now() WHERE id BETWEEN {} AND {};
             UPDATE {table} SET status = 'SUCCESS', sent_at = NULL, \
                    updated_at = now() - interval '10 days' WHERE id = {};
             UPDATE {table} SET created_at = now() - interval '30 days' WHERE id = {}",
            old[0], old[6], recent[0], recent[1], resolved[0], unsent[0]
        ))
        .await
        .expect("age rows");
    let store = fx.connector.open_store().await.expect("store");
    let week = Duration::from_secs(7 * 24 * 3600);

    // Archive: 3 + 3 + 2 (the resolved row ages from updated_at), then 0.
    let archive = format!("{}.outbox_archive", fx.schema);
    let action = JanitorAction::Archive(archive.clone());
    let mut batches = Vec::new();
    loop {
        let n = store
            .janitor_batch(week, &action, 3)
            .await
            .expect("janitor");
        batches.push(n);
        if n == 0 {
            break;
        }
    }
    assert_eq!(batches, [3, 3, 2, 0]);
    let archived: Vec<i64> = fx
        .client
        .query(
            &format!(
                "SELECT id FROM \"{}\".outbox_archive ORDER BY id",
                fx.schema
            ),
            &[],
        )
        .await
        .expect("archive")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut expected = old.clone();
    expected.push(resolved[0]);
    assert_eq!(archived, expected, "archived with their ids");
    let left: i64 = fx
        .client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(left, 3, "recent SUCCESS and unsent rows stay");

    // Delete: nothing old is left; with a zero retention the recent ones go.
    assert_eq!(
        store
            .janitor_batch(week, &JanitorAction::Delete, 100)
            .await
            .expect("delete"),
        0
    );
    assert_eq!(
        store
            .janitor_batch(Duration::ZERO, &JanitorAction::Delete, 100)
            .await
            .expect("delete"),
        2
    );
    assert_eq!(
        fx.status(unsent[0]).await,
        "INIT",
        "unsent rows are never deleted"
    );
}

#[tokio::test]
async fn status_summary_counts_rows_and_reads_checkpoint_and_lag() {
    let fx = initialised("ad_status").await;
    let ids = fx.insert_rows(5, 10).await;
    fx.set_status(&ids[..2], "SUCCESS", None).await;
    fx.set_status(&ids[2..3], "MANUAL_REQUIRED", Some("-1 hour"))
        .await;
    fx.client
        .execute(
            &format!(
                "UPDATE {} SET created_at = now() - interval '1 hour' WHERE id = $1",
                fx.outbox()
            ),
            &[&ids[3]],
        )
        .await
        .expect("age");
    let store = fx.connector.open_store().await.expect("store");
    let summary = store.status_summary().await.expect("summary");
    let count = |status: &str| {
        summary
            .counts
            .iter()
            .filter(|c| c.status == status)
            .map(|c| c.rows)
            .sum::<i64>()
    };
    assert_eq!(
        (count("INIT"), count("SUCCESS"), count("MANUAL_REQUIRED")),
        (2, 2, 1)
    );
    assert!(summary
        .counts
        .iter()
        .all(|c| c.message_type == "order.created"));
    let age = summary
        .oldest_unsent
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .expect("oldest unsent");
    assert!(
        (3500..3700).contains(&age.as_secs()),
        "oldest INIT row is an hour old: {age:?}"
    );
    assert_eq!(summary.checkpoint, None);
    assert!(summary.source_lag_bytes.is_some(), "init created the slot");

    let position: Position = "lsn:0/1000".parse().expect("lsn");
    store
        .write_back(WriteBack {
            checkpoint: Some(&position),
            ..WriteBack::default()
        })
        .await
        .expect("checkpoint");
    let summary = store.status_summary().await.expect("summary");
    let (at, written) = summary.checkpoint.expect("checkpoint");
    assert_eq!(at, position);
    assert!(SystemTime::now().duration_since(written).expect("past") < Duration::from_secs(60));
}

#[tokio::test]
async fn scan_init_pages_through_init_rows_in_id_order() {
    let fx = initialised("ad_scan").await;
    let ids = fx.insert_keyed(&["a", "b", "c", "d", "e"]).await;
    fx.set_status(&ids[1..2], "SUCCESS", None).await;
    fx.set_status(&ids[3..4], "FAILED", Some("1 hour")).await;
    let store = fx.connector.open_store().await.expect("store");
    let page = store.scan_init(0, 2).await.expect("scan");
    let got: Vec<i64> = page.iter().map(|e| e.id).collect();
    assert_eq!(got, [ids[0], ids[2]]);
    assert_eq!(page[0].biz_key, "a");
    assert_eq!(&page[0].payload[..], br#"{"k": 1}"#);
    let next = store.scan_init(ids[2], 2).await.expect("scan");
    assert_eq!(next.iter().map(|e| e.id).collect::<Vec<_>>(), [ids[4]]);
    assert!(store.scan_init(ids[4], 2).await.expect("scan").is_empty());
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
    let lsn = |s: &str| s.parse::<outboxd_connector::Lsn>().expect("lsn");
    assert!(lsn(&after) > lsn(&before), "{before} -> {after}");

    // A missing slot (and publication) is simply created.
    fx.client
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await
        .expect("drop slot");
    fx.client
        .batch_execute(&format!(
            "DROP PUBLICATION \"{}\"",
            fx.connector.publication()
        ))
        .await
        .expect("drop publication");
    let said = fx.connector.reset_log_position().await.expect("reset");
    assert!(said.contains("did not exist"), "{said}");
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
