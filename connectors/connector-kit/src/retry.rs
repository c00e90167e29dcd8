//! The longest retry delay written to a row.

use std::time::Duration;

/// Longest retry delay written (one year); longer ones are clamped. One year rather than
/// ten: it keeps `now + delay` far inside every engine's date range (MySQL's TIMESTAMP
/// ends in 2038) and inside the interval arithmetic of both dialects, and a row due in a
/// year is as good as parked for an operator anyway.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(365 * 24 * 3600);

/// `delay` in whole milliseconds, clamped to [`MAX_RETRY_DELAY`], as the SQL of every
/// engine writes it.
pub fn delay_ms(delay: Duration) -> i64 {
    let ms = delay.min(MAX_RETRY_DELAY).as_millis();
    // At most a year of milliseconds: always fits.
    i64::try_from(ms).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamps_delays() {
        assert_eq!(delay_ms(Duration::from_millis(1500)), 1500);
        let max = i64::try_from(MAX_RETRY_DELAY.as_millis()).unwrap();
        assert_eq!(delay_ms(Duration::from_secs(u64::MAX)), max);
        assert_eq!(delay_ms(MAX_RETRY_DELAY * 2), max);
    }
}
