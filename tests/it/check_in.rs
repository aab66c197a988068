//! Check-ins: idempotent by serial number, never below zero however many run at once.

use std::sync::Arc;

use serde_json::json;

use crate::harness::*;

async fn paid_pack(app: &TestApp, s: &Studio) -> String {
    let placed = app
        .place(
            &s.member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WALLET"}),
        )
        .await;
    placed["order"]["orderNo"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn twenty_five_simultaneous_check_ins_on_ten_credits_use_exactly_ten() {
    let app = Arc::new(TestApp::new().await);
    let s = app.studio(100_000, None, 3).await;
    let no = paid_pack(&app, &s).await;
    let mut tasks = vec![];
    for i in 0..25 {
        let (app, member, no) = (app.clone(), s.member.clone(), no.clone());
        tasks.push(tokio::spawn(async move {
            app.op(
                &app.member_token(&member),
                MEMBER_OPS,
                "CheckIn",
                json!({"input": {"orderNo": no, "consumeTxnNo": format!("gate-{i}")}}),
            )
            .await
        }));
    }
    let mut ok = 0;
    let mut remaining = vec![];
    for t in tasks {
        let r = t.await.unwrap();
        match r.get("errors") {
            None => {
                ok += 1;
                remaining.push(r["data"]["checkIn"]["remainingSessions"].as_i64().unwrap());
            }
            Some(_) => {
                let code = error_code(&r);
                assert!(code == "ILLEGAL_TRANSITION" || code == "BAD_USER_INPUT", "{r}");
            }
        }
    }
    assert_eq!(ok, 10);
    remaining.sort();
    assert_eq!(remaining, (0..10).collect::<Vec<i64>>());
    let o = app.order(&no).await;
    assert_eq!(o["status"], "CONSUMED");
    assert_eq!(o["sessionsUsed"], 10);
    assert_eq!(o["member"]["sessionCredits"], 0);
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM check_ins").await, 10);
}

#[tokio::test]
async fn a_repeated_serial_number_changes_nothing_and_answers_as_before() {
    let app = Arc::new(TestApp::new().await);
    let s = app.studio(100_000, None, 3).await;
    let no = paid_pack(&app, &s).await;
    let vars = json!({"input": {"orderNo": no, "consumeTxnNo": "gate-7", "sessions": 2}});
    let token = app.member_token(&s.member);
    let first = app.op(&token, MEMBER_OPS, "CheckIn", vars.clone()).await;
    assert_eq!(first["data"]["checkIn"]["duplicate"], false);
    assert_eq!(first["data"]["checkIn"]["remainingSessions"], 8);
    assert_eq!(first["data"]["checkIn"]["order"]["status"], "CONSUMING");
    // Ten more at once with the same serial number.
    let mut tasks = vec![];
    for _ in 0..10 {
        let (app, token, vars) = (app.clone(), token.clone(), vars.clone());
        tasks.push(tokio::spawn(async move {
            app.op(&token, MEMBER_OPS, "CheckIn", vars).await
        }));
    }
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r["data"]["checkIn"]["duplicate"], true, "{r}");
        assert_eq!(r["data"]["checkIn"]["remainingSessions"], 8);
    }
    let o = app.order(&no).await;
    assert_eq!(o["sessionsUsed"], 2);
    assert_eq!(o["member"]["sessionCredits"], 8);
    // The same serial number for another amount is a conflict.
    let r = app
        .op(
            &token,
            MEMBER_OPS,
            "CheckIn",
            json!({"input": {"orderNo": no, "consumeTxnNo": "gate-7", "sessions": 1}}),
        )
        .await;
    assert_eq!(error_code(&r), "CONFLICT");
    // Duplicates are counted for ops.
    let stats = app
        .op(
            &app.ops_token(),
            OPS_OPS,
            "Anomalies",
            json!({"from": "2000-01-01T00:00:00Z", "to": "2100-01-01T00:00:00Z"}),
        )
        .await;
    let dup = stats["data"]["anomalyStats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["category"] == "DUPLICATE_CHECK_IN")
        .unwrap()["count"]
        .clone();
    assert_eq!(dup, 10);
}

#[tokio::test]
async fn asking_for_more_than_is_left_is_refused_whole() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let no = paid_pack(&app, &s).await;
    let token = app.member_token(&s.member);
    app.op(
        &token,
        MEMBER_OPS,
        "CheckIn",
        json!({"input": {"orderNo": no, "consumeTxnNo": "a", "sessions": 8}}),
    )
    .await;
    let r = app
        .op(
            &token,
            MEMBER_OPS,
            "CheckIn",
            json!({"input": {"orderNo": no, "consumeTxnNo": "b", "sessions": 3}}),
        )
        .await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT");
    for bad in [0, -1, 101] {
        let r = app
            .op(
                &token,
                MEMBER_OPS,
                "CheckIn",
                json!({"input": {"orderNo": no, "consumeTxnNo": "c", "sessions": bad}}),
            )
            .await;
        assert_eq!(error_code(&r), "BAD_USER_INPUT", "{bad}");
    }
    let o = app.order(&no).await;
    assert_eq!(o["sessionsUsed"], 8);
    // The rest in one go: CONSUMING -> CONSUMED.
    let r = app
        .op(
            &token,
            MEMBER_OPS,
            "CheckIn",
            json!({"input": {"orderNo": no, "consumeTxnNo": "d", "sessions": 2}}),
        )
        .await;
    assert_eq!(r["data"]["checkIn"]["order"]["status"], "CONSUMED");
}

#[tokio::test]
async fn a_private_session_passes_through_consuming_to_consumed_in_one_check_in() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let placed = app
        .place(
            &s.member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"coachSlotId": s.slot}, "paymentMethod": "WALLET"}),
        )
        .await;
    let no = placed["order"]["orderNo"].as_str().unwrap();
    assert_eq!(placed["order"]["sessionsTotal"], 1);
    let r = app
        .admin(CHECK_IN, json!({"input": {"orderNo": no, "consumeTxnNo": "desk-1"}}))
        .await;
    assert_eq!(r["checkIn"]["order"]["status"], "CONSUMED");
    let o = app.order(no).await;
    let steps: Vec<(String, String)> = o["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "STATUS_CHANGE")
        .map(|e| {
            (
                e["fromStatus"].as_str().unwrap_or("NONE").to_string(),
                e["toStatus"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("NONE", "WAIT_PAY"),
        ("WAIT_PAY", "PAID"),
        ("PAID", "CONSUMING"),
        ("CONSUMING", "CONSUMED"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(steps, expected);
}

#[tokio::test]
async fn memberships_allow_check_ins_within_their_validity_only() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let no = app
        .buy(&s.member, &s.store, json!({"membershipPlanId": s.plan}), "WALLET")
        .await;
    let token = app.member_token(&s.member);
    let my = app.op(&token, MEMBER_OPS, "MyOrder", json!({"orderNo": no})).await;
    assert_eq!(my["data"]["order"]["membership"]["status"], "ACTIVE");
    for i in 0..3 {
        let r = app
            .op(
                &token,
                MEMBER_OPS,
                "CheckIn",
                json!({"input": {"orderNo": no, "consumeTxnNo": format!("door-{i}")}}),
            )
            .await;
        assert_eq!(r["data"]["checkIn"]["order"]["status"], "CONSUMING", "{r}");
    }
    // A renewal bought early starts when the current card ends, and cannot be used before.
    let renewal = app
        .place(
            &s.member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"membershipPlanId": s.plan}, "paymentMethod": "WALLET"}),
        )
        .await;
    let rno = renewal["order"]["orderNo"].as_str().unwrap().to_string();
    let r = app
        .op(
            &token,
            MEMBER_OPS,
            "CheckIn",
            json!({"input": {"orderNo": rno, "consumeTxnNo": "door-x"}}),
        )
        .await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT");
    let account = app.op(&token, MEMBER_OPS, "MyAccount", json!({})).await;
    let cards = account["data"]["me"]["member"]["memberships"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(cards.len(), 2);
    // Past the card's end (moved back by hand), check-ins are refused.
    let mut c = app.conn().await;
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(
            "UPDATE memberships SET valid_from = now() - interval '40 days', valid_to = now() - interval '10 days'",
        ),
        &mut c,
    )
    .await
    .unwrap();
    let r = app
        .op(
            &token,
            MEMBER_OPS,
            "CheckIn",
            json!({"input": {"orderNo": no, "consumeTxnNo": "door-late"}}),
        )
        .await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT");
}
