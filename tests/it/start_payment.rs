//! Starting payments at the providers (issue 12), through the member app's own documents,
//! against the development sandbox playing WeChat Pay and Alipay on loopback: every channel,
//! the deadline and notify_url the trade carries, the same trade when asked again, JSAPI's
//! openid, answers that are not properly signed, an unconfigured provider, paying at the
//! cashier, expiry asking the provider, refunds confirmed only by signed answers.
//!
//! The signatures themselves are checked against the providers' own SDKs in `sdk_crosscheck`
//! and against an independent stand-in in `standin`; here the point is the whole path.

use std::time::Duration;

use chrono::{DateTime, Utc};
use fitorder::providers::alipay::gateway;
use fitorder::providers::crypto;
use serde_json::{json, Value};

use crate::harness::*;
use crate::providers;

fn channel_method(channel: &str) -> &'static str {
    if channel.starts_with("WECHAT") {
        "WECHAT_PAY"
    } else {
        "ALIPAY"
    }
}

fn provider_of(channel: &str) -> &'static str {
    channel_method(channel)
}

/// The member places a class pack order through the app's own `PlaceOrder`.
pub async fn place_with(app: &TestApp, s: &Studio, channel: Option<&str>, method: &str, extra: Value) -> Value {
    let mut input = json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack},
                           "paymentMethod": method});
    if let Some(c) = channel {
        input["channel"] = json!(c);
    }
    for (k, v) in extra.as_object().unwrap() {
        input[k] = v.clone();
    }
    app.op(
        &app.member_token(&s.member),
        MEMBER_OPS,
        "PlaceOrder",
        json!({"input": input}),
    )
    .await
}

fn form(query: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(query.as_bytes()).into_owned().collect()
}

#[tokio::test]
async fn every_channel_opens_a_trade_that_carries_the_deadline_and_notify_url() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 3).await;
    let merchant = providers::merchant_public();
    for channel in [
        "WECHAT_JSAPI",
        "WECHAT_NATIVE",
        "WECHAT_APP",
        "WECHAT_H5",
        "ALIPAY_APP",
        "ALIPAY_WAP",
        "ALIPAY_QR",
    ] {
        let extra = if channel == "WECHAT_JSAPI" {
            json!({"wechatOpenId": "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"})
        } else {
            json!({})
        };
        let r = place_with(&app, &s, Some(channel), channel_method(channel), extra).await;
        assert!(r.get("errors").is_none(), "{channel}: {r:#}");
        let order = &r["data"]["placeOrder"]["order"];
        let pay = &r["data"]["placeOrder"]["payment"];
        let no = order["orderNo"].as_str().unwrap();
        assert_eq!(pay["channel"], channel);
        assert_eq!(pay["outTradeNo"], no);
        assert_eq!(pay["amountCents"], order["amountCents"]);
        assert_eq!(pay["expiresAt"], order["expiresAt"]);
        let expires: DateTime<Utc> = order["expiresAt"].as_str().unwrap().parse().unwrap();
        // Exactly one of the channel fields is set.
        let set: Vec<&str> = ["wechatJsapi", "wechatApp", "qrCode", "payUrl", "alipayOrderString"]
            .into_iter()
            .filter(|f| !pay[*f].is_null())
            .collect();
        assert_eq!(set.len(), 1, "{channel}: {pay:#}");
        match channel {
            "WECHAT_JSAPI" => {
                let j = &pay["wechatJsapi"];
                assert_eq!(j["signType"], "RSA");
                assert!(j["package"].as_str().unwrap().starts_with("prepay_id="));
                let message = format!(
                    "{}\n{}\n{}\n{}\n",
                    j["appId"].as_str().unwrap(),
                    j["timeStamp"].as_str().unwrap(),
                    j["nonceStr"].as_str().unwrap(),
                    j["package"].as_str().unwrap()
                );
                assert!(crypto::verify(
                    &merchant,
                    message.as_bytes(),
                    j["paySign"].as_str().unwrap()
                ));
            }
            "WECHAT_APP" => {
                let a = &pay["wechatApp"];
                assert_eq!(a["packageValue"], "Sign=WXPay");
                assert_eq!(a["partnerId"], providers::MCH_ID);
                let message = format!(
                    "{}\n{}\n{}\n{}\n",
                    a["appId"].as_str().unwrap(),
                    a["timeStamp"].as_str().unwrap(),
                    a["nonceStr"].as_str().unwrap(),
                    a["prepayId"].as_str().unwrap()
                );
                assert!(crypto::verify(
                    &merchant,
                    message.as_bytes(),
                    a["sign"].as_str().unwrap()
                ));
            }
            "ALIPAY_APP" => {
                let params = form(pay["alipayOrderString"].as_str().unwrap());
                let get = |k: &str| {
                    params
                        .iter()
                        .find(|(n, _)| n == k)
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default()
                };
                assert_eq!(get("method"), "alipay.trade.app.pay");
                assert_eq!(
                    get("notify_url"),
                    format!("{}/pay/alipay/notify", app.state.config.public_url)
                );
                let biz: Value = serde_json::from_str(&get("biz_content")).unwrap();
                assert_eq!(biz["out_trade_no"], no);
                assert_eq!(biz["time_expire"], fitorder::providers::provider::alipay_time(expires));
                // The gateway's rule: every non-empty parameter but sign, sign_type included.
                assert!(crypto::verify(
                    &merchant,
                    gateway::request_content(&params).as_bytes(),
                    &get("sign")
                ));
                // The Alipay app hands the order string to the sandbox as the real app would.
                let resp = reqwest::Client::new()
                    .post(app.sandbox.alipay_app_pay_url())
                    .body(pay["alipayOrderString"].as_str().unwrap().to_string())
                    .send()
                    .await
                    .unwrap();
                assert!(resp.status().is_success(), "the sandbox refused the order string");
            }
            "ALIPAY_WAP" => {
                let url = pay["payUrl"].as_str().unwrap();
                assert!(url.starts_with(&app.sandbox.alipay_gateway()), "{url}");
                // Opening the page is the member's browser asking the gateway: it checks the signature.
                let resp = reqwest::get(url).await.unwrap();
                assert!(resp.status().is_success(), "the sandbox refused the WAP page");
            }
            _ => {}
        }
        let trade = app
            .sandbox
            .trade(provider_of(channel), no)
            .unwrap_or_else(|| panic!("{channel}: no trade at the sandbox"));
        assert_eq!(trade.amount_cents, order["amountCents"].as_i64().unwrap());
        assert_eq!(trade.time_expire.timestamp(), expires.timestamp(), "{channel}");
        let path = if channel.starts_with("WECHAT") {
            "/pay/wechat/notify"
        } else {
            "/pay/alipay/notify"
        };
        assert_eq!(
            trade.notify_url,
            format!("{}{path}", app.state.config.public_url),
            "{channel}"
        );
    }
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payment_trades").await, 7);
}

#[tokio::test]
async fn asking_again_answers_the_same_trade_and_another_channel_shares_the_out_trade_no() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 3).await;
    let input = json!({"idempotencyKey": "tap-1", "storeId": s.store, "item": {"classPackId": s.pack},
                       "paymentMethod": "WECHAT_PAY"});
    let tok = app.member_token(&s.member);
    let first = app.op(&tok, MEMBER_OPS, "PlaceOrder", json!({"input": input})).await;
    let again = app.op(&tok, MEMBER_OPS, "PlaceOrder", json!({"input": input})).await;
    let p1 = &first["data"]["placeOrder"]["payment"];
    assert_eq!(p1["channel"], "WECHAT_NATIVE", "the default channel");
    assert_eq!(
        p1, &again["data"]["placeOrder"]["payment"],
        "a double tap answers the same trade"
    );
    let no = p1["outTradeNo"].as_str().unwrap();
    let again = app
        .op(
            &tok,
            MEMBER_OPS,
            "StartPayment",
            json!({"orderNo": no, "channel": "WECHAT_NATIVE"}),
        )
        .await;
    assert_eq!(&again["data"]["startPayment"], p1);
    let prepays = |kind: &str| {
        app.sandbox
            .calls()
            .iter()
            .filter(|c| c.path.ends_with(&format!("/v3/pay/transactions/{kind}")))
            .count()
    };
    assert_eq!(prepays("native"), 1, "one prepay however often the member asks");
    // WeChat Pay keeps an out_trade_no to the trade type it was opened with (201 商户订单号重复):
    // asking for another channel is answered with the channel to use, nothing is stored.
    let jsapi = app
        .op(
            &tok,
            MEMBER_OPS,
            "StartPayment",
            json!({"orderNo": no, "channel": "WECHAT_JSAPI", "wechatOpenId": "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"}),
        )
        .await;
    assert_eq!(error_code(&jsapi), "CONFLICT", "{jsapi:#}");
    assert!(
        jsapi["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("WECHAT_NATIVE"),
        "{jsapi:#}"
    );
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payment_trades").await, 1);
    // Alipay takes the same out_trade_no through another cashier: QR first, then the WAP page.
    let ali = place_with(&app, &s, Some("ALIPAY_QR"), "ALIPAY", json!({})).await;
    let ali_no = ali["data"]["placeOrder"]["order"]["orderNo"]
        .as_str()
        .unwrap()
        .to_string();
    let wap = app
        .op(
            &tok,
            MEMBER_OPS,
            "StartPayment",
            json!({"orderNo": ali_no, "channel": "ALIPAY_WAP"}),
        )
        .await;
    assert_eq!(wap["data"]["startPayment"]["outTradeNo"], ali_no, "{wap:#}");
    assert!(wap["data"]["startPayment"]["payUrl"].is_string());
    // A channel of the other provider is not this order's.
    let wrong = app
        .op(
            &tok,
            MEMBER_OPS,
            "StartPayment",
            json!({"orderNo": no, "channel": "ALIPAY_QR"}),
        )
        .await;
    assert_eq!(error_code(&wrong), "BAD_USER_INPUT");
    // Another member's order is not found.
    let other = app.new_member(&s.store, 0).await;
    let theirs = app
        .op(
            &app.member_token(&other),
            MEMBER_OPS,
            "StartPayment",
            json!({"orderNo": no, "channel": "WECHAT_NATIVE"}),
        )
        .await;
    assert_eq!(error_code(&theirs), "NOT_FOUND");
}

#[tokio::test]
async fn jsapi_needs_an_openid_and_remembers_it() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 3).await;
    let r = place_with(&app, &s, Some("WECHAT_JSAPI"), "WECHAT_PAY", json!({})).await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT");
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM orders").await,
        0,
        "nothing is placed"
    );
    let bad = place_with(
        &app,
        &s,
        Some("WECHAT_JSAPI"),
        "WECHAT_PAY",
        json!({"wechatOpenId": "x'; --"}),
    )
    .await;
    assert_eq!(error_code(&bad), "BAD_USER_INPUT");
    let r = place_with(
        &app,
        &s,
        Some("WECHAT_JSAPI"),
        "WECHAT_PAY",
        json!({"wechatOpenId": "oOpenId_1"}),
    )
    .await;
    assert!(r.get("errors").is_none(), "{r:#}");
    let r = place_with(&app, &s, Some("WECHAT_JSAPI"), "WECHAT_PAY", json!({})).await;
    assert!(r.get("errors").is_none(), "the openid was remembered: {r:#}");
    let no = r["data"]["placeOrder"]["order"]["orderNo"].as_str().unwrap();
    assert_eq!(
        app.sandbox.trade("WECHAT_PAY", no).unwrap().payer_openid.as_deref(),
        Some("oOpenId_1")
    );
}

#[tokio::test]
async fn a_prepay_answer_signed_with_another_key_leaves_the_order_waiting_without_a_payment() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 3).await;
    app.sandbox.sign_answers_with_wrong_key(true);
    for (channel, method) in [("WECHAT_NATIVE", "WECHAT_PAY"), ("ALIPAY_QR", "ALIPAY")] {
        let r = place_with(&app, &s, Some(channel), method, json!({})).await;
        let placed = &r["data"]["placeOrder"];
        assert_eq!(placed["order"]["status"], "WAIT_PAY", "{r:#}");
        assert!(placed["payment"].is_null(), "{r:#}");
        let e = &r["errors"][0];
        assert_eq!(e["extensions"]["code"], "INTERNAL");
        assert_eq!(e["extensions"]["reason"], "PROVIDER_UNAVAILABLE");
        assert_eq!(e["path"], json!(["placeOrder", "payment"]));
        assert!(
            !e["message"].as_str().unwrap().contains("signature"),
            "no internals: {e}"
        );
    }
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payment_trades").await, 0);
    // The provider is trustworthy again: startPayment retries.
    app.sandbox.sign_answers_with_wrong_key(false);
    let no = app
        .gql(
            Some(&app.admin_token()),
            "{ orders(filter: {status: [WAIT_PAY]}) { edges { node { orderNo paymentMethod } } } }",
            json!({}),
        )
        .await["data"]["orders"]["edges"][0]["node"]["orderNo"]
        .as_str()
        .unwrap()
        .to_string();
    let r = app
        .op(
            &app.member_token(&s.member),
            MEMBER_OPS,
            "StartPayment",
            json!({"orderNo": no, "channel": "WECHAT_NATIVE"}),
        )
        .await;
    let r = if r.get("errors").is_some() {
        app.op(
            &app.member_token(&s.member),
            MEMBER_OPS,
            "StartPayment",
            json!({"orderNo": no, "channel": "ALIPAY_QR"}),
        )
        .await
    } else {
        r
    };
    assert!(r["data"]["startPayment"]["qrCode"].is_string(), "{r:#}");
}

#[tokio::test]
async fn an_unconfigured_provider_is_refused_before_anything_is_placed() {
    let app = TestApp::with_config(providers::unconfigure_alipay).await;
    let s = app.studio(5_000, None, 3).await;
    for (channel, method) in [(None, "ALIPAY"), (Some("ALIPAY_QR"), "MIXED")] {
        let extra = if method == "MIXED" {
            json!({"walletAmountCents": 1_000})
        } else {
            json!({})
        };
        let r = place_with(&app, &s, channel, method, extra).await;
        assert_eq!(error_code(&r), "BAD_USER_INPUT", "{r:#}");
    }
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM orders").await, 0);
    assert_eq!(app.sql_i64("SELECT frozen_cents AS v FROM members").await, 0);
    let r = app.post("/pay/alipay/notify", &[], b"a=b".to_vec()).await;
    assert_eq!(r.0.as_u16(), 503, "its callbacks are refused");
}

#[tokio::test]
async fn a_member_pays_at_the_cashier_and_the_signed_notification_pays_the_order() {
    let app = TestApp::served().await;
    let s = app.studio(5_000, None, 3).await;
    for (channel, method, extra) in [
        ("WECHAT_NATIVE", "WECHAT_PAY", json!({})),
        ("ALIPAY_QR", "ALIPAY", json!({})),
        ("WECHAT_H5", "MIXED", json!({"walletAmountCents": 1_000})),
    ] {
        let r = place_with(&app, &s, Some(channel), method, extra).await;
        let no = r["data"]["placeOrder"]["order"]["orderNo"]
            .as_str()
            .unwrap()
            .to_string();
        app.sandbox.pay(provider_of(channel), &no).await.unwrap();
        let order = app.order(&no).await;
        assert_eq!(order["status"], "PAID", "{channel}: {order:#}");
        assert!(order["providerTxnId"].is_string());
    }
    assert_eq!(
        app.sql_i64("SELECT frozen_cents AS v FROM members").await,
        0,
        "the MIXED part was captured"
    );
}

#[tokio::test]
async fn expiry_waits_for_a_member_still_paying_and_believes_only_signed_answers() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 3).await;
    // Time passes: the deadlines lie `minutes` back, and claims of earlier rounds have lapsed.
    let due = |app: &TestApp, minutes: i64| {
        let pool = app.state.pool.clone();
        async move {
            use diesel_async::RunQueryDsl;
            let mut conn = pool.get().await.unwrap();
            diesel::sql_query(format!(
                "UPDATE orders SET expires_at = now() - interval '{minutes} minutes' WHERE status = 'WAIT_PAY'"
            ))
            .execute(&mut conn)
            .await
            .unwrap();
            diesel::sql_query("UPDATE expiry_claims SET claimed_until = now()")
                .execute(&mut conn)
                .await
                .unwrap();
        }
    };
    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WECHAT_PAY")
        .await;
    due(&app, 1).await;
    app.sandbox.set_state("WECHAT_PAY", &no, "USERPAYING");
    fitorder::expiry::expire_due(&app.state).await.unwrap();
    assert_eq!(
        app.order(&no).await["status"],
        "WAIT_PAY",
        "USERPAYING is not unpaid: ask again first"
    );
    // A forged "SUCCESS" does not pay the order; without a trustworthy answer it is canceled
    // (past the grace for members still paying), and the trade is not closed on a forged word.
    app.sandbox.set_state("WECHAT_PAY", &no, "SUCCESS");
    app.sandbox.sign_answers_with_wrong_key(true);
    due(&app, 10).await;
    fitorder::expiry::expire_due(&app.state).await.unwrap();
    let order = app.order(&no).await;
    assert_eq!(order["status"], "CANCELED", "{order:#}");
    assert!(order["paidAt"].is_null());
    // A second order: unpaid at the provider (signed) → closed there and canceled.
    app.sandbox.sign_answers_with_wrong_key(false);
    let no2 = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "ALIPAY")
        .await;
    due(&app, 1).await;
    fitorder::expiry::expire_due(&app.state).await.unwrap();
    assert_eq!(app.order(&no2).await["status"], "CANCELED");
    let closes: Vec<_> = app
        .sandbox
        .calls()
        .into_iter()
        .filter(|c| c.api == "alipay.trade.close" && c.verified)
        .collect();
    assert_eq!(
        closes.len(),
        1,
        "the unpaid trade is closed at the provider before the cancel"
    );
}

#[tokio::test]
async fn a_refund_is_done_only_when_the_provider_accepts_it_in_a_signed_answer() {
    let app = TestApp::served_with(|c| c.retry_base = Duration::from_millis(50)).await;
    let s = app.studio(0, None, 3).await;
    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WECHAT_PAY")
        .await;
    app.sandbox.pay("WECHAT_PAY", &no).await.unwrap();
    assert_eq!(app.order(&no).await["status"], "PAID");
    app.admin(
        "mutation($n: String!) { refundOrder(orderNo: $n, reason: \"member moved away\") { status } }",
        json!({"n": no}),
    )
    .await;
    // PROCESSING until the test ends it (a genuine REFUND.SUCCESS would confirm it by itself).
    app.sandbox
        .set_refund_flow(fitorder::dev::sandbox_server::RefundFlow::Hold);
    app.sandbox.sign_answers_with_wrong_key(true);
    let worker = fitorder::compensation::worker::Worker::new(app.state.clone());
    worker.run_once().await.unwrap();
    let e = provider_refund(&app, &no).await;
    let last_error = app
        .admin(
            "query($n: String!) { compensationEvents(filter: {orderNo: $n, kind: [PROVIDER_REFUND]}) { edges { node { lastError } } } }",
            json!({"n": no}),
        )
        .await["compensationEvents"]["edges"][0]["node"]["lastError"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_ne!(e["status"], "SUCCEEDED", "a forged acceptance is no acceptance: {e:#}");
    assert!(last_error.contains("unsigned"), "{last_error}");
    app.sandbox.sign_answers_with_wrong_key(false);
    let refund_no = app.sandbox.trade("WECHAT_PAY", &no).unwrap().refunds[0]
        .out_refund_no
        .clone();
    app.sandbox.finish_refund_silently(&refund_no, "SUCCESS").unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    worker.run_once().await.unwrap();
    assert_eq!(provider_refund(&app, &no).await["status"], "SUCCEEDED");
    let trade = app.sandbox.trade("WECHAT_PAY", &no).unwrap();
    assert_eq!(trade.refunds.len(), 1, "{trade:?}");
}

#[tokio::test]
async fn providers_configured_in_part_stop_the_start_naming_what_is_missing() {
    let mut c = fitorder::config::Config::for_tests("postgres://unused".into());
    providers::configure(&mut c);
    c.wechatpay.merchant_serial = None;
    let err = fitorder::providers::keys::ProviderKeys::load(&c)
        .err()
        .expect("refused");
    assert!(format!("{err:#}").contains("WECHATPAY_MCH_SERIAL"), "{err:#}");
    let mut c = fitorder::config::Config::for_tests("postgres://unused".into());
    providers::configure(&mut c);
    c.alipay.app_private_key = None;
    let err = fitorder::providers::keys::ProviderKeys::load(&c)
        .err()
        .expect("refused");
    assert!(format!("{err:#}").contains("ALIPAY_APP_PRIVATE_KEY"), "{err:#}");
}

async fn provider_refund(app: &TestApp, no: &str) -> Value {
    let o = app.order(no).await;
    o["compensation"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "PROVIDER_REFUND")
        .cloned()
        .unwrap_or_else(|| panic!("no PROVIDER_REFUND event: {o:#}"))
}
