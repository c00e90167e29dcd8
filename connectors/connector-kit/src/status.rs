//! The values of the outbox's `status` column, written by every engine's SQL.

/// Inserted by the application, not published yet.
pub const INIT: &str = "INIT";
/// Published and acknowledged.
pub const SUCCESS: &str = "SUCCESS";
/// A publish failed (or the row was parked); due again at `next_retry_time`.
pub const FAILED: &str = "FAILED";
/// Claimed by a worker (`claimed_at`, `claim_token`).
pub const PROCESSING: &str = "PROCESSING";
/// Out of attempts: waits for an operator.
pub const MANUAL_REQUIRED: &str = "MANUAL_REQUIRED";

/// The statuses that hold back later events of a key under strict ordering.
pub const BLOCKING: [&str; 3] = [FAILED, PROCESSING, MANUAL_REQUIRED];

/// [`BLOCKING`] as an SQL list, `('FAILED', 'PROCESSING', 'MANUAL_REQUIRED')`; the literals
/// are plain ASCII, so the text is the same in every dialect.
pub fn blocking_sql_list() -> String {
    sql_list(&BLOCKING)
}

/// Status literals as an SQL list: `('A', 'B')`.
pub fn sql_list(statuses: &[&str]) -> String {
    let quoted: Vec<String> = statuses.iter().map(|s| format!("'{s}'")).collect();
    format!("({})", quoted.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocking_list_as_sql() {
        assert_eq!(
            blocking_sql_list(),
            "('FAILED', 'PROCESSING', 'MANUAL_REQUIRED')"
        );
    }
}
