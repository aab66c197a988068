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
        let app = Router::new()
            .route("/access", post(handle))
            .with_state(fake.clone());
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

async fn handle(
    State(f): State<FakeDownstream>,
    headers: HeaderMap,
    Json(mut body): Json<Value>,
) -> StatusCode {
    let n = f.seen.fetch_add(1, Ordering::SeqCst);
    let mode = *f.mode.lock().unwrap();
    let ok = match mode {
        Mode::Healthy => true,
        Mode::FailFirst(k) => n >= k,
        Mode::AlwaysFail => false,
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
