//! One test pipeline whatever the source engine: [`Pipeline<E>`] owns the names, the topic
//! and the config file; `E` ([`Engine`]) is where that engine's server is and what differs
//! on it (its `[source]` section, SQL, checkpoint text, what its logs say). The scenarios in
//! `scenarios.rs` are written against this, once for every engine.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use rand::Rng;

use super::{
    alter_topic, block_on_thread, consume_all, create_topic_with, run_outboxd, spawn_outboxd,
    topic_exists, Daemon, Record,
};

/// One outbox row a test writes: `(biz_key, seq)`. Written as message `{tag}-{key}-{seq}`
/// of type `order.step{seq}`, payload `{"key": key, "seq": seq}` and header `seq`.
pub type Event = (String, u32);

/// Where one row landed: `(kafka_partition, kafka_offset, message_id, sent_at IS NOT NULL)`.
pub type Landed = (i32, i64, String, bool);

/// What an outbox row says about its delivery.
#[derive(Debug)]
pub struct OutboxRow {
    pub status: String,
    pub retry_count: i32,
    pub last_error: Option<String>,
}

/// A source engine as the end-to-end tests see it: where its server is (read from the
/// environment `scripts/services env` prints) and what differs on it.
pub trait Engine: Sized + Sync {
    /// A connection that writes outbox rows, owned by one writer task.
    type Writer: Writer;

    /// The engine's name in what a test prints.
    const NAME: &'static str;
    /// Prefix of this engine's pipeline names, so that tests of two engines never share one.
    const NAME_PREFIX: &'static str;
    /// `OUTBOXD_LOG` of `outboxd run`.
    const LOG_FILTER: &'static str;
    /// How this engine's checkpoint positions start (`lsn:`, `binlog:`).
    const CHECKPOINT_PREFIX: &'static str;
    /// How the `created_at` header ends: the UTC offset as this engine's text renders it.
    const CREATED_AT_SUFFIX: &'static str;
    /// What a second instance's log says, every piece of it, while the first holds the
    /// pipeline (the slot, the lock).
    const STANDBY_WAITING: &'static [&'static str];
    /// What `outboxd check` reports after `init`, besides Kafka.
    const CHECK_ITEMS: &'static [&'static str];
    /// The DDL that lets the outbox's `message_type` be NULL (`{table}` stands for the
    /// table), as a user's own schema might.
    const NULLABLE_MESSAGE_TYPE: &'static str;

    /// The server named by the environment.
    fn from_env() -> Self;
    fn kafka(&self) -> &str;
    /// The config's `[source]` section, logging in as the runtime role (README,
    /// "Privileges"): what `run`, `check`, `recover` and the operator commands use.
    fn source_section(&self) -> String;
    /// `config` (written with [`Engine::source_section`]) logging in as the admin role
    /// instead, for `init`.
    fn as_admin(&self, config: &str) -> String;
    /// Gives the runtime role its table grants (`schemas/<engine>/grants.sql`) on the
    /// pipeline's tables, as the administrator does after `init`.
    fn grant_runtime(p: &Pipeline<Self>) -> impl Future<Output = ()> + Send;
    /// Adds the grant `[canary]` needs (INSERT on the outbox table), as the
    /// administrator does with `grants.sql`'s canary line.
    fn grant_canary(p: &Pipeline<Self>) -> impl Future<Output = ()> + Send;

    fn writer(p: &Pipeline<Self>) -> impl Future<Output = Self::Writer>;
    /// Rows by status.
    fn status_counts(p: &Pipeline<Self>) -> impl Future<Output = HashMap<String, i64>>;
    /// Every row by `message_id`.
    fn rows(p: &Pipeline<Self>) -> impl Future<Output = BTreeMap<String, OutboxRow>>;
    /// Every row's [`Landed`].
    fn landed(p: &Pipeline<Self>) -> impl Future<Output = Vec<Landed>>;
    /// The pipeline's checkpoint row.
    fn checkpoint(p: &Pipeline<Self>) -> impl Future<Output = Option<String>>;
    /// Drops what the test created on the server side.
    fn cleanup(p: &Pipeline<Self>) -> impl Future<Output = ()>;
    /// Runs one statement on a fresh connection.
    fn execute(p: &Pipeline<Self>, sql: &str) -> impl Future<Output = ()>;
    /// Runs `sql` as the admin role would (what a migration tool applies), then gives the
    /// runtime role its grants, as after `init`.
    fn execute_as_admin(p: &Pipeline<Self>, sql: &str) -> impl Future<Output = ()>;
    /// Takes UPDATE on the pipeline's outbox away from the runtime role.
    fn revoke_outbox_update(p: &Pipeline<Self>) -> impl Future<Output = ()>;
    /// The id of the row with `message_id`.
    fn row_id(p: &Pipeline<Self>, message_id: &str) -> impl Future<Output = i64>;
    /// Locks the pipeline's checkpoint row in an open transaction, returning once the lock
    /// is held; every write-back of the relay then waits (it updates that row), so the
    /// relay reads nothing further from the log. Dropping the sender rolls back.
    fn hold_checkpoint_row(
        p: &Pipeline<Self>,
    ) -> impl Future<Output = tokio::sync::oneshot::Sender<()>>;
}

/// Writes [`Event`]s on its own connection.
pub trait Writer: Send + 'static {
    /// Inserts `events` in one transaction and commits it.
    fn commit(&mut self, events: &[Event], tag: &str) -> impl Future<Output = ()> + Send;
    /// Inserts `events` in one transaction and rolls it back.
    fn roll_back(&mut self, events: &[Event], tag: &str) -> impl Future<Output = ()> + Send;
    /// Inserts one row bound for `topic` whose payload is padded with `pad_bytes` random
    /// letters (incompressible: the producer compresses batches).
    fn insert_padded(
        &mut self,
        message_id: &str,
        key: &str,
        seq: u32,
        topic: &str,
        pad_bytes: usize,
    ) -> impl Future<Output = ()> + Send;
}

/// `bytes` random letters.
pub fn random_pad(bytes: usize) -> String {
    rand::thread_rng()
        .sample_iter(&rand::distributions::Alphanumeric)
        .take(bytes)
        .map(char::from)
        .collect()
}

/// One test's pipeline: its own outbox table, topic, config file and whatever the engine
/// keeps per pipeline (slot and publication, checkpoint row and lock).
pub struct Pipeline<E: Engine> {
    pub services: E,
    pub name: String,
    pub table: String,
    pub topic: String,
    pub partitions: i32,
    pub config_path: PathBuf,
    pub dir: PathBuf,
}

impl<E: Engine> Pipeline<E> {
    /// Creates the topic and writes the config; `extra` is appended to the TOML.
    pub async fn new(prefix: &str, partitions: i32, extra: &str) -> Self {
        Self::on(E::from_env(), prefix, partitions, extra).await
    }

    /// As [`Pipeline::new`] on the given server.
    pub async fn on(services: E, prefix: &str, partitions: i32, extra: &str) -> Self {
        // Kafka's data outlives the services between runs on one machine: a topic an
        // earlier run left may carry the same random name, so draw again until it is new.
        let name = loop {
            let suffix: u32 = rand::thread_rng().gen_range(100_000..999_999);
            let name = format!("{}{prefix}_{suffix}", E::NAME_PREFIX);
            if !topic_exists(services.kafka(), &format!("it.{name}")) {
                break name;
            }
        };
        let table = format!("outbox_{name}");
        let topic = format!("it.{name}");
        let dir = std::env::temp_dir().join(format!("outboxd-it-{name}"));
        std::fs::create_dir_all(&dir).expect("create test dir");
        let config_path = dir.join("outboxd.toml");
        let config = format!(
            r#"
[pipeline]
name = "{name}"

{source}

[outbox]
table = "{table}"
checkpoint_table = "outboxd_checkpoint"

[kafka]
bootstrap_servers = "{kafka}"
topic_template = "{topic}"
message_timeout = "10s"
{extra}
"#,
            source = services.source_section(),
            kafka = services.kafka(),
        );
        std::fs::write(&config_path, config).expect("write config");
        let pipeline = Self {
            services,
            name,
            table,
            topic,
            partitions,
            config_path,
            dir,
        };
        pipeline.create_topic(&pipeline.topic, partitions).await;
        pipeline
    }

    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        create_topic_with(self.services.kafka(), topic, partitions, &[]).await;
    }

    /// Creates a topic with topic-level configs such as `max.message.bytes`.
    pub async fn create_topic_with(&self, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
        create_topic_with(self.services.kafka(), topic, partitions, configs).await;
    }

    /// Changes one topic-level config.
    pub async fn alter_topic(&self, topic: &str, key: &str, value: &str) {
        alter_topic(self.services.kafka(), topic, key, value).await;
    }

    /// Runs an outboxd subcommand to completion under the runtime role; `init` as an
    /// administrator runs it: under the admin role, then the runtime role's table grants
    /// (see [`Pipeline::init`]).
    pub fn outboxd(&self, args: &[&str]) -> Output {
        if args.first() != Some(&"init") {
            return run_outboxd(&self.config_path, args);
        }
        let config = std::fs::read_to_string(&self.config_path).expect("read config");
        let admin = self.dir.join("outboxd-admin.toml");
        std::fs::write(&admin, self.services.as_admin(&config)).expect("write admin config");
        let out = run_outboxd(&admin, args);
        if out.status.success() {
            block_on_thread(E::grant_runtime(self));
        }
        out
    }

    /// `outboxd init` (which must succeed) under the admin role, then the grants of
    /// `schemas/<engine>/grants.sql` to the runtime role, which runs everything else: a
    /// grant missing there fails the test.
    pub fn init(&self) {
        let out = self.outboxd(&["init"]);
        assert!(
            out.status.success(),
            "outboxd init failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts `outboxd run` in the background; its log goes to `<dir>/<log_name>`.
    pub fn spawn_run(&self, log_name: &str) -> Daemon {
        spawn_outboxd(&self.config_path, &self.dir.join(log_name), E::LOG_FILTER)
    }

    /// Reads every partition of the pipeline's topic (see [`consume_all`]).
    pub fn consume(&self, expected: usize, timeout: Duration) -> Vec<Record> {
        consume_all(
            self.services.kafka(),
            &self.topic,
            self.partitions,
            expected,
            timeout,
        )
    }

    /// A new connection that writes outbox rows.
    pub async fn writer(&self) -> E::Writer {
        E::writer(self).await
    }

    /// Rows by status.
    pub async fn status_counts(&self) -> HashMap<String, i64> {
        E::status_counts(self).await
    }

    pub async fn success_count(&self) -> i64 {
        self.status_counts()
            .await
            .get("SUCCESS")
            .copied()
            .unwrap_or(0)
    }

    /// Every row by `message_id`.
    pub async fn rows(&self) -> BTreeMap<String, OutboxRow> {
        E::rows(self).await
    }

    /// Every row's [`Landed`].
    pub async fn landed(&self) -> Vec<Landed> {
        E::landed(self).await
    }

    /// The pipeline's checkpoint row.
    pub async fn row_id(&self, message_id: &str) -> i64 {
        E::row_id(self, message_id).await
    }

    pub async fn hold_checkpoint_row(&self) -> tokio::sync::oneshot::Sender<()> {
        E::hold_checkpoint_row(self).await
    }

    pub async fn checkpoint(&self) -> Option<String> {
        E::checkpoint(self).await
    }

    /// Drops what the test created on the server side.
    pub async fn cleanup(&self) {
        E::cleanup(self).await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A test that fails before its `cleanup` still drops its slot and tables: a slot left
/// behind holds the server's WAL for good (failed runs once filled this machine's disk).
/// The cleanup runs on a thread and runtime of its own, since the test's runtime may be
/// the one unwinding. Its files stay, for the post-mortem.
impl<E: Engine> Drop for Pipeline<E> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let pipeline: &Pipeline<E> = self;
        std::thread::scope(|scope| {
            let _ = scope
                .spawn(|| {
                    if let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        runtime.block_on(E::cleanup(pipeline));
                    }
                })
                .join();
        });
    }
}
