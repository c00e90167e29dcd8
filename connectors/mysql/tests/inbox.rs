//! What only the MySQL/MariaDB inbox store has to get right, against a real MariaDB
//! (`scripts/services`); the contract's inbox scenarios run in `tests/conformance.rs`:
//! a batch larger than one query text, a rejected message, handler statements the server
//! refuses part-way or that do not bind, the archive (no unique keys), the payload
//! column's kinds, a missing table, and `init` adding the indexes to an older table.
//!
//! Each scenario is a plain async fn over a store and [`Tables`] (what a test reads and
//! sets behind the store's back). Each test has its own tables, so tests run in parallel.
//! The store runs as the runtime user with the grants of `schemas/mysql/grants.sql` (and
//! INSERT on the effects table), after `init` as the admin user (README, "Privileges");
//! only the archive test, about the table the janitor creates, runs as the test user.

mod support;

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use outboxd_conformance::inbox::{message, stored};
use outboxd_connector::{
    Completed, Connector, InboxMessage, InboxOutcome, InboxStore, Ingested, JanitorAction,
    JanitorRule, OutboxLayout, ReadMode, TableAdmin,
};
use outboxd_mysql::MysqlConnector;

// ---------------------------------------------------------------------------------------
// What a scenario needs besides the store.

/// An inbox row as a test sees it.
#[derive(Debug)]
struct InboxRow {
    status: String,
    retry_count: i32,
    /// `next_retry_time - now` in seconds.
    next_retry_in: Option<f64>,
    claim_token: Option<String>,
    last_error: Option<String>,
    /// The stored payload as text.
    payload: String,
}

/// Reads and sets the tables behind the store's back.
trait Tables {
    /// The row; panics when it does not exist.
    async fn row(&self, id: i64) -> InboxRow;
    /// Rows in the inbox table.
    async fn count(&self) -> i64;
    /// `status = 'DONE'`, processed and created `seconds` ago.
    async fn done_ago(&self, ids: &[i64], seconds: i64);
    /// A table `(n integer primary key, v text)` for the SQL handler; its name as SQL.
    async fn effects_table(&self) -> String;
    /// `v` of the effects, in `n` order.
    async fn effects(&self) -> Vec<String>;
    /// The `message_id`s in a table, in id order.
    async fn message_ids(&self, table: &str) -> Vec<String>;
}

// ---------------------------------------------------------------------------------------
// Scenarios.

/// A batch far larger than one query text is cut into several, still one transaction:
/// duplicates across the texts are found, and a message the server refuses late in the
/// batch leaves nothing of the batch stored, with an error naming that message.
async fn a_large_batch_is_one_transaction<S: InboxStore, T: Tables>(s: &S, t: &T) {
    let body = format!(r#"{{"pad": "{}"}}"#, "x".repeat(1000));
    let big = |n: usize| {
        let mut m = message(&format!("big-{n}"), "t", &format!("k{n}"));
        m.payload = body.clone().into_bytes();
        m
    };
    // ~2.1 KB of hex per message: 3000 messages are several 1 MiB texts.
    let mut batch: Vec<InboxMessage> = (0..3000).map(big).collect();
    for n in [700, 1500, 2999] {
        batch[n] = big(n - 600); // the same message again, in a later text
    }
    let outcomes = s.insert(&batch).await.expect("a large batch");
    assert_eq!(outcomes.len(), batch.len());
    for (n, outcome) in outcomes.iter().enumerate() {
        let duplicate = [700, 1500, 2999].contains(&n);
        assert_eq!(
            matches!(outcome, Ingested::Duplicate),
            duplicate,
            "message {n}: {outcome:?}"
        );
    }
    let ids = stored(&outcomes);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids in arrival order");
    assert_eq!(t.count().await, 2997);

    let mut batch: Vec<InboxMessage> = (3000..6000).map(big).collect();
    batch[2500].message_id = "not-json".into();
    batch[2500].payload = b"{ not json".to_vec();
    let e = s
        .insert(&batch)
        .await
        .expect_err("the server refuses the body");
    assert!(!e.is_transient(), "{e}");
    assert!(e.message().contains("`not-json`"), "names the message: {e}");
    assert_eq!(
        t.count().await,
        2997,
        "nothing of the refused batch is stored"
    );
    // The store reconnects and goes on.
    let after = s
        .insert(&[big(6000)])
        .await
        .expect("insert after a refusal");
    assert!(matches!(after[..], [Ingested::Stored(_)]), "{after:?}");
}

/// A rejected message is stored MANUAL_REQUIRED with its reason (its body kept as a JSON
/// string when it is not JSON), never claimed, and holds back its key.
async fn a_rejected_message_is_stored_for_an_operator<S: InboxStore, T: Tables>(s: &S, t: &T) {
    let mut bad = message("kafka:orders/0/17", "created", "k1");
    bad.payload = b"not json".to_vec();
    bad.rejected = Some("the record has no message_id header".into());
    let outcomes = s
        .insert(&[bad, message("m2", "updated", "k1")])
        .await
        .expect("insert");
    let [Ingested::Stored(id), Ingested::Stored(_)] = outcomes[..] else {
        panic!("a rejected message is stored: {outcomes:?}");
    };
    let row = t.row(id).await;
    assert_eq!(row.status, "MANUAL_REQUIRED");
    assert_eq!(
        row.last_error.as_deref(),
        Some("the record has no message_id header")
    );
    let due = row.next_retry_in.expect("next_retry_time = now");
    assert!((-60.0..=1.0).contains(&due), "{due}");
    assert_eq!(row.payload, r#""not json""#);
    assert!(
        s.claim(10).await.expect("claim").is_empty(),
        "neither the rejected message nor the later one of its key"
    );
}

/// A statement the server refuses writes nothing, its partial effect included: the row
/// stays PROCESSING under its claim, and the error is the handler's, for the caller to
/// record as a failed attempt. A statement that does not bind is refused the same way.
async fn a_failing_statement_writes_nothing<S: InboxStore, T: Tables>(s: &S, t: &T) {
    s.insert(&[message("f1", "t", "k1")]).await.expect("insert");
    let claimed = s.claim(10).await.expect("claim");
    let m = &claimed[0];
    let effects = t.effects_table().await;

    let missing = format!("INSERT INTO {effects} (n, no_such_column) VALUES (1, :message_id)");
    // The first row goes in, the second violates the primary key: the statement fails.
    let half = format!("INSERT INTO {effects} (n, v) VALUES (7, :message_id), (7, :message_id)");
    let unbound = format!("INSERT INTO {effects} (n, v) VALUES (?, :message_id)");
    for (statement, expect) in [
        (&missing, "no_such_column"),
        (&half, "Duplicate entry"),
        (&unbound, "parameters"),
    ] {
        let outcome = InboxOutcome::Done {
            statement: Some(statement),
        };
        let result = s.complete(m, outcome).await.expect("complete");
        let Completed::StatementFailed(error) = result else {
            panic!("the statement's error is the handler's failure: {result:?}");
        };
        assert!(error.starts_with("SQL handler: "), "{error}");
        assert!(error.contains(expect), "{error}");
        assert!(t.effects().await.is_empty(), "no effect: {statement}");
        let row = t.row(m.id).await;
        assert_eq!(row.status, "PROCESSING", "{statement}");
        assert_eq!(row.claim_token.as_deref(), Some(m.claim_token.0.as_str()));
    }

    // An unknown field is refused before anything runs.
    let unknown = format!("INSERT INTO {effects} (n, v) VALUES (1, :nope)");
    let e = (s
        .complete(
            m,
            InboxOutcome::Done {
                statement: Some(&unknown),
            },
        )
        .await)
        .expect_err("unknown field");
    assert!(!e.is_transient() && e.message().contains(":nope"), "{e}");
    assert_eq!(t.row(m.id).await.status, "PROCESSING");

    // The claim still holds: the caller records the failure.
    let failed = InboxOutcome::Failed {
        error: "SQL handler: Unknown column",
        retry_delay: Duration::from_secs(1),
    };
    assert_eq!(
        s.complete(m, failed).await.expect("fail"),
        Completed::Written
    );
    let row = t.row(m.id).await;
    assert_eq!((row.status.as_str(), row.retry_count), ("FAILED", 1));
}

/// The janitor's archive has none of the inbox's unique keys: a message stored again after
/// the deduplication window is archived a second time.
async fn the_archive_takes_a_message_twice<S: InboxStore + TableAdmin, T: Tables>(
    s: &S,
    t: &T,
    archive: &str,
) {
    let window = Duration::from_secs(86_400);
    let rule = JanitorRule::inbox(
        Duration::from_secs(60),
        window,
        JanitorAction::Archive(archive.to_owned()),
    );
    for round in 0..2 {
        let ids = stored(
            &s.insert(&[message("again", "t", "k")])
                .await
                .expect("insert"),
        );
        assert_eq!(
            ids.len(),
            1,
            "round {round}: stored, the earlier one is gone"
        );
        t.done_ago(&ids, 2 * 86_400).await;
        let moved = s.janitor_batch(&rule, 100).await.expect("janitor");
        assert_eq!(moved, 1, "round {round}");
    }
    assert_eq!(t.count().await, 0);
    assert_eq!(t.message_ids(archive).await, ["again", "again"]);
}

/// The payload column decides how bodies are stored: bytes as received in a BLOB, text in
/// a text column, JSON text in a JSON column.
async fn payloads_round_trip<S: InboxStore>(s: &S, body: &[u8]) {
    let mut m = message("raw", "t", "k");
    m.payload = body.to_vec();
    s.insert(&[m]).await.expect("insert");
    let claimed = s.claim(1).await.expect("claim");
    assert_eq!(claimed[0].payload, body);
}

// ---------------------------------------------------------------------------------------
// MariaDB.

/// Tables of one test: its own outbox, inbox, effects and archive.
struct Maria {
    /// The test user's (its own SQL, `init` in the tests of `init`).
    connector: MysqlConnector,
    /// The runtime user's: the store under test.
    run: MysqlConnector,
    name: String,
}

impl Maria {
    /// The shipped tables, made by `outboxd init` as the admin user (poll mode: no
    /// checkpoint needed), with the runtime user's grants.
    async fn new(prefix: &str) -> Self {
        let m = Self::named(prefix);
        let admin = MysqlConnector::new(
            support::as_role(m.connector.config(), "ADMIN"),
            &m.name,
            m.connector.layout().clone(),
        )
        .expect("connector");
        Connector::init(&admin, ReadMode::Poll).await.expect("init");
        m.grant_runtime(false).await;
        m
    }

    /// The grants of `schemas/mysql/grants.sql` on this test's tables (only the inbox's
    /// when `inbox_only`).
    async fn grant_runtime(&self, inbox_only: bool) {
        let layout = self.run.layout();
        let mut conn = self.sql().await;
        for sql in support::runtime_grants(
            &self.run.config().user,
            layout.outbox_table(),
            &layout.inbox_table,
            &layout.checkpoint_table,
        ) {
            if !inbox_only || sql.contains(&self.inbox()) {
                conn.query_drop(&sql).await.expect(&sql);
            }
        }
    }

    /// Only the inbox, from the shipped DDL with the payload column of `payload_type`.
    async fn with_payload(prefix: &str, payload_type: &str) -> Self {
        let m = Self::named(prefix);
        let ddl = include_str!("../../../schemas/mysql/inbox.sql")
            .replace("`inbox", &format!("`inbox_{}", m.name))
            .replace("payload          JSON", &format!("payload {payload_type}"));
        assert!(ddl.contains(payload_type));
        m.sql()
            .await
            .query_drop(ddl)
            .await
            .expect("create the inbox");
        m.grant_runtime(true).await;
        m
    }

    fn named(prefix: &str) -> Self {
        let name = format!("{prefix}_{}", support::rand_u32() % 1_000_000);
        let layout = OutboxLayout {
            outbox_tables: vec![format!("outbox_{name}")],
            inbox_table: format!("inbox_{name}"),
            ..OutboxLayout::default()
        };
        let config = support::config();
        let run = support::as_role(&config, "RUN");
        let run = MysqlConnector::new(run, &name, layout.clone()).expect("connector");
        let connector = MysqlConnector::new(config, &name, layout).expect("connector");
        Self {
            connector,
            run,
            name,
        }
    }

    /// The inbox store, as the runtime user.
    async fn store(&self) -> <MysqlConnector as Connector>::Inbox {
        self.run.open_inbox().await.expect("open the inbox")
    }

    fn inbox(&self) -> String {
        format!("`inbox_{}`", self.name)
    }

    fn archive(&self) -> String {
        format!("archive_{}", self.name)
    }

    async fn sql(&self) -> Conn {
        let c = self.connector.config();
        let opts = mysql_async::OptsBuilder::default()
            .ip_or_hostname(c.host.clone())
            .tcp_port(c.port)
            .user(Some(c.user.clone()))
            .pass(c.password.as_ref().map(|p| p.expose().to_owned()))
            .db_name(Some(c.database.clone()))
            .prefer_socket(false)
            .setup(vec!["SET time_zone = '+00:00'"]);
        Conn::new(opts).await.expect("connect to the test MariaDB")
    }

    async fn set(&self, ids: &[i64], assignments: &str) {
        let list: Vec<String> = ids.iter().map(i64::to_string).collect();
        self.sql()
            .await
            .query_drop(format!(
                "UPDATE {} SET {assignments} WHERE id IN ({})",
                self.inbox(),
                list.join(", ")
            ))
            .await
            .expect("set inbox columns");
    }

    async fn cleanup(self) {
        let mut conn = self.sql().await;
        // MySQL keeps a table's grants after the table is dropped.
        for table in ["outbox", "inbox", "effects"] {
            let revoke = format!(
                "REVOKE ALL PRIVILEGES ON `{table}_{}` FROM '{}'@'%'",
                self.name,
                self.run.config().user
            );
            let _ = conn.query_drop(revoke).await;
        }
        let _ = conn
            .query_drop(format!(
                "DROP TABLE IF EXISTS `outbox_{n}`, `inbox_{n}`, `effects_{n}`, `archive_{n}`",
                n = self.name
            ))
            .await;
    }
}

impl Tables for Maria {
    async fn row(&self, id: i64) -> InboxRow {
        type Row = (
            String,
            i32,
            Option<f64>,
            Option<String>,
            Option<String>,
            String,
        );
        let row: Option<Row> = self
            .sql()
            .await
            .query_first(format!(
                "SELECT status, retry_count, \
                 TIMESTAMPDIFF(MICROSECOND, NOW(6), next_retry_time) / 1e6, claim_token, \
                 last_error, CAST(payload AS CHAR) FROM {} WHERE id = {id}",
                self.inbox()
            ))
            .await
            .expect("read an inbox row");
        let r = row.unwrap_or_else(|| panic!("inbox row {id} exists"));
        InboxRow {
            status: r.0,
            retry_count: r.1,
            next_retry_in: r.2,
            claim_token: r.3,
            last_error: r.4,
            payload: r.5,
        }
    }

    async fn count(&self) -> i64 {
        let n: Option<i64> = (self.sql().await)
            .query_first(format!("SELECT COUNT(*) FROM {}", self.inbox()))
            .await
            .expect("count");
        n.unwrap_or(0)
    }

    async fn done_ago(&self, ids: &[i64], seconds: i64) {
        self.set(
            ids,
            &format!(
                "status = 'DONE', processed_at = NOW(6) - INTERVAL {seconds} SECOND, \
                 created_at = NOW(6) - INTERVAL {seconds} SECOND"
            ),
        )
        .await;
    }

    async fn effects_table(&self) -> String {
        let table = format!("`effects_{}`", self.name);
        self.sql()
            .await
            .query_drop(format!(
                "CREATE TABLE IF NOT EXISTS {table} (n BIGINT PRIMARY KEY, v TEXT)"
            ))
            .await
            .expect("create the effects table");
        // The SQL handler's statement runs as the runtime user.
        let grant = format!(
            "GRANT INSERT ON {table} TO '{}'@'%'",
            self.run.config().user
        );
        self.sql().await.query_drop(&grant).await.expect(&grant);
        table
    }

    async fn effects(&self) -> Vec<String> {
        (self.sql().await)
            .query(format!("SELECT v FROM `effects_{}` ORDER BY n", self.name))
            .await
            .expect("effects")
    }

    async fn message_ids(&self, table: &str) -> Vec<String> {
        (self.sql().await)
            .query(format!("SELECT message_id FROM `{table}` ORDER BY id"))
            .await
            .expect("message ids")
    }
}

// ---------------------------------------------------------------------------------------
// Tests.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_of_a_large_batch_is_one_transaction() {
    let m = Maria::new("ib_large").await;
    a_large_batch_is_one_transaction(&m.store().await, &m).await;
    m.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_message_is_stored_manual_required() {
    let m = Maria::new("ib_rejected").await;
    a_rejected_message_is_stored_for_an_operator(&m.store().await, &m).await;
    m.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_statement_is_statement_failed_and_writes_nothing() {
    let m = Maria::new("ib_sqlfail").await;
    a_failing_statement_writes_nothing(&m.store().await, &m).await;
    m.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn janitor_archive_takes_a_message_twice() {
    let m = Maria::new("ib_archive").await;
    // The test user's store: the janitor creates the archive table, which takes CREATE
    // (the runtime user archives into one the administrator made: README, "Privileges").
    let store = m.connector.open_inbox().await.expect("open the inbox");
    the_archive_takes_a_message_twice(&store, &m, &m.archive()).await;
    m.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_column_kinds() {
    let body = b"\x00\xff not UTF-8 \x80";
    let blob = Maria::with_payload("ib_blob", "LONGBLOB").await;
    let store = blob.store().await;
    assert!(!store.payload_is_json(), "a BLOB holds bytes");
    payloads_round_trip(&store, body).await;
    blob.cleanup().await;

    let text = Maria::with_payload("ib_text", "LONGTEXT").await;
    let store = text.store().await;
    assert!(
        !store.payload_is_json(),
        "a LONGTEXT without json_valid is text"
    );
    payloads_round_trip(&store, "plain text, ünïcode".as_bytes()).await;
    text.cleanup().await;

    let json = Maria::with_payload("ib_json", "JSON").await;
    let store = json.store().await;
    assert!(
        store.payload_is_json(),
        "MariaDB's JSON: LONGTEXT with json_valid"
    );
    payloads_round_trip(&store, br#"{"a": [1, 2]}"#).await;
    json.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_is_a_definite_error_naming_init() {
    let m = Maria::named("ib_missing");
    let e = m.run.open_inbox().await.expect_err("no inbox table");
    assert!(!e.is_transient(), "{e}");
    assert!(e.message().contains(&format!("inbox_{}", m.name)), "{e}");
    assert!(e.message().contains("outboxd init"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_adds_the_inbox_indexes_to_an_older_table() {
    let m = Maria::named("ib_upgrade");
    // The inbox as `outboxd init` created it before the inbox store existed.
    let ddl = include_str!("../../../schemas/mysql/inbox.sql")
        .lines()
        .filter(|line| !line.contains("KEY `inbox_due_idx`") && !line.contains("KEY `inbox_key_idx`"))
        .collect::<Vec<_>>()
        .join("\n")
        .replace(
            "UNIQUE KEY `inbox_type_key_key` (message_type, biz_key),",
            "UNIQUE KEY `inbox_type_key_key` (message_type, biz_key),\n    KEY `inbox_claim_idx` (next_retry_time, id),",
        )
        .replace("`inbox", &format!("`inbox_{}", m.name));
    m.sql()
        .await
        .query_drop(ddl)
        .await
        .expect("an older inbox table");

    let report = Connector::init(&m.connector, ReadMode::Poll)
        .await
        .expect("init");
    let inbox = format!("inbox_{}", m.name);
    for index in ["due_idx", "key_idx"] {
        let line = format!("created index {inbox}_{index} on existing table {inbox}");
        assert!(report.contains(&line), "{line}: {report:?}");
    }
    let columns: Vec<(String, String)> = (m.sql().await)
        .query(format!(
            "SELECT INDEX_NAME, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) \
             FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() \
             AND TABLE_NAME = '{inbox}' AND INDEX_NAME LIKE '%\\_idx' GROUP BY INDEX_NAME \
             ORDER BY INDEX_NAME"
        ))
        .await
        .expect("indexes");
    assert_eq!(
        columns,
        [
            (
                format!("{inbox}_claim_idx"),
                "next_retry_time,id".to_owned()
            ),
            (
                format!("{inbox}_due_idx"),
                "status,next_retry_time,id".to_owned()
            ),
            (format!("{inbox}_key_idx"), "biz_key,status,id".to_owned()),
        ]
    );
    let again = Connector::init(&m.connector, ReadMode::Poll)
        .await
        .expect("init again");
    assert!(
        again.contains(&format!("table {inbox}: exists, nothing to do")),
        "{again:?}"
    );
    m.cleanup().await;
}
