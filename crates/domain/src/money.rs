//! Money rules: amounts are integer cents (fen) everywhere; yuan strings only at the edges
//! (Alipay callbacks, bills), parsed exactly, never through floating point.

/// The unused share of `amount`: `amount × unused ÷ total`, rounded down to the cent.
/// `unused` is clamped to `0..=total`, so a caller's off-by-one can never refund more than paid.
pub fn pro_rata(amount_cents: i64, unused: i64, total: i64) -> i64 {
    if total <= 0 || amount_cents <= 0 {
        return 0;
    }
    let unused = unused.clamp(0, total);
    (i128::from(amount_cents) * i128::from(unused) / i128::from(total)) as i64
}

/// Splits a refund of a MIXED order between the wallet and the online payment in proportion to
/// how it was paid. The wallet share rounds down; the online share takes the remainder, so the
/// two always add up to the refund.
pub fn split_refund(refund_cents: i64, amount_cents: i64, wallet_cents: i64) -> (i64, i64) {
    let wallet = pro_rata(refund_cents, wallet_cents, amount_cents).min(wallet_cents);
    (wallet, refund_cents - wallet)
}

/// Parses a yuan amount as providers write it (`"12.30"`, `"12.3"`, `"12"`, `"¥12.30"`) into
/// cents. Refuses more than two decimals, signs other than a leading minus, and garbage.
pub fn parse_yuan(s: &str) -> Option<i64> {
    let s = s.trim().trim_start_matches(['¥', '￥']);
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (whole, frac) = match s.split_once('.') {
        Some((w, f)) => (w, f),
        None => (s, ""),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) || whole.len() > 15 {
        return None;
    }
    if frac.len() > 2 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut cents: i64 = whole.parse::<i64>().ok()?.checked_mul(100)?;
    let frac_cents = match frac.len() {
        0 => 0,
        1 => frac.parse::<i64>().ok()? * 10,
        _ => frac.parse::<i64>().ok()?,
    };
    cents = cents.checked_add(frac_cents)?;
    Some(if neg { -cents } else { cents })
}

/// An amount exactly as Alipay writes one in a notification: yuan with two decimals, no sign,
/// no leading zero, no blank (`999.00`, `0.10`). `999`, `0999.00`, `"999.00 "` and `+9.00` are
/// refused: a lenient reading of a signed amount is a guess at what the signer meant.
pub fn parse_yuan_exact(s: &str) -> Option<i64> {
    let (whole, frac) = s.split_once('.')?;
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || frac.len() != 2 || !digits(frac) || whole.len() > 13 {
        return None;
    }
    if whole.len() > 1 && whole.starts_with('0') {
        return None;
    }
    parse_yuan(s)
}

/// Formats cents as yuan with two decimals (`1230` → `"12.30"`).
pub fn format_yuan(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    let abs = cents.unsigned_abs();
    format!("{sign}{}.{:02}", abs / 100, abs % 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pro_rata_rounds_down_and_never_exceeds_amount() {
        assert_eq!(pro_rata(10_000, 3, 10), 3_000);
        assert_eq!(pro_rata(9_999, 1, 3), 3_333);
        assert_eq!(pro_rata(100, 10, 10), 100);
        assert_eq!(pro_rata(100, 11, 10), 100);
        assert_eq!(pro_rata(100, -1, 10), 0);
        assert_eq!(pro_rata(100, 1, 0), 0);
        assert_eq!(pro_rata(i64::MAX, 1, 2), i64::MAX / 2);
    }

    #[test]
    fn mixed_refund_split_adds_up() {
        for refund in [0, 1, 99, 5_000, 9_999, 10_000] {
            let (w, o) = split_refund(refund, 10_000, 3_000);
            assert_eq!(w + o, refund);
            assert!(w <= 3_000 && o <= 7_000, "{refund}: {w} {o}");
        }
        assert_eq!(split_refund(10_000, 10_000, 3_000), (3_000, 7_000));
    }

    #[test]
    fn yuan_parses_exactly() {
        assert_eq!(parse_yuan("12.30"), Some(1230));
        assert_eq!(parse_yuan("12.3"), Some(1230));
        assert_eq!(parse_yuan("12"), Some(1200));
        assert_eq!(parse_yuan("0.01"), Some(1));
        assert_eq!(parse_yuan("¥88.00"), Some(8800));
        assert_eq!(parse_yuan("-5.00"), Some(-500));
        for bad in ["", ".5", "1.234", "1e3", "abc", "1.2.3", "+1", " - 1"] {
            assert_eq!(parse_yuan(bad), None, "{bad}");
        }
        assert_eq!(format_yuan(1230), "12.30");
        assert_eq!(format_yuan(5), "0.05");
        assert_eq!(format_yuan(-500), "-5.00");
    }

    #[test]
    fn notification_amounts_are_read_only_as_alipay_writes_them() {
        assert_eq!(parse_yuan_exact("999.00"), Some(99_900));
        assert_eq!(parse_yuan_exact("0.10"), Some(10));
        assert_eq!(parse_yuan_exact("0.00"), Some(0));
        for bad in [
            "999", "0999.00", "999.00 ", " 999.00", "+999.00", "-1.00", "999.0", "999.000", "¥999.00", "9,99.00",
        ] {
            assert_eq!(parse_yuan_exact(bad), None, "{bad:?}");
        }
    }
}
