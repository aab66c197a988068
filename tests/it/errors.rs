//! What outside callers read when something fails: a stable message and the trace id, never the
//! database's text or a constraint's name (those go to the log and the callback row).

use axum::http::StatusCode;
use diesel_async::RunQueryDsl;
use serde_json::{json, Value};

use crate::harness::*;
use crate::providers;

async fn exec(app: &TestApp, sql: &str) {
    let mut c = app.conn().await;
    diesel::sql_query(sql).execute(&mut c).await.unwrap();
}

#[tokio::test]
async fn a_constraint_nobody_expects_is_internal_and_its_name_stays_inside() {
    let app = TestApp::new().await;
    // A CHECK no call site knows (a bug, as far as the API is concerned).
    exec(
        &app,
        "ALTER TABLE stores ADD CONSTRAINT stores_test_only_refusal CHECK (name <> 'Refused by a test')",
    )
    .await;
    let body = json!({
        "query": "mutation($i: CreateStoreInput!) { createStore(input: $i) { id } }",
        "variables": {"i": {"name": "Refused by a test", "code": "REFUSED1"}},
    });
    let (status, headers, bytes) = app
        .post(
            "/graphql",
            &[
                ("content-type", "application/json"),
                ("authorization", &format!("Bearer {}", app.admin_token())),
            ],
            serde_json::to_vec(&body).unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(bytes).unwrap();
    let r: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(error_code(&r), "INTERNAL", "{r}");
    assert_eq!(r["errors"][0]["message"], "internal error", "{r}");
    for inside in ["stores_test_only_refusal", "violates", "constraint", "stores"] {
        assert!(!text.contains(inside), "{inside:?} reached the caller: {text}");
    }
    // The caller has the trace id to quote: the response header's.
    let trace = headers.get("x-trace-id").unwrap().to_str().unwrap();
    assert_eq!(r["errors"][0]["extensions"]["traceId"], trace, "{r}");
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM stores WHERE code = 'REFUSED1'")
            .await,
        0
    );
    // Errors the caller can act on carry no trace id: their message says what to do.
    let dup = app
        .gql(
            Some(&app.admin_token()),
            "mutation($i: CreateStoreInput!) { createStore(input: $i) { id } }",
            json!({"i": {"name": "A", "code": "DUP1"}}),
        )
        .await;
    assert!(dup.get("errors").is_none(), "{dup}");
    let again = app
        .gql(
            Some(&app.admin_token()),
            "mutation($i: CreateStoreInput!) { createStore(input: $i) { id } }",
            json!({"i": {"name": "B", "code": "DUP1"}}),
        )
        .await;
    assert_eq!(error_code(&again), "CONFLICT", "{again}");
    assert!(again["errors"][0]["extensions"].get("traceId").is_none(), "{again}");
}

#[tokio::test]
async fn a_callback_that_cannot_be_applied_tells_the_provider_only_to_retry() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 3).await;
    let wechat_no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WECHAT_PAY")
        .await;
    let alipay_no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "ALIPAY")
        .await;
    // Applying a payment runs into a constraint nobody expects.
    exec(
        &app,
        "ALTER TABLE payments ADD CONSTRAINT payments_test_only_refusal CHECK (amount_cents < 0) NOT VALID",
    )
    .await;
    let w = providers::wechat();
    let n = w.notification(
        "TRANSACTION.SUCCESS",
        &w.transaction(&wechat_no, "4200000000000000000000000777", 10_000),
        chrono::Utc::now().timestamp(),
    );
    let (status, reply) = app.wechat_notify(&n).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(reply, json!({"code": "FAIL", "message": "not processed, please retry"}));
    let (status, reply) = app
        .alipay_notify(&providers::alipay().payment(
            &alipay_no,
            "2026113022001400000000000777",
            "TRADE_SUCCESS",
            "100.00",
        ))
        .await;
    assert_eq!((status, reply.as_str()), (StatusCode::INTERNAL_SERVER_ERROR, "failure"));
    // Nothing was applied; the rows say why, for the people who look.
    for no in [&wechat_no, &alipay_no] {
        assert_eq!(app.order(no).await["status"], "WAIT_PAY");
    }
    assert_eq!(
        app.sql_i64(
            "SELECT count(*) AS v FROM payment_callbacks
              WHERE outcome = 'RECEIVED' AND error LIKE '%payments_test_only_refusal%'"
        )
        .await,
        2
    );
    // Once the cause is gone, the provider's retry applies it.
    exec(&app, "ALTER TABLE payments DROP CONSTRAINT payments_test_only_refusal").await;
    assert_eq!(app.wechat_notify(&n).await.0, StatusCode::NO_CONTENT);
    assert_eq!(app.order(&wechat_no).await["status"], "PAID");
}

#[tokio::test]
async fn a_callback_without_a_database_connection_is_answered_503() {
    let app = TestApp::with_config(|c| c.db_pool_size = 1).await;
    let s = app.studio(0, None, 3).await;
    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WECHAT_PAY")
        .await;
    // Every connection of the pool is taken: the notification is recorded (the evidence has
    // its own connections) but cannot be applied within the checkout wait.
    let held = app.conn().await;
    let (status, reply) = app
        .wechat_notify(&providers::wechat().notification(
            "TRANSACTION.SUCCESS",
            &providers::wechat().transaction(&no, "4200000000000000000000000778", 10_000),
            chrono::Utc::now().timestamp(),
        ))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply["code"], "FAIL");
    assert_eq!(reply["message"], "temporarily unavailable, please retry");
    drop(held);
    assert_eq!(app.order(&no).await["status"], "WAIT_PAY");
}
