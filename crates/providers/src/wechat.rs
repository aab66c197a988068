//! WeChat Pay API v3 notifications: RSA-SHA256 signatures over `timestamp\nnonce\nbody\n`,
//! AEAD_AES_256_GCM resources.

use serde::Deserialize;

pub mod client;
pub mod signing;

use super::keys::WechatKeys;
use super::provider::Notice;

/// Notifications older or newer than this are refused (replays, clock trouble).
pub const MAX_SKEW_SECONDS: i64 = 300;

/// WeChat Pay as a [`Plugin`](super::provider::Plugin).
pub struct WechatPlugin;

impl super::provider::Plugin for WechatPlugin {
    fn provider(&self) -> crate::domain::payment::Provider {
        crate::domain::payment::Provider::WechatPay
    }

    fn notify_path(&self) -> &'static str {
        NOTIFY_PATH
    }

    /// 204 when processed, `{"code":"FAIL"}` with 401 (refused) or 5xx (retry).
    fn reply(&self, outcome: super::provider::NotifyOutcome) -> super::provider::NotifyReply {
        use super::provider::{NotifyOutcome as O, NotifyReply};
        let fail = |status: u16, message: &str| NotifyReply {
            status,
            content_type: "application/json",
            body: serde_json::json!({"code": "FAIL", "message": message}).to_string(),
        };
        match outcome {
            O::Processed => NotifyReply {
                status: 204,
                content_type: "application/json",
                body: String::new(),
            },
            O::Unconfigured => fail(503, "WeChat Pay is not configured"),
            O::Malformed | O::Unauthentic | O::Unreadable => fail(401, "notification refused"),
            O::Retry => fail(500, "not processed, please retry"),
            O::Busy => fail(503, "temporarily unavailable, please retry"),
        }
    }

    fn gateway(
        &self,
        keys: &super::keys::ProviderKeys,
        with: &super::provider::GatewayParts,
    ) -> Option<std::sync::Arc<dyn super::provider::Gateway>> {
        let k = keys.wechat.clone()?;
        let client = client::WechatPay::new(
            with.http.clone(),
            k,
            &with.public_url,
            with.timeout,
            Some(with.pool.clone()),
        );
        Some(std::sync::Arc::new(client))
    }

    /// A gzip (`tar_type=GZIP`) whose unpacked bytes have the SHA1 of the signed answer.
    fn unpack_bill(
        &self,
        archive: &std::path::Path,
        sha1: Option<&str>,
        dest: &std::path::Path,
    ) -> Result<super::bills::Unpacked, super::bills::ArchiveError> {
        let sha1 =
            sha1.ok_or_else(|| std::io::Error::other("the bill answer named no SHA1 to check the download by"))?;
        let file = std::io::BufReader::new(std::fs::File::open(archive)?);
        super::bills::unpack_wechat_gz(file, dest, sha1)
    }

    fn parse_bill(
        &self,
        input: &mut dyn std::io::BufRead,
        row: &mut dyn FnMut(super::bills::BillRow) -> Result<(), String>,
    ) -> Result<super::bills::BillSummary, super::bills::BillError> {
        super::bills::parse_wechat(input, row)
    }
}

/// Where WeChat Pay's notifications arrive.
pub const NOTIFY_PATH: &str = "/pay/wechat/notify";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WechatError {
    MissingHeader(&'static str),
    StaleTimestamp,
    BadSignature,
    BadEnvelope(String),
    Undecryptable,
    BadResource(String),
    WrongMerchant,
    /// Signed, but made under an appid that is not one of ours.
    WrongApp,
    /// An `event_type` fitorder does not know: refused rather than guessed at.
    UnknownEvent(String),
    /// Signed, but not a payment fitorder can book (another currency, a time that is none).
    Unbookable(String),
}

/// The event types WeChat Pay sends to a merchant's notify_url (payments and refunds).
pub const KNOWN_EVENTS: [&str; 4] = [
    "TRANSACTION.SUCCESS",
    "REFUND.SUCCESS",
    "REFUND.ABNORMAL",
    "REFUND.CLOSED",
];

impl WechatError {
    pub fn message(&self) -> String {
        match self {
            WechatError::MissingHeader(h) => format!("missing header {h}"),
            WechatError::StaleTimestamp => "timestamp more than 5 minutes from now".into(),
            WechatError::BadSignature => "signature verification failed".into(),
            WechatError::BadEnvelope(e) => format!("malformed notification: {e}"),
            WechatError::Undecryptable => "resource could not be decrypted".into(),
            WechatError::BadResource(e) => format!("malformed resource: {e}"),
            WechatError::WrongMerchant => "notification for another merchant".into(),
            WechatError::WrongApp => "notification for another appid".into(),
            WechatError::UnknownEvent(e) => format!("unknown event_type {e:?}"),
            WechatError::Unbookable(e) => format!("payment refused: {e}"),
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct Envelope {
    pub id: Option<String>,
    pub event_type: String,
    pub resource: Resource,
}

#[derive(Debug, Deserialize)]
pub struct Resource {
    pub algorithm: String,
    pub ciphertext: String,
    pub associated_data: Option<String>,
    pub nonce: String,
}

#[derive(Debug, Deserialize)]
struct Amount {
    total: i64,
    refund: Option<i64>,
    currency: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Transaction {
    appid: Option<String>,
    mchid: Option<String>,
    out_trade_no: String,
    transaction_id: String,
    trade_state: String,
    success_time: Option<String>,
    amount: Amount,
}

#[derive(Debug, Deserialize)]
struct Refund {
    mchid: Option<String>,
    out_trade_no: String,
    out_refund_no: String,
    refund_id: String,
    refund_status: String,
    amount: Amount,
}

/// The signed headers of a notification.
pub struct Headers<'a> {
    pub timestamp: Option<&'a str>,
    pub nonce: Option<&'a str>,
    pub signature: Option<&'a str>,
    pub serial: Option<&'a str>,
}

/// Checks the signature and the time window.
pub fn verify(keys: &WechatKeys, h: &Headers<'_>, body: &[u8], now: i64) -> Result<(), WechatError> {
    let ts = h.timestamp.ok_or(WechatError::MissingHeader("Wechatpay-Timestamp"))?;
    let nonce = h.nonce.ok_or(WechatError::MissingHeader("Wechatpay-Nonce"))?;
    let sig = h.signature.ok_or(WechatError::MissingHeader("Wechatpay-Signature"))?;
    let serial = h.serial.ok_or(WechatError::MissingHeader("Wechatpay-Serial"))?;
    // Whole seconds in plain digits, as WeChat writes them: `+1733…`, ` 1733…` and the like are
    // no timestamp (a lenient parse would accept a header WeChat never sends).
    if ts.is_empty() || ts.len() > 12 || !ts.bytes().all(|b| b.is_ascii_digit()) {
        return Err(WechatError::StaleTimestamp);
    }
    let ts_num: i64 = ts.parse().map_err(|_| WechatError::StaleTimestamp)?;
    if (now - ts_num).abs() > MAX_SKEW_SECONDS {
        return Err(WechatError::StaleTimestamp);
    }
    // The key is the one the serial names: the 微信支付公钥 or a platform certificate.
    keys.platform
        .verify(serial, ts, nonce, body, sig)
        .map_err(|_| WechatError::BadSignature)
}

pub fn parse_envelope(body: &[u8]) -> Result<Envelope, WechatError> {
    serde_json::from_slice(body).map_err(|e| WechatError::BadEnvelope(e.to_string()))
}

/// Decrypts `resource` (base64 of ciphertext‖tag) with the APIv3 key.
pub fn decrypt(apiv3_key: &[u8; 32], r: &Resource) -> Result<String, WechatError> {
    if r.algorithm != "AEAD_AES_256_GCM" {
        return Err(WechatError::BadEnvelope(format!("unknown algorithm {}", r.algorithm)));
    }
    let ad = r.associated_data.as_deref().unwrap_or("");
    let plain = super::platform_keys::aead_decrypt(apiv3_key, r.nonce.as_bytes(), ad.as_bytes(), &r.ciphertext)
        .map_err(|_| WechatError::Undecryptable)?;
    String::from_utf8(plain).map_err(|_| WechatError::Undecryptable)
}

/// Reads the decrypted resource of `event_type` into a notice. A payment must be ours in every
/// respect before it is booked: our merchant, one of our appids (`app_ids`), a known event,
/// `trade_state` SUCCESS, yuan (`CNY`) and a real `success_time`; anything else is refused.
pub fn notice(mch_id: &str, app_ids: &[&str], event_type: &str, plain: &str) -> Result<Notice, WechatError> {
    let bad = |e: serde_json::Error| WechatError::BadResource(e.to_string());
    if !KNOWN_EVENTS.contains(&event_type) {
        return Err(WechatError::UnknownEvent(event_type.chars().take(64).collect()));
    }
    if event_type == "TRANSACTION.SUCCESS" {
        let t: Transaction = serde_json::from_str(plain).map_err(bad)?;
        if t.mchid.as_deref().is_some_and(|m| m != mch_id) {
            return Err(WechatError::WrongMerchant);
        }
        if !t.appid.as_deref().is_some_and(|a| app_ids.contains(&a)) {
            return Err(WechatError::WrongApp);
        }
        if t.trade_state != "SUCCESS" {
            return Err(WechatError::Unbookable(format!(
                "TRANSACTION.SUCCESS with trade_state {:?}",
                t.trade_state.chars().take(32).collect::<String>()
            )));
        }
        if t.amount.currency.as_deref().is_some_and(|c| c != "CNY") {
            return Err(WechatError::Unbookable("currency is not CNY".into()));
        }
        if t.amount.total <= 0 {
            return Err(WechatError::Unbookable("amount.total is not positive".into()));
        }
        if t.success_time
            .as_deref()
            .is_none_or(|at| chrono::DateTime::parse_from_rfc3339(at).is_err())
        {
            return Err(WechatError::Unbookable("success_time is not an RFC 3339 time".into()));
        }
        Ok(Notice::Paid {
            out_trade_no: t.out_trade_no,
            txn_id: t.transaction_id,
            amount_cents: t.amount.total,
        })
    } else if event_type.starts_with("REFUND.") {
        let r: Refund = serde_json::from_str(plain).map_err(bad)?;
        if r.mchid.as_deref().is_some_and(|m| m != mch_id) {
            return Err(WechatError::WrongMerchant);
        }
        Ok(Notice::Refund {
            ok: r.refund_status == "SUCCESS",
            out_trade_no: r.out_trade_no,
            refund_no: r.out_refund_no,
            refund_id: r.refund_id,
            status: r.refund_status,
            amount_cents: r.amount.refund.unwrap_or(r.amount.total),
        })
    } else {
        Err(WechatError::UnknownEvent(event_type.chars().take(64).collect()))
    }
}
