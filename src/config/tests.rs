use super::*;
use outboxd_connector::{ColumnNames, RowLifecycle};

const MINIMAL: &str = r#"
        [pipeline]
        name = "orders"
        [source]
        kind = "postgres"
        user = "outboxd"
        database = "app"
        [kafka]
        bootstrap_servers = "127.0.0.1:9092"
    "#;

#[test]
fn minimal_config_gets_defaults() {
    let config = Config::parse(MINIMAL).unwrap();
    config.validate().unwrap();
    assert_eq!(config.kafka.topic_template, "outbox.{message_type}");
    assert_eq!(config.outbox.table, "outbox");
    assert_eq!(config.delivery.max_in_flight, 10_000);
    let SourceConfig::Postgres(pg) = &config.source.engine else {
        panic!("{:?}", config.source.engine)
    };
    assert_eq!(pg.port, 5432);
    assert_eq!(config.source.mode, SourceMode::Log);
    assert_eq!(config.pipeline.ordering, Ordering::Strict);
    assert_eq!(pg.slot_name("orders"), "outboxd_orders");
}

#[test]
fn slot_failover_is_for_log_mode() {
    let text = MINIMAL.replace(
        "kind = \"postgres\"",
        "kind = \"postgres\"\nslot_failover = true",
    );
    let config = Config::parse(&text).unwrap();
    config.validate().unwrap();
    let SourceConfig::Postgres(pg) = &config.source.engine else {
        panic!("{:?}", config.source.engine)
    };
    assert!(pg.slot_failover);
    let poll = text.replace(
        "kind = \"postgres\"",
        "kind = \"postgres\"\nmode = \"poll\"",
    );
    let err = Config::parse(&poll)
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("source.slot_failover"), "{err}");
}

#[test]
fn unknown_keys_are_rejected_with_their_name() {
    let text = MINIMAL.replace("database = \"app\"", "database = \"app\"\nslots = \"x\"");
    let err = Config::parse(&text).unwrap_err().to_string();
    assert!(err.contains("slots"), "{err}");
    let text = format!("{MINIMAL}\n[kafka2]\nx = 1\n");
    assert!(Config::parse(&text)
        .unwrap_err()
        .to_string()
        .contains("kafka2"));
}

#[test]
fn source_mode_sits_beside_the_engine_keys() {
    let text = MINIMAL.replace(
        "kind = \"postgres\"",
        "kind = \"postgres\"\nmode = \"poll\"",
    );
    let config = Config::parse(&text).unwrap();
    assert_eq!(config.source.mode, SourceMode::Poll);
    let text = MINIMAL.replace(
        "kind = \"postgres\"",
        "kind = \"postgres\"\nmode = \"tail\"",
    );
    assert!(Config::parse(&text)
        .unwrap_err()
        .to_string()
        .contains("tail"));
    let text = MINIMAL.replace("kind = \"postgres\"", "kind = \"postgres\"\nport = \"x\"");
    assert!(Config::parse(&text).is_err());
}

#[test]
fn claim_timeout_must_outlast_the_producer_retries() {
    let text = format!("{MINIMAL}\n[retry]\nclaim_timeout = \"10s\"\n");
    let err = Config::parse(&text)
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("claim_timeout"), "{err}");
}

#[test]
fn metrics_endpoint_is_off_unless_configured() {
    assert!(Config::parse(MINIMAL).unwrap().metrics.is_none());
    let config = Config::parse(&format!("{MINIMAL}\n[metrics]\n")).unwrap();
    assert_eq!(config.metrics.unwrap().listen.to_string(), "127.0.0.1:9187");
    let text = format!("{MINIMAL}\n[metrics]\nlisten = \"0.0.0.0:9999\"\n");
    let config = Config::parse(&text).unwrap();
    assert_eq!(config.metrics.unwrap().listen.port(), 9999);
    let text = format!("{MINIMAL}\n[metrics]\nlisten = \"localhost\"\n");
    assert!(Config::parse(&text).is_err());
    let text = format!("{MINIMAL}\n[metrics]\nport = 1\n");
    let err = Config::parse(&text).unwrap_err().to_string();
    assert!(err.contains("port"), "{err}");
}

#[test]
fn durations_are_typed() {
    let text = format!("{MINIMAL}\n[delivery]\nwriteback_interval = \"20ms\"\n");
    let config = Config::parse(&text).unwrap();
    assert_eq!(
        config.delivery.writeback_interval,
        Duration::from_millis(20)
    );
    let text = format!("{MINIMAL}\n[delivery]\nwriteback_interval = \"soon\"\n");
    assert!(Config::parse(&text).is_err());
}

#[test]
fn environment_overrides_secrets() {
    let mut config = Config::parse(MINIMAL).unwrap();
    config
        .resolve_secrets(|name| match name {
            ENV_SOURCE_PASSWORD => Some("s3cret".into()),
            ENV_KAFKA_SASL_PASSWORD => Some("k3y".into()),
            _ => None,
        })
        .unwrap();
    let SourceConfig::Postgres(pg) = &config.source.engine else {
        panic!("{:?}", config.source.engine)
    };
    assert_eq!(pg.password.as_ref().map(Secret::expose), Some("s3cret"));
    assert_eq!(config.kafka.options["sasl.password"], "k3y");
}

#[test]
fn mysql_source_gets_defaults_and_the_password_override() {
    let text = MINIMAL.replace("kind = \"postgres\"", "kind = \"mysql\"\nserver_id = 4242");
    let mut config = Config::parse(&text).unwrap();
    config.validate().unwrap();
    config
        .resolve_secrets(|name| (name == ENV_SOURCE_PASSWORD).then(|| "s3cret".into()))
        .unwrap();
    let SourceConfig::Mysql(my) = &config.source.engine else {
        panic!("{:?}", config.source.engine)
    };
    assert_eq!(my.port, 3306);
    assert_eq!(my.server_id, 4242);
    assert_eq!(my.heartbeat, Duration::from_secs(5));
    assert_eq!(my.password.as_ref().map(Secret::expose), Some("s3cret"));
    // server_id is required by the relay; unknown keys are named.
    let text = MINIMAL.replace("kind = \"postgres\"", "kind = \"mysql\"");
    assert!(Config::parse(&text)
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string()
        .contains("server_id"));
    let text = MINIMAL.replace(
        "kind = \"postgres\"",
        "kind = \"mysql\"\nserver_id = 1\nslot = \"x\"",
    );
    assert!(Config::parse(&text)
        .unwrap_err()
        .to_string()
        .contains("slot"));
}

#[test]
fn weakening_kafka_options_are_config_errors() {
    for (key, value) in [("enable.idempotence", "false"), ("acks", "1")] {
        let text = format!("{MINIMAL}\n[kafka.options]\n\"{key}\" = \"{value}\"\n");
        let err = Config::parse(&text)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{err}");
    }
    let text = format!("{MINIMAL}\n[kafka.options]\n\"compression.type\" = \"zstd\"\n");
    Config::parse(&text).unwrap().validate().unwrap();
}

/// A huge duration is an error naming the key and the range, never a panic later
/// (`Instant + d` overflows); so is a zero period.
#[test]
fn durations_are_bounded_at_load() {
    let huge = "\"18446744073709551615s\"";
    for (section, key) in [
        ("kafka", "message_timeout"),
        ("delivery", "writeback_interval"),
        ("delivery", "shutdown_deadline"),
        ("retry", "base"),
        ("retry", "cap"),
        ("retry", "jitter"),
        ("retry", "claim_timeout"),
        ("retry", "idle_check"),
        ("poll", "interval"),
        ("source", "status_interval"),
        ("source", "connect_timeout"),
    ] {
        let text = MINIMAL.replace(
            &format!("[{section}]"),
            &format!("[{section}]\n{key} = {huge}"),
        );
        let text = if text == MINIMAL {
            format!("{MINIMAL}\n[{section}]\n{key} = {huge}\n")
        } else {
            text
        };
        let err = Config::parse(&text)
            .unwrap()
            .validate()
            .expect_err(key)
            .to_string();
        assert!(
            err.contains(&format!("{section}.{key}")) && err.contains("allowed from"),
            "{err}"
        );
    }
    for (section, key) in [
        ("poll", "interval"),
        ("retry", "idle_check"),
        ("source", "status_interval"),
    ] {
        let text = MINIMAL.replace(
            &format!("[{section}]"),
            &format!("[{section}]\n{key} = \"0s\""),
        );
        let text = if text == MINIMAL {
            format!("{MINIMAL}\n[{section}]\n{key} = \"0s\"\n")
        } else {
            text
        };
        let err = Config::parse(&text)
            .unwrap()
            .validate()
            .expect_err(key)
            .to_string();
        assert!(err.contains(key), "{err}");
    }
    let mysql = MINIMAL.replace("kind = \"postgres\"", "kind = \"mysql\"\nserver_id = 7");
    for key in ["heartbeat", "connect_timeout"] {
        let text = mysql.replace("[source]", &format!("[source]\n{key} = {huge}"));
        let err = Config::parse(&text)
            .unwrap()
            .validate()
            .expect_err(key)
            .to_string();
        assert!(err.contains(&format!("source.{key}")), "{err}");
    }
}

#[test]
fn cloudevents_are_off_unless_configured_and_checked() {
    assert!(Config::parse(MINIMAL).unwrap().kafka.cloudevents.is_none());
    let config = Config::parse(&format!("{MINIMAL}\n[kafka.cloudevents]\n")).unwrap();
    config.validate().unwrap();
    let ce = config.kafka.cloudevents.unwrap();
    assert_eq!(ce.source("orders"), "/outboxd/orders");
    assert_eq!(ce.content_type, "application/json");
    let text = format!(
        "{MINIMAL}\n[kafka.cloudevents]\nsource = \"urn:example:orders\"\n\
         content_type = \"application/cloudevents-batch\"\n"
    );
    Config::parse(&text).unwrap().validate().unwrap();
    for (line, key) in [
        ("source = \"\"", "source"),
        ("source = \"my service\"", "source"),
        ("source = \"/a%zz\"", "source"),
        ("content_type = \"json\"", "content_type"),
        ("content_type = \"application/json\\n\"", "content_type"),
    ] {
        let text = format!("{MINIMAL}\n[kafka.cloudevents]\n{line}\n");
        let err = Config::parse(&text)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("kafka.cloudevents.{key}")),
            "{line}: {err}"
        );
    }
    let text = format!("{MINIMAL}\n[kafka.cloudevents]\nmode = \"structured\"\n");
    let ce = Config::parse(&text).unwrap().kafka.cloudevents.unwrap();
    assert_eq!(ce.mode, CloudEventsMode::Structured);
    let text = format!("{MINIMAL}\n[kafka.cloudevents]\nmode = \"batched\"\n");
    let err = Config::parse(&text).unwrap_err().to_string();
    assert!(err.contains("mode") || err.contains("batched"), "{err}");
}

#[test]
fn bad_names_and_bounds_are_rejected() {
    let text = MINIMAL.replace("name = \"orders\"", "name = \"Orders-1\"");
    assert!(Config::parse(&text).unwrap().validate().is_err());
    let text = format!("{MINIMAL}\n[delivery]\nmax_in_flight = 0\n");
    assert!(Config::parse(&text).unwrap().validate().is_err());
    let text = MINIMAL.replace("[kafka]", "[kafka]\ntopic_template = \"t.{nope}\"");
    let err = Config::parse(&text)
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("{nope}"), "{err}");
}

/// A configuration that can only route rows into a positions topic or a Kafka
/// internal topic is refused at load, naming the key.
#[test]
fn reserved_topics_cannot_be_configured_as_destinations() {
    for (kafka, key, named) in [
        (
            "allowed_topics = [\"orders\", \"__consumer_offsets\"]",
            "kafka.allowed_topics",
            "__consumer_offsets",
        ),
        ("allowed_topics = [\"__*\"]", "kafka.allowed_topics", "__*"),
        (
            "allowed_topics = [\"outboxd-positions-*\"]",
            "kafka.allowed_topics",
            "outboxd-positions-*",
        ),
        (
            "positions_topic = \"it.positions\"\nallowed_topics = [\"it.positions\"]",
            "kafka.allowed_topics",
            "it.positions",
        ),
        (
            "topic_template = \"__transaction_state\"",
            "kafka.topic_template",
            "__transaction_state",
        ),
        (
            "topic_template = \"__{message_type}\"",
            "kafka.topic_template",
            "__{message_type}",
        ),
        (
            "topic_template = \"outboxd-positions-{pipeline}\"",
            "kafka.topic_template",
            "outboxd-positions-{pipeline}",
        ),
        (
            "positions_topic = \"it.positions\"\ntopic_template = \"it.positions\"",
            "kafka.topic_template",
            "it.positions",
        ),
    ] {
        let text = MINIMAL.replace("[kafka]", &format!("[kafka]\n{kafka}"));
        let err = Config::parse(&text)
            .unwrap()
            .validate()
            .expect_err(kafka)
            .to_string();
        assert!(
            err.contains(key) && err.contains(&format!("`{named}`")),
            "{kafka}: {err}"
        );
    }
    // Patterns that also match other topics stay: the sink refuses the reserved ones
    // row by row.
    for kafka in [
        "allowed_topics = [\"*\", \"outboxd-*\", \"_x*\"]",
        "topic_template = \"_{message_type}\"",
        "topic_template = \"outboxd-{pipeline}\"",
    ] {
        let text = MINIMAL.replace("[kafka]", &format!("[kafka]\n{kafka}"));
        Config::parse(&text).unwrap().validate().expect(kafka);
    }
}

#[test]
fn several_outbox_tables_are_one_list_of_valid_names() {
    let tables =
        "[outbox]\nlayout = \"debezium\"\ntables = [\"a.outboxevent\", \"b.outboxevent\"]\n";
    let text = format!(
        "{}\n{tables}",
        MINIMAL.replace(
            "[kafka]",
            "[kafka]\ntopic_template = \"{schema}.{table}.{routing}\""
        )
    );
    let config = Config::parse(&text).unwrap();
    config.validate().unwrap();
    assert_eq!(
        config.outbox.layout().outbox_tables,
        ["a.outboxevent", "b.outboxevent"]
    );
    let invalid = |extra: &str, template: &str| {
        let text = format!(
            "{}\n[outbox]\n{extra}\n",
            MINIMAL.replace(
                "[kafka]",
                &format!("[kafka]\ntopic_template = \"{template}\"")
            )
        );
        Config::parse(&text)
            .and_then(|c| c.validate())
            .unwrap_err()
            .to_string()
    };
    // Kept rows too: each row's status goes to its own table.
    let kept = format!("{MINIMAL}\n[outbox]\ntables = [\"a.outbox\", \"b.outbox\"]\n");
    let config = Config::parse(&kept).expect("parse");
    config.validate().expect("kept rows in several tables");
    assert!(config.outbox.layout().tracks_status());
    // Both keys, a name twice, an empty name.
    let deleted = "layout = \"debezium\"";
    let err = invalid(
        &format!("{deleted}\ntable = \"x\"\ntables = [\"a.t\"]"),
        "t",
    );
    assert!(err.contains("not both"), "{err}");
    let err = invalid(&format!("{deleted}\ntables = [\"a.t\", \"A.T\"]"), "t");
    assert!(err.contains("twice"), "{err}");
    let err = invalid(&format!("{deleted}\ntables = [\"a.t\", \" \"]"), "t");
    assert!(err.contains("outbox.tables"), "{err}");
    // {schema} needs every name qualified.
    let err = invalid(
        &format!("{deleted}\ntables = [\"a.t\", \"u\"]"),
        "{schema}.x",
    );
    assert!(
        err.contains("`u`") && err.contains("schema-qualified"),
        "{err}"
    );
}

#[test]
fn the_debezium_layout_reads_debeziums_columns_and_routes_as_its_event_router() {
    let text = format!("{MINIMAL}\n[outbox]\nlayout = \"debezium\"\n");
    let config = Config::parse(&text).unwrap();
    config.validate().unwrap();
    assert_eq!(config.kafka.topic_template, "outbox.event.{routing}");
    let layout = config.outbox.layout();
    assert_eq!(layout.rows, RowLifecycle::Deleted);
    assert_eq!(layout.key_column, "aggregateid");
    assert_eq!(layout.columns, ColumnNames::debezium());

    // A named template and column overrides win; "" means "the table has none".
    let text = format!(
        "{}\n[outbox]\nlayout = \"debezium\"\n[outbox.columns]\ntrace = \"\"\n\
         header_columns = [\"id\", \"tenant\"]\n",
        MINIMAL.replace("[kafka]", "[kafka]\ntopic_template = \"events\"")
    );
    let config = Config::parse(&text).unwrap();
    config.validate().unwrap();
    assert_eq!(config.kafka.topic_template, "events");
    let columns = config.outbox.layout().columns;
    assert_eq!(columns.trace, None);
    assert_eq!(columns.header_columns, ["id", "tenant"]);
}

#[test]
fn renamed_columns_need_deleted_rows_and_deleted_rows_need_the_log() {
    let invalid = |extra: &str| {
        let text = format!("{MINIMAL}\n{extra}");
        Config::parse(&text)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string()
    };
    // Kept rows on a mapped table: PostgreSQL's log mode, with an integer id.
    let kept = format!("{MINIMAL}\n[outbox]\nlayout = \"debezium\"\nrows = \"kept\"\n");
    let config = Config::parse(&kept).unwrap();
    config.validate().unwrap();
    let layout = config.outbox.layout();
    assert!(layout.tracks_status());
    assert_eq!(layout.columns.id.as_deref(), Some(DEBEZIUM_ROW_ID));
    assert_eq!(layout.key_column, "aggregateid");
    let err =
        invalid("[outbox]\nlayout = \"debezium\"\nrows = \"kept\"\n[outbox.columns]\nid = \"\"\n");
    assert!(err.contains("integer row id"), "{err}");
    let renamed = format!("{MINIMAL}\n[outbox.columns]\npayload = \"body\"\n");
    Config::parse(&renamed).unwrap().validate().unwrap();
    let poll = MINIMAL.replace(
        "kind = \"postgres\"",
        "kind = \"postgres\"\nmode = \"poll\"",
    );
    let err = Config::parse(&format!("{poll}\n[outbox.columns]\npayload = \"body\"\n"))
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("outboxd's own table only"), "{err}");
    let deleted = format!("{MINIMAL}\n[outbox]\nrows = \"deleted\"\n");
    Config::parse(&deleted).unwrap().validate().unwrap();
    let poll = MINIMAL.replace(
        "kind = \"postgres\"",
        "kind = \"postgres\"\nmode = \"poll\"",
    );
    let text = format!("{poll}\n[outbox]\nrows = \"deleted\"\n");
    let err = Config::parse(&text)
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("nothing to poll"), "{err}");
    let err = invalid("[outbox]\nrows = \"deleted\"\n[outbox.columns]\nmessage_id = \"\"\n");
    assert!(err.contains("outbox.columns.message_id"), "{err}");
}

#[cfg(test)]
mod example_tests {
    use super::*;

    /// The documented examples must stay valid configs.
    #[test]
    fn example_configs_are_valid() {
        for (name, text) in [
            (
                "examples/outboxd.toml",
                include_str!("../../examples/outboxd.toml"),
            ),
            (
                "examples/docker/outboxd.toml",
                include_str!("../../examples/docker/outboxd.toml"),
            ),
            (
                "examples/docker/outboxd-mysql.toml",
                include_str!("../../examples/docker/outboxd-mysql.toml"),
            ),
        ] {
            let config = Config::parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            config.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    /// The commented `[otlp]` part of `examples/outboxd.toml`, uncommented, is valid.
    #[test]
    fn the_documented_otlp_keys_parse_and_validate() {
        let example = include_str!("../../examples/outboxd.toml");
        let start = example.find("# [otlp]").expect("an [otlp] part");
        let part: String = example[start..]
            .lines()
            .take_while(|l| l.starts_with("# "))
            .map(|l| format!("{}\n", &l[2..]))
            .collect();
        let text = format!("{}\n{part}", include_str!("../../examples/outboxd.toml"));
        let config = Config::parse(&text).unwrap_or_else(|e| panic!("{part}: {e}"));
        config.validate().unwrap();
        let otlp = config.otlp.expect("[otlp]");
        assert_eq!(otlp.endpoint, "http://127.0.0.1:4318");
        assert_eq!(otlp.timeout, Duration::from_secs(10));
        let text = format!("{text}bogus = 1\n");
        assert!(Config::parse(&text)
            .unwrap_err()
            .to_string()
            .contains("bogus"));
    }

    /// So must the MySQL examples.
    #[test]
    fn mysql_example_configs_are_valid() {
        for text in [
            include_str!("../../examples/outboxd-mysql.toml"),
            include_str!("../../examples/docker/outboxd-mysql.toml"),
        ] {
            let config = Config::parse(text).unwrap();
            config.validate().unwrap();
            assert!(matches!(config.source.engine, SourceConfig::Mysql(_)));
        }
    }
}

#[test]
fn the_console_needs_metrics_and_a_token_of_its_own() {
    let with =
        |extra: &str| Config::parse(&format!("{MINIMAL}\n{extra}")).and_then(|c| c.validate());
    let err = with("[console]\ntoken = \"0123456789abcdef\"\n").unwrap_err();
    assert!(err.to_string().contains("add [metrics]"), "{err}");
    let err = with("[metrics]\nbearer_token = \"0123456789abcdef\"\n[console]\n").unwrap_err();
    assert!(err.to_string().contains("its own credential"), "{err}");
    let err = with("[metrics]\n[console]\ntoken = \"short\"\n").unwrap_err();
    assert!(err.to_string().contains("shorter than 16"), "{err}");
    let config = with("[metrics]\n[console]\ntoken = \"0123456789abcdef\"\nsecure_cookie = true\n");
    assert!(config.is_ok(), "{config:?}");
}
