//! Issue 26: the inbox's insert is what Kafka ingress stores an offset after and HTTP
//! ingress answers 200 after, so it must be durable when it returns, whatever
//! `synchronous_commit` the server, database or role defaults to.
//!
//! Observed from inside the server: a deferred constraint trigger on the inbox table (the
//! test's own) fires at commit and records the `synchronous_commit` the committing
//! transaction has then, which is the value its commit waits by. The store logs in as a
//! role only this test uses, so its `ALTER ROLE … SET` changes nobody else's sessions;
//! the role is dropped again at the end, also after a failed assertion.

mod support_store;

use std::time::Duration;

use outboxd_conformance::inbox::message;
use outboxd_connector::{Connector, InboxStore, Ingested, OutboxLayout, ReadMode};
use outboxd_postgres::PostgresConnector;
use support_store::{clean_up_from_drop, runtime_grants, unique, Fixture, PgEnv};

/// A login role of this test alone, with the runtime role's grants on the fixture's
/// tables; dropped (its sessions ended first) when this is dropped.
struct TestRole {
    env: PgEnv,
    name: String,
}

impl TestRole {
    async fn create(fx: &Fixture) -> Self {
        let name = unique("ib_sync_role");
        let sql = format!(
            "CREATE ROLE \"{name}\" LOGIN PASSWORD '{name}'; {}",
            runtime_grants(&name, &fx.schema)
        );
        fx.client.batch_execute(&sql).await.expect(&sql);
        Self {
            env: PgEnv {
                user: name.clone(),
                password: name.clone(),
                ..fx.env.clone()
            },
            name,
        }
    }

    /// The role's default for its new sessions, as an administrator would set it.
    async fn set_synchronous_commit(&self, fx: &Fixture, value: &str) {
        let sql = format!(
            "ALTER ROLE \"{}\" SET synchronous_commit = {value}",
            self.name
        );
        fx.client.batch_execute(&sql).await.expect(&sql);
    }

    /// A connector to the fixture's tables logging in as this role.
    fn connector(&self, fx: &Fixture) -> PostgresConnector {
        let schema = &fx.schema;
        let layout = OutboxLayout {
            outbox_tables: vec![format!("{schema}.outbox")],
            inbox_table: format!("{schema}.inbox"),
            checkpoint_table: format!("{schema}.outboxd_checkpoint"),
            key_column: "biz_key".into(),
            ..OutboxLayout::default()
        };
        let mut config = self.env.config();
        config.slot = Some(fx.slot.clone());
        config.publication = Some(fx.slot.clone());
        PostgresConnector::new(config, &fx.slot, layout).expect("valid names")
    }
}

impl Drop for TestRole {
    fn drop(&mut self) {
        let (env, name) = (PgEnv::from_env(), self.name.clone());
        clean_up_from_drop(async move {
            let client = env.client().await;
            let _ = client
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
                    &[&name],
                )
                .await;
            let _ = client
                .batch_execute(&format!(
                    "DROP OWNED BY \"{name}\"; DROP ROLE IF EXISTS \"{name}\""
                ))
                .await;
        });
    }
}

/// Creates the test's trigger: every transaction that inserts into the inbox leaves its
/// id and, at its commit, its `synchronous_commit` in `commit_settings`.
async fn record_commit_settings(fx: &Fixture, role: &TestRole) {
    let schema = &fx.schema;
    let sql = format!(
        "CREATE TABLE \"{schema}\".commit_settings (xid bigint NOT NULL, setting text NOT NULL); \
         GRANT INSERT ON \"{schema}\".commit_settings TO \"{role}\"; \
         CREATE FUNCTION \"{schema}\".record_commit_setting() RETURNS trigger LANGUAGE plpgsql \
         AS $$ BEGIN \
           INSERT INTO \"{schema}\".commit_settings \
           VALUES (txid_current(), current_setting('synchronous_commit')); \
           RETURN NULL; \
         END $$; \
         CREATE CONSTRAINT TRIGGER record_commit_setting AFTER INSERT ON \"{schema}\".inbox \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW \
         EXECUTE FUNCTION \"{schema}\".record_commit_setting()",
        role = role.name
    );
    fx.client.batch_execute(&sql).await.expect(&sql);
}

/// The `synchronous_commit` of each inserting transaction since the last call, in commit
/// order.
async fn commits_since_last(fx: &Fixture) -> Vec<String> {
    let sql = format!(
        "WITH d AS (DELETE FROM \"{}\".commit_settings RETURNING xid, setting) \
         SELECT DISTINCT xid, setting FROM d ORDER BY xid",
        fx.schema
    );
    let rows = fx.client.query(&sql, &[]).await.expect(&sql);
    rows.iter().map(|r| r.get(1)).collect()
}

/// Two new messages, stored.
async fn insert_two(inbox: &impl InboxStore, n: u32) -> Result<(), String> {
    let batch = [
        message(&format!("m-{n}-a"), "order.created", &format!("k-{n}-a")),
        message(&format!("m-{n}-b"), "order.created", &format!("k-{n}-b")),
    ];
    let outcomes = inbox.insert(&batch).await.map_err(|e| e.to_string())?;
    assert!(
        outcomes.iter().all(|o| matches!(o, Ingested::Stored(_))),
        "{outcomes:?}"
    );
    Ok(())
}

#[tokio::test]
async fn inbox_insert_commits_durably_when_the_role_defaults_to_synchronous_commit_off() {
    let fx = Fixture::new("ib_sync").await;
    fx.init(ReadMode::Poll).await.expect("init");
    let role = TestRole::create(&fx).await;
    record_commit_settings(&fx, &role).await;
    let connector = role.connector(&fx);

    // The role's sessions default to off: the store's inserts must commit with on.
    role.set_synchronous_commit(&fx, "off").await;
    let inbox = connector.open_inbox().await.expect("open inbox");
    insert_two(&inbox, 1).await.expect("insert");
    insert_two(&inbox, 2).await.expect("insert");
    assert_eq!(
        commits_since_last(&fx).await,
        ["on", "on"],
        "an acknowledged inbox insert committed without waiting for its WAL flush"
    );

    // The connection the store opens again after it broke is set up the same way.
    fx.client
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
            &[&role.name],
        )
        .await
        .expect("end the store's session");
    let mut attempts = 0;
    while let Err(e) = insert_two(&inbox, 3).await {
        attempts += 1;
        assert!(attempts < 20, "the store did not reconnect: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(commits_since_last(&fx).await, ["on"], "after a reconnect");

    // Settings at least as strong are the administrator's and are kept.
    for (n, strong) in (10..).zip(["local", "remote_write", "remote_apply"]) {
        role.set_synchronous_commit(&fx, strong).await;
        let inbox = connector.open_inbox().await.expect("open inbox");
        insert_two(&inbox, n).await.expect("insert");
        assert_eq!(commits_since_last(&fx).await, [strong], "kept: {strong}");
    }
}
