//! fitorder's whole provider client — prepay, answers, notifications, query at expiry, close,
//! refund, platform certificates, Alipay certificate mode — against the independent stand-in
//! (`tests/standin/provider.py`, written from the providers' documentation, sharing no code
//! with fitorder), which checks every request as the providers do and signs as they do.

use std::time::Duration;

use fitorder::config::{AlipayConfig, Config, WechatPayConfig};
use serde_json::{json, Value};

use crate::harness::*;
use crate::standin::{Modes, StandIn, StandInMode, Trade};

pub(crate) fn point_at(c: &mut Config, s: &StandIn) {
    let d = s.dir();
    let pk = s.mode == StandInMode::PublicKey;
    c.wechatpay = WechatPayConfig {
        mch_id: Some(s.mch_id()),
        app_id: Some(s.wechat_app_id()),
        mobile_app_id: None,
        apiv3_key: Some(s.apiv3_key().into()),
        merchant_private_key: Some(s.merchant_key_path()),
        merchant_serial: Some(s.merchant_serial()),
        // Public-key mode names the 微信支付公钥; certificate mode downloads the certificates.
        platform_public_key: pk.then(|| d.join("wechat_public_key.pem")),
        public_key_id: pk.then(|| s.wechat_serial()),
        api_base: s.wechat_base(),
    };
    c.alipay = AlipayConfig {
        app_id: Some(s.alipay_app_id()),
        app_private_key: Some(s.app_key_path()),
        public_key: pk.then(|| d.join("alipay_public_key.pem")),
        app_cert: (!pk).then(|| d.join("appCertPublicKey.crt")),
        public_cert: (!pk).then(|| d.join("alipayCertPublicKey_RSA2.crt")),
        root_cert: (!pk).then(|| d.join("alipayRootCert.crt")),
        api_base: s.alipay_gateway(),
        seller_id: None,
    };
}

async fn place(app: &TestApp, s: &Studio, method: &str, channel: &str) -> Value {
    let extra = if channel == "WECHAT_JSAPI" {
        json!({"wechatOpenId": "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"})
    } else {
        json!({})
    };
    crate::start_payment::place_with(app, s, Some(channel), method, extra).await
}

async fn against_the_standin(mode: StandInMode) {
    let Some(standin) = StandIn::start_or_skip(mode) else {
        return;
    };
    let app = TestApp::served_with(|c| {
        point_at(c, &standin);
        c.retry_base = Duration::from_millis(50);
    })
    .await;
    let s = app.studio(0, None, 3).await;
    let mut wechat_no = String::new();
    for (method, channel) in [
        ("WECHAT_PAY", "WECHAT_NATIVE"),
        ("WECHAT_PAY", "WECHAT_JSAPI"),
        ("WECHAT_PAY", "WECHAT_APP"),
        ("WECHAT_PAY", "WECHAT_H5"),
        ("ALIPAY", "ALIPAY_QR"),
    ] {
        let r = place(&app, &s, method, channel).await;
        assert!(r.get("errors").is_none(), "{mode:?} {channel}: {r:#}");
        let pay = &r["data"]["placeOrder"]["payment"];
        assert_eq!(pay["channel"], channel);
        if channel == "WECHAT_NATIVE" {
            wechat_no = pay["outTradeNo"].as_str().unwrap().to_string();
        }
    }
    // Every request the stand-in saw verified as the provider verifies it, and carried the
    // deadline and notify_url.
    let requests = standin.requests().await;
    let prepays: Vec<&Value> = requests
        .iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/v3/pay/transactions/"))
                || r["params"]["method"] == "alipay.trade.precreate"
        })
        .collect();
    assert_eq!(prepays.len(), 5, "{requests:#?}");
    for r in &prepays {
        assert_eq!(r["verified"], true, "{r:#}");
        let body: Value = if r["provider"] == "ALIPAY" || r["params"].is_object() {
            serde_json::from_str(r["params"]["biz_content"].as_str().unwrap_or("{}")).unwrap()
        } else {
            serde_json::from_str(r["body"].as_str().unwrap_or("{}")).unwrap()
        };
        assert!(body["time_expire"].is_string(), "{r:#}");
        let notify = body["notify_url"]
            .as_str()
            .or(r["params"]["notify_url"].as_str())
            .unwrap_or_default();
        assert!(notify.starts_with(&app.state.config.public_url), "{r:#}");
    }
    if mode == StandInMode::Certificate {
        assert!(
            requests.iter().any(|r| r["path"] == "/v3/certificates"),
            "certificate mode fetched the platform certificates"
        );
        let ali = prepays.iter().find(|r| r["params"].is_object()).unwrap();
        assert_eq!(ali["params"]["app_cert_sn"].as_str(), standin.app_cert_sn().as_deref());
        assert_eq!(
            ali["params"]["alipay_root_cert_sn"].as_str(),
            standin.alipay_root_cert_sn().as_deref()
        );
    }

    // The stand-in's signed notification pays the order.
    let total = app.order(&wechat_no).await["amountCents"].as_i64().unwrap();
    standin
        .set_trade(
            Trade::wechat(&wechat_no, "SUCCESS")
                .amount(total)
                .transaction_id("4200000000000000000000000777"),
        )
        .await;
    let (status, body) = standin.notify(&wechat_no).await;
    assert!((200..300).contains(&status), "{status} {body}");
    assert_eq!(app.order(&wechat_no).await["status"], "PAID");

    // A refund goes to the stand-in, signed, and is done on its signed acceptance.
    app.admin(
        "mutation($n: String!) { refundOrder(orderNo: $n, reason: \"moving\") { status } }",
        json!({"n": wechat_no}),
    )
    .await;
    let worker = fitorder::compensation::worker::Worker::new(app.state.clone());
    let refunded = || async {
        app.sql_i64(
            "SELECT count(*) AS v FROM compensation_events WHERE kind = 'PROVIDER_REFUND' AND status = 'SUCCEEDED'",
        )
        .await
    };
    // The stand-in answers PROCESSING; the refund query (asked when the event is due again,
    // here at once rather than in an hour) finds it SUCCESS.
    for _ in 0..20 {
        worker.run_once().await.unwrap();
        if refunded().await == 1 {
            break;
        }
        refund_due_now(&app).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(refunded().await, 1);
    let refund = standin
        .requests()
        .await
        .into_iter()
        .find(|r| r["path"] == "/v3/refund/domestic/refunds")
        .expect("a refund request");
    assert_eq!(refund["verified"], true, "{refund:#}");

    // Answers signed with a key that is not the provider's are no answers.
    standin
        .set_mode(Modes {
            wrong_key: Some(true),
            ..Default::default()
        })
        .await;
    for (method, channel) in [("WECHAT_PAY", "WECHAT_NATIVE"), ("ALIPAY", "ALIPAY_QR")] {
        let r = place(&app, &s, method, channel).await;
        assert_eq!(r["data"]["placeOrder"]["order"]["status"], "WAIT_PAY", "{r:#}");
        assert!(r["data"]["placeOrder"]["payment"].is_null(), "{r:#}");
        assert_eq!(r["errors"][0]["extensions"]["reason"], "PROVIDER_UNAVAILABLE", "{r:#}");
    }
}

#[tokio::test]
async fn the_client_against_the_independent_standin_in_public_key_mode() {
    against_the_standin(StandInMode::PublicKey).await;
}

#[tokio::test]
async fn the_client_against_the_independent_standin_in_certificate_mode() {
    against_the_standin(StandInMode::Certificate).await;
}

/// The PROVIDER_REFUND events waiting for a retry or a recheck are due now.
async fn refund_due_now(app: &TestApp) {
    app.sql_i64(
        "WITH u AS (UPDATE compensation_events SET next_attempt_at = now()
                     WHERE status IN ('PENDING', 'RETRYING') AND kind = 'PROVIDER_REFUND' RETURNING 1)
         SELECT count(*) AS v FROM u",
    )
    .await;
}

async fn refund_statuses(app: &TestApp, nos: &[&str]) -> Vec<String> {
    let mut out = vec![];
    for no in nos {
        let o = app.order(no).await;
        let e = o["compensation"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == "PROVIDER_REFUND")
            .cloned()
            .unwrap_or_default();
        out.push(e["status"].as_str().unwrap_or_default().to_string());
    }
    out
}

/// Money's hard cases against the stand-in: a WeChat refund still PROCESSING when queried and
/// an Alipay refund answered `fund_change` N are not done until the provider's refund query
/// says so; a close refused because the member paid meanwhile (`ORDERPAID`,
/// `ACQ.TRADE_HAS_SUCCESS`) is followed by a query and the order is paid.
#[tokio::test]
async fn refunds_and_the_deadline_race_against_the_independent_standin() {
    let Some(standin) = StandIn::start_or_skip(StandInMode::PublicKey) else {
        return;
    };
    let app = TestApp::served_with(|c| {
        point_at(c, &standin);
        c.retry_base = Duration::from_millis(50);
    })
    .await;
    let s = app.studio(0, None, 3).await;
    let no_of = |r: &Value| {
        r["data"]["placeOrder"]["order"]["orderNo"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let wx = no_of(&place(&app, &s, "WECHAT_PAY", "WECHAT_NATIVE").await);
    let ali = no_of(&place(&app, &s, "ALIPAY", "ALIPAY_QR").await);
    let total = app.order(&wx).await["amountCents"].as_i64().unwrap();
    standin
        .set_trade(
            Trade::wechat(&wx, "SUCCESS")
                .amount(total)
                .transaction_id("4200000000000000000000000888"),
        )
        .await;
    standin
        .set_trade(
            Trade::alipay(&ali, "TRADE_SUCCESS")
                .amount(total)
                .transaction_id("2026120222001400000000000888"),
        )
        .await;
    for no in [&wx, &ali] {
        let (status, body) = standin.notify(no).await;
        assert!((200..300).contains(&status), "{status} {body}");
        assert_eq!(app.order(no).await["status"], "PAID");
    }

    standin
        .money(json!({"wechat_refund_hold": true, "alipay_refund_pending": true}))
        .await;
    for no in [&wx, &ali] {
        app.admin(
            "mutation($n: String!) { refundOrder(orderNo: $n, reason: \"moving\") { status } }",
            json!({"n": no}),
        )
        .await;
    }
    let worker = fitorder::compensation::worker::Worker::new(app.state.clone());
    worker.run_once().await.unwrap();
    assert_eq!(refund_statuses(&app, &[&wx, &ali]).await, ["RETRYING", "RETRYING"]);
    refund_due_now(&app).await;
    worker.run_once().await.unwrap();
    assert_eq!(
        refund_statuses(&app, &[&wx, &ali]).await,
        ["RETRYING", "RETRYING"],
        "asked again: still PROCESSING, still not moved"
    );
    let requests = standin.requests().await;
    let refund_no = |no: &str| {
        requests
            .iter()
            .find(|r| r["path"] == "/v3/refund/domestic/refunds" && r["body"].as_str().unwrap_or("").contains(no))
            .map(|r| serde_json::from_str::<Value>(r["body"].as_str().unwrap()).unwrap()["out_refund_no"].clone())
            .unwrap()
    };
    let wx_refund = refund_no(&wx);
    assert!(
        requests.iter().any(
            |r| r["path"] == format!("/v3/refund/domestic/refunds/{}", wx_refund.as_str().unwrap())
                && r["verified"] == true
        ),
        "the WeChat refund was queried"
    );
    let queries: Vec<&Value> = requests
        .iter()
        .filter(|r| r["params"]["method"] == "alipay.trade.fastpay.refund.query")
        .collect();
    assert!(
        queries.len() >= 2 && queries.iter().all(|r| r["verified"] == true),
        "{queries:#?}"
    );
    let ali_refund: Value = serde_json::from_str(queries[0]["params"]["biz_content"].as_str().unwrap()).unwrap();
    standin
        .end_refund(json!({"provider": "wechat", "out_refund_no": wx_refund, "status": "SUCCESS"}))
        .await;
    standin
        .end_refund(json!({"provider": "alipay", "out_request_no": ali_refund["out_request_no"]}))
        .await;
    refund_due_now(&app).await;
    worker.run_once().await.unwrap();
    assert_eq!(refund_statuses(&app, &[&wx, &ali]).await, ["SUCCEEDED", "SUCCEEDED"]);
    standin
        .money(json!({"wechat_refund_hold": false, "alipay_refund_pending": false}))
        .await;

    // The deadline race: the provider says unpaid, the member pays before the close arrives.
    let wx = no_of(&place(&app, &s, "WECHAT_PAY", "WECHAT_NATIVE").await);
    let ali = no_of(&place(&app, &s, "ALIPAY", "ALIPAY_QR").await);
    standin.set_trade(Trade::alipay(&ali, "WAIT_BUYER_PAY")).await;
    standin.money(json!({"pay_on_close": [wx, ali]})).await;
    app.sql_i64("WITH u AS (UPDATE orders SET expires_at = now() - interval '1 minute' WHERE status = 'WAIT_PAY' RETURNING 1) SELECT count(*) AS v FROM u")
        .await;
    fitorder::expiry::expire_due(&app.state).await.unwrap();
    for no in [&wx, &ali] {
        let o = app.order(no).await;
        assert_eq!(o["status"], "PAID", "{o:#}");
        assert!(o["tickets"].as_array().unwrap().is_empty(), "{o:#}");
    }
    let requests = standin.requests().await;
    let refused_closes = requests
        .iter()
        .filter(|r| {
            r["answer"]
                .as_str()
                .is_some_and(|a| a.contains("ORDERPAID") || a.contains("ACQ.TRADE_HAS_SUCCESS"))
        })
        .count();
    assert_eq!(refused_closes, 2, "both closes were refused as paid");
}
