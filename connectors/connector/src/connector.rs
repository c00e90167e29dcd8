use std::fmt;
use std::future::Future;

use crate::{
    ChangeStream, CheckReport, ConnectorError, InboxStore, OutboxLayout, OutboxStore, TableAdmin,
};

/// Environment variable that overrides the source's password, whatever the engine.
pub const ENV_SOURCE_PASSWORD: &str = "OUTBOXD_SOURCE_PASSWORD";

/// How a pipeline finds new outbox rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadMode {
    /// Tail the database log (logical replication, binlog).
    #[default]
    Log,
    /// Claim INIT rows with `SELECT … FOR UPDATE SKIP LOCKED`: no log access needed.
    Poll,
}

/// One database engine's side of a pipeline, built from its configuration.
///
/// The core opens a fresh stream and store after every transient failure, so opening
/// must be cheap to retry and must not change anything on the server except what
/// `init` is documented to create.
pub trait Connector: Send + Sync {
    /// The log tail.
    type Stream: ChangeStream;
    /// The SQL side: the pipeline's write-back and claims, and the operator's actions
    /// on the outbox ([`TableAdmin::TABLE`] is [`TableKind::Outbox`](crate::TableKind)).
    type Store: OutboxStore + TableAdmin;
    /// The inbox table's side, and the operator's actions on it
    /// ([`TableKind::Inbox`](crate::TableKind)).
    type Inbox: InboxStore + TableAdmin;

    /// Creates what is missing and returns one line per object saying whether it was
    /// created or already there. Idempotent. `Log`: tables, publication or equivalent,
    /// slot or starting checkpoint. `Poll`: tables and the index of INIT rows the claim
    /// needs; nothing that requires log access.
    fn init(
        &self,
        mode: ReadMode,
    ) -> impl Future<Output = Result<Vec<String>, ConnectorError>> + Send;

    /// `outboxd init --add-columns`: adds the columns outboxd writes (an integer row id and
    /// the status columns) to an application's outbox table whose rows it keeps, before
    /// `init`. One line per table. An engine without it says so (a definite error).
    fn add_columns(&self) -> impl Future<Output = Result<Vec<String>, ConnectorError>> + Send {
        async {
            Err(ConnectorError::definite(
                "init --add-columns: this engine keeps rows on outboxd's own table only",
            ))
        }
    }

    /// The DDL `init` would run for `mode` (tables and indexes, and the publication or
    /// equivalent in `Log` mode), with the configured names, as one script, for teams that
    /// apply DDL through their migration tool; what is not DDL (the replication slot) is
    /// a comment with the statement. No connection is made. `init` and `check` accept
    /// what it creates.
    fn schema(&self, mode: ReadMode) -> String;

    /// One line per prerequisite of `run` in `mode`, each failure with its fix. Never
    /// fails as a whole: unreachable servers are reported as lines.
    fn check(&self, mode: ReadMode) -> impl Future<Output = CheckReport> + Send;

    /// Opens the log tail at the last confirmed position. A transient error means
    /// "try again later", e.g. while another outboxd holds the slot.
    fn open_stream(&self) -> impl Future<Output = Result<Self::Stream, ConnectorError>> + Send;

    /// Opens the SQL side.
    fn open_store(&self) -> impl Future<Output = Result<Self::Store, ConnectorError>> + Send;

    /// Opens the inbox table's side (`outbox.inbox_table`); fails definitely when the
    /// table or a column is missing (run `outboxd init`).
    fn open_inbox(&self) -> impl Future<Output = Result<Self::Inbox, ConnectorError>> + Send;

    /// `outboxd recover`: starts the log afresh at the server's current position
    /// (PostgreSQL: drops and recreates the slot; MySQL: records the current binlog
    /// position as the checkpoint). The caller then publishes every INIT row, so nothing
    /// written while the log position was lost is skipped. Returns what it did.
    fn reset_log_position(&self) -> impl Future<Output = Result<String, ConnectorError>> + Send;

    /// Whether [`Connector::watch_retries`] reports operator retries (PostgreSQL:
    /// LISTEN/NOTIFY). Without it the retry worker looks every `retry.idle_check`.
    fn notifies_retries(&self) -> bool {
        false
    }

    /// Calls `on_notify` whenever an operator makes rows due (`outboxd retry`,
    /// `resolve`), and once when it starts listening, so nothing sent while it was not
    /// listening is missed. Runs until its connection fails and returns that error; the
    /// caller calls it again. Engines without notifications never return.
    fn watch_retries(
        &self,
        on_notify: &(dyn Fn() + Send + Sync),
    ) -> impl Future<Output = ConnectorError> + Send {
        let _ = on_notify;
        std::future::pending()
    }

    /// A short description for logs, e.g. `postgres 127.0.0.1:5432/app slot outboxd_orders`.
    fn describe(&self) -> String;
}

/// A connector as the binary's registry makes it: the type of its engine's `[source]`
/// keys and how the connector is made from them. The registry (`src/engines.rs`) maps
/// each `source.kind` — each database engine — to one `ConfiguredConnector`; nothing else
/// in the core names an engine.
///
/// "Engine" names the database engine alone (PostgreSQL, MySQL/MariaDB); this trait's
/// implementor is that engine's connector type.
pub trait ConfiguredConnector: Connector + Clone + 'static {
    /// The engine's own `[source]` keys (all but `kind` and `mode`), deserialized by the
    /// registry with `deny_unknown_fields`.
    type Config: Clone + fmt::Debug + Send + Sync;

    /// The connector of pipeline `pipeline` for the tables of `layout`. Rejects what the
    /// keys cannot say on their own (a name too long for a slot, a zero server id), with
    /// the key to fix.
    fn from_config(
        config: Self::Config,
        pipeline: &str,
        layout: OutboxLayout,
    ) -> Result<Self, ConnectorError>;

    /// Fills the engine's secrets from where the config says they are: the environment
    /// (e.g. [`ENV_SOURCE_PASSWORD`], which wins) or a file (`password_file`), with
    /// [`crate::secret::resolve`]. `var` reads one variable. Called once, when the config
    /// is loaded; errors name the key and never hold the secret.
    fn resolve_secrets(
        config: &mut Self::Config,
        var: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), crate::SecretError>;

    /// Rejects values of the engine's keys out of their range (durations that would
    /// overflow a deadline, a zero period), naming the key and the range. Called when the
    /// config is loaded, before anything connects.
    fn validate(config: &Self::Config) -> Result<(), String>;
}
