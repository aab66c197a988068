//! What fitorder signs for the Alipay open gateway with the app's private key, and how it
//! checks the gateway's answers.
//!
//! A request is signed over every non-empty parameter but `sign` — `sign_type` included —
//! sorted by key, joined as `k=v` with `&`, raw (not URL-encoded) values. An answer
//! `{"<method>_response": {...}, "sign": "..."}` is signed over the exact text of the
//! `<method>_response` value as the gateway wrote it, so it is taken from the raw body, never
//! re-serialized.

use std::collections::BTreeMap;

use rsa::{RsaPrivateKey, RsaPublicKey};
use serde_json::value::RawValue;

use crate::crypto;

/// The string a request's `sign` covers: every non-empty parameter but `sign`, sorted by key.
pub fn request_content(params: &[(String, String)]) -> String {
    super::sorted_content(params, &["sign"])
}

/// Appends `sign` (RSA2 with the app key) to `params`.
pub fn sign_params(key: &RsaPrivateKey, params: &mut Vec<(String, String)>) {
    params.retain(|(k, _)| k != "sign");
    let signature = crypto::sign(key, request_content(params).as_bytes());
    params.push(("sign".into(), signature));
}

/// The URL-encoded `k=v&…` of signed parameters: the order string the Alipay app SDK takes
/// (`alipay.trade.app.pay`), and the query of a `alipay.trade.wap.pay` page URL.
pub fn encode(params: &[(String, String)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .finish()
}

/// Why an answer is not believed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("the answer is not the gateway's JSON: {0}")]
    Malformed(String),
    #[error("the answer has no {0}")]
    Missing(String),
    #[error("the answer's signature does not verify")]
    BadSignature,
    #[error("the answer names Alipay certificate {got}, expected {expected}")]
    WrongCertificate { got: String, expected: String },
}

/// Checks the gateway's answer to `method` and returns the `<method>_response` object.
/// `alipay_cert_sn`: in certificate mode, the SN the answer must name.
pub fn verify_answer(
    public_key: &RsaPublicKey,
    alipay_cert_sn: Option<&str>,
    method: &str,
    body: &str,
) -> Result<serde_json::Value, AnswerError> {
    let fields: BTreeMap<String, Box<RawValue>> =
        serde_json::from_str(body).map_err(|e| AnswerError::Malformed(e.to_string()))?;
    let name = format!("{}_response", method.replace('.', "_"));
    let raw = fields.get(&name).ok_or_else(|| AnswerError::Missing(name.clone()))?;
    let sign: String = fields
        .get("sign")
        .and_then(|s| serde_json::from_str(s.get()).ok())
        .ok_or_else(|| AnswerError::Missing("sign".into()))?;
    if let Some(expected) = alipay_cert_sn {
        let got: String = fields
            .get("alipay_cert_sn")
            .and_then(|s| serde_json::from_str(s.get()).ok())
            .ok_or_else(|| AnswerError::Missing("alipay_cert_sn".into()))?;
        if got != expected {
            return Err(AnswerError::WrongCertificate {
                got,
                expected: expected.into(),
            });
        }
    }
    if !crypto::verify(public_key, raw.get().as_bytes(), &sign) {
        return Err(AnswerError::BadSignature);
    }
    serde_json::from_str(raw.get()).map_err(|e| AnswerError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn sign_type_is_signed_and_empty_values_are_not() {
        let params = p(&[
            ("sign_type", "RSA2"),
            ("app_id", "1"),
            ("sign", "x"),
            ("notify_url", ""),
            ("biz_content", "{\"a\":1}"),
        ]);
        assert_eq!(
            request_content(&params),
            "app_id=1&biz_content={\"a\":1}&sign_type=RSA2"
        );
    }
}
