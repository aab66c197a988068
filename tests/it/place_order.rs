//! Placing orders: idempotency keys (also under concurrency), seat and stock contention,
//! wallet and MIXED money, expiry deadlines.

use serde_json::json;

use crate::harness::*;

#[tokio::test]
async fn the_same_key_returns_the_same_order_and_answer() {
    let app = TestApp::new().await;
    let s = app.studio(0, Some(5), 3).await;
    let k = key();
    let input = json!({"idempotencyKey": k, "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WECHAT_PAY"});
    let first = app.place(&s.member, input.clone()).await;
    let second = app.place(&s.member, input.clone()).await;
    assert_eq!(first, second);
    assert_eq!(first["order"]["status"], "WAIT_PAY");
    assert_eq!(first["payment"]["provider"], "WECHAT_PAY");
    assert_eq!(first["payment"]["outTradeNo"], first["order"]["orderNo"]);
    assert_eq!(first["payment"]["amountCents"], 10000);
    assert!(first["order"]["expiresAt"].is_string());
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM orders").await, 1);
    // One stock unit held, not two.
    assert_eq!(app.sql_i64("SELECT stock::bigint AS v FROM class_packs").await, 4);

    // The same key with another request is a conflict, not a silent second answer.
    let other = json!({"idempotencyKey": k, "storeId": s.store, "item": {"coachSlotId": s.slot}, "paymentMethod": "WECHAT_PAY"});
    let r = app
        .op(
            &app.member_token(&s.member),
            MEMBER_OPS,
            "PlaceOrder",
            json!({"input": other}),
        )
        .await;
    assert_eq!(error_code(&r), "CONFLICT");
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM orders").await, 1);
}

#[tokio::test]
async fn thirty_simultaneous_double_taps_make_one_order() {
    let app = std::sync::Arc::new(TestApp::new().await);
    let s = app.studio(100_000, Some(50), 3).await;
    let input = json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WALLET"});
    let mut tasks = vec![];
    for _ in 0..30 {
        let (app, member, input) = (app.clone(), s.member.clone(), input.clone());
        tasks.push(tokio::spawn(async move {
            app.op(
                &app.member_token(&member),
                MEMBER_OPS,
                "PlaceOrder",
                json!({"input": input}),
            )
            .await
        }));
    }
    let mut order_nos = std::collections::HashSet::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert!(r.get("errors").is_none(), "{r}");
        order_nos.insert(
            r["data"]["placeOrder"]["order"]["orderNo"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(order_nos.len(), 1);
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM orders").await, 1);
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payments").await, 1);
    // Paid once from the wallet.
    let m = app.member_view(&s.member).await;
    assert_eq!(m["wallet"]["balanceCents"], 90_000);
    assert_eq!(m["sessionCredits"], 10);
}

#[tokio::test]
async fn the_last_seat_goes_to_exactly_one_of_many() {
    let app = std::sync::Arc::new(TestApp::new().await);
    let s = app.studio(0, None, 3).await;
    let mut members = vec![];
    for _ in 0..10 {
        members.push(app.new_member(&s.store, 50_000).await);
    }
    let mut tasks = vec![];
    for m in members.clone() {
        let (app, store, slot) = (app.clone(), s.store.clone(), s.slot.clone());
        tasks.push(tokio::spawn(async move {
            let input = json!({"idempotencyKey": key(), "storeId": store, "item": {"coachSlotId": slot}, "paymentMethod": "WALLET"});
            app.op(&app.member_token(&m), MEMBER_OPS, "PlaceOrder", json!({"input": input}))
                .await
        }));
    }
    let (mut won, mut sold_out) = (0, 0);
    for t in tasks {
        let r = t.await.unwrap();
        match r.get("errors") {
            None => won += 1,
            Some(_) => {
                assert_eq!(error_code(&r), "SOLD_OUT", "{r}");
                sold_out += 1;
            }
        }
    }
    assert_eq!((won, sold_out), (3, 7));
    assert_eq!(app.sql_i64("SELECT remaining::bigint AS v FROM coach_slots").await, 0);
    // The losers paid nothing.
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM members WHERE balance_cents = 50000")
            .await,
        7
    );
    // A refund puts the seat back on sale.
    let order_no: String = {
        let r = app
            .admin(
                "query { orders(first: 1, filter: {status: [PAID]}) { edges { node { orderNo } } } }",
                json!({}),
            )
            .await;
        r["orders"]["edges"][0]["node"]["orderNo"].as_str().unwrap().to_string()
    };
    app.admin(REFUND, json!({"orderNo": order_no, "reason": "coach ill"}))
        .await;
    assert_eq!(app.sql_i64("SELECT remaining::bigint AS v FROM coach_slots").await, 1);
}

#[tokio::test]
async fn stock_runs_out_and_comes_back_on_cancel() {
    let app = TestApp::new().await;
    let s = app.studio(0, Some(2), 3).await;
    let place = |k: String| json!({"idempotencyKey": k, "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "ALIPAY"});
    let a = app.place(&s.member, place(key())).await;
    app.place(&s.member, place(key())).await;
    let r = app
        .op(
            &app.member_token(&s.member),
            MEMBER_OPS,
            "PlaceOrder",
            json!({"input": place(key())}),
        )
        .await;
    assert_eq!(error_code(&r), "SOLD_OUT");
    let catalog = app
        .op(
            &app.member_token(&s.member),
            MEMBER_OPS,
            "Catalog",
            json!({"storeId": s.store}),
        )
        .await;
    assert_eq!(catalog["data"]["catalog"]["classPacks"][0]["remainingStock"], 0);
    let no = a["order"]["orderNo"].as_str().unwrap();
    let c = app
        .op(
            &app.member_token(&s.member),
            MEMBER_OPS,
            "CancelMyOrder",
            json!({"orderNo": no}),
        )
        .await;
    assert_eq!(c["data"]["cancelOrder"]["status"], "CANCELED");
    assert_eq!(c["data"]["cancelOrder"]["cancelReason"], "member canceled");
    // A double tap on cancel answers with the canceled order and releases nothing twice.
    let again = app
        .op(
            &app.member_token(&s.member),
            MEMBER_OPS,
            "CancelMyOrder",
            json!({"orderNo": no}),
        )
        .await;
    assert_eq!(again["data"]["cancelOrder"]["status"], "CANCELED");
    assert_eq!(app.sql_i64("SELECT stock::bigint AS v FROM class_packs").await, 1);
}

#[tokio::test]
async fn wallet_orders_pay_at_once_and_refuse_without_money() {
    let app = TestApp::new().await;
    let s = app.studio(5_000, None, 3).await;
    let r = app
        .op(
            &app.member_token(&s.member),
            MEMBER_OPS,
            "PlaceOrder",
            json!({"input": {"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WALLET"}}),
        )
        .await;
    assert_eq!(error_code(&r), "INSUFFICIENT_FUNDS");
    // Nothing half-written: no order, no ledger row, balance intact.
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM orders").await, 0);
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM wallet_ledger").await, 1);
    app.admin(
        "mutation($m: ID!) { topUpWallet(memberId: $m, amountCents: 20000, reference: \"desk-1\") { id } }",
        json!({"m": s.member}),
    )
    .await;
    let placed = app
        .place(
            &s.member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WALLET"}),
        )
        .await;
    assert_eq!(placed["order"]["status"], "PAID");
    assert!(placed["order"]["expiresAt"].is_null());
    assert!(placed["payment"].is_null());
    assert_eq!(placed["order"]["walletAmountCents"], 10000);
    let o = app.order(placed["order"]["orderNo"].as_str().unwrap()).await;
    assert_eq!(o["member"]["wallet"]["balanceCents"], 15_000);
    assert_eq!(o["member"]["sessionCredits"], 10);
    let kinds: Vec<&str> = o["compensation"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["DOOR_ACCESS_GRANT", "AI_ACCESS_GRANT"]);
    // The whole placement shares the request's trace id.
    let trace = o["traceId"].as_str().unwrap();
    assert!(o["timeline"].as_array().unwrap().iter().all(|e| e["traceId"] == trace));
    assert!(o["compensation"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["traceId"] == trace));
}

#[tokio::test]
async fn mixed_orders_freeze_the_wallet_part_and_unfreeze_on_cancel() {
    let app = TestApp::new().await;
    let s = app.studio(8_000, None, 3).await;
    let placed = app
        .place(
            &s.member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack},
                   "paymentMethod": "MIXED", "walletAmountCents": 3000, "onlineProvider": "ALIPAY"}),
        )
        .await;
    assert_eq!(placed["order"]["status"], "WAIT_PAY");
    assert_eq!(placed["payment"]["provider"], "ALIPAY");
    assert_eq!(placed["payment"]["amountCents"], 7000);
    let m = app.member_view(&s.member).await;
    assert_eq!(m["wallet"], json!({"balanceCents": 5000, "frozenCents": 3000}));
    let no = placed["order"]["orderNo"].as_str().unwrap();
    app.admin(CANCEL, json!({"orderNo": no, "reason": "desk"})).await;
    app.admin(CANCEL, json!({"orderNo": no, "reason": "desk"})).await;
    let m = app.member_view(&s.member).await;
    assert_eq!(m["wallet"], json!({"balanceCents": 8000, "frozenCents": 0}));
    // Bad MIXED splits are refused.
    for w in [0, 10_000, 20_000, -5] {
        let r = app
            .op(
                &app.member_token(&s.member),
                MEMBER_OPS,
                "PlaceOrder",
                json!({"input": {"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack},
                                 "paymentMethod": "MIXED", "walletAmountCents": w}}),
            )
            .await;
        assert_eq!(error_code(&r), "BAD_USER_INPUT", "{w}: {r}");
    }
    // More than the balance can freeze.
    let r = app
        .op(
            &app.member_token(&s.member),
            MEMBER_OPS,
            "PlaceOrder",
            json!({"input": {"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack},
                             "paymentMethod": "MIXED", "walletAmountCents": 9000}}),
        )
        .await;
    assert_eq!(error_code(&r), "INSUFFICIENT_FUNDS");
}

#[tokio::test]
async fn online_and_members_offline_orders_expire_and_wallet_ones_do_not() {
    let app = TestApp::with_config(|c| c.order_timeout = std::time::Duration::from_secs(90)).await;
    let s = app.studio(50_000, None, 3).await;
    // An OFFLINE order the member placed expires too, after FITORDER_OFFLINE_ORDER_TIMEOUT
    // (24 h by default; business_limits.rs has the desk's, which does not).
    for (method, has_expiry, window) in [
        ("WECHAT_PAY", true, 80..=90),
        ("ALIPAY", true, 80..=90),
        ("OFFLINE", true, 86_390..=86_400),
        ("WALLET", false, 0..=0),
    ] {
        let placed = app
            .place(
                &s.member,
                json!({"idempotencyKey": key(), "storeId": s.store, "item": {"membershipPlanId": s.plan}, "paymentMethod": method}),
            )
            .await;
        assert_eq!(placed["order"]["expiresAt"].is_string(), has_expiry, "{method}");
        assert_eq!(placed["order"]["isExpired"], false);
        if has_expiry {
            let created = app.order(placed["order"]["orderNo"].as_str().unwrap()).await;
            let exp = chrono::DateTime::parse_from_rfc3339(created["expiresAt"].as_str().unwrap()).unwrap();
            let left = exp.signed_duration_since(chrono::Utc::now()).num_seconds();
            assert!(window.contains(&left), "{method}: {left}");
        }
    }
}

#[tokio::test]
async fn members_order_for_themselves_and_staff_for_members() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 3).await;
    let other = app.new_member(&s.store, 0).await;
    let input = json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack},
                       "paymentMethod": "OFFLINE", "memberId": other});
    let r = app
        .op(
            &app.member_token(&s.member),
            MEMBER_OPS,
            "PlaceOrder",
            json!({"input": input.clone()}),
        )
        .await;
    assert_eq!(error_code(&r), "FORBIDDEN");
    let placed = app
        .op(&app.admin_token(), MEMBER_OPS, "PlaceOrder", json!({"input": input}))
        .await;
    assert!(placed.get("errors").is_none(), "{placed}");
    let no = placed["data"]["placeOrder"]["order"]["orderNo"].as_str().unwrap();
    let o = app.order(no).await;
    assert_eq!(o["member"]["id"], other);
    // Staff must say for whom.
    let r = app
        .op(
            &app.admin_token(),
            MEMBER_OPS,
            "PlaceOrder",
            json!({"input": {"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "OFFLINE"}}),
        )
        .await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT");
    // Another store's item, a missing item, a past slot.
    let r = app
        .op(
            &app.member_token(&s.member),
            MEMBER_OPS,
            "PlaceOrder",
            json!({"input": {"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": "999999"}, "paymentMethod": "OFFLINE"}}),
        )
        .await;
    assert_eq!(error_code(&r), "NOT_FOUND");
    let r = app
        .op(
            &app.member_token(&s.member),
            MEMBER_OPS,
            "PlaceOrder",
            json!({"input": {"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack, "coachSlotId": s.slot}, "paymentMethod": "OFFLINE"}}),
        )
        .await;
    assert!(r.get("errors").is_some(), "two items at once must be refused: {r}");
}
