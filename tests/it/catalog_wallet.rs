//! The admin console's catalog and wallet operations, with their validation.

use serde_json::json;

use crate::harness::*;

#[tokio::test]
async fn the_contracts_admin_operations_build_a_studio() {
    let app = TestApp::new().await;
    let admin = app.admin_token();
    let store = app
        .op(
            &admin,
            ADMIN_OPS,
            "CreateStore",
            json!({"input": {"name": "Xuhui", "code": "SH-XH"}}),
        )
        .await;
    let store_id = store["data"]["createStore"]["id"].as_str().unwrap().to_string();
    let dup = app
        .op(
            &admin,
            ADMIN_OPS,
            "CreateStore",
            json!({"input": {"name": "Xuhui 2", "code": "SH-XH"}}),
        )
        .await;
    assert_eq!(error_code(&dup), "CONFLICT");
    let m = app
        .op(
            &admin,
            ADMIN_OPS,
            "CreateMember",
            json!({"input": {"storeId": store_id, "name": "Zhou", "phone": "138 0013 8000"}}),
        )
        .await;
    assert_eq!(m["data"]["createMember"]["phone"], "13800138000");
    let member = m["data"]["createMember"]["id"].as_str().unwrap().to_string();
    for (op, input) in [
        (
            "CreateMembershipPlan",
            json!({"storeId": store_id, "name": "Q", "durationDays": 90, "priceCents": 99900}),
        ),
        (
            "CreateClassPack",
            json!({"storeId": store_id, "name": "P", "sessions": 20, "priceCents": 150000, "stock": null}),
        ),
        (
            "CreateCoachSlot",
            json!({"storeId": store_id, "coachName": "Wu", "startsAt": "2030-01-01T10:00:00+08:00",
                                   "endsAt": "2030-01-01T11:00:00+08:00", "capacity": 1, "priceCents": 40000}),
        ),
    ] {
        let r = app.op(&admin, ADMIN_OPS, op, json!({"input": input})).await;
        assert!(r.get("errors").is_none(), "{op}: {r}");
    }
    for (op, input) in [
        (
            "CreateMembershipPlan",
            json!({"storeId": store_id, "name": "Q", "durationDays": 0, "priceCents": 99900}),
        ),
        (
            "CreateClassPack",
            json!({"storeId": store_id, "name": "P", "sessions": 20, "priceCents": -1}),
        ),
        (
            "CreateClassPack",
            json!({"storeId": store_id, "name": "", "sessions": 20, "priceCents": 100}),
        ),
        (
            "CreateClassPack",
            json!({"storeId": "424242", "name": "P", "sessions": 20, "priceCents": 100}),
        ),
        (
            "CreateCoachSlot",
            json!({"storeId": store_id, "coachName": "Wu", "startsAt": "2030-01-01T11:00:00+08:00",
                                   "endsAt": "2030-01-01T10:00:00+08:00", "capacity": 1, "priceCents": 40000}),
        ),
        (
            "CreateMember",
            json!({"storeId": store_id, "name": "X", "phone": "abc"}),
        ),
    ] {
        let r = app.op(&admin, ADMIN_OPS, op, json!({"input": input})).await;
        let code = error_code(&r);
        assert!(code == "BAD_USER_INPUT" || code == "NOT_FOUND", "{op} {input}: {r}");
    }
    let catalog = app
        .op(
            &app.member_token(&member),
            MEMBER_OPS,
            "Catalog",
            json!({"storeId": store_id}),
        )
        .await;
    let c = &catalog["data"]["catalog"];
    assert_eq!(c["membershipPlans"].as_array().unwrap().len(), 1);
    assert_eq!(c["classPacks"][0]["remainingStock"], json!(null));
    assert_eq!(c["coachSlots"][0]["remaining"], 1);
}

#[tokio::test]
async fn top_ups_are_idempotent_by_reference() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 1).await;
    let admin = app.admin_token();
    let vars = json!({"memberId": s.member, "amountCents": 12_345, "reference": "WX-TOPUP-1"});
    let a = app.op(&admin, ADMIN_OPS, "TopUpWallet", vars.clone()).await;
    let b = app.op(&admin, ADMIN_OPS, "TopUpWallet", vars).await;
    assert_eq!(a["data"], b["data"]);
    assert_eq!(
        a["data"]["topUpWallet"]["wallet"],
        json!({"balanceCents": 12_345, "frozenCents": 0})
    );
    let c = app
        .op(
            &admin,
            ADMIN_OPS,
            "TopUpWallet",
            json!({"memberId": s.member, "amountCents": 1, "reference": "WX-TOPUP-1"}),
        )
        .await;
    assert_eq!(error_code(&c), "CONFLICT");
    for bad in [0, -100] {
        let r = app
            .op(
                &admin,
                ADMIN_OPS,
                "TopUpWallet",
                json!({"memberId": s.member, "amountCents": bad, "reference": "x"}),
            )
            .await;
        assert_eq!(error_code(&r), "BAD_USER_INPUT");
    }
    let r = app
        .op(
            &admin,
            ADMIN_OPS,
            "TopUpWallet",
            json!({"memberId": "999999", "amountCents": 5, "reference": "x"}),
        )
        .await;
    assert_eq!(error_code(&r), "NOT_FOUND");
}

#[tokio::test]
async fn the_database_refuses_a_negative_wallet_whoever_writes() {
    let app = TestApp::new().await;
    let s = app.studio(100, None, 1).await;
    let mut c = app.conn().await;
    let r = diesel_async::RunQueryDsl::execute(
        diesel::sql_query(format!(
            "INSERT INTO wallet_ledger (member_id, kind, balance_delta, frozen_delta, actor, trace_id)
             VALUES ({}, 'PAY', -101, 0, 'test', 't')",
            s.member
        )),
        &mut c,
    )
    .await;
    assert!(r.unwrap_err().to_string().contains("wallet_balance_not_negative"));
}
