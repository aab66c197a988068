//! Money at the providers (issue 24), against the development sandbox playing WeChat Pay and
//! Alipay on loopback: one provider client for every caller, refunds done only when the money
//! moved (Alipay `fund_change` `N` and the refund query, WeChat `PROCESSING` and its
//! notification or query), refund notifications nobody asked for, and the deadline race (a close
//! refused because the member paid meanwhile, at expiry and at `cancelOrder`).

use std::time::Duration;

use fitorder::dev::sandbox_server::{AlipayRefundFlow, RefundFlow};
use serde_json::{json, Value};

use crate::harness::*;

/// A paid order of `method` (the sandbox's cashier paid it and its notification was applied).
async fn paid_order(app: &TestApp, s: &Studio, method: &str) -> String {
    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), method)
        .await;
    app.sandbox.pay(method, &no).await.unwrap();
    assert_eq!(app.order(&no).await["status"], "PAID");
    no
}

async fn refund(app: &TestApp, no: &str) {
    app.admin(REFUND, json!({"orderNo": no, "reason": "member moved away"}))
        .await;
}

/// The order's PROVIDER_REFUND event: (status, attempts, last error).
async fn refund_event(app: &TestApp, no: &str) -> (String, i64, String) {
    let e = app
        .admin(
            "query($n: String!) { compensationEvents(filter: {orderNo: $n, kind: [PROVIDER_REFUND]}) {
                edges { node { status attempts lastError } } } }",
            json!({"n": no}),
        )
        .await["compensationEvents"]["edges"][0]["node"]
        .clone();
    (
        e["status"].as_str().unwrap_or_default().to_string(),
        e["attempts"].as_i64().unwrap_or(-1),
        e["lastError"].as_str().unwrap_or_default().to_string(),
    )
}

/// The refund event is due now (its recheck or backoff has passed).
async fn due_now(app: &TestApp) {
    app.sql_i64(
        "WITH u AS (UPDATE compensation_events SET next_attempt_at = now()
                     WHERE status IN ('PENDING', 'RETRYING') AND kind = 'PROVIDER_REFUND' RETURNING 1)
         SELECT count(*) AS v FROM u",
    )
    .await;
}

fn calls(app: &TestApp, api: &str) -> usize {
    app.sandbox
        .calls()
        .iter()
        .filter(|c| c.api == api && c.verified)
        .count()
}

async fn wait_for(what: &str, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..200 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what} never happened");
}

/// Another instance of fitorder on the same database: its own pool and its own keyring (no
/// platform certificate loaded yet), the same configuration.
fn second_instance(app: &TestApp) -> fitorder::app::AppState {
    let pool = fitorder::db::pool(&app.db_url, 4).unwrap();
    let config = (*app.state.config).clone();
    let keys = fitorder::providers::keys::ProviderKeys::load(&config).unwrap();
    fitorder::app::AppState::with_keys(
        pool,
        config,
        keys,
        fitorder::events::EventHub::detached(),
        app.db_url.clone(),
    )
}

/// In certificate mode the platform key comes from `/v3/certificates`, kept in the database.
/// The outbox worker and expiry use the instance's one provider client, which can load the
/// certificate another instance stored; a client of their own without the pool could not (the
/// refund was "unsigned", expiry canceled without closing).
#[tokio::test]
async fn the_worker_and_expiry_use_the_one_provider_client_and_load_platform_certificates() {
    use fitorder::dev::sandbox_server::WechatSerialMode;
    let app = TestApp::served_with(|c| {
        c.wechatpay.platform_public_key = None;
        c.wechatpay.public_key_id = None;
    })
    .await;
    app.sandbox.set_wechat_serial_mode(WechatSerialMode::Certificate);
    app.sandbox.set_refund_flow(RefundFlow::Immediate);
    let s = app.studio(0, None, 3).await;
    let paid = paid_order(&app, &s, "WECHAT_PAY").await;
    refund(&app, &paid).await;
    let waiting = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WECHAT_PAY")
        .await;
    assert_eq!(
        calls(&app, "/v3/certificates"),
        1,
        "the first instance fetched the certificate"
    );

    let other = second_instance(&app);
    let worker = fitorder::compensation::worker::Worker::new(other.clone());
    worker.run_once().await.unwrap();
    let (status, _, error) = refund_event(&app, &paid).await;
    assert_eq!(status, "SUCCEEDED", "{error}");

    app.sql_i64("WITH u AS (UPDATE orders SET expires_at = now() - interval '1 minute' WHERE status = 'WAIT_PAY' RETURNING 1) SELECT count(*) AS v FROM u")
        .await;
    fitorder::expiry::expire_due(&other).await.unwrap();
    assert_eq!(app.order(&waiting).await["status"], "CANCELED");
    assert_eq!(
        calls(&app, "/v3/pay/transactions/out-trade-no/{out_trade_no}/close"),
        1,
        "the trade was closed on a signed answer before the cancel"
    );
    assert_eq!(app.sandbox.trade("WECHAT_PAY", &waiting).unwrap().state, "CLOSED");
}

/// Alipay `fund_change` `N`: nothing moved with that request. The refund is done only when
/// `alipay.trade.fastpay.refund.query` says `REFUND_SUCCESS` (or the refund notification
/// confirms it); until then the event is retried with its backoff, DEAD and a ticket at the end.
#[tokio::test]
async fn an_alipay_refund_answered_fund_change_n_is_done_only_on_refund_success() {
    let app = TestApp::served_with(|c| {
        c.retry_base = Duration::from_millis(10);
        c.max_attempts = 3;
    })
    .await;
    app.expect_dead(); // a refund the provider never confirms ends DEAD
    let s = app.studio(0, None, 3).await;
    let worker = fitorder::compensation::worker::Worker::new(app.state.clone());

    // Held: the query finds no finished refund; the notification then confirms it.
    app.sandbox.set_alipay_refund_flow(AlipayRefundFlow::Hold);
    let held = paid_order(&app, &s, "ALIPAY").await;
    refund(&app, &held).await;
    worker.run_once().await.unwrap();
    let (status, attempts, error) = refund_event(&app, &held).await;
    assert_eq!((status.as_str(), attempts), ("RETRYING", 1), "{error}");
    assert!(error.contains("fund_change N"), "{error}");
    assert_eq!(calls(&app, "alipay.trade.fastpay.refund.query"), 1);
    due_now(&app).await;
    worker.run_once().await.unwrap();
    assert_eq!(
        refund_event(&app, &held).await.0,
        "RETRYING",
        "asked again: still not moved"
    );
    let refund_no = app.sandbox.trade("ALIPAY", &held).unwrap().refunds[0]
        .out_refund_no
        .clone();
    let sent = app.sandbox.finish_alipay_refund(&refund_no).await.unwrap();
    assert!(sent.acknowledged, "{sent:?}");
    assert_eq!(
        refund_event(&app, &held).await.0,
        "SUCCEEDED",
        "the notification confirmed it"
    );

    // Later: no notification reaches fitorder; the next attempt's query finds REFUND_SUCCESS.
    app.sandbox.set_alipay_refund_flow(AlipayRefundFlow::Later);
    app.sandbox.lose_notifications(true);
    let later = paid_order_quietly(&app, &s, "ALIPAY").await;
    refund(&app, &later).await;
    worker.run_once().await.unwrap();
    assert_eq!(refund_event(&app, &later).await.0, "RETRYING");
    tokio::time::sleep(Duration::from_millis(100)).await;
    due_now(&app).await;
    worker.run_once().await.unwrap();
    let (status, _, error) = refund_event(&app, &later).await;
    assert_eq!(status, "SUCCEEDED", "{error}");
    let trade = app.sandbox.trade("ALIPAY", &later).unwrap();
    assert_eq!(trade.refunds.len(), 1, "one refund, asked once and queried: {trade:?}");

    // Never moved: DEAD at the last attempt, with its ticket.
    app.sandbox.set_alipay_refund_flow(AlipayRefundFlow::Hold);
    let never = paid_order_quietly(&app, &s, "ALIPAY").await;
    refund(&app, &never).await;
    for _ in 0..3 {
        due_now(&app).await;
        worker.run_once().await.unwrap();
    }
    assert_eq!(refund_event(&app, &never).await.0, "DEAD");
    let o = app.order(&never).await;
    assert!(
        o["tickets"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["kind"] == "COMPENSATION_DEAD"),
        "{o:#}"
    );
}

/// Paid at the cashier while the sandbox's notifications to fitorder are lost, the payment
/// applied from the provider's signed query (as expiry would): refunds then cannot be
/// confirmed by a notification.
async fn paid_order_quietly(app: &TestApp, s: &Studio, method: &str) -> String {
    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), method)
        .await;
    let _ = app.sandbox.pay(method, &no).await;
    let t = app.sandbox.trade(method, &no).unwrap();
    let provider = fitorder::domain::Provider::from_short_name(method).unwrap();
    let outcome = fitorder::payments::closing::apply_found_payment(
        &app.state,
        provider,
        &no,
        t.txn_id.as_deref().unwrap(),
        t.amount_cents,
        "test",
        &fitorder::trace::TraceId::new(),
    )
    .await
    .unwrap();
    assert_eq!(outcome.as_str(), "APPLIED");
    no
}

/// WeChat `PROCESSING` is not done: done on `REFUND.SUCCESS`, or when the refund query asked an
/// hour later says `SUCCESS`; `ABNORMAL` or `CLOSED` is DEAD with a ticket at once; a
/// `REFUND.SUCCESS` for a refund fitorder never asked for is a `REFUND_MISMATCH` ticket.
#[tokio::test]
async fn a_wechat_refund_processing_is_done_only_on_success() {
    let app = TestApp::served_with(|c| c.retry_base = Duration::from_millis(10)).await;
    app.expect_dead(); // an ABNORMAL refund ends DEAD, for a person
    let s = app.studio(0, None, 3).await;
    let worker = fitorder::compensation::worker::Worker::new(app.state.clone());
    app.sandbox.set_refund_flow(RefundFlow::Hold);

    // PROCESSING, then the notification.
    let notified = paid_order(&app, &s, "WECHAT_PAY").await;
    refund(&app, &notified).await;
    worker.run_once().await.unwrap();
    let (status, _, error) = refund_event(&app, &notified).await;
    assert_eq!(status, "RETRYING", "{error}");
    assert!(error.contains("PROCESSING"), "{error}");
    let recheck_in = app
        .sql_i64("SELECT extract(epoch FROM next_attempt_at - now())::bigint AS v FROM compensation_events WHERE kind = 'PROVIDER_REFUND'")
        .await;
    assert!(
        (3500..=3600).contains(&recheck_in),
        "asked again in an hour, not {recheck_in} s"
    );
    let refund_no = app.sandbox.trade("WECHAT_PAY", &notified).unwrap().refunds[0]
        .out_refund_no
        .clone();
    let sent = app.sandbox.finish_refund(&refund_no, "SUCCESS").await.unwrap();
    assert!(sent.acknowledged, "{sent:?}");
    assert_eq!(refund_event(&app, &notified).await.0, "SUCCEEDED");

    // PROCESSING, the notification lost: the query an hour later finds SUCCESS.
    let queried = paid_order(&app, &s, "WECHAT_PAY").await;
    refund(&app, &queried).await;
    worker.run_once().await.unwrap();
    let refund_no = app.sandbox.trade("WECHAT_PAY", &queried).unwrap().refunds[0]
        .out_refund_no
        .clone();
    app.sandbox.finish_refund_silently(&refund_no, "SUCCESS").unwrap();
    let posts = calls(&app, "/v3/refund/domestic/refunds");
    due_now(&app).await;
    worker.run_once().await.unwrap();
    let (status, _, error) = refund_event(&app, &queried).await;
    assert_eq!(status, "SUCCEEDED", "{error}");
    assert_eq!(calls(&app, "/v3/refund/domestic/refunds/{out_refund_no}"), 1);
    assert_eq!(
        calls(&app, "/v3/refund/domestic/refunds"),
        posts,
        "a refund the provider knows is asked about, not requested again"
    );

    // ABNORMAL: the money did not go back; DEAD with a ticket at once.
    let abnormal = paid_order(&app, &s, "WECHAT_PAY").await;
    refund(&app, &abnormal).await;
    worker.run_once().await.unwrap();
    let refund_no = app.sandbox.trade("WECHAT_PAY", &abnormal).unwrap().refunds[0]
        .out_refund_no
        .clone();
    app.sandbox.finish_refund_silently(&refund_no, "ABNORMAL").unwrap();
    due_now(&app).await;
    worker.run_once().await.unwrap();
    let (status, attempts, error) = refund_event(&app, &abnormal).await;
    assert_eq!((status.as_str(), attempts), ("DEAD", 2), "{error}");
    assert!(error.contains("ABNORMAL"), "{error}");
    let o = app.order(&abnormal).await;
    assert!(
        o["tickets"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["kind"] == "COMPENSATION_DEAD"),
        "{o:#}"
    );

    // A REFUND.SUCCESS for a refund nobody asked for.
    let w = crate::providers::wechat();
    let forged = w.notification(
        "REFUND.SUCCESS",
        &w.refund(&notified, "RF999", "50300000000999", "SUCCESS", 10_000, 10_000),
        chrono::Utc::now().timestamp(),
    );
    assert_eq!(app.wechat_notify(&forged).await.0.as_u16(), 204);
    let o = app.order(&notified).await;
    let tickets: Vec<&Value> = o["tickets"].as_array().unwrap().iter().collect();
    assert!(tickets.iter().any(|t| t["kind"] == "REFUND_MISMATCH"), "{o:#}");
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM payment_callbacks WHERE outcome = 'REFUND_MISMATCH'")
            .await,
        1
    );
}

/// Expiry: the provider said unpaid, the member paid just before the close arrived (WeChat
/// `ORDERPAID`, Alipay `ACQ.TRADE_STATUS_ERROR`): the close is followed by a query and the
/// payment applied — PAID, not canceled and refunded as paid-after-cancel. The notification
/// that comes afterwards is a duplicate.
#[tokio::test]
async fn a_close_refused_because_the_member_paid_meanwhile_pays_the_order_at_expiry() {
    let app = TestApp::served().await;
    let s = app.studio(0, None, 3).await;
    let wechat = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WECHAT_PAY")
        .await;
    let alipay = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "ALIPAY")
        .await;
    // The Alipay trade exists at Alipay once the member opened the cashier.
    app.sandbox.set_state("ALIPAY", &alipay, "WAIT_BUYER_PAY");
    app.sandbox.pay_during_close("WECHAT_PAY", &wechat, false);
    app.sandbox.pay_during_close("ALIPAY", &alipay, true);
    app.sql_i64("WITH u AS (UPDATE orders SET expires_at = now() - interval '1 minute' WHERE status = 'WAIT_PAY' RETURNING 1) SELECT count(*) AS v FROM u")
        .await;
    fitorder::expiry::expire_due(&app.state).await.unwrap();
    for (provider, no) in [("WECHAT_PAY", &wechat), ("ALIPAY", &alipay)] {
        let o = app.order(no).await;
        assert_eq!(o["status"], "PAID", "{provider}: {o:#}");
        let t = app.sandbox.trade(provider, no).unwrap();
        assert_eq!(o["providerTxnId"].as_str(), t.txn_id.as_deref());
        assert!(
            !o["compensation"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["kind"] == "PROVIDER_REFUND"),
            "{o:#}"
        );
        assert!(o["tickets"].as_array().unwrap().is_empty(), "{o:#}");
    }
    // The late Alipay notification changes nothing.
    wait_for("the late notification", async || {
        app.sandbox
            .notifications()
            .iter()
            .any(|n| n.out_trade_no == alipay && n.acknowledged)
    })
    .await;
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payments").await, 2);
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM payment_callbacks WHERE outcome = 'APPLIED'")
            .await,
        2,
        "each payment applied once (the late notification, or the query before it, is a duplicate)"
    );
}

/// `cancelOrder` of a waiting order with a trade closes the trade first; when the member paid
/// meanwhile the answer is the order PAID; a provider that cannot be reached leaves the order
/// waiting (nothing is canceled on a guess).
#[tokio::test]
async fn canceling_closes_the_trade_first_and_a_paid_trade_answers_paid() {
    let app = TestApp::served().await;
    let s = app.studio(0, None, 3).await;
    let member = app.member_token(&s.member);
    let cancel = |no: &str| json!({"orderNo": no, "reason": "changed my mind"});

    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WECHAT_PAY")
        .await;
    let r = app.ok(&member, CANCEL, cancel(&no)).await;
    assert_eq!(r["cancelOrder"]["status"], "CANCELED", "{r:#}");
    assert_eq!(app.sandbox.trade("WECHAT_PAY", &no).unwrap().state, "CLOSED");
    assert!(
        app.sandbox.pay("WECHAT_PAY", &no).await.is_err(),
        "a closed trade cannot be paid"
    );

    // Staff cancel; the member paid at the cashier a moment before.
    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "ALIPAY")
        .await;
    app.sandbox.set_state("ALIPAY", &no, "WAIT_BUYER_PAY");
    app.sandbox.pay_during_close("ALIPAY", &no, false);
    let r = app.admin(CANCEL, cancel(&no)).await;
    assert_eq!(r["cancelOrder"]["status"], "PAID", "{r:#}");
    let o = app.order(&no).await;
    assert_eq!(o["status"], "PAID");
    assert!(o["tickets"].as_array().unwrap().is_empty(), "{o:#}");

    // The provider cannot be reached: the order waits.
    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WECHAT_PAY")
        .await;
    app.sandbox.fail_with(Some(500));
    let r = app.gql(Some(&member), CANCEL, cancel(&no)).await;
    assert_eq!(error_code(&r), "INTERNAL", "{r:#}");
    assert_eq!(r["errors"][0]["extensions"]["reason"], "PROVIDER_UNAVAILABLE", "{r:#}");
    assert_eq!(app.order(&no).await["status"], "WAIT_PAY");
    app.sandbox.fail_with(None);
    let r = app.ok(&member, CANCEL, cancel(&no)).await;
    assert_eq!(r["cancelOrder"]["status"], "CANCELED");

    // Without a trade (never started) there is nothing to close.
    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "OFFLINE")
        .await;
    let r = app.ok(&member, CANCEL, cancel(&no)).await;
    assert_eq!(r["cancelOrder"]["status"], "CANCELED");
}
