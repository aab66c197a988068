//! Alipay asynchronous notifications: form fields signed with RSA2 (SHA256withRSA) over every
//! other non-empty field, sorted by key, joined as `k=v` with `&`.

use base64::Engine;
use rsa::pkcs1v15::{Signature, VerifyingKey};
use rsa::signature::Verifier;
use sha2::Sha256;

pub mod client;
pub mod gateway;

use super::keys::AlipayKeys;
use super::Notice;
use crate::domain::money::parse_yuan;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlipayError {
    BadForm(String),
    BadSignature,
    WrongApp,
}

impl AlipayError {
    pub fn message(&self) -> String {
        match self {
            AlipayError::BadForm(e) => format!("malformed notification: {e}"),
            AlipayError::BadSignature => "signature verification failed".into(),
            AlipayError::WrongApp => "notification for another app".into(),
        }
    }
}

/// The decoded fields, in the order they came.
pub fn parse_form(body: &[u8]) -> Result<Vec<(String, String)>, AlipayError> {
    let fields: Vec<(String, String)> = form_urlencoded::parse(body).into_owned().collect();
    if fields.is_empty() {
        return Err(AlipayError::BadForm("no fields".into()));
    }
    Ok(fields)
}

pub fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// The string Alipay signs: every non-empty field but `sign` and `sign_type`, sorted by key.
pub fn signed_content(fields: &[(String, String)]) -> String {
    let mut pairs: Vec<&(String, String)> = fields
        .iter()
        .filter(|(k, v)| k != "sign" && k != "sign_type" && !v.is_empty())
        .collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

pub fn verify(keys: &AlipayKeys, fields: &[(String, String)]) -> Result<(), AlipayError> {
    if field(fields, "sign_type").is_some_and(|t| t != "RSA2") {
        return Err(AlipayError::BadSignature);
    }
    let sig = field(fields, "sign").ok_or(AlipayError::BadSignature)?;
    let sig = base64::engine::general_purpose::STANDARD
        .decode(sig.trim())
        .map_err(|_| AlipayError::BadSignature)?;
    let sig = Signature::try_from(sig.as_slice()).map_err(|_| AlipayError::BadSignature)?;
    VerifyingKey::<Sha256>::new(keys.public_key.clone())
        .verify(signed_content(fields).as_bytes(), &sig)
        .map_err(|_| AlipayError::BadSignature)?;
    if field(fields, "app_id") != Some(keys.app_id.as_str()) {
        return Err(AlipayError::WrongApp);
    }
    Ok(())
}

/// Reads verified fields into a notice. A notification carrying `refund_fee` reports a refund
/// (Alipay sends those with the trade's status); TRADE_SUCCESS and TRADE_FINISHED mean paid.
pub fn notice(fields: &[(String, String)]) -> Result<Notice, AlipayError> {
    let need = |k: &str| field(fields, k).ok_or_else(|| AlipayError::BadForm(format!("missing {k}")));
    let out_trade_no = need("out_trade_no")?.to_string();
    let status = need("trade_status")?.to_string();
    if let Some(refund_fee) = field(fields, "refund_fee").filter(|v| !v.is_empty()) {
        let cents = parse_yuan(refund_fee).ok_or_else(|| AlipayError::BadForm("refund_fee".into()))?;
        return Ok(Notice::Refund {
            out_trade_no,
            refund_no: field(fields, "out_biz_no").unwrap_or_default().to_string(),
            refund_id: need("trade_no")?.to_string(),
            ok: true,
            status: format!("REFUND:{status}"),
            amount_cents: cents,
        });
    }
    match status.as_str() {
        "TRADE_SUCCESS" | "TRADE_FINISHED" => {
            let amount = need("total_amount")?;
            let cents = parse_yuan(amount).ok_or_else(|| AlipayError::BadForm(format!("total_amount {amount:?}")))?;
            Ok(Notice::Paid {
                out_trade_no,
                txn_id: need("trade_no")?.to_string(),
                amount_cents: cents,
            })
        }
        _ => Ok(Notice::Other {
            out_trade_no: Some(out_trade_no),
            what: status,
        }),
    }
}

/// Certificate mode: the Alipay public key from its public-key certificate, and the SNs
/// requests carry (`app_cert_sn`, `alipay_root_cert_sn`) and answers must name.
pub fn cert_mode(
    app_cert: &str,
    public_cert: &str,
    root_cert: &str,
) -> anyhow::Result<(rsa::RsaPublicKey, super::keys::AlipayCertSns)> {
    use super::certs;
    use anyhow::Context;
    let sns = super::keys::AlipayCertSns {
        app_cert_sn: certs::alipay_cert_sn(app_cert).context("ALIPAY_APP_CERT")?,
        alipay_root_cert_sn: certs::alipay_root_cert_sn(root_cert).context("ALIPAY_ROOT_CERT")?,
        alipay_cert_sn: certs::alipay_cert_sn(public_cert).context("ALIPAY_PUBLIC_CERT")?,
    };
    let key = certs::alipay_public_key_from_cert(public_cert).context("ALIPAY_PUBLIC_CERT")?;
    Ok((key, sns))
}
