//! Faults: PostgreSQL stops under a running service and comes back. Readiness says so, callers
//! get quick, honest errors (providers a 5xx, so they retry), and everything recovers by itself.

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use fitorder::dev::dev_pg::DevPostgres;
use serde_json::json;

use crate::harness::*;
use crate::providers;

async fn ready(app: &TestApp) -> StatusCode {
    app.get("/readyz").await.0
}

#[tokio::test]
async fn the_database_goes_away_and_comes_back_without_a_restart() {
    // A cluster of our own, so that stopping it hurts no other test.
    let dir = std::env::temp_dir().join(format!("fitorder-faults-{}", std::process::id()));
    let d = dir.clone();
    let pg = tokio::task::spawn_blocking(move || DevPostgres::ensure(&d))
        .await
        .unwrap()
        .expect("a private cluster");
    fitorder::server::ensure_database(&pg.url("postgres"), "faults")
        .await
        .unwrap();
    let url = pg.url("faults");
    fitorder::db::migrate(&url).await.unwrap();
    let app = TestApp::on_database(&url, providers::configure).await;
    let s = app.studio(0, None, 3).await;
    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WECHAT_PAY")
        .await;
    assert_eq!(ready(&app).await, StatusCode::OK);

    // PostgreSQL stops.
    let pg = std::sync::Arc::new(pg);
    let p = pg.clone();
    tokio::task::spawn_blocking(move || p.stop()).await.unwrap();
    let started = Instant::now();
    assert_eq!(ready(&app).await, StatusCode::SERVICE_UNAVAILABLE);
    let r = app
        .gql(Some(&app.admin_token()), "query { orders { totalCount } }", json!({}))
        .await;
    assert_eq!(error_code(&r), "INTERNAL");
    // The provider is told to retry: nothing could be recorded.
    let w = providers::wechat();
    let n = w.notification(
        "TRANSACTION.SUCCESS",
        &w.transaction(&no, "4200000000000000000000007001", 10_000),
        chrono::Utc::now().timestamp(),
    );
    let (status, body) = app.wechat_notify(&n).await;
    assert!(status.is_server_error(), "{status}");
    assert_eq!(body["code"], "FAIL");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "errors came quickly, not after hanging"
    );

    // It comes back (same port, same data); nothing is restarted on our side.
    let d = dir.clone();
    let again = tokio::task::spawn_blocking(move || DevPostgres::ensure(&d))
        .await
        .unwrap()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while ready(&app).await != StatusCode::OK {
        assert!(Instant::now() < deadline, "did not recover");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The provider's retry of the same notification applies it once.
    let mut status = StatusCode::INTERNAL_SERVER_ERROR;
    while status != StatusCode::NO_CONTENT && Instant::now() < deadline {
        status = app.wechat_notify(&n).await.0;
    }
    assert_eq!(status, StatusCode::NO_CONTENT);
    let o = app.order(&no).await;
    assert_eq!(o["status"], "PAID");
    assert_eq!(o["member"]["sessionCredits"], 10);
    drop(app);
    tokio::task::spawn_blocking(move || {
        again.stop();
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn slow_statements_and_an_exhausted_pool_fail_cleanly() {
    use diesel_async::RunQueryDsl;
    let app = TestApp::with_config(|c| {
        c.statement_timeout = Duration::from_millis(300);
        c.db_pool_size = 2;
    })
    .await;
    // A statement past the timeout is canceled by PostgreSQL.
    let mut c = app.conn().await;
    let started = Instant::now();
    let r = diesel::sql_query("SELECT pg_sleep(5)").execute(&mut c).await;
    assert!(r.unwrap_err().to_string().contains("statement timeout"));
    assert!(started.elapsed() < Duration::from_secs(2));
    // With every connection taken, a request waits a bounded time and answers INTERNAL.
    let _held = app.conn().await;
    let started = Instant::now();
    let r = app
        .gql(Some(&app.admin_token()), "query { orders { totalCount } }", json!({}))
        .await;
    assert_eq!(error_code(&r), "INTERNAL");
    assert_eq!(
        r["errors"][0]["extensions"]["reason"], "DATABASE_UNAVAILABLE",
        "pool exhaustion is told apart: {r}"
    );
    assert!(started.elapsed() < Duration::from_secs(8), "{:?}", started.elapsed());
    drop(c);
    drop(_held);
    let r = app
        .gql(Some(&app.admin_token()), "query { orders { totalCount } }", json!({}))
        .await;
    assert!(r.get("errors").is_none(), "{r}");
}

#[tokio::test]
async fn a_connection_that_met_a_read_only_server_is_not_reused() {
    use diesel_async::SimpleAsyncConnection;
    let app = TestApp::with_config(|c| c.db_pool_size = 1).await;
    assert_eq!(ready(&app).await, StatusCode::OK);
    // The pool's one connection now leads to a server that takes no writes, as a primary
    // draining before its demotion does (`default_transaction_read_only`).
    {
        let mut c = app.conn().await;
        c.batch_execute("SET default_transaction_read_only = on").await.unwrap();
    }
    assert_eq!(
        ready(&app).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "a read-only server is not ready"
    );
    let create = "mutation($i: CreateStoreInput!) { createStore(input: $i) { id } }";
    let vars = json!({"i": {"name": "Read-only", "code": "RO1"}});
    let r = app.gql(Some(&app.admin_token()), create, vars.clone()).await;
    assert_eq!(error_code(&r), "INTERNAL");
    assert_eq!(r["errors"][0]["extensions"]["reason"], "DATABASE_UNAVAILABLE", "{r}");
    assert!(!r.to_string().contains("read-only"), "nothing internal leaks: {r}");
    // Not handed out again: the next checkout connects anew, to a server that takes writes.
    assert_eq!(ready(&app).await, StatusCode::OK);
    let r = app.gql(Some(&app.admin_token()), create, vars).await;
    assert!(r.get("errors").is_none(), "{r}");
}
