//! Issue 12: the producer over TLS to the broker's SSL listener (certificate from the local
//! test CA of `scripts/services`). With the CA, `check` connects and says the brokers'
//! certificates are verified, and rows are delivered; with an unrelated CA the connection
//! is refused; with verification switched off, or SASL PLAIN without TLS, `check` warns
//! with the fix.

mod common;

use std::process::Output;
use std::time::Duration;

use common::engine::{Event, Writer};
use common::postgres::TestPipeline;
use common::wait_for;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} (scripts/services env)"))
}

/// The pipeline's config with `[kafka]` pointed at the TLS listener, and `options`.
fn over_tls(p: &TestPipeline, options: &[(&str, &str)]) {
    let config = std::fs::read_to_string(&p.config_path).expect("read config");
    let plain = format!("bootstrap_servers = \"{}\"", env("OUTBOXD_TEST_KAFKA"));
    assert!(config.contains(&plain), "the harness's [kafka] section");
    let mut tls = format!(
        "bootstrap_servers = \"{}\"\n",
        env("OUTBOXD_TEST_KAFKA_SSL")
    );
    // Options go in their own table at the end of the file.
    let mut table = String::from("\n[kafka.options]\n\"security.protocol\" = \"SSL\"\n");
    for (key, value) in options {
        table.push_str(&format!("\"{key}\" = \"{value}\"\n"));
    }
    tls.pop();
    let config = config.replace(&plain, &tls) + &table;
    std::fs::write(&p.config_path, config).expect("write config");
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_producer_verifies_the_brokers_certificate() {
    let ca = env("OUTBOXD_TEST_CA");
    let wrong_ca = env("OUTBOXD_TEST_WRONG_CA");

    // The right CA: verified, and rows delivered over TLS.
    let p = TestPipeline::new("ktls", 1, "").await;
    over_tls(&p, &[("ssl.ca.location", &ca)]);
    p.init();
    let out = p.outboxd(&["check"]);
    let said = text(&out);
    assert!(out.status.success(), "check over TLS: {said}");
    assert!(
        said.contains("brokers' certificates and host names verified"),
        "check says what is verified: {said}"
    );
    let daemon = p.spawn_run("run.log");
    let mut writer = p.writer().await;
    let events: Vec<Event> = (1..=5).map(|seq| ("k".to_owned(), seq)).collect();
    writer.commit(&events, "ktls").await;
    wait_for(
        "rows delivered over TLS",
        Duration::from_secs(60),
        || async { (p.success_count().await == 5).then_some(()) },
    )
    .await;
    assert_eq!(p.consume(5, Duration::from_secs(30)).len(), 5);
    drop(daemon);
    p.cleanup().await;

    // An unrelated CA: the broker is not trusted.
    let p = TestPipeline::new("ktlswrong", 1, "").await;
    over_tls(&p, &[("ssl.ca.location", &wrong_ca)]);
    let out = p.outboxd(&["check"]);
    let said = text(&out);
    assert!(!out.status.success(), "check must fail: {said}");
    assert!(
        said.contains("[FAIL] kafka"),
        "the kafka line fails: {said}"
    );
    p.cleanup().await;

    // Verification switched off: it connects, and check warns with the fix.
    let p = TestPipeline::new("ktlsoff", 1, "").await;
    over_tls(&p, &[("enable.ssl.certificate.verification", "false")]);
    let out = p.outboxd(&["check"]);
    let said = text(&out);
    assert!(
        said.contains("certificates are not verified") && said.contains("ssl.ca.location"),
        "check warns with the fix: {said}"
    );
    p.cleanup().await;

    // SASL PLAIN without TLS: check warns that the password would travel in the clear.
    let p = TestPipeline::new("ksaslplain", 1, "").await;
    let config = std::fs::read_to_string(&p.config_path).expect("read config")
        + "\n[kafka.options]\n\"security.protocol\" = \"SASL_PLAINTEXT\"\n\
           \"sasl.mechanism\" = \"PLAIN\"\n\"sasl.username\" = \"u\"\n\"sasl.password\" = \"p\"\n";
    std::fs::write(&p.config_path, config).expect("write config");
    let out = p.outboxd(&["check"]);
    let said = text(&out);
    assert!(
        said.contains("SASL PLAIN sends the password in the clear") && said.contains("SASL_SSL"),
        "check warns with the fix: {said}"
    );
    p.cleanup().await;
}
