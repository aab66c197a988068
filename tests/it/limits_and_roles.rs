//! Who may do what, and the query limits.

use fitorder::auth::{issue_token, Role};
use fitorder::config::ExposeSecret;
use serde_json::json;

use crate::harness::*;

#[tokio::test]
async fn tokens_are_checked() {
    let app = TestApp::new().await;
    let me = "query { me { role subject } }";
    assert_eq!(app.err_code(None, me, json!({})).await, "UNAUTHENTICATED");
    let wrong_secret = issue_token(
        "another-secret",
        Role::Admin,
        "x",
        None,
        std::time::Duration::from_secs(60),
    );
    assert_eq!(
        app.err_code(Some(&wrong_secret), me, json!({})).await,
        "UNAUTHENTICATED"
    );
    assert_eq!(app.err_code(Some("garbage"), me, json!({})).await, "UNAUTHENTICATED");
    // alg: none
    let none = format!(
        "{}.{}.",
        base64_url(r#"{"alg":"none","typ":"JWT"}"#),
        base64_url(r#"{"sub":"1","role":"admin","exp":9999999999}"#)
    );
    assert_eq!(app.err_code(Some(&none), me, json!({})).await, "UNAUTHENTICATED");
    // Expired.
    let claims = json!({"sub": "1", "role": "admin", "exp": chrono::Utc::now().timestamp() - 3600});
    let expired = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(app.state.config.jwt_secret.expose_secret().as_bytes()),
    )
    .unwrap();
    assert_eq!(app.err_code(Some(&expired), me, json!({})).await, "UNAUTHENTICATED");
    // Missing role, unknown role, member with a non-numeric sub.
    for claims in [
        json!({"sub": "1", "exp": 9999999999u64}),
        json!({"sub": "1", "role": "root", "exp": 9999999999u64}),
        json!({"sub": "abc", "role": "member", "exp": 9999999999u64}),
    ] {
        let t = jsonwebtoken::encode(
            &jsonwebtoken::Header::default(),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(app.state.config.jwt_secret.expose_secret().as_bytes()),
        )
        .unwrap();
        assert_eq!(
            app.err_code(Some(&t), me, json!({})).await,
            "UNAUTHENTICATED",
            "{claims}"
        );
    }
    let r = app.ok(&app.ops_token(), me, json!({})).await;
    assert_eq!(r["me"], json!({"role": "ops", "subject": "ops-1"}));
}

fn base64_url(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
}

#[tokio::test]
async fn members_never_see_each_other() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let other = app.new_member(&s.store, 100_000).await;
    let theirs = app
        .buy(&other, &s.store, json!({"classPackId": s.pack}), "WALLET")
        .await;
    app.place(
        &s.member,
        json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WECHAT_PAY"}),
    )
    .await;
    let me = app.member_token(&s.member);
    let r = app.op(&me, MEMBER_OPS, "MyOrder", json!({"orderNo": theirs})).await;
    assert_eq!(r["data"]["order"], json!(null));
    let r = app
        .op(&me, MEMBER_OPS, "CancelMyOrder", json!({"orderNo": theirs}))
        .await;
    assert_eq!(error_code(&r), "NOT_FOUND");
    let r = app
        .op(
            &me,
            MEMBER_OPS,
            "CheckIn",
            json!({"input": {"orderNo": theirs, "consumeTxnNo": "x"}}),
        )
        .await;
    assert_eq!(error_code(&r), "NOT_FOUND");
    // Filtering by the other member still shows only one's own.
    let r = app
        .op(&me, MEMBER_OPS, "MyOrders", json!({"filter": {"memberId": other}}))
        .await;
    assert_eq!(r["data"]["orders"]["totalCount"], 0);
    let r = app.op(&me, MEMBER_OPS, "MyOrders", json!({})).await;
    assert_eq!(r["data"]["orders"]["totalCount"], 1);
    let r = app
        .gql(
            Some(&me),
            "query($id: ID!) { member(id: $id) { id } }",
            json!({"id": other}),
        )
        .await;
    assert_eq!(r["data"]["member"], json!(null));
    let r = app
        .gql(Some(&me), "query { memberships { totalCount } }", json!({}))
        .await;
    assert_eq!(r["data"]["memberships"]["totalCount"], 0);
    // Staff-only views are refused to members.
    for q in [
        "query { exceptionTickets { totalCount } }",
        "query { compensationEvents { totalCount } }",
        "query { reconciliationRuns { totalCount } }",
    ] {
        assert_eq!(app.err_code(Some(&me), q, json!({})).await, "FORBIDDEN", "{q}");
    }
    // Ops see phone numbers masked, staff whole.
    let phone_ops = app
        .gql(
            Some(&app.ops_token()),
            "query($id: ID!) { member(id: $id) { phone } }",
            json!({"id": other}),
        )
        .await;
    let masked = phone_ops["data"]["member"]["phone"].as_str().unwrap();
    assert!(masked.contains("****") && masked.len() == 11, "{masked}");
}

#[tokio::test]
async fn roles_are_refused_what_is_not_theirs() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 3).await;
    let member = app.member_token(&s.member);
    let ops = app.ops_token();
    let admin_only = [
        ("CreateStore", json!({"input": {"name": "x", "code": "x1"}})),
        (
            "CreateMember",
            json!({"input": {"storeId": s.store, "name": "x", "phone": "13000000000"}}),
        ),
        (
            "TopUpWallet",
            json!({"memberId": s.member, "amountCents": 100, "reference": "r"}),
        ),
        ("ConfirmOfflinePayment", json!({"orderNo": "x", "reference": "r"})),
        ("RefundOrder", json!({"orderNo": "x", "reason": "r"})),
        (
            "RunReconciliation",
            json!({"provider": "WECHAT_PAY", "date": "2026-11-29"}),
        ),
    ];
    for (op, vars) in admin_only {
        for token in [&member, &ops] {
            let r = app.op(token, ADMIN_OPS, op, vars.clone()).await;
            assert_eq!(error_code(&r), "FORBIDDEN", "{op}: {r}");
        }
    }
    for (op, vars) in [
        ("ReplayCompensation", json!({"id": "1"})),
        ("ReplayDeadCompensations", json!({})),
        ("ResolveTicket", json!({"id": "1", "action": "NO_ACTION"})),
    ] {
        let r = app.op(&member, ADMIN_OPS, op, vars).await;
        assert_eq!(error_code(&r), "FORBIDDEN", "{op}: {r}");
    }
    // A store-limited admin sees and changes only their stores.
    let other_store = app.studio(0, None, 1).await;
    let limited = issue_token(
        app.state.config.jwt_secret.expose_secret(),
        Role::Admin,
        "staff-9",
        Some(vec![s.store.clone()]),
        std::time::Duration::from_secs(60),
    );
    let r = app
        .op(
            &limited,
            ADMIN_OPS,
            "CreateMember",
            json!({"input": {"storeId": other_store.store, "name": "x", "phone": "13000000001"}}),
        )
        .await;
    assert_eq!(error_code(&r), "FORBIDDEN");
    let r = app
        .op(&limited, ADMIN_OPS, "Member", json!({"id": other_store.member}))
        .await;
    assert_eq!(r["data"]["member"], json!(null));
    let r = app.op(&limited, ADMIN_OPS, "Member", json!({"id": s.member})).await;
    assert_eq!(r["data"]["member"]["id"], s.member);
}

#[tokio::test]
async fn deep_and_costly_queries_are_refused_before_they_run() {
    let app = TestApp::with_config(|c| c.max_complexity = 2_000).await;
    let admin = app.admin_token();
    // 14 levels through membership -> order -> member -> memberships ...
    let deep = "query { orders { edges { node { membership { order { member { memberships { order { member { memberships { order { member { id } } } } } } } } } } } } }";
    let r = app.gql(Some(&admin), deep, json!({})).await;
    assert!(
        r["errors"][0]["message"].as_str().unwrap().contains("nested too deep"),
        "{r}"
    );
    assert!(r.get("data").is_none() || r["data"].is_null());
    let costly = "query { orders(first: 100) { edges { node { orderNo member { name memberships { id status validFrom validTo order { orderNo status } } } timeline { at kind summary } compensation { id kind attemptLog { at ok } } } } } }";
    let r = app.gql(Some(&admin), costly, json!({})).await;
    assert!(r["errors"][0]["message"].as_str().unwrap().contains("complex"), "{r}");
    // Alias bombs cost what they ask for.
    let mut bomb = String::from("query {");
    for i in 0..200 {
        bomb.push_str(&format!(
            " a{i}: orders(first: 100) {{ totalCount edges {{ node {{ orderNo }} }} }}"
        ));
    }
    bomb.push('}');
    let r = app.gql(Some(&admin), &bomb, json!({})).await;
    assert!(r["errors"][0]["message"].as_str().unwrap().contains("complex"), "{r}");
    // Page sizes are capped at 100; negative ones refused.
    let r = app
        .gql(Some(&admin), "query { orders(first: 1000) { totalCount } }", json!({}))
        .await;
    assert!(r.get("errors").is_none(), "{r}");
    let r = app
        .gql(Some(&admin), "query { orders(first: -1) { totalCount } }", json!({}))
        .await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT");
}
