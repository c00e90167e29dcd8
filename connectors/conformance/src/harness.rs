//! What an engine's test crate provides to run the scenarios: an isolated outbox with its
//! connector, and plain SQL on the side to insert rows, read and set their columns, and
//! take the log position away.
#![allow(async_fn_in_trait)]

use std::sync::atomic::{AtomicU64, Ordering};

use outboxd_connector::{Connector, ConnectorError, Position, ReadMode};

/// One outbox row to insert. Every row gets a unique `message_id`, `payload`
/// `{"k": 1}` and `headers` `{"trace": "abc", "n": 7}`.
#[derive(Clone, Debug)]
pub struct NewRow {
    /// `biz_key` (also the Kafka key).
    pub key: String,
    /// `message_type`; `(message_type, biz_key)` is unique, so rows of one key need
    /// different types.
    pub message_type: String,
    /// `max_retry_count`.
    pub max_retry_count: i32,
}

impl NewRow {
    /// A row of `key` with a type no other row has and `max_retry_count` 3.
    pub fn keyed(key: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        Self {
            key: key.to_owned(),
            message_type: format!("type-{}", N.fetch_add(1, Ordering::Relaxed)),
            max_retry_count: 3,
        }
    }

    /// One row per key, in order.
    pub fn keys(keys: &[&str]) -> Vec<Self> {
        keys.iter().map(|k| Self::keyed(k)).collect()
    }

    /// This row with another `message_type`.
    pub fn typed(mut self, message_type: &str) -> Self {
        self.message_type = message_type.to_owned();
        self
    }

    /// This row with another `max_retry_count`.
    pub fn max_retries(mut self, max_retry_count: i32) -> Self {
        self.max_retry_count = max_retry_count;
        self
    }
}

/// The columns of a row the scenarios assert on.
#[derive(Clone, Debug, PartialEq)]
pub struct RowState {
    /// `status`.
    pub status: String,
    /// `retry_count`.
    pub retry_count: i32,
    /// Seconds from now to `next_retry_time` (negative when past); `None` when NULL.
    pub next_retry_in: Option<f64>,
    /// `claim_token` as text.
    pub claim_token: Option<String>,
    /// `claimed_at IS NOT NULL`.
    pub claimed: bool,
    /// `last_error`.
    pub last_error: Option<String>,
    /// `sent_at IS NOT NULL`.
    pub sent: bool,
    /// `kafka_partition`.
    pub partition: Option<i32>,
    /// `kafka_offset`.
    pub offset: Option<i64>,
}

/// Columns to set on rows before a scenario acts, as outboxd (or a crashed worker, or
/// time) would have left them. `None` leaves a column alone.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    /// `status`.
    pub status: Option<&'static str>,
    /// `next_retry_time = now + seconds` (negative: in the past); `Some(None)`: NULL.
    pub next_retry_in: Option<Option<i64>>,
    /// `retry_count`.
    pub retry_count: Option<i32>,
    /// `max_retry_count`.
    pub max_retry_count: Option<i32>,
    /// `claim_token` (a UUID in text form), e.g. to steal a claim.
    pub claim_token: Option<String>,
    /// `claimed_at = now - seconds`.
    pub claimed_ago: Option<i64>,
    /// `message_type`.
    pub message_type: Option<String>,
    /// `last_error`.
    pub last_error: Option<String>,
    /// `created_at = now - seconds`.
    pub created_ago: Option<i64>,
    /// `updated_at = now - seconds`.
    pub updated_ago: Option<i64>,
    /// `sent_at = now - seconds`; `Some(None)`: NULL.
    pub sent_ago: Option<Option<i64>>,
}

impl Setup {
    /// `status`, with `next_retry_time = now + seconds` (or NULL).
    pub fn status(status: &'static str, next_retry_in: Option<i64>) -> Self {
        Self {
            status: Some(status),
            next_retry_in: Some(next_retry_in),
            ..Self::default()
        }
    }

    /// The `column = value` assignments of an UPDATE that applies this setup, in the
    /// engine's SQL: `literal` quotes a string, `from_now` renders `now + seconds`.
    pub fn assignments(
        &self,
        literal: impl Fn(&str) -> String,
        from_now: impl Fn(i64) -> String,
    ) -> Vec<String> {
        let nullable = |value: Option<i64>| value.map_or_else(|| "NULL".into(), &from_now);
        let mut set = Vec::new();
        let mut push = |column: &str, value: Option<String>| {
            if let Some(value) = value {
                set.push(format!("{column} = {value}"));
            }
        };
        push("status", self.status.map(&literal));
        push("next_retry_time", self.next_retry_in.map(nullable));
        push("retry_count", self.retry_count.map(|n| n.to_string()));
        push(
            "max_retry_count",
            self.max_retry_count.map(|n| n.to_string()),
        );
        push("claim_token", self.claim_token.as_deref().map(&literal));
        push("claimed_at", self.claimed_ago.map(|ago| from_now(-ago)));
        push("message_type", self.message_type.as_deref().map(&literal));
        push("last_error", self.last_error.as_deref().map(&literal));
        push("created_at", self.created_ago.map(|ago| from_now(-ago)));
        push("updated_at", self.updated_ago.map(|ago| from_now(-ago)));
        push(
            "sent_at",
            self.sent_ago.map(|sent| nullable(sent.map(|ago| -ago))),
        );
        set
    }
}

/// One of the tables of an outbox, private to the scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// The outbox table.
    Outbox,
    /// The checkpoint table (the scenario's own, not one shared with other pipelines).
    Checkpoint,
}

/// An engine's test fixture for one scenario.
pub trait Harness: Sized {
    /// The engine's connector.
    type Connector: Connector;
    /// How the engine renders UTC in [`OutboxEvent::created_at`](outboxd_connector::OutboxEvent),
    /// e.g. `+00` (PostgreSQL) or `+00:00` (MySQL).
    const UTC_OFFSET: &'static str;
    /// The `headers` object every row is inserted with (`{"trace": "abc", "n": 7}`) as
    /// the engine stores it, in its order: `jsonb` orders keys, a text column keeps them.
    const STORED_HEADERS: &'static [(&'static str, &'static str)];
    /// A transaction holding a row lock (`SELECT … FOR UPDATE`) on a separate connection.
    type Lock;

    /// A fresh, isolated outbox (its own tables, checkpoint row, slot or lock name),
    /// not initialised: the scenario calls [`Harness::init`]. `prefix` names it for
    /// whoever reads the server (engines may shorten it).
    async fn create(prefix: &str) -> Self;

    /// The connector of this outbox, logged in as the runtime role of README's
    /// "Privileges" (what `run`, `check`, `recover` and the operator commands use), so
    /// that a grant missing from `schemas/<engine>/grants.sql` fails a scenario.
    fn connector(&self) -> &Self::Connector;

    /// [`Connector::init`] as an administrator runs it: logged in as the admin role, then
    /// the runtime role's grants of `schemas/<engine>/grants.sql` on this outbox's tables.
    async fn init(&self, mode: ReadMode) -> Result<Vec<String>, ConnectorError>;

    /// Inserts `rows` in one committed transaction; returns their ids in order.
    async fn insert(&self, rows: &[NewRow]) -> Vec<i64>;

    /// Inserts `rows` in one transaction that is rolled back.
    async fn insert_rolled_back(&self, rows: &[NewRow]);

    /// The row's columns; panics when it does not exist.
    async fn row(&self, id: i64) -> RowState;

    /// Sets columns of `ids`.
    async fn set(&self, ids: &[i64], setup: &Setup);

    /// Locks row `id` in a transaction of another connection until [`Harness::unlock`].
    async fn lock_row(&self, id: i64) -> Self::Lock;

    /// Rolls the lock's transaction back.
    async fn unlock(&self, lock: Self::Lock);

    /// Four strictly increasing positions of this engine, all after any position `init`
    /// records. Where the engine's text form would sort differently from the order (e.g.
    /// `lsn:9/…` and `lsn:10/…`), they should show it.
    fn positions(&self) -> [Position; 4];

    /// The position the server (or the engine's own bookkeeping) has recorded as
    /// confirmed by the stream: PostgreSQL's slot `confirmed_flush_lsn`, MySQL's
    /// checkpoint row.
    async fn confirmed_position(&self) -> Option<Position>;

    /// Makes the position the stream would resume from unavailable, as an operator or
    /// the server's retention would: drop the slot, or point the checkpoint at a binlog
    /// the server no longer has. No stream is open.
    async fn lose_log_position(&self);

    /// Writes this outbox's checkpoint row as a dump/restore or a migration to this
    /// server would have left it: the engine's checkpoint text naming another server, at
    /// a position this server's log has or is below (an old outboxd resumed from it and
    /// skipped every row inserted so far). No stream is open.
    async fn carry_checkpoint_from_another_server(&self);

    /// The inbox row's columns (`sent` is `processed_at IS NOT NULL`; no Kafka
    /// position); panics when it does not exist.
    async fn inbox_row(&self, id: i64) -> RowState;

    /// Sets columns of inbox rows (`sent_ago` does not apply).
    async fn set_inbox(&self, ids: &[i64], setup: &Setup);

    /// Sets `processed_at = now - seconds` on inbox rows.
    async fn set_processed_ago(&self, ids: &[i64], seconds: i64);

    /// A table `(v text)` of this scenario for the SQL handler to write into, created
    /// when missing (with the grants the application gives the runtime role for its
    /// statement); its name as SQL.
    async fn effects_table(&self) -> String;

    /// The values in [`Harness::effects_table`], in insertion order.
    async fn effects(&self) -> Vec<String>;

    /// Renames this outbox's `table` away (`away`) or back, so that statements on it
    /// fail meanwhile.
    async fn hide_table(&self, table: Table, away: bool);

    /// The name of a table the janitor may archive into, with the outbox's columns:
    /// created, as README's "Privileges" says, by the administrator, who lets the runtime
    /// role insert into it (the runtime role may create no table).
    async fn archive_table(&self) -> String;

    /// Ids in the archive table, in order.
    async fn archived_ids(&self) -> Vec<i64>;

    /// Lets the runtime role insert into this outbox, as `schemas/<engine>/grants.sql`
    /// does for `[canary]` and `outboxd verify` (their rows are written like the
    /// application's).
    async fn grant_insert_on_outbox(&self);

    /// Lets the runtime role create (and drop, insert into and read) a table, as
    /// `outboxd verify --inbox` needs for its scratch table.
    async fn grant_create_table(&self);

    /// Removes everything the scenario created.
    async fn cleanup(self);
}
