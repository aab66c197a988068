//! Entry points for the fuzz targets in `fuzz/` (and for the test that replays their corpora
//! on every CI run): each feeds untrusted bytes to a parser the way the service does and
//! checks what must hold, panicking only on a real bug.

use crate::providers::bills;
use crate::providers::{alipay, wechat};

pub fn wechat_bill(data: &[u8]) {
    let mut rows = 0usize;
    if let Ok(summary) = bills::parse_wechat(data, |r| {
        rows += 1;
        assert!(r.line >= 2, "data rows come after the header");
        Ok(())
    }) {
        assert_eq!(summary.rows, rows, "the summary counts the rows handed out");
    }
}

pub fn alipay_bill(data: &[u8]) {
    let mut rows = 0usize;
    if let Ok(summary) = bills::parse_alipay(data, |_| {
        rows += 1;
        Ok(())
    }) {
        assert_eq!(summary.rows, rows);
    }
}

pub fn wechat_notification(data: &[u8]) {
    if let Ok(env) = wechat::parse_envelope(data) {
        let key = [7u8; 32];
        let _ = wechat::decrypt(&key, &env.resource);
    }
    // The decrypted resource is JSON from the provider; read it as such too.
    if let Ok(text) = std::str::from_utf8(data) {
        for event in ["TRANSACTION.SUCCESS", "REFUND.SUCCESS", "OTHER"] {
            if let Ok(crate::payments::Notice::Paid { amount_cents, .. }) =
                wechat::notice("1900000109", &["wxd678efh567hg6787"], event, text)
            {
                let _ = amount_cents;
            }
        }
    }
}

pub fn alipay_form(data: &[u8]) {
    if let Ok(fields) = alipay::parse_form(data) {
        // What is signed never depends on the signature fields themselves.
        let content = alipay::signed_content(&fields);
        let resigned: Vec<(String, String)> = fields
            .iter()
            .map(|(k, v)| match k.as_str() {
                "sign" | "sign_type" => (k.clone(), format!("{v}-changed")),
                _ => (k.clone(), v.clone()),
            })
            .collect();
        assert_eq!(content, alipay::signed_content(&resigned));
        let _ = alipay::notice(&fields);
    }
}

pub fn cursor(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(id) = crate::graphql::decode_cursor(text) {
            assert!(id > 0);
            assert_eq!(
                crate::graphql::decode_cursor(&crate::graphql::encode_cursor(id)).ok(),
                Some(id)
            );
        }
    }
}

/// The whole GraphQL request path short of running a resolver (see `http::fuzz_request`):
/// whatever the bytes, the process must not abort (a stack overflow is not a panic: it ends
/// the fuzzer as it ended the server) and nothing may panic.
pub fn graphql_request(data: &[u8]) {
    // On a stack the size of a tokio worker's (2 MiB), where the server parses; the fuzzer's
    // own thread has far more, which would hide an overflow.
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn_scoped(scope, || crate::http::fuzz_request(data))
            .expect("a thread")
            .join()
            .expect("the request path does not panic");
    });
}
