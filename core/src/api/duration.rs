//! Durations written as Go writes them (`"90s"`, `"1h30m"`, `"2.5s"`, `"500ms"`): v2's
//! `attemptDeadline`, and the whole seconds a Job's `activeDeadlineSeconds` takes.

const NANOS_PER_SECOND: i128 = 1_000_000_000;
/// Fraction digits kept per part: beyond these a digit moves the value by far less than
/// a nanosecond even in hours, and the product stays within i128.
const MAX_FRACTION_DIGITS: u32 = 24;

/// `s` in nanoseconds, read as Go's `time.ParseDuration` reads it with the units `h`,
/// `m`, `s` and `ms`: an optional sign, then one or more `<number><unit>` parts, a
/// number being digits with an optional fraction (`1h30m`, `2.5s`, `.5s`, `1.s`); `"0"`
/// alone is zero. Digits below a nanosecond are dropped, as Go does. Unlike Go, the range
/// is not capped at 292 years: every whole number of seconds an i64 holds (v1's
/// `activeDeadlineSeconds`) has a duration string, so the versions convert losslessly.
pub fn parse_nanos(s: &str) -> Result<i128, String> {
    let bad = |why: &str| {
        format!("{s:?} is not a duration ({why}; e.g. \"90s\", \"1h30m\", \"2.5s\", \"500ms\")")
    };
    let (negative, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(bad("empty"));
    }
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int_digits, after) = rest.split_at(int_len);
        let (frac_digits, after) = match after.strip_prefix('.') {
            Some(a) => {
                let n = a.bytes().take_while(u8::is_ascii_digit).count();
                a.split_at(n)
            }
            None => ("", after),
        };
        if int_digits.is_empty() && frac_digits.is_empty() {
            return Err(bad("expected a number"));
        }
        let unit_len = after
            .bytes()
            .take_while(|b| !b.is_ascii_digit() && *b != b'.')
            .count();
        let (unit, after) = after.split_at(unit_len);
        let unit_nanos: i128 = match unit {
            "h" => 3600 * NANOS_PER_SECOND,
            "m" => 60 * NANOS_PER_SECOND,
            "s" => NANOS_PER_SECOND,
            "ms" => 1_000_000,
            "" => return Err(bad("missing unit after a number; units: h, m, s, ms")),
            other => return Err(bad(&format!("unknown unit {other:?}; units: h, m, s, ms"))),
        };
        let too_large = || bad("too large");
        let mut int: i128 = 0;
        for d in int_digits.bytes() {
            int = int
                .checked_mul(10)
                .and_then(|v| v.checked_add(i128::from(d - b'0')))
                .ok_or_else(too_large)?;
        }
        let mut part = int.checked_mul(unit_nanos).ok_or_else(too_large)?;
        let (mut frac, mut scale): (i128, i128) = (0, 1);
        for d in frac_digits.bytes().take(MAX_FRACTION_DIGITS as usize) {
            frac = frac * 10 + i128::from(d - b'0');
            scale *= 10;
        }
        // Truncated to whole nanoseconds, as Go does.
        part = part
            .checked_add(frac * unit_nanos / scale)
            .ok_or_else(too_large)?;
        total = total.checked_add(part).ok_or_else(too_large)?;
        rest = after;
    }
    Ok(if negative { -total } else { total })
}

/// `s` in whole seconds, rounded up (`"2.5s"` is 3, `"500ms"` is 1): what a Job's
/// `activeDeadlineSeconds` can say.
pub fn ceil_seconds(s: &str) -> Result<i64, String> {
    let nanos = parse_nanos(s)?;
    let whole = nanos.div_euclid(NANOS_PER_SECOND);
    let up = i128::from(nanos.rem_euclid(NANOS_PER_SECOND) != 0);
    i64::try_from(whole + up).map_err(|_| {
        format!(
            "{s:?} is too long a duration (more than {} seconds)",
            i64::MAX
        )
    })
}

/// The canonical string of `seconds`: hours, minutes and seconds, zero parts left out
/// (`"1h30m"`, `"45s"`, `"2h"`, `"1m5s"`; zero is `"0s"`). [`parse_nanos`] reads it back
/// to exactly `seconds`.
pub fn format_seconds(seconds: i64) -> String {
    if seconds == 0 {
        return "0s".to_owned();
    }
    let sign = if seconds < 0 { "-" } else { "" };
    let n = seconds.unsigned_abs();
    let (h, m, s) = (n / 3600, n % 3600 / 60, n % 60);
    let mut out = sign.to_owned();
    for (value, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if value != 0 {
            out.push_str(&format!("{value}{unit}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn go_style_durations_parse() {
        let s = NANOS_PER_SECOND;
        for (text, nanos) in [
            ("90s", 90 * s),
            ("1h30m", 5400 * s),
            ("2.5s", 2 * s + s / 2),
            ("500ms", s / 2),
            ("1.5h", 5400 * s),
            (".5s", s / 2),
            ("1.s", s),
            ("1m0.5s", 60 * s + s / 2),
            ("0", 0),
            ("0s", 0),
            ("-1m", -60 * s),
            ("+2s", 2 * s),
            ("1.0000000001s", s),
            ("3600s", 3600 * s),
            ("1h1h", 7200 * s),
        ] {
            assert_eq!(parse_nanos(text), Ok(nanos), "{text}");
        }
    }

    #[test]
    fn bad_durations_say_why() {
        for (text, why) in [
            ("", "empty"),
            ("-", "empty"),
            ("90", "missing unit"),
            ("1d", "unknown unit \"d\""),
            ("1us", "unknown unit"),
            ("s", "expected a number"),
            ("1h.", "expected a number"),
            (".s", "expected a number"),
            ("1 s", "unknown unit \" s\""),
            ("99999999999999999999999999999999999999h", "too large"),
        ] {
            let e = parse_nanos(text).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn seconds_round_up() {
        for (text, secs) in [
            ("2.5s", 3),
            ("500ms", 1),
            ("1ms", 1),
            ("90m", 5400),
            ("3600s", 3600),
            ("1h30m", 5400),
            ("-1.5s", -1),
            ("0", 0),
        ] {
            assert_eq!(ceil_seconds(text), Ok(secs), "{text}");
        }
        let max = format!("{}s", i64::MAX);
        assert_eq!(ceil_seconds(&max), Ok(i64::MAX));
        let over = format!("{}s", i128::from(i64::MAX) + 1);
        assert!(ceil_seconds(&over).unwrap_err().contains("too long"));
    }

    #[test]
    fn canonical_form() {
        for (secs, text) in [
            (5400, "1h30m"),
            (45, "45s"),
            (7200, "2h"),
            (65, "1m5s"),
            (3661, "1h1m1s"),
            (0, "0s"),
            (-90, "-1m30s"),
        ] {
            assert_eq!(format_seconds(secs), text);
        }
    }

    proptest! {
        #[test]
        fn canonical_form_reads_back_exactly(secs in any::<i64>()) {
            prop_assert_eq!(ceil_seconds(&format_seconds(secs)), Ok(secs));
        }
    }
}
