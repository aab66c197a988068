//! Alipay asynchronous notifications: form fields signed with RSA2 (SHA256withRSA) over every
//! other non-empty field, sorted by key, joined as `k=v` with `&`.

use base64::Engine;

pub mod certs;
pub mod client;
pub mod gateway;

use super::keys::AlipayKeys;
use super::provider::Notice;
use crate::domain::money::parse_yuan_exact;

/// Alipay as a [`Plugin`](super::provider::Plugin).
pub struct AlipayPlugin;

impl super::provider::Plugin for AlipayPlugin {
    fn provider(&self) -> crate::domain::payment::Provider {
        crate::domain::payment::Provider::Alipay
    }

    fn notify_path(&self) -> &'static str {
        NOTIFY_PATH
    }

    /// The plain text `success`, or `failure` with 400/401 (refused) or 5xx.
    fn reply(&self, outcome: super::provider::NotifyOutcome) -> super::provider::NotifyReply {
        use super::provider::{NotifyOutcome as O, NotifyReply};
        let text = |status: u16, body: &str| NotifyReply {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.to_string(),
        };
        match outcome {
            O::Processed => text(200, "success"),
            O::Unconfigured | O::Busy => text(503, "failure"),
            O::Malformed | O::Unreadable => text(400, "failure"),
            O::Unauthentic => text(401, "failure"),
            O::Retry => text(500, "failure"),
        }
    }

    fn gateway(
        &self,
        keys: &super::keys::ProviderKeys,
        with: &super::provider::GatewayParts,
    ) -> Option<std::sync::Arc<dyn super::provider::Gateway>> {
        let k = keys.alipay.clone()?;
        let client = client::Alipay::new(
            with.http.clone(),
            k,
            &with.public_url,
            with.timeout,
            Some(with.pool.clone()),
        );
        Some(std::sync::Arc::new(client))
    }

    /// A zip whose `…_业务明细.csv` (GBK) is the bill.
    fn unpack_bill(
        &self,
        archive: &std::path::Path,
        _sha1: Option<&str>,
        dest: &std::path::Path,
    ) -> Result<super::bills::Unpacked, super::bills::ArchiveError> {
        super::bills::unpack_alipay_zip(std::fs::File::open(archive)?, dest)
    }

    fn parse_bill(
        &self,
        input: &mut dyn std::io::BufRead,
        row: &mut dyn FnMut(super::bills::BillRow) -> Result<(), String>,
    ) -> Result<super::bills::BillSummary, super::bills::BillError> {
        super::bills::parse_alipay(input, row)
    }
}

/// Where Alipay's notifications arrive.
pub const NOTIFY_PATH: &str = "/pay/alipay/notify";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlipayError {
    BadForm(String),
    BadSignature,
    WrongApp,
    /// Signed, but for another seller than ours (`ALIPAY_SELLER_ID`).
    WrongSeller,
}

impl AlipayError {
    pub fn message(&self) -> String {
        match self {
            AlipayError::BadForm(e) => format!("malformed notification: {e}"),
            AlipayError::BadSignature => "signature verification failed".into(),
            AlipayError::WrongApp => "notification for another app".into(),
            AlipayError::WrongSeller => "notification for another seller".into(),
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

/// The string Alipay signs for a notification: every non-empty field but `sign` and
/// `sign_type`, sorted by key (a request keeps `sign_type`: [`gateway::request_content`]).
pub fn signed_content(fields: &[(String, String)]) -> String {
    sorted_content(fields, &["sign", "sign_type"])
}

/// Every non-empty field but `excluded`, sorted by key, joined as `k=v` with `&`, raw values.
pub fn sorted_content(fields: &[(String, String)], excluded: &[&str]) -> String {
    let mut pairs: Vec<&(String, String)> = fields
        .iter()
        .filter(|(k, v)| !excluded.contains(&k.as_str()) && !v.is_empty())
        .collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

pub fn verify(keys: &AlipayKeys, fields: &[(String, String)]) -> Result<(), AlipayError> {
    verify_with(keys, std::slice::from_ref(&keys.public_key), fields)
}

/// [`verify`] with any of `candidates` (certificate mode after a renewal: the configured key
/// and the renewed ones; a notification names no certificate).
pub fn verify_with(
    keys: &AlipayKeys,
    candidates: &[rsa::RsaPublicKey],
    fields: &[(String, String)],
) -> Result<(), AlipayError> {
    if field(fields, "sign_type").is_some_and(|t| t != "RSA2") {
        return Err(AlipayError::BadSignature);
    }
    let sig = field(fields, "sign").ok_or(AlipayError::BadSignature)?;
    let sig = base64::engine::general_purpose::STANDARD
        .decode(sig.trim())
        .map_err(|_| AlipayError::BadSignature)?;
    let content = signed_content(fields);
    if !candidates
        .iter()
        .any(|key| super::crypto::verify_bytes(key, content.as_bytes(), &sig))
    {
        return Err(AlipayError::BadSignature);
    }
    if field(fields, "app_id") != Some(keys.app_id.as_str()) {
        return Err(AlipayError::WrongApp);
    }
    // Service-provider mode names the merchant's app apart; for us it is our own app or absent.
    if field(fields, "auth_app_id").is_some_and(|a| !a.is_empty() && a != keys.app_id) {
        return Err(AlipayError::WrongApp);
    }
    if let Some(ours) = &keys.seller_id {
        if field(fields, "seller_id") != Some(ours.as_str()) {
            return Err(AlipayError::WrongSeller);
        }
    }
    Ok(())
}

/// Reads verified fields into a notice.
///
/// Alipay sends refunds to the payment's notify_url with the trade's status: a partial refund as
/// `TRADE_SUCCESS`, a full one as `TRADE_CLOSED`, both carrying `refund_fee` (the trade's total
/// refunded so far), `gmt_refund` and `out_biz_no` (the refund's out_request_no). Those are
/// [`Notice::RefundConfirmed`], never a payment. `TRADE_CLOSED` without a refund is a timeout
/// close, and `TRADE_SUCCESS`/`TRADE_FINISHED` without one mean paid.
pub fn notice(fields: &[(String, String)]) -> Result<Notice, AlipayError> {
    let need = |k: &str| field(fields, k).ok_or_else(|| AlipayError::BadForm(format!("missing {k}")));
    let out_trade_no = need("out_trade_no")?.to_string();
    let status = need("trade_status")?.to_string();
    let refund_fee = field(fields, "refund_fee").filter(|v| !v.trim().is_empty());
    if let Some(refund_fee) = refund_fee {
        let cents =
            parse_yuan_exact(refund_fee).ok_or_else(|| AlipayError::BadForm(format!("refund_fee {refund_fee:?}")))?;
        // A close that refunded nothing (`refund_fee=0.00` without `gmt_refund`) is no refund.
        if cents > 0 || field(fields, "gmt_refund").is_some_and(|v| !v.is_empty()) {
            return Ok(Notice::RefundConfirmed {
                out_trade_no,
                refund_no: field(fields, "out_biz_no").unwrap_or_default().to_string(),
                trade_no: need("trade_no")?.to_string(),
                refunded_total_cents: cents,
                trade_status: status,
            });
        }
    }
    match status.as_str() {
        "TRADE_SUCCESS" | "TRADE_FINISHED" => {
            let amount = need("total_amount")?;
            let cents =
                parse_yuan_exact(amount).ok_or_else(|| AlipayError::BadForm(format!("total_amount {amount:?}")))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn form(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    const TRADE: [(&str, &str); 4] = [
        ("out_trade_no", "FO1"),
        ("trade_no", "2026120122001400000000000001"),
        ("total_amount", "100.00"),
        ("gmt_payment", "2026-12-01 08:00:00"),
    ];

    fn with(status: &str, more: &[(&'static str, &'static str)]) -> Vec<(String, String)> {
        let mut pairs: Vec<(&str, &str)> = TRADE.to_vec();
        pairs.push(("trade_status", status));
        pairs.extend_from_slice(more);
        form(&pairs)
    }

    #[test]
    fn refunds_are_confirmations_by_out_biz_no_never_payments() {
        let partial = with(
            "TRADE_SUCCESS",
            &[
                ("refund_fee", "30.00"),
                ("gmt_refund", "2026-12-01 09:00:00.123"),
                ("out_biz_no", "RF7"),
            ],
        );
        match notice(&partial).unwrap() {
            Notice::RefundConfirmed {
                refund_no,
                refunded_total_cents,
                trade_status,
                trade_no,
                ..
            } => assert_eq!(
                (
                    refund_no.as_str(),
                    refunded_total_cents,
                    trade_status.as_str(),
                    trade_no.as_str()
                ),
                ("RF7", 3_000, "TRADE_SUCCESS", "2026120122001400000000000001")
            ),
            other => panic!("{other:?}"),
        }
        let full = with(
            "TRADE_CLOSED",
            &[
                ("refund_fee", "100.00"),
                ("gmt_refund", "2026-12-01 09:00:00.123"),
                ("gmt_close", "2026-12-01 09:00:00"),
                ("out_biz_no", "RF8"),
            ],
        );
        assert!(matches!(
            notice(&full).unwrap(),
            Notice::RefundConfirmed {
                refunded_total_cents: 10_000,
                ..
            }
        ));
        // A timeout close refunds nothing; a payment may carry refund_fee=0.00.
        let timeout = with("TRADE_CLOSED", &[("gmt_close", "2026-12-01 08:15:00")]);
        assert!(matches!(notice(&timeout).unwrap(), Notice::Other { what, .. } if what == "TRADE_CLOSED"));
        let paid = with("TRADE_SUCCESS", &[("refund_fee", "0.00")]);
        assert!(matches!(
            notice(&paid).unwrap(),
            Notice::Paid {
                amount_cents: 10_000,
                ..
            }
        ));
        let bad = with("TRADE_SUCCESS", &[("refund_fee", "3O.00")]);
        assert!(matches!(notice(&bad), Err(AlipayError::BadForm(_))));
    }
}
