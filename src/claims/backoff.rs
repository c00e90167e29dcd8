//! The backoff of failed rows: `next_retry_time = now + min(base * 2^retry_count, cap) +
//! jitter`.

use std::time::Duration;

use rand::Rng;

use crate::config::RetryConfig;

/// Delay before the next attempt of a row that has failed `retry_count` times before
/// this failure, with `jitter_fraction` in `[0, 1)` choosing the random extra delay.
pub fn backoff_delay(policy: &RetryConfig, retry_count: i32, jitter_fraction: f64) -> Duration {
    // 2^31 overflows any real cap long before the exponent matters; clamp it.
    let exponent = retry_count.clamp(0, 30) as u32;
    let exponential = policy.base.saturating_mul(1u32 << exponent);
    let jitter = policy.jitter.mul_f64(jitter_fraction.clamp(0.0, 1.0));
    exponential.min(policy.cap) + jitter
}

/// [`backoff_delay`] with a random jitter.
pub fn next_retry_delay(policy: &RetryConfig, retry_count: i32) -> Duration {
    backoff_delay(policy, retry_count, rand::thread_rng().gen::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryConfig {
        RetryConfig {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
            jitter: Duration::from_millis(500),
            ..RetryConfig::default()
        }
    }

    #[test]
    fn doubles_per_attempt_up_to_the_cap() {
        let p = policy();
        assert_eq!(backoff_delay(&p, 0, 0.0), Duration::from_secs(1));
        assert_eq!(backoff_delay(&p, 1, 0.0), Duration::from_secs(2));
        assert_eq!(backoff_delay(&p, 5, 0.0), Duration::from_secs(32));
        assert_eq!(backoff_delay(&p, 6, 0.0), Duration::from_secs(60));
        assert_eq!(backoff_delay(&p, i32::MAX, 0.0), Duration::from_secs(60));
        assert_eq!(backoff_delay(&p, -3, 0.0), Duration::from_secs(1));
    }

    #[test]
    fn jitter_adds_at_most_the_configured_amount() {
        let p = policy();
        assert_eq!(backoff_delay(&p, 0, 0.5), Duration::from_millis(1250));
        assert_eq!(backoff_delay(&p, 10, 0.999_999).as_millis(), 60_499);
        for _ in 0..100 {
            let d = next_retry_delay(&p, 2);
            assert!(
                d >= Duration::from_secs(4) && d < Duration::from_millis(4500),
                "{d:?}"
            );
        }
    }
}
