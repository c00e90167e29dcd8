//! Which halves a file turns on, and the old keys read at their new places.

use super::*;

const SOURCE: &str = r#"
    [source]
    kind = "mysql"
    user = "app"
    database = "app"
"#;

const INBOX: &str = r#"
    [inbox]
    table = "orders_inbox"
    [inbox.kafka]
    bootstrap_servers = "127.0.0.1:9092"
    topics = ["orders"]
    group_id = "inventory"
    [inbox.handlers.default]
    kind = "sql"
    statement = "SELECT :message_id"
"#;

fn load(text: &str) -> Result<Config, ConfigError> {
    let config = Config::parse(text)?;
    config.validate()?;
    Ok(config)
}

fn warnings(config: &Config) -> String {
    let lines: Vec<String> = (config.warnings.iter())
        .map(|w| format!("{}: {}", w.message, w.fix))
        .collect();
    lines.join("\n")
}

#[test]
fn an_inbox_only_process_names_a_database_and_its_inbox() {
    let config = load(&format!("{SOURCE}{INBOX}")).unwrap();
    assert!(!config.relays_outbox());
    assert_eq!(config.pipeline.name, "inbox");
    assert_eq!(config.layout().inbox_table, "orders_inbox");
    let features = config.features();
    assert!(!features.outbox && features.inbox, "{features:?}");
    assert_eq!(config.inbox_bootstrap_servers(), Some("127.0.0.1:9092"));
    assert!(config.warnings.is_empty(), "{}", warnings(&config));
    // No server_id: the relay's binlog replica id is not needed without the relay.
    let SourceConfig::Mysql(mysql) = &config.source.engine else {
        panic!("{:?}", config.source.engine)
    };
    assert_eq!(mysql.server_id, 0);
}

#[test]
fn the_relay_runs_with_its_sections_and_its_process_keeps_the_inbox_table() {
    let relay = format!(
        "[pipeline]\nname = \"orders\"\n{SOURCE}server_id = 7\n[outbox]\nmode = \"poll\"\n\
         [kafka]\nbootstrap_servers = \"k:9092\"\n"
    );
    let config = load(&relay).unwrap();
    assert!(config.relays_outbox());
    assert_eq!(
        config.source.mode,
        SourceMode::Poll,
        "outbox.mode is the relay's mode"
    );
    let features = config.features();
    assert!(features.outbox && features.inbox, "{features:?}");
    assert!(config.warnings.is_empty(), "{}", warnings(&config));
    // Both halves in one process; the inbox's consumer takes the relay's brokers.
    let both = format!(
        "{relay}{}",
        INBOX.replace("bootstrap_servers = \"127.0.0.1:9092\"", "")
    );
    let config = load(&both).unwrap();
    assert!(config.relays_outbox() && config.inbox.is_some());
    assert_eq!(config.inbox_bootstrap_servers(), Some("k:9092"));
}

#[test]
fn an_old_inbox_only_file_still_works_and_says_what_to_change() {
    // The form an inbox-only process needed before: a relay switched off.
    let old = format!(
        "[pipeline]\nname = \"inventory\"\n{SOURCE}mode = \"poll\"\nserver_id = 4242\n\
         [outbox]\nrelay = false\ninbox_table = \"orders_inbox\"\n\
         [kafka]\nbootstrap_servers = \"k:9092\"\n{}",
        INBOX
            .replace("table = \"orders_inbox\"\n", "")
            .replace("bootstrap_servers = \"127.0.0.1:9092\"", "")
    );
    let config = load(&old).unwrap();
    assert!(!config.relays_outbox());
    assert_eq!(config.layout().inbox_table, "orders_inbox");
    assert_eq!(config.inbox_bootstrap_servers(), Some("k:9092"));
    let said = warnings(&config);
    assert!(said.contains("outbox.relay is deprecated"), "{said}");
    assert!(said.contains("source.mode is deprecated"), "{said}");
    assert!(said.contains("leaves out [outbox] and [kafka]"), "{said}");
}

#[test]
fn files_that_run_nothing_or_half_a_relay_are_refused() {
    let cases = [
        (SOURCE.to_owned(), "nothing to run"),
        (
            format!("{SOURCE}[outbox]\nrelay = false\n[kafka]\nbootstrap_servers = \"k:1\"\n"),
            "nothing to run",
        ),
        (
            format!("{SOURCE}server_id = 7\n[kafka]\nbootstrap_servers = \"k:1\"\n"),
            "needs [pipeline]",
        ),
        (
            format!("[pipeline]\nname = \"p\"\n{SOURCE}server_id = 7\n[outbox]\n"),
            "needs a sink",
        ),
        (
            format!(
                "{SOURCE}{}",
                INBOX.replace("bootstrap_servers = \"127.0.0.1:9092\"", "")
            ),
            "inbox.kafka.bootstrap_servers",
        ),
        (
            format!(
                "[pipeline]\nname = \"p\"\n{SOURCE}mode = \"log\"\n[outbox]\nmode = \"poll\"\n\
                 [kafka]\nbootstrap_servers = \"k:1\"\n"
            ),
            "outbox.mode and source.mode disagree",
        ),
        (
            format!(
                "[pipeline]\nname = \"p\"\n{SOURCE}[outbox]\ninbox_table = \"a\"\n\
                 [kafka]\nbootstrap_servers = \"k:1\"\n{INBOX}"
            ),
            "disagree",
        ),
    ];
    let http = format!(
        "[pipeline]\nname = \"p\"\n{SOURCE}server_id = 7\n[outbox]\n\
         [http.endpoints.default]\nurl = \"http://127.0.0.1:1/\"\n"
    );
    let cases = cases.into_iter().chain([
        (
            format!("{http}[kafka]\nbootstrap_servers = \"k:1\"\n"),
            "one sink",
        ),
        (
            format!("{http}[delivery]\nexactly_once = true\n"),
            "needs the Kafka sink",
        ),
        (
            http.replace("[outbox]\n", "[outbox]\nrows = \"deleted\"\n"),
            "needs the Kafka sink",
        ),
    ]);
    load(&http).expect("an HTTP relay");
    for (text, expected) in cases {
        let err = load(&text).map(|_| ()).unwrap_err().to_string();
        assert!(
            err.contains(expected),
            "{expected:?} in {err}\nfor:\n{text}"
        );
    }
}

/// `[canary]` rides on the relay: refused without it, with rows deleted, without its own
/// topic (with `[http]`: an endpoint), or on a table not outboxd's own; its own values are
/// checked too.
#[test]
fn the_canary_needs_the_relay_with_kept_rows() {
    let source = format!("{SOURCE}    server_id = 7\n");
    let relay = "[pipeline]\nname = \"orders\"\n[outbox]\ntable = \"outbox\"\n\
                 [kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n";
    let config = load(&format!(
        "{source}{relay}[canary]\ninterval = \"10s\"\ntopic = \"canary\"\n"
    ))
    .unwrap();
    let canary = config.canary.as_ref().unwrap();
    assert_eq!(canary.unready_after(), std::time::Duration::from_secs(40));
    assert_eq!(canary.message_type, "outboxd.canary");

    let refused = |text: &str, says: &str| {
        let e = load(text).unwrap_err().to_string();
        assert!(e.contains(says), "`{says}` not in: {e}");
    };
    refused(
        &format!("{SOURCE}{INBOX}[canary]\n"),
        "[canary] needs the outbox relay",
    );
    refused(
        &format!("{source}{relay}[canary]\n").replace(
            "table = \"outbox\"\n",
            "table = \"outbox\"\nrows = \"deleted\"\n",
        ),
        "outbox.rows = \"kept\"",
    );
    refused(
        &format!("{source}{relay}[canary]\n"),
        "canary.topic is missing",
    );
    refused(
        &format!("{source}{relay}[canary]\ntopic = \"c\"\n").replace(
            "table = \"outbox\"\n",
            "table = \"outbox\"\nlayout = \"debezium\"\nrows = \"kept\"\n",
        ),
        "outboxd's own outbox table",
    );
    let http = "[pipeline]\nname = \"orders\"\n[outbox]\ntable = \"outbox\"\n\
                [http.endpoints.partner]\nurl = \"https://partner.example/hooks\"\n";
    refused(
        &format!("{source}{http}[canary]\ntopic = \"outboxd.canary\"\n"),
        "is not an endpoint of [http.endpoints]",
    );
    load(&format!("{source}{http}[canary]\ntopic = \"partner\"\n")).expect("an endpoint");
    refused(
        &format!("{source}{relay}allowed_topics = [\"orders.*\"]\n[canary]\ntopic = \"c\"\n"),
        "canary.topic `c`",
    );
    refused(
        &format!("{source}{relay}[canary]\nunready_after = 1\n"),
        "canary.unready_after must be at least 2",
    );
    refused(
        &format!("{source}{relay}[canary]\ninterval = \"10ms\"\n"),
        "canary.interval must be between",
    );
}
