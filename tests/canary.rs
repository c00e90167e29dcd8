//! The canary (`[canary]`) on the real servers: on PostgreSQL and MariaDB each canary row
//! goes through the outbox to Kafka and is measured (`outboxd_canary_*`), its row deleted
//! once SUCCESS; and with Kafka black-holed (Toxiproxy in front of the broker's PROXIED
//! listener) `/readyz` fails naming the canary, then is ready again once Kafka answers.

mod common;

use std::time::Duration;

use common::engine::{Engine, Pipeline};
use common::mysql::MysqlServices;
use common::postgres::PgServices;
use common::toxiproxy::{Toxic, Toxiproxy};
use common::{free_port, http_get, metric_value, metrics_section};

/// A canary every 300 ms, `/readyz` failing after 4 of them (1.2 s) without one.
const CANARY: &str = "\n[canary]\ninterval = \"300ms\"\nunready_after = 4\n";

/// `canary.topic` = the pipeline's topic, so the test reads the canaries where it reads
/// everything (`[canary]` is the config's last section).
fn canary_to_the_pipelines_topic<E: Engine>(p: &Pipeline<E>) {
    let mut config = std::fs::read_to_string(&p.config_path).expect("read config");
    assert!(config.trim_end().ends_with("unready_after = 4"), "{config}");
    config.push_str(&format!("topic = \"{}\"\n", p.topic));
    std::fs::write(&p.config_path, config).expect("write config");
}

async fn scrape(port: u16) -> String {
    http_get(port, "/metrics")
        .await
        .map(|(_, body)| body)
        .unwrap_or_default()
}

async fn canaries_go_through_the_outbox<E: Engine>(prefix: &str) {
    let port = free_port();
    let extra = format!("{}{CANARY}", metrics_section(port));
    let p = Pipeline::<E>::new(prefix, 1, &extra).await;
    canary_to_the_pipelines_topic(&p);
    p.init();
    E::grant_canary(&p).await;
    let daemon = p.spawn_run("run.log");
    let delivered = common::wait_for(
        "five canaries delivered",
        Duration::from_secs(60),
        || async {
            let text = scrape(port).await;
            let count = metric_value(&text, "outboxd_canary_latency_seconds_count", "")?;
            (count >= 5.0).then_some(text)
        },
    )
    .await;
    let last = metric_value(
        &delivered,
        "outboxd_canary_last_success_timestamp_seconds",
        "",
    )
    .expect("the last success is a series");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - last).abs() < 30.0, "last success {last}, now {now}");
    // Ready. Within one Kafka check (10 s) plus its timeout, not at once: the check's
    // answer is cached, and one made while the shared broker still recovers from an earlier
    // test's freeze (tests/broker_outage.rs runs just before) fails until the next check.
    common::wait_for("/readyz 200", Duration::from_secs(15), || async {
        let (status, _) = http_get(port, "/readyz").await?;
        (status == 200).then_some(())
    })
    .await;

    // Delivered canary rows are deleted (at the canary's next round, so a burst of
    // deliveries may be seen before it): a few on their way at most, not one per canary.
    common::wait_for(
        "delivered canary rows deleted: 3 or fewer left",
        Duration::from_secs(10),
        || async {
            let rows = p.rows().await;
            let canary_rows = rows.keys().filter(|id| id.starts_with("canary-")).count();
            (canary_rows <= 3).then_some(())
        },
    )
    .await;
    // Each reached Kafka as an event of its own type.
    let records = p.consume(5, Duration::from_secs(30));
    let canaries = records
        .iter()
        .filter(|r| r.headers.get("message_type").map(String::as_str) == Some("outboxd.canary"))
        .inspect(|r| {
            // The mark an inbox reading this topic acknowledges without storing.
            let mark = r.headers.get(outboxd::canary::CANARY_HEADER);
            assert_eq!(mark.map(String::as_str), Some("1"), "{:?}", r.headers);
        })
        .count();
    assert!(canaries >= 5, "{canaries} canary records in Kafka");
    drop(daemon);
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_canaries_go_through_the_outbox_and_are_measured() {
    canaries_go_through_the_outbox::<PgServices>("canary").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_canaries_go_through_the_outbox_and_are_measured() {
    canaries_go_through_the_outbox::<MysqlServices>("canary").await;
}

/// Kafka silent (every byte held): no canary arrives, and `/readyz` fails saying so within
/// a few seconds; once Kafka answers again, canaries arrive and `/readyz` is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_fails_while_no_canary_arrives_and_recovers() {
    let toxiproxy = Toxiproxy::from_env();
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let listen = env("OUTBOXD_TEST_KAFKA_PROXIED", "127.0.0.1:29096");
    let upstream = env("OUTBOXD_TEST_KAFKA_PROXIED_UPSTREAM", "127.0.0.1:29095");
    let proxy = toxiproxy.proxy_at("outboxd_test_kafka", &listen, &upstream);

    let port = free_port();
    let extra = format!("{}{CANARY}", metrics_section(port));
    let p = Pipeline::<PgServices>::new("canarybh", 1, &extra).await;
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let direct = format!("bootstrap_servers = \"{}\"", p.services.kafka);
    let config = config
        .replacen(&direct, &format!("bootstrap_servers = \"{listen}\""), 1)
        .replacen("message_timeout = \"10s\"", "message_timeout = \"3s\"", 1);
    std::fs::write(&p.config_path, config).expect("write config");
    canary_to_the_pipelines_topic(&p);
    p.init();
    PgServices::grant_canary(&p).await;
    let daemon = p.spawn_run("run.log");
    common::wait_for(
        "ready, canaries arriving",
        Duration::from_secs(60),
        || async {
            let count = metric_value(
                &scrape(port).await,
                "outboxd_canary_latency_seconds_count",
                "",
            )?;
            let (status, _) = http_get(port, "/readyz").await?;
            (count >= 2.0 && status == 200).then_some(())
        },
    )
    .await;

    proxy.add_both(Toxic::BLACK_HOLE);
    let reason = common::wait_for(
        "/readyz failing on the canary",
        Duration::from_secs(30),
        || async {
            let (status, body) = http_get(port, "/readyz").await?;
            (status != 200 && body.contains("no canary delivered")).then_some(body)
        },
    )
    .await;
    println!("/readyz while Kafka is silent: {reason}");
    proxy.heal();

    common::wait_for("/readyz ready again", Duration::from_secs(120), || async {
        let (status, _) = http_get(port, "/readyz").await?;
        (status == 200).then_some(())
    })
    .await;
    let log = daemon.log_text();
    assert!(
        log.contains("canary: the canary row is not delivered within the interval"),
        "the log names the late canary:\n{log}"
    );
    drop(daemon);
    p.cleanup().await;
    drop(proxy);
}
