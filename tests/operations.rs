//! Operating outboxd: graceful restart under load, the metrics and health endpoints.
//! Real PostgreSQL and Kafka from `scripts/services`, the real binary.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::postgres::TestPipeline;
use common::{consume_all, free_port, http_get, metric_value, metrics_section, wait_for};

/// The kind of a series as the Prometheus text format declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every series the README's metrics table lists, with its type and label names: what
/// `/metrics` must show once events have flowed and the status was queried.
const README_SERIES: &[(&str, Kind, &[&str])] = &[
    ("outboxd_events_published_total", Kind::Counter, &["topic"]),
    ("outboxd_events_failed_total", Kind::Counter, &["topic"]),
    ("outboxd_publish_latency_seconds", Kind::Histogram, &[]),
    ("outboxd_lag_seconds", Kind::Gauge, &[]),
    ("outboxd_events_in_flight", Kind::Gauge, &[]),
    ("outboxd_transactions_total", Kind::Counter, &[]),
    ("outboxd_events_parked_total", Kind::Counter, &[]),
    ("outboxd_retries_total", Kind::Counter, &["outcome"]),
    ("outboxd_rows_reaped_total", Kind::Counter, &[]),
    ("outboxd_producer_queue_depth", Kind::Gauge, &[]),
    ("outboxd_source_streaming", Kind::Gauge, &[]),
    ("outboxd_kafka_reachable", Kind::Gauge, &[]),
    ("outboxd_checkpoint_position", Kind::Gauge, &[]),
    ("outboxd_checkpoint_age_seconds", Kind::Gauge, &[]),
    ("outboxd_status_query_up", Kind::Gauge, &[]),
    ("outboxd_outbox_rows", Kind::Gauge, &["status"]),
    ("outboxd_outbox_oldest_unsent_age_seconds", Kind::Gauge, &[]),
    ("outboxd_source_lag_bytes", Kind::Gauge, &[]),
    ("process_resident_memory_bytes", Kind::Gauge, &[]),
    ("process_cpu_seconds_total", Kind::Counter, &[]),
];

/// Upper bounds of the publish latency histogram's buckets, as dashboards query them.
const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Parses a `/metrics` body with a Prometheus text-format parser and checks it against
/// the README: every series present with its type, its labels and a HELP text, no line
/// the parser could not read.
fn assert_readme_series(body: &str) {
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned())))
        .expect("a Prometheus text exposition");
    // The parser skips what it cannot read: every sample line must have become a sample
    // (a histogram's buckets fold into one, its _sum and _count stay apart).
    let sample_lines = body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    let parsed_lines: usize = scrape
        .samples
        .iter()
        .map(|s| match &s.value {
            prometheus_parse::Value::Histogram(buckets) => buckets.len(),
            _ => 1,
        })
        .sum();
    assert_eq!(sample_lines, parsed_lines, "unparsed lines in\n{body}");

    for (name, kind, labels) in README_SERIES {
        let samples: Vec<_> = scrape
            .samples
            .iter()
            .filter(|s| s.metric == *name)
            .collect();
        assert!(!samples.is_empty(), "{name} missing from /metrics:\n{body}");
        for sample in &samples {
            let parsed_kind = match &sample.value {
                prometheus_parse::Value::Counter(_) => Some(Kind::Counter),
                prometheus_parse::Value::Gauge(_) => Some(Kind::Gauge),
                prometheus_parse::Value::Histogram(_) => Some(Kind::Histogram),
                _ => None,
            };
            assert_eq!(parsed_kind, Some(*kind), "type of {name}:\n{body}");
            let mut names: Vec<&str> = sample.labels.keys().map(String::as_str).collect();
            names.sort_unstable();
            assert_eq!(names, *labels, "labels of {name}:\n{body}");
        }
        assert!(
            scrape.docs.get(*name).is_some_and(|help| !help.is_empty()),
            "no HELP for {name}"
        );
        if *kind == Kind::Histogram {
            let prometheus_parse::Value::Histogram(buckets) = &samples[0].value else {
                unreachable!("checked above");
            };
            let bounds: Vec<f64> = buckets.iter().map(|b| b.less_than).collect();
            let mut expected = LATENCY_BUCKETS.to_vec();
            expected.push(f64::INFINITY);
            assert_eq!(bounds, expected, "buckets of {name}");
            for part in ["_sum", "_count"] {
                let series = format!("{name}{part}");
                assert!(
                    scrape.samples.iter().any(|s| s.metric == series),
                    "{series} missing:\n{body}"
                );
            }
        }
    }
    let statuses: Vec<&str> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "outboxd_outbox_rows")
        .filter_map(|s| s.labels.get("status"))
        .collect();
    for status in ["INIT", "PROCESSING", "FAILED", "MANUAL_REQUIRED"] {
        assert!(
            statuses.contains(&status),
            "outboxd_outbox_rows{{status=\"{status}\"}}"
        );
    }
}

/// One raw request on 127.0.0.1:`port`; the whole reply (the server closes the connection).
async fn exchange(port: u16, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("endpoint");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.expect("reply");
    reply
}

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
    assert_readme_series(&metrics);
    // The head as before: the text format's content type; HEAD has it without the body.
    let reply = exchange(port, "HEAD /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").await;
    let head = reply.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200 "), "{reply}");
    assert!(
        head.contains("\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n"),
        "{reply}"
    );
    assert!(reply.ends_with("\r\n\r\n"), "HEAD has no body: {reply}");
    let reply = exchange(port, "POST /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").await;
    assert!(reply.starts_with("HTTP/1.1 405 "), "{reply}");
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

/// Per-topic series are bounded (issue 12): with `metrics.max_topic_series = 1`, records
/// of a second topic count under `topic="other"`, and no series names that topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_topic_series_stop_at_the_configured_maximum() {
    use common::engine::Writer as _;

    let port = free_port();
    let extra = format!("{}max_topic_series = 1\n", metrics_section(port));
    let p = TestPipeline::new("opsseries", 1, &extra).await;
    let second = format!("{}.second", p.topic);
    p.create_topic(&second, 1).await;
    p.init();
    let mut daemon = p.spawn_run("run.log");
    let mut writer = p.writer().await;
    // The template's topic first, so that it is the one topic with series of its own.
    writer.commit(&[("k1".to_owned(), 1)], "series").await;
    wait_for("the first row sent", Duration::from_secs(60), || async {
        (p.success_count().await == 1).then_some(())
    })
    .await;
    writer.insert_padded("series-2", "k2", 2, &second, 16).await;
    let own = format!("{{topic=\"{}\"}}", p.topic);
    let metrics = wait_for("both records counted", Duration::from_secs(60), || async {
        let metrics = http_get(port, "/metrics").await?.1;
        let published =
            |labels: &str| metric_value(&metrics, "outboxd_events_published_total", labels);
        (published(&own) == Some(1.0) && published("{topic=\"other\"}") == Some(1.0))
            .then_some(metrics)
    })
    .await;
    assert!(
        !metrics.contains(&format!("topic=\"{second}\"")),
        "no series of its own: {metrics}"
    );
    assert_eq!(p.success_count().await, 2);
    assert!(daemon.terminate().success(), "{}", daemon.log_text());
    p.cleanup().await;
}

/// The status query behind `/metrics` is bounded (issue 12): with the outbox locked (as a
/// long migration would hold it), a scrape still answers within its 5 s bound, with
/// `outboxd_status_query_up 0`, and `/healthz` answers at once meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_outbox_does_not_hold_the_scrape() {
    let port = free_port();
    let p = TestPipeline::new("opslocked", 1, &metrics_section(port)).await;
    p.init();
    let mut daemon = p.spawn_run("run.log");
    wait_for("/readyz 200", Duration::from_secs(30), || async {
        http_get(port, "/readyz")
            .await
            .filter(|(status, _)| *status == 200)
    })
    .await;

    let lock = p.sql().await;
    lock.batch_execute(&format!(
        "BEGIN; LOCK TABLE \"{}\" IN ACCESS EXCLUSIVE MODE",
        p.table
    ))
    .await
    .expect("lock the outbox");
    let started = std::time::Instant::now();
    let scrape = tokio::spawn(async move { http_get(port, "/metrics").await });
    let (status, _) = http_get(port, "/healthz").await.expect("/healthz");
    assert_eq!(status, 200);
    assert!(
        !scrape.is_finished(),
        "the scrape waits on the locked outbox while /healthz answers"
    );
    let (status, metrics) = scrape.await.expect("scrape task").expect("/metrics");
    let took = started.elapsed();
    assert_eq!(status, 200, "{metrics}");
    assert!(took < Duration::from_secs(10), "the scrape took {took:?}");
    assert_eq!(
        metric_value(&metrics, "outboxd_status_query_up", ""),
        Some(0.0),
        "{metrics}"
    );
    lock.batch_execute("ROLLBACK").await.expect("unlock");
    assert!(daemon.terminate().success(), "{}", daemon.log_text());
    p.cleanup().await;
}
