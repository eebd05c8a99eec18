//! RFC 3339 UTC timestamps for reports, without a date-time dependency.

use std::time::{SystemTime, UNIX_EPOCH};

/// `t` as `YYYY-MM-DDTHH:MM:SSZ` (UTC). Times before 1970 are written as the epoch.
pub fn rfc3339_utc(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The current time as [`rfc3339_utc`].
pub fn now_rfc3339() -> String {
    rfc3339_utc(SystemTime::now())
}

/// Proleptic Gregorian (year, month, day) of a day count since 1970-01-01, by Howard Hinnant's `civil_from_days`
/// (400-year eras of 146 097 days, years starting in March so the leap day is the last day of the year).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Expected strings from `date -u -d @SECONDS +%Y-%m-%dT%H:%M:%SZ` (GNU coreutils).
    #[test]
    fn timestamps_match_gnu_date() {
        for (secs, want) in [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (1_709_251_199, "2024-02-29T23:59:59Z"),
            (1_795_888_800, "2026-11-28T18:00:00Z"),
            (4_107_542_400, "2100-03-01T00:00:00Z"),
        ] {
            assert_eq!(
                rfc3339_utc(UNIX_EPOCH + Duration::from_secs(secs)),
                want,
                "{secs}"
            );
        }
    }
}
