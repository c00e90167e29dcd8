//! What outboxd writes into `last_error`: the same words from every engine, so operators
//! can search for them in plain SQL.

use std::fmt::Write;
use std::time::Duration;

use crate::ReapPolicy;

/// `last_error` keeps at most this many characters: a broker error is short, a stack of
/// nested causes need not fill the row.
pub const LAST_ERROR_MAX_CHARS: usize = 2000;

/// At most [`LAST_ERROR_MAX_CHARS`] characters of `error`, cut on a character boundary.
pub fn last_error_text(error: &str) -> String {
    match error.char_indices().nth(LAST_ERROR_MAX_CHARS) {
        Some((at, _)) => error[..at].to_owned(),
        None => error.to_owned(),
    }
}

/// `last_error` of a row parked behind an undelivered earlier event of its key (strict
/// ordering); `parked` says who parked it (`parked`, `parked by recover`).
pub fn parked_behind_key(parked: &str, biz_key: &str) -> String {
    format!(
        "{parked}: an earlier event of biz_key `{biz_key}` is not delivered yet (strict ordering)"
    )
}

/// `last_error` of a row an operator parked (`outboxd park`).
pub fn parked_by_operator(reason: &str) -> String {
    last_error_text(&format!("parked by operator: {reason}"))
}

/// `last_error` of a row an operator resolved without sending (`outboxd resolve`).
pub fn resolved_by_operator(reason: &str) -> String {
    last_error_text(&format!("resolved by operator without sending: {reason}"))
}

/// `last_error` of an inbox row an operator resolved without handling it.
pub fn resolved_without_handling(reason: &str) -> String {
    last_error_text(&format!("resolved by operator without handling: {reason}"))
}

impl ReapPolicy {
    /// `last_error` of a row the reaper took back from an abandoned claim.
    pub fn reaped_reason(&self) -> String {
        format!(
            "claim expired after {} (worker stopped while publishing)",
            short_duration(self.claim_timeout)
        )
    }
}

/// `90s` → `1m30s`, `1500ms` → `1.5s`: short, for messages stored in `last_error`.
pub fn short_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    if ms % 1000 != 0 && ms < 60_000 {
        return format!("{:.1}s", d.as_secs_f64());
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        let _ = write!(out, "{h}h");
    }
    if m > 0 {
        let _ = write!(out, "{m}m");
    }
    if s > 0 || out.is_empty() {
        let _ = write!(out, "{s}s");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_error_is_cut_on_character_boundaries() {
        assert_eq!(last_error_text("short"), "short");
        let long = "é".repeat(LAST_ERROR_MAX_CHARS + 5);
        assert_eq!(last_error_text(&long).chars().count(), LAST_ERROR_MAX_CHARS);
        assert_eq!(parked_by_operator("x"), "parked by operator: x");
    }

    #[test]
    fn durations_are_short() {
        assert_eq!(short_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(short_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(short_duration(Duration::from_secs(30)), "30s");
        assert_eq!(short_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(short_duration(Duration::from_secs(3600)), "1h");
        assert_eq!(short_duration(Duration::ZERO), "0ms");
        let policy = ReapPolicy {
            claim_timeout: Duration::from_secs(60),
            retry_delay: Duration::from_secs(1),
        };
        assert_eq!(
            policy.reaped_reason(),
            "claim expired after 1m (worker stopped while publishing)"
        );
    }
}
