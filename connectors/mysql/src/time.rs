//! MySQL date-time values as outboxd shows them. Sessions run in `time_zone = '+00:00'`,
//! so a TIMESTAMP read by SQL is UTC; the binlog carries TIMESTAMPs as seconds since the
//! epoch. Both become the same ISO 8601 text (`2026-05-09T07:30:00.123456+00:00`, no
//! fraction when it is zero), so a row claimed by SQL and the same row read from the log
//! give the same `created_at`. The calendar arithmetic is jiff's.

use std::time::SystemTime;

use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use jiff::Timestamp;

/// Seconds (and microseconds) since the epoch as `2026-05-09T07:30:00.123456+00:00`.
/// Outside jiff's range (years -9999..=9999) the raw seconds are shown.
pub(crate) fn iso8601_utc(secs: i64, micros: u32) -> String {
    let nanos = i32::try_from(micros.min(999_999) * 1000).unwrap_or(0);
    match Timestamp::new(secs, nanos) {
        Ok(ts) => iso8601(ts),
        Err(_) => format!("{secs}.{micros:06}"),
    }
}

fn iso8601(ts: Timestamp) -> String {
    let dt = TimeZone::UTC.to_datetime(ts);
    let micros = dt.subsec_nanosecond() / 1000;
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{}+00:00",
        dt.year(),
        dt.month(),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second(),
        fraction(u32::try_from(micros).unwrap_or(0))
    )
}

/// `.123456`, or nothing for a whole second.
pub(crate) fn fraction(micros: u32) -> String {
    if micros == 0 {
        String::new()
    } else {
        format!(".{micros:06}")
    }
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff]` in UTC (an SQL-read TIMESTAMP).
fn parse_sql_time(text: &str) -> Option<Timestamp> {
    let dt: DateTime = text.trim().parse().ok()?;
    TimeZone::UTC.to_timestamp(dt).ok()
}

/// An SQL-read TIMESTAMP as the stream renders it; text that is not one stays as it is.
pub(crate) fn sql_time_iso(text: &str) -> String {
    parse_sql_time(text).map_or_else(|| text.to_owned(), iso8601)
}

/// An SQL-read TIMESTAMP as a [`SystemTime`].
pub(crate) fn system_time(text: Option<String>) -> Option<SystemTime> {
    parse_sql_time(&text?).map(SystemTime::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sql_times_read_as_the_stream_renders_them() {
        assert_eq!(
            sql_time_iso("2026-05-09 07:30:00.123456"),
            "2026-05-09T07:30:00.123456+00:00"
        );
        assert_eq!(
            sql_time_iso("2026-05-09 07:30:00.000000"),
            "2026-05-09T07:30:00+00:00"
        );
        assert_eq!(sql_time_iso("garbage"), "garbage");
        assert_eq!(
            system_time(Some("1970-01-01 00:00:01".into())),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1))
        );
        assert_eq!(
            system_time(Some("2000-03-01 00:00:00.5".into())),
            Some(SystemTime::UNIX_EPOCH + Duration::from_millis(951_868_800_500))
        );
        assert!(system_time(Some("2026-05-09 07:30:00".into())).is_some());
    }

    #[test]
    fn epoch_seconds_render_in_utc() {
        assert_eq!(iso8601_utc(0, 0), "1970-01-01T00:00:00+00:00");
        assert_eq!(
            iso8601_utc(1_778_311_800, 123_456),
            "2026-05-09T07:30:00.123456+00:00"
        );
        assert_eq!(iso8601_utc(951_782_400, 0), "2000-02-29T00:00:00+00:00");
        assert_eq!(iso8601_utc(-1, 0), "1969-12-31T23:59:59+00:00");
    }
}
