//! RFC 3339 formatting of engine instants, without a clock (history payloads carry timestamps).

use crate::Millis;

/// `2026-01-01T00:00:05.000000Z` — microsecond precision, UTC, as DW writes timestamps.
pub fn iso8601(ms: Millis) -> String {
    iso8601_micros(ms * 1000)
}

/// The same form for an instant in microseconds since the epoch.
pub fn iso8601_micros(us: i64) -> String {
    let secs = us.div_euclid(1_000_000);
    let micros = us.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hour, minute, second) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    if !(0..=9999).contains(&y) {
        return format!("{y:04}-{m:02}-{d:02}T{hour:02}:{minute:02}:{second:02}.{micros:06}Z");
    }
    // Written digit by digit: history pages format one per event, and `format!` was a visible
    // share of serving them.
    let mut text = *b"0000-00-00T00:00:00.000000Z";
    let mut put = |at: usize, width: usize, mut value: u64| {
        for slot in text[at..at + width].iter_mut().rev() {
            *slot = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    put(0, 4, y as u64);
    put(5, 2, m as u64);
    put(8, 2, d as u64);
    put(11, 2, hour as u64);
    put(14, 2, minute as u64);
    put(17, 2, second as u64);
    put(20, 6, micros as u64);
    String::from_utf8(text.to_vec()).expect("ASCII digits")
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(iso8601(1_767_225_605_123), "2026-01-01T00:00:05.123000Z");
        assert_eq!(iso8601(951_782_400_000), "2000-02-29T00:00:00.000000Z");
        assert_eq!(iso8601_micros(1_767_225_605_123_456), "2026-01-01T00:00:05.123456Z");
        assert_eq!(iso8601_micros(-1), "1969-12-31T23:59:59.999999Z");
        assert_eq!(iso8601(253_402_300_800_000), "10000-01-01T00:00:00.000000Z");
    }
}
