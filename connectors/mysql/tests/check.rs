//! `outboxd check` against a real MariaDB (`scripts/services`): the outbox's required
//! columns come from the connector kit's column model, the same list PostgreSQL checks.

mod support;

use mysql_async::prelude::Queryable;
use outboxd_connector::{CheckStatus, Connector, ReadMode};
use support::Fixture;

/// A table without the claim columns used to pass `check` and then fail at the first
/// retry claim: `check` must name the missing column.
#[tokio::test]
async fn an_outbox_without_claim_token_fails_check() {
    // init as the admin user, check as the runtime user (README, "Privileges").
    let f = Fixture::least_privilege("check_claim");
    f.init_for(ReadMode::Poll).await.expect("init");
    let line = |report: &[outboxd_connector::CheckLine]| {
        report
            .iter()
            .find(|l| l.item == "outbox table")
            .cloned()
            .expect("an outbox table line")
    };
    let before = line(&Connector::check(&f.connector, ReadMode::Poll).await);
    assert_eq!(before.status, CheckStatus::Ok, "{before}");

    f.sql()
        .await
        .query_drop(format!("ALTER TABLE `{}` DROP COLUMN claim_token", f.table))
        .await
        .expect("drop claim_token");
    let after = line(&Connector::check(&f.connector, ReadMode::Poll).await);
    assert_eq!(after.status, CheckStatus::Fail, "{after}");
    assert!(after.detail.contains("claim_token"), "{after}");
    assert!(!after.detail.contains("claimed_at"), "{after}");
    f.cleanup().await;
}
