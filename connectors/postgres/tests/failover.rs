//! `source.slot_failover` against a real server. From PostgreSQL 17 on, `init` and
//! `recover` create the slot with `failover = true` and `check` names a slot made without
//! it, with a fix that works; below 17, `init`, `recover` and `check` refuse the option
//! before changing anything. `scripts/test` runs this file on 15 (the workspace run), 18
//! and 13, so both sides are exercised.

mod support_store;

use outboxd_connector::{CheckLine, CheckReport, CheckStatus, Connector, ReadMode};
use outboxd_postgres::replication::ReplicationConnection;
use outboxd_postgres::PostgresConnector;
use support_store::Fixture;

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
