//! Health, readiness, metrics, GraphiQL, trace ids, body limits.

use axum::http::StatusCode;
use serde_json::json;

use crate::harness::*;

#[tokio::test]
async fn health_readiness_and_metrics_answer() {
    let app = TestApp::new().await;
    let (s, _) = app.get("/healthz").await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = app.get("/readyz").await;
    assert_eq!(s, StatusCode::OK);
    app.gql(Some(&app.admin_token()), "query { me { role } }", json!({}))
        .await;
    let (s, body) = app.metrics().await;
    assert_eq!(s, StatusCode::OK);
    let text = String::from_utf8(body).unwrap();
    assert!(text.contains("fitorder_http_requests_total"), "{text}");
    let (s, body) = app.get("/graphql").await;
    assert_eq!(s, StatusCode::OK);
    let html = String::from_utf8(body).unwrap();
    assert!(html.contains("/graphql/assets/init.js"), "{html}");
    let (_, boot) = app.get("/graphql/assets/init.js").await;
    let boot = String::from_utf8(boot).unwrap();
    assert!(boot.contains("/graphql/ws") && boot.contains("Authorization"));
}

#[tokio::test]
async fn readiness_fails_when_the_database_is_gone() {
    let mut config = fitorder::config::Config::for_tests("postgres://postgres@127.0.0.1:1/none".into());
    config.db_pool_size = 1;
    let pool = fitorder::db::pool(config.database_url.as_deref().unwrap(), 1).unwrap();
    let router = fitorder::http::router(fitorder::app::AppState::new(pool, config));
    use tower::ServiceExt;
    let started = std::time::Instant::now();
    let resp = router
        .clone()
        .oneshot(
            axum::http::Request::get("/readyz")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    // GraphQL answers INTERNAL rather than hanging.
    let token = fitorder::auth::issue_token(
        "test-secret-not-for-production-0123456789",
        fitorder::auth::Role::Admin,
        "a",
        None,
        std::time::Duration::from_secs(60),
    );
    let resp = router
        .oneshot(
            axum::http::Request::post("/graphql")
                .header("content-type", "application/json")
                .header("authorization", format!("Bearer {token}"))
                .body(axum::body::Body::from(r#"{"query":"{ orders { totalCount } }"}"#))
                .unwrap(),
        )
        .await
        .unwrap();
    use http_body_util::BodyExt;
    let body: serde_json::Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(error_code(&body), "INTERNAL");
    assert!(started.elapsed() < std::time::Duration::from_secs(15));
}

#[tokio::test]
async fn the_callers_trace_id_lands_on_every_row_the_request_writes() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let body = serde_json::to_vec(&json!({
        "query": MEMBER_OPS, "operationName": "PlaceOrder",
        "variables": {"input": {"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WALLET"}}
    }))
    .unwrap();
    let auth = format!("Bearer {}", app.member_token(&s.member));
    let (status, headers, bytes) = app
        .post(
            "/graphql",
            &[
                ("content-type", "application/json"),
                ("authorization", &auth),
                ("traceparent", &format!("00-{trace}-00f067aa0ba902b7-01")),
            ],
            body,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-trace-id"], trace);
    let r: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(r["data"]["placeOrder"]["order"]["traceId"], trace);
    for table in [
        "orders",
        "order_transitions",
        "wallet_ledger",
        "payments",
        "compensation_events",
    ] {
        let n = app
            .sql_i64(&format!("SELECT count(*) AS v FROM {table} WHERE trace_id <> '{trace}' AND trace_id IN (SELECT trace_id FROM orders)"))
            .await;
        assert_eq!(n, 0, "{table}");
        let with = app
            .sql_i64(&format!("SELECT count(*) AS v FROM {table} WHERE trace_id = '{trace}'"))
            .await;
        assert!(with >= 1, "{table} has no row with the trace id");
    }
}

#[tokio::test]
async fn oversized_bodies_are_refused_with_413() {
    let app = TestApp::new().await;
    let big = vec![b'x'; 3 * 1024 * 1024];
    let (status, _, _) = app.post("/graphql", &[("content-type", "application/json")], big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}
