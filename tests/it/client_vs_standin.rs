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
        apiv3_key: Some(s.apiv3_key()),
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
    for _ in 0..20 {
        worker.run_once().await.unwrap();
        if refunded().await == 1 {
            break;
        }
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
