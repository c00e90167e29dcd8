//! When the claim worker looks at the table again.

use std::time::{Duration, Instant, SystemTime};

use outboxd_connector::RetrySchedule;

/// When to look again: the earliest due row or claim expiry, at most `idle_check` away,
/// at least a few milliseconds away (so a row due "now" that a stricter claim skipped
/// does not spin the worker).
pub(super) fn next_look(
    schedule: &RetrySchedule,
    claim_timeout: Duration,
    idle_check: Option<Duration>,
    now: SystemTime,
) -> Instant {
    const FLOOR: Duration = Duration::from_millis(20);
    let until = |t: SystemTime| t.duration_since(now).unwrap_or(Duration::ZERO);
    // A year stands for "until woken".
    let mut wait = idle_check.unwrap_or(Duration::from_secs(365 * 86_400));
    if let Some(due) = schedule.next_due {
        wait = wait.min(until(due));
    }
    if let Some(claimed) = schedule.oldest_claim {
        wait = wait.min(until(claimed + claim_timeout));
    }
    Instant::now() + wait.max(FLOOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worker_wakes_for_the_earliest_due_row_or_expired_claim() {
        let now = SystemTime::now();
        let idle = Some(Duration::from_secs(60));
        let timeout = Duration::from_secs(30);
        let in_ = |d: Instant| d.saturating_duration_since(Instant::now());
        let nothing = RetrySchedule::default();
        assert!(in_(next_look(&nothing, timeout, idle, now)) > Duration::from_secs(59));
        let due = RetrySchedule {
            next_due: Some(now + Duration::from_secs(5)),
            oldest_claim: None,
        };
        let wait = in_(next_look(&due, timeout, idle, now));
        assert!(
            wait <= Duration::from_secs(5) && wait > Duration::from_secs(4),
            "{wait:?}"
        );
        let claim = RetrySchedule {
            next_due: Some(now + Duration::from_secs(50)),
            oldest_claim: Some(now - Duration::from_secs(20)),
        };
        let wait = in_(next_look(&claim, timeout, idle, now));
        assert!(
            wait <= Duration::from_secs(10) && wait > Duration::from_secs(9),
            "{wait:?}"
        );
        let overdue = RetrySchedule {
            next_due: Some(now - Duration::from_secs(5)),
            oldest_claim: None,
        };
        assert!(in_(next_look(&overdue, timeout, idle, now)) <= Duration::from_millis(20));
    }
}
