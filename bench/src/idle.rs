//! The idle outbox: no query on it in log mode while other tables are written.

use crate::*;

/// Reads and index scans of `table`, and rows updated, from pg_stat_user_tables.
pub(crate) async fn table_activity(sql: &Client, table: &str) -> anyhow::Result<(i64, i64)> {
    let row = sql
        .query_one(
            "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0), n_tup_upd \
             FROM pg_stat_user_tables WHERE relname = $1",
            &[&table],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// With the log-mode outboxd running and its outbox idle: are there scans of the outbox
/// table over the window? Waits out PostgreSQL's statistics flush first (an idle backend
/// reports its counts within 10 s).
pub(crate) async fn idle_check(
    sql: Client,
    table: String,
    daemon: Daemon,
    seconds: f64,
) -> anyhow::Result<Idle> {
    tokio::time::sleep(Duration::from_secs(11)).await;
    let before = table_activity(&sql, &table).await?;
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let after = table_activity(&sql, &table).await?;
    let code = daemon.terminate(Duration::from_secs(60)).await?;
    Ok(Idle {
        window_seconds: seconds,
        scans: after.0 - before.0,
        updates: after.1 - before.1,
        exit_code: code,
    })
}
