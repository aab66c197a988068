use axum::extract::State;
use axum::http::StatusCode;
use diesel::IntoSql;
use diesel_async::RunQueryDsl;

use super::HttpState;

/// 200 while the process runs.
pub async fn healthz() -> &'static str {
    "ok"
}

/// 200 when the database answers within two seconds, 503 otherwise.
pub async fn readyz(State(s): State<HttpState>) -> (StatusCode, &'static str) {
    let check = async {
        let mut conn = s.app.pool.get().await.ok()?;
        diesel::select(1.into_sql::<diesel::sql_types::Integer>())
            .execute(&mut conn)
            .await
            .ok()
    };
    match tokio::time::timeout(std::time::Duration::from_secs(2), check).await {
        Ok(Some(_)) => (StatusCode::OK, "ready"),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "database unavailable"),
    }
}
