//! The soak's traffic: the writers (one transaction at a time, learning after an error
//! whether it went in) and the bench's own reader of the relays' topics.

use super::*;

/// One writer of a relay until `stop`: a transaction of [`TX_ROWS`] rows of its own keys
/// at its share of the rate; after an error, on a new connection, whether the transaction
/// went in, and if not the same transaction again (so a key's events are committed in
/// order, each once).
pub(super) async fn steady_writer(
    load: Workload,
    writer: usize,
    progress: &Progress,
    stop: &AtomicBool,
) {
    let payload = format!(
        "{{\"pad\":\"{}\"}}",
        "x".repeat(load.payload_bytes.saturating_sub(10))
    );
    let per_writer = load.rate.unwrap_or(100.0) / WRITERS as f64;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(TX_ROWS as f64 / per_writer));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut db: Option<Writer> = None;
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let tx = progress.begun[writer].fetch_add(1, Ordering::SeqCst);
        let ids: Vec<String> = (0..TX_ROWS)
            .map(|i| format!("{}-{writer}-{tx}-{i}", load.tag))
            .collect();
        let keys: Vec<String> = (0..TX_ROWS)
            .map(|i| format!("w{writer}-k{}", (tx * TX_ROWS + i) % KEYS_PER_WRITER))
            .collect();
        let mut failures = 0;
        loop {
            let inserted = match db.as_mut() {
                Some(conn) => {
                    tokio::time::timeout(STATEMENT_TIMEOUT, conn.insert(&ids, &keys, &payload))
                        .await
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("timed out")))
                }
                None => Err(anyhow::anyhow!("not connected")),
            };
            if inserted.is_ok() {
                break;
            }
            failures += 1;
            // The outcome is unknown: ask a new connection.
            db = None;
            let Some(mut conn) = connect_until(&load, stop).await else {
                return;
            };
            let went_in =
                tokio::time::timeout(STATEMENT_TIMEOUT, conn.contains(&load.table, &ids[0]))
                    .await
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("timed out")));
            match went_in {
                Ok(true) => {
                    db = Some(conn);
                    break;
                }
                Ok(false) if failures >= 100 => {
                    progress.abandoned.fetch_add(1, Ordering::SeqCst);
                    db = Some(conn);
                    break;
                }
                Ok(false) => db = Some(conn),
                // Asked again on the next connection, before any new insert.
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

/// A writer's connection, tried every 100 ms until it opens or `stop`.
pub(super) async fn connect_until(load: &Workload, stop: &AtomicBool) -> Option<Writer> {
    loop {
        if let Ok(Ok(conn)) = tokio::time::timeout(STATEMENT_TIMEOUT, Writer::open(load)).await {
            return Some(conn);
        }
        if stop.load(Ordering::SeqCst) {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The bench's reader of the relays' topics, until `stop`: per relay (by topic), the
/// distinct records and the progress of each writer in `watched`, the duplicates and
/// when they were seen, and per key whether the first sightings come in commit order.
pub(super) fn read(
    kafka: &str,
    group: &str,
    topics: &[String],
    partitions: i32,
    watched: &[(String, Arc<Progress>)],
    stop: &AtomicBool,
) -> anyhow::Result<Vec<Delivered>> {
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let mut consumer = consume::from_beginning(kafka, group, &names, partitions)?;
    // Per topic and partition, the next offset to read: where a new consumer starts.
    let mut next: HashMap<(usize, i32), i64> = HashMap::new();
    let mut last_message = Instant::now();
    let mut out: Vec<Delivered> = topics.iter().map(|_| Delivered::default()).collect();
    let mut seen: Vec<HashSet<(usize, usize, usize)>> =
        topics.iter().map(|_| HashSet::new()).collect();
    // Per relay and key: the latest (transaction, row) seen.
    let mut latest: Vec<HashMap<Vec<u8>, (usize, usize)>> =
        topics.iter().map(|_| HashMap::new()).collect();
    while !stop.load(Ordering::SeqCst) {
        // A silent consumer is made anew where it was: after a broker freeze a consumer
        // was seen to read nothing more while the topics grew.
        if last_message.elapsed() > READER_SILENCE {
            let mut assignment = rdkafka::TopicPartitionList::new();
            for (r, topic) in topics.iter().enumerate() {
                for p in 0..partitions {
                    let offset = next
                        .get(&(r, p))
                        .map_or(rdkafka::Offset::Beginning, |o| rdkafka::Offset::Offset(*o));
                    assignment.add_partition_offset(topic, p, offset)?;
                }
            }
            eprintln!(
                "soak reader: nothing read for {READER_SILENCE:?}; a new consumer from {} offsets",
                next.len()
            );
            drop(consumer);
            consumer = consume::from(kafka, group, &assignment)?;
            last_message = Instant::now();
        }
        let m = match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                eprintln!("soak reader: {e}");
                continue;
            }
            None => continue,
        };
        last_message = Instant::now();
        let Some(r) = topics.iter().position(|t| t == m.topic()) else {
            continue;
        };
        next.insert((r, m.partition()), m.offset() + 1);
        let (tag, progress) = &watched[r];
        let Some(id) = consume::message_id(&m) else {
            continue;
        };
        let Some((writer, tx, row)) = parse_id(&id, tag) else {
            continue;
        };
        if !seen[r].insert((writer, tx, row)) {
            out[r].duplicates.push(Instant::now());
            continue;
        }
        progress.unique.fetch_add(1, Ordering::SeqCst);
        if let Some(upto) = progress.seen_upto.get(writer) {
            upto.fetch_max(tx + 1, Ordering::SeqCst);
        }
        let key = m.key().unwrap_or_default().to_vec();
        let last = latest[r].entry(key).or_insert((tx, row));
        if (tx, row) < *last {
            out[r].order_violations += 1;
            if out[r].examples.len() < 5 {
                out[r].examples.push(format!(
                    "{id} first seen after {tag}-{writer}-{}-{} of its key",
                    last.0, last.1
                ));
            }
        } else {
            *last = (tx, row);
        }
    }
    Ok(out)
}

/// (writer, transaction, row) of `<tag>-<writer>-<transaction>-<row>`.
pub(super) fn parse_id(id: &str, tag: &str) -> Option<(usize, usize, usize)> {
    let mut parts = id.strip_prefix(tag)?.strip_prefix('-')?.split('-');
    let mut next = || parts.next()?.parse().ok();
    Some((next()?, next()?, next()?))
}

#[cfg(test)]
mod tests {
    use super::parse_id;

    #[test]
    fn a_message_id_names_writer_transaction_and_row() {
        assert_eq!(parse_id("a1s0-1-42-3", "a1s0"), Some((1, 42, 3)));
        assert_eq!(parse_id("a1s1-1-42-3", "a1s0"), None);
        assert_eq!(parse_id("a1s0-x-42-3", "a1s0"), None);
    }
}
