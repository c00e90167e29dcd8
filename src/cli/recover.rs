//! `outboxd recover`: publish every INIT row after the log position was lost.

use std::time::Instant;

use std::collections::HashSet;

use outboxd_connector::{
    parked_behind_key, Connector, OutboxEvent, OutboxStore, ParkedEvent, RowLifecycle, WriteBack,
};

use crate::config::{Config, Ordering as KeyOrdering};
use crate::observability::trace_context::event_span;
use crate::relay::outcome::Outcome;
use crate::sink::{acknowledged_by, FailureKind, Sink};
use tracing::Instrument;

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
    if config.outbox.rows() == RowLifecycle::Deleted {
        // The table holds no rows to scan: what the lost log held is gone from here.
        println!(
            "outbox.rows = \"deleted\": the outbox keeps no rows to publish again, so events \
             committed between the lost position and now are not sent; start `outboxd run` to \
             resume from the new log position"
        );
        return Ok(0);
    }
    let store = connector.open_store().await?;
    const BATCH: usize = 500;
    let started = Instant::now();
    // Strict ordering: keys with an event not delivered yet (FAILED, PROCESSING,
    // MANUAL_REQUIRED in the table, or failed during this recovery) keep their INIT rows
    // back, parked as the log path parks them, so none overtakes an earlier event.
    let mut failed_keys: HashSet<String> = HashSet::new();
    let (mut sent, mut failed, mut parked_rows) = (0u64, 0u64, 0u64);
    // Each outbox table in turn, in id order within it.
    let tables = config.outbox.layout().outbox_tables;
    for (table, name) in (0u16..).zip(&tables) {
        let mut after_id = 0i64;
        loop {
            let rows = store.scan_init(table, after_id, BATCH).await?;
            let Some(last) = rows.last() else { break };
            after_id = last.id;
            let counts = publish_batch(config, &store, sink, &rows, &mut failed_keys).await?;
            sent += counts.sent;
            failed += counts.failed;
            parked_rows += counts.parked;
            if let Some(error) = counts.sink_failure {
                anyhow::bail!(
                    "the Kafka producer failed fatally: {error}; {sent} rows were published, the \
                 rest stay INIT with no attempt counted: run `outboxd recover --config <file>` \
                 again"
                );
            }
            let rate = (sent + failed) as f64 / started.elapsed().as_secs_f64().max(0.001);
            println!(
                "recover: {sent} published, {failed} failed, {parked_rows} parked (up to id \
             {after_id} of {name}, {rate:.0} rows/s)"
            );
        }
    }
    println!(
        "recover done: {sent} INIT rows published, {failed} marked FAILED and {parked_rows} \
         parked behind an earlier event of their key (the retry worker of `outboxd run` \
         retries them in order); start `outboxd run` to resume from the new log position"
    );
    Ok(0)
}

/// What one batch of `recover` came to.
struct BatchCounts {
    sent: u64,
    /// FAILED, and MANUAL_REQUIRED (refused, never sent).
    failed: u64,
    parked: u64,
    /// The sink failed (not a row): the rows it did not take stay INIT.
    sink_failure: Option<String>,
}

/// Publishes one batch of INIT rows of one table and writes their statuses back: refused
/// rows MANUAL_REQUIRED, under strict ordering rows of a key with an event not delivered
/// (`failed_keys`, the table's blocked keys) parked, the rest sent.
async fn publish_batch<O: OutboxStore, S: Sink>(
    config: &Config,
    store: &O,
    sink: &S,
    rows: &[OutboxEvent],
    failed_keys: &mut HashSet<String>,
) -> anyhow::Result<BatchCounts> {
    let strict = config.pipeline.ordering == KeyOrdering::Strict;
    let blocked = if strict {
        let keys: Vec<String> = rows.iter().map(|e| e.biz_key.clone()).collect();
        store.blocked_keys(Some(&keys)).await?
    } else {
        HashSet::new()
    };
    let mut pending = Vec::with_capacity(rows.len());
    let mut parked = Vec::new();
    let mut rejected = Vec::new();
    for event in rows {
        if let Some(reason) = event.rejected.clone().or_else(|| sink.refusal(event)) {
            // Retrying cannot help: MANUAL_REQUIRED with the reason, never sent.
            if strict && !event.biz_key.is_empty() {
                failed_keys.insert(event.biz_key.clone());
            }
            rejected.push(ParkedEvent {
                id: event.id,
                table: event.table,
                reason,
            });
            continue;
        }
        if blocked.contains(&event.biz_key) || failed_keys.contains(&event.biz_key) {
            parked.push(ParkedEvent {
                id: event.id,
                table: event.table,
                reason: parked_behind_key("parked by recover", &event.biz_key),
            });
            continue;
        }
        // The event's span (its trace id when the row carries a traceparent)
        // covers its send, its acknowledgement and what is logged about it.
        let span = event_span(event);
        let delivery = sink.send(event).instrument(span.clone()).await;
        pending.push((event, span, delivery));
    }
    let (mut delivered, mut failures) = (Vec::new(), Vec::new());
    let mut sink_failure = None;
    // Under strict ordering the sink waits out a broker outage without limit; an
    // operator's command reports a failure instead.
    let deadline = tokio::time::Instant::now() + config.sink_timeout();
    for (event, span, delivery) in pending {
        let result = acknowledged_by(deadline, delivery)
            .instrument(span.clone())
            .await;
        let _entered = span.enter();
        match Outcome::new(event.row(), event.retry_count, result, &config.retry) {
            Outcome::Delivered(d) => delivered.push(d),
            // The sink failed, not the row: it stays INIT, no attempt counted.
            Outcome::Failed {
                failure,
                kind: FailureKind::Fatal,
            } => {
                sink_failure.get_or_insert(failure.error);
            }
            Outcome::Failed {
                failure,
                kind: FailureKind::Refused,
            } => {
                tracing::warn!(id = event.id, message_id = %event.message_id, error = %failure.error, "recover: the destination refused the record; the row becomes MANUAL_REQUIRED");
                if strict {
                    failed_keys.insert(event.biz_key.clone());
                }
                rejected.push(ParkedEvent {
                    id: failure.id,
                    table: failure.table,
                    reason: failure.error,
                });
            }
            Outcome::Failed { failure, .. } => {
                tracing::warn!(id = event.id, message_id = %event.message_id, error = %failure.error, "recover: delivery failed");
                if strict {
                    failed_keys.insert(event.biz_key.clone());
                }
                failures.push(failure);
            }
        }
    }
    let batch = WriteBack {
        delivered: &delivered,
        failed: &failures,
        parked: &parked,
        rejected: &rejected,
        checkpoint: None,
        replace_positions: false,
    };
    store.write_back(batch).await?;
    Ok(BatchCounts {
        sent: delivered.len() as u64,
        failed: (failures.len() + rejected.len()) as u64,
        parked: parked.len() as u64,
        sink_failure,
    })
}
