//! The no-op downstream: a local HTTP endpoint answering every request 200 `{}`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Result;

/// A local HTTP endpoint that answers every request 200 `{}`: the door / AI-device services
/// for B6 and for the baseline client loop, counting what it received.
pub struct Noop {
    pub url: String,
    pub hits: Arc<AtomicU64>,
    pub first_hit: Arc<Mutex<Option<Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct NoopState {
    hits: Arc<AtomicU64>,
    first_hit: Arc<Mutex<Option<Instant>>>,
}

async fn noop_handler(
    axum::extract::State(s): axum::extract::State<NoopState>,
    _body: bytes::Bytes,
) -> impl axum::response::IntoResponse {
    if s.hits.fetch_add(1, Ordering::Relaxed) == 0 {
        *s.first_hit.lock().expect("not poisoned") = Some(Instant::now());
    }
    ([(axum::http::header::CONTENT_TYPE, "application/json")], "{}")
}

impl Noop {
    pub async fn start() -> Result<Noop> {
        let hits = Arc::new(AtomicU64::new(0));
        let first_hit = Arc::new(Mutex::new(None));
        let state = NoopState {
            hits: hits.clone(),
            first_hit: first_hit.clone(),
        };
        let app = axum::Router::new().fallback(noop_handler).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Noop {
            url: format!("http://{addr}"),
            hits,
            first_hit,
            task,
        })
    }

    pub fn reset(&self) {
        self.hits.store(0, Ordering::Relaxed);
        *self.first_hit.lock().expect("not poisoned") = None;
    }

    pub fn first_hit(&self) -> Option<Instant> {
        *self.first_hit.lock().expect("not poisoned")
    }
}

impl Drop for Noop {
    fn drop(&mut self) {
        self.task.abort();
    }
}
