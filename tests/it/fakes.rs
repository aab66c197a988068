//! Local stand-ins for what fitorder calls: a downstream (door access, AI devices) that can be
//! told to fail, hang or succeed, and a running server to reach over real TCP/WebSocket.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Healthy,
    /// Answers 503 to the first N calls, then 200.
    FailFirst(usize),
    AlwaysFail,
    /// Never answers (until the caller times out).
    Hang,
    /// Every third call fails.
    Flaky,
}

#[derive(Debug, Clone)]
pub struct Call {
    pub body: Value,
    pub trace_id: Option<String>,
}

#[derive(Clone)]
pub struct FakeDownstream {
    pub url: String,
    mode: Arc<Mutex<Mode>>,
    seen: Arc<AtomicUsize>,
    pub calls: Arc<Mutex<Vec<Call>>>,
}

impl FakeDownstream {
    pub async fn start(mode: Mode) -> FakeDownstream {
        let fake = FakeDownstream {
            url: String::new(),
            mode: Arc::new(Mutex::new(mode)),
            seen: Arc::new(AtomicUsize::new(0)),
            calls: Arc::new(Mutex::new(vec![])),
        };
        let app = Router::new().route("/access", post(handle)).with_state(fake.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FakeDownstream {
            url: format!("http://{addr}/access"),
            ..fake
        }
    }

    pub fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// How many successful deliveries each idempotency key got.
    pub fn delivered_per_key(&self) -> HashMap<String, usize> {
        let mut m = HashMap::new();
        for c in self.calls() {
            if c.body["__ok"] == true {
                *m.entry(c.body["idempotencyKey"].as_str().unwrap().to_string())
                    .or_default() += 1;
            }
        }
        m
    }
}

async fn handle(State(f): State<FakeDownstream>, headers: HeaderMap, Json(mut body): Json<Value>) -> StatusCode {
    let n = f.seen.fetch_add(1, Ordering::SeqCst);
    let mode = *f.mode.lock().unwrap();
    let ok = match mode {
        Mode::Healthy => true,
        Mode::FailFirst(k) => n >= k,
        Mode::AlwaysFail => false,
        Mode::Flaky => n % 3 != 2,
        Mode::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            false
        }
    };
    body["__ok"] = Value::Bool(ok);
    f.calls.lock().unwrap().push(Call {
        body,
        trace_id: headers
            .get("x-trace-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
    });
    if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// Serves `router` on a real port; returns `127.0.0.1:port`.
pub async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr.to_string()
}

/// A fake WeChat Pay API and Alipay gateway that check our signatures as the providers do,
/// sign their answers as the providers do, and record refunds.
#[derive(Clone)]
pub struct FakeProviderApi {
    pub base: String,
    pub refunds: Arc<Mutex<Vec<Value>>>,
    /// out_trade_no -> (transaction id, fen) of trades the fake says were paid.
    pub paid: Arc<Mutex<HashMap<String, (String, i64)>>>,
    pub closed: Arc<Mutex<Vec<String>>>,
    /// When set, queries never answer.
    pub hang_queries: Arc<std::sync::atomic::AtomicBool>,
    key: rsa::RsaPublicKey,
}

impl FakeProviderApi {
    pub async fn start(merchant_public: rsa::RsaPublicKey) -> FakeProviderApi {
        let fake = FakeProviderApi {
            base: String::new(),
            refunds: Arc::new(Mutex::new(vec![])),
            paid: Arc::new(Mutex::new(HashMap::new())),
            closed: Arc::new(Mutex::new(vec![])),
            hang_queries: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            key: merchant_public,
        };
        let app = Router::new()
            .route("/v3/pay/transactions/{kind}", post(wechat_prepay))
            .route("/v3/refund/domestic/refunds", post(wechat_refund))
            .route(
                "/v3/pay/transactions/out-trade-no/{no}",
                axum::routing::get(wechat_query),
            )
            .route("/v3/pay/transactions/out-trade-no/{no}/close", post(wechat_close))
            .route("/gateway.do", post(alipay_gateway))
            .layer(axum::middleware::from_fn(sign_wechat_answers))
            .with_state(fake.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FakeProviderApi {
            base: format!("http://{addr}"),
            ..fake
        }
    }
}

fn verify(key: &rsa::RsaPublicKey, message: &[u8], sig_b64: &str) -> bool {
    use base64::Engine;
    use rsa::signature::Verifier;
    let Ok(sig) = base64::engine::general_purpose::STANDARD.decode(sig_b64) else {
        return false;
    };
    let Ok(sig) = rsa::pkcs1v15::Signature::try_from(sig.as_slice()) else {
        return false;
    };
    rsa::pkcs1v15::VerifyingKey::<sha2::Sha256>::new(key.clone())
        .verify(message, &sig)
        .is_ok()
}

async fn wechat_refund(
    State(f): State<FakeProviderApi>,
    headers: HeaderMap,
    body: String,
) -> (StatusCode, Json<Value>) {
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
    let field = |name: &str| -> String {
        auth.split(&format!("{name}=\""))
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("")
            .to_string()
    };
    let message = format!(
        "POST\n/v3/refund/domestic/refunds\n{}\n{}\n{body}\n",
        field("timestamp"),
        field("nonce_str")
    );
    if !auth.starts_with("WECHATPAY2-SHA256-RSA2048 ") || !verify(&f.key, message.as_bytes(), &field("signature")) {
        return (
            StatusCode::UNAUTHORIZED,
            Json(serde_json::json!({"code": "SIGN_ERROR", "message": "bad signature"})),
        );
    }
    let v: Value = serde_json::from_str(&body).unwrap();
    f.refunds
        .lock()
        .unwrap()
        .push(serde_json::json!({"provider": "WECHAT_PAY", "request": v, "mchid": field("mchid")}));
    (
        StatusCode::OK,
        Json(
            serde_json::json!({"refund_id": "50300000000001", "out_refund_no": v["out_refund_no"], "status": "SUCCESS"}),
        ),
    )
}

/// Signs every WeChat Pay answer as WeChat Pay does: `Wechatpay-Signature` over
/// `timestamp\nnonce\nbody\n` with the platform key the `Wechatpay-Serial` names.
async fn sign_wechat_answers(req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    let is_wechat = req.uri().path().starts_with("/v3/");
    let resp = next.run(req).await;
    if !is_wechat {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = http_body_util::BodyExt::collect(body).await.unwrap().to_bytes();
    let ts = chrono::Utc::now().timestamp().to_string();
    let nonce = "FAKENONCE0123456789";
    let message = fitorder::providers::wechat::signing::answer_message(&ts, nonce, &bytes);
    let sig = fitorder::providers::crypto::sign(&crate::providers::wechat_platform_private(), &message);
    for (k, v) in [
        ("wechatpay-timestamp", ts),
        ("wechatpay-nonce", nonce.to_string()),
        ("wechatpay-signature", sig),
        ("wechatpay-serial", crate::providers::WECHAT_PUBLIC_KEY_ID.to_string()),
    ] {
        parts.headers.insert(k, v.parse().unwrap());
    }
    axum::response::Response::from_parts(parts, axum::body::Body::from(bytes))
}

async fn wechat_prepay(
    axum::extract::Path(kind): axum::extract::Path<String>,
    body: String,
) -> (StatusCode, Json<Value>) {
    let v: Value = serde_json::from_str(&body).unwrap_or_default();
    let no = v["out_trade_no"].as_str().unwrap_or_default();
    let answer = match kind.as_str() {
        "native" => serde_json::json!({"code_url": format!("weixin://wxpay/bizpayurl?pr={no}")}),
        "h5" => {
            serde_json::json!({"h5_url": format!("https://wx.tenpay.com/cgi-bin/mmpayweb-bin/checkmweb?prepay_id={no}")})
        }
        _ => serde_json::json!({"prepay_id": format!("wx{no}")}),
    };
    (StatusCode::OK, Json(answer))
}

/// An answer as the Alipay gateway writes it: signed over the exact `<method>_response` text.
fn alipay_answer(method: &str, response: Value) -> String {
    let name = format!("{}_response", method.replace('.', "_"));
    let inner = response.to_string();
    let sign = fitorder::providers::crypto::sign(&crate::providers::alipay_private(), inner.as_bytes());
    format!("{{\"{name}\":{inner},\"sign\":\"{sign}\"}}")
}

async fn alipay_gateway(State(f): State<FakeProviderApi>, body: String) -> String {
    let fields: Vec<(String, String)> = form_urlencoded::parse(body.as_bytes()).into_owned().collect();
    let get = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let method = get("method");
    // The gateway's rule: every non-empty parameter but sign, sorted (sign_type included).
    let mut pairs: Vec<&(String, String)> = fields.iter().filter(|(k, v)| k != "sign" && !v.is_empty()).collect();
    pairs.sort();
    let content = pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    if !verify(&f.key, content.as_bytes(), &get("sign")) {
        return alipay_answer(
            &method,
            serde_json::json!({"code": "40002", "sub_code": "isv.invalid-signature", "sub_msg": "bad sign"}),
        );
    }
    let biz: Value = serde_json::from_str(&get("biz_content")).unwrap();
    match method.as_str() {
        "alipay.trade.precreate" => alipay_answer(
            &method,
            serde_json::json!({"code": "10000", "msg": "Success", "out_trade_no": biz["out_trade_no"],
                               "qr_code": format!("https://qr.alipay.com/{}", biz["out_trade_no"].as_str().unwrap_or_default())}),
        ),
        _ => {
            f.refunds
                .lock()
                .unwrap()
                .push(serde_json::json!({"provider": "ALIPAY", "request": biz}));
            alipay_answer(
                &method,
                serde_json::json!({"code": "10000", "msg": "Success", "fund_change": "Y"}),
            )
        }
    }
}

fn wechat_signed(f: &FakeProviderApi, headers: &HeaderMap, method: &str, path: &str, body: &str) -> bool {
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
    let field = |name: &str| -> String {
        auth.split(&format!("{name}=\""))
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("")
            .to_string()
    };
    let message = format!(
        "{method}\n{path}\n{}\n{}\n{body}\n",
        field("timestamp"),
        field("nonce_str")
    );
    verify(&f.key, message.as_bytes(), &field("signature"))
}

async fn wechat_query(
    State(f): State<FakeProviderApi>,
    axum::extract::Path(no): axum::extract::Path<String>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> (StatusCode, Json<Value>) {
    if f.hang_queries.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    let path = uri.path_and_query().map(|p| p.as_str().to_string()).unwrap_or_default();
    if !wechat_signed(&f, &headers, "GET", &path, "") {
        return (
            StatusCode::UNAUTHORIZED,
            Json(serde_json::json!({"code": "SIGN_ERROR"})),
        );
    }
    let paid = f.paid.lock().unwrap().get(&no).cloned();
    match paid {
        Some((txn, fen)) => (
            StatusCode::OK,
            Json(
                serde_json::json!({"out_trade_no": no, "transaction_id": txn, "trade_state": "SUCCESS", "amount": {"total": fen}}),
            ),
        ),
        None => (
            StatusCode::OK,
            Json(serde_json::json!({"out_trade_no": no, "trade_state": "NOTPAY"})),
        ),
    }
}

async fn wechat_close(
    State(f): State<FakeProviderApi>,
    axum::extract::Path(no): axum::extract::Path<String>,
    headers: HeaderMap,
    body: String,
) -> StatusCode {
    let path = format!("/v3/pay/transactions/out-trade-no/{no}/close");
    if !wechat_signed(&f, &headers, "POST", &path, &body) {
        return StatusCode::UNAUTHORIZED;
    }
    f.closed.lock().unwrap().push(no);
    StatusCode::NO_CONTENT
}
