//! The Alipay open gateway as the sandbox plays it: `{base}/alipay/gateway.do` and
//! `{base}/alipay/app-pay`.
//!
//! A request is its common parameters (`app_id`, `method`, `charset`, `sign_type`, `timestamp`,
//! `version`, `notify_url`, `biz_content`, `sign`), from the query, a form body or both, as the
//! SDKs send them. `sign` is RSA2 by the app key over every other non-empty parameter, sorted
//! by key, `k=v` joined with `&` (`sign_type` included). An answer is
//! `{"<method>_response":{…},"sign":"…"}`, the sign over the exact text of the response object.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{OriginalUri, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use chrono::{DateTime, NaiveDateTime, TimeZone, Utc};
use serde_json::{json, Value};

use std::sync::atomic::Ordering;

use super::{
    alipay_trade_no, cashier, cashier_url, parse_yuan, rsa_sign, rsa_verify, shanghai, valid_notify_url, yuan,
    AlipayRefundFlow, AlipaySandbox, Inner, SandboxCall, SandboxNotification, SandboxRefund, SandboxTrade, ALIPAY,
};

pub(super) const BUYER_ID: &str = "2088102177846880";
pub(super) const BUYER_LOGON_ID: &str = "159****5620";
pub(super) const SELLER_ID: &str = "2088101106499364";

/// How far a request's `timestamp` may be from now.
const MAX_SKEW_SECONDS: i64 = 15 * 60;

pub(super) fn router() -> Router<Arc<Inner>> {
    Router::new()
        .route("/gateway.do", get(gateway).post(gateway))
        .route("/app-pay", post(app_pay))
        .route("/downloadBillFile.resource", get(bill_download))
}

type Params = Vec<(String, String)>;

fn param<'a>(params: &'a Params, name: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}

/// The string a request's `sign` covers.
fn sign_content(params: &Params) -> String {
    let mut pairs: Vec<&(String, String)> = params.iter().filter(|(k, v)| k != "sign" && !v.is_empty()).collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    let parts: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    parts.join("&")
}

/// A refusal: the gateway's code, msg, sub_code and sub_msg.
struct Refusal {
    code: &'static str,
    msg: &'static str,
    sub_code: String,
    sub_msg: String,
}

fn missing(sub_code: &str, sub_msg: &str) -> Refusal {
    Refusal {
        code: "40001",
        msg: "Missing Required Arguments",
        sub_code: sub_code.into(),
        sub_msg: sub_msg.into(),
    }
}

fn invalid(sub_code: &str, sub_msg: &str) -> Refusal {
    Refusal {
        code: "40002",
        msg: "Invalid Arguments",
        sub_code: sub_code.into(),
        sub_msg: sub_msg.into(),
    }
}

fn business(sub_code: &str, sub_msg: &str) -> Refusal {
    Refusal {
        code: "40004",
        msg: "Business Failed",
        sub_code: sub_code.into(),
        sub_msg: sub_msg.into(),
    }
}

const METHODS: &[&str] = &[
    "alipay.trade.precreate",
    "alipay.trade.query",
    "alipay.trade.close",
    "alipay.trade.refund",
    "alipay.trade.fastpay.refund.query",
    "alipay.trade.wap.pay",
    "alipay.data.dataservice.bill.downloadurl.query",
];

/// Checks the common parameters and the signature; the method name on success. The gateway's
/// own calls must be recent; a page URL or an app order string is signed when the order is
/// placed and used later, so only its timestamp's form is checked.
fn authenticate(inner: &Inner, params: &Params, allowed: &[&str]) -> Result<String, Refusal> {
    let method = param(params, "method").ok_or_else(|| missing("isv.missing-method", "缺少方法名参数"))?;
    if !allowed.contains(&method) {
        return Err(invalid("isv.invalid-method", "不存在的方法名"));
    }
    let app_id = param(params, "app_id").ok_or_else(|| missing("isv.missing-app-id", "缺少AppID参数"))?;
    if app_id != inner.keys.alipay_app_id {
        return Err(invalid("isv.invalid-app-id", "无效的AppID参数"));
    }
    let sign_type =
        param(params, "sign_type").ok_or_else(|| missing("isv.missing-signature-type", "缺少签名类型参数"))?;
    if sign_type != "RSA2" {
        return Err(invalid(
            "isv.invalid-signature-type",
            "无效的签名类型参数 (the sandbox takes RSA2)",
        ));
    }
    let sign = param(params, "sign").ok_or_else(|| missing("isv.missing-signature", "缺少签名参数"))?;
    match param(params, "charset") {
        Some(c) if c.eq_ignore_ascii_case("utf-8") => {}
        Some(_) => return Err(invalid("isv.invalid-charset", "字符集错误 (the sandbox takes utf-8)")),
        None => return Err(missing("isv.missing-charset", "缺少字符集参数")),
    }
    let timestamp = param(params, "timestamp").ok_or_else(|| missing("isv.missing-timestamp", "缺少时间戳参数"))?;
    let Some(at) = parse_shanghai(timestamp) else {
        return Err(invalid(
            "isv.invalid-timestamp",
            "非法的时间戳参数 (yyyy-MM-dd HH:mm:ss, Asia/Shanghai)",
        ));
    };
    let client_side = matches!(method, "alipay.trade.wap.pay" | "alipay.trade.app.pay");
    if !client_side && (Utc::now() - at).num_seconds().abs() > MAX_SKEW_SECONDS {
        return Err(invalid(
            "isv.invalid-timestamp",
            "非法的时间戳参数 (more than 15 minutes from now)",
        ));
    }
    match param(params, "version") {
        Some("1.0") => {}
        Some(_) => return Err(invalid("isv.invalid-version", "版本号错误")),
        None => return Err(missing("isv.missing-version", "缺少版本参数")),
    }
    if param(params, "format").is_some_and(|f| !f.eq_ignore_ascii_case("json")) {
        return Err(invalid("isv.invalid-format", "无效的数据格式参数"));
    }
    let content = sign_content(params);
    if !rsa_verify(&inner.keys.app_public_key, content.as_bytes(), sign) {
        return Err(invalid(
            "isv.invalid-signature",
            &format!("验签出错，建议检查签名字符串或签名私钥与应用公钥是否匹配，网关生成的验签字符串为：{content}"),
        ));
    }
    Ok(method.to_string())
}

fn parse_shanghai(text: &str) -> Option<DateTime<Utc>> {
    let naive = NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S").ok()?;
    chrono_tz::Asia::Shanghai
        .from_local_datetime(&naive)
        .single()
        .map(|t| t.with_timezone(&Utc))
}

/// The query's and the form body's parameters; None when one name has two values.
fn read_params(uri: &axum::http::Uri, headers: &HeaderMap, body: &[u8]) -> Option<Params> {
    let mut params: Params = uri
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let is_form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.to_ascii_lowercase().starts_with("application/x-www-form-urlencoded"));
    if is_form || (!body.is_empty() && params.is_empty()) {
        for (k, v) in form_urlencoded::parse(body).into_owned() {
            match params.iter().find(|(ek, _)| *ek == k) {
                Some((_, ev)) if *ev != v => return None,
                Some(_) => {}
                None => params.push((k, v)),
            }
        }
    }
    Some(params)
}

/// `{"<method>_response": response, "sign": …}` signed over the response's exact text.
async fn answer(inner: &Inner, method: &str, response: &Value, signed: bool) -> Response {
    let name = if METHODS.contains(&method) {
        format!("{}_response", method.replace('.', "_"))
    } else {
        "error_response".to_string()
    };
    let text = response.to_string();
    let body = if signed {
        let key = inner.answer_key(ALIPAY).await;
        let sign = rsa_sign(&key, text.as_bytes());
        format!("{{\"{name}\":{text},\"sign\":\"{sign}\"}}")
    } else {
        format!("{{\"{name}\":{text}}}")
    };
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json;charset=utf-8")],
        body,
    )
        .into_response()
}

fn refusal_json(r: &Refusal) -> Value {
    json!({"code": r.code, "msg": r.msg, "sub_code": r.sub_code, "sub_msg": r.sub_msg})
}

fn record(inner: &Inner, method: &str, path: &str, api: &str, verified: bool, code: Option<String>) {
    inner.record(SandboxCall {
        provider: ALIPAY.into(),
        method: method.into(),
        path: path.into(),
        api: api.into(),
        verified,
        status: 200,
        code,
    });
}

async fn gateway(
    State(inner): State<Arc<Inner>>,
    http_method: axum::http::Method,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let failure = inner.knobs().await;
    let Some(params) = read_params(&uri, &headers, &body) else {
        let r = invalid(
            "isv.invalid-parameter",
            "参数无效 (a parameter has two different values)",
        );
        record(
            &inner,
            http_method.as_str(),
            "/alipay/gateway.do",
            "",
            false,
            Some(r.sub_code.clone()),
        );
        return answer(&inner, "", &refusal_json(&r), false).await;
    };
    let api = param(&params, "method").unwrap_or_default().to_string();
    let method = match authenticate(&inner, &params, METHODS) {
        Ok(m) => m,
        Err(r) => {
            record(
                &inner,
                http_method.as_str(),
                "/alipay/gateway.do",
                &api,
                false,
                Some(r.sub_code.clone()),
            );
            if api == "alipay.trade.wap.pay" {
                return cashier::error_page(StatusCode::BAD_REQUEST, &r.sub_code, &r.sub_msg);
            }
            return answer(&inner, &api, &refusal_json(&r), false).await;
        }
    };
    if inner.lock().unsigned_errors && method != "alipay.trade.wap.pay" {
        // As the gateway answers a request whose signature it refused: no `sign`.
        let r = invalid(
            "isv.invalid-signature",
            "验签出错，建议检查签名字符串或签名私钥与应用公钥是否匹配",
        );
        record(
            &inner,
            http_method.as_str(),
            "/alipay/gateway.do",
            &api,
            false,
            Some(r.sub_code.clone()),
        );
        return answer(&inner, &method, &refusal_json(&r), false).await;
    }
    if failure.is_some() {
        let r = Refusal {
            code: "20000",
            msg: "Service Currently Unavailable",
            sub_code: "isp.unknow-error".into(),
            sub_msg: "系统繁忙".into(),
        };
        record(
            &inner,
            http_method.as_str(),
            "/alipay/gateway.do",
            &api,
            true,
            Some(r.sub_code.clone()),
        );
        if method == "alipay.trade.wap.pay" {
            return cashier::error_page(StatusCode::SERVICE_UNAVAILABLE, &r.sub_code, &r.sub_msg);
        }
        return answer(&inner, &method, &refusal_json(&r), true).await;
    }
    let biz: Value = match param(&params, "biz_content").map(serde_json::from_str::<Value>) {
        Some(Ok(v)) if v.is_object() => v,
        Some(_) => {
            let r = invalid("isv.invalid-parameter", "biz_content 不是 JSON 对象");
            return refused(&inner, http_method.as_str(), &method, r).await;
        }
        None => {
            let r = missing("isv.missing-parameter", "缺少必选参数 biz_content");
            return refused(&inner, http_method.as_str(), &method, r).await;
        }
    };
    let result = match method.as_str() {
        "alipay.trade.precreate" => precreate(&inner, &params, &biz),
        "alipay.trade.wap.pay" => {
            let opened = open_trade(&inner, &params, &biz, "ALIPAY_WAP");
            record(
                &inner,
                http_method.as_str(),
                "/alipay/gateway.do",
                &method,
                true,
                opened.as_ref().err().map(|r| r.sub_code.clone()),
            );
            return match opened {
                Ok(t) => cashier::page(&inner, &t),
                Err(r) => cashier::error_page(StatusCode::BAD_REQUEST, &r.sub_code, &r.sub_msg),
            };
        }
        "alipay.trade.query" => query(&inner, &biz),
        "alipay.trade.close" => {
            // The deadline race: the member pays just before the close arrives.
            let no = text(&biz, "out_trade_no").to_string();
            if super::paid_before_close(&inner, ALIPAY, &no) == Some(true) {
                super::notify_paid_later(inner.clone(), ALIPAY, no);
            }
            close(&inner, &biz)
        }
        "alipay.trade.refund" => refund(&inner, &biz),
        "alipay.data.dataservice.bill.downloadurl.query" => bill_query(&inner, &biz),
        _ => refund_query(&inner, &biz),
    };
    match result {
        Ok((response, after)) => {
            record(&inner, http_method.as_str(), "/alipay/gateway.do", &method, true, None);
            let answered = answer(&inner, &method, &response, true).await;
            if let Some(no) = after {
                let inner = inner.clone();
                tokio::spawn(async move {
                    match no.strip_prefix(LATER) {
                        Some(out_request_no) => {
                            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                            finish_refund(&inner, out_request_no).await;
                        }
                        None => {
                            notify_refund(&inner, &no).await;
                        }
                    }
                });
            }
            answered
        }
        Err(r) => refused(&inner, http_method.as_str(), &method, r).await,
    }
}

/// A verified request refused for its content: signed, as business answers are.
async fn refused(inner: &Inner, http_method: &str, method: &str, r: Refusal) -> Response {
    record(
        inner,
        http_method,
        "/alipay/gateway.do",
        method,
        true,
        Some(r.sub_code.clone()),
    );
    answer(inner, method, &refusal_json(&r), true).await
}

/// `POST {base}/alipay/app-pay` with an `alipay.trade.app.pay` order string, as the Alipay app
/// submits it: verified, the trade recorded, then 303 to its cashier page.
async fn app_pay(State(inner): State<Arc<Inner>>, body: Bytes) -> Response {
    let params: Params = form_urlencoded::parse(&body).into_owned().collect();
    let checked = authenticate(&inner, &params, &["alipay.trade.app.pay"]).and_then(|_| {
        let biz: Value = param(&params, "biz_content")
            .and_then(|b| serde_json::from_str(b).ok())
            .filter(Value::is_object)
            .ok_or_else(|| invalid("isv.invalid-parameter", "biz_content 不是 JSON 对象"))?;
        open_trade(&inner, &params, &biz, "ALIPAY_APP")
    });
    inner.record(SandboxCall {
        provider: ALIPAY.into(),
        method: "POST".into(),
        path: "/alipay/app-pay".into(),
        api: param(&params, "method").unwrap_or_default().into(),
        verified: !matches!(&checked, Err(r) if r.code == "40001" || r.code == "40002"),
        status: if checked.is_ok() { 303 } else { 400 },
        code: checked.as_ref().err().map(|r| r.sub_code.clone()),
    });
    match checked {
        Ok(t) => (StatusCode::SEE_OTHER, [(header::LOCATION, t.cashier_url)]).into_response(),
        Err(r) => cashier::error_page(StatusCode::BAD_REQUEST, &r.sub_code, &r.sub_msg),
    }
}

fn amount_of(biz: &Value, name: &str) -> Option<i64> {
    match biz.get(name)? {
        Value::String(s) => parse_yuan(s),
        Value::Number(n) => parse_yuan(&n.to_string()),
        _ => None,
    }
}

fn text<'a>(biz: &'a Value, name: &str) -> &'a str {
    biz.get(name).and_then(|v| v.as_str()).unwrap_or("")
}

/// Validates a new trade's `biz_content` and opens it (or finds the same one again).
fn open_trade(inner: &Inner, params: &Params, biz: &Value, channel: &str) -> Result<SandboxTrade, Refusal> {
    let bad = |what: &str| business("ACQ.INVALID_PARAMETER", &format!("参数无效: {what}"));
    let out_trade_no = text(biz, "out_trade_no");
    if out_trade_no.is_empty()
        || out_trade_no.len() > 64
        || !out_trade_no
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-|*".contains(&b))
    {
        return Err(bad("out_trade_no must be 1 to 64 of letters, digits, _ - | *"));
    }
    let cents = amount_of(biz, "total_amount")
        .filter(|c| (1..=10_000_000_000).contains(c))
        .ok_or_else(|| bad("total_amount must be yuan with at most two decimals, 0.01 to 100000000"))?;
    let subject = text(biz, "subject");
    if subject.is_empty() || subject.chars().count() > 256 {
        return Err(bad("subject must be 1 to 256 characters"));
    }
    let time_expire_text = text(biz, "time_expire");
    let time_expire = parse_shanghai(time_expire_text).ok_or_else(|| {
        bad("time_expire must be yyyy-MM-dd HH:mm:ss (Asia/Shanghai); the fitorder contract requires it on every trade")
    })?;
    if time_expire <= Utc::now() {
        return Err(bad("time_expire is in the past"));
    }
    let notify_url = param(params, "notify_url").unwrap_or("");
    if !valid_notify_url(notify_url) {
        return Err(bad("notify_url must be an http(s) URL without a query"));
    }
    let expected_product = match channel {
        "ALIPAY_WAP" => "QUICK_WAP_WAY",
        "ALIPAY_APP" => "QUICK_MSECURITY_PAY",
        _ => "FACE_TO_FACE_PAYMENT",
    };
    let product = text(biz, "product_code");
    if !product.is_empty() && product != expected_product {
        return Err(bad(&format!("product_code must be {expected_product} for this method")));
    }
    let fingerprint = json!([channel, cents, subject, time_expire_text, notify_url]).to_string();
    let mut s = inner.lock();
    let key = (ALIPAY, out_trade_no.to_string());
    if let Some(t) = s.trades.get(&key) {
        if t.fingerprint != fingerprint {
            return Err(business("ACQ.CONTEXT_INCONSISTENT", "交易信息被篡改"));
        }
        return match t.state.as_str() {
            "TRADE_SUCCESS" | "TRADE_FINISHED" => Err(business("ACQ.TRADE_HAS_SUCCESS", "交易已被支付")),
            "TRADE_CLOSED" => Err(business("ACQ.TRADE_HAS_CLOSE", "交易已经关闭")),
            _ => Ok(t.clone()),
        };
    }
    // A precreated trade exists at Alipay only once it is scanned; pages and app orders exist
    // once opened.
    let exists = channel != "ALIPAY_QR";
    let trade = SandboxTrade {
        payer_client_ip: None,
        provider: ALIPAY.into(),
        channel: channel.into(),
        out_trade_no: out_trade_no.into(),
        amount_cents: cents,
        description: subject.into(),
        time_expire,
        time_expire_text: time_expire_text.into(),
        notify_url: notify_url.into(),
        created_at: Utc::now(),
        state: "WAIT_BUYER_PAY".into(),
        exists_at_provider: exists,
        txn_id: exists.then(alipay_trade_no),
        paid_at: None,
        prepay_id: None,
        payer_openid: None,
        refunds: vec![],
        cashier_url: cashier_url(&inner.base_url, ALIPAY, out_trade_no),
        fingerprint,
    };
    s.trades.insert(key, trade.clone());
    Ok(trade)
}

type Answered = Result<(Value, Option<String>), Refusal>;

fn precreate(inner: &Inner, params: &Params, biz: &Value) -> Answered {
    let t = open_trade(inner, params, biz, "ALIPAY_QR")?;
    Ok((
        json!({"code": "10000", "msg": "Success", "out_trade_no": t.out_trade_no, "qr_code": t.cashier_url}),
        None,
    ))
}

/// The trade `biz` names (by `trade_no` first, as Alipay does), if it exists at Alipay.
fn find<'a>(
    trades: &'a mut std::collections::HashMap<(&'static str, String), SandboxTrade>,
    biz: &Value,
) -> Option<&'a mut SandboxTrade> {
    let trade_no = text(biz, "trade_no");
    let out_trade_no = text(biz, "out_trade_no");
    trades.values_mut().find(|t| {
        t.provider == ALIPAY
            && t.exists_at_provider
            && if trade_no.is_empty() {
                t.out_trade_no == out_trade_no
            } else {
                t.txn_id.as_deref() == Some(trade_no)
            }
    })
}

fn not_exist() -> Refusal {
    business("ACQ.TRADE_NOT_EXIST", "交易不存在")
}

fn need_trade_id(biz: &Value) -> Result<(), Refusal> {
    if text(biz, "trade_no").is_empty() && text(biz, "out_trade_no").is_empty() {
        return Err(business(
            "ACQ.INVALID_PARAMETER",
            "参数无效: out_trade_no or trade_no is required",
        ));
    }
    Ok(())
}

fn query(inner: &Inner, biz: &Value) -> Answered {
    need_trade_id(biz)?;
    let mut s = inner.lock();
    let t = find(&mut s.trades, biz).ok_or_else(not_exist)?;
    let mut v = json!({
        "code": "10000", "msg": "Success",
        "trade_no": t.txn_id, "out_trade_no": t.out_trade_no,
        "buyer_logon_id": BUYER_LOGON_ID, "buyer_user_id": BUYER_ID,
        "trade_status": t.state, "total_amount": yuan(t.amount_cents),
    });
    if let Some(at) = t.paid_at {
        v["send_pay_date"] = json!(shanghai(at));
        v["receipt_amount"] = json!(yuan(t.amount_cents));
        v["buyer_pay_amount"] = json!(yuan(t.amount_cents));
    }
    Ok((v, None))
}

fn close(inner: &Inner, biz: &Value) -> Answered {
    need_trade_id(biz)?;
    let mut s = inner.lock();
    let t = find(&mut s.trades, biz).ok_or_else(not_exist)?;
    if matches!(t.state.as_str(), "TRADE_SUCCESS" | "TRADE_FINISHED") {
        return Err(business("ACQ.TRADE_STATUS_ERROR", "交易状态不合法"));
    }
    t.state = "TRADE_CLOSED".into();
    Ok((
        json!({"code": "10000", "msg": "Success", "trade_no": t.txn_id, "out_trade_no": t.out_trade_no}),
        None,
    ))
}

fn refunded_cents(t: &SandboxTrade) -> i64 {
    t.refunds.iter().map(|r| r.amount_cents).sum()
}

fn refund(inner: &Inner, biz: &Value) -> Answered {
    need_trade_id(biz)?;
    let cents = amount_of(biz, "refund_amount").filter(|c| *c >= 1).ok_or_else(|| {
        business(
            "ACQ.INVALID_PARAMETER",
            "参数无效: refund_amount must be yuan, at least 0.01",
        )
    })?;
    let mut s = inner.lock();
    let t = find(&mut s.trades, biz).ok_or_else(not_exist)?;
    let out_request_no = match text(biz, "out_request_no") {
        "" => t.out_trade_no.clone(),
        no => no.to_string(),
    };
    let answer = |t: &SandboxTrade, fund_change: &str, at: DateTime<Utc>| {
        json!({
            "code": "10000", "msg": "Success",
            "trade_no": t.txn_id, "out_trade_no": t.out_trade_no,
            "buyer_logon_id": BUYER_LOGON_ID, "buyer_user_id": BUYER_ID,
            "fund_change": fund_change, "refund_fee": yuan(refunded_cents(t)),
            "gmt_refund_pay": shanghai(at),
        })
    };
    if let Some(r) = t.refunds.iter().find(|r| r.out_refund_no == out_request_no) {
        if r.amount_cents != cents {
            return Err(business(
                "ACQ.CONTEXT_INCONSISTENT",
                "交易信息被篡改 (the same out_request_no with another amount)",
            ));
        }
        let at = r.created_at;
        return Ok((answer(t, "N", at), None));
    }
    if t.state != "TRADE_SUCCESS" {
        return Err(business("ACQ.TRADE_STATUS_ERROR", "交易状态不合法"));
    }
    if refunded_cents(t) + cents > t.amount_cents {
        return Err(business("ACQ.REFUND_AMT_NOT_EQUAL_TOTAL", "退款金额超限"));
    }
    let now = Utc::now();
    let flow = s.alipay_refund_flow;
    let t = find(&mut s.trades, biz).ok_or_else(not_exist)?;
    let moved = flow == AlipayRefundFlow::Immediate;
    t.refunds.push(SandboxRefund {
        out_refund_no: out_request_no.clone(),
        refund_id: t.txn_id.clone().unwrap_or_default(),
        amount_cents: cents,
        // Not moved yet: the refund query finds no finished refund.
        status: if moved { "REFUND_SUCCESS".into() } else { String::new() },
        notify_url: None,
        created_at: now,
        success_time: moved.then_some(now),
    });
    if refunded_cents(t) == t.amount_cents {
        t.state = "TRADE_CLOSED".into();
    }
    let key = format!("{}\n{}", t.out_trade_no, out_request_no);
    match flow {
        AlipayRefundFlow::Immediate => Ok((answer(t, "Y", now), Some(key))),
        // Finished a moment after the answer (see `gateway`).
        AlipayRefundFlow::Later => Ok((answer(t, "N", now), Some(format!("{LATER}{out_request_no}")))),
        AlipayRefundFlow::Hold => Ok((answer(t, "N", now), None)),
    }
}

/// Marks the refund an answer names as one that finishes a moment later.
const LATER: &str = "later\n";

/// Ends a held refund: `REFUND_SUCCESS` from now on, and its notification.
pub(super) async fn finish_refund(inner: &Inner, out_request_no: &str) -> Option<super::SandboxNotification> {
    let key = {
        let mut s = inner.lock();
        let t = s
            .trades
            .values_mut()
            .find(|t| t.provider == ALIPAY && t.refunds.iter().any(|r| r.out_refund_no == out_request_no))?;
        let r = t.refunds.iter_mut().find(|r| r.out_refund_no == out_request_no)?;
        r.status = "REFUND_SUCCESS".into();
        r.success_time = Some(Utc::now());
        format!("{}\n{}", t.out_trade_no, out_request_no)
    };
    notify_refund(inner, &key).await
}

fn refund_query(inner: &Inner, biz: &Value) -> Answered {
    need_trade_id(biz)?;
    let out_request_no = text(biz, "out_request_no");
    if out_request_no.is_empty() {
        return Err(business(
            "ACQ.INVALID_PARAMETER",
            "参数无效: out_request_no is required",
        ));
    }
    let mut s = inner.lock();
    let t = find(&mut s.trades, biz).ok_or_else(not_exist)?;
    let mut v = json!({"code": "10000", "msg": "Success", "trade_no": t.txn_id, "out_trade_no": t.out_trade_no});
    // Not found: a 10000 without refund fields ("没有查询到则代表未退款成功").
    if let Some(r) = t.refunds.iter().find(|r| r.out_refund_no == out_request_no) {
        v["out_request_no"] = json!(r.out_refund_no);
        v["total_amount"] = json!(yuan(t.amount_cents));
        v["refund_amount"] = json!(yuan(r.amount_cents));
        if !r.status.is_empty() {
            v["refund_status"] = json!(r.status);
        }
        v["gmt_refund_pay"] = json!(shanghai(r.created_at));
    }
    Ok((v, None))
}

/// Sends the refund notification: `TRADE_SUCCESS` with the cumulative `refund_fee` for a
/// partial refund, `TRADE_CLOSED` with `gmt_close` once all is refunded.
async fn notify_refund(inner: &Inner, key: &str) -> Option<super::SandboxNotification> {
    let (out_trade_no, out_request_no) = key.split_once('\n')?;
    let (t, r) = {
        let s = inner.lock();
        s.trades.get(&(ALIPAY, out_trade_no.to_string())).and_then(|t| {
            t.refunds
                .iter()
                .find(|r| r.out_refund_no == out_request_no)
                .map(|r| (t.clone(), r.clone()))
        })
    }?;
    // The cumulative refund up to and including this one.
    let upto: i64 = t
        .refunds
        .iter()
        .take_while(|x| x.out_refund_no != r.out_refund_no)
        .map(|x| x.amount_cents)
        .sum::<i64>()
        + r.amount_cents;
    let full = upto == t.amount_cents;
    let status = if full { "TRADE_CLOSED" } else { "TRADE_SUCCESS" };
    let total = yuan(t.amount_cents);
    let refund_fee = yuan(upto);
    let gmt_refund = r
        .created_at
        .with_timezone(&chrono_tz::Asia::Shanghai)
        .format("%Y-%m-%d %H:%M:%S%.3f")
        .to_string();
    let paid = shanghai(t.paid_at.unwrap_or(r.created_at));
    let created = shanghai(t.created_at);
    let closed = shanghai(r.created_at);
    let mut fields: Vec<(&str, &str)> = vec![
        ("out_trade_no", &t.out_trade_no),
        ("trade_no", t.txn_id.as_deref().unwrap_or_default()),
        ("trade_status", status),
        ("total_amount", &total),
        ("receipt_amount", &total),
        ("refund_fee", &refund_fee),
        ("gmt_refund", &gmt_refund),
        ("out_biz_no", &r.out_refund_no),
        ("buyer_id", BUYER_ID),
        ("seller_id", SELLER_ID),
        ("subject", &t.description),
        ("gmt_create", &created),
        ("gmt_payment", &paid),
    ];
    if full {
        fields.push(("gmt_close", &closed));
    }
    Some(
        inner
            .notify_alipay(&t.out_trade_no, &t.notify_url, &format!("{status}+refund"), &fields)
            .await,
    )
}

/// `alipay.data.dataservice.bill.downloadurl.query`: a URL of the day's bill zip.
fn bill_query(inner: &Inner, biz: &Value) -> Answered {
    if text(biz, "bill_type") != "trade" {
        return Err(invalid("isv.invalid-parameter", "bill_type 仅支持 trade (sandbox)"));
    }
    let date = chrono::NaiveDate::parse_from_str(text(biz, "bill_date"), "%Y-%m-%d")
        .map_err(|_| invalid("isv.invalid-parameter", "bill_date 格式为 yyyy-MM-dd"))?;
    let prepared = super::bills::prepare(&mut inner.lock(), ALIPAY, date, SELLER_ID);
    match prepared {
        Ok(super::bills::Bill::Ready(token, _)) => Ok((
            json!({"code": "10000", "msg": "Success",
                   "bill_download_url": format!("{}/alipay/downloadBillFile.resource?bizType=trade&fileType=csv.zip&bizDates={}&fileId={token}",
                                                inner.base_url, date.format("%Y%m%d"))}),
            None,
        )),
        Ok(_) => Err(business("isp.bill_not_exist", "账单不存在")),
        Err(why) => Err(business("isp.unknow-error", &why)),
    }
}

/// The bill zip behind a `bill_download_url`; a lapsed link answers an error page.
async fn bill_download(State(inner): State<Arc<Inner>>, OriginalUri(uri): OriginalUri) -> Response {
    let token = uri.query().and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "fileId")
            .map(|(_, v)| v.into_owned())
    });
    let bytes = token.and_then(|t| super::bills::take(&mut inner.lock(), ALIPAY, &t));
    record(
        &inner,
        "GET",
        "/alipay/downloadBillFile.resource",
        "bill download",
        true,
        None,
    );
    match bytes {
        Some(b) => (StatusCode::OK, [(header::CONTENT_TYPE, "application/oct-stream")], b).into_response(),
        None => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/html;charset=utf-8")],
            "<html><body>下载链接已失效</body></html>",
        )
            .into_response(),
    }
}

/// The sandbox's Alipay notifications.
impl Inner {
    /// POSTs a signed Alipay notification with `fields` (the envelope fields are added).
    pub(super) async fn notify_alipay(
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
        self.deliver(ALIPAY, out_trade_no, event, url, req.body(body), |status, reply| {
            status == 200 && reply.trim() == "success"
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vectors() -> Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/provider-samples/alipay/notify/alipay_sdk_nodejs_notify_sign_vectors.json"
        );
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_json::from_str(&text).unwrap()
    }

    fn params_of(v: &Value) -> Params {
        v["params"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, x)| (k.clone(), x.as_str().unwrap().to_string()))
            .collect()
    }

    /// The request rule (everything but `sign`, `sign_type` kept) against a message Alipay's
    /// SDK signs that way, with Alipay's published key.
    #[test]
    fn request_content_matches_the_published_vector() {
        use rsa::pkcs8::DecodePublicKey;
        let all = vectors();
        let v = &all["vectors"][2];
        assert_eq!(v["exclude_from_content"], json!(["sign"]));
        let params = params_of(v);
        assert_eq!(sign_content(&params), v["expected_content"].as_str().unwrap());
        let pem = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/provider-samples/alipay/notify/alipay-notify-sign-public-key-v2.pem"
        ))
        .unwrap();
        let key = rsa::RsaPublicKey::from_public_key_pem(pem.trim()).unwrap();
        let sign = param(&params, "sign").unwrap();
        assert!(rsa_verify(&key, sign_content(&params).as_bytes(), sign));
        let mut tampered = params.clone();
        tampered.retain(|(k, _)| k != "sign_type");
        assert!(!rsa_verify(&key, sign_content(&tampered).as_bytes(), sign));
    }
}
