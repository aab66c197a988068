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
        diesel::sql_query(
            "SELECT status, count(*) AS n FROM compensation_events WHERE status IN ('PENDING', 'RETRYING', 'DEAD') GROUP BY status",
        )
        .load::<B>(&mut conn)
        .await
        .ok()
    };
    if let Ok(Some(rows)) = tokio::time::timeout(std::time::Duration::from_secs(2), backlog).await {
        for st in ["PENDING", "RETRYING", "DEAD"] {
            let n = rows.iter().find(|r| r.status == st).map(|r| r.n).unwrap_or(0);
            ::metrics::gauge!("fitorder_compensation_backlog", "status" => st).set(n as f64);
        }
    }
    drop(last);
    rendered(&s, handle)
}

fn rendered(s: &HttpState, handle: &PrometheusHandle) -> ([(header::HeaderName, &'static str); 1], String) {
    ::metrics::gauge!("fitorder_subscribers_hub").set(s.app.events.subscriber_count() as f64);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], handle.render())
}

/// How often a scrape may query the outbox backlog.
pub const BACKLOG_EVERY: std::time::Duration = std::time::Duration::from_secs(15);

static BACKLOG_READS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times this process has queried the backlog for `/metrics` (for tests).
pub fn backlog_reads() -> u64 {
    BACKLOG_READS.load(std::sync::atomic::Ordering::Relaxed)
}
