//! Prometheus metrics: one recorder per process, rendered at `/metrics`.

use std::sync::OnceLock;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use super::HttpState;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the global recorder once (tests build many apps in one process).
pub fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .expect("the metrics recorder is installed once per process")
    })
}

pub async fn render(State(s): State<HttpState>) -> impl IntoResponse {
    let handle = install();
    let status = s.app.pool.status();
    ::metrics::gauge!("fitorder_db_pool_size").set(status.size as f64);
    ::metrics::gauge!("fitorder_db_pool_available").set(status.available as f64);
    ::metrics::gauge!("fitorder_db_pool_waiting").set(status.waiting as f64);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], handle.render())
}
