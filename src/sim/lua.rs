//! Numbers as Redis and its Lua 5.1 read and print them, for the script runtime and the
//! command model: a number turned into a string when passed to `redis.call` (`%.17g`, not
//! Lua's own `%.14g`), a number turned into an integer reply (truncation), a score read
//! (`strtod`, as `ZADD` and the range bounds do) and printed (`%.17g`, `inf`), and the
//! strict integer syntax of `INCR` and TTL arguments.

/// Lua 5.1's `tonumber(s)` for a string: C `strtod` (decimal, `inf`, `nan`, hexadecimal)
/// with surrounding white space allowed, the string read up to its first NUL byte.
pub(crate) fn tonumber(raw: &[u8]) -> Option<f64> {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    let text = std::str::from_utf8(raw.get(..end)?).ok()?;
    let t = text.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r'));
    if t.is_empty() {
        return None;
    }
    let (neg, body) = match t.as_bytes().first() {
        Some(b'-') => (true, t.get(1..)?),
        Some(b'+') => (false, t.get(1..)?),
        _ => (false, t),
    };
    if let Some(hex) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let v = hex
            .bytes()
            .fold(0f64, |acc, b| acc * 16.0 + f64::from(hex_digit(b)));
        return Some(if neg { -v } else { v });
    }
    // strtod and Rust agree on decimal forms, "inf", "infinity" and "nan"; Rust also
    // takes a sign we already removed.
    if body.starts_with(['+', '-']) {
        return None;
    }
    let v: f64 = body.parse().ok()?;
    Some(if neg { -v } else { v })
}

fn hex_digit(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => b - b'A' + 10,
    }
}

/// A Lua number as `redis.call` receives it: C's `%.17g` (Redis formats a number argument
/// itself, because Lua's own `%.14g` loses precision: `now + lease` past 10^14 ms would
/// print in exponent form and be rounded).
pub(crate) fn format_number(v: f64) -> String {
    format_g(v, 17)
}

/// A sorted set score as Redis 7.0 replies it in RESP2: `inf`, `-inf` or C's `%.17g`.
pub(crate) fn format_score(v: f64) -> String {
    if v.is_infinite() {
        return if v < 0.0 { "-inf" } else { "inf" }.to_owned();
    }
    format_g(v, 17)
}

/// Redis's reading of a score argument (`ZADD`): C `strtod` over the whole text, no
/// leading space, not NaN, no overflow of a finite number.
pub(crate) fn redis_double(raw: &[u8]) -> Option<f64> {
    let first = *raw.first()?;
    if matches!(first, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r') || raw.contains(&0) {
        return None;
    }
    let v = tonumber(raw)?;
    let text = std::str::from_utf8(raw).ok()?;
    // tonumber allows trailing spaces; strtod here must consume everything.
    if text.trim_end() != text || v.is_nan() {
        return None;
    }
    let literal_inf = text
        .trim_start_matches(['+', '-'])
        .to_ascii_lowercase()
        .starts_with("inf");
    if v.is_infinite() && !literal_inf {
        return None;
    }
    Some(v)
}

/// C's `%.<prec>g`.
fn format_g(v: f64, prec: usize) -> String {
    if v.is_nan() {
        return if v.is_sign_negative() { "-nan" } else { "nan" }.to_owned();
    }
    if v.is_infinite() {
        return if v < 0.0 { "-inf" } else { "inf" }.to_owned();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.to_owned();
    }
    // %.Pg: P significant digits; exponent form when exp < -4 or exp >= P; trailing
    // zeros (and a trailing point) removed.
    let sci = format!("{v:.*e}", prec - 1);
    let (mantissa, exp) = match sci.split_once('e') {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (sci.as_str(), 0),
    };
    let p = i32::try_from(prec).unwrap_or(17);
    if !(-4..p).contains(&exp) {
        let m = trim_zeros(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{m}e{sign}{:02}", exp.unsigned_abs());
    }
    let decimals = usize::try_from(p - 1 - exp).unwrap_or(0);
    trim_zeros(&format!("{v:.decimals$}")).to_owned()
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// A Lua number as an integer reply: truncated towards zero (saturating here).
pub(crate) fn to_integer_reply(v: f64) -> i64 {
    v as i64
}

/// Redis's `string2ll`: the strict integer syntax `INCR` and friends accept (no spaces, no
/// `+`, no leading zeros, fits in an `i64`).
pub(crate) fn string2ll(raw: &[u8]) -> Option<i64> {
    if raw.is_empty() || raw.len() > 20 {
        return None;
    }
    if raw == b"0" {
        return Some(0);
    }
    let (neg, digits) = match raw.first() {
        Some(b'-') => (true, raw.get(1..)?),
        _ => (false, raw),
    };
    match digits.first() {
        Some(b'1'..=b'9') => {}
        _ => return None,
    }
    let mut v: i128 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v * 10 + i128::from(b - b'0');
        if v > i128::from(i64::MAX) + 1 {
            return None;
        }
    }
    let v = if neg { -v } else { v };
    i64::try_from(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tonumber_follows_lua() {
        assert_eq!(tonumber(b"12"), Some(12.0));
        assert_eq!(tonumber(b"  12\t"), Some(12.0));
        assert_eq!(tonumber(b"-3.5"), Some(-3.5));
        assert_eq!(tonumber(b"0x1f"), Some(31.0));
        assert_eq!(tonumber(b"1e3"), Some(1000.0));
        assert_eq!(tonumber(b"inf"), Some(f64::INFINITY));
        assert!(tonumber(b"nan").is_some_and(f64::is_nan));
        assert_eq!(tonumber(b"abc"), None);
        assert_eq!(tonumber(b""), None);
        assert_eq!(tonumber(b"1 2"), None);
        assert_eq!(tonumber(b"+-1"), None);
        assert_eq!(tonumber(b"5\0junk"), Some(5.0));
    }

    #[test]
    fn call_arguments_format_like_percent_17g() {
        assert_eq!(format_number(1_764_543_600_123.0), "1764543600123");
        // Lua's own tostring would give "1e+14" and "1.0179650696403e+14".
        assert_eq!(format_number(1e14), "100000000000000");
        assert_eq!(format_number(101_796_506_964_029.0), "101796506964029");
        assert_eq!(format_number(12_345_678_901_234.0), "12345678901234");
        assert_eq!(format_number(1.5), "1.5");
        assert_eq!(format_number(0.0001), "0.0001");
        assert_eq!(format_number(0.00001), "1.0000000000000001e-05");
        assert_eq!(format_number(1e17), "1e+17");
        assert_eq!(format_number(-7.0), "-7");
    }

    #[test]
    fn scores_format_like_percent_17g_and_parse_like_redis() {
        assert_eq!(format_score(1_796_080_539_738_123.0), "1796080539738123");
        assert_eq!(format_score(1.5), "1.5");
        assert_eq!(format_score(0.1), "0.10000000000000001");
        assert_eq!(format_score(1e17), "1e+17");
        assert_eq!(format_score(f64::NEG_INFINITY), "-inf");
        assert_eq!(redis_double(b"12"), Some(12.0));
        assert_eq!(redis_double(b"inf"), Some(f64::INFINITY));
        assert_eq!(redis_double(b"0x10"), Some(16.0));
        assert_eq!(redis_double(b" 5"), None);
        assert_eq!(redis_double(b"5 "), None);
        assert_eq!(redis_double(b"nan"), None);
        assert_eq!(redis_double(b"1e400"), None);
        assert_eq!(redis_double(b""), None);
        assert_eq!(redis_double(b"abc"), None);
    }

    #[test]
    fn string2ll_is_strict() {
        assert_eq!(string2ll(b"42"), Some(42));
        assert_eq!(string2ll(b"-42"), Some(-42));
        assert_eq!(string2ll(b"0"), Some(0));
        assert_eq!(string2ll(b"007"), None);
        assert_eq!(string2ll(b"-0"), None);
        assert_eq!(string2ll(b" 7"), None);
        assert_eq!(string2ll(b"+7"), None);
        assert_eq!(string2ll(b"1.0"), None);
        assert_eq!(string2ll(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(string2ll(b"9223372036854775808"), None);
        assert_eq!(string2ll(b"-9223372036854775808"), Some(i64::MIN));
    }
}
