//! librdkafka options: the safety defaults outboxd always applies and the pass-through
//! options it refuses because they would weaken the delivery guarantee.

use std::collections::BTreeMap;

/// Producer settings outboxd always applies. Together they make the producer
/// idempotent: no duplicates from internal retries and no reordering within a
/// partition, which is what keeps each `biz_key` in order.
pub(super) const SAFE_DEFAULTS: &[(&str, &str)] =
    &[("enable.idempotence", "true"), ("acks", "all")];

/// Options outboxd sets itself from typed config keys.
const OWNED_OPTIONS: &[(&str, &str)] = &[
    ("bootstrap.servers", "kafka.bootstrap_servers"),
    ("message.timeout.ms", "kafka.message_timeout"),
    ("delivery.timeout.ms", "kafka.message_timeout"),
];

/// Rejects librdkafka options that would silently weaken the delivery guarantee.
pub(crate) fn validate_options(options: &BTreeMap<String, String>) -> Result<(), String> {
    for (key, value) in options {
        let value = value.trim().to_ascii_lowercase();
        let conflict = match key.as_str() {
            "enable.idempotence" if value != "true" => Some(
                "outboxd keeps the producer idempotent: without it a retried batch can be \
                 written twice or out of order, breaking per-key order",
            ),
            "acks" | "request.required.acks" if value != "all" && value != "-1" => Some(
                "outboxd marks a row SUCCESS only when every in-sync replica has it; a weaker \
                 acks setting can lose acknowledged records",
            ),
            "message.send.max.retries" | "retries" if value == "0" => Some(
                "the idempotent producer needs retries; give kafka.message_timeout to bound \
                 how long a record is retried",
            ),
            "max.in.flight.requests.per.connection" | "max.in.flight"
                if value.parse::<u32>().map_or(true, |n| n > 5) =>
            {
                Some("the idempotent producer keeps order only with at most 5 in-flight requests")
            }
            "transactional.id" => {
                Some("outboxd does not use Kafka transactions; the outbox row is the ledger")
            }
            _ => None,
        };
        if let Some(why) = conflict {
            return Err(format!(
                "kafka.options.\"{key}\" = \"{value}\" is not allowed: {why}"
            ));
        }
        if let Some((_, typed)) = OWNED_OPTIONS.iter().find(|(k, _)| k == key) {
            return Err(format!(
                "kafka.options.\"{key}\" is set by outboxd; use `{typed}` instead"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_that_weaken_delivery_are_rejected() {
        let reject = |k: &str, v: &str| {
            let options = BTreeMap::from([(k.to_owned(), v.to_owned())]);
            validate_options(&options).unwrap_err()
        };
        assert!(reject("enable.idempotence", "false").contains("idempotent"));
        assert!(reject("acks", "1").contains("acks"));
        assert!(reject("max.in.flight.requests.per.connection", "10").contains("5"));
        assert!(reject("bootstrap.servers", "x:1").contains("kafka.bootstrap_servers"));
        assert!(reject("transactional.id", "t").contains("transactions"));
        let fine = BTreeMap::from([
            ("acks".to_owned(), "all".to_owned()),
            ("compression.type".to_owned(), "zstd".to_owned()),
            ("security.protocol".to_owned(), "SASL_SSL".to_owned()),
        ]);
        validate_options(&fine).unwrap();
    }
}
