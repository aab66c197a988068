//! Small helpers shared by both providers, written for the sandbox alone.

use super::*;

pub(super) const B64: base64::engine::general_purpose::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// SHA256withRSA (PKCS#1 v1.5), base64.
pub(super) fn rsa_sign(key: &RsaPrivateKey, message: &[u8]) -> String {
    B64.encode(SigningKey::<Sha256>::new(key.clone()).sign(message).to_bytes())
}

pub(super) fn rsa_verify(key: &RsaPublicKey, message: &[u8], signature_b64: &str) -> bool {
    let Ok(raw) = B64.decode(signature_b64.trim()) else {
        return false;
    };
    let Ok(sig) = Signature::try_from(raw.as_slice()) else {
        return false;
    };
    VerifyingKey::<Sha256>::new(key.clone()).verify(message, &sig).is_ok()
}

pub(super) fn random_from(alphabet: &[u8], n: usize) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..n)
        .map(|_| alphabet[rng.random_range(0..alphabet.len())] as char)
        .collect()
}

pub(super) fn alnum(n: usize) -> String {
    random_from(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", n)
}

pub(super) fn digits(n: usize) -> String {
    random_from(b"0123456789", n)
}

/// A certificate serial for `key`: 20 bytes of SHA-256 over its modulus, as 40 upper-case hex
/// digits (the first byte kept in 0x10..0x7F so the DER integer is positive and 20 bytes long).
pub(super) fn cert_serial(key: &RsaPrivateKey) -> String {
    use rsa::traits::PublicKeyParts;
    use sha2::Digest;
    let digest = Sha256::digest(key.n().to_bytes_be());
    let mut bytes = digest[..20].to_vec();
    bytes[0] = (bytes[0] & 0x6F) | 0x10;
    hex::encode_upper(bytes)
}

/// An Alipay `trade_no`: date, `22001`, 15 digits (28 characters).
pub(super) fn alipay_trade_no() -> String {
    format!("{}22001{}", shanghai_now().format("%Y%m%d"), digits(15))
}

pub(super) fn shanghai_now() -> DateTime<chrono_tz::Tz> {
    Utc::now().with_timezone(&chrono_tz::Asia::Shanghai)
}

/// `yyyy-MM-dd HH:mm:ss` in Asia/Shanghai (Alipay's time format).
pub(super) fn shanghai(t: DateTime<Utc>) -> String {
    t.with_timezone(&chrono_tz::Asia::Shanghai)
        .format("%Y-%m-%d %H:%M:%S")
        .to_string()
}

/// RFC 3339 with the +08:00 offset (WeChat Pay's time format).
pub(super) fn rfc3339_cn(t: DateTime<Utc>) -> String {
    t.with_timezone(&chrono_tz::Asia::Shanghai)
        .format("%Y-%m-%dT%H:%M:%S%:z")
        .to_string()
}

/// Cents as yuan with two decimals.
pub(super) fn yuan(cents: i64) -> String {
    format!("{}.{:02}", cents / 100, cents % 100)
}

/// `"12.3"`, `"12.30"`, `"12"` → cents; None for anything else (negative, 3 decimals, junk).
pub(super) fn parse_yuan(text: &str) -> Option<i64> {
    let (whole, frac) = match text.split_once('.') {
        Some((w, f)) => (w, f),
        None => (text, ""),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) || whole.len() > 9 {
        return None;
    }
    if frac.len() > 2 || !frac.bytes().all(|b| b.is_ascii_digit()) || (text.contains('.') && frac.is_empty()) {
        return None;
    }
    let mut cents: i64 = whole.parse::<i64>().ok()? * 100;
    if !frac.is_empty() {
        let f: i64 = frac.parse().ok()?;
        cents += if frac.len() == 1 { f * 10 } else { f };
    }
    Some(cents)
}

/// The request's `notify_url`: an absolute http(s) URL without a query (WeChat: "不能携带参数").
pub(super) fn valid_notify_url(url: &str) -> bool {
    (url.starts_with("http://") || url.starts_with("https://")) && !url.contains('?') && url.len() <= 256
}

pub(super) fn html_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

pub(super) fn error_json(code: &str, message: &str) -> Value {
    json!({"code": code, "message": message})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yuan_round_trips() {
        assert_eq!(parse_yuan("12.30"), Some(1230));
        assert_eq!(parse_yuan("12.3"), Some(1230));
        assert_eq!(parse_yuan("0.01"), Some(1));
        assert_eq!(parse_yuan("100"), Some(10000));
        for bad in ["", "-1", "1.234", "1.", ".5", "1e3", "abc", " 1"] {
            assert_eq!(parse_yuan(bad), None, "{bad:?}");
        }
        assert_eq!(yuan(1230), "12.30");
        assert_eq!(yuan(5), "0.05");
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(
            html_escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
