//! Delivering one outbox event: door access and AI-device access over HTTP, provider refunds
//! through WeChat Pay v3 and Alipay's refund APIs. Whatever has no endpoint configured is
//! recorded as delivered by the built-in simulator.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use rsa::pkcs1v15::SigningKey;
use rsa::signature::{SignatureEncoding, Signer};
use rsa::RsaPrivateKey;
use serde_json::{json, Value};
use sha2::Sha256;

use crate::config::Config;
use crate::db::models::CompensationEvent;
use crate::domain::money::format_yuan;
use crate::payments::keys::ProviderKeys;

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// The downstream accepted it.
    Ok,
    /// No endpoint configured: recorded as delivered by the simulator.
    Simulated,
}

#[derive(Clone)]
pub struct Downstream {
    http: reqwest::Client,
    config: Arc<Config>,
    keys: Arc<ProviderKeys>,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn sign(key: &RsaPrivateKey, message: &[u8]) -> String {
    b64(&SigningKey::<Sha256>::new(key.clone())
        .sign(message)
        .to_bytes())
}

fn nonce() -> String {
    use rand::Rng;
    let bytes: [u8; 16] = rand::rng().random();
    hex::encode(bytes)
}

impl Downstream {
    pub fn new(config: Arc<Config>, keys: Arc<ProviderKeys>) -> Downstream {
        let http = reqwest::Client::builder()
            .timeout(config.downstream_timeout)
            .connect_timeout(config.downstream_timeout)
            .pool_max_idle_per_host(64)
            .build()
            .expect("an HTTP client without TLS always builds");
        Downstream { http, config, keys }
    }

    /// One attempt. `Err` carries what went wrong, for the attempt log.
    pub async fn deliver(&self, e: &CompensationEvent) -> Result<Delivered, String> {
        match e.kind.as_str() {
            "DOOR_ACCESS_GRANT" | "DOOR_ACCESS_REVOKE" => {
                self.access(self.config.door_access_url.as_deref(), e).await
            }
            "AI_ACCESS_GRANT" | "AI_ACCESS_REVOKE" => {
                self.access(self.config.ai_access_url.as_deref(), e).await
            }
            "PROVIDER_REFUND" => self.refund(e).await,
            other => Err(format!("unknown event kind {other}")),
        }
    }

    async fn access(&self, url: Option<&str>, e: &CompensationEvent) -> Result<Delivered, String> {
        let Some(url) = url else {
            return Ok(Delivered::Simulated);
        };
        let p = &e.payload;
        let body = json!({
            "eventId": e.id.to_string(),
            "orderNo": p["orderNo"],
            "memberId": p["memberId"],
            "storeId": p["storeId"],
            "action": p["action"],
            "idempotencyKey": e.idempotency_key,
        });
        let resp = self
            .http
            .post(url)
            .header("X-Trace-Id", &e.trace_id)
            .json(&body)
            .send()
            .await
            .map_err(|err| describe(&err, self.config.downstream_timeout))?;
        check(resp).await.map(|_| Delivered::Ok)
    }

    async fn refund(&self, e: &CompensationEvent) -> Result<Delivered, String> {
        let p = &e.payload;
        match p["provider"].as_str() {
            Some("WECHAT_PAY") => self.wechat_refund(e).await,
            Some("ALIPAY") => self.alipay_refund(e).await,
            other => Err(format!("refund for unknown provider {other:?}")),
        }
    }

    /// `POST /v3/refund/domestic/refunds`, signed with the merchant key (WECHATPAY2-SHA256-RSA2048).
    async fn wechat_refund(&self, e: &CompensationEvent) -> Result<Delivered, String> {
        let (Some(base), Some(w)) = (
            self.config.wechatpay.api_base.as_deref(),
            self.keys.wechat.as_ref(),
        ) else {
            return Ok(Delivered::Simulated);
        };
        let (Some(key), Some(serial)) = (w.merchant_key.as_ref(), w.merchant_serial.as_deref())
        else {
            return Ok(Delivered::Simulated);
        };
        let p = &e.payload;
        let mut body = json!({
            "out_trade_no": p["orderNo"],
            "out_refund_no": p["refundNo"],
            "reason": p["reason"],
            "amount": {"refund": p["amountCents"], "total": p["totalCents"], "currency": "CNY"},
        });
        if let Some(txn) = p["providerTxnId"].as_str() {
            body["transaction_id"] = json!(txn);
        }
        let body = body.to_string();
        let path = "/v3/refund/domestic/refunds";
        let ts = chrono::Utc::now().timestamp();
        let nonce = nonce();
        let signature = sign(
            key,
            format!("POST\n{path}\n{ts}\n{nonce}\n{body}\n").as_bytes(),
        );
        let auth = format!(
            "WECHATPAY2-SHA256-RSA2048 mchid=\"{}\",nonce_str=\"{nonce}\",signature=\"{signature}\",timestamp=\"{ts}\",serial_no=\"{serial}\"",
            w.mch_id
        );
        let resp = self
            .http
            .post(format!("{}{path}", base.trim_end_matches('/')))
            .header("Authorization", auth)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json")
            .header("X-Trace-Id", &e.trace_id)
            .body(body)
            .send()
            .await
            .map_err(|err| describe(&err, self.config.downstream_timeout))?;
        let v = check(resp).await?;
        match v["status"].as_str() {
            Some("SUCCESS") | Some("PROCESSING") => Ok(Delivered::Ok),
            other => Err(format!("refund status {other:?}")),
        }
    }

    /// `alipay.trade.refund` through the gateway, signed RSA2 with the app key.
    async fn alipay_refund(&self, e: &CompensationEvent) -> Result<Delivered, String> {
        let (Some(base), Some(a)) = (
            self.config.alipay.api_base.as_deref(),
            self.keys.alipay.as_ref(),
        ) else {
            return Ok(Delivered::Simulated);
        };
        let Some(key) = a.app_private_key.as_ref() else {
            return Ok(Delivered::Simulated);
        };
        let p = &e.payload;
        let biz = json!({
            "out_trade_no": p["orderNo"],
            "refund_amount": format_yuan(p["amountCents"].as_i64().unwrap_or(0)),
            "out_request_no": p["refundNo"],
            "refund_reason": p["reason"],
        });
        let mut fields: Vec<(String, String)> = vec![
            ("app_id".into(), a.app_id.clone()),
            ("method".into(), "alipay.trade.refund".into()),
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
        let content = crate::payments::alipay::signed_content(&fields);
        fields.push(("sign".into(), sign(key, content.as_bytes())));
        let resp = self
            .http
            .post(base)
            .header("X-Trace-Id", &e.trace_id)
            .form(&fields)
            .send()
            .await
            .map_err(|err| describe(&err, self.config.downstream_timeout))?;
        let v = check(resp).await?;
        let r = &v["alipay_trade_refund_response"];
        match r["code"].as_str() {
            Some("10000") => Ok(Delivered::Ok),
            _ => Err(format!(
                "alipay refused: {} {}",
                r["code"],
                r["sub_msg"].as_str().unwrap_or("")
            )),
        }
    }
}

fn describe(err: &reqwest::Error, timeout: Duration) -> String {
    if err.is_timeout() {
        format!("no answer within {}", humantime::format_duration(timeout))
    } else if err.is_connect() {
        "connection refused".into()
    } else {
        format!("request failed: {err}")
    }
}

/// Any 2xx is success; the body (JSON when there is one) is returned for the caller to read.
async fn check(resp: reqwest::Response) -> Result<Value, String> {
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    if status.is_success() {
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    } else {
        let snippet: String = text.chars().take(200).collect();
        Err(format!("HTTP {}: {snippet}", status.as_u16()))
    }
}
