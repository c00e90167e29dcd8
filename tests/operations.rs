//! Operating outboxd: graceful restart under load, the metrics and health endpoints.
//! Real PostgreSQL and Kafka from `scripts/services`, the real binary.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{
    consume_all, free_port, http_get, metric_value, metrics_section, wait_for, TestPipeline,
};

/// Every series `/metrics` must show once events have flowed and the status was queried.
const EXPECTED_SERIES: &[&str] = &[
    "outboxd_events_published_total",
    "outboxd_events_failed_total",
    "outboxd_publish_latency_seconds_bucket",
    "outboxd_publish_latency_seconds_count",
    "outboxd_lag_seconds",
    "outboxd_events_in_flight",
    "outboxd_transactions_total",
    "outboxd_events_parked_total",
    "outboxd_retries_total",
    "outboxd_producer_queue_depth",
    "outboxd_source_streaming",
    "outboxd_kafka_reachable",
    "outboxd_checkpoint_position",
    "outboxd_checkpoint_age_seconds",
    "outboxd_status_query_up",
    "outboxd_outbox_rows",
    "outboxd_outbox_oldest_unsent_age_seconds",
    "outboxd_source_lag_bytes",
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graceful_restart_under_load_sends_every_event_exactly_once() {
    let port = free_port();
    let p = TestPipeline::new("opsrestart", 3, &metrics_section(port)).await;
    p.init();
    let mut first = p.spawn_run("run1.log");

    // 4 writers, 250 transactions of 1 to 4 rows each, paced so the load spans the restart.
    const WRITERS: usize = 4;
    const TXS: usize = 250;
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let client = p.sql().await;
        let table = p.table.clone();
        writers.push(tokio::spawn(async move {
            let insert = format!(
                "INSERT INTO \"{table}\" (message_id, message_type, biz_key, payload) \
                 SELECT m, 'order.created', 'key-' || m, '{{}}' FROM unnest($1::text[]) AS u(m)"
            );
            let mut rows = 0usize;
            for tx in 0..TXS {
                let ids: Vec<String> = (0..=tx % 4).map(|i| format!("ops-{w}-{tx}-{i}")).collect();
                client.execute(&insert, &[&ids]).await.expect("insert");
                rows += ids.len();
                tokio::time::sleep(Duration::from_millis(8)).await;
            }
            rows
        }));
    }

    // Restart once a good part has been published and while the writers still write.
    let _ = wait_for("some events published", Duration::from_secs(60), || async {
        let sent = p.status_counts().await.get("SUCCESS").copied().unwrap_or(0);
        (sent >= 300).then_some(())
    })
    .await;
    let status = first.terminate();
    let log = first.log_text();
    assert!(status.success(), "graceful stop exits 0: {status:?}\n{log}");
    assert!(log.contains("stopped cleanly"), "{log}");
    assert!(
        !writers.iter().all(|w| w.is_finished()),
        "the restart should happen under load; make the writers slower"
    );
    let mut second = p.spawn_run("run2.log");

    let mut total = 0;
    for w in writers {
        total += w.await.expect("writer");
    }
    let counts: HashMap<String, i64> =
        wait_for("every row SUCCESS", Duration::from_secs(60), || async {
            let counts = p.status_counts().await;
            (counts.get("SUCCESS").copied() == Some(total as i64)).then_some(counts)
        })
        .await;
    assert_eq!(counts.len(), 1, "{counts:?}");

    let records = consume_all(
        &p.services.kafka,
        &p.topic,
        p.partitions,
        total,
        Duration::from_secs(60),
    );
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for r in &records {
        *seen.entry(r.headers["message_id"].as_str()).or_default() += 1;
    }
    let duplicated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        duplicated.is_empty(),
        "duplicates after a graceful restart: {duplicated:?}"
    );
    assert_eq!(seen.len(), total, "every message_id reached Kafka");
    assert_eq!(records.len(), total);

    // The endpoint of the second daemon: alive, ready, and the metrics name what happened.
    let (status, body) = http_get(port, "/healthz").await.expect("/healthz answers");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let ready = wait_for("/readyz 200", Duration::from_secs(30), || async {
        http_get(port, "/readyz")
            .await
            .filter(|(status, _)| *status == 200)
    })
    .await;
    assert!(ready.1.contains("ready"), "{ready:?}");
    let (status, metrics) = http_get(port, "/metrics").await.expect("/metrics answers");
    assert_eq!(status, 200);
    for name in EXPECTED_SERIES {
        assert!(
            metrics.lines().any(|l| l.starts_with(name)),
            "{name} missing from /metrics:\n{metrics}"
        );
    }
    let topic_label = format!("{{topic=\"{}\"}}", p.topic);
    let published = metric_value(&metrics, "outboxd_events_published_total", &topic_label)
        .expect("published counter of the topic");
    // The second daemon counts what it published itself.
    assert!((1.0..=total as f64).contains(&published), "{published}");
    assert_eq!(
        metric_value(&metrics, "outboxd_outbox_rows", "{status=\"INIT\"}"),
        Some(0.0)
    );
    assert_eq!(
        metric_value(&metrics, "outboxd_source_streaming", ""),
        Some(1.0)
    );
    assert_eq!(
        metric_value(&metrics, "outboxd_kafka_reachable", ""),
        Some(1.0)
    );
    let (status, _) = http_get(port, "/nope").await.expect("404 answers");
    assert_eq!(status, 404);

    let status = second.terminate();
    assert!(status.success(), "{status:?}\n{}", second.log_text());
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_source_and_the_endpoint_address_is_exclusive() {
    let port = free_port();
    let p = TestPipeline::new("opsready", 1, &metrics_section(port)).await;
    p.init();

    // Not ready while the source cannot be reached, healthy all the same.
    let good = std::fs::read_to_string(&p.config_path).expect("config");
    let pg_port = format!("port = {}", p.services.pg_port);
    let closed = free_port();
    std::fs::write(
        &p.config_path,
        good.replacen(&pg_port, &format!("port = {closed}"), 1),
    )
    .expect("config");
    let mut daemon = p.spawn_run("unreachable.log");
    let health = wait_for("/healthz", Duration::from_secs(30), || {
        http_get(port, "/healthz")
    })
    .await;
    assert_eq!(health.0, 200);
    let (status, body) = http_get(port, "/readyz").await.expect("/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("not streaming"), "{body}");
    let (_, metrics) = http_get(port, "/metrics").await.expect("/metrics");
    assert_eq!(
        metric_value(&metrics, "outboxd_source_streaming", ""),
        Some(0.0)
    );
    assert_eq!(
        metric_value(&metrics, "outboxd_status_query_up", ""),
        Some(0.0)
    );
    daemon.kill9();

    // Against the real database: ready; the status query answers, then comes from the cache.
    std::fs::write(&p.config_path, &good).expect("config");
    let mut daemon = p.spawn_run("run.log");
    wait_for("/readyz 200", Duration::from_secs(30), || async {
        http_get(port, "/readyz")
            .await
            .filter(|(status, _)| *status == 200)
    })
    .await;
    let (_, metrics) = http_get(port, "/metrics").await.expect("/metrics");
    assert_eq!(
        metric_value(&metrics, "outboxd_status_query_up", ""),
        Some(1.0),
        "{metrics}"
    );
    // Scraped again at once: answered from the cache.
    let (_, again) = http_get(port, "/metrics").await.expect("/metrics");
    assert!(
        again.contains("outboxd_outbox_rows{status=\"MANUAL_REQUIRED\"} 0"),
        "{again}"
    );

    // A second outboxd with the same endpoint address stops with a message that names it.
    let second = p.outboxd(&["run"]);
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success());
    assert!(stderr.contains("metrics.listen"), "{stderr}");

    assert!(daemon.terminate().success(), "{}", daemon.log_text());
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once_and_the_rows_wait_for_the_next_run() {
    let port = free_port();
    let p = TestPipeline::new("opssignal", 1, &metrics_section(port)).await;
    p.init();
    // Kafka unreachable: the records stay in flight, so the drain would wait for its deadline.
    let good = std::fs::read_to_string(&p.config_path).expect("config");
    let kafka = format!("bootstrap_servers = \"{}\"", p.services.kafka);
    let unreachable = format!("bootstrap_servers = \"127.0.0.1:{}\"", free_port());
    std::fs::write(&p.config_path, good.replacen(&kafka, &unreachable, 1)).expect("config");
    let mut daemon = p.spawn_run("stuck.log");
    wait_for("streaming", Duration::from_secs(30), || async {
        let (_, metrics) = http_get(port, "/metrics").await?;
        (metric_value(&metrics, "outboxd_source_streaming", "") == Some(1.0)).then_some(())
    })
    .await;
    let client = p.sql().await;
    for seq in 1..=5 {
        p.insert_event(&client, "key-1", seq, "sig").await;
    }
    wait_for("5 events in flight", Duration::from_secs(30), || async {
        let (_, metrics) = http_get(port, "/metrics").await?;
        (metric_value(&metrics, "outboxd_events_in_flight", "") == Some(5.0)).then_some(())
    })
    .await;

    daemon.send_signal("TERM");
    wait_for("draining", Duration::from_secs(10), || async {
        daemon
            .log_text()
            .contains("shutting down: draining")
            .then_some(())
    })
    .await;
    let second = std::time::Instant::now();
    daemon.send_signal("TERM");
    let status = daemon
        .wait_exit(Duration::from_secs(5))
        .expect("the second signal ends outboxd at once");
    assert!(
        second.elapsed() < Duration::from_secs(3),
        "{:?}",
        second.elapsed()
    );
    assert_eq!(status.code(), Some(130), "{}", daemon.log_text());
    assert_eq!(p.status_counts().await.get("INIT"), Some(&5));

    // Nothing was confirmed: the next run sends all five.
    std::fs::write(&p.config_path, &good).expect("config");
    let mut daemon = p.spawn_run("run.log");
    wait_for("all SUCCESS", Duration::from_secs(60), || async {
        (p.status_counts().await.get("SUCCESS") == Some(&5)).then_some(())
    })
    .await;
    let records = consume_all(&p.services.kafka, &p.topic, 1, 5, Duration::from_secs(30));
    assert_eq!(records.len(), 5);
    assert!(daemon.terminate().success(), "{}", daemon.log_text());
    p.cleanup().await;
}
