//! Issue 23, the business side: what a member may hold, how fast they may place, what a flood of
//! unsigned callbacks leaves behind, which signed notifications are still not payments, wallet
//! bounds, what a store-limited admin may read, the sandbox cashier's cross-site POST, and
//! refunds of a provider this process lacks.

use fitorder::config::ExposeSecret;
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use fitorder::auth::{issue_token, Role};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::harness::*;
use crate::providers;

const PLACE: &str = "mutation($i: PlaceOrderInput!) { placeOrder(input: $i) { order { orderNo status expiresAt } } }";

fn reason(r: &Value) -> String {
    r["errors"][0]["extensions"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

async fn expire(app: &TestApp) -> i64 {
    fitorder::expiry::expire_due(&app.state)
        .await
        .map_err(|e| e.message())
        .unwrap()
}

#[tokio::test]
async fn an_offline_order_a_member_places_expires_and_gives_its_seat_back_once() {
    let app = TestApp::with_config(|c| c.offline_order_timeout = Duration::from_millis(800)).await;
    let s = app.studio(0, None, 2).await;
    let other = app.new_member(&s.store, 0).await;
    let mine = app
        .place(
            &s.member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"coachSlotId": s.slot}, "paymentMethod": "OFFLINE"}),
        )
        .await;
    assert!(mine["order"]["expiresAt"].is_string(), "{mine}");
    let no = mine["order"]["orderNo"].as_str().unwrap().to_string();
    // The desk's OFFLINE order (the member pays at the counter) has no deadline.
    let desk = app
        .admin(
            PLACE,
            json!({"i": {"idempotencyKey": key(), "storeId": s.store, "memberId": other,
                         "item": {"coachSlotId": s.slot}, "paymentMethod": "OFFLINE"}}),
        )
        .await;
    assert!(desk["placeOrder"]["order"]["expiresAt"].is_null(), "{desk}");
    let desk_no = desk["placeOrder"]["order"]["orderNo"].as_str().unwrap().to_string();
    let remaining = || app.sql_i64("SELECT remaining::bigint AS v FROM coach_slots");
    assert_eq!(remaining().await, 0, "both seats held");
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    // Three expirers at once, as three instances would.
    let (a, b, c) = tokio::join!(expire(&app), expire(&app), expire(&app));
    assert_eq!(a + b + c, 1, "canceled exactly once");
    let o = app.order(&no).await;
    assert_eq!(
        (o["status"].as_str(), o["cancelReason"].as_str()),
        (Some("CANCELED"), Some("TIMEOUT"))
    );
    assert_eq!(remaining().await, 1, "the member's seat is back, once");
    assert_eq!(app.order(&desk_no).await["status"], "WAIT_PAY");
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT count(*) AS v FROM order_transitions t JOIN orders o ON o.id = t.order_id
              WHERE o.order_no = '{no}' AND t.to_status = 'CANCELED'"
        ))
        .await,
        1
    );
    // The desk cannot confirm a payment for it any more.
    let r = app
        .gql(
            Some(&app.admin_token()),
            CONFIRM_OFFLINE,
            json!({"orderNo": no, "reference": "R-1"}),
        )
        .await;
    assert_eq!(error_code(&r), "ILLEGAL_TRANSITION", "{r}");
}

#[tokio::test]
async fn a_member_holds_at_most_five_unpaid_orders_even_placing_twelve_at_once() {
    let app = TestApp::with_config(|c| c.max_open_orders = 5).await;
    let s = app.studio(0, None, 3).await;
    let token = app.member_token(&s.member);
    let keys: Vec<String> = (0..12).map(|_| key()).collect();
    let answers = futures_util::future::join_all(keys.iter().map(|k| {
        app.gql(
            Some(&token),
            PLACE,
            json!({"i": {"idempotencyKey": k, "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "OFFLINE"}}),
        )
    }))
    .await;
    let placed: Vec<&Value> = answers.iter().filter(|r| r.get("errors").is_none()).collect();
    assert_eq!(placed.len(), 5, "{answers:#?}");
    for r in answers.iter().filter(|r| r.get("errors").is_some()) {
        assert_eq!(
            (error_code(r), reason(r)),
            ("BAD_USER_INPUT".into(), "TOO_MANY_OPEN_ORDERS".into()),
            "{r}"
        );
    }
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM orders WHERE status = 'WAIT_PAY'")
            .await,
        5
    );
    // A retry of a placed order is answered as the first time, cap or not.
    let first_key = keys
        .iter()
        .zip(&answers)
        .find(|(_, r)| r.get("errors").is_none())
        .unwrap()
        .0;
    let again = app
        .gql(
            Some(&token),
            PLACE,
            json!({"i": {"idempotencyKey": first_key, "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "OFFLINE"}}),
        )
        .await;
    assert!(again.get("errors").is_none(), "{again}");
    // The desk is held to the same cap for this member.
    let desk = app
        .gql(
            Some(&app.admin_token()),
            PLACE,
            json!({"i": {"idempotencyKey": key(), "storeId": s.store, "memberId": s.member,
                         "item": {"classPackId": s.pack}, "paymentMethod": "OFFLINE"}}),
        )
        .await;
    assert_eq!(reason(&desk), "TOO_MANY_OPEN_ORDERS", "{desk}");
    // One canceled: room for one more.
    let no = placed[0]["data"]["placeOrder"]["order"]["orderNo"].as_str().unwrap();
    app.ok(&token, CANCEL, json!({"orderNo": no})).await;
    let one_more = app
        .gql(
            Some(&token),
            PLACE,
            json!({"i": {"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WALLET"}}),
        )
        .await;
    // A wallet order is paid at once (here: refused for want of money), never held.
    assert_eq!(error_code(&one_more), "INSUFFICIENT_FUNDS", "{one_more}");
    let one_more = app
        .gql(
            Some(&token),
            PLACE,
            json!({"i": {"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "OFFLINE"}}),
        )
        .await;
    assert!(one_more.get("errors").is_none(), "{one_more}");
}

#[tokio::test]
async fn placing_is_rate_limited_per_member() {
    let app = TestApp::with_config(|c| c.place_rate_per_minute = 3).await;
    let s = app.studio(100_000, None, 3).await;
    let other = app.new_member(&s.store, 100_000).await;
    let app = &app;
    let place = |member: &str| {
        let token = app.member_token(member);
        let vars = json!({"i": {"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WALLET"}});
        async move { app.gql(Some(&token), PLACE, vars).await }
    };
    for _ in 0..3 {
        let r = place(&s.member).await;
        assert!(r.get("errors").is_none(), "{r}");
    }
    let r = place(&s.member).await;
    assert_eq!(
        (error_code(&r), reason(&r)),
        ("BAD_USER_INPUT".into(), "RATE_LIMITED".into()),
        "{r}"
    );
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM orders").await, 3);
    // Another member is not held back by the first one's rate.
    let r = place(&other).await;
    assert!(r.get("errors").is_none(), "{r}");
}

async fn unsigned_post(app: &TestApp, from: SocketAddr) -> StatusCode {
    let req = Request::post("/pay/wechat/notify")
        .header("content-type", "application/json")
        .extension(ConnectInfo(from))
        .body(Body::from(r#"{"id":"forged","event_type":"TRANSACTION.SUCCESS"}"#))
        .unwrap();
    app.router.clone().oneshot(req).await.unwrap().status()
}

const SCRAPE: &str = "scrape-token-business-limits";

async fn unverified_counted(app: &TestApp) -> u64 {
    let req = Request::get("/metrics")
        .header("authorization", format!("Bearer {SCRAPE}"))
        .body(Body::empty())
        .unwrap();
    let resp = app.router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    String::from_utf8(body)
        .unwrap()
        .lines()
        .find(|l| l.starts_with("fitorder_callbacks_unverified_total{provider=\"WECHAT_PAY\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

#[tokio::test]
async fn thousands_of_unsigned_callbacks_leave_a_bounded_sample_and_are_all_counted() {
    let app = TestApp::with_config(|c| {
        providers::configure(c);
        c.metrics_token = Some(SCRAPE.into());
    })
    .await;
    let flood: SocketAddr = "203.0.113.9:40000".parse().unwrap();
    let before = unverified_counted(&app).await;
    for _ in 0..3_000 {
        assert_eq!(unsigned_post(&app, flood).await, StatusCode::UNAUTHORIZED);
    }
    let rows = app
        .sql_i64("SELECT count(*) AS v FROM payment_callbacks WHERE NOT verified")
        .await;
    let limit = app.state.config.unverified_callbacks_per_minute as i64;
    assert!(rows >= limit, "the first ones are kept whole: {rows}");
    assert!(rows <= limit + 3_000 / 100 + 1, "a sample, not a row each: {rows}");
    assert!(
        unverified_counted(&app).await - before >= 3_000,
        "the metric counts every one"
    );
    // Another address still leaves its evidence.
    let other: SocketAddr = "198.51.100.4:40000".parse().unwrap();
    for _ in 0..3 {
        unsigned_post(&app, other).await;
    }
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM payment_callbacks WHERE NOT verified")
            .await,
        rows + 3
    );
}

/// A WeChat notification of `resource` under `event_type`, signed as WeChat signs, with the
/// timestamp header written as `ts` (e.g. `+1733000000`).
fn wechat_signed_with_timestamp(
    event_type: &str,
    resource: &Value,
    ts: &str,
) -> fitorder::dev::sandbox::WechatNotification {
    use base64::Engine;
    use rsa::signature::{SignatureEncoding, Signer};
    let mut n = providers::wechat().notification(event_type, resource, chrono::Utc::now().timestamp());
    let nonce = n
        .headers
        .iter()
        .find(|(k, _)| *k == "Wechatpay-Nonce")
        .unwrap()
        .1
        .clone();
    let message = format!("{ts}\n{nonce}\n{}\n", String::from_utf8(n.body.clone()).unwrap());
    let key = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(providers::wechat_platform_private());
    let sig = base64::engine::general_purpose::STANDARD.encode(key.sign(message.as_bytes()).to_bytes());
    for (k, v) in n.headers.iter_mut() {
        match *k {
            "Wechatpay-Timestamp" => *v = ts.to_string(),
            "Wechatpay-Signature" => *v = sig.clone(),
            _ => {}
        }
    }
    n
}

async fn order_of(app: &TestApp, s: &Studio, pack: &str, method: &str) -> String {
    app.buy(&s.member, &s.store, json!({"classPackId": pack}), method).await
}

async fn tickets_of(app: &TestApp, no: &str) -> Vec<String> {
    app.order(no).await["tickets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["kind"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn signed_wechat_notifications_that_are_not_our_payment_are_refused() {
    const MOBILE_APP_ID: &str = "wx5e2f1d0c9b8a7f60";
    let app = TestApp::with_config(|c| {
        providers::configure(c);
        c.wechatpay.mobile_app_id = Some(MOBILE_APP_ID.into());
    })
    .await;
    let s = app.studio(0, None, 3).await;
    let w = providers::wechat();
    let no = order_of(&app, &s, &s.pack, "WECHAT_PAY").await;
    let now = chrono::Utc::now().timestamp();
    let paid = |r: &mut Value| {
        r["transaction_id"] = json!(format!("42{}", key()));
    };
    let mut cases: Vec<(&str, fitorder::dev::sandbox::WechatNotification)> = vec![];
    let mut usd = w.transaction(&no, "4200000000000000000000000001", 10_000);
    usd["amount"]["currency"] = json!("USD");
    cases.push(("USD", w.notification("TRANSACTION.SUCCESS", &usd, now)));
    let mut foreign = w.transaction(&no, "4200000000000000000000000002", 10_000);
    foreign["appid"] = json!("wx0000000000000000");
    cases.push(("foreign appid", w.notification("TRANSACTION.SUCCESS", &foreign, now)));
    let mut unknown = w.transaction(&no, "4200000000000000000000000003", 10_000);
    paid(&mut unknown);
    cases.push((
        "unknown event_type",
        w.notification("TRANSACTION.PAID_MAYBE", &unknown, now),
    ));
    let mut no_time = w.transaction(&no, "4200000000000000000000000004", 10_000);
    no_time["success_time"] = json!("not-a-time");
    cases.push(("success_time", w.notification("TRANSACTION.SUCCESS", &no_time, now)));
    let plus = w.transaction(&no, "4200000000000000000000000005", 10_000);
    cases.push((
        "+timestamp",
        wechat_signed_with_timestamp("TRANSACTION.SUCCESS", &plus, &format!("+{now}")),
    ));
    for (what, n) in &cases {
        let (status, _) = app.wechat_notify(n).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}");
        assert_eq!(app.order(&no).await["status"], "WAIT_PAY", "{what}");
    }
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payments").await, 0);
    // The same payment, as WeChat sends it, is one.
    let good = w.notification(
        "TRANSACTION.SUCCESS",
        &w.transaction(&no, "4200000000000000000000000006", 10_000),
        now,
    );
    assert_eq!(app.wechat_notify(&good).await.0, StatusCode::NO_CONTENT);
    assert_eq!(app.order(&no).await["status"], "PAID");
    // A trade of the mobile app (`WECHAT_APP`) carries the mobile app's appid: ours too.
    let app_order = order_of(&app, &s, &s.pack, "WECHAT_PAY").await;
    let mut mobile = w.transaction(&app_order, "4200000000000000000000000007", 10_000);
    mobile["appid"] = json!(MOBILE_APP_ID);
    let n = w.notification("TRANSACTION.SUCCESS", &mobile, now);
    assert_eq!(app.wechat_notify(&n).await.0, StatusCode::NO_CONTENT);
    assert_eq!(app.order(&app_order).await["status"], "PAID");
}

#[tokio::test]
async fn a_payment_through_the_other_provider_is_a_ticket_not_a_payment() {
    let app = TestApp::with_config(providers::configure).await;
    let s = app.studio(0, None, 3).await;
    // WeChat Pay says it collected an Alipay order's money.
    let alipay_order = order_of(&app, &s, &s.pack, "ALIPAY").await;
    assert_eq!(
        app.wechat_paid(&alipay_order, "4200000000000000000000000011", 10_000)
            .await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(app.order(&alipay_order).await["status"], "WAIT_PAY");
    assert_eq!(tickets_of(&app, &alipay_order).await, ["AMOUNT_MISMATCH"]);
    // And the reverse.
    let wechat_order = order_of(&app, &s, &s.pack, "WECHAT_PAY").await;
    let form = providers::alipay().notification(&[
        ("out_trade_no", &wechat_order),
        ("trade_no", "2026120122001400000000000011"),
        ("trade_status", "TRADE_SUCCESS"),
        ("total_amount", "100.00"),
        ("gmt_payment", "2026-12-01 08:10:05"),
    ]);
    assert_eq!(app.alipay_notify(&form).await, (StatusCode::OK, "success".to_string()));
    assert_eq!(app.order(&wechat_order).await["status"], "WAIT_PAY");
    assert_eq!(tickets_of(&app, &wechat_order).await, ["AMOUNT_MISMATCH"]);
    // An order paid at the desk is not paid by a provider's notification either.
    let offline = order_of(&app, &s, &s.pack, "OFFLINE").await;
    assert_eq!(
        app.wechat_paid(&offline, "4200000000000000000000000012", 10_000).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(app.order(&offline).await["status"], "WAIT_PAY");
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payments").await, 0);
}

#[tokio::test]
async fn signed_alipay_notifications_with_odd_amounts_or_another_seller_are_refused() {
    const SELLER: &str = "2088101106499364";
    let app = TestApp::with_config(|c| {
        providers::configure(c);
        c.alipay.seller_id = Some(SELLER.into());
    })
    .await;
    let s = app.studio(0, None, 3).await;
    let pack = app
        .admin(
            "mutation($i: CreateClassPackInput!) { createClassPack(input: $i) { id } }",
            json!({"i": {"storeId": s.store, "name": "Year", "sessions": 100, "priceCents": 99_900}}),
        )
        .await["createClassPack"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let no = order_of(&app, &s, &pack, "ALIPAY").await;
    let a = providers::alipay();
    let form = |amount: &str, seller: &str, app_id: &str| {
        a.notification(&[
            ("out_trade_no", &no),
            ("trade_no", &format!("20261201220014{}", &key()[..8])),
            ("trade_status", "TRADE_SUCCESS"),
            ("total_amount", amount),
            ("seller_id", seller),
            ("app_id", app_id),
            ("gmt_payment", "2026-12-01 08:10:05"),
        ])
    };
    for amount in ["999", "0999.00", "999.00 ", "+999.00", "999.0"] {
        let (status, _) = app.alipay_notify(&form(amount, SELLER, providers::APP_ID)).await;
        assert!(status.is_client_error(), "{amount:?}: {status}");
        assert_eq!(app.order(&no).await["status"], "WAIT_PAY", "{amount:?}");
    }
    for (seller, app_id) in [("2088000000000001", providers::APP_ID), (SELLER, "2021000000000999")] {
        let (status, _) = app.alipay_notify(&form("999.00", seller, app_id)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{seller} {app_id}");
        assert_eq!(app.order(&no).await["status"], "WAIT_PAY");
    }
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payments").await, 0);
    let (status, reply) = app.alipay_notify(&form("999.00", SELLER, providers::APP_ID)).await;
    assert_eq!((status, reply.as_str()), (StatusCode::OK, "success"));
    assert_eq!(app.order(&no).await["status"], "PAID");
}

const TOP_UP: &str =
    "mutation($m: ID!, $a: Int!, $r: String!) { topUpWallet(memberId: $m, amountCents: $a, reference: $r) { wallet { balanceCents } } }";

#[tokio::test]
async fn top_ups_and_balances_are_bounded_in_the_api_and_in_the_database() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 3).await;
    let app = &app;
    let top_up = |amount: i64| {
        let token = app.admin_token();
        let vars = json!({"m": s.member, "a": amount, "r": key()});
        async move { app.gql(Some(&token), TOP_UP, vars).await }
    };
    for too_much in [2_147_483_647i64, 5_000_001] {
        let r = top_up(too_much).await;
        assert_eq!(error_code(&r), "BAD_USER_INPUT", "{too_much}: {r}");
    }
    for _ in 0..20 {
        let r = top_up(5_000_000).await;
        assert!(r.get("errors").is_none(), "{r}");
    }
    let r = top_up(1).await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT", "over the balance cap: {r}");
    // Every read of the wallet still works.
    assert_eq!(app.member_view(&s.member).await["wallet"]["balanceCents"], 100_000_000);
    // The database refuses what the API would not write.
    let mut c = app.conn().await;
    use diesel_async::RunQueryDsl;
    let top_up_row = diesel::sql_query(format!(
        "INSERT INTO wallet_ledger (member_id, kind, balance_delta, frozen_delta, actor, trace_id, reference)
         VALUES ({}, 'TOP_UP', 2147483647, 0, 'probe', 't', 'big')",
        s.member
    ))
    .execute(&mut c)
    .await;
    assert!(
        format!("{top_up_row:?}").contains("wallet_top_up_in_range"),
        "{top_up_row:?}"
    );
    let refund_row = diesel::sql_query(format!(
        "INSERT INTO wallet_ledger (member_id, kind, balance_delta, frozen_delta, actor, trace_id)
         VALUES ({}, 'REFUND', 2100000000, 0, 'probe', 't')",
        s.member
    ))
    .execute(&mut c)
    .await;
    assert!(
        format!("{refund_row:?}").contains("wallet_balance_fits_int"),
        "{refund_row:?}"
    );
}

#[tokio::test]
async fn a_store_limited_admin_reads_no_chain_wide_runs_nor_storeless_tickets() {
    let app = TestApp::with_config(providers::configure).await;
    let s = app.studio(0, None, 3).await;
    let limited = issue_token(
        app.state.config.jwt_secret.expose_secret(),
        Role::Admin,
        "desk-1",
        Some(vec![s.store.clone()]),
        Duration::from_secs(600),
    );
    for q in [
        "{ reconciliationRuns(first: 5) { edges { node { id } } } }",
        "{ taskRuns(first: 5) { task } }",
    ] {
        assert_eq!(app.err_code(Some(&limited), q, json!({})).await, "FORBIDDEN", "{q}");
        let r = app.gql(Some(&app.admin_token()), q, json!({})).await;
        assert!(r.get("errors").is_none(), "the chain-wide admin may: {r}");
    }
    // A payment for an order nobody knows: a ticket of no store.
    assert_eq!(
        app.wechat_paid("FO20990101000001", "4200000000000000000000000021", 100)
            .await,
        StatusCode::NO_CONTENT
    );
    let id = app
        .sql_i64("SELECT id AS v FROM exception_tickets WHERE kind = 'UNKNOWN_ORDER'")
        .await;
    let one = "query($id: ID!) { exceptionTicket(id: $id) { id kind } }";
    let r = app.gql(Some(&limited), one, json!({"id": id.to_string()})).await;
    assert!(r["data"]["exceptionTicket"].is_null(), "{r}");
    let list = "{ exceptionTickets(first: 50) { edges { node { id kind } } } }";
    let r = app.ok(&limited, list, json!({})).await;
    assert!(!r.to_string().contains("UNKNOWN_ORDER"), "{r}");
    let resolve = "mutation($id: ID!) { resolveTicket(id: $id, action: NO_ACTION) { id status } }";
    let r = app.gql(Some(&limited), resolve, json!({"id": id.to_string()})).await;
    assert_eq!(error_code(&r), "NOT_FOUND", "{r}");
    let r = app.admin(one, json!({"id": id.to_string()})).await;
    assert_eq!(r["exceptionTicket"]["kind"], "UNKNOWN_ORDER");
}

#[tokio::test]
async fn the_sandbox_cashier_refuses_a_cross_site_post() {
    let app = TestApp::served().await;
    let s = app.studio(0, None, 3).await;
    let no = order_of(&app, &s, &s.pack, "WECHAT_PAY").await;
    let url = app.sandbox.cashier_url("WECHAT_PAY", &no);
    let http = reqwest::Client::new();
    let post = |origin: Option<&str>, token: Option<&str>| {
        let mut r = http.post(format!("{url}/pay"));
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        if let Some(t) = token {
            r = r.header("x-cashier-token", t);
        }
        r.send()
    };
    // What a page on another site can send: a form or a fetch, without the page's token.
    assert_eq!(post(Some("http://evil.example"), None).await.unwrap().status(), 403);
    assert_eq!(post(None, None).await.unwrap().status(), 403);
    let page = http.get(&url).send().await.unwrap().text().await.unwrap();
    let token = page
        .split("data-token=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string();
    assert_eq!(
        post(Some("http://evil.example"), Some(&token)).await.unwrap().status(),
        403
    );
    assert_eq!(post(None, Some("0".repeat(64).as_str())).await.unwrap().status(), 403);
    assert_eq!(app.order(&no).await["status"], "WAIT_PAY");
    // The page's own button: same origin, its token.
    let origin = url.split("/cashier").next().unwrap().to_string();
    let paid: Value = post(Some(&origin), Some(&token)).await.unwrap().json().await.unwrap();
    assert_eq!(paid["ok"], true, "{paid}");
    assert_eq!(app.order(&no).await["status"], "PAID");
}

#[tokio::test]
async fn a_process_without_a_provider_leaves_its_refunds_to_one_that_has_it() {
    let app = TestApp::with_config(providers::configure).await;
    let s = app.studio(0, None, 3).await;
    let no = order_of(&app, &s, &s.pack, "WECHAT_PAY").await;
    assert_eq!(
        app.wechat_paid(&no, "4200000000000000000000000031", 10_000).await,
        StatusCode::NO_CONTENT
    );
    app.admin(REFUND, json!({"orderNo": no, "reason": "moving away"})).await;
    // A production-mode process on the same database, with no provider keys.
    let mut bare = (*app.state.config).clone();
    providers::unconfigure(&mut bare);
    let pool = fitorder::db::pool(&app.db_url, 4).unwrap();
    let other = fitorder::app::AppState::with_keys(
        pool,
        bare,
        fitorder::providers::keys::ProviderKeys::default(),
        fitorder::events::EventHub::detached(),
        app.db_url.clone(),
    );
    assert!(fitorder::compensation::worker::served_providers(&other).is_empty());
    let worker = fitorder::compensation::worker::Worker::new(other);
    for _ in 0..5 {
        worker.run_once().await.unwrap();
    }
    let refund = "SELECT {} AS v FROM compensation_events WHERE kind = 'PROVIDER_REFUND'";
    assert_eq!(
        app.sql_i64(&refund.replace("{}", "attempts::bigint")).await,
        0,
        "never attempted"
    );
    assert_eq!(
        app.sql_i64(&refund.replace("{}", "(status = 'PENDING')::int::bigint"))
            .await,
        1
    );
    assert_eq!(
        app.sql_i64(&refund.replace("{}", "(locked_by IS NULL)::int::bigint"))
            .await,
        1,
        "never claimed"
    );
    // The door and AI events are anyone's: delivered (simulated) by that process.
    assert_eq!(
        app.sql_i64(
            "SELECT count(*) AS v FROM compensation_events WHERE kind <> 'PROVIDER_REFUND' AND status = 'SUCCEEDED'"
        )
        .await,
        4
    );
    // The process that has WeChat Pay asks WeChat (whose sandbox never saw this payment, which
    // was notified by hand above, and says so): an attempt at the provider, not "not configured".
    let served = fitorder::compensation::worker::Worker::new(app.state.clone());
    served.run_once().await.unwrap();
    let q = "query($n: String!) { order(orderNo: $n) { compensation { kind attempts lastError } } }";
    let seen = app.admin(q, json!({"n": no})).await;
    let refund_event = seen["order"]["compensation"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == "PROVIDER_REFUND")
        .unwrap()
        .clone();
    assert_eq!(refund_event["attempts"], 1, "{seen}");
    let error = refund_event["lastError"].as_str().unwrap_or_default();
    assert!(error.contains("refused by the provider"), "{seen}");
}
