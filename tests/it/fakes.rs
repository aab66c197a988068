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

/// A fake WeChat Pay API and Alipay gateway that check our signatures and record refunds.
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
            .route("/v3/refund/domestic/refunds", post(wechat_refund))
            .route(
                "/v3/pay/transactions/out-trade-no/{no}",
                axum::routing::get(wechat_query),
            )
            .route("/v3/pay/transactions/out-trade-no/{no}/close", post(wechat_close))
            .route("/gateway.do", post(alipay_gateway))
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
            serde_json::json!({"refund_id": "50300000000001", "out_refund_no": v["out_refund_no"], "status": "PROCESSING"}),
        ),
    )
}

async fn alipay_gateway(State(f): State<FakeProviderApi>, body: String) -> Json<Value> {
    let fields: Vec<(String, String)> = form_urlencoded::parse(body.as_bytes()).into_owned().collect();
    let sign = fields
        .iter()
        .find(|(k, _)| k == "sign")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let content = fitorder::payments::alipay::signed_content(&fields);
    if !verify(&f.key, content.as_bytes(), &sign) {
        return Json(serde_json::json!({"alipay_trade_refund_response": {"code": "40002", "sub_msg": "bad sign"}}));
    }
    let biz: Value = serde_json::from_str(&fields.iter().find(|(k, _)| k == "biz_content").unwrap().1).unwrap();
    f.refunds
        .lock()
        .unwrap()
        .push(serde_json::json!({"provider": "ALIPAY", "request": biz}));
    Json(
        serde_json::json!({"alipay_trade_refund_response": {"code": "10000", "msg": "Success", "fund_change": "Y"}, "sign": "x"}),
    )
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
