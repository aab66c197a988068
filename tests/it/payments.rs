//! Payment callbacks: every ordering, every duplicate, every forgery.

use std::sync::Arc;

use axum::http::StatusCode;
use fitorder::dev::sandbox::WechatNotification;
use serde_json::{json, Value};

use crate::harness::*;
use crate::providers;
use crate::ws::WsClient;

async fn app() -> TestApp {
    TestApp::with_config(providers::configure).await
}

impl TestApp {
    pub async fn wechat_notify(&self, n: &WechatNotification) -> (StatusCode, Value) {
        let headers: Vec<(&str, &str)> = n
            .headers
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .chain([("content-type", "application/json")])
            .collect();
        let (status, _, body) = self.post("/pay/wechat/notify", &headers, n.body.clone()).await;
        let v = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).unwrap_or(Value::Null)
        };
        (status, v)
    }

    pub async fn alipay_notify(&self, form: &str) -> (StatusCode, String) {
        let (status, _, body) = self
            .post(
                "/pay/alipay/notify",
                &[("content-type", "application/x-www-form-urlencoded")],
                form.as_bytes().to_vec(),
            )
            .await;
        (status, String::from_utf8(body).unwrap())
    }

    /// WeChat Pay says `order_no` was paid `fen` in transaction `txn`.
    pub async fn wechat_paid(&self, order_no: &str, txn: &str, fen: i64) -> StatusCode {
        let w = providers::wechat();
        let n = w.notification(
            "TRANSACTION.SUCCESS",
            &w.transaction(order_no, txn, fen),
            chrono::Utc::now().timestamp(),
        );
        self.wechat_notify(&n).await.0
    }
}

async fn online_order(app: &TestApp, s: &Studio, method: &str) -> String {
    let placed = app
        .place(
            &s.member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": method}),
        )
        .await;
    placed["order"]["orderNo"].as_str().unwrap().to_string()
}

fn outcomes(order: &Value) -> Vec<String> {
    order["callbacks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["outcome"].as_str().unwrap().to_string())
        .collect()
}

const CHAIN: &str = "query($orderNo: String!) { order(orderNo: $orderNo) { orderNo status providerTxnId paidAt traceId
    member { wallet { balanceCents frozenCents } sessionCredits }
    callbacks { id provider verified outcome body }
    timeline { kind fromStatus toStatus traceId summary }
    compensation { kind status }
    tickets { id kind status } } }";

async fn chain(app: &TestApp, no: &str) -> Value {
    app.admin(CHAIN, json!({"orderNo": no})).await["order"].clone()
}

#[tokio::test]
async fn a_wechat_payment_is_applied_once_with_its_whole_story() {
    let app = app().await;
    let s = app.studio(0, None, 3).await;
    let no = online_order(&app, &s, "WECHAT_PAY").await;
    assert_eq!(
        app.wechat_paid(&no, "4200001234202611300000000001", 10_000).await,
        StatusCode::NO_CONTENT
    );
    let o = chain(&app, &no).await;
    assert_eq!(o["status"], "PAID");
    assert_eq!(o["providerTxnId"], "4200001234202611300000000001");
    assert_eq!(o["member"]["sessionCredits"], 10);
    assert_eq!(outcomes(&o), ["APPLIED"]);
    let cb = &o["callbacks"][0];
    assert_eq!(cb["verified"], true);
    // The decrypted transaction, not the ciphertext, is kept as the evidence.
    assert!(
        cb["body"].as_str().unwrap().contains("\"trade_state\":\"SUCCESS\""),
        "{cb}"
    );
    let kinds: Vec<&str> = o["compensation"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["DOOR_ACCESS_GRANT", "AI_ACCESS_GRANT"]);
    // The callback and the transition it caused share one trace id.
    let tl = o["timeline"].as_array().unwrap();
    let cb_trace = tl.iter().find(|e| e["kind"] == "CALLBACK").unwrap()["traceId"].clone();
    let paid_trace = tl.iter().find(|e| e["toStatus"] == "PAID").unwrap()["traceId"].clone();
    assert_eq!(cb_trace, paid_trace);
    // Again, and again: acknowledged, nothing more applied.
    for _ in 0..3 {
        assert_eq!(
            app.wechat_paid(&no, "4200001234202611300000000001", 10_000).await,
            StatusCode::NO_CONTENT
        );
    }
    let o = chain(&app, &no).await;
    assert_eq!(outcomes(&o), ["APPLIED", "DUPLICATE", "DUPLICATE", "DUPLICATE"]);
    assert_eq!(o["member"]["sessionCredits"], 10);
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payments").await, 1);
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM compensation_events").await, 2);
}

#[tokio::test]
async fn forty_identical_callbacks_at_once_pay_once() {
    let app = Arc::new(app().await);
    let s = app.studio(0, None, 3).await;
    let no = online_order(&app, &s, "WECHAT_PAY").await;
    let w = providers::wechat();
    let n = Arc::new(w.notification(
        "TRANSACTION.SUCCESS",
        &w.transaction(&no, "4200000000000000000000000040", 10_000),
        chrono::Utc::now().timestamp(),
    ));
    let mut tasks = vec![];
    for _ in 0..40 {
        let (app, n) = (app.clone(), n.clone());
        tasks.push(tokio::spawn(async move { app.wechat_notify(&n).await.0 }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::NO_CONTENT);
    }
    let o = chain(&app, &no).await;
    let outs = outcomes(&o);
    assert_eq!(outs.iter().filter(|o| *o == "APPLIED").count(), 1);
    assert_eq!(outs.iter().filter(|o| *o == "DUPLICATE").count(), 39);
    assert_eq!(o["member"]["sessionCredits"], 10);
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payments").await, 1);
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM compensation_events").await, 2);
}

/// A process remembers the keys it processed, and answers their redeliveries in one statement;
/// another process knows nothing of them and finds the duplicate by the key's claim in its
/// payment transaction. Either way: one payment, every delivery recorded whole.
#[tokio::test]
async fn a_redelivery_to_another_process_is_a_duplicate_all_the_same() {
    let a = app().await;
    let b = TestApp::on_database(&a.db_url, providers::configure).await;
    let s = a.studio(0, None, 3).await;
    let no = online_order(&a, &s, "WECHAT_PAY").await;
    let w = providers::wechat();
    let n = w.notification(
        "TRANSACTION.SUCCESS",
        &w.transaction(&no, "4200000000000000000000000041", 10_000),
        chrono::Utc::now().timestamp(),
    );
    assert_eq!(a.wechat_notify(&n).await.0, StatusCode::NO_CONTENT);
    // `b` has never seen the key: its own transaction claims nothing and records a duplicate.
    assert_eq!(b.wechat_notify(&n).await.0, StatusCode::NO_CONTENT);
    // `a` remembers it.
    assert_eq!(a.wechat_notify(&n).await.0, StatusCode::NO_CONTENT);
    let o = chain(&a, &no).await;
    assert_eq!(outcomes(&o), ["APPLIED", "DUPLICATE", "DUPLICATE"], "{o}");
    assert_eq!(o["status"], "PAID");
    assert_eq!(a.sql_i64("SELECT count(*) AS v FROM payments").await, 1);
    assert_eq!(a.sql_i64("SELECT count(*) AS v FROM compensation_events").await, 2);
    // Every record names its order and key, however it was answered.
    assert_eq!(
        a.sql_i64(&format!(
            "SELECT count(*) AS v FROM payment_callbacks c JOIN orders o ON o.id = c.order_id
              WHERE o.order_no = '{no}' AND c.idempotency_key = '{no}:4200000000000000000000000041'
                AND c.verified AND c.error IS NULL"
        ))
        .await,
        3
    );
}

#[tokio::test]
async fn forgeries_are_refused_with_401_and_change_nothing() {
    let app = app().await;
    let s = app.studio(0, None, 3).await;
    let no = online_order(&app, &s, "WECHAT_PAY").await;
    let w = providers::wechat();
    let now = chrono::Utc::now().timestamp();
    let resource = w.transaction(&no, "4200000000000000000000000099", 10_000);

    // A tampered body.
    let mut n = w.notification("TRANSACTION.SUCCESS", &resource, now);
    let pos = n.body.len() / 2;
    n.body[pos] ^= 0x01;
    let (status, body) = app.wechat_notify(&n).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["code"], "FAIL");
    // A tampered signature.
    let mut n = w.notification("TRANSACTION.SUCCESS", &resource, now);
    n.headers[2].1 = n.headers[2].1.chars().rev().collect();
    assert_eq!(app.wechat_notify(&n).await.0, StatusCode::UNAUTHORIZED);
    // A stale timestamp (a replay from ten minutes ago) and one from the future.
    for ts in [now - 600, now + 600] {
        let n = w.notification("TRANSACTION.SUCCESS", &resource, ts);
        assert_eq!(app.wechat_notify(&n).await.0, StatusCode::UNAUTHORIZED);
    }
    // Encrypted under another APIv3 key.
    let mut other = providers::wechat();
    other.apiv3_key = *b"ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ";
    let n = other.notification("TRANSACTION.SUCCESS", &resource, now);
    assert_eq!(app.wechat_notify(&n).await.0, StatusCode::UNAUTHORIZED);
    // A truncated body.
    let mut n = w.notification("TRANSACTION.SUCCESS", &resource, now);
    n.body.truncate(n.body.len() - 10);
    assert_eq!(app.wechat_notify(&n).await.0, StatusCode::UNAUTHORIZED);
    // Missing headers.
    let mut n = w.notification("TRANSACTION.SUCCESS", &resource, now);
    n.headers.remove(1);
    assert_eq!(app.wechat_notify(&n).await.0, StatusCode::UNAUTHORIZED);
    // Authentic, but for another merchant.
    let mut foreign = resource.clone();
    foreign["mchid"] = json!("1900000999");
    let n = w.notification("TRANSACTION.SUCCESS", &foreign, now);
    assert_eq!(app.wechat_notify(&n).await.0, StatusCode::UNAUTHORIZED);

    let o = chain(&app, &no).await;
    assert_eq!(o["status"], "WAIT_PAY");
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payments").await, 0);
    // Every refusal is kept as evidence and counted.
    let bad = app
        .sql_i64("SELECT count(*) AS v FROM payment_callbacks WHERE outcome = 'BAD_SIGNATURE' AND NOT verified")
        .await;
    assert_eq!(bad, 7, "forged, stale, undecryptable, truncated, incomplete");
    let foreign = app
        .sql_i64("SELECT count(*) AS v FROM payment_callbacks WHERE outcome = 'BAD_SIGNATURE' AND verified")
        .await;
    assert_eq!(foreign, 1, "authentic but for another merchant");
    let stats = app
        .op(
            &app.ops_token(),
            OPS_OPS,
            "Anomalies",
            json!({"from": "2000-01-01T00:00:00Z", "to": "2100-01-01T00:00:00Z"}),
        )
        .await;
    let count = |cat: &str| {
        stats["data"]["anomalyStats"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["category"] == cat)
            .unwrap()["count"]
            .clone()
    };
    assert_eq!(count("BAD_SIGNATURE"), 8);
    // And the genuine one still works afterwards.
    assert_eq!(
        app.wechat_paid(&no, "4200000000000000000000000099", 10_000).await,
        StatusCode::NO_CONTENT
    );
}

#[tokio::test]
async fn a_signature_made_by_openssl_verifies() {
    // An independent signer: the openssl command line, over `timestamp\nnonce\nbody\n`.
    if std::process::Command::new("openssl").arg("version").output().is_err() {
        eprintln!("no openssl on this machine; skipping");
        return;
    }
    let dir = tempdir();
    std::fs::write(dir.join("key.pem"), providers::wechat_private_pem()).unwrap();
    let body = br#"{"id":"EV-1","event_type":"TRANSACTION.SUCCESS"}"#;
    let ts = chrono::Utc::now().timestamp();
    let msg = [format!("{ts}\nNONCE123\n").as_bytes(), body, b"\n"].concat();
    std::fs::write(dir.join("msg"), &msg).unwrap();
    let out = std::process::Command::new("openssl")
        .args(["dgst", "-sha256", "-sign"])
        .arg(dir.join("key.pem"))
        .arg(dir.join("msg"))
        .output()
        .unwrap();
    assert!(out.status.success());
    use base64::Engine;
    let sig = base64::engine::general_purpose::STANDARD.encode(out.stdout);
    let mut config = fitorder::config::Config::for_tests(String::new());
    providers::configure(&mut config);
    let keys = fitorder::providers::keys::ProviderKeys::load(&config).unwrap();
    let h = fitorder::providers::wechat::Headers {
        timestamp: Some(&ts.to_string()),
        nonce: Some("NONCE123"),
        signature: Some(&sig),
        serial: Some(providers::WECHAT_PUBLIC_KEY_ID),
    };
    assert_eq!(
        fitorder::providers::wechat::verify(keys.wechat.as_ref().unwrap(), &h, body, ts),
        Ok(())
    );
    let h2 = fitorder::providers::wechat::Headers {
        nonce: Some("NONCE124"),
        ..h
    };
    assert!(fitorder::providers::wechat::verify(keys.wechat.as_ref().unwrap(), &h2, body, ts).is_err());
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fitorder-t-{}-{}", std::process::id(), key()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[tokio::test]
async fn a_payment_for_an_unknown_order_is_recorded_ticketed_and_acknowledged() {
    let app = app().await;
    assert_eq!(
        app.wechat_paid("FO20261130NOSUCH", "4200000000000000000000000777", 500)
            .await,
        StatusCode::NO_CONTENT
    );
    let t = app.op(&app.ops_token(), OPS_OPS, "OpenTickets", json!({})).await;
    let tickets = t["data"]["exceptionTickets"]["edges"].as_array().unwrap().clone();
    assert_eq!(tickets.len(), 1);
    assert_eq!(tickets[0]["node"]["kind"], "UNKNOWN_ORDER");
    assert_eq!(tickets[0]["node"]["orderNo"], "FO20261130NOSUCH");
    // The provider retrying does not open a second ticket.
    assert_eq!(
        app.wechat_paid("FO20261130NOSUCH", "4200000000000000000000000777", 500)
            .await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM exception_tickets").await, 1);
}

#[tokio::test]
async fn paid_after_cancel_stays_canceled_with_a_ticket_and_a_refund() {
    let app = app().await;
    let s = app.studio(0, Some(1), 3).await;
    let no = online_order(&app, &s, "WECHAT_PAY").await;
    app.op(
        &app.member_token(&s.member),
        MEMBER_OPS,
        "CancelMyOrder",
        json!({"orderNo": no}),
    )
    .await;
    assert_eq!(
        app.wechat_paid(&no, "4200000000000000000000000555", 10_000).await,
        StatusCode::NO_CONTENT
    );
    let o = chain(&app, &no).await;
    assert_eq!(o["status"], "CANCELED");
    assert_eq!(outcomes(&o), ["PAID_AFTER_CANCEL"]);
    assert_eq!(o["tickets"][0]["kind"], "PAID_AFTER_CANCEL");
    let kinds: Vec<&str> = o["compensation"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["PROVIDER_REFUND"]);
    assert_eq!(o["member"]["sessionCredits"], 0);
    // The released stock unit stayed released.
    assert_eq!(app.sql_i64("SELECT stock::bigint AS v FROM class_packs").await, 1);
    // Duplicates of the late payment change nothing more.
    assert_eq!(
        app.wechat_paid(&no, "4200000000000000000000000555", 10_000).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM compensation_events").await, 1);
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM exception_tickets").await, 1);
}

#[tokio::test]
async fn a_second_payment_after_refund_is_rejected_with_a_ticket() {
    let app = app().await;
    let s = app.studio(0, None, 3).await;
    let no = online_order(&app, &s, "WECHAT_PAY").await;
    assert_eq!(
        app.wechat_paid(&no, "4200000000000000000000000001", 10_000).await,
        StatusCode::NO_CONTENT
    );
    app.admin(REFUND, json!({"orderNo": no, "reason": "changed mind"}))
        .await;
    assert_eq!(
        app.wechat_paid(&no, "4200000000000000000000000002", 10_000).await,
        StatusCode::NO_CONTENT
    );
    let o = chain(&app, &no).await;
    assert_eq!(o["status"], "REFUNDED");
    assert_eq!(outcomes(&o), ["APPLIED", "REJECTED_TRANSITION"]);
    assert_eq!(o["tickets"][0]["kind"], "REJECTED_TRANSITION");
    assert_eq!(o["providerTxnId"], "4200000000000000000000000001");
}

#[tokio::test]
async fn a_wrong_amount_is_not_paid_and_opens_a_ticket() {
    let app = app().await;
    let s = app.studio(0, None, 3).await;
    let no = online_order(&app, &s, "WECHAT_PAY").await;
    assert_eq!(
        app.wechat_paid(&no, "4200000000000000000000000003", 1).await,
        StatusCode::NO_CONTENT
    );
    let o = chain(&app, &no).await;
    assert_eq!(o["status"], "WAIT_PAY");
    assert_eq!(outcomes(&o), ["AMOUNT_MISMATCH"]);
    let t = app
        .op(
            &app.admin_token(),
            ADMIN_OPS,
            "Tickets",
            json!({"filter": {"kind": ["AMOUNT_MISMATCH"]}}),
        )
        .await;
    let node = &t["data"]["exceptionTickets"]["edges"][0]["node"];
    assert_eq!(node["localAmountCents"], 10_000);
    assert_eq!(node["providerAmountCents"], 1);
    assert_eq!(node["order"]["status"], "WAIT_PAY");
}

#[tokio::test]
async fn a_mixed_order_captures_its_frozen_wallet_part_when_the_online_part_is_paid() {
    let app = app().await;
    let s = app.studio(5_000, None, 3).await;
    let placed = app
        .place(
            &s.member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack},
                   "paymentMethod": "MIXED", "walletAmountCents": 4_000}),
        )
        .await;
    let no = placed["order"]["orderNo"].as_str().unwrap().to_string();
    assert_eq!(
        app.member_view(&s.member).await["wallet"],
        json!({"balanceCents": 1000, "frozenCents": 4000})
    );
    // The provider is asked for the online part only; paying the full price is a mismatch.
    assert_eq!(
        app.wechat_paid(&no, "4200000000000000000000000004", 10_000).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(chain(&app, &no).await["status"], "WAIT_PAY");
    assert_eq!(
        app.wechat_paid(&no, "4200000000000000000000000005", 6_000).await,
        StatusCode::NO_CONTENT
    );
    let o = chain(&app, &no).await;
    assert_eq!(o["status"], "PAID");
    assert_eq!(o["member"]["wallet"], json!({"balanceCents": 1000, "frozenCents": 0}));
    let ledger = app
        .sql_i64("SELECT count(*) AS v FROM wallet_ledger WHERE kind = 'CAPTURE'")
        .await;
    assert_eq!(ledger, 1);
}

#[tokio::test]
async fn alipay_success_then_finished_is_one_payment() {
    let app = app().await;
    let s = app.studio(0, None, 3).await;
    let no = online_order(&app, &s, "ALIPAY").await;
    let a = providers::alipay();
    let (status, text) = app
        .alipay_notify(&a.payment(&no, "2026113022001400000000000001", "WAIT_BUYER_PAY", "100.00"))
        .await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "success"));
    let (status, text) = app
        .alipay_notify(&a.payment(&no, "2026113022001400000000000001", "TRADE_SUCCESS", "100.00"))
        .await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "success"));
    let (status, _) = app
        .alipay_notify(&a.payment(&no, "2026113022001400000000000001", "TRADE_FINISHED", "100.00"))
        .await;
    assert_eq!(status, StatusCode::OK);
    let o = chain(&app, &no).await;
    assert_eq!(o["status"], "PAID");
    assert_eq!(outcomes(&o), ["RECORDED", "APPLIED", "DUPLICATE"]);
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payments").await, 1);
    // Forged, for another app, or not a form at all.
    let mut forged = a.payment(&no, "2026113022001400000000000002", "TRADE_SUCCESS", "100.00");
    forged = forged.replace("100.00", "1.00");
    let (status, text) = app.alipay_notify(&forged).await;
    assert_eq!((status, text.as_str()), (StatusCode::UNAUTHORIZED, "failure"));
    let mut other = providers::alipay();
    other.app_id = "2021009999999999".into();
    let (status, _) = app
        .alipay_notify(&other.payment(&no, "2026113022001400000000000003", "TRADE_SUCCESS", "100.00"))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = app.alipay_notify("").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payments").await, 1);
}

#[tokio::test]
async fn refund_notifications_are_recorded_and_failed_ones_ticketed() {
    let app = app().await;
    let s = app.studio(0, None, 3).await;
    let no = online_order(&app, &s, "WECHAT_PAY").await;
    assert_eq!(
        app.wechat_paid(&no, "4200000000000000000000000006", 10_000).await,
        StatusCode::NO_CONTENT
    );
    app.admin(REFUND, json!({"orderNo": no, "reason": "r"})).await;
    let w = providers::wechat();
    let now = chrono::Utc::now().timestamp();
    let ok = w.notification(
        "REFUND.SUCCESS",
        &w.refund(&no, "RF1", "50300000000001", "SUCCESS", 10_000, 10_000),
        now,
    );
    assert_eq!(app.wechat_notify(&ok).await.0, StatusCode::NO_CONTENT);
    assert_eq!(app.wechat_notify(&ok).await.0, StatusCode::NO_CONTENT);
    let bad = w.notification(
        "REFUND.ABNORMAL",
        &w.refund(&no, "RF1", "50300000000001", "ABNORMAL", 10_000, 10_000),
        now,
    );
    assert_eq!(app.wechat_notify(&bad).await.0, StatusCode::NO_CONTENT);
    let o = chain(&app, &no).await;
    assert_eq!(
        outcomes(&o),
        ["APPLIED", "REFUND_RECORDED", "DUPLICATE", "REFUND_FAILED"]
    );
    assert_eq!(o["status"], "REFUNDED");
    assert_eq!(o["tickets"][0]["kind"], "REFUND_MISMATCH");
}

#[tokio::test]
async fn bodies_of_several_mib_get_413_and_unconfigured_providers_503() {
    let app = app().await;
    let big = vec![b'{'; 4 << 20];
    let (status, _, _) = app
        .post(
            "/pay/wechat/notify",
            &[("content-type", "application/json")],
            big.clone(),
        )
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let (status, _, _) = app.post("/pay/alipay/notify", &[], big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let bare = TestApp::with_config(providers::unconfigure).await;
    let (status, _, body) = bare.post("/pay/wechat/notify", &[], b"{}".to_vec()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(String::from_utf8_lossy(&body).contains("FAIL"));
    let (status, _, _) = bare.post("/pay/alipay/notify", &[], b"a=b".to_vec()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn callback_evidence_commits_asynchronously_and_business_synchronously() {
    use diesel_async::RunQueryDsl;
    #[derive(diesel::QueryableByName)]
    struct S {
        #[diesel(sql_type = diesel::sql_types::Text)]
        synchronous_commit: String,
    }
    let app = app().await;
    let mut evidence = app.state.evidence.get().await.unwrap();
    let e: S = diesel::sql_query("SHOW synchronous_commit")
        .get_result(&mut evidence)
        .await
        .unwrap();
    assert_eq!(e.synchronous_commit, "off");
    // Business connections keep the server's setting (the private test cluster runs with it off
    // for speed; production servers with it on).
    let mut business = app.conn().await;
    let b: S = diesel::sql_query("SHOW synchronous_commit")
        .get_result(&mut business)
        .await
        .unwrap();
    let mut fresh = <diesel_async::AsyncPgConnection as diesel_async::AsyncConnection>::establish(&app.db_url)
        .await
        .unwrap();
    let server: S = diesel::sql_query("SHOW synchronous_commit")
        .get_result(&mut fresh)
        .await
        .unwrap();
    assert_eq!(b.synchronous_commit, server.synchronous_commit);
}

/// An Alipay notification signed here by the rule Alipay documents for RSA2 notifications
/// (apart from the project's signing code): every field but `sign` and `sign_type`, sorted by
/// key, joined as `k=v` with `&`, SHA256withRSA with the test Alipay key, base64.
pub fn alipay_signed(fields: &[(&str, &str)]) -> String {
    use base64::Engine;
    use rsa::signature::{SignatureEncoding, Signer};
    let mut all: Vec<(String, String)> = [
        ("notify_time", "2026-12-01 10:00:00"),
        ("notify_type", "trade_status_sync"),
        ("notify_id", &key()),
        ("app_id", providers::APP_ID),
        ("charset", "utf-8"),
        ("version", "1.0"),
        ("sign_type", "RSA2"),
        ("buyer_id", "2088102177846880"),
        ("seller_id", "2088101106499364"),
    ]
    .iter()
    .chain(fields)
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut signed: Vec<&(String, String)> = all.iter().filter(|(k, _)| k != "sign" && k != "sign_type").collect();
    signed.sort();
    let content: Vec<String> = signed.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let key = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(providers::alipay().alipay_key);
    let sig = key.sign(content.join("&").as_bytes()).to_bytes();
    all.push(("sign".into(), base64::engine::general_purpose::STANDARD.encode(sig)));
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(all)
        .finish()
}

/// Alipay's refund notification for `no`: the trade's status after it, the trade's refunded
/// total and our refund number.
pub fn alipay_refunded(no: &str, trade_no: &str, status: &str, refund_fee: &str, out_biz_no: &str) -> String {
    let mut fields = vec![
        ("out_trade_no", no),
        ("trade_no", trade_no),
        ("trade_status", status),
        ("total_amount", "100.00"),
        ("receipt_amount", "100.00"),
        ("gmt_create", "2026-12-01 08:10:00"),
        ("gmt_payment", "2026-12-01 08:10:05"),
        ("refund_fee", refund_fee),
        ("gmt_refund", "2026-12-01 09:30:00.417"),
        ("out_biz_no", out_biz_no),
    ];
    if status == "TRADE_CLOSED" {
        fields.push(("gmt_close", "2026-12-01 09:30:00"));
    }
    alipay_signed(&fields)
}

/// An Alipay order paid 100.00 as trade `trade_no`, then refunded `cents` (all when `None`)
/// through the admin console; returns the order and our refund number.
async fn alipay_paid_and_refunded(app: &TestApp, s: &Studio, trade_no: &str, cents: Option<i64>) -> (String, String) {
    let no = online_order(app, s, "ALIPAY").await;
    let paid = alipay_signed(&[
        ("out_trade_no", &no),
        ("trade_no", trade_no),
        ("trade_status", "TRADE_SUCCESS"),
        ("total_amount", "100.00"),
        ("receipt_amount", "100.00"),
    ]);
    assert_eq!(app.alipay_notify(&paid).await, (StatusCode::OK, "success".into()));
    let r = app
        .admin(REFUND, json!({"orderNo": no, "reason": "r", "amountCents": cents}))
        .await;
    assert_eq!(r["refundOrder"]["status"], "REFUNDED", "{r}");
    let id = app
        .sql_i64(&format!(
            "SELECT r.id AS v FROM refunds r JOIN orders o ON o.id = r.order_id WHERE o.order_no = '{no}'"
        ))
        .await;
    (no, format!("RF{id}"))
}

#[tokio::test]
async fn alipay_partial_and_full_refund_notifications_confirm_our_refunds() {
    let app = app().await;
    let s = app.studio(0, None, 3).await;
    // Partial: 30.00 of 100.00 back, the trade stays TRADE_SUCCESS.
    let (partial, rf1) = alipay_paid_and_refunded(&app, &s, "2026120122001400000000000011", Some(3_000)).await;
    let n = alipay_refunded(&partial, "2026120122001400000000000011", "TRADE_SUCCESS", "30.00", &rf1);
    assert_eq!(app.alipay_notify(&n).await, (StatusCode::OK, "success".into()));
    assert_eq!(app.alipay_notify(&n).await, (StatusCode::OK, "success".into()));
    let o = chain(&app, &partial).await;
    assert_eq!(outcomes(&o), ["APPLIED", "REFUND_RECORDED", "DUPLICATE"]);
    assert_eq!(o["status"], "REFUNDED");
    assert_eq!(o["tickets"], json!([]));
    // Full: everything back, the trade is TRADE_CLOSED.
    let (full, rf2) = alipay_paid_and_refunded(&app, &s, "2026120122001400000000000012", None).await;
    let n = alipay_refunded(&full, "2026120122001400000000000012", "TRADE_CLOSED", "100.00", &rf2);
    assert_eq!(app.alipay_notify(&n).await, (StatusCode::OK, "success".into()));
    let o = chain(&app, &full).await;
    assert_eq!(outcomes(&o), ["APPLIED", "REFUND_RECORDED"]);
    assert_eq!(o["tickets"], json!([]));
    // Neither was a payment: the two orders' payments are all there are.
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payments").await, 2);
    let callbacks = app
        .sql_i64("SELECT count(*) AS v FROM payment_callbacks WHERE provider_txn_id = '2026120122001400000000000011' AND amount_cents = 3000 AND outcome = 'REFUND_RECORDED'")
        .await;
    assert_eq!(callbacks, 1, "the callback row keeps the trade and the refunded total");
}

#[tokio::test]
async fn alipay_refunds_we_never_asked_for_are_tickets_and_a_timeout_close_changes_nothing() {
    let app = app().await;
    let s = app.studio(0, None, 3).await;
    let (no, rf) = alipay_paid_and_refunded(&app, &s, "2026120122001400000000000021", Some(3_000)).await;
    // Another refund number than ours.
    let unknown = alipay_refunded(
        &no,
        "2026120122001400000000000021",
        "TRADE_SUCCESS",
        "50.00",
        "RF-NOT-OURS",
    );
    assert_eq!(app.alipay_notify(&unknown).await, (StatusCode::OK, "success".into()));
    // Ours, but the trade's refunded total is more than we asked for.
    let more = alipay_refunded(&no, "2026120122001400000000000021", "TRADE_CLOSED", "100.00", &rf);
    assert_eq!(app.alipay_notify(&more).await, (StatusCode::OK, "success".into()));
    assert_eq!(app.alipay_notify(&more).await, (StatusCode::OK, "success".into()));
    let o = chain(&app, &no).await;
    assert_eq!(
        outcomes(&o),
        ["APPLIED", "REFUND_MISMATCH", "REFUND_MISMATCH", "DUPLICATE"]
    );
    let kinds: Vec<&str> = o["tickets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["REFUND_MISMATCH", "REFUND_MISMATCH"]);
    let why = app
        .sql_i64("SELECT count(*) AS v FROM exception_tickets WHERE detail->>'why' LIKE '%never asked for%' AND detail->>'refundNo' = 'RF-NOT-OURS'")
        .await;
    assert_eq!(why, 1);
    // A trade closed unpaid (timeout): TRADE_CLOSED without refund_fee. Recorded, nothing else.
    let unpaid = online_order(&app, &s, "ALIPAY").await;
    let closed = alipay_signed(&[
        ("out_trade_no", &unpaid),
        ("trade_no", "2026120122001400000000000022"),
        ("trade_status", "TRADE_CLOSED"),
        ("total_amount", "100.00"),
        ("gmt_create", "2026-12-01 08:10:00"),
        ("gmt_close", "2026-12-01 08:25:00"),
    ]);
    assert_eq!(app.alipay_notify(&closed).await, (StatusCode::OK, "success".into()));
    let o = chain(&app, &unpaid).await;
    assert_eq!(
        (o["status"].as_str(), outcomes(&o)),
        (Some("WAIT_PAY"), vec!["RECORDED".to_string()])
    );
    assert_eq!(o["tickets"], json!([]));
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payments").await, 1);
}

/// A provider's payment sends its announcements after its commit (`orders::Announcements`):
/// subscribers still see the order paid and its grants written, once each.
#[tokio::test]
async fn a_wechat_payment_is_announced_after_its_commit() {
    let app = app().await;
    let addr = crate::fakes::serve(fitorder::http::router(app.state.clone())).await;
    let mut ops = WsClient::connect(&addr, Some(&app.ops_token()), false).await.unwrap();
    ops.subscribe("o", OPS_OPS, Some("OrderStatusChanges"), json!({})).await;
    ops.subscribe("c", OPS_OPS, Some("CompensationUpdates"), json!({}))
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let s = app.studio(0, None, 3).await;
    let no = online_order(&app, &s, "WECHAT_PAY").await;
    assert_eq!(
        app.wechat_paid(&no, "4200001234202612020000000001", 10_000).await,
        StatusCode::NO_CONTENT
    );
    let (mut statuses, mut grants) = (vec![], vec![]);
    while statuses.len() < 2 || grants.len() < 2 {
        let p = ops.next_payload(10).await.expect("the payment's announcements");
        if let Some(c) = p["data"].get("orderStatusChanged") {
            assert_eq!(c["orderNo"], no);
            statuses.push(c["toStatus"].as_str().unwrap().to_string());
        }
        if let Some(e) = p["data"].get("compensationUpdates") {
            assert_eq!(e["orderNo"], no);
            grants.push(e["status"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(statuses, ["WAIT_PAY", "PAID"]);
    assert_eq!(grants, ["PENDING", "PENDING"]);
    // Nothing announced twice.
    assert!(ops.next_payload(1).await.is_none());
}
