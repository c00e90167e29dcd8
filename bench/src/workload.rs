//! The workload generator: N writer connections inserting outbox rows, each transaction
//! one multi-row INSERT (so the commit returns with the statement), as fast as possible or
//! at a fixed total rate. Each writer notes its clock right after the commit returns; the
//! rows' `message_id`s name writer and transaction, so a consumer can find that time.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;

/// Where the writers connect.
#[derive(Clone, Debug)]
pub(crate) enum Database {
    /// A tokio-postgres connection string.
    Postgres(String),
    /// A mysql_async URL (MySQL or MariaDB).
    Mysql(String),
}

/// What to write.
#[derive(Clone, Debug)]
pub(crate) struct Workload {
    /// The database.
    pub(crate) db: Database,
    /// Outbox table.
    pub(crate) table: String,
    /// Writer connections.
    pub(crate) writers: usize,
    /// Rows per transaction.
    pub(crate) tx_size: usize,
    /// Bytes of each row's JSON payload.
    pub(crate) payload_bytes: usize,
    /// Distinct `biz_key`s, drawn at random per row.
    pub(crate) keys: u64,
    /// Rows in total.
    pub(crate) events: usize,
    /// Rows per second over all writers; `None`: as fast as possible.
    pub(crate) rate: Option<f64>,
    /// Prefix of every `message_id`: `<tag>-<writer>-<tx>-<row>`.
    pub(crate) tag: String,
}

/// What was written.
#[derive(Debug, Default)]
pub(crate) struct Written {
    /// `commit_micros[writer][tx]`: the writer's clock (µs since the epoch) right after
    /// the transaction's COMMIT returned.
    pub(crate) commit_micros: Vec<Vec<u64>>,
    /// Rows written.
    pub(crate) events: usize,
    /// First and last commit, µs since the epoch.
    pub(crate) first_commit: u64,
    /// See `first_commit`.
    pub(crate) last_commit: u64,
    /// Wall time of the whole write.
    pub(crate) elapsed: Duration,
}

impl Written {
    /// The commit time of the row whose `message_id` is `id`, if it is one of ours.
    pub(crate) fn commit_of(&self, tag: &str, id: &str) -> Option<u64> {
        let rest = id.strip_prefix(tag)?.strip_prefix('-')?;
        let mut parts = rest.split('-');
        let writer: usize = parts.next()?.parse().ok()?;
        let tx: usize = parts.next()?.parse().ok()?;
        self.commit_micros.get(writer)?.get(tx).copied()
    }
}

pub(crate) fn unix_micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

pub(crate) fn now_micros() -> u64 {
    unix_micros(SystemTime::now())
}

/// A small xorshift generator: keys and padding need spread, not quality.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

pub(crate) async fn connect(conn: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(conn, tokio_postgres::NoTls)
        .await
        .context("connecting to PostgreSQL (is `scripts/services start` running?)")?;
    tokio::spawn(connection);
    Ok(client)
}

/// Runs the workload to completion.
pub(crate) async fn run(w: &Workload) -> anyhow::Result<Written> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for writer in 0..w.writers {
        let share = w.events / w.writers + usize::from(writer < w.events % w.writers);
        let w = w.clone();
        tasks.push(tokio::spawn(async move { write(&w, writer, share).await }));
    }
    let mut written = Written {
        first_commit: u64::MAX,
        ..Written::default()
    };
    for task in tasks {
        let commits = task.await.context("writer task")??;
        if let (Some(first), Some(last)) = (commits.first(), commits.last()) {
            written.first_commit = written.first_commit.min(*first);
            written.last_commit = written.last_commit.max(*last);
        }
        written.commit_micros.push(commits);
    }
    written.events = w.events;
    written.elapsed = started.elapsed();
    Ok(written)
}

/// One writer's connection and its prepared insert.
pub(crate) enum Writer {
    Postgres(tokio_postgres::Client, tokio_postgres::Statement),
    Mysql(mysql_async::Conn, String),
}

impl Writer {
    pub(crate) async fn open(w: &Workload) -> anyhow::Result<Self> {
        match &w.db {
            Database::Postgres(conn) => {
                let client = connect(conn).await?;
                let insert = client
                    .prepare(&format!(
                        "INSERT INTO \"{}\" (message_id, message_type, biz_key, payload) \
                         SELECT m, 'bench.' || m, k, $3::text::jsonb \
                         FROM unnest($1::text[], $2::text[]) AS u(m, k)",
                        w.table
                    ))
                    .await
                    .context("preparing the insert")?;
                Ok(Writer::Postgres(client, insert))
            }
            Database::Mysql(url) => {
                let opts = mysql_async::Opts::from_url(url).context("MySQL URL")?;
                let conn = mysql_async::Conn::new(opts)
                    .await
                    .context("connecting to MariaDB (is `scripts/services start` running?)")?;
                Ok(Writer::Mysql(conn, format!("`{}`", w.table)))
            }
        }
    }

    /// Whether the outbox holds the row `id` (of a transaction whose commit's outcome the
    /// writer did not learn).
    pub(crate) async fn contains(&mut self, table: &str, id: &str) -> anyhow::Result<bool> {
        Ok(match self {
            Writer::Postgres(client, _) => {
                let sql = format!("SELECT count(*) FROM \"{table}\" WHERE message_id = $1");
                client.query_one(&sql, &[&id]).await?.get::<_, i64>(0) > 0
            }
            Writer::Mysql(conn, _) => {
                use mysql_async::prelude::Queryable;
                let sql = format!("SELECT count(*) FROM `{table}` WHERE message_id = ?");
                conn.exec_first::<i64, _, _>(sql, (id,)).await?.unwrap_or(0) > 0
            }
        })
    }

    /// One transaction of `ids.len()` rows; returns when its commit has.
    pub(crate) async fn insert(
        &mut self,
        ids: &[String],
        keys: &[String],
        payload: &str,
    ) -> anyhow::Result<()> {
        match self {
            Writer::Postgres(client, insert) => {
                client.execute(insert, &[&ids, &keys, &payload]).await?;
            }
            Writer::Mysql(conn, table) => {
                use mysql_async::prelude::Queryable;
                let mut sql = format!(
                    "INSERT INTO {table} (message_id, message_type, biz_key, payload) VALUES "
                );
                let mut params: Vec<mysql_async::Value> = Vec::with_capacity(ids.len() * 4);
                for (i, (id, key)) in ids.iter().zip(keys).enumerate() {
                    sql.push_str(if i == 0 {
                        "(?, ?, ?, ?)"
                    } else {
                        ", (?, ?, ?, ?)"
                    });
                    params.push(id.as_str().into());
                    params.push(format!("bench.{id}").into());
                    params.push(key.as_str().into());
                    params.push(payload.into());
                }
                conn.exec_drop(sql, params).await?;
            }
        }
        Ok(())
    }
}

async fn write(w: &Workload, writer: usize, rows: usize) -> anyhow::Result<Vec<u64>> {
    let mut db = Writer::open(w).await?;
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (writer as u64 + 1).wrapping_mul(0x2545_F491));
    // `{"pad":"…"}`: 10 bytes of JSON around the padding.
    let pad: String = (0..w.payload_bytes.saturating_sub(10))
        .map(|_| char::from(b'a' + (rng.next() % 26) as u8))
        .collect();
    let payload = format!("{{\"pad\":\"{pad}\"}}");
    let per_writer_rate = w.rate.map(|r| r / w.writers as f64);
    let start = Instant::now();
    let txs = rows.div_ceil(w.tx_size);
    let mut commits = Vec::with_capacity(txs);
    let mut left = rows;
    for tx in 0..txs {
        let n = left.min(w.tx_size);
        left -= n;
        if let Some(rate) = per_writer_rate {
            let due = start + Duration::from_secs_f64((tx * w.tx_size) as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
        }
        let ids: Vec<String> = (0..n)
            .map(|i| format!("{}-{writer}-{tx}-{i}", w.tag))
            .collect();
        let keys: Vec<String> = (0..n)
            .map(|_| format!("key-{}", rng.next() % w.keys.max(1)))
            .collect();
        db.insert(&ids, &keys, &payload)
            .await
            .context("inserting outbox rows")?;
        commits.push(now_micros());
    }
    Ok(commits)
}
