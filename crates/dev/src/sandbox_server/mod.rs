//! The development sandbox as a provider on loopback: it plays WeChat Pay API v3 and the
//! Alipay open gateway over HTTP with its own keys, so fitorder's real client runs against it
//! unchanged (only the base URLs differ).
//!
//! - WeChat Pay under `{base}/wechatpay` (fitorder appends `/v3/...`): prepay for JSAPI, Native,
//!   App and H5, query, close, refund, refund query, and `/v3/certificates`. Requests must carry
//!   a valid `WECHATPAY2-SHA256-RSA2048` Authorization by the merchant key; every answer is
//!   signed (`Wechatpay-Timestamp/Nonce/Signature/Serial`). The serial names the
//!   `PUB_KEY_ID_…` of the "微信支付公钥" by default; [`SandboxProvider::set_wechat_serial_mode`]
//!   switches to a self-signed platform certificate holding the same key (what
//!   `/v3/certificates` lists), or alternates between both as during a migration.
//! - Alipay at `{base}/alipay/gateway.do`: `alipay.trade.precreate`, `.query`, `.close`,
//!   `.refund`, `.fastpay.refund.query` (POST form or GET query), and the `alipay.trade.wap.pay`
//!   page (GET); `POST {base}/alipay/app-pay` takes an `alipay.trade.app.pay` order string as the
//!   Alipay app would. Requests must be signed RSA2 by the app key over every non-empty
//!   parameter but `sign`; answers are signed over the exact `<method>_response` text.
//! - A cashier page per trade, `GET {base}/cashier/{wechat|alipay}/{out_trade_no}` (the Native
//!   `code_url`, the H5 `h5_url`, the precreate `qr_code` and the WAP page all lead there): a
//!   person presses Pay and the sandbox sends the signed notification to the trade's
//!   `notify_url`.
//!
//! The checking and signing here is written from the providers' documentation and shares no
//! code with fitorder's client (`providers::crypto`, `wechat::signing`, `alipay::gateway`), so a
//! test that runs the client against the sandbox has an independent other side. Notifications
//! are built by [`super::sandbox`], which shares nothing with the notification verifiers either.
//!
//! Trades live in memory. Fast and controllable for tests: [`SandboxProvider::pay`],
//! [`SandboxProvider::set_state`], [`SandboxProvider::set_refund_flow`],
//! [`SandboxProvider::fail_with`], wrong-key modes, and the record of every call.

mod alipay;
mod bills;
mod cashier;
mod control;
pub mod miniprogram;
mod pay;
mod platform_certs;
mod record;
mod util;
mod wechat;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use axum::Router;
use base64::Engine;
use chrono::{DateTime, Utc};
use rsa::pkcs1v15::{Signature, SigningKey, VerifyingKey};
use rsa::signature::{SignatureEncoding, Signer, Verifier};
use rsa::{RsaPrivateKey, RsaPublicKey};
use serde_json::{json, Value};
use sha2::Sha256;

use super::sandbox::{AlipaySandbox, WechatSandbox};
pub use bills::BillControls;
pub use pay::{notify_paid_later, paid_before_close, pay_trade, PayError};
use util::*;

/// The providers as the sandbox's trades are keyed and its API names them (the stored names).
pub const WECHAT_PAY: &str = crate::domain::Provider::WechatPay.as_str();
pub const ALIPAY: &str = crate::domain::Provider::Alipay.as_str();

/// The keys and identities the sandbox plays the providers with.
#[derive(Clone)]
pub struct SandboxKeys {
    pub mch_id: String,
    pub wechat_app_id: String,
    pub apiv3_key: [u8; 32],
    /// Signs WeChat Pay answers and notifications (the "微信支付公钥" mode).
    pub wechat_platform_key: RsaPrivateKey,
    /// `PUB_KEY_ID_…`, sent as `Wechatpay-Serial`.
    pub wechat_public_key_id: String,
    /// The mobile app's appid: `WECHAT_APP` trades are made under it, the others under
    /// `wechat_app_id` (WeChat Pay refuses another with `APPID_MCHID_NOT_MATCH`).
    pub wechat_mobile_app_id: String,
    /// Verifies fitorder's `Authorization`.
    pub merchant_public_key: RsaPublicKey,
    /// The `serial_no` fitorder's `Authorization` must name.
    pub merchant_serial: String,
    pub alipay_app_id: String,
    /// Signs Alipay answers and notifications.
    pub alipay_key: RsaPrivateKey,
    /// Verifies fitorder's gateway requests and order strings.
    pub app_public_key: RsaPublicKey,
}

/// One trade as the sandbox holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxTrade {
    /// `WECHAT_PAY` or `ALIPAY`.
    pub provider: String,
    /// The contract's channel: `WECHAT_JSAPI`, `WECHAT_NATIVE`, `WECHAT_APP`, `WECHAT_H5`,
    /// `ALIPAY_QR`, `ALIPAY_WAP`, `ALIPAY_APP`.
    pub channel: String,
    pub out_trade_no: String,
    pub amount_cents: i64,
    /// `description` (WeChat) or `subject` (Alipay).
    pub description: String,
    pub time_expire: DateTime<Utc>,
    /// `time_expire` exactly as the request sent it.
    pub time_expire_text: String,
    pub notify_url: String,
    pub created_at: DateTime<Utc>,
    /// In the provider's words: WeChat `NOTPAY`, `USERPAYING`, `SUCCESS`, `REFUND`, `CLOSED`,
    /// `PAYERROR`; Alipay `WAIT_BUYER_PAY`, `TRADE_SUCCESS`, `TRADE_CLOSED`, `TRADE_FINISHED`.
    pub state: String,
    /// Alipay only: false for a precreated trade nobody has scanned yet (Alipay answers
    /// `ACQ.TRADE_NOT_EXIST` for it, as the real gateway does).
    pub exists_at_provider: bool,
    /// `transaction_id` (WeChat, once paid) or `trade_no` (Alipay, once the trade exists).
    pub txn_id: Option<String>,
    pub paid_at: Option<DateTime<Utc>>,
    pub prepay_id: Option<String>,
    pub payer_openid: Option<String>,
    /// WECHAT_H5: the `scene_info.payer_client_ip` the prepay carried.
    pub payer_client_ip: Option<String>,
    pub refunds: Vec<SandboxRefund>,
    /// The cashier page of this trade.
    pub cashier_url: String,
    /// What identifies a repeated prepay as the same request (amount, description, expiry, …).
    pub fingerprint: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxRefund {
    /// `out_refund_no` (WeChat) or `out_request_no` (Alipay).
    pub out_refund_no: String,
    /// WeChat `refund_id`; for Alipay the trade's `trade_no`.
    pub refund_id: String,
    pub amount_cents: i64,
    /// WeChat `PROCESSING`, `SUCCESS`, `ABNORMAL`, `CLOSED`; Alipay `REFUND_SUCCESS`.
    pub status: String,
    pub notify_url: Option<String>,
    pub created_at: DateTime<Utc>,
    pub success_time: Option<DateTime<Utc>>,
}

/// One API call the sandbox received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxCall {
    /// `WECHAT_PAY` or `ALIPAY`.
    pub provider: String,
    /// HTTP method.
    pub method: String,
    /// The path as received (WeChat: from `/v3`; Alipay: `/alipay/gateway.do`, `/alipay/app-pay`).
    pub path: String,
    /// WeChat: the path with the ids replaced (`/v3/pay/transactions/out-trade-no/{no}`);
    /// Alipay: the `method` parameter.
    pub api: String,
    /// Whether the caller's signature verified.
    pub verified: bool,
    pub status: u16,
    /// The error code answered, if any (`SIGN_ERROR`, `isv.invalid-signature`, …).
    pub code: Option<String>,
}

/// One notification the sandbox sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxNotification {
    pub provider: String,
    pub out_trade_no: String,
    /// WeChat `event_type`; Alipay `trade_status` (with `+refund` for refund notifications).
    pub event: String,
    pub url: String,
    /// The receiver's HTTP status; None when it could not be reached.
    pub status: Option<u16>,
    pub reply: String,
    /// 2xx for WeChat; 200 with the body `success` for Alipay.
    pub acknowledged: bool,
}

/// How WeChat refunds go (Alipay refunds are synchronous, as the real gateway's are).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RefundFlow {
    /// Answered `PROCESSING`; a moment later `SUCCESS` and a `REFUND.SUCCESS` notification.
    #[default]
    Processing,
    /// Answered `SUCCESS`, then the `REFUND.SUCCESS` notification.
    Immediate,
    /// Answered `PROCESSING`; then `ABNORMAL` and a `REFUND.ABNORMAL` notification.
    Abnormal,
    /// Answered `PROCESSING`, and it stays so until [`SandboxProvider::finish_refund`].
    Hold,
}

/// How Alipay refunds go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AlipayRefundFlow {
    /// `fund_change` `Y`: the money moved with the answer, the notification follows.
    #[default]
    Immediate,
    /// `fund_change` `N` (the money has not moved yet); a moment later the refund query says
    /// `REFUND_SUCCESS` and the notification is sent.
    Later,
    /// `fund_change` `N`, and the refund query finds no finished refund until
    /// [`SandboxProvider::finish_alipay_refund`].
    Hold,
}

/// Which `Wechatpay-Serial` WeChat answers and notifications name (the same key signs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WechatSerialMode {
    /// The "微信支付公钥" id, `PUB_KEY_ID_…` (`SandboxKeys::wechat_public_key_id`).
    #[default]
    PublicKey,
    /// The platform certificate's serial ([`SandboxProvider::wechat_cert_serial`]).
    Certificate,
    /// One then the other, as WeChat Pay does while a merchant migrates.
    Alternate,
}

#[derive(Default)]
struct State {
    trades: HashMap<(&'static str, String), SandboxTrade>,
    calls: Vec<SandboxCall>,
    notifications: Vec<SandboxNotification>,
    refund_flow: RefundFlow,
    alipay_refund_flow: AlipayRefundFlow,
    /// Trades the member pays just before a close arrives (the deadline race), and whether
    /// the payment notification is sent too (after the close's answer).
    pay_on_close: HashMap<(&'static str, String), bool>,
    failure: Option<u16>,
    delay: Duration,
    serial_mode: WechatSerialMode,
    serials_named: u64,
    bill_controls: BillControls,
    /// Bill download URLs handed out, by token.
    downloads: HashMap<String, bills::Download>,
    /// Bills published whole for a day ([`SandboxProvider::publish_bill`]), by provider and day.
    published: HashMap<(&'static str, chrono::NaiveDate), bills::Published>,
    /// Trades whose payment the bill books on the day after it was paid.
    booked_next_day: std::collections::HashSet<(&'static str, String)>,
    /// WeChat's switch between platform certificate and 微信支付公钥 ([`SandboxProvider::set_wechat_key_switch`]).
    key_switch: bool,
    /// Error answers without a signature ([`SandboxProvider::answer_errors_unsigned`]).
    unsigned_errors: bool,
    /// The `Wechatpay-Serial` each WeChat Pay request carried (None: none), in order.
    request_serials: Vec<Option<String>>,
}

pub struct Inner {
    keys: SandboxKeys,
    base_url: String,
    state: Mutex<State>,
    http: reqwest::Client,
    wrong_answer_key: AtomicBool,
    wrong_notification_key: AtomicBool,
    /// Notifications are lost on the way (recorded, never sent).
    lose_notifications: AtomicBool,
    wrong_key: tokio::sync::OnceCell<RsaPrivateKey>,
    /// The platform certificate (serial, PEM) `/v3/certificates` lists.
    platform_cert: tokio::sync::OnceCell<(String, String)>,
    /// During a key switch: the platform certificate of another key than the 微信支付公钥's
    /// (key, serial, PEM), listed by `/v3/certificates` beside the other.
    switch_cert: tokio::sync::OnceCell<(RsaPrivateKey, String, String)>,
}

struct Shutdown(Option<tokio::sync::oneshot::Sender<()>>);

impl Drop for Shutdown {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// A running sandbox. Clones share it; it stops when the last clone is dropped.
#[derive(Clone)]
pub struct SandboxProvider {
    /// `http://127.0.0.1:PORT`
    pub base_url: String,
    inner: Arc<Inner>,
    _shutdown: Arc<Shutdown>,
}

/// `WECHAT_PAY`/`wechat`/`wechatpay` → `WECHAT_PAY`; `ALIPAY`/`alipay` → `ALIPAY`.
pub fn provider_name(p: &str) -> Option<&'static str> {
    crate::domain::Provider::from_short_name(p).map(crate::domain::Provider::as_str)
}

fn router(inner: Arc<Inner>) -> Router {
    Router::new()
        .nest("/wechatpay", wechat::router())
        .nest("/alipay", alipay::router())
        .nest("/cashier", cashier::router())
        .nest_service("/wechat-mp", miniprogram::router())
        .with_state(inner)
}

pub fn cashier_url(base: &str, provider: &str, out_trade_no: &str) -> String {
    let p = if provider == ALIPAY { "alipay" } else { "wechat" };
    format!("{base}/cashier/{p}/{out_trade_no}")
}
