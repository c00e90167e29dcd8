//! Defaults of the `[source]` keys every engine has (`host`, `connect_timeout`); each
//! engine's config struct names them in its serde attributes, so the keys and their
//! defaults stay the same across engines.
//!
//! The keys themselves (`host`, `port`, `user`, `password`, `password_file`, `database`,
//! the `ssl*` keys, `connect_timeout`) are declared again in each engine's struct rather
//! than in one shared struct: serde cannot `flatten` a struct into one that denies unknown
//! fields, and a misspelt `[source]` key must be an error, not silently ignored.

use std::time::Duration;

/// `host`: the local server.
pub fn default_host() -> String {
    "127.0.0.1".into()
}

/// `connect_timeout`: time allowed to establish a connection.
pub fn default_connect_timeout() -> Duration {
    Duration::from_secs(10)
}

/// Checks that `value` of `key` lies in `min..=max`, so that no deadline computed from it
/// (`Instant + value`) can overflow and no period of zero spins. The error names the key
/// and the range.
pub fn check_duration(
    key: &str,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), String> {
    if value < min || value > max {
        return Err(format!(
            "{key} = \"{}\" is out of range: allowed from {} to {}",
            human(value),
            human(min),
            human(max)
        ));
    }
    Ok(())
}

/// `d` as a config would write it: `500ms`, `10s`, `5m`, `2h`, `7d`.
pub fn human(d: Duration) -> String {
    let secs = d.as_secs();
    if d.is_zero() {
        return "0s".into();
    }
    if d.subsec_nanos() != 0 || secs == 0 {
        return match d.subsec_nanos() % 1_000_000 {
            0 => format!("{}ms", d.as_millis()),
            _ => format!("{d:?}"),
        };
    }
    for (unit, len) in [("d", 86_400), ("h", 3_600), ("m", 60)] {
        if secs % len == 0 {
            return format!("{}{unit}", secs / len);
        }
    }
    format!("{secs}s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_out_of_range_name_the_key_and_the_range() {
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(3600));
        assert!(check_duration("a.b", Duration::from_secs(1), min, max).is_ok());
        assert!(check_duration("a.b", max, min, max).is_ok());
        let err = check_duration("a.b", Duration::from_secs(u64::MAX), min, max).unwrap_err();
        assert!(
            err.contains("a.b") && err.contains("from 100ms to 1h"),
            "{err}"
        );
        let err = check_duration("a.b", Duration::ZERO, min, max).unwrap_err();
        assert!(err.contains("\"0s\""), "{err}");
        assert_eq!(human(Duration::from_secs(7 * 86_400)), "7d");
        assert_eq!(human(Duration::from_secs(90)), "90s");
        assert_eq!(human(Duration::from_millis(1500)), "1500ms");
    }
}
