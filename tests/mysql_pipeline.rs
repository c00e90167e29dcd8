//! End-to-end: MariaDB outbox → binlog → outboxd → Kafka, on the real servers started by
//! `scripts/services`, through the real `outboxd` binary. The scenarios every engine
//! passes are in `common/scenarios.rs`; the MariaDB-only cases (resume from the checkpoint
//! row, DDL mid-stream, a purged binlog, poll mode, a killed server connection) are here.

mod common;

use std::time::Duration;

use common::mysql::{MysqlPipeline, MysqlServices};
use common::{consume_all, scenarios, seqs_by_key, wait_for};
use mysql_async::prelude::Queryable;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_arrive_in_key_order_and_every_row_succeeds() {
    scenarios::concurrent_writers_arrive_in_key_order_where_java_would_put_them::<MysqlServices>()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_transactions_publish_nothing() {
    scenarios::rolled_back_transactions_publish_nothing::<MysqlServices>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_stream_loses_nothing() {
    scenarios::kill_9_mid_stream_loses_nothing::<MysqlServices>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_from_the_checkpoint() {
    let p = MysqlPipeline::new("resume", 1, "").await;
    p.init();
    let mut conn = p.sql().await;
    let mut first = p.spawn_run("run-1.log");
    for seq in 1..=5 {
        p.insert_event(&mut conn, "k", seq, "a").await;
    }
    wait_for("first five SUCCESS", Duration::from_secs(30), || async {
        (p.success_count().await == 5).then_some(())
    })
    .await;
    assert!(first.terminate().success(), "{}", first.log_text());
    let checkpoint = p.checkpoint().await.expect("checkpoint");
    // The position, without the server the row names after it (`;server_id=…`).
    let checkpoint = checkpoint.split(';').next().unwrap_or_default().to_owned();

    // Written while outboxd is down: found in the binlog after the checkpoint.
    for seq in 6..=10 {
        p.insert_event(&mut conn, "k", seq, "a").await;
    }
    let second = p.spawn_run("run-2.log");
    wait_for("all ten SUCCESS", Duration::from_secs(30), || async {
        (p.success_count().await == 10).then_some(())
    })
    .await;
    let log = second.log_text();
    assert!(
        log.contains(&format!("position={checkpoint}")) || log.contains(&checkpoint),
        "the second run starts at the checkpoint {checkpoint}:\n{log}"
    );
    let records = consume_all(&p.services.kafka, &p.topic, 1, 10, Duration::from_secs(30));
    let seqs = seqs_by_key(&records).remove("k").unwrap_or_default();
    assert_eq!(
        seqs,
        (1..=10).collect::<Vec<u32>>(),
        "nothing lost, nothing twice"
    );
    drop(second);
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_a_column_mid_stream_keeps_working() {
    let p = MysqlPipeline::new("ddl", 1, "").await;
    p.init();
    let _daemon = p.spawn_run("run.log");
    let mut conn = p.sql().await;
    p.insert_event(&mut conn, "k", 1, "d").await;
    // Mid-stream: outboxd has read the table as it was. (With binlog_row_metadata = NO_LOG,
    // MariaDB's default, names come from information_schema; a row read only after a later
    // DDL reordered the columns is refused with the advice to set FULL, see the decoder.)
    wait_for("the first row SUCCESS", Duration::from_secs(30), || async {
        (p.success_count().await == 1).then_some(())
    })
    .await;
    conn.query_drop(format!(
        "ALTER TABLE `{}` ADD COLUMN tenant VARCHAR(32) NULL AFTER id",
        p.table
    ))
    .await
    .expect("alter");
    conn.query_drop(format!(
        "INSERT INTO `{}` (tenant, message_id, message_type, biz_key, payload, headers) \
         VALUES ('t1', 'd-k-2', 'order.step2', 'k', '{{}}', '{{\"seq\": \"2\"}}')",
        p.table
    ))
    .await
    .expect("insert after the alter");
    p.insert_event(&mut conn, "k", 3, "d").await;
    wait_for("all three SUCCESS", Duration::from_secs(30), || async {
        (p.success_count().await == 3).then_some(())
    })
    .await;
    let records = consume_all(&p.services.kafka, &p.topic, 1, 3, Duration::from_secs(30));
    let seqs = seqs_by_key(&records).remove("k").unwrap_or_default();
    assert_eq!(seqs, [1, 2, 3]);
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_waits_for_the_lock_and_takes_over() {
    scenarios::a_standby_waits_and_takes_over::<MysqlServices>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_binlog_stops_with_the_recovery_command() {
    // Alone on the binlog files: PURGE would pull them from under other tests.
    let p = MysqlPipeline::exclusive("purge", 1, "").await;
    p.init();
    let mut conn = p.sql().await;
    let mut daemon = p.spawn_run("run-1.log");
    p.insert_event(&mut conn, "k", 1, "a").await;
    wait_for("first event SUCCESS", Duration::from_secs(30), || async {
        (p.success_count().await == 1).then_some(())
    })
    .await;
    assert!(daemon.terminate().success(), "{}", daemon.log_text());
    let checkpoint = p.checkpoint().await.expect("checkpoint");
    let file = checkpoint
        .split(':')
        .nth(1)
        .expect("file in the checkpoint")
        .to_owned();

    // While outboxd is stopped: a row is written, then its binlog is purged.
    p.insert_event(&mut conn, "k", 2, "a").await;
    conn.query_drop("FLUSH BINARY LOGS").await.expect("flush");
    let (current, _): (String, u64) = conn
        .query_first("SHOW MASTER STATUS")
        .await
        .expect("master status")
        .map(|row: mysql_async::Row| {
            let name: String = row.get(0).expect("file");
            let pos: u64 = row.get(1).expect("pos");
            (name, pos)
        })
        .expect("binlog on");
    // The server keeps a file a binlog reader still uses (a replica connection of a
    // killed process lingers until its next heartbeat): purge until it is gone.
    let p = &p;
    wait_for(
        "the checkpoint's binlog purged",
        Duration::from_secs(60),
        || {
            let (current, file) = (current.clone(), file.clone());
            async move {
                let mut conn = p.sql().await;
                conn.query_drop(format!("PURGE BINARY LOGS TO '{current}'"))
                    .await
                    .expect("purge");
                let logs: Vec<(String, u64)> = conn.query("SHOW BINARY LOGS").await.expect("logs");
                let _ = conn.disconnect().await;
                (!logs.iter().any(|(name, _)| *name == file)).then_some(())
            }
        },
    )
    .await;

    let mut run = p.spawn_run("run-2.log");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while run.is_running() {
        assert!(
            std::time::Instant::now() < deadline,
            "outboxd run keeps running:\n{}",
            run.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stderr = run.log_text();
    assert!(
        !stderr.contains("stopped cleanly"),
        "run must stop with an error:\n{stderr}"
    );
    let expected = format!(
        "binlog `{file}` needed to resume pipeline `{}` was purged",
        p.name
    );
    assert!(
        stderr.contains(&expected),
        "expected `{expected}` in:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "outboxd recover --config {}",
            p.config_path.display()
        )),
        "names the recovery command with the config path:\n{stderr}"
    );
    let check = p.outboxd(&["check"]);
    let text = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(1), "check fails too:\n{text}");
    assert!(text.contains("was purged"), "{text}");

    // The way out: recover publishes the INIT row written meanwhile.
    let recover = p.outboxd(&["recover"]);
    assert!(
        recover.status.success(),
        "recover:\n{}\n{}",
        String::from_utf8_lossy(&recover.stdout),
        String::from_utf8_lossy(&recover.stderr)
    );
    wait_for(
        "the row written meanwhile SUCCESS",
        Duration::from_secs(30),
        || async { (p.success_count().await == 2).then_some(()) },
    )
    .await;
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_every_item_and_init_is_idempotent() {
    scenarios::check_reports_every_item_and_init_is_idempotent::<MysqlServices>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_record_fails_its_row_parks_its_key_and_is_retried_in_order() {
    scenarios::a_rejected_record_fails_its_row_parks_its_key_and_is_delivered_in_order_later::<
        MysqlServices,
    >()
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_mode_claims_rows_without_the_binlog() {
    let p = MysqlPipeline::new("poll", 1, "\n[poll]\ninterval = \"100ms\"\n").await;
    let config = std::fs::read_to_string(&p.config_path).expect("config");
    std::fs::write(
        &p.config_path,
        config.replace("kind = \"mysql\"", "kind = \"mysql\"\nmode = \"poll\""),
    )
    .expect("config");
    let out = p.outboxd(&["init"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("poll mode"), "{text}");
    assert!(
        p.checkpoint().await.is_none(),
        "poll mode records no binlog position"
    );
    let _daemon = p.spawn_run("run.log");
    let mut conn = p.sql().await;
    for seq in 1..=20 {
        p.insert_event(&mut conn, &format!("k{}", seq % 3), seq, "p")
            .await;
    }
    wait_for("every row SUCCESS", Duration::from_secs(30), || async {
        (p.success_count().await == 20).then_some(())
    })
    .await;
    let records = consume_all(&p.services.kafka, &p.topic, 1, 20, Duration::from_secs(30));
    assert_eq!(records.len(), 20);
    for (key, seqs) in seqs_by_key(&records) {
        let mut sorted = seqs.clone();
        sorted.sort_unstable();
        assert_eq!(seqs, sorted, "key {key} in order");
    }
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_connection_is_reopened_and_nothing_is_lost() {
    let p = MysqlPipeline::new("killconn", 1, "").await;
    p.init();
    let daemon = p.spawn_run("run.log");
    let mut conn = p.sql().await;
    p.insert_event(&mut conn, "k", 1, "a").await;
    wait_for("the first row SUCCESS", Duration::from_secs(30), || async {
        (p.success_count().await == 1).then_some(())
    })
    .await;
    // The connection holding the pipeline's lock is the stream's: kill it server-side.
    let holder: Option<Option<u64>> = conn
        .query_first(format!("SELECT IS_USED_LOCK('outboxd:{}')", p.name))
        .await
        .expect("lock holder");
    let holder = holder
        .flatten()
        .expect("the running outboxd holds the lock");
    conn.query_drop(format!("KILL {holder}"))
        .await
        .expect("kill");
    p.insert_event(&mut conn, "k", 2, "a").await;
    wait_for(
        "the lock taken again by a new connection",
        Duration::from_secs(60),
        || async {
            let mut c = p.sql().await;
            let now = c
                .query_first::<Option<u64>, _>(format!("SELECT IS_USED_LOCK('outboxd:{}')", p.name))
                .await
                .ok()
                .flatten()
                .flatten();
            let _ = c.disconnect().await;
            now.filter(|id| *id != holder)
        },
    )
    .await;
    for seq in 3..=5 {
        p.insert_event(&mut conn, "k", seq, "a").await;
    }
    wait_for("every row SUCCESS", Duration::from_secs(60), || async {
        (p.success_count().await == 5).then_some(())
    })
    .await;
    let log = daemon.log_text();
    assert!(log.contains("retrying"), "the stream was reopened:\n{log}");
    let records = consume_all(&p.services.kafka, &p.topic, 1, 5, Duration::from_secs(30));
    let seqs = seqs_by_key(&records).remove("k").unwrap_or_default();
    let mut first: Vec<u32> = Vec::new();
    for s in seqs {
        if !first.contains(&s) {
            first.push(s);
        }
    }
    assert_eq!(first, [1, 2, 3, 4, 5], "every event, in order");
    drop(daemon);
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_that_cannot_be_published_needs_an_operator_and_the_relay_goes_on() {
    scenarios::a_row_that_cannot_be_published_needs_an_operator_and_the_relay_goes_on::<
        MysqlServices,
    >()
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_parked_while_the_relay_runs_holds_its_key() {
    scenarios::a_row_parked_while_the_relay_runs_holds_its_key::<MysqlServices>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_transaction_read_again_is_not_sent_again() {
    scenarios::a_large_transaction_read_again_is_not_sent_again::<MysqlServices>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_outbox_tables_keep_each_rows_status_in_its_table() {
    scenarios::several_outbox_tables_keep_each_rows_status_in_its_table::<MysqlServices>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_outbox_tables_are_recovered_and_polled() {
    scenarios::several_outbox_tables_are_recovered_and_polled::<MysqlServices>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_outside_the_allowed_list_is_never_written() {
    scenarios::a_topic_outside_the_allowed_list_is_never_written::<MysqlServices>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_topics_are_never_written() {
    scenarios::reserved_topics_are_never_written::<MysqlServices>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_command_prints_what_init_and_check_expect() {
    scenarios::the_schema_command_prints_what_init_and_check_expect::<MysqlServices>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_a_missing_table_grant() {
    scenarios::check_names_a_missing_table_grant::<MysqlServices>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_and_trace_context_reach_the_consumer() {
    scenarios::cloudevents_and_trace_context_reach_the_consumer::<MysqlServices>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_structured_mode_puts_the_event_in_the_value() {
    scenarios::cloudevents_structured_mode_puts_the_event_in_the_value::<MysqlServices>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_span_carries_the_trace_id_of_its_traceparent() {
    scenarios::the_events_span_carries_the_trace_id_of_its_traceparent::<MysqlServices>().await;
}
