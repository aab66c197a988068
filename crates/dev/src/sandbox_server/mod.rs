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
pub mod miniprogram;
mod platform_certs;
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

impl SandboxProvider {
    /// Listens on `addr` (`127.0.0.1:0` for any free port) and serves until the last handle
    /// is dropped.
    pub async fn start(keys: SandboxKeys, addr: &str) -> Result<SandboxProvider> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("sandbox provider cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        let base_url = format!("http://{local}");
        let inner = Arc::new(Inner {
            keys,
            base_url: base_url.clone(),
            state: Mutex::new(State::default()),
            // WeChat Pay gives the receiver 5 seconds to answer a notification.
            http: reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?,
            wrong_answer_key: AtomicBool::new(false),
            wrong_notification_key: AtomicBool::new(false),
            lose_notifications: AtomicBool::new(false),
            wrong_key: tokio::sync::OnceCell::new(),
            platform_cert: tokio::sync::OnceCell::new(),
            switch_cert: tokio::sync::OnceCell::new(),
        });
        let app = router(inner.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(SandboxProvider {
            base_url,
            inner,
            _shutdown: Arc::new(Shutdown(Some(tx))),
        })
    }

    /// The WeChat Pay API base fitorder appends `/v3/...` to.
    pub fn wechat_api_base(&self) -> String {
        format!("{}/wechatpay", self.base_url)
    }

    /// The Alipay gateway URL.
    pub fn alipay_gateway(&self) -> String {
        format!("{}/alipay/gateway.do", self.base_url)
    }

    /// Where the Alipay app would submit an `alipay.trade.app.pay` order string (POST).
    pub fn alipay_app_pay_url(&self) -> String {
        format!("{}/alipay/app-pay", self.base_url)
    }

    /// The cashier page of a trade (it exists whether or not the trade does).
    pub fn cashier_url(&self, provider: &str, out_trade_no: &str) -> String {
        let p = provider_name(provider).unwrap_or(WECHAT_PAY);
        cashier_url(&self.inner.base_url, p, out_trade_no)
    }

    pub fn trade(&self, provider: &str, out_trade_no: &str) -> Option<SandboxTrade> {
        let p = provider_name(provider)?;
        self.inner.lock().trades.get(&(p, out_trade_no.to_string())).cloned()
    }

    /// What the cashier's Pay button does: the trade becomes paid and the signed notification
    /// is POSTed to its `notify_url`. Err when the trade cannot be paid (unknown, closed,
    /// past `time_expire`) or the notification was not acknowledged (the trade stays paid;
    /// paying again resends the same notification, as the provider's retries would).
    pub async fn pay(&self, provider: &str, out_trade_no: &str) -> Result<()> {
        let p = provider_name(provider).ok_or_else(|| anyhow!("unknown provider {provider}"))?;
        let sent = pay_trade(&self.inner, p, out_trade_no).await?;
        if sent.acknowledged {
            Ok(())
        } else {
            Err(anyhow!(
                "the notification to {} was not acknowledged: {} {}",
                sent.url,
                sent.status.map(|s| s.to_string()).unwrap_or_else(|| "no answer".into()),
                sent.reply
            ))
        }
    }

    /// Sets a trade's state in the provider's words (`USERPAYING`, `PAYERROR`, `CLOSED`,
    /// `WAIT_BUYER_PAY`, `TRADE_CLOSED`, …). For Alipay the trade then exists at the provider.
    pub fn set_state(&self, provider: &str, out_trade_no: &str, state: &str) {
        let Some(p) = provider_name(provider) else { return };
        let mut s = self.inner.lock();
        if let Some(t) = s.trades.get_mut(&(p, out_trade_no.to_string())) {
            t.state = state.to_string();
            if p == ALIPAY && !t.exists_at_provider {
                t.exists_at_provider = true;
                t.txn_id.get_or_insert_with(alipay_trade_no);
            }
        }
    }

    /// Answers (not notifications) signed with a key fitorder does not know.
    pub fn sign_answers_with_wrong_key(&self, on: bool) {
        self.inner.wrong_answer_key.store(on, Ordering::SeqCst);
    }

    /// Notifications signed with a key fitorder does not know.
    pub fn sign_notifications_with_wrong_key(&self, on: bool) {
        self.inner.wrong_notification_key.store(on, Ordering::SeqCst);
    }

    /// Notifications from now on are lost on the way (recorded as unreachable, never sent):
    /// only queries tell what happened.
    pub fn lose_notifications(&self, on: bool) {
        self.inner.lose_notifications.store(on, Ordering::SeqCst);
    }

    /// Which `Wechatpay-Serial` answers and notifications name from now on.
    pub fn set_wechat_serial_mode(&self, mode: WechatSerialMode) {
        self.inner.lock().serial_mode = mode;
    }

    /// WeChat's switch between platform certificates and the 微信支付公钥, as WeChat Pay runs
    /// it for a merchant: two different keys sign — the 微信支付公钥 (`PUB_KEY_ID_…`) and a
    /// platform certificate of another key ([`SandboxProvider::wechat_switch_cert_serial`]),
    /// which `/v3/certificates` lists. An answer follows the `Wechatpay-Serial` the request
    /// named (either of the two); otherwise answers and notifications alternate between them.
    pub async fn set_wechat_key_switch(&self, on: bool) -> Result<()> {
        if on {
            self.inner.switch_cert().await.map_err(|e| anyhow!(e))?;
        }
        self.inner.lock().key_switch = on;
        Ok(())
    }

    /// The serial of the certificate that signs beside the 微信支付公钥 during a key switch.
    pub async fn wechat_switch_cert_serial(&self) -> Result<String> {
        Ok(self.inner.switch_cert().await.map_err(|e| anyhow!(e))?.1)
    }

    /// Every call is refused with an error answer without a signature, as a provider refuses
    /// requests it cannot authenticate (a wrong merchant key or serial in the configuration):
    /// WeChat Pay `401 SIGN_ERROR` with no `Wechatpay-*` headers, Alipay `<method>_response`
    /// `40002 isv.invalid-signature` with no `sign`.
    pub fn answer_errors_unsigned(&self, on: bool) {
        self.inner.lock().unsigned_errors = on;
    }

    /// The `Wechatpay-Serial` every WeChat Pay API request carried so far (None: none).
    pub fn wechat_request_serials(&self) -> Vec<Option<String>> {
        self.inner.lock().request_serials.clone()
    }

    /// The serial of the sandbox's WeChat Pay platform certificate (40 hex digits, derived from
    /// the platform key, so it stays the same across restarts).
    pub fn wechat_cert_serial(&self) -> String {
        cert_serial(&self.inner.keys.wechat_platform_key)
    }

    /// How the bill service behaves from now on (not made yet, a wrong SHA1, a lapsing URL).
    pub fn set_bill_controls(&self, controls: BillControls) {
        self.inner.lock().bill_controls = controls;
    }

    /// The bill books this trade's payment on the day after it was paid (as a payment at the
    /// stroke of midnight can be): it is missing from that day's bill.
    pub fn book_on_next_day(&self, provider: &str, out_trade_no: &str) {
        let Some(p) = provider_name(provider) else { return };
        self.inner.lock().booked_next_day.insert((p, out_trade_no.to_string()));
    }

    /// From now on `provider`'s bill of `date` is `rows` (packed here, once), whatever trades the
    /// sandbox took that day: a bill of any size for the fetch path without that many trades.
    /// Blocking (a million rows take seconds): call it from `spawn_blocking`.
    pub fn publish_bill(
        &self,
        provider: &str,
        date: chrono::NaiveDate,
        rows: &[crate::providers::bills::BillRow],
    ) -> Result<()> {
        let p = provider_name(provider).ok_or_else(|| anyhow!("unknown provider {provider}"))?;
        let pid = if p == ALIPAY {
            alipay::SELLER_ID
        } else {
            self.inner.keys.mch_id.as_str()
        };
        let published = bills::publish(p, date, rows, pid).map_err(|e| anyhow!("packing the bill: {e}"))?;
        self.inner.lock().published.insert((p, date), published);
        Ok(())
    }

    /// Takes back a bill [`publish_bill`](Self::publish_bill) gave: the day is served as if
    /// nothing had been published.
    pub fn withdraw_bill(&self, provider: &str, date: chrono::NaiveDate) -> Result<()> {
        let p = provider_name(provider).ok_or_else(|| anyhow!("unknown provider {provider}"))?;
        self.inner.lock().published.remove(&(p, date));
        Ok(())
    }

    pub fn bill_controls(&self) -> BillControls {
        self.inner.lock().bill_controls
    }

    pub fn set_refund_flow(&self, flow: RefundFlow) {
        self.inner.lock().refund_flow = flow;
    }

    pub fn set_alipay_refund_flow(&self, flow: AlipayRefundFlow) {
        self.inner.lock().alipay_refund_flow = flow;
    }

    /// The deadline race: the member pays this trade just before fitorder's close arrives, so
    /// the close is refused (WeChat `ORDERPAID`, Alipay `ACQ.TRADE_STATUS_ERROR`). `notify`:
    /// the payment notification is sent too, after the close's answer (otherwise it is lost).
    pub fn pay_during_close(&self, provider: &str, out_trade_no: &str, notify: bool) {
        let Some(p) = provider_name(provider) else { return };
        self.inner
            .lock()
            .pay_on_close
            .insert((p, out_trade_no.to_string()), notify);
    }

    /// Ends a held Alipay refund (`REFUND_SUCCESS` from now on in the refund query) and sends
    /// its notification.
    pub async fn finish_alipay_refund(&self, out_request_no: &str) -> Result<SandboxNotification> {
        alipay::finish_refund(&self.inner, out_request_no)
            .await
            .ok_or_else(|| anyhow!("no held Alipay refund {out_request_no}"))
    }

    /// Ends a held WeChat refund like [`finish_refund`](Self::finish_refund), but the
    /// notification is lost: only the refund query tells.
    pub fn finish_refund_silently(&self, out_refund_no: &str, status: &str) -> Result<()> {
        wechat::settle_refund(&self.inner, out_refund_no, status)
            .map(|_| ())
            .ok_or_else(|| anyhow!("no WeChat refund {out_refund_no}"))
    }

    /// Every API call is answered with this HTTP status (WeChat `SYSTEM_ERROR`; Alipay answers
    /// 200 with code `20000`, as its gateway does), until `None`.
    pub fn fail_with(&self, status: Option<u16>) {
        self.inner.lock().failure = status;
    }

    /// Every API call waits this long before it is answered (client timeouts).
    pub fn set_delay(&self, delay: Duration) {
        self.inner.lock().delay = delay;
    }

    /// Ends a held WeChat refund (`SUCCESS`, `ABNORMAL` or `CLOSED`) and sends its notification.
    pub async fn finish_refund(&self, out_refund_no: &str, status: &str) -> Result<SandboxNotification> {
        wechat::finish_refund(&self.inner, out_refund_no, status)
            .await
            .ok_or_else(|| anyhow!("no WeChat refund {out_refund_no}"))
    }

    pub fn calls(&self) -> Vec<SandboxCall> {
        self.inner.lock().calls.clone()
    }

    pub fn notifications(&self) -> Vec<SandboxNotification> {
        self.inner.lock().notifications.clone()
    }

    /// Waits until `n` notifications were sent (refund notifications go out after the answer).
    pub async fn wait_notifications(&self, n: usize, within: Duration) -> Result<Vec<SandboxNotification>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let sent = self.notifications();
            if sent.len() >= n {
                return Ok(sent);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(anyhow!("{} notification(s) sent, expected {n}", sent.len()));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
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

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, call: SandboxCall) {
        self.lock().calls.push(call);
    }

    /// The configured failure and delay, applied before a call is looked at.
    async fn knobs(&self) -> Option<u16> {
        let (failure, delay) = {
            let s = self.lock();
            (s.failure, s.delay)
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        failure
    }

    async fn other_key(&self) -> RsaPrivateKey {
        self.wrong_key
            .get_or_init(|| async {
                tokio::task::spawn_blocking(|| RsaPrivateKey::new(&mut rand_core::OsRng, 2048).expect("RSA key"))
                    .await
                    .expect("key generation")
            })
            .await
            .clone()
    }

    async fn answer_key(&self, provider: &str) -> RsaPrivateKey {
        if self.wrong_answer_key.load(Ordering::SeqCst) {
            return self.other_key().await;
        }
        self.own_key(provider)
    }

    async fn notification_key(&self, provider: &str) -> RsaPrivateKey {
        if self.wrong_notification_key.load(Ordering::SeqCst) {
            return self.other_key().await;
        }
        self.own_key(provider)
    }

    /// The `Wechatpay-Serial` of the next answer or notification.
    fn wechat_serial(&self) -> String {
        let mode = {
            let mut s = self.lock();
            s.serials_named += 1;
            match s.serial_mode {
                WechatSerialMode::Alternate if s.serials_named.is_multiple_of(2) => WechatSerialMode::Certificate,
                WechatSerialMode::Alternate => WechatSerialMode::PublicKey,
                m => m,
            }
        };
        match mode {
            WechatSerialMode::Certificate => cert_serial(&self.keys.wechat_platform_key),
            _ => self.keys.wechat_public_key_id.clone(),
        }
    }

    /// What signs the next WeChat answer or notification: the key and the serial naming it.
    /// `requested`: the `Wechatpay-Serial` of the request answered (during a switch the answer
    /// follows it).
    async fn wechat_signer(&self, answer: bool, requested: Option<&str>) -> (RsaPrivateKey, String) {
        let switching = self.lock().key_switch;
        let wrong = if answer {
            self.wrong_answer_key.load(Ordering::SeqCst)
        } else {
            self.wrong_notification_key.load(Ordering::SeqCst)
        };
        if !switching || wrong {
            let key = if answer {
                self.answer_key(WECHAT_PAY).await
            } else {
                self.notification_key(WECHAT_PAY).await
            };
            return (key, self.wechat_serial());
        }
        let Ok((cert_key, cert_serial, _)) = self.switch_cert().await else {
            return (self.own_key(WECHAT_PAY), self.wechat_serial());
        };
        let public = (
            self.keys.wechat_platform_key.clone(),
            self.keys.wechat_public_key_id.clone(),
        );
        let cert = (cert_key, cert_serial.clone());
        match requested.map(str::trim) {
            Some(r) if r == self.keys.wechat_public_key_id => public,
            Some(r) if r.eq_ignore_ascii_case(&cert_serial) => cert,
            _ => {
                let n = {
                    let mut s = self.lock();
                    s.serials_named += 1;
                    s.serials_named
                };
                if n.is_multiple_of(2) {
                    cert
                } else {
                    public
                }
            }
        }
    }

    /// The key-switch certificate: a second platform key and its self-signed certificate.
    async fn switch_cert(&self) -> Result<(RsaPrivateKey, String, String), String> {
        self.switch_cert
            .get_or_try_init(|| async {
                tokio::task::spawn_blocking(move || {
                    let key = RsaPrivateKey::new(&mut rand_core::OsRng, 2048).map_err(|e| e.to_string())?;
                    let serial = cert_serial(&key);
                    let pem = platform_certs::self_signed_platform_cert(
                        &key,
                        &serial,
                        "fitorder sandbox WeChat Pay platform (switch)",
                        1825,
                    )
                    .map_err(|e| e.to_string())?;
                    Ok::<_, String>((key, serial, pem))
                })
                .await
                .map_err(|e| e.to_string())?
            })
            .await
            .cloned()
    }

    /// The certificates `/v3/certificates` lists: the platform key's, and during a key switch
    /// the other key's.
    async fn listed_certs(&self) -> Result<Vec<(String, String)>, String> {
        let mut certs = vec![self.platform_cert().await?];
        if self.lock().key_switch {
            let (_, serial, pem) = self.switch_cert().await?;
            certs.push((serial, pem));
        }
        Ok(certs)
    }

    /// The self-signed platform certificate of the platform key: (serial, PEM).
    async fn platform_cert(&self) -> Result<(String, String), String> {
        self.platform_cert
            .get_or_try_init(|| async {
                let key = self.keys.wechat_platform_key.clone();
                tokio::task::spawn_blocking(move || {
                    let serial = cert_serial(&key);
                    platform_certs::self_signed_platform_cert(
                        &key,
                        &serial,
                        "fitorder sandbox WeChat Pay platform",
                        1825,
                    )
                    .map(|pem| (serial, pem))
                    .map_err(|e| e.to_string())
                })
                .await
                .map_err(|e| e.to_string())?
            })
            .await
            .cloned()
    }

    fn own_key(&self, provider: &str) -> RsaPrivateKey {
        if provider == ALIPAY {
            self.keys.alipay_key.clone()
        } else {
            self.keys.wechat_platform_key.clone()
        }
    }

    /// POSTs a signed WeChat Pay notification.
    async fn notify_wechat(
        &self,
        out_trade_no: &str,
        url: &str,
        event_type: &str,
        resource: &Value,
    ) -> SandboxNotification {
        let (platform_key, serial) = self.wechat_signer(false, None).await;
        let signer = WechatSandbox {
            platform_key,
            apiv3_key: self.keys.apiv3_key,
            mch_id: self.keys.mch_id.clone(),
            serial,
            app_id: self.keys.wechat_app_id.clone(),
        };
        let n = signer.notification(event_type, resource, Utc::now().timestamp());
        if self.lose_notifications.load(Ordering::SeqCst) {
            return self.lost(WECHAT_PAY, out_trade_no, event_type, url);
        }
        let mut req = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .header("user-agent", "Mozilla/4.0 (fitorder sandbox; WeChat Pay)")
            .header("wechatpay-signature-type", "WECHATPAY2-SHA256-RSA2048");
        for (k, v) in &n.headers {
            req = req.header(*k, v);
        }
        let sent = match req.body(n.body).send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let reply = resp.text().await.unwrap_or_default();
                SandboxNotification {
                    provider: WECHAT_PAY.into(),
                    out_trade_no: out_trade_no.into(),
                    event: event_type.into(),
                    url: url.into(),
                    status: Some(status),
                    acknowledged: (200..300).contains(&status),
                    reply,
                }
            }
            Err(e) => unreachable_notification(WECHAT_PAY, out_trade_no, event_type, url, &e),
        };
        self.lock().notifications.push(sent.clone());
        sent
    }

    /// POSTs a signed Alipay notification with `fields` (the envelope fields are added).
    async fn notify_alipay(
        &self,
        out_trade_no: &str,
        url: &str,
        event: &str,
        fields: &[(&str, &str)],
    ) -> SandboxNotification {
        let signer = AlipaySandbox {
            alipay_key: self.notification_key(ALIPAY).await,
            app_id: self.keys.alipay_app_id.clone(),
        };
        let body = signer.notification(fields);
        if self.lose_notifications.load(Ordering::SeqCst) {
            return self.lost(ALIPAY, out_trade_no, event, url);
        }
        let req = self
            .http
            .post(url)
            .header("content-type", "application/x-www-form-urlencoded; charset=utf-8")
            .header("user-agent", "Mozilla/4.0 (fitorder sandbox; Alipay)");
        let sent = match req.body(body).send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let reply = resp.text().await.unwrap_or_default();
                SandboxNotification {
                    provider: ALIPAY.into(),
                    out_trade_no: out_trade_no.into(),
                    event: event.into(),
                    url: url.into(),
                    status: Some(status),
                    acknowledged: status == 200 && reply.trim() == "success",
                    reply,
                }
            }
            Err(e) => unreachable_notification(ALIPAY, out_trade_no, event, url, &e),
        };
        self.lock().notifications.push(sent.clone());
        sent
    }
}

impl Inner {
    fn lost(&self, provider: &str, no: &str, event: &str, url: &str) -> SandboxNotification {
        let n = SandboxNotification {
            provider: provider.into(),
            out_trade_no: no.into(),
            event: event.into(),
            url: url.into(),
            status: None,
            reply: "lost on the way (SandboxProvider::lose_notifications)".into(),
            acknowledged: false,
        };
        self.lock().notifications.push(n.clone());
        n
    }
}

fn unreachable_notification(
    provider: &str,
    no: &str,
    event: &str,
    url: &str,
    e: &reqwest::Error,
) -> SandboxNotification {
    SandboxNotification {
        provider: provider.into(),
        out_trade_no: no.into(),
        event: event.into(),
        url: url.into(),
        status: None,
        reply: e.to_string(),
        acknowledged: false,
    }
}

/// Why the cashier could not take a payment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayError {
    #[error("the sandbox has no such trade")]
    UnknownTrade,
    #[error("the trade is {0}: it cannot be paid")]
    NotPayable(String),
    #[error("the trade expired at {0}: it cannot be paid any more")]
    Expired(String),
}

/// A close arrived for a trade [`SandboxProvider::pay_during_close`] named: the member pays
/// it first. Returns whether the payment notification is to be sent after the close's answer.
pub fn paid_before_close(inner: &Inner, provider: &'static str, no: &str) -> Option<bool> {
    let mut s = inner.lock();
    let notify = s.pay_on_close.remove(&(provider, no.to_string()))?;
    let t = s.trades.get_mut(&(provider, no.to_string()))?;
    if !matches!(t.state.as_str(), "NOTPAY" | "USERPAYING" | "WAIT_BUYER_PAY") {
        return None;
    }
    if provider == ALIPAY {
        t.exists_at_provider = true;
        t.txn_id.get_or_insert_with(alipay_trade_no);
        t.state = "TRADE_SUCCESS".into();
    } else {
        t.state = "SUCCESS".into();
        t.txn_id = Some(format!("42000{}", digits(23)));
    }
    t.paid_at = Some(Utc::now());
    Some(notify)
}

/// Sends the payment notification of a trade paid during its close (after the close's answer).
pub fn notify_paid_later(inner: Arc<Inner>, provider: &'static str, no: String) {
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _ = pay_trade(&inner, provider, &no).await;
    });
}

/// The Pay button: marks the trade paid (or finds it paid already) and sends the payment
/// notification.
pub async fn pay_trade(inner: &Inner, provider: &'static str, no: &str) -> Result<SandboxNotification, PayError> {
    let now = Utc::now();
    let trade = {
        let mut s = inner.lock();
        let t = s
            .trades
            .get_mut(&(provider, no.to_string()))
            .ok_or(PayError::UnknownTrade)?;
        if provider == ALIPAY && !t.exists_at_provider {
            t.exists_at_provider = true;
            t.txn_id.get_or_insert_with(alipay_trade_no);
        }
        let paid_already = matches!(t.state.as_str(), "SUCCESS" | "REFUND" | "TRADE_SUCCESS");
        if !paid_already {
            if !matches!(t.state.as_str(), "NOTPAY" | "USERPAYING" | "WAIT_BUYER_PAY") {
                return Err(PayError::NotPayable(t.state.clone()));
            }
            if now > t.time_expire {
                return Err(PayError::Expired(t.time_expire_text.clone()));
            }
            if provider == WECHAT_PAY {
                t.state = "SUCCESS".into();
                t.txn_id = Some(format!("42000{}", digits(23)));
            } else {
                t.state = "TRADE_SUCCESS".into();
            }
            t.paid_at = Some(now);
        }
        t.clone()
    };
    Ok(if provider == WECHAT_PAY {
        // A resent notification says what the first one said, even after a refund.
        let mut paid = trade.clone();
        paid.state = "SUCCESS".into();
        let resource = wechat::transaction_resource(&inner.keys, &paid);
        inner
            .notify_wechat(&trade.out_trade_no, &trade.notify_url, "TRANSACTION.SUCCESS", &resource)
            .await
    } else {
        let yuan = yuan(trade.amount_cents);
        let paid = shanghai(trade.paid_at.unwrap_or(now));
        let created = shanghai(trade.created_at);
        inner
            .notify_alipay(
                &trade.out_trade_no,
                &trade.notify_url,
                "TRADE_SUCCESS",
                &[
                    ("out_trade_no", &trade.out_trade_no),
                    ("trade_no", trade.txn_id.as_deref().unwrap_or_default()),
                    ("trade_status", "TRADE_SUCCESS"),
                    ("total_amount", &yuan),
                    ("receipt_amount", &yuan),
                    ("buyer_pay_amount", &yuan),
                    ("invoice_amount", &yuan),
                    ("buyer_id", alipay::BUYER_ID),
                    ("seller_id", alipay::SELLER_ID),
                    ("subject", &trade.description),
                    ("gmt_create", &created),
                    ("gmt_payment", &paid),
                ],
            )
            .await
    })
}

// ----- small helpers shared by both providers, written for the sandbox alone -----

const B64: base64::engine::general_purpose::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// SHA256withRSA (PKCS#1 v1.5), base64.
fn rsa_sign(key: &RsaPrivateKey, message: &[u8]) -> String {
    B64.encode(SigningKey::<Sha256>::new(key.clone()).sign(message).to_bytes())
}

fn rsa_verify(key: &RsaPublicKey, message: &[u8], signature_b64: &str) -> bool {
    let Ok(raw) = B64.decode(signature_b64.trim()) else {
        return false;
    };
    let Ok(sig) = Signature::try_from(raw.as_slice()) else {
        return false;
    };
    VerifyingKey::<Sha256>::new(key.clone()).verify(message, &sig).is_ok()
}

fn random_from(alphabet: &[u8], n: usize) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..n)
        .map(|_| alphabet[rng.random_range(0..alphabet.len())] as char)
        .collect()
}

fn alnum(n: usize) -> String {
    random_from(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", n)
}

fn digits(n: usize) -> String {
    random_from(b"0123456789", n)
}

/// A certificate serial for `key`: 20 bytes of SHA-256 over its modulus, as 40 upper-case hex
/// digits (the first byte kept in 0x10..0x7F so the DER integer is positive and 20 bytes long).
fn cert_serial(key: &RsaPrivateKey) -> String {
    use rsa::traits::PublicKeyParts;
    use sha2::Digest;
    let digest = Sha256::digest(key.n().to_bytes_be());
    let mut bytes = digest[..20].to_vec();
    bytes[0] = (bytes[0] & 0x6F) | 0x10;
    hex::encode_upper(bytes)
}

/// An Alipay `trade_no`: date, `22001`, 15 digits (28 characters).
fn alipay_trade_no() -> String {
    format!("{}22001{}", shanghai_now().format("%Y%m%d"), digits(15))
}

fn shanghai_now() -> DateTime<chrono_tz::Tz> {
    Utc::now().with_timezone(&chrono_tz::Asia::Shanghai)
}

/// `yyyy-MM-dd HH:mm:ss` in Asia/Shanghai (Alipay's time format).
fn shanghai(t: DateTime<Utc>) -> String {
    t.with_timezone(&chrono_tz::Asia::Shanghai)
        .format("%Y-%m-%d %H:%M:%S")
        .to_string()
}

/// RFC 3339 with the +08:00 offset (WeChat Pay's time format).
fn rfc3339_cn(t: DateTime<Utc>) -> String {
    t.with_timezone(&chrono_tz::Asia::Shanghai)
        .format("%Y-%m-%dT%H:%M:%S%:z")
        .to_string()
}

/// Cents as yuan with two decimals.
fn yuan(cents: i64) -> String {
    format!("{}.{:02}", cents / 100, cents % 100)
}

/// `"12.3"`, `"12.30"`, `"12"` → cents; None for anything else (negative, 3 decimals, junk).
fn parse_yuan(text: &str) -> Option<i64> {
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
fn valid_notify_url(url: &str) -> bool {
    (url.starts_with("http://") || url.starts_with("https://")) && !url.contains('?') && url.len() <= 256
}

fn html_escape(text: &str) -> String {
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

fn error_json(code: &str, message: &str) -> Value {
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
