//! librdkafka options: the safety defaults outboxd always applies and the pass-through
//! options it refuses because they would weaken the delivery guarantee.

use std::collections::BTreeMap;

use outboxd_connector::CheckLine;

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

/// `outboxd check`'s line on the Kafka connection's security, from the options alone:
/// a warning, with the fix, when certificates are not verified or a password travels
/// without TLS.
pub(crate) fn security_line(options: &BTreeMap<String, String>) -> CheckLine {
    let get = |key: &str| {
        options
            .get(key)
            .map(|v| v.trim().to_ascii_lowercase())
            .unwrap_or_default()
    };
    let protocol = match get("security.protocol") {
        p if p.is_empty() => "plaintext".to_owned(),
        p => p,
    };
    let tls = protocol == "ssl" || protocol == "sasl_ssl";
    let mechanism = match get("sasl.mechanism").as_str() {
        "" => get("sasl.mechanisms"),
        m => m.to_owned(),
    };
    let mut problems = Vec::new();
    let mut fixes = Vec::new();
    if protocol == "sasl_plaintext" && (mechanism.is_empty() || mechanism == "plain") {
        problems.push(
            "SASL PLAIN sends the password in the clear (security.protocol = SASL_PLAINTEXT)",
        );
        fixes.push("set \"security.protocol\" = \"SASL_SSL\"");
    }
    if tls && get("enable.ssl.certificate.verification") == "false" {
        problems.push("the brokers' certificates are not verified (enable.ssl.certificate.verification = false)");
        fixes.push("remove enable.ssl.certificate.verification (or set it to true) and give ssl.ca.location");
    }
    if tls && get("ssl.endpoint.identification.algorithm") == "none" {
        problems.push("the brokers' host names are not checked (ssl.endpoint.identification.algorithm = none)");
        fixes.push("remove ssl.endpoint.identification.algorithm (librdkafka's default is https)");
    }
    if !problems.is_empty() {
        return CheckLine::warn("kafka security", problems.join("; "), fixes.join("; "));
    }
    let detail = if tls {
        "TLS, brokers' certificates and host names verified".to_owned()
    } else if protocol == "sasl_plaintext" {
        format!("SASL {mechanism} without TLS: no password in the clear, traffic not encrypted")
    } else {
        "no TLS (security.protocol = PLAINTEXT): traffic not encrypted".to_owned()
    };
    CheckLine::ok("kafka security", detail)
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

    #[test]
    fn check_warns_when_certificates_are_not_verified_or_a_password_travels_in_clear() {
        let line = |pairs: &[(&str, &str)]| {
            let options: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            security_line(&options)
        };
        let plain = line(&[
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", "PLAIN"),
        ]);
        assert_eq!(plain.status, outboxd_connector::CheckStatus::Warn);
        assert!(plain.fix.unwrap_or_default().contains("SASL_SSL"));
        let unverified = line(&[
            ("security.protocol", "SSL"),
            ("enable.ssl.certificate.verification", "false"),
        ]);
        assert_eq!(unverified.status, outboxd_connector::CheckStatus::Warn);
        let no_host = line(&[
            ("security.protocol", "SASL_SSL"),
            ("ssl.endpoint.identification.algorithm", "none"),
        ]);
        assert!(no_host.detail.contains("host names"), "{}", no_host.detail);
        let verified = line(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
        ]);
        assert_eq!(verified.status, outboxd_connector::CheckStatus::Ok);
        assert!(verified.detail.contains("verified"));
        assert_eq!(line(&[]).status, outboxd_connector::CheckStatus::Ok);
    }
}
