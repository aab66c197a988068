//! What fitorder signs for WeChat Pay API v3 with the merchant's API key: the `Authorization`
//! of every API call, and the pay parameters handed to the member's client (JSAPI
//! `wx.requestPayment`, the app SDK's `PayReq`).

use rsa::RsaPrivateKey;

use crate::crypto;

/// The merchant identity every signed call carries.
pub struct Merchant<'a> {
    pub mch_id: &'a str,
    /// Serial of the merchant API certificate whose key signs.
    pub serial: &'a str,
    pub key: &'a RsaPrivateKey,
}

/// `Authorization: WECHATPAY2-SHA256-RSA2048 …` over
/// `METHOD\nURL path with query\ntimestamp\nnonce\nbody\n` (the body empty for a GET).
pub fn authorization(
    m: &Merchant<'_>,
    method: &str,
    path_and_query: &str,
    timestamp: i64,
    nonce: &str,
    body: &str,
) -> String {
    let message = format!("{method}\n{path_and_query}\n{timestamp}\n{nonce}\n{body}\n");
    let signature = crypto::sign(m.key, message.as_bytes());
    format!(
        "WECHATPAY2-SHA256-RSA2048 mchid=\"{}\",nonce_str=\"{nonce}\",signature=\"{signature}\",timestamp=\"{timestamp}\",serial_no=\"{}\"",
        m.mch_id, m.serial
    )
}

/// The arguments of `wx.requestPayment` (JSAPI / mini program).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JsapiParams {
    pub app_id: String,
    pub time_stamp: String,
    pub nonce_str: String,
    /// `prepay_id=…`
    pub package: String,
    /// Always `RSA`.
    pub sign_type: String,
    pub pay_sign: String,
}

/// Signs `appId\ntimeStamp\nnonceStr\npackage\n` with the merchant key.
pub fn jsapi_params(key: &RsaPrivateKey, app_id: &str, prepay_id: &str, timestamp: i64, nonce: &str) -> JsapiParams {
    let package = format!("prepay_id={prepay_id}");
    let time_stamp = timestamp.to_string();
    let message = format!("{app_id}\n{time_stamp}\n{nonce}\n{package}\n");
    JsapiParams {
        app_id: app_id.into(),
        pay_sign: crypto::sign(key, message.as_bytes()),
        time_stamp,
        nonce_str: nonce.into(),
        package,
        sign_type: "RSA".into(),
    }
}

/// The fields of the WeChat app SDK's `PayReq`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AppParams {
    pub app_id: String,
    /// The merchant id.
    pub partner_id: String,
    pub prepay_id: String,
    /// Always `Sign=WXPay`.
    pub package_value: String,
    pub nonce_str: String,
    pub time_stamp: String,
    pub sign: String,
}

/// Signs `appId\ntimeStamp\nnonceStr\nprepayId\n` with the merchant key.
pub fn app_params(
    key: &RsaPrivateKey,
    app_id: &str,
    mch_id: &str,
    prepay_id: &str,
    timestamp: i64,
    nonce: &str,
) -> AppParams {
    let time_stamp = timestamp.to_string();
    let message = format!("{app_id}\n{time_stamp}\n{nonce}\n{prepay_id}\n");
    AppParams {
        app_id: app_id.into(),
        partner_id: mch_id.into(),
        prepay_id: prepay_id.into(),
        package_value: "Sign=WXPay".into(),
        nonce_str: nonce.into(),
        sign: crypto::sign(key, message.as_bytes()),
        time_stamp,
    }
}

/// The message WeChat Pay signs its answers and notifications over:
/// `Wechatpay-Timestamp\nWechatpay-Nonce\nbody\n`.
pub fn answer_message(timestamp: &str, nonce: &str, body: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(timestamp.len() + nonce.len() + body.len() + 3);
    message.extend_from_slice(timestamp.as_bytes());
    message.push(b'\n');
    message.extend_from_slice(nonce.as_bytes());
    message.push(b'\n');
    message.extend_from_slice(body);
    message.push(b'\n');
    message
}
