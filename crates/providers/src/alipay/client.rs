//! Alipay's open gateway as a [`Gateway`]: `alipay.trade.precreate` (QR), the locally signed
//! `alipay.trade.app.pay` order string and `alipay.trade.wap.pay` page, query, close and
//! refund. Requests are signed RSA2 with the app key over every non-empty parameter but `sign`;
//! an answer counts only when its `sign` verifies over the exact `<method>_response` text (and,
//! in certificate mode, it names the configured Alipay certificate).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::gateway;
use crate::domain::money::{format_yuan, parse_yuan};
use crate::domain::payment::{PayChannel, Provider};
use crate::keys::AlipayKeys;
use crate::provider::*;

pub struct Alipay {
    http: reqwest::Client,
    keys: Arc<AlipayKeys>,
    notify_url: String,
    timeout: Duration,
    /// Certificate mode: where renewed Alipay certificates are kept for every instance.
    pool: Option<crate::db::DbPool>,
}

/// The method that hands out an Alipay public-key certificate by its SN.
pub const CERT_DOWNLOAD_METHOD: &str = "alipay.open.app.alipaycert.download";

impl Alipay {
    pub fn new(
        http: reqwest::Client,
        keys: Arc<AlipayKeys>,
        public_url: &str,
        timeout: Duration,
        pool: Option<crate::db::DbPool>,
    ) -> Alipay {
        Alipay {
            http,
            keys,
            notify_url: format!("{public_url}{}", super::NOTIFY_PATH),
            timeout,
            pool,
        }
    }

    /// The common parameters of a request for `method`, signed, with `biz` as `biz_content`.
    pub fn signed_params(&self, method: &str, biz: &Value, notify: bool) -> Vec<(String, String)> {
        let k = &self.keys;
        let mut params: Vec<(String, String)> = vec![
            ("app_id".into(), k.app_id.clone()),
            ("method".into(), method.into()),
            ("format".into(), "JSON".into()),
            ("charset".into(), "utf-8".into()),
            ("sign_type".into(), "RSA2".into()),
            ("timestamp".into(), alipay_time(chrono::Utc::now())),
            ("version".into(), "1.0".into()),
        ];
        if notify {
            params.push(("notify_url".into(), self.notify_url.clone()));
        }
        if let Some(sns) = &k.cert {
            params.push(("app_cert_sn".into(), sns.app_cert_sn.clone()));
            params.push(("alipay_root_cert_sn".into(), sns.alipay_root_cert_sn.clone()));
        }
        params.push(("biz_content".into(), biz.to_string()));
        gateway::sign_params(&k.app_private_key, &mut params);
        params
    }

    /// One gateway call; returns the verified `<method>_response` object. In certificate mode
    /// an answer naming another `alipay_cert_sn` (a renewal) is verified with that certificate,
    /// once it is known and chains to `ALIPAY_ROOT_CERT`.
    async fn call(&self, method: &str, biz: Value, notify: bool, trace: &str) -> Result<Value, ProviderError> {
        let text = self.post(method, &biz, notify, trace).await?;
        let sn = self.keys.cert.as_ref().map(|c| c.alipay_cert_sn.as_str());
        match gateway::verify_answer(&self.keys.public_key, sn, method, &text) {
            Ok(v) => Ok(v),
            Err(gateway::AnswerError::WrongCertificate { got, .. }) => {
                let key =
                    self.renewed_key(&got, trace)
                        .await
                        .map_err(|e| match unsigned_error_answer(method, &text) {
                            Some(answer) => answer,
                            None => e,
                        })?;
                gateway::verify_answer(&key, Some(&got), method, &text)
                    .map_err(|e| ProviderError::Unsigned(e.to_string()))
            }
            Err(e) => {
                Err(unsigned_error_answer(method, &text).unwrap_or_else(|| ProviderError::Unsigned(e.to_string())))
            }
        }
    }

    /// The key of a renewed Alipay certificate: known, stored by another instance, or
    /// downloaded now — rate-limited in memory before any of that costs anything.
    async fn renewed_key(&self, sn: &str, trace: &str) -> Result<rsa::RsaPublicKey, ProviderError> {
        use super::certs::UnknownSnStep;
        if let Some(key) = self.keys.renewed.key_for(sn) {
            return Ok(key);
        }
        let unknown = || {
            ProviderError::Unsigned(format!(
                "the answer names Alipay certificate {sn}, which is not known (yet)"
            ))
        };
        let (Some(pool), Some(root)) = (&self.pool, &self.keys.root_cert_pem) else {
            return Err(unknown());
        };
        let step = self.keys.renewed.unknown_sn_step(chrono::Utc::now());
        if step == UnknownSnStep::Nothing {
            return Err(unknown());
        }
        let db = |e: &dyn std::fmt::Display| ProviderError::Unreachable(format!("database: {e}"));
        {
            let mut conn = pool.get().await.map_err(|e| db(&e))?;
            super::certs::reload(&mut conn, &self.keys.renewed, root, chrono::Utc::now())
                .await
                .map_err(|e| db(&format!("{e:#}")))?;
        }
        if let Some(key) = self.keys.renewed.key_for(sn) {
            return Ok(key);
        }
        if step != UnknownSnStep::LookupThenDownload {
            return Err(unknown());
        }
        let cert = self.download_cert(sn, root, trace).await?;
        let mut conn = pool.get().await.map_err(|e| db(&e))?;
        super::certs::store(&mut conn, &cert)
            .await
            .map_err(|e| db(&format!("{e:#}")))?;
        tracing::info!(alipay_cert_sn = sn, not_after = %cert.not_after, "a renewed Alipay certificate was downloaded, checked against ALIPAY_ROOT_CERT and stored");
        let key = cert.public_key.clone();
        self.keys.renewed.insert(cert);
        Ok(key)
    }

    /// `alipay.open.app.alipaycert.download`: the certificate `sn` names, checked against the
    /// root file (refused unless it chains to it), with that very SN, its answer signed by it (or
    /// by the configured certificate).
    async fn download_cert(
        &self,
        sn: &str,
        root: &str,
        trace: &str,
    ) -> Result<super::certs::RenewedCert, ProviderError> {
        let text = self
            .post(CERT_DOWNLOAD_METHOD, &json!({"alipay_cert_sn": sn}), false, trace)
            .await?;
        let refused = |why: String| ProviderError::Unsigned(format!("{CERT_DOWNLOAD_METHOD}: {why}"));
        let fields: Value = serde_json::from_str(&text).map_err(|_| refused("not the gateway's JSON".into()))?;
        let name = format!("{}_response", CERT_DOWNLOAD_METHOD.replace('.', "_"));
        let content = fields[&name]["alipay_cert_content"].as_str().filter(|c| !c.is_empty());
        let Some(content) = content else {
            return Err(unsigned_error_answer(CERT_DOWNLOAD_METHOD, &text)
                .unwrap_or_else(|| refused("the answer has no alipay_cert_content".into())));
        };
        use base64::Engine;
        let pem = base64::engine::general_purpose::STANDARD
            .decode(content.split_whitespace().collect::<String>())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_else(|| content.to_string());
        let cert = super::certs::check(&pem, root, chrono::Utc::now()).map_err(|e| {
            tracing::error!(alipay_cert_sn = sn, error = %e, "a downloaded Alipay certificate was refused");
            refused(format!("the certificate for {sn} was refused: {e}"))
        })?;
        if cert.sn != sn {
            return Err(refused(format!("asked for certificate {sn}, got {}", cert.sn)));
        }
        let configured = self.keys.cert.as_ref().map(|c| c.alipay_cert_sn.as_str());
        let answer_sn = fields["alipay_cert_sn"].as_str().unwrap_or(sn);
        let key = if Some(answer_sn) == configured {
            &self.keys.public_key
        } else {
            &cert.public_key
        };
        gateway::verify_answer(key, Some(answer_sn), CERT_DOWNLOAD_METHOD, &text)
            .map_err(|e| refused(e.to_string()))?;
        Ok(cert)
    }

    /// One gateway request; the answer's text as received.
    async fn post(&self, method: &str, biz: &Value, notify: bool, trace: &str) -> Result<String, ProviderError> {
        let params = self.signed_params(method, biz, notify);
        let resp = self
            .http
            .post(&self.keys.api_base)
            // The whole call's limit (FITORDER_PROVIDER_TIMEOUT); the shared client's own is
            // the downstream calls'.
            .timeout(self.timeout)
            .header("X-Trace-Id", trace)
            .header("Content-Type", "application/x-www-form-urlencoded;charset=utf-8")
            .body(gateway::encode(&params))
            .send()
            .await
            .map_err(|e| unreachable(&e, self.timeout))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| unreachable(&e, self.timeout))?;
        if !status.is_success() {
            return Err(ProviderError::Refused(format!("HTTP {}", status.as_u16())));
        }
        Ok(text)
    }

    fn order_biz(&self, t: &TradeRequest<'_>, product_code: Option<&str>) -> Value {
        let mut biz = json!({
            "out_trade_no": t.out_trade_no,
            "total_amount": format_yuan(t.amount_cents),
            "subject": t.description.chars().take(128).collect::<String>(),
            "time_expire": alipay_time(t.expires_at),
        });
        if let Some(code) = product_code {
            biz["product_code"] = json!(code);
        }
        biz
    }
}

/// Downloads (a bill) may take minutes; gateway calls have the downstream timeout.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(600);

/// An answer that does not verify but is an error in the gateway's words — an
/// `error_response`, or the method's response with a code other than 10000 (`isv.*`: a
/// signature, app id or certificate mistake): still no answer, but reported with its codes.
fn unsigned_error_answer(method: &str, text: &str) -> Option<ProviderError> {
    let fields: Value = serde_json::from_str(text).ok()?;
    let name = format!("{}_response", method.replace('.', "_"));
    let r = fields.get("error_response").or_else(|| fields.get(&name))?;
    let code = r["code"].as_str().unwrap_or_default();
    if code.is_empty() || code == "10000" {
        return None;
    }
    let sub_code = r["sub_code"].as_str().unwrap_or_default();
    let e = unsigned_error(
        200,
        &format!("{code} {sub_code}"),
        r["sub_msg"].as_str().or(r["msg"].as_str()).unwrap_or_default(),
    );
    tracing::warn!(method, error = %e, "Alipay answered an error without a valid signature");
    Some(e)
}

fn refused(v: &Value) -> ProviderError {
    ProviderError::Refused(format!(
        "{} {} {}",
        v["code"].as_str().unwrap_or_default(),
        v["sub_code"].as_str().unwrap_or_default(),
        v["sub_msg"].as_str().or(v["msg"].as_str()).unwrap_or_default()
    ))
}

impl Alipay {
    fn verify_notification(&self, fields: &[(String, String)]) -> Result<(), crate::alipay::AlipayError> {
        let mut keys = vec![self.keys.public_key.clone()];
        keys.extend(self.keys.renewed.keys());
        crate::alipay::verify_with(&self.keys, &keys, fields)
    }

    /// Loads the renewed certificates other instances stored (at most every few seconds);
    /// true when it looked.
    async fn reload_renewed(&self) -> bool {
        let (Some(pool), Some(root)) = (&self.pool, &self.keys.root_cert_pem) else {
            return false;
        };
        if self.keys.renewed.unknown_sn_step(chrono::Utc::now()) == super::certs::UnknownSnStep::Nothing {
            return false;
        }
        let Ok(mut conn) = pool.get().await else { return false };
        super::certs::reload(&mut conn, &self.keys.renewed, root, chrono::Utc::now())
            .await
            .is_ok()
    }
}

#[async_trait::async_trait]
impl Gateway for Alipay {
    fn provider(&self) -> Provider {
        Provider::Alipay
    }

    async fn start_trade(&self, t: &TradeRequest<'_>) -> Result<Instruction, ProviderError> {
        match t.channel {
            PayChannel::AlipayQr => {
                let v = self
                    .call("alipay.trade.precreate", self.order_biz(t, None), true, t.trace_id)
                    .await?;
                match (v["code"].as_str(), v["qr_code"].as_str()) {
                    (Some("10000"), Some(qr)) if !qr.is_empty() => Ok(Instruction {
                        qr_code: Some(qr.to_string()),
                        ..Default::default()
                    }),
                    _ => Err(refused(&v)),
                }
            }
            PayChannel::AlipayApp => {
                let params = self.signed_params(
                    "alipay.trade.app.pay",
                    &self.order_biz(t, Some("QUICK_MSECURITY_PAY")),
                    true,
                );
                Ok(Instruction {
                    alipay_order_string: Some(gateway::encode(&params)),
                    ..Default::default()
                })
            }
            PayChannel::AlipayWap => {
                let params =
                    self.signed_params("alipay.trade.wap.pay", &self.order_biz(t, Some("QUICK_WAP_WAY")), true);
                let sep = if self.keys.api_base.contains('?') { '&' } else { '?' };
                Ok(Instruction {
                    pay_url: Some(format!("{}{sep}{}", self.keys.api_base, gateway::encode(&params))),
                    ..Default::default()
                })
            }
            other => Err(ProviderError::Unsupported(format!("Alipay has no channel {other}"))),
        }
    }

    async fn query(&self, out_trade_no: &str, trace: &str) -> Result<TradeState, ProviderError> {
        let v = self
            .call(
                "alipay.trade.query",
                json!({"out_trade_no": out_trade_no}),
                false,
                trace,
            )
            .await?;
        if v["sub_code"] == "ACQ.TRADE_NOT_EXIST" {
            return Ok(TradeState::NotPaid);
        }
        if v["code"] != "10000" {
            return Err(refused(&v));
        }
        if v["out_trade_no"].as_str() != Some(out_trade_no) {
            return Err(ProviderError::Refused("the answer is about another trade".into()));
        }
        let paid = || TradeState::Paid {
            txn_id: v["trade_no"].as_str().unwrap_or_default().to_string(),
            amount_cents: v["total_amount"].as_str().and_then(parse_yuan).unwrap_or(-1),
        };
        let refunded = v["refund_fee"].as_str().and_then(parse_yuan).is_some_and(|c| c > 0)
            || v["send_pay_date"].as_str().is_some_and(|d| !d.is_empty());
        Ok(match v["trade_status"].as_str().unwrap_or_default() {
            "TRADE_SUCCESS" | "TRADE_FINISHED" => paid(),
            // Closed after a full refund: it was paid. Closed unpaid (timeout): not paid.
            "TRADE_CLOSED" if refunded => paid(),
            "TRADE_CLOSED" | "WAIT_BUYER_PAY" => TradeState::NotPaid,
            other => return Err(ProviderError::Refused(format!("unknown trade_status {other:?}"))),
        })
    }

    async fn close(&self, out_trade_no: &str, trace: &str) -> Result<Closed, ProviderError> {
        let v = self
            .call(
                "alipay.trade.close",
                json!({"out_trade_no": out_trade_no}),
                false,
                trace,
            )
            .await?;
        if v["code"] == "10000" || v["sub_code"] == "ACQ.TRADE_NOT_EXIST" {
            return Ok(Closed::Closed);
        }
        match v["sub_code"].as_str() {
            // Only a trade waiting for the buyer closes: paid meanwhile (or closed already), as
            // the query will say.
            Some("ACQ.TRADE_STATUS_ERROR" | "ACQ.TRADE_HAS_SUCCESS") => Ok(Closed::NotOpen),
            _ => Err(refused(&v)),
        }
    }

    /// `alipay.trade.refund`: done when the money moved (`fund_change` `Y`). `N` says nothing
    /// moved with this request (a repeated one, or money not moved yet): then the refund query
    /// decides.
    async fn refund(&self, r: &RefundRequest<'_>) -> Result<RefundState, ProviderError> {
        let biz = json!({
            "out_trade_no": r.out_trade_no,
            "refund_amount": format_yuan(r.amount_cents),
            "out_request_no": r.refund_no,
            "refund_reason": r.reason,
        });
        let v = self.call("alipay.trade.refund", biz, false, r.trace_id).await?;
        if v["code"] != "10000" {
            return Err(refused(&v));
        }
        if v["out_trade_no"].as_str().is_some_and(|no| no != r.out_trade_no) {
            return Err(ProviderError::Refused("the answer is about another trade".into()));
        }
        if v["fund_change"] == "Y" {
            return Ok(RefundState::Done {
                provider_refund_id: v["trade_no"].as_str().map(str::to_string),
            });
        }
        match self.refund_status(r).await? {
            RefundState::Unknown => Ok(RefundState::Pending {
                status: format!("fund_change {}", v["fund_change"].as_str().unwrap_or("missing")),
                provider_refund_id: v["trade_no"].as_str().map(str::to_string),
                recheck_in: None,
            }),
            done => Ok(done),
        }
    }

    /// `alipay.trade.fastpay.refund.query`: `REFUND_SUCCESS` is done; an answer without
    /// `refund_status` means the refund was not received or did not go through ("未返回该字段
    /// 表示退款请求未收到或者退款失败").
    async fn refund_status(&self, r: &RefundRequest<'_>) -> Result<RefundState, ProviderError> {
        let v = self
            .call(
                "alipay.trade.fastpay.refund.query",
                json!({"out_trade_no": r.out_trade_no, "out_request_no": r.refund_no}),
                false,
                r.trace_id,
            )
            .await?;
        if v["sub_code"] == "ACQ.TRADE_NOT_EXIST" {
            return Ok(RefundState::Unknown);
        }
        if v["code"] != "10000" {
            return Err(refused(&v));
        }
        if v["refund_status"] != "REFUND_SUCCESS" {
            return Ok(RefundState::Unknown);
        }
        let about = |name: &str, ours: &str| v[name].as_str().is_some_and(|x| x != ours);
        if about("out_trade_no", r.out_trade_no) || about("out_request_no", r.refund_no) {
            return Err(ProviderError::Refused("the answer is about another refund".into()));
        }
        let amount = v["refund_amount"].as_str().and_then(parse_yuan);
        if amount != Some(r.amount_cents) {
            return Err(ProviderError::Refused(format!(
                "the refund {} is of {}, fitorder asked for {}",
                r.refund_no,
                v["refund_amount"].as_str().unwrap_or("nothing"),
                format_yuan(r.amount_cents)
            )));
        }
        Ok(RefundState::Done {
            provider_refund_id: v["trade_no"].as_str().map(str::to_string),
        })
    }

    /// `alipay.data.dataservice.bill.downloadurl.query` (signed answer with a URL that lives
    /// about 30 s), then the zip from that URL.
    async fn fetch_bill(
        &self,
        date: chrono::NaiveDate,
        dir: &std::path::Path,
        trace: &str,
    ) -> Result<BillDownload, ProviderError> {
        for _ in 0..3 {
            let biz = json!({"bill_type": "trade", "bill_date": date.format("%Y-%m-%d").to_string()});
            let v = self
                .call("alipay.data.dataservice.bill.downloadurl.query", biz, false, trace)
                .await?;
            if v["code"] != "10000" {
                return match v["sub_code"].as_str() {
                    Some("isp.bill_not_exist") => Ok(BillDownload::NoBill(format!(
                        "isp.bill_not_exist {}",
                        v["sub_msg"].as_str().unwrap_or_default()
                    ))),
                    _ => Err(refused(&v)),
                };
            }
            let url = v["bill_download_url"]
                .as_str()
                .filter(|u| !u.is_empty())
                .ok_or_else(|| ProviderError::Refused("the answer has no bill_download_url".into()))?;
            let resp = self
                .http
                .get(url)
                .timeout(DOWNLOAD_TIMEOUT)
                .send()
                .await
                .map_err(|e| unreachable(&e, DOWNLOAD_TIMEOUT))?;
            if !resp.status().is_success() {
                // The URL lapsed: ask for a new one.
                continue;
            }
            let archive = dir.join(format!(".alipay-{date}.{}.zip.part", crate::crypto::nonce(8)));
            stream_to_file(resp, &archive, DOWNLOAD_TIMEOUT).await?;
            // An expired link answers an error page, not a zip.
            let mut magic = [0u8; 2];
            let is_zip = std::fs::File::open(&archive)
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
                .is_ok()
                && &magic == b"PK";
            if !is_zip {
                let _ = std::fs::remove_file(&archive);
                continue;
            }
            return Ok(BillDownload::Downloaded { archive, sha1: None });
        }
        Err(ProviderError::Refused(
            "the bill's download URL lapsed three times in a row".into(),
        ))
    }

    /// The form's RSA2 `sign` over every other non-empty field but `sign_type`, with the Alipay
    /// public key, and the app id. Certificate mode: also with the renewed certificates (a
    /// notification names none, unless it carries `alipay_cert_sn`); when none verifies, the
    /// stored ones are reloaded (rate-limited) and tried once more.
    async fn check_notification(
        &self,
        _headers: &reqwest::header::HeaderMap,
        body: &[u8],
        trace: &str,
    ) -> CheckedNotification {
        use crate::alipay;
        use crate::provider::{evidence_header, evidence_text};
        let fields = match alipay::parse_form(body) {
            Ok(f) => f,
            Err(e) => {
                return CheckedNotification::Refused {
                    malformed: true,
                    event_type: None,
                    evidence: json!({}),
                    error: e.message(),
                }
            }
        };
        let evidence = json!({"notify_id": evidence_header(alipay::field(&fields, "notify_id")),
                              "notify_time": evidence_header(alipay::field(&fields, "notify_time")),
                              "app_id": evidence_header(alipay::field(&fields, "app_id"))});
        let event_type = alipay::field(&fields, "trade_status").map(|e| evidence_text(e.as_bytes(), Some(64)));
        let mut verified = self.verify_notification(&fields);
        if verified == Err(alipay::AlipayError::BadSignature) && self.keys.cert.is_some() {
            let named = alipay::field(&fields, "alipay_cert_sn").filter(|sn| !sn.is_empty());
            let configured = self.keys.cert.as_ref().map(|c| c.alipay_cert_sn.as_str());
            let learned = match named {
                Some(sn) if Some(sn) != configured => self.renewed_key(sn, trace).await.is_ok(),
                _ => self.reload_renewed().await,
            };
            if learned {
                verified = self.verify_notification(&fields);
            }
        }
        if let Err(e) = verified {
            return CheckedNotification::Refused {
                malformed: false,
                event_type,
                evidence,
                error: e.message(),
            };
        }
        CheckedNotification::Authentic {
            event_type,
            evidence,
            body: evidence_text(body, None),
            notice: alipay::notice(&fields).map_err(|e| e.message()),
        }
    }
}
