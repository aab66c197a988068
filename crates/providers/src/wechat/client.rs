//! WeChat Pay API v3 as a [`Gateway`]: prepay for JSAPI / Native / APP / H5, query, close and
//! refund. Every call is signed with the merchant key; every answer — errors included — is
//! verified with the platform key its `Wechatpay-Serial` names before anything is read from it.

use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use super::signing::{self, Merchant};
use crate::crypto;
use crate::domain::payment::{PayChannel, Provider};
use crate::keys::WechatKeys;
use crate::platform_keys::VerifyError;
use crate::provider::*;
use futures_util::FutureExt;

/// Answers older or newer than this are refused, as the official SDKs do.
const MAX_ANSWER_SKEW_SECONDS: i64 = 300;

/// Cheap to clone (the HTTP client, the keys and the pool are shared handles): a refresh an
/// unknown serial starts runs on a clone in a task of its own.
#[derive(Clone)]
pub struct WechatPay {
    http: reqwest::Client,
    keys: Arc<WechatKeys>,
    notify_url: String,
    timeout: Duration,
    /// Where the platform certificates are kept (certificate mode); None: no refresh here.
    pool: Option<crate::db::DbPool>,
}

/// An answer as received, before its signature is checked.
struct Raw {
    status: u16,
    timestamp: Option<String>,
    nonce: Option<String>,
    signature: Option<String>,
    serial: Option<String>,
    body: bytes::Bytes,
}

/// A verified answer: its status and JSON body (`Null` when empty).
struct Answer {
    status: u16,
    body: Value,
}

impl Answer {
    fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or_default()
    }

    fn refused(&self) -> ProviderError {
        ProviderError::Refused(format!(
            "HTTP {} {} {}",
            self.status,
            self.code(),
            self.body["message"].as_str().unwrap_or_default()
        ))
    }
}

impl WechatPay {
    pub fn new(
        http: reqwest::Client,
        keys: Arc<WechatKeys>,
        public_url: &str,
        timeout: Duration,
        pool: Option<crate::db::DbPool>,
    ) -> WechatPay {
        WechatPay {
            http,
            keys,
            notify_url: format!("{public_url}{}", super::NOTIFY_PATH),
            timeout,
            pool,
        }
    }

    pub fn keys(&self) -> &WechatKeys {
        &self.keys
    }

    fn merchant(&self) -> Merchant<'_> {
        Merchant {
            mch_id: &self.keys.mch_id,
            serial: &self.keys.merchant_serial,
            key: &self.keys.merchant_key,
        }
    }

    /// One signed call, its answer as received.
    async fn send(&self, method: Method, path: &str, body: Option<Value>, trace: &str) -> Result<Raw, ProviderError> {
        let payload = body.map(|b| b.to_string()).unwrap_or_default();
        let ts = chrono::Utc::now().timestamp();
        let nonce = crypto::nonce(32);
        let auth = signing::authorization(&self.merchant(), method.as_str(), path, ts, &nonce, &payload);
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.keys.api_base))
            // The whole call's limit (FITORDER_PROVIDER_TIMEOUT); the shared client's own is
            // the downstream calls'.
            .timeout(self.timeout)
            .header("Authorization", auth)
            .header("Accept", "application/json")
            .header("User-Agent", concat!("fitorder/", env!("CARGO_PKG_VERSION")))
            .header("X-Trace-Id", trace);
        // The platform key we verify with: during WeChat's switch its answers follow it.
        if let Some(serial) = self.keys.request_serial() {
            req = req.header("Wechatpay-Serial", serial);
        }
        if method != Method::GET {
            req = req.header("Content-Type", "application/json").body(payload);
        }
        let resp = req.send().await.map_err(|e| unreachable(&e, self.timeout))?;
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let raw = Raw {
            status: resp.status().as_u16(),
            timestamp: header("Wechatpay-Timestamp"),
            nonce: header("Wechatpay-Nonce"),
            signature: header("Wechatpay-Signature"),
            serial: header("Wechatpay-Serial"),
            body: bytes::Bytes::new(),
        };
        let body = resp.bytes().await.map_err(|e| unreachable(&e, self.timeout))?;
        Ok(Raw { body, ..raw })
    }

    /// One signed call; the answer is returned only when its signature verifies. An unknown
    /// serial (a new platform certificate) triggers one rate-limited certificate refresh.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        trace: &str,
    ) -> Result<Answer, ProviderError> {
        let raw = self.send(method, path, body, trace).await?;
        let serial = raw.serial.as_deref().unwrap_or_default();
        if self.keys.platform.key_for(serial).is_none() && !serial.is_empty() {
            self.unknown_serial(self.timeout, trace).await;
        }
        if let Err(e) = self.verify_answer(
            raw.timestamp.as_deref(),
            raw.nonce.as_deref(),
            raw.signature.as_deref(),
            raw.serial.as_deref(),
            &raw.body,
        ) {
            return Err(unsigned_error_answer(&raw).unwrap_or(e));
        }
        let status = raw.status;
        let body = if raw.body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&raw.body).map_err(|_| ProviderError::Refused(format!("HTTP {status}: not JSON")))?
        };
        Ok(Answer { status, body })
    }

    /// A serial we do not know, in either mode (during WeChat's switch from platform
    /// certificates to the 微信支付公钥, or back, both sign). Decided in memory, no database work
    /// here: the refresh in flight is waited for (at most `wait`), or one is started when none
    /// was in the last [`UNKNOWN_REFRESH_MIN_INTERVAL_SECS`] — in a task of its own, on a clone,
    /// so it runs to its end whoever waits — or nothing happens. The refresh fetches the
    /// certificates when it wins the claim (once a minute across all instances), else reloads
    /// what the winner stored. Afterwards the caller looks the serial up again in memory.
    ///
    /// [`UNKNOWN_REFRESH_MIN_INTERVAL_SECS`]: crate::platform_keys::UNKNOWN_REFRESH_MIN_INTERVAL_SECS
    pub async fn unknown_serial(&self, wait: Duration, trace: &str) {
        let refresh = self.keys.platform.unknown_serial(chrono::Utc::now(), || {
            let me = self.clone();
            let trace = trace.to_string();
            async move {
                if let Err(e) = me.refresh_certificates(true, &trace).await {
                    tracing::warn!(error = %e, "refreshing the WeChat Pay platform certificates failed");
                }
            }
            .boxed()
        });
        if let Some(refresh) = refresh {
            let _ = tokio::time::timeout(wait, refresh).await;
        }
    }

    /// `GET /v3/certificates`: the certificates are decrypted with the APIv3 key (which only
    /// WeChat Pay and we hold), the answer is checked against the certificate its serial names
    /// (known before, or among those just decrypted, as the official SDKs bootstrap), and they
    /// are stored for every instance. `forced`: claim the cross-instance rate limit first.
    pub async fn refresh_certificates(&self, forced: bool, trace: &str) -> Result<usize, ProviderError> {
        let Some(pool) = &self.pool else {
            return Ok(0);
        };
        let db = |e: &dyn std::fmt::Display| ProviderError::Unreachable(format!("database: {e}"));
        let visit = || {
            if forced {
                self.keys.platform.count_unknown_serial_db_visit();
            }
        };
        visit();
        let mut conn = pool.get().await.map_err(|e| db(&e))?;
        if forced
            && !self
                .keys
                .platform
                .may_force_refresh(&mut conn, chrono::Utc::now())
                .await
                .map_err(|e| db(&e))?
        {
            // Another instance (or this one, a moment ago) is fetching: take what it stored.
            let _ = self.keys.platform.reload(&mut conn).await;
            return Ok(0);
        }
        drop(conn);
        let raw = self.send(Method::GET, "/v3/certificates", None, trace).await?;
        if raw.status != 200 {
            return Err(ProviderError::Refused(format!("/v3/certificates: HTTP {}", raw.status)));
        }
        let fetched = crate::platform_keys::decrypt_certificates(&self.keys.apiv3_key, &raw.body)
            .map_err(|e| ProviderError::Unsigned(format!("/v3/certificates: {e}")))?;
        let mut ring = self.keys.platform.snapshot();
        for c in &fetched {
            ring.insert_cert(c.clone());
        }
        let (Some(ts), Some(nonce), Some(sig), Some(serial)) =
            (&raw.timestamp, &raw.nonce, &raw.signature, &raw.serial)
        else {
            return Err(ProviderError::Unsigned(
                "/v3/certificates: no Wechatpay-Signature".into(),
            ));
        };
        ring.verify(serial, ts, nonce, &raw.body, sig)
            .map_err(|e| ProviderError::Unsigned(format!("/v3/certificates: {e}")))?;
        visit();
        let mut conn = pool.get().await.map_err(|e| db(&e))?;
        let n = self
            .keys
            .platform
            .refresh_from_answer(&mut conn, &self.keys.apiv3_key, &raw.body)
            .await
            .map_err(|e| db(&format!("{e:#}")))?;
        tracing::info!(certificates = n, "WeChat Pay platform certificates refreshed");
        Ok(n)
    }

    fn verify_answer(
        &self,
        ts: Option<&str>,
        nonce: Option<&str>,
        sig: Option<&str>,
        serial: Option<&str>,
        body: &[u8],
    ) -> Result<(), ProviderError> {
        let (Some(ts), Some(nonce), Some(sig), Some(serial)) = (ts, nonce, sig, serial) else {
            return Err(ProviderError::Unsigned(
                "the answer carries no Wechatpay-Signature".into(),
            ));
        };
        let unknown = |serial: &str| ProviderError::Unsigned(format!("unknown Wechatpay-Serial {serial}"));
        if self.keys.platform.key_for(serial).is_none() {
            return Err(unknown(serial));
        }
        let at: i64 = ts
            .trim()
            .parse()
            .map_err(|_| ProviderError::Unsigned("bad Wechatpay-Timestamp".into()))?;
        if (chrono::Utc::now().timestamp() - at).abs() > MAX_ANSWER_SKEW_SECONDS {
            return Err(ProviderError::Unsigned(
                "Wechatpay-Timestamp more than 5 minutes off".into(),
            ));
        }
        self.keys
            .platform
            .verify(serial, ts, nonce, body, sig)
            .map_err(|e| match e {
                VerifyError::UnknownSerial(serial) => unknown(&serial),
                VerifyError::BadSignature => ProviderError::Unsigned("Wechatpay-Signature does not verify".into()),
            })
    }
}

/// How long a WeChat refund answered `PROCESSING` waits for its `REFUND.SUCCESS` notification
/// before it is asked of the refund query.
pub const REFUND_RECHECK: Duration = Duration::from_secs(3600);

/// A refund as WeChat Pay answers it (refund and refund query): done only on `SUCCESS`.
fn refund_state(body: &Value, r: &RefundRequest<'_>) -> Result<RefundState, ProviderError> {
    if body["out_refund_no"].as_str() != Some(r.refund_no) {
        return Err(ProviderError::Refused("the answer is about another refund".into()));
    }
    if let Some(amount) = body["amount"]["refund"].as_i64() {
        if amount != r.amount_cents {
            return Err(ProviderError::Refused(format!(
                "the refund {} is of {amount} fen, fitorder asked for {}",
                r.refund_no, r.amount_cents
            )));
        }
    }
    let provider_refund_id = body["refund_id"].as_str().map(str::to_string);
    Ok(match body["status"].as_str() {
        Some("SUCCESS") => RefundState::Done { provider_refund_id },
        Some("PROCESSING") => RefundState::Pending {
            status: "PROCESSING".into(),
            provider_refund_id,
            recheck_in: Some(REFUND_RECHECK),
        },
        Some(s @ ("ABNORMAL" | "CLOSED")) => RefundState::Failed {
            status: s.to_string(),
            provider_refund_id,
        },
        other => return Err(ProviderError::Refused(format!("refund status {other:?}"))),
    })
}

/// Downloads (a bill) may take minutes; API calls have the downstream timeout.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(600);

/// An error answer (4xx/5xx with WeChat's `{"code","message"}`) that does not verify: still no
/// answer, but reported with its code and message (`401 SIGN_ERROR` is a merchant key or
/// serial mistake, not an attack).
fn unsigned_error_answer(raw: &Raw) -> Option<ProviderError> {
    if raw.status < 400 {
        return None;
    }
    let body: Value = serde_json::from_slice(&raw.body).ok()?;
    let code = body["code"].as_str().filter(|c| !c.is_empty())?;
    let e = unsigned_error(raw.status, code, body["message"].as_str().unwrap_or_default());
    tracing::warn!(error = %e, "WeChat Pay answered an error without a valid signature");
    Some(e)
}

/// At most `max` bytes of `s`, cut at a character boundary (WeChat counts bytes).
fn truncate_bytes(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[async_trait::async_trait]
impl Gateway for WechatPay {
    /// The stored platform certificates are loaded in both modes (a 微信支付公钥 beside them is
    /// a switch in progress: both kinds verify); they are fetched when the newest fetch (by any
    /// instance) is 12 hours old — without a 微信支付公钥, or beside one while certificates are
    /// in use — and kept for every instance.
    async fn refresh_keys(&self, trace: &str) -> anyhow::Result<usize> {
        let Some(pool) = &self.pool else {
            return Ok(0);
        };
        let mut conn = pool.get().await?;
        self.keys.platform.reload(&mut conn).await?;
        drop(conn);
        if !self.keys.downloads_certificates() || !self.keys.platform.needs_refresh(chrono::Utc::now()) {
            return Ok(0);
        }
        self.refresh_certificates(false, trace)
            .await
            .map_err(|e| anyhow::anyhow!("WeChat Pay platform certificates: {e}"))
    }

    fn provider(&self) -> Provider {
        Provider::WechatPay
    }

    async fn start_trade(&self, t: &TradeRequest<'_>) -> Result<Instruction, ProviderError> {
        let kind = match t.channel {
            PayChannel::WechatJsapi => "jsapi",
            PayChannel::WechatNative => "native",
            PayChannel::WechatApp => "app",
            PayChannel::WechatH5 => "h5",
            other => return Err(ProviderError::Unsupported(format!("WeChat Pay has no channel {other}"))),
        };
        let mut body = json!({
            "appid": self.keys.app_id_for(t.channel),
            "mchid": self.keys.mch_id,
            "description": truncate_bytes(t.description, 127),
            "out_trade_no": t.out_trade_no,
            "time_expire": wechat_time(t.expires_at),
            "notify_url": self.notify_url,
            "amount": {"total": t.amount_cents, "currency": "CNY"},
        });
        match t.channel {
            PayChannel::WechatJsapi => {
                let openid = t
                    .openid
                    .ok_or_else(|| ProviderError::Unsupported("JSAPI needs the payer's openid".into()))?;
                body["payer"] = json!({ "openid": openid });
            }
            PayChannel::WechatH5 => {
                let ip = t
                    .client_ip
                    .ok_or_else(|| ProviderError::Unsupported("H5 needs the payer's IP address".into()))?;
                body["scene_info"] = json!({
                    "payer_client_ip": ip,
                    "h5_info": {"type": "Wap"},
                });
            }
            _ => {}
        }
        let answer = self
            .call(
                Method::POST,
                &format!("/v3/pay/transactions/{kind}"),
                Some(body),
                t.trace_id,
            )
            .await?;
        let message = answer.body["message"].as_str().unwrap_or_default();
        if answer.code() == "OUT_TRADE_NO_USED" || message.contains("商户订单号重复") {
            return Err(ProviderError::TradeTaken(message.to_string()));
        }
        if answer.status != 200 {
            return Err(answer.refused());
        }
        let field = |name: &str| {
            answer.body[name]
                .as_str()
                .filter(|v| !v.is_empty())
                .map(str::to_string)
                .ok_or_else(|| ProviderError::Refused(format!("the prepay answer has no {name}")))
        };
        let now = chrono::Utc::now().timestamp();
        let k = &self.keys;
        Ok(match t.channel {
            PayChannel::WechatJsapi => Instruction {
                wechat_jsapi: Some(signing::jsapi_params(
                    &k.merchant_key,
                    &k.app_id,
                    &field("prepay_id")?,
                    now,
                    &crypto::nonce(32),
                )),
                ..Default::default()
            },
            PayChannel::WechatApp => Instruction {
                wechat_app: Some(signing::app_params(
                    &k.merchant_key,
                    k.app_id_for(PayChannel::WechatApp),
                    &k.mch_id,
                    &field("prepay_id")?,
                    now,
                    &crypto::nonce(32),
                )),
                ..Default::default()
            },
            PayChannel::WechatNative => Instruction {
                qr_code: Some(field("code_url")?),
                ..Default::default()
            },
            _ => Instruction {
                pay_url: Some(field("h5_url")?),
                ..Default::default()
            },
        })
    }

    async fn query(&self, out_trade_no: &str, trace: &str) -> Result<TradeState, ProviderError> {
        let path = format!(
            "/v3/pay/transactions/out-trade-no/{out_trade_no}?mchid={}",
            self.keys.mch_id
        );
        let answer = self.call(Method::GET, &path, None, trace).await?;
        if answer.status == 404 && answer.code() == "ORDER_NOT_EXIST" {
            return Ok(TradeState::NotPaid);
        }
        if answer.status != 200 {
            return Err(answer.refused());
        }
        let b = &answer.body;
        if b["out_trade_no"].as_str() != Some(out_trade_no) {
            return Err(ProviderError::Refused("the answer is about another trade".into()));
        }
        Ok(match b["trade_state"].as_str().unwrap_or_default() {
            // REFUND: paid, and refunded since.
            "SUCCESS" | "REFUND" => TradeState::Paid {
                txn_id: b["transaction_id"].as_str().unwrap_or_default().to_string(),
                amount_cents: b["amount"]["total"].as_i64().unwrap_or(-1),
            },
            "USERPAYING" | "ACCEPT" => TradeState::Paying,
            "NOTPAY" | "CLOSED" | "REVOKED" | "PAYERROR" => TradeState::NotPaid,
            other => return Err(ProviderError::Refused(format!("unknown trade_state {other:?}"))),
        })
    }

    async fn close(&self, out_trade_no: &str, trace: &str) -> Result<Closed, ProviderError> {
        let path = format!("/v3/pay/transactions/out-trade-no/{out_trade_no}/close");
        let answer = self
            .call(Method::POST, &path, Some(json!({"mchid": self.keys.mch_id})), trace)
            .await?;
        match (answer.status, answer.code()) {
            (200..=299, _) | (_, "ORDER_NOT_EXIST") | (_, "ORDER_CLOSED") => Ok(Closed::Closed),
            // The member paid meanwhile: only the query says with what.
            (_, "ORDERPAID") => Ok(Closed::NotOpen),
            _ => Err(answer.refused()),
        }
    }

    async fn refund(&self, r: &RefundRequest<'_>) -> Result<RefundState, ProviderError> {
        let mut body = json!({
            "out_trade_no": r.out_trade_no,
            "out_refund_no": r.refund_no,
            "reason": truncate_bytes(r.reason, 80),
            "notify_url": self.notify_url,
            "amount": {"refund": r.amount_cents, "total": r.total_cents, "currency": "CNY"},
        });
        if let Some(txn) = r.provider_txn_id {
            body["transaction_id"] = json!(txn);
        }
        let answer = self
            .call(Method::POST, "/v3/refund/domestic/refunds", Some(body), r.trace_id)
            .await?;
        if answer.status != 200 {
            return Err(answer.refused());
        }
        refund_state(&answer.body, r)
    }

    /// `GET /v3/refund/domestic/refunds/{out_refund_no}`: what became of a refund.
    async fn refund_status(&self, r: &RefundRequest<'_>) -> Result<RefundState, ProviderError> {
        let path = format!("/v3/refund/domestic/refunds/{}", r.refund_no);
        let answer = self.call(Method::GET, &path, None, r.trace_id).await?;
        match (answer.status, answer.code()) {
            (200, _) => refund_state(&answer.body, r),
            (404, "RESOURCE_NOT_EXISTS" | "ORDER_NOT_EXIST") => Ok(RefundState::Unknown),
            _ => Err(answer.refused()),
        }
    }

    /// `GET /v3/bill/tradebill` (signed answer: the SHA1 and a short-lived `download_url`),
    /// then the download itself: a signed request whose answer WeChat does not sign — the SHA1
    /// of the unpacked bill is checked instead, by the reader.
    async fn fetch_bill(
        &self,
        date: chrono::NaiveDate,
        dir: &std::path::Path,
        trace: &str,
    ) -> Result<BillDownload, ProviderError> {
        for _ in 0..3 {
            let path = format!(
                "/v3/bill/tradebill?bill_date={}&bill_type=ALL&tar_type=GZIP",
                date.format("%Y-%m-%d")
            );
            let answer = self.call(Method::GET, &path, None, trace).await?;
            if answer.status != 200 {
                let said = format!(
                    "{} {}",
                    answer.code(),
                    answer.body["message"].as_str().unwrap_or_default()
                );
                return match answer.code() {
                    // A day without any trade has no bill; one being made is not ready.
                    "NO_STATEMENT_EXIST" => Ok(BillDownload::NoBill(said)),
                    "STATEMENT_CREATING" => Ok(BillDownload::NotReady(said)),
                    _ => Err(answer.refused()),
                };
            }
            let (Some(url), Some("SHA1"), Some(sha1)) = (
                answer.body["download_url"].as_str(),
                answer.body["hash_type"].as_str(),
                answer.body["hash_value"].as_str(),
            ) else {
                return Err(ProviderError::Refused(
                    "the bill answer lacks download_url or its SHA1".into(),
                ));
            };
            // The signature covers the URL's path and query as the API sees them.
            let signed_path = url
                .strip_prefix(&self.keys.api_base)
                .map(str::to_string)
                .or_else(|| {
                    reqwest::Url::parse(url)
                        .ok()
                        .map(|u| format!("{}{}", u.path(), u.query().map(|q| format!("?{q}")).unwrap_or_default()))
                })
                .ok_or_else(|| ProviderError::Refused("the download_url is not a URL".into()))?;
            let ts = chrono::Utc::now().timestamp();
            let auth = signing::authorization(&self.merchant(), "GET", &signed_path, ts, &crypto::nonce(32), "");
            let resp = self
                .http
                .get(url)
                .header("Authorization", auth)
                .header("User-Agent", concat!("fitorder/", env!("CARGO_PKG_VERSION")))
                .timeout(DOWNLOAD_TIMEOUT)
                .send()
                .await
                .map_err(|e| unreachable(&e, DOWNLOAD_TIMEOUT))?;
            match resp.status().as_u16() {
                200 => {}
                // The download URL lapsed (it lives seconds to minutes): ask for a new one.
                400 | 403 | 404 => continue,
                other => return Err(ProviderError::Refused(format!("bill download: HTTP {other}"))),
            }
            let archive = dir.join(format!(".wechatpay-{date}.{}.gz.part", crypto::nonce(8)));
            stream_to_file(resp, &archive, DOWNLOAD_TIMEOUT).await?;
            return Ok(BillDownload::Downloaded {
                archive,
                sha1: Some(sha1.to_ascii_lowercase()),
            });
        }
        Err(ProviderError::Refused(
            "the bill's download URL lapsed three times in a row".into(),
        ))
    }

    /// `Wechatpay-Signature` over `timestamp\nnonce\nbody\n` with the key the serial names
    /// (an unknown serial first fetches the certificates, rate-limited), ±5 minutes, then the
    /// AEAD_AES_256_GCM resource with the APIv3 key.
    async fn check_notification(
        &self,
        headers: &reqwest::header::HeaderMap,
        body: &[u8],
        trace: &str,
    ) -> CheckedNotification {
        use crate::{provider::evidence_header, wechat};
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let h = wechat::Headers {
            timestamp: header("wechatpay-timestamp"),
            nonce: header("wechatpay-nonce"),
            signature: header("wechatpay-signature"),
            serial: header("wechatpay-serial"),
        };
        let mut evidence = json!({
            "Wechatpay-Timestamp": evidence_header(h.timestamp), "Wechatpay-Nonce": evidence_header(h.nonce),
            "Wechatpay-Serial": evidence_header(h.serial), "Wechatpay-Signature": evidence_header(h.signature),
        });
        // An unknown serial costs no database work here (see `unknown_serial`): a forged one is
        // refused from memory, a new certificate of WeChat's is fetched by the one refresh.
        if let Some(serial) = h.serial {
            if self.keys.platform.key_for(serial.trim()).is_none() {
                self.unknown_serial(crate::platform_keys::UNKNOWN_SERIAL_WAIT, trace)
                    .await;
            }
        }
        let now = chrono::Utc::now().timestamp();
        let checked = wechat::verify(&self.keys, &h, body, now)
            .and_then(|_| wechat::parse_envelope(body))
            .and_then(|env| {
                let plain = wechat::decrypt(&self.keys.apiv3_key, &env.resource)?;
                let notice = wechat::notice(&self.keys.mch_id, &self.keys.app_ids(), &env.event_type, &plain);
                Ok((env, plain, notice))
            });
        match checked {
            Err(e) => CheckedNotification::Refused {
                malformed: false,
                event_type: None,
                evidence,
                error: e.message(),
            },
            Ok((env, plain, notice)) => {
                evidence["notificationId"] = json!(env.id);
                CheckedNotification::Authentic {
                    event_type: Some(env.event_type),
                    evidence,
                    body: plain,
                    notice: notice.map_err(|e| e.message()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn descriptions_are_cut_at_a_character_boundary() {
        assert_eq!(super::truncate_bytes("私教课", 7), "私教");
        assert_eq!(super::truncate_bytes("abc", 7), "abc");
    }
}
