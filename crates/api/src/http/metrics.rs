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
    // The outbox backlog, read from the database so every instance reports the same truth,
    // at most every BACKLOG_EVERY (scrapes in between, or at the same time, reuse the gauges).
    let mut last = s.backlog_read.lock().await;
    if last.is_some_and(|t| t.elapsed() < BACKLOG_EVERY) {
        drop(last);
        return rendered(&s, handle);
    }
    *last = Some(std::time::Instant::now());
    BACKLOG_READS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let backlog = async {
        use diesel_async::RunQueryDsl;
        #[derive(diesel::QueryableByName)]
        struct B {
            #[diesel(sql_type = diesel::sql_types::Text)]
            status: String,
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let mut conn = s.app.pool.get().await.ok()?;
        crate::db::sql::StaticQuery::new(include_str!("metrics/backlog.sql"))
            .load::<B>(&mut conn)
            .await
            .ok()
    };
    let answered = tokio::time::timeout(std::time::Duration::from_secs(2), backlog).await;
    // Readiness as a metric (what /readyz answers): the database answered within 2 s.
    ::metrics::gauge!("fitorder_ready").set(if matches!(answered, Ok(Some(_))) { 1.0 } else { 0.0 });
    if let Ok(Some(rows)) = answered {
        let n = |st: &str| rows.iter().find(|r| r.status == st).map(|r| r.n).unwrap_or(0) as f64;
        for st in ["PENDING", "RETRYING", "DEAD"] {
            ::metrics::gauge!("fitorder_compensation_backlog", "status" => st).set(n(st));
        }
        // Read at scrape time too, so that every instance reports the same truth.
        ::metrics::gauge!("fitorder_compensation_overdue").set(n("OVERDUE"));
        ::metrics::gauge!("fitorder_alert_deliveries_dead").set(n("ALERT_DEAD"));
    }
    drop(last);
    rendered(&s, handle)
}

/// `/metrics` on the API port outside development mode without FITORDER_METRICS_TOKEN: not
/// served there (Prometheus scrapes the FITORDER_METRICS_ADDR listener).
pub async fn not_here() -> axum::response::Response {
    (
        axum::http::StatusCode::NOT_FOUND,
        "metrics are served on FITORDER_METRICS_ADDR (or here with FITORDER_METRICS_TOKEN)",
    )
        .into_response()
}

/// Lets the scrape through with `Authorization: Bearer <FITORDER_METRICS_TOKEN>`; 401 otherwise.
pub async fn require_token(
    token: &str,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    if presented.is_some_and(|p| same_secret(p, token)) {
        next.run(req).await
    } else {
        let mut resp = (
            axum::http::StatusCode::UNAUTHORIZED,
            "a metrics bearer token is required",
        )
            .into_response();
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
        resp
    }
}

/// Compares digests, so the time taken says nothing about how much of the token matched.
fn same_secret(a: &str, b: &str) -> bool {
    use sha2::{Digest, Sha256};
    let (x, y) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    x.iter().zip(y.iter()).fold(0u8, |acc, (p, q)| acc | (p ^ q)) == 0
}

fn rendered(s: &HttpState, handle: &PrometheusHandle) -> ([(header::HeaderName, &'static str); 1], String) {
    ::metrics::gauge!("fitorder_subscribers_hub").set(s.app.events.subscriber_count() as f64);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], handle.render())
}

/// Every metric family fitorder exports (name, Prometheus type, labels): what the dashboard and
/// the alerting rules in `deploy/` may use. A test keeps it equal to the call sites in `src/`.
pub const FAMILIES: &[(&str, &str, &[&str])] = &[
    ("fitorder_alert_attempts_total", "counter", &["channel", "outcome"]),
    ("fitorder_alert_deliveries_dead", "gauge", &[]),
    ("fitorder_alert_deliveries_dead_total", "counter", &["channel"]),
    ("fitorder_alerts_raised_total", "counter", &["cause"]),
    ("fitorder_callbacks_total", "counter", &["provider", "outcome"]),
    ("fitorder_callbacks_unverified_dropped_total", "counter", &["provider"]),
    ("fitorder_callbacks_unverified_total", "counter", &["provider"]),
    ("fitorder_check_ins_total", "counter", &[]),
    ("fitorder_compensation_attempts_total", "counter", &["kind", "outcome"]),
    ("fitorder_compensation_backlog", "gauge", &["status"]),
    ("fitorder_compensation_dead", "gauge", &[]),
    ("fitorder_compensation_dead_total", "counter", &["kind"]),
    ("fitorder_compensation_overdue", "gauge", &[]),
    ("fitorder_db_pool_available", "gauge", &[]),
    ("fitorder_db_pool_size", "gauge", &[]),
    ("fitorder_db_pool_waiting", "gauge", &[]),
    ("fitorder_duplicate_check_ins_total", "counter", &[]),
    ("fitorder_events_dropped_total", "counter", &[]),
    ("fitorder_graphql_documents_kept", "gauge", &[]),
    ("fitorder_graphql_documents_kept_bytes", "gauge", &[]),
    ("fitorder_http_request_seconds", "summary", &["route"]),
    (
        "fitorder_http_requests_total",
        "counter",
        &["route", "method", "status"],
    ),
    ("fitorder_listen_reconnects_total", "counter", &[]),
    ("fitorder_orders_expired_total", "counter", &[]),
    ("fitorder_orders_placed_total", "counter", &["method"]),
    ("fitorder_outbox_delivery_seconds", "summary", &["kind"]),
    ("fitorder_provider_failures_total", "counter", &["provider", "call"]),
    ("fitorder_read_replica_fallback_total", "counter", &["reason"]),
    ("fitorder_read_replica_reads_total", "counter", &[]),
    ("fitorder_ready", "gauge", &[]),
    ("fitorder_reconciliation_findings_total", "counter", &["provider"]),
    ("fitorder_refresh_token_reuse_total", "counter", &[]),
    ("fitorder_subscriber_lagged_total", "counter", &[]),
    ("fitorder_subscribers", "gauge", &[]),
    ("fitorder_subscribers_hub", "gauge", &[]),
    ("fitorder_task_runs_total", "counter", &["task", "status"]),
    ("fitorder_task_seconds", "summary", &["task"]),
    ("fitorder_tickets_opened_total", "counter", &["kind"]),
    ("fitorder_trades_started_total", "counter", &["channel"]),
    ("fitorder_transitions_total", "counter", &["from", "to"]),
    ("fitorder_wechat_access_token_fetches_total", "counter", &[]),
    ("fitorder_wechat_unknown_serials_total", "counter", &["outcome"]),
];
/// How often a scrape may query the outbox backlog.
pub const BACKLOG_EVERY: std::time::Duration = std::time::Duration::from_secs(15);

static BACKLOG_READS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times this process has queried the backlog for `/metrics` (for tests).
pub fn backlog_reads() -> u64 {
    BACKLOG_READS.load(std::sync::atomic::Ordering::Relaxed)
}
