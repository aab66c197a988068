//! Calls fitorder makes to the providers: refunds (from the outbox worker), and before an
//! online order expires, a query for a late payment and a close of the trade. WeChat Pay v3
//! calls are signed `WECHATPAY2-SHA256-RSA2048` with the merchant key; Alipay gateway calls RSA2
//! with the app key. A provider without an API base URL or private key is simulated.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use rsa::pkcs1v15::SigningKey;
use rsa::signature::{SignatureEncoding, Signer};
use rsa::RsaPrivateKey;
use serde_json::{json, Value};
use sha2::Sha256;

use super::keys::{AlipayKeys, ProviderKeys, WechatKeys};
use crate::config::Config;
use crate::domain::money::{format_yuan, parse_yuan};

/// What a call achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Called {
    Done,
    /// Nothing configured to call: recorded as done by the simulator.
    Simulated,
}

/// What the provider says about a trade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TradeState {
    Paid {
        txn_id: String,
        amount_cents: i64,
    },
    NotPaid,
    /// No API configured: nothing to ask.
    Unknown,
}

pub struct RefundRequest<'a> {
    pub provider: &'a str,
    pub out_trade_no: &'a str,
    pub refund_no: &'a str,
    pub provider_txn_id: Option<&'a str>,
    pub amount_cents: i64,
    pub total_cents: i64,
    pub reason: &'a str,
    pub trace_id: &'a str,
}

#[derive(Clone)]
pub struct ProviderApi {
    http: reqwest::Client,
    config: Arc<Config>,
    keys: Arc<ProviderKeys>,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn sign(key: &RsaPrivateKey, message: &[u8]) -> String {
    b64(&SigningKey::<Sha256>::new(key.clone()).sign(message).to_bytes())
}

fn nonce() -> String {
    use rand::Rng;
    let bytes: [u8; 16] = rand::rng().random();
    hex::encode(bytes)
}

pub fn describe(err: &reqwest::Error, timeout: Duration) -> String {
    if err.is_timeout() {
        format!("no answer within {}", humantime::format_duration(timeout))
    } else if err.is_connect() {
        "connection refused".into()
    } else {
        format!("request failed: {err}")
    }
}

/// Any 2xx is success; the body (JSON when there is one) is returned to the caller.
pub async fn check(resp: reqwest::Response) -> Result<Value, String> {
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    if status.is_success() {
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    } else {
        let snippet: String = text.chars().take(200).collect();
        Err(format!("HTTP {}: {snippet}", status.as_u16()))
    }
}

/// The pieces a WeChat Pay API call needs, when all are configured.
struct Wechat<'a> {
    base: &'a str,
    keys: &'a WechatKeys,
    key: &'a RsaPrivateKey,
    serial: &'a str,
}

struct Alipay<'a> {
    gateway: &'a str,
    keys: &'a AlipayKeys,
    key: &'a RsaPrivateKey,
}

impl ProviderApi {
    pub fn new(config: Arc<Config>, keys: Arc<ProviderKeys>) -> ProviderApi {
        let http = reqwest::Client::builder()
            .timeout(config.downstream_timeout)
            .connect_timeout(config.downstream_timeout)
            .pool_max_idle_per_host(64)
            .build()
            .expect("an HTTP client without TLS always builds");
        ProviderApi { http, config, keys }
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    fn wechat(&self) -> Option<Wechat<'_>> {
        let keys = self.keys.wechat.as_ref()?;
        Some(Wechat {
            base: self.config.wechatpay.api_base.as_deref()?.trim_end_matches('/'),
            key: keys.merchant_key.as_ref()?,
            serial: keys.merchant_serial.as_deref()?,
            keys,
        })
    }

    fn alipay(&self) -> Option<Alipay<'_>> {
        let keys = self.keys.alipay.as_ref()?;
        Some(Alipay {
            gateway: self.config.alipay.api_base.as_deref()?,
            key: keys.app_private_key.as_ref()?,
            keys,
        })
    }

    /// Whether `provider`'s API can be called (otherwise its calls are simulated).
    pub fn configured(&self, provider: &str) -> bool {
        match provider {
            "WECHAT_PAY" => self.wechat().is_some(),
            "ALIPAY" => self.alipay().is_some(),
            _ => false,
        }
    }

    async fn wechat_call(
        &self,
        w: &Wechat<'_>,
        method: &str,
        path: &str,
        body: Option<String>,
        trace: &str,
    ) -> Result<Value, String> {
        let ts = chrono::Utc::now().timestamp();
        let nonce = nonce();
        let payload = body.clone().unwrap_or_default();
        let signature = sign(
            w.key,
            format!("{method}\n{path}\n{ts}\n{nonce}\n{payload}\n").as_bytes(),
        );
        let auth = format!(
            "WECHATPAY2-SHA256-RSA2048 mchid=\"{}\",nonce_str=\"{nonce}\",signature=\"{signature}\",timestamp=\"{ts}\",serial_no=\"{}\"",
            w.keys.mch_id, w.serial
        );
        let url = format!("{}{path}", w.base);
        let req = match method {
            "GET" => self.http.get(url),
            _ => self
                .http
                .post(url)
                .header("Content-Type", "application/json")
                .body(payload),
        };
        let resp = req
            .header("Authorization", auth)
            .header("Accept", "application/json")
            .header("X-Trace-Id", trace)
            .send()
            .await
            .map_err(|e| describe(&e, self.config.downstream_timeout))?;
        check(resp).await
    }

    async fn alipay_call(&self, a: &Alipay<'_>, method: &str, biz: Value, trace: &str) -> Result<Value, String> {
        let mut fields: Vec<(String, String)> = vec![
            ("app_id".into(), a.keys.app_id.clone()),
            ("method".into(), method.into()),
            ("format".into(), "JSON".into()),
            ("charset".into(), "utf-8".into()),
            ("sign_type".into(), "RSA2".into()),
            (
                "timestamp".into(),
                chrono::Utc::now()
                    .with_timezone(&chrono_tz::Asia::Shanghai)
                    .format("%Y-%m-%d %H:%M:%S")
                    .to_string(),
            ),
            ("version".into(), "1.0".into()),
            ("biz_content".into(), biz.to_string()),
        ];
        super::alipay::gateway::sign_params(a.key, &mut fields);
        let resp = self
            .http
            .post(a.gateway)
            .header("X-Trace-Id", trace)
            .form(&fields)
            .send()
            .await
            .map_err(|e| describe(&e, self.config.downstream_timeout))?;
        let v = check(resp).await?;
        let key = format!("{}_response", method.replace('.', "_"));
        Ok(v[key].clone())
    }

    /// Sends money back to the payer. Both providers deduplicate by the refund number, so a
    /// retried refund is never paid twice.
    pub async fn refund(&self, r: &RefundRequest<'_>) -> Result<Called, String> {
        match r.provider {
            "WECHAT_PAY" => {
                let Some(w) = self.wechat() else {
                    return Ok(Called::Simulated);
                };
                let mut body = json!({
                    "out_trade_no": r.out_trade_no,
                    "out_refund_no": r.refund_no,
                    "reason": r.reason,
                    "amount": {"refund": r.amount_cents, "total": r.total_cents, "currency": "CNY"},
                });
                if let Some(txn) = r.provider_txn_id {
                    body["transaction_id"] = json!(txn);
                }
                let v = self
                    .wechat_call(
                        &w,
                        "POST",
                        "/v3/refund/domestic/refunds",
                        Some(body.to_string()),
                        r.trace_id,
                    )
                    .await?;
                match v["status"].as_str() {
                    Some("SUCCESS") | Some("PROCESSING") => Ok(Called::Done),
                    other => Err(format!("refund status {other:?}")),
                }
            }
            "ALIPAY" => {
                let Some(a) = self.alipay() else {
                    return Ok(Called::Simulated);
                };
                let biz = json!({
                    "out_trade_no": r.out_trade_no,
                    "refund_amount": format_yuan(r.amount_cents),
                    "out_request_no": r.refund_no,
                    "refund_reason": r.reason,
                });
                let v = self.alipay_call(&a, "alipay.trade.refund", biz, r.trace_id).await?;
                match v["code"].as_str() {
                    Some("10000") => Ok(Called::Done),
                    _ => Err(format!(
                        "alipay refused: {} {}",
                        v["code"],
                        v["sub_msg"].as_str().unwrap_or("")
                    )),
                }
            }
            other => Err(format!("refund for unknown provider {other}")),
        }
    }

    /// Asks whether `out_trade_no` was paid (a callback may be late or lost).
    pub async fn query(&self, provider: &str, out_trade_no: &str, trace: &str) -> Result<TradeState, String> {
        match provider {
            "WECHAT_PAY" => {
                let Some(w) = self.wechat() else {
                    return Ok(TradeState::Unknown);
                };
                let path = format!(
                    "/v3/pay/transactions/out-trade-no/{out_trade_no}?mchid={}",
                    w.keys.mch_id
                );
                match self.wechat_call(&w, "GET", &path, None, trace).await {
                    Ok(v) if v["trade_state"] == "SUCCESS" => Ok(TradeState::Paid {
                        txn_id: v["transaction_id"].as_str().unwrap_or_default().to_string(),
                        amount_cents: v["amount"]["total"].as_i64().unwrap_or(-1),
                    }),
                    Ok(_) => Ok(TradeState::NotPaid),
                    Err(e) if e.contains("ORDER_NOT_EXIST") || e.starts_with("HTTP 404") => Ok(TradeState::NotPaid),
                    Err(e) => Err(e),
                }
            }
            "ALIPAY" => {
                let Some(a) = self.alipay() else {
                    return Ok(TradeState::Unknown);
                };
                let v = self
                    .alipay_call(&a, "alipay.trade.query", json!({"out_trade_no": out_trade_no}), trace)
                    .await?;
                match (v["code"].as_str(), v["trade_status"].as_str()) {
                    (Some("10000"), Some("TRADE_SUCCESS" | "TRADE_FINISHED")) => Ok(TradeState::Paid {
                        txn_id: v["trade_no"].as_str().unwrap_or_default().to_string(),
                        amount_cents: v["total_amount"].as_str().and_then(parse_yuan).unwrap_or(-1),
                    }),
                    (Some("10000"), _) => Ok(TradeState::NotPaid),
                    (_, _) if v["sub_code"] == "ACQ.TRADE_NOT_EXIST" => Ok(TradeState::NotPaid),
                    _ => Err(format!(
                        "alipay query failed: {} {}",
                        v["code"],
                        v["sub_msg"].as_str().unwrap_or("")
                    )),
                }
            }
            _ => Ok(TradeState::Unknown),
        }
    }

    /// Closes the trade so that it cannot be paid any more (before the order is canceled).
    pub async fn close(&self, provider: &str, out_trade_no: &str, trace: &str) -> Result<Called, String> {
        match provider {
            "WECHAT_PAY" => {
                let Some(w) = self.wechat() else {
                    return Ok(Called::Simulated);
                };
                let path = format!("/v3/pay/transactions/out-trade-no/{out_trade_no}/close");
                let body = json!({"mchid": w.keys.mch_id}).to_string();
                self.wechat_call(&w, "POST", &path, Some(body), trace)
                    .await
                    .map(|_| Called::Done)
            }
            "ALIPAY" => {
                let Some(a) = self.alipay() else {
                    return Ok(Called::Simulated);
                };
                let v = self
                    .alipay_call(&a, "alipay.trade.close", json!({"out_trade_no": out_trade_no}), trace)
                    .await?;
                match v["code"].as_str() {
                    Some("10000") => Ok(Called::Done),
                    _ if v["sub_code"] == "ACQ.TRADE_NOT_EXIST" => Ok(Called::Done),
                    _ => Err(format!(
                        "alipay close failed: {} {}",
                        v["code"],
                        v["sub_msg"].as_str().unwrap_or("")
                    )),
                }
            }
            _ => Ok(Called::Simulated),
        }
    }
}
