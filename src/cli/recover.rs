//! `outboxd recover`: publish every INIT row after the log position was lost.

use std::time::Instant;

use outboxd_connector::{Connector, OutboxAdmin, OutboxStore, WriteBack};

use crate::config::Config;
use crate::relay::outcome::Outcome;
use crate::sink::{FailureKind, Sink};

/// `outboxd recover`: the log position is lost (slot dropped or invalidated, binlog
/// purged). Start the log afresh at the server's current position first, so every row
/// committed from now on comes through the log, then publish every INIT row written
/// before, in id order, writing statuses back as the log path does. A row committed in
/// between may be sent twice; none is skipped.
pub(super) async fn recover<C: Connector, S: Sink>(
    config: &Config,
    connector: &C,
    sink: &S,
) -> anyhow::Result<i32> {
    println!("{}", connector.reset_log_position().await?);
    let store = connector.open_store().await?;
    const BATCH: usize = 500;
    let started = Instant::now();
    let (mut after_id, mut sent, mut failed) = (0i64, 0u64, 0u64);
    loop {
        let rows = store.scan_init(after_id, BATCH).await?;
        let Some(last) = rows.last() else { break };
        after_id = last.id;
        let mut pending = Vec::with_capacity(rows.len());
        for event in &rows {
            pending.push((event, sink.send(event).await));
        }
        let (mut delivered, mut failures) = (Vec::new(), Vec::new());
        let mut sink_failure = None;
        for (event, delivery) in pending {
            let result = delivery.await;
            match Outcome::new(event.id, event.retry_count, result, &config.retry) {
                Outcome::Delivered(d) => delivered.push(d),
                // The sink failed, not the row: it stays INIT, no attempt counted.
                Outcome::Failed {
                    failure,
                    kind: FailureKind::Fatal,
                } => {
                    sink_failure.get_or_insert(failure.error);
                }
                Outcome::Failed { failure, .. } => {
                    tracing::warn!(id = event.id, message_id = %event.message_id, error = %failure.error, "recover: delivery failed");
                    failures.push(failure);
                }
            }
        }
        let batch = WriteBack {
            delivered: &delivered,
            failed: &failures,
            ..WriteBack::default()
        };
        store.write_back(batch).await?;
        sent += delivered.len() as u64;
        failed += failures.len() as u64;
        if let Some(error) = sink_failure {
            anyhow::bail!(
                "the Kafka producer failed fatally: {error}; {sent} rows were published, the \
                 rest stay INIT with no attempt counted: run `outboxd recover --config <file>` \
                 again"
            );
        }
        let rate = (sent + failed) as f64 / started.elapsed().as_secs_f64().max(0.001);
        println!(
            "recover: {sent} published, {failed} failed (up to id {after_id}, {rate:.0} rows/s)"
        );
    }
    println!(
        "recover done: {sent} INIT rows published, {failed} marked FAILED (the retry worker of \
         `outboxd run` retries them); start `outboxd run` to resume from the new log position"
    );
    Ok(0)
}
