use axum::extract::State;
use axum::http::StatusCode;
use diesel_async::RunQueryDsl;

use super::HttpState;

/// 200 while the process runs.
pub async fn healthz() -> &'static str {
    "ok"
}

/// 200 when the database answers within two seconds and takes writes, 503 otherwise: a
/// standby, a primary being demoted (read-only while it drains) or no server at all is not
/// ready, so a load balancer stops sending work while a failover runs.
pub async fn readyz(State(s): State<HttpState>) -> (StatusCode, &'static str) {
    let check = async {
        let mut conn = s.app.pool.get().await.ok()?;
        // `transaction_read_only` is on in recovery and under `default_transaction_read_only`.
        diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(
            "current_setting('transaction_read_only') = 'off'",
        ))
        .get_result::<bool>(&mut conn)
        .await
        .ok()
    };
    match tokio::time::timeout(std::time::Duration::from_secs(2), check).await {
        Ok(Some(true)) => (StatusCode::OK, "ready"),
        Ok(Some(false)) => (StatusCode::SERVICE_UNAVAILABLE, "database read-only"),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "database unavailable"),
    }
}
