//! `--scenarios console`: the operator console's pages on an outbox of a million rows, on
//! PostgreSQL and on MariaDB.
//!
//! The table: 1,000,000 rows of which 95 % SUCCESS and 5 % in trouble (25,000 FAILED,
//! due in a day so nothing claims them, and 25,000 MANUAL_REQUIRED), over 1,000 keys and 1,000 message types (one row of a type per key), with
//! varied errors. `outboxd run` (poll mode on PostgreSQL, so no slot holds the bulk
//! insert's WAL) serves `/ui`; the bench signs in and asks each page [`REPEATS`] times
//! over HTTP, the whole answer timed: the overview, the first and a deep page of FAILED
//! rows, FAILED filtered by key, by type and by error text, MANUAL_REQUIRED, the held
//! keys, and a row. Target: each under 100 ms.

use std::time::{Duration, Instant};

use anyhow::Context;
use mysql_async::prelude::Queryable;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::daemon::{BenchPipeline, Daemon, Source};
use crate::report::{Latency, Row};
use crate::Bench;

/// Rows in the table.
const ROWS: i64 = 1_000_000;
/// Times each page is asked.
const REPEATS: usize = 20;
const TOKEN: &str = "bench-console-token";

impl Bench {
    pub(crate) async fn console(&mut self) -> anyhow::Result<Vec<Row>> {
        let mut rows = Vec::new();
        for source in [Source::PgPoll, Source::Mysql] {
            let engine = if source == Source::Mysql {
                "MariaDB"
            } else {
                "PostgreSQL"
            };
            let extra = format!("\n[console]\ntoken = \"{TOKEN}\"\n");
            let scenario = if source == Source::Mysql {
                "console_my"
            } else {
                "console_pg"
            };
            let p = self.pipeline_with(scenario, source, &extra).await?;
            let started = Instant::now();
            self.fill(&p).await?;
            eprintln!(
                "console ({engine}): {ROWS} rows written in {:.1?}",
                started.elapsed()
            );
            let daemon = Daemon::spawn(
                &self.args.outboxd,
                &p.config,
                self.dir.join(format!("{scenario}.log")),
            )?;
            let measured = measure(&p, engine).await;
            let _ = daemon.terminate(Duration::from_secs(30)).await;
            rows.extend(measured?);
        }
        Ok(rows)
    }

    /// The million rows, in one statement per engine.
    async fn fill(&self, p: &BenchPipeline) -> anyhow::Result<()> {
        // n: 1..ROWS. Every 20th row is in trouble: odd ones FAILED, even ones MANUAL.
        let status = "CASE WHEN n % 20 <> 0 THEN 'SUCCESS' WHEN n % 40 = 0 THEN 'MANUAL_REQUIRED' ELSE 'FAILED' END";
        let error = "CASE WHEN n % 20 <> 0 THEN NULL WHEN n % 3 = 0 THEN 'timed out waiting for Kafka' \
                     WHEN n % 3 = 1 THEN 'broker: message too large' ELSE 'topic not in kafka.allowed_topics' END";
        match p.source {
            Source::Mysql => {
                let mut conn = mysql_async::Conn::new(mysql_async::Opts::from_url(
                    &self.services.mysql_url(),
                )?)
                .await?;
                // MariaDB's bound on a recursive CTE (MySQL's is cte_max_recursion_depth).
                conn.query_drop(format!(
                    "SET SESSION max_recursive_iterations = {}",
                    ROWS + 1
                ))
                .await
                .context("raising MariaDB's max_recursive_iterations")?;
                let sql = format!(
                    "INSERT INTO `{table}` (message_id, message_type, biz_key, payload, status, \
                     retry_count, next_retry_time, last_error) \
                     WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < {ROWS}) \
                     SELECT CONCAT('m-', n), CONCAT('type.', n DIV 1000), CONCAT('key-', n % 1000), \
                     CONCAT('{{\"n\":', n, '}}'), {status}, IF(n % 20 = 0, 3, 0), \
                     IF(n % 20 = 0, NOW(6) + INTERVAL 1 DAY, NULL), {error} FROM s",
                    table = p.table,
                );
                conn.query_drop(&sql)
                    .await
                    .context("filling the MariaDB outbox")?;
                conn.query_drop(format!("ANALYZE TABLE `{}`", p.table))
                    .await?;
                let count: Option<i64> = conn
                    .query_first(format!("SELECT COUNT(*) FROM `{}`", p.table))
                    .await?;
                anyhow::ensure!(count == Some(ROWS), "the MariaDB outbox has {count:?} rows");
            }
            _ => {
                let sql = format!(
                    "INSERT INTO \"{table}\" (message_id, message_type, biz_key, payload, status, \
                     retry_count, next_retry_time, last_error) \
                     SELECT 'm-' || n, 'type.' || n / 1000, 'key-' || n % 1000, \
                     ('{{\"n\":' || n || '}}')::jsonb, {status}, \
                     CASE WHEN n % 20 = 0 THEN 3 ELSE 0 END, \
                     CASE WHEN n % 20 = 0 THEN now() + interval '1 day' END, {error} \
                     FROM generate_series(1, {ROWS}) AS n",
                    table = p.table,
                );
                self.sql
                    .batch_execute(&sql)
                    .await
                    .context("filling the PostgreSQL outbox")?;
                self.sql
                    .batch_execute(&format!("VACUUM ANALYZE \"{}\"", p.table))
                    .await?;
            }
        }
        Ok(())
    }
}

/// Signs in and times every page.
async fn measure(p: &BenchPipeline, engine: &str) -> anyhow::Result<Vec<Row>> {
    let port = p.metrics_port;
    let deadline = Instant::now() + Duration::from_secs(60);
    let cookie = loop {
        let body = format!("token={TOKEN}&name=bench");
        let request = format!(
            "POST /ui/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if let Ok(reply) = exchange(port, &request).await {
            if let Some(cookie) = reply
                .lines()
                .find_map(|l| {
                    l.strip_prefix("set-cookie: ")
                        .or_else(|| l.strip_prefix("Set-Cookie: "))
                })
                .and_then(|c| c.split(';').next())
            {
                break cookie.to_owned();
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the console did not sign the bench in"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // A row in trouble, and an id halfway down the FAILED rows for a deep page.
    let pages = [
        ("overview", "/ui".to_owned()),
        (
            "FAILED, first page",
            "/ui/outbox/rows?status=FAILED".to_owned(),
        ),
        (
            "FAILED, deep page",
            format!("/ui/outbox/rows?status=FAILED&before={}", ROWS / 2),
        ),
        (
            "FAILED by key",
            "/ui/outbox/rows?status=FAILED&key=key-500".to_owned(),
        ),
        (
            "FAILED by type",
            "/ui/outbox/rows?status=FAILED&type=type.500".to_owned(),
        ),
        (
            "FAILED by error text",
            "/ui/outbox/rows?status=FAILED&error=too+large".to_owned(),
        ),
        (
            "MANUAL_REQUIRED, first page",
            "/ui/outbox/rows?status=MANUAL_REQUIRED".to_owned(),
        ),
        ("held keys", "/ui/outbox/held".to_owned()),
        ("a row", format!("/ui/outbox/rows/{}", ROWS / 2)),
    ];
    let mut rows = Vec::new();
    for (name, path) in pages {
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\n\r\n");
        // One warm-up (the connection, the plan cache), then the timed ones.
        let first = exchange(port, &request).await?;
        anyhow::ensure!(
            first.starts_with("HTTP/1.1 200"),
            "{path}: {}",
            first.lines().next().unwrap_or("")
        );
        let mut samples = Vec::with_capacity(REPEATS);
        for _ in 0..REPEATS {
            let started = Instant::now();
            let reply = exchange(port, &request).await?;
            samples.push(started.elapsed().as_secs_f64() * 1000.0);
            anyhow::ensure!(
                reply.starts_with("HTTP/1.1 200"),
                "{path}: {}",
                reply.lines().next().unwrap_or("")
            );
        }
        samples.sort_by(f64::total_cmp);
        let mut row = Row::named(&format!("console ({engine}): {name}"));
        row.events = REPEATS;
        row.latency = Latency::from_sorted(&samples);
        let p99 = row.latency.as_ref().map_or(f64::MAX, |l| l.p99);
        row.note = format!(
            "{ROWS} rows; {} (target < 100 ms)",
            if p99 < 100.0 { "PASS" } else { "MISS" }
        );
        eprintln!(
            "{}: p50 {:.1} ms, p99 {:.1} ms",
            row.name,
            samples[samples.len() / 2],
            p99
        );
        rows.push(row);
    }
    Ok(rows)
}

/// One request on a fresh connection (the endpoint closes each): the whole answer.
async fn exchange(port: u16, request: &str) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream.write_all(request.as_bytes()).await?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await?;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}
