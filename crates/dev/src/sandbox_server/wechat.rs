//! WeChat Pay API v3 as the sandbox plays it, under `{base}/wechatpay`.
//!
//! Every call must carry `Authorization: WECHATPAY2-SHA256-RSA2048 mchid="…",nonce_str="…",
//! signature="…",timestamp="…",serial_no="…"` with the signature by the merchant key over
//! `METHOD\n/v3/…?query\ntimestamp\nnonce\nbody\n` (the body empty for a GET). Refusals follow
//! WeChat's: 401 `SIGN_ERROR`, 400 `PARAM_ERROR` with a `detail`, 404 `ORDER_NOT_EXIST`, …
//! Every answer, errors and 204s included, is signed over `timestamp\nnonce\nbody\n`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{OriginalUri, Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use std::sync::atomic::Ordering;

use rsa::RsaPrivateKey;

use super::{
    alnum, cashier_url, cert_serial, digits, error_json, platform_certs, rfc3339_cn, rsa_sign, rsa_verify,
    valid_notify_url, Inner, RefundFlow, SandboxCall, SandboxKeys, SandboxNotification, SandboxRefund, SandboxTrade,
    WechatSandbox, WechatSerialMode, WECHAT_PAY,
};

/// How far the Authorization timestamp may be from now.
const MAX_SKEW_SECONDS: i64 = 300;

pub(super) fn router() -> Router<Arc<Inner>> {
    Router::new()
        .route("/v3/pay/transactions/jsapi", post(prepay_jsapi))
        .route("/v3/pay/transactions/native", post(prepay_native))
        .route("/v3/pay/transactions/app", post(prepay_app))
        .route("/v3/pay/transactions/h5", post(prepay_h5))
        .route("/v3/pay/transactions/out-trade-no/{no}", get(query_by_out_trade_no))
        .route("/v3/pay/transactions/id/{id}", get(query_by_transaction_id))
        .route("/v3/pay/transactions/out-trade-no/{no}/close", post(close))
        .route("/v3/refund/domestic/refunds", post(refund))
        .route("/v3/refund/domestic/refunds/{no}", get(refund_query))
        .route("/v3/certificates", get(certificates))
        .route("/v3/bill/tradebill", get(trade_bill))
        .route("/v3/billdownload/file", get(bill_download))
}

// ----- bills -----

/// `GET /v3/bill/tradebill`: the SHA1 and download URL of a day's trade bill.
async fn trade_bill(State(inner): State<Arc<Inner>>, OriginalUri(uri): OriginalUri, headers: HeaderMap) -> Response {
    let req = Req::new(Method::GET, &uri, headers, Bytes::new());
    run(inner, req, "/v3/bill/tradebill", |inner, req| {
        let Some(date) = req
            .query("bill_date")
            .and_then(|d| chrono::NaiveDate::parse_from_str(&d, "%Y-%m-%d").ok())
        else {
            return param_error("bill_date", "bill_date 格式为 YYYY-MM-DD");
        };
        if req.query("tar_type").is_some_and(|t| t != "GZIP") {
            return param_error("tar_type", "tar_type 仅支持 GZIP");
        }
        let prepared = super::bills::prepare(&mut inner.lock(), WECHAT_PAY, date, &inner.keys.mch_id);
        match prepared {
            Ok(super::bills::Bill::NotReady) => fail(StatusCode::BAD_REQUEST, "STATEMENT_CREATING", "账单生成中"),
            Ok(super::bills::Bill::Nothing) => fail(
                StatusCode::BAD_REQUEST,
                "NO_STATEMENT_EXIST",
                "账单不存在，请检查当前商户号在指定日期内是否有成功的交易",
            ),
            Ok(super::bills::Bill::Ready(token, sha1)) => ok(json!({
                "hash_type": "SHA1",
                "hash_value": sha1,
                "download_url": format!("{}/wechatpay/v3/billdownload/file?token={token}", inner.base_url),
            })),
            Err(why) => fail(StatusCode::INTERNAL_SERVER_ERROR, "SYSTEM_ERROR", &why),
        }
    })
    .await
}

/// `GET {download_url}`: the gzip, to a signed request; the answer itself is not signed.
async fn bill_download(State(inner): State<Arc<Inner>>, OriginalUri(uri): OriginalUri, headers: HeaderMap) -> Response {
    let mut req = Req::new(Method::GET, &uri, headers, Bytes::new());
    let verified = authenticate(&inner.keys, &mut req, Utc::now().timestamp());
    let bytes = match &verified {
        Ok(()) => req
            .query("token")
            .and_then(|t| super::bills::take(&mut inner.lock(), WECHAT_PAY, &t)),
        Err(_) => None,
    };
    let (status, code) = match (&verified, &bytes) {
        (Err(_), _) => (StatusCode::UNAUTHORIZED, Some("SIGN_ERROR")),
        (Ok(()), None) => (StatusCode::BAD_REQUEST, Some("INVALID_REQUEST")),
        (Ok(()), Some(_)) => (StatusCode::OK, None),
    };
    inner.record(SandboxCall {
        provider: WECHAT_PAY.into(),
        method: "GET".into(),
        path: req.path_and_query.clone(),
        api: "/v3/billdownload/file".into(),
        verified: verified.is_ok(),
        status: status.as_u16(),
        code: code.map(str::to_string),
    });
    match bytes {
        Some(b) => Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/octet-stream")
            .body(Body::from(b))
            .expect("a valid response"),
        None => {
            let body = match verified {
                Err(why) => error_json("SIGN_ERROR", &format!("签名错误 (sandbox: {why})")),
                Ok(()) => error_json("INVALID_REQUEST", "下载链接已过期，请重新申请账单"),
            };
            Response::builder()
                .status(status)
                .header("content-type", "application/json; charset=utf-8")
                .body(Body::from(body.to_string()))
                .expect("a valid response")
        }
    }
}

/// A received call: what the signature covers.
struct Req {
    method: String,
    /// From `/v3`, with the query.
    path_and_query: String,
    headers: HeaderMap,
    body: String,
    /// The Authorization's `mchid`, once verified.
    mchid: String,
}

impl Req {
    fn new(method: Method, uri: &axum::http::Uri, headers: HeaderMap, body: Bytes) -> Req {
        let full = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let path_and_query = full.strip_prefix("/wechatpay").unwrap_or(full).to_string();
        Req {
            method: method.as_str().to_string(),
            path_and_query,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
            mchid: String::new(),
        }
    }

    fn query(&self, name: &str) -> Option<String> {
        let (_, q) = self.path_and_query.split_once('?')?;
        form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    }
}

/// What a call answers, and what happens after the answer.
struct Outcome {
    status: StatusCode,
    body: Option<Value>,
    after: Option<After>,
}

enum After {
    /// A refund was accepted: its result follows as a notification.
    Refund { out_refund_no: String, flow: RefundFlow },
}

fn ok(body: Value) -> Outcome {
    Outcome {
        status: StatusCode::OK,
        body: Some(body),
        after: None,
    }
}

fn fail(status: StatusCode, code: &str, message: &str) -> Outcome {
    Outcome {
        status,
        body: Some(error_json(code, message)),
        after: None,
    }
}

/// 400 `PARAM_ERROR` naming the field (a JSON pointer) as WeChat's `detail` does.
fn param_error(field: &str, issue: &str) -> Outcome {
    Outcome {
        status: StatusCode::BAD_REQUEST,
        body: Some(json!({
            "code": "PARAM_ERROR",
            "message": format!("参数错误: {issue}"),
            "detail": {"field": field, "location": "body", "issue": issue},
        })),
        after: None,
    }
}

/// Checks the Authorization; on refusal the message says what was wrong.
fn authenticate(keys: &SandboxKeys, req: &mut Req, now: i64) -> Result<(), String> {
    let header = req
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .ok_or("no Authorization header")?;
    let rest = header
        .strip_prefix("WECHATPAY2-SHA256-RSA2048 ")
        .ok_or("the Authorization scheme is not WECHATPAY2-SHA256-RSA2048")?;
    let mut fields: HashMap<&str, &str> = HashMap::new();
    for part in rest.split(',') {
        let (k, v) = part.trim().split_once('=').ok_or("a malformed Authorization field")?;
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .ok_or("an Authorization value is not quoted")?;
        fields.insert(k.trim(), v);
    }
    let need = |k: &str| fields.get(k).copied().ok_or(format!("the Authorization has no {k}"));
    let mchid = need("mchid")?;
    let nonce = need("nonce_str")?;
    let signature = need("signature")?;
    let timestamp = need("timestamp")?;
    let serial = need("serial_no")?;
    let ts: i64 = timestamp
        .parse()
        .map_err(|_| "the Authorization timestamp is not a number")?;
    if (now - ts).abs() > MAX_SKEW_SECONDS {
        return Err("the Authorization timestamp is more than 5 minutes from now".into());
    }
    if mchid != keys.mch_id {
        return Err(format!("mchid {mchid} is not this merchant"));
    }
    if serial != keys.merchant_serial {
        return Err(format!("serial_no {serial} is not the merchant certificate's"));
    }
    let message = format!(
        "{}\n{}\n{timestamp}\n{nonce}\n{}\n",
        req.method, req.path_and_query, req.body
    );
    if !rsa_verify(&keys.merchant_public_key, message.as_bytes(), signature) {
        return Err("the signature does not verify with the merchant key".into());
    }
    req.mchid = mchid.to_string();
    Ok(())
}

/// Authenticates, runs `business`, records the call, answers signed, then runs what follows.
async fn run(inner: Arc<Inner>, mut req: Req, api: &str, business: impl FnOnce(&Inner, &Req) -> Outcome) -> Response {
    let failure = inner.knobs().await;
    let requested = req
        .headers
        .get("wechatpay-serial")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    inner.lock().request_serials.push(requested.clone());
    let verified = authenticate(&inner.keys, &mut req, Utc::now().timestamp());
    let outcome = match (&verified, failure) {
        (Err(why), _) => fail(
            StatusCode::UNAUTHORIZED,
            "SIGN_ERROR",
            &format!("签名错误，请检查后再试 (sandbox: {why})"),
        ),
        (Ok(()), Some(status)) => fail(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            "SYSTEM_ERROR",
            "系统错误",
        ),
        (Ok(()), None) => business(&inner, &req),
    };
    inner.record(SandboxCall {
        provider: WECHAT_PAY.into(),
        method: req.method.clone(),
        path: req.path_and_query.clone(),
        api: api.into(),
        verified: verified.is_ok(),
        status: outcome.status.as_u16(),
        code: outcome
            .body
            .as_ref()
            .and_then(|b| b.get("code"))
            .and_then(|c| c.as_str())
            .map(str::to_string),
    });
    let unsigned = inner.lock().unsigned_errors;
    let response = if unsigned {
        unsigned_error_answer(outcome.status)
    } else {
        answer(&inner, outcome.status, outcome.body.as_ref(), requested.as_deref()).await
    };
    if let Some(After::Refund { out_refund_no, flow }) = outcome.after {
        let inner = inner.clone();
        tokio::spawn(async move {
            match flow {
                RefundFlow::Immediate => {
                    notify_refund(&inner, &out_refund_no).await;
                }
                RefundFlow::Processing => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    finish_refund(&inner, &out_refund_no, "SUCCESS").await;
                }
                RefundFlow::Abnormal => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    finish_refund(&inner, &out_refund_no, "ABNORMAL").await;
                }
                RefundFlow::Hold => {}
            }
        });
    }
    response
}

/// The unsigned-errors mode: `401 SIGN_ERROR` as WeChat Pay answers a request it refused
/// before looking at it, without any `Wechatpay-*` header.
fn unsigned_error_answer(_status: StatusCode) -> Response {
    Response::builder()
        .status(StatusCode::UNAUTHORIZED)
        .header("content-type", "application/json; charset=utf-8")
        .header("Request-ID", format!("08{}", digits(30)))
        .body(Body::from(
            error_json("SIGN_ERROR", "签名错误，请检查后再试").to_string(),
        ))
        .expect("a valid response")
}

/// A signed answer: `Wechatpay-Signature` over `timestamp\nnonce\nbody\n`, by the key the
/// request's `Wechatpay-Serial` names during a key switch.
async fn answer(inner: &Inner, status: StatusCode, body: Option<&Value>, requested: Option<&str>) -> Response {
    let text = body.map(|b| b.to_string()).unwrap_or_default();
    let timestamp = Utc::now().timestamp().to_string();
    let nonce = alnum(32);
    let (key, serial) = inner.wechat_signer(true, requested).await;
    let signature = rsa_sign(&key, format!("{timestamp}\n{nonce}\n{text}\n").as_bytes());
    let mut builder = Response::builder()
        .status(status)
        .header("Wechatpay-Timestamp", timestamp)
        .header("Wechatpay-Nonce", nonce)
        .header("Wechatpay-Signature", signature)
        .header("Wechatpay-Serial", serial)
        .header("Wechatpay-Signature-Type", "WECHATPAY2-SHA256-RSA2048")
        .header("Request-ID", format!("08{}", digits(30)));
    if body.is_some() {
        builder = builder.header("content-type", "application/json; charset=utf-8");
    }
    builder.body(Body::from(text)).expect("a valid response")
}

// ----- prepay -----

async fn prepay_jsapi(s: State<Arc<Inner>>, u: OriginalUri, h: HeaderMap, b: Bytes) -> Response {
    prepay(s, u, h, b, "WECHAT_JSAPI").await
}
async fn prepay_native(s: State<Arc<Inner>>, u: OriginalUri, h: HeaderMap, b: Bytes) -> Response {
    prepay(s, u, h, b, "WECHAT_NATIVE").await
}
async fn prepay_app(s: State<Arc<Inner>>, u: OriginalUri, h: HeaderMap, b: Bytes) -> Response {
    prepay(s, u, h, b, "WECHAT_APP").await
}
async fn prepay_h5(s: State<Arc<Inner>>, u: OriginalUri, h: HeaderMap, b: Bytes) -> Response {
    prepay(s, u, h, b, "WECHAT_H5").await
}

fn api_path(channel: &str) -> &'static str {
    match channel {
        "WECHAT_JSAPI" => "/v3/pay/transactions/jsapi",
        "WECHAT_NATIVE" => "/v3/pay/transactions/native",
        "WECHAT_APP" => "/v3/pay/transactions/app",
        _ => "/v3/pay/transactions/h5",
    }
}

async fn prepay(
    State(inner): State<Arc<Inner>>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    body: Bytes,
    channel: &'static str,
) -> Response {
    let req = Req::new(Method::POST, &uri, headers, body);
    run(inner, req, api_path(channel), |inner, req| {
        prepay_business(inner, req, channel)
    })
    .await
}

fn valid_out_no(no: &str, min: usize, max: usize, extra: &[u8]) -> bool {
    (min..=max).contains(&no.len()) && no.bytes().all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
}

fn prepay_business(inner: &Inner, req: &Req, channel: &'static str) -> Outcome {
    let keys = &inner.keys;
    let Ok(v) = serde_json::from_str::<Value>(&req.body) else {
        return param_error("/", "the body is not JSON");
    };
    let text = |p: &str| v.pointer(p).and_then(|x| x.as_str()).unwrap_or("");
    let appid = text("/appid");
    let mchid = text("/mchid");
    if appid.is_empty() {
        return param_error("/appid", "appid is required");
    }
    if mchid.is_empty() {
        return param_error("/mchid", "mchid is required");
    }
    let expected_appid = if channel == "WECHAT_APP" {
        &keys.wechat_mobile_app_id
    } else {
        &keys.wechat_app_id
    };
    if appid != expected_appid || mchid != keys.mch_id {
        return fail(StatusCode::BAD_REQUEST, "APPID_MCHID_NOT_MATCH", "AppID和mch_id不匹配");
    }
    if mchid != req.mchid {
        return param_error("/mchid", "mchid differs from the Authorization's");
    }
    let description = text("/description");
    if description.is_empty() || description.chars().count() > 127 {
        return param_error("/description", "description must be 1 to 127 characters");
    }
    let out_trade_no = text("/out_trade_no");
    if !valid_out_no(out_trade_no, 6, 32, b"_-|*") {
        return param_error("/out_trade_no", "out_trade_no must be 6 to 32 of 0-9 a-z A-Z _ - | *");
    }
    let time_expire_text = text("/time_expire");
    let Ok(time_expire) = DateTime::parse_from_rfc3339(time_expire_text) else {
        return param_error(
            "/time_expire",
            "time_expire must be RFC 3339 (yyyy-MM-DDTHH:mm:ss+TIMEZONE); the fitorder contract requires it on every trade",
        );
    };
    let time_expire = time_expire.with_timezone(&Utc);
    if time_expire <= Utc::now() {
        return param_error("/time_expire", "time_expire is in the past");
    }
    let notify_url = text("/notify_url");
    if !valid_notify_url(notify_url) {
        return param_error("/notify_url", "notify_url must be an http(s) URL without a query");
    }
    let Some(total) = v.pointer("/amount/total").and_then(|t| t.as_i64()).filter(|t| *t >= 1) else {
        return param_error(
            "/amount/total",
            "amount.total must be a whole number of fen, at least 1",
        );
    };
    if v.pointer("/amount/currency").is_some_and(|c| c.as_str() != Some("CNY")) {
        return param_error("/amount/currency", "currency must be CNY");
    }
    let openid = text("/payer/openid");
    if channel == "WECHAT_JSAPI" && openid.is_empty() {
        return param_error("/payer/openid", "payer.openid is required for JSAPI");
    }
    if channel == "WECHAT_H5"
        && (text("/scene_info/payer_client_ip").is_empty() || text("/scene_info/h5_info/type").is_empty())
    {
        return param_error(
            "/scene_info",
            "scene_info.payer_client_ip and scene_info.h5_info.type are required for H5",
        );
    }
    let fingerprint = json!([channel, appid, description, total, time_expire_text, notify_url, openid]).to_string();
    let cashier = cashier_url(&inner.base_url, WECHAT_PAY, out_trade_no);
    let mut s = inner.lock();
    let key = (WECHAT_PAY, out_trade_no.to_string());
    let prepay_id = match s.trades.get(&key) {
        Some(t) if t.fingerprint != fingerprint => {
            return fail(StatusCode::BAD_REQUEST, "INVALID_REQUEST", "201 商户订单号重复");
        }
        Some(t) if matches!(t.state.as_str(), "SUCCESS" | "REFUND") => {
            return fail(StatusCode::BAD_REQUEST, "ORDERPAID", "该订单已支付");
        }
        Some(t) if !matches!(t.state.as_str(), "NOTPAY" | "USERPAYING") => {
            return fail(StatusCode::BAD_REQUEST, "ORDER_CLOSED", "订单已关闭");
        }
        Some(t) => t.prepay_id.clone().unwrap_or_default(),
        None => {
            let prepay_id = format!("wx{}{}", Utc::now().format("%d%H%M%S"), alnum(24).to_lowercase());
            s.trades.insert(
                key,
                SandboxTrade {
                    provider: WECHAT_PAY.into(),
                    channel: channel.into(),
                    out_trade_no: out_trade_no.into(),
                    amount_cents: total,
                    description: description.into(),
                    time_expire,
                    time_expire_text: time_expire_text.into(),
                    notify_url: notify_url.into(),
                    created_at: Utc::now(),
                    state: "NOTPAY".into(),
                    exists_at_provider: true,
                    txn_id: None,
                    paid_at: None,
                    prepay_id: Some(prepay_id.clone()),
                    payer_openid: (!openid.is_empty()).then(|| openid.to_string()),
                    payer_client_ip: Some(text("/scene_info/payer_client_ip"))
                        .filter(|ip| !ip.is_empty())
                        .map(str::to_string),
                    refunds: vec![],
                    cashier_url: cashier.clone(),
                    fingerprint,
                },
            );
            prepay_id
        }
    };
    match channel {
        "WECHAT_NATIVE" => ok(json!({ "code_url": cashier })),
        "WECHAT_H5" => ok(json!({ "h5_url": format!("{cashier}?prepay_id={prepay_id}") })),
        _ => ok(json!({ "prepay_id": prepay_id })),
    }
}

// ----- query and close -----

fn trade_type(channel: &str) -> &'static str {
    match channel {
        "WECHAT_JSAPI" => "JSAPI",
        "WECHAT_NATIVE" => "NATIVE",
        "WECHAT_APP" => "APP",
        _ => "MWEB",
    }
}

fn state_desc(state: &str) -> &'static str {
    match state {
        "SUCCESS" => "支付成功",
        "REFUND" => "转入退款",
        "NOTPAY" => "订单未支付",
        "CLOSED" => "订单已关闭",
        "USERPAYING" => "用户支付中",
        "PAYERROR" => "支付失败",
        "REVOKED" => "已撤销",
        _ => "",
    }
}

/// The transaction as the query answers it and the payment notification carries it.
pub(super) fn transaction_resource(keys: &SandboxKeys, t: &SandboxTrade) -> Value {
    let mut v = json!({
        "appid": if t.channel == "WECHAT_APP" { &keys.wechat_mobile_app_id } else { &keys.wechat_app_id },
        "mchid": keys.mch_id,
        "out_trade_no": t.out_trade_no,
        "trade_type": trade_type(&t.channel),
        "trade_state": t.state,
        "trade_state_desc": state_desc(&t.state),
        "attach": "",
        "amount": {"total": t.amount_cents, "currency": "CNY", "payer_currency": "CNY"},
    });
    if let (Some(txn), Some(paid_at)) = (&t.txn_id, t.paid_at) {
        v["transaction_id"] = json!(txn);
        v["bank_type"] = json!("OTHERS");
        v["success_time"] = json!(rfc3339_cn(paid_at));
        v["payer"] = json!({"openid": t.payer_openid.clone().unwrap_or_else(|| "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o".into())});
        v["amount"]["payer_total"] = json!(t.amount_cents);
    }
    v
}

fn check_mchid_query(inner: &Inner, req: &Req) -> Option<Outcome> {
    match req.query("mchid") {
        Some(m) if m == inner.keys.mch_id => None,
        Some(_) => Some(fail(
            StatusCode::BAD_REQUEST,
            "PARAM_ERROR",
            "mchid 与请求的商户号不一致",
        )),
        None => Some(fail(StatusCode::BAD_REQUEST, "PARAM_ERROR", "缺少参数 mchid")),
    }
}

async fn query_by_out_trade_no(
    State(inner): State<Arc<Inner>>,
    Path(no): Path<String>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
) -> Response {
    let req = Req::new(Method::GET, &uri, headers, Bytes::new());
    run(
        inner,
        req,
        "/v3/pay/transactions/out-trade-no/{out_trade_no}",
        |inner, req| {
            if let Some(refused) = check_mchid_query(inner, req) {
                return refused;
            }
            match inner.lock().trades.get(&(WECHAT_PAY, no)) {
                Some(t) => ok(transaction_resource(&inner.keys, t)),
                None => fail(StatusCode::NOT_FOUND, "ORDER_NOT_EXIST", "订单不存在"),
            }
        },
    )
    .await
}

async fn query_by_transaction_id(
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
) -> Response {
    let req = Req::new(Method::GET, &uri, headers, Bytes::new());
    run(inner, req, "/v3/pay/transactions/id/{transaction_id}", |inner, req| {
        if let Some(refused) = check_mchid_query(inner, req) {
            return refused;
        }
        let s = inner.lock();
        let found = s
            .trades
            .values()
            .find(|t| t.provider == WECHAT_PAY && t.txn_id.as_deref() == Some(id.as_str()));
        match found {
            Some(t) => ok(transaction_resource(&inner.keys, t)),
            None => fail(StatusCode::NOT_FOUND, "ORDER_NOT_EXIST", "订单不存在"),
        }
    })
    .await
}

async fn close(
    State(inner): State<Arc<Inner>>,
    Path(no): Path<String>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = Req::new(Method::POST, &uri, headers, body);
    // The deadline race: the member pays just before the close arrives.
    let notify_paid = super::paid_before_close(&inner, WECHAT_PAY, &no);
    let later = (inner.clone(), no.clone());
    let answered = run(
        inner,
        req,
        "/v3/pay/transactions/out-trade-no/{out_trade_no}/close",
        |inner, req| {
            let mchid = serde_json::from_str::<Value>(&req.body)
                .ok()
                .and_then(|v| v.get("mchid").and_then(|m| m.as_str()).map(str::to_string));
            if mchid.as_deref() != Some(inner.keys.mch_id.as_str()) {
                return param_error("/mchid", "mchid is required and must be this merchant's");
            }
            let mut s = inner.lock();
            let Some(t) = s.trades.get_mut(&(WECHAT_PAY, no)) else {
                return fail(StatusCode::NOT_FOUND, "ORDER_NOT_EXIST", "订单不存在");
            };
            if matches!(t.state.as_str(), "SUCCESS" | "REFUND") {
                return fail(StatusCode::BAD_REQUEST, "ORDERPAID", "订单已支付");
            }
            t.state = "CLOSED".into();
            Outcome {
                status: StatusCode::NO_CONTENT,
                body: None,
                after: None,
            }
        },
    )
    .await;
    if notify_paid == Some(true) {
        super::notify_paid_later(later.0, WECHAT_PAY, later.1);
    }
    answered
}

// ----- refunds -----

fn refund_json(t: &SandboxTrade, r: &SandboxRefund) -> Value {
    let mut v = json!({
        "refund_id": r.refund_id,
        "out_refund_no": r.out_refund_no,
        "transaction_id": t.txn_id,
        "out_trade_no": t.out_trade_no,
        "channel": "ORIGINAL",
        "user_received_account": "支付用户零钱",
        "create_time": rfc3339_cn(r.created_at),
        "status": r.status,
        "funds_account": "AVAILABLE",
        "amount": {
            "total": t.amount_cents, "refund": r.amount_cents,
            "payer_total": t.amount_cents, "payer_refund": r.amount_cents,
            "settlement_total": t.amount_cents, "settlement_refund": r.amount_cents,
            "discount_refund": 0, "refund_fee": 0, "currency": "CNY",
        },
        "promotion_detail": [],
    });
    if let Some(at) = r.success_time {
        v["success_time"] = json!(rfc3339_cn(at));
    }
    v
}

/// The resource of a `REFUND.*` notification.
fn refund_resource(keys: &SandboxKeys, t: &SandboxTrade, r: &SandboxRefund) -> Value {
    let mut v = json!({
        "mchid": keys.mch_id,
        "out_trade_no": t.out_trade_no,
        "transaction_id": t.txn_id,
        "out_refund_no": r.out_refund_no,
        "refund_id": r.refund_id,
        "refund_status": r.status,
        "user_received_account": "支付用户零钱",
        "amount": {"total": t.amount_cents, "refund": r.amount_cents,
                   "payer_total": t.amount_cents, "payer_refund": r.amount_cents},
    });
    if let Some(at) = r.success_time {
        v["success_time"] = json!(rfc3339_cn(at));
    }
    v
}

async fn refund(
    State(inner): State<Arc<Inner>>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = Req::new(Method::POST, &uri, headers, body);
    run(inner, req, "/v3/refund/domestic/refunds", refund_business).await
}

fn refund_business(inner: &Inner, req: &Req) -> Outcome {
    let Ok(v) = serde_json::from_str::<Value>(&req.body) else {
        return param_error("/", "the body is not JSON");
    };
    let text = |p: &str| v.pointer(p).and_then(|x| x.as_str()).unwrap_or("").to_string();
    let out_refund_no = text("/out_refund_no");
    if !valid_out_no(&out_refund_no, 1, 64, b"_-|*@") {
        return param_error(
            "/out_refund_no",
            "out_refund_no must be 1 to 64 of 0-9 a-z A-Z _ - | * @",
        );
    }
    let notify_url = text("/notify_url");
    if !notify_url.is_empty() && !valid_notify_url(&notify_url) {
        return param_error("/notify_url", "notify_url must be an http(s) URL without a query");
    }
    let Some(refund) = v.pointer("/amount/refund").and_then(|t| t.as_i64()).filter(|t| *t >= 1) else {
        return param_error(
            "/amount/refund",
            "amount.refund must be a whole number of fen, at least 1",
        );
    };
    let Some(total) = v.pointer("/amount/total").and_then(|t| t.as_i64()) else {
        return param_error("/amount/total", "amount.total is required");
    };
    if text("/amount/currency") != "CNY" {
        return param_error("/amount/currency", "amount.currency is required and must be CNY");
    }
    let out_trade_no = text("/out_trade_no");
    let transaction_id = text("/transaction_id");
    if out_trade_no.is_empty() && transaction_id.is_empty() {
        return param_error("/out_trade_no", "out_trade_no or transaction_id is required");
    }
    let flow = inner.lock().refund_flow;
    let mut s = inner.lock();
    let trade = s.trades.values_mut().find(|t| {
        t.provider == WECHAT_PAY
            && if out_trade_no.is_empty() {
                t.txn_id.as_deref() == Some(transaction_id.as_str())
            } else {
                t.out_trade_no == out_trade_no
            }
    });
    let Some(t) = trade else {
        return fail(StatusCode::NOT_FOUND, "RESOURCE_NOT_EXISTS", "订单不存在");
    };
    if let Some(r) = t.refunds.iter().find(|r| r.out_refund_no == out_refund_no) {
        if r.amount_cents != refund {
            return fail(
                StatusCode::BAD_REQUEST,
                "INVALID_REQUEST",
                "同一退款单号的退款金额不一致",
            );
        }
        return ok(refund_json(t, r));
    }
    if !matches!(t.state.as_str(), "SUCCESS" | "REFUND") {
        return fail(StatusCode::BAD_REQUEST, "INVALID_REQUEST", "订单未支付，不能退款");
    }
    if total != t.amount_cents {
        return fail(
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            "订单金额与实际支付金额不一致",
        );
    }
    let refunded: i64 = t
        .refunds
        .iter()
        .filter(|r| !matches!(r.status.as_str(), "ABNORMAL" | "CLOSED"))
        .map(|r| r.amount_cents)
        .sum();
    if refunded + refund > t.amount_cents {
        return fail(
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            "申请退款金额超过订单可退金额",
        );
    }
    let now = Utc::now();
    let r = SandboxRefund {
        out_refund_no: out_refund_no.clone(),
        refund_id: format!("503{}", digits(26)),
        amount_cents: refund,
        status: if flow == RefundFlow::Immediate {
            "SUCCESS".into()
        } else {
            "PROCESSING".into()
        },
        notify_url: (!notify_url.is_empty()).then_some(notify_url),
        created_at: now,
        success_time: (flow == RefundFlow::Immediate).then_some(now),
    };
    let answer = refund_json(t, &r);
    t.refunds.push(r);
    t.state = "REFUND".into();
    Outcome {
        status: StatusCode::OK,
        body: Some(answer),
        after: Some(After::Refund { out_refund_no, flow }),
    }
}

async fn refund_query(
    State(inner): State<Arc<Inner>>,
    Path(no): Path<String>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
) -> Response {
    let req = Req::new(Method::GET, &uri, headers, Bytes::new());
    run(inner, req, "/v3/refund/domestic/refunds/{out_refund_no}", |inner, _| {
        let s = inner.lock();
        let found = s.trades.values().filter(|t| t.provider == WECHAT_PAY).find_map(|t| {
            t.refunds
                .iter()
                .find(|r| r.out_refund_no == no)
                .map(|r| refund_json(t, r))
        });
        match found {
            Some(v) => ok(v),
            None => fail(StatusCode::NOT_FOUND, "RESOURCE_NOT_EXISTS", "退款单不存在"),
        }
    })
    .await
}

/// Ends refund `out_refund_no` with `status` and sends its notification.
pub(super) async fn finish_refund(inner: &Inner, out_refund_no: &str, status: &str) -> Option<SandboxNotification> {
    settle_refund(inner, out_refund_no, status)?;
    notify_refund(inner, out_refund_no).await
}

/// Ends refund `out_refund_no` with `status`, without a notification.
pub(super) fn settle_refund(inner: &Inner, out_refund_no: &str, status: &str) -> Option<()> {
    let mut s = inner.lock();
    let r = s
        .trades
        .values_mut()
        .filter(|t| t.provider == WECHAT_PAY)
        .find_map(|t| t.refunds.iter_mut().find(|r| r.out_refund_no == out_refund_no))?;
    r.status = status.to_string();
    if status == "SUCCESS" {
        r.success_time = Some(Utc::now());
    }
    Some(())
}

/// Sends `REFUND.<status>` for refund `out_refund_no` to its notify_url (or the trade's).
async fn notify_refund(inner: &Inner, out_refund_no: &str) -> Option<SandboxNotification> {
    let (t, r) = {
        let s = inner.lock();
        s.trades.values().filter(|t| t.provider == WECHAT_PAY).find_map(|t| {
            t.refunds
                .iter()
                .find(|r| r.out_refund_no == out_refund_no)
                .map(|r| (t.clone(), r.clone()))
        })?
    };
    let url = r.notify_url.clone().unwrap_or_else(|| t.notify_url.clone());
    let resource = refund_resource(&inner.keys, &t, &r);
    Some(
        inner
            .notify_wechat(&t.out_trade_no, &url, &format!("REFUND.{}", r.status), &resource)
            .await,
    )
}

/// `GET /v3/certificates`: the platform certificate, encrypted with the APIv3 key
/// (AEAD_AES_256_GCM, associated data `certificate`), as WeChat Pay lists them.
async fn certificates(State(inner): State<Arc<Inner>>, OriginalUri(uri): OriginalUri, headers: HeaderMap) -> Response {
    let req = Req::new(Method::GET, &uri, headers, Bytes::new());
    let certs = inner.listed_certs().await;
    run(inner, req, "/v3/certificates", move |inner, _| {
        let listed = certs.and_then(|certs| {
            let pairs: Vec<(&str, &str)> = certs.iter().map(|(s, p)| (s.as_str(), p.as_str())).collect();
            super::platform_certs::encrypt_certificates_answer(&inner.keys.apiv3_key, &pairs).map_err(|e| e.to_string())
        });
        match listed.map(|body| serde_json::from_str::<Value>(&body)) {
            Ok(Ok(v)) => ok(v),
            _ => fail(StatusCode::INTERNAL_SERVER_ERROR, "SYSTEM_ERROR", "系统错误"),
        }
    })
    .await
}

/// The sandbox's WeChat Pay side of its memory: which key and serial sign, and the notifications.
impl Inner {
    /// The `Wechatpay-Serial` of the next answer or notification.
    pub(super) fn wechat_serial(&self) -> String {
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
    pub(super) async fn wechat_signer(&self, answer: bool, requested: Option<&str>) -> (RsaPrivateKey, String) {
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
    pub(super) async fn switch_cert(&self) -> Result<(RsaPrivateKey, String, String), String> {
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
    pub(super) async fn listed_certs(&self) -> Result<Vec<(String, String)>, String> {
        let mut certs = vec![self.platform_cert().await?];
        if self.lock().key_switch {
            let (_, serial, pem) = self.switch_cert().await?;
            certs.push((serial, pem));
        }
        Ok(certs)
    }

    /// POSTs a signed WeChat Pay notification.
    pub(super) async fn notify_wechat(
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
        self.deliver(
            WECHAT_PAY,
            out_trade_no,
            event_type,
            url,
            req.body(n.body),
            |status, _reply| (200..300).contains(&status),
        )
        .await
    }
}
