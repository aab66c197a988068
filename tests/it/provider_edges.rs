//! What production lives through at the providers (issue 24, outages and edges), end to end
//! against the development sandbox (`payments::sandbox_server`) and the independent stand-in
//! (`tests/standin/provider.py`): WeChat's key switch, Alipay's certificate renewal, two app
//! ids, the H5 payer's address, timeouts, unsigned error answers and quiet bill days.

use std::time::{Duration, Instant};

use chrono::Utc;
use fitorder::dev::sandbox_server::BillControls;
use fitorder::domain::payment::Provider;
use fitorder::domain::ReconciliationStatus;
use fitorder::trace::TraceId;
use serde_json::{json, Value};

use crate::harness::*;
use crate::providers;
use crate::standin::{StandIn, StandInMode, Trade};
use crate::start_payment::place_with;

fn method_of(channel: &str) -> &'static str {
    if channel.starts_with("WECHAT") {
        "WECHAT_PAY"
    } else {
        "ALIPAY"
    }
}

async fn place(app: &TestApp, s: &Studio, channel: &str) -> Value {
    let extra = if channel == "WECHAT_JSAPI" {
        json!({"wechatOpenId": "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"})
    } else {
        json!({})
    };
    place_with(app, s, Some(channel), method_of(channel), extra).await
}

fn order_no(r: &Value) -> String {
    r["data"]["placeOrder"]["order"]["orderNo"]
        .as_str()
        .unwrap_or_else(|| panic!("no order: {r:#}"))
        .to_string()
}

fn today() -> chrono::NaiveDate {
    Utc::now().with_timezone(&chrono_tz::Asia::Shanghai).date_naive()
}

fn statement_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fitorder-edges-{}", key()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[tokio::test]
async fn during_a_key_switch_answers_and_notifications_signed_by_either_key_verify() {
    // The 微信支付公钥 is configured; WeChat Pay also signs with a platform certificate of
    // another key, which fitorder has never seen.
    let app = TestApp::served().await;
    app.sandbox.set_wechat_key_switch(true).await.unwrap();
    let s = app.studio(0, None, 3).await;
    for _ in 0..4 {
        let r = place(&app, &s, "WECHAT_NATIVE").await;
        assert!(r.get("errors").is_none(), "{r:#}");
        let no = order_no(&r);
        // Notifications alternate between the two keys: every one is acknowledged.
        app.sandbox.pay("WECHAT_PAY", &no).await.unwrap();
        assert_eq!(app.order(&no).await["status"], "PAID");
    }
    // The certificate came from /v3/certificates although a public key is configured, and is
    // kept for every instance.
    let cert_serial = app.sandbox.wechat_switch_cert_serial().await.unwrap();
    assert!(
        app.sandbox
            .calls()
            .iter()
            .any(|c| c.api == "/v3/certificates" && c.verified),
        "the certificates were fetched in public-key mode"
    );
    let stored = app
        .sql_i64(&format!(
            "SELECT count(*) AS v FROM wechat_platform_certs WHERE serial_no = '{cert_serial}'"
        ))
        .await;
    assert_eq!(stored, 1);
    // Every request named the key fitorder verifies with (answers follow it during a switch).
    let serials = app.sandbox.wechat_request_serials();
    assert!(!serials.is_empty());
    assert!(
        serials
            .iter()
            .all(|s| s.as_deref() == Some(providers::WECHAT_PUBLIC_KEY_ID)),
        "{serials:?}"
    );
    // With both kinds stored, the scheduled refresh keeps fetching certificates.
    assert!(app.state.keys.wechat.as_ref().unwrap().downloads_certificates());
}

#[tokio::test]
async fn forged_notifications_naming_unknown_serials_cost_bounded_database_work() {
    let app = TestApp::new().await;
    let keyring = app.state.keys.wechat.as_ref().unwrap().platform.clone();
    let before = keyring.unknown_serial_db_visits();
    let now = Utc::now().timestamp().to_string();
    for i in 0..40 {
        let serial = if i % 2 == 0 {
            format!("PUB_KEY_ID_{:032}", i)
        } else {
            format!("{:040X}", i * 7919)
        };
        let (status, _, _) = app
            .post(
                "/pay/wechat/notify",
                &[
                    ("content-type", "application/json"),
                    ("wechatpay-timestamp", now.as_str()),
                    ("wechatpay-nonce", "n0nce"),
                    ("wechatpay-serial", serial.as_str()),
                    ("wechatpay-signature", "Zm9yZ2Vk"),
                ],
                br#"{"id":"x","event_type":"TRANSACTION.SUCCESS","resource":{}}"#.to_vec(),
            )
            .await;
        assert_eq!(status.as_u16(), 401);
    }
    let visits = keyring.unknown_serial_db_visits() - before;
    assert!(
        visits <= 2,
        "40 forged notifications went to the database {visits} times"
    );
    let fetches = app
        .sandbox
        .calls()
        .iter()
        .filter(|c| c.api == "/v3/certificates")
        .count();
    assert!(fetches <= 1, "{fetches} certificate downloads");
}

/// Every checkout `pool` has served so far, read from deadpool's object metrics: each
/// connection was created by one checkout and recycled by each later one. Reading takes every
/// connection once; the second number is how many checkouts that took (count them out of the
/// next reading).
async fn pool_checkouts(pool: &fitorder::db::DbPool) -> (usize, usize) {
    let size = pool.status().size;
    let mut held = Vec::with_capacity(size);
    for _ in 0..size {
        held.push(pool.get().await.unwrap());
    }
    let served: usize = held
        .iter()
        .map(|c| fitorder::db::DbConn::metrics(c).recycle_count + 1)
        .sum();
    (served - size, size)
}

/// A flood of forged notifications naming made-up serials, while WeChat Pay is switching to a
/// platform certificate fitorder has not seen: the forgeries are refused from memory — one
/// refresh in all (one fetch of `/v3/certificates`), no pool checkout beyond that refresh's and
/// the sampled evidence rows — and the certificate WeChat really signs with is accepted.
#[tokio::test]
async fn forged_serials_cost_one_refresh_and_no_pool_checkouts_and_a_rotated_one_is_accepted() {
    let app = TestApp::served().await;
    app.sandbox.set_wechat_key_switch(true).await.unwrap();
    let s = app.studio(0, None, 3).await;
    let keyring = app.state.keys.wechat.as_ref().unwrap().platform.clone();
    let fetches = |app: &TestApp| {
        app.sandbox
            .calls()
            .iter()
            .filter(|c| c.api == "/v3/certificates")
            .count()
    };
    let (fetched, refreshes, seen) = (
        fetches(&app),
        keyring.unknown_serial_refreshes(),
        keyring.unknown_serial_db_visits(),
    );
    let evidence = "SELECT count(*) AS v FROM payment_callbacks";
    let evidence_before = app.sql_i64(evidence).await;
    let (before, reading) = pool_checkouts(&app.state.pool).await;
    let now = Utc::now().timestamp().to_string();
    for i in 0..60 {
        let serial = if i % 3 == 0 {
            format!("PUB_KEY_ID_{}", fitorder::providers::crypto::nonce(34))
        } else {
            fitorder::providers::crypto::nonce(40)
        };
        let (status, _, body) = app
            .post(
                "/pay/wechat/notify",
                &[
                    ("content-type", "application/json"),
                    ("wechatpay-timestamp", now.as_str()),
                    ("wechatpay-nonce", "n0nce"),
                    ("wechatpay-serial", serial.as_str()),
                    ("wechatpay-signature", "Zm9yZ2Vk"),
                ],
                br#"{"id":"x","event_type":"TRANSACTION.SUCCESS","resource":{}}"#.to_vec(),
            )
            .await;
        assert_eq!(status.as_u16(), 401, "{serial}: {body:?}");
    }
    // The one refresh may still be storing what it fetched: let it end before counting.
    if let Some(refresh) = keyring.unknown_serial_refresh() {
        tokio::time::timeout(Duration::from_secs(30), refresh).await.unwrap();
    }
    let (after, _) = pool_checkouts(&app.state.pool).await;
    let sampled = (app.sql_i64(evidence).await - evidence_before) as usize;
    assert!(keyring.unknown_serials_seen() >= 60);
    assert_eq!(
        keyring.unknown_serial_refreshes() - refreshes,
        1,
        "one refresh for 60 forgeries"
    );
    assert!(
        fetches(&app) - fetched <= 1,
        "{} certificate downloads",
        fetches(&app) - fetched
    );
    let refresh_visits = (keyring.unknown_serial_db_visits() - seen) as usize;
    assert!(
        refresh_visits <= 2,
        "the refresh went to the database {refresh_visits} times"
    );
    let checkouts = after - before - reading;
    assert!(
        checkouts <= refresh_visits + sampled,
        "60 forged notifications took {checkouts} pool checkouts: the refresh's {refresh_visits} and \
         {sampled} sampled evidence rows allowed"
    );

    // The platform certificate WeChat switched to (fetched by that refresh: WeChat lists a new
    // certificate before it signs with it) verifies the notifications it signs at once.
    let cert_serial = app.sandbox.wechat_switch_cert_serial().await.unwrap();
    assert!(keyring.key_for(&cert_serial).is_some(), "{cert_serial} was fetched");
    let fetched = fetches(&app);
    for _ in 0..4 {
        let r = place(&app, &s, "WECHAT_NATIVE").await;
        assert!(r.get("errors").is_none(), "{r:#}");
        let no = order_no(&r);
        // Notifications alternate between the 微信支付公钥 and the new certificate.
        app.sandbox.pay("WECHAT_PAY", &no).await.unwrap();
        assert_eq!(app.order(&no).await["status"], "PAID");
    }
    assert_eq!(fetches(&app), fetched, "nothing more to fetch");
}

#[tokio::test]
async fn app_trades_are_made_under_the_mobile_app_id_the_others_under_the_mini_programs() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 3).await;
    let r = place(&app, &s, "WECHAT_APP").await;
    assert!(r.get("errors").is_none(), "{r:#}");
    let pay = &r["data"]["placeOrder"]["payment"]["wechatApp"];
    assert_eq!(pay["appId"], providers::WECHAT_MOBILE_APP_ID, "{pay:#}");
    for channel in ["WECHAT_JSAPI", "WECHAT_NATIVE"] {
        let r = place(&app, &s, channel).await;
        assert!(r.get("errors").is_none(), "{channel}: {r:#}");
    }
    let jsapi = &place(&app, &s, "WECHAT_JSAPI").await["data"]["placeOrder"]["payment"]["wechatJsapi"];
    assert_eq!(jsapi["appId"], providers::WECHAT_APP_ID);
    // Unset, the mobile app id is WECHATPAY_APP_ID.
    let mut c = fitorder::config::Config::for_tests("postgres://x".into());
    providers::configure(&mut c);
    c.wechatpay.mobile_app_id = None;
    let keys = fitorder::providers::keys::ProviderKeys::load(&c).unwrap();
    assert_eq!(keys.wechat.unwrap().mobile_app_id, providers::WECHAT_APP_ID);
}

#[tokio::test]
async fn h5_takes_the_payers_address_only_from_a_trusted_proxy() {
    // Through the test load balancer (trusted): the address it reports goes to WeChat.
    let app = TestApp::new().await;
    let s = app.studio(0, None, 3).await;
    let r = place(&app, &s, "WECHAT_H5").await;
    assert!(r.get("errors").is_none(), "{r:#}");
    let trade = app.sandbox.trade("WECHAT_PAY", &order_no(&r)).unwrap();
    assert_eq!(trade.payer_client_ip.as_deref(), Some(TEST_CLIENT_IP));

    // No trusted proxy: whatever X-Forwarded-For says, H5 is refused and nothing is placed.
    let app = TestApp::with_config(|c| c.trusted_proxies = vec![]).await;
    let s = app.studio(0, None, 3).await;
    let r = place(&app, &s, "WECHAT_H5").await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT", "{r:#}");
    let message = r["errors"][0]["message"].as_str().unwrap();
    assert!(message.contains("FITORDER_TRUSTED_PROXIES"), "{message}");
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM orders").await, 0);
    assert!(app.sandbox.calls().iter().all(|c| !c.api.ends_with("/h5")));

    // The real server loop: the peer address of the TCP connection decides.
    for (trusted, expect_ok) in [(vec![], false), (vec!["127.0.0.1/32".parse().unwrap()], true)] {
        let app = TestApp::with_config(|c| c.trusted_proxies = trusted).await;
        let s = app.studio(0, None, 3).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = app.router.clone();
        tokio::spawn(fitorder::http::serve(
            listener,
            router,
            Duration::from_secs(10),
            std::future::pending(),
        ));
        let input = json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack},
                           "paymentMethod": "WECHAT_PAY", "channel": "WECHAT_H5"});
        let r: Value = reqwest::Client::new()
            .post(format!("http://{addr}/graphql"))
            .bearer_auth(app.member_token(&s.member))
            .header("x-forwarded-for", "203.0.113.9")
            .json(&json!({
                "query": "mutation($input: PlaceOrderInput!) { placeOrder(input: $input) { order { orderNo } payment { payUrl } } }",
                "variables": {"input": input},
            }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if expect_ok {
            assert!(r.get("errors").is_none(), "{r:#}");
            let trade = app.sandbox.trade("WECHAT_PAY", &order_no(&r)).unwrap();
            assert_eq!(trade.payer_client_ip.as_deref(), Some("203.0.113.9"));
        } else {
            assert_eq!(error_code(&r), "BAD_USER_INPUT", "{r:#}");
        }
    }
}

#[tokio::test]
async fn a_provider_call_is_limited_by_the_whole_call_timeout() {
    let app = TestApp::with_config(|c| {
        c.provider_timeout = Duration::from_millis(800);
        c.provider_connect_timeout = Duration::from_secs(3);
        // Not the provider calls' limit any more.
        c.downstream_timeout = Duration::from_secs(10);
    })
    .await;
    let s = app.studio(0, None, 3).await;
    app.sandbox.set_delay(Duration::from_millis(1_600));
    let started = Instant::now();
    let r = place(&app, &s, "WECHAT_NATIVE").await;
    let took = started.elapsed();
    assert_eq!(r["errors"][0]["extensions"]["reason"], "PROVIDER_UNAVAILABLE", "{r:#}");
    assert!(took < Duration::from_millis(1_500), "the call waited {took:?}");
    assert_eq!(r["data"]["placeOrder"]["order"]["status"], "WAIT_PAY", "{r:#}");
    // A slow answer within the limit is taken.
    app.sandbox.set_delay(Duration::from_millis(300));
    let r = place(&app, &s, "WECHAT_NATIVE").await;
    assert!(r.get("errors").is_none(), "{r:#}");
}

#[tokio::test]
async fn unsigned_error_answers_change_nothing_and_are_reported_with_the_providers_code() {
    let dir = statement_dir();
    let d = dir.clone();
    let app = TestApp::with_config(move |c| c.statement_dir = d).await;
    let s = app.studio(0, None, 3).await;
    app.sandbox.answer_errors_unsigned(true);
    for (channel, code) in [("WECHAT_NATIVE", "SIGN_ERROR"), ("ALIPAY_QR", "isv.invalid-signature")] {
        let r = place(&app, &s, channel).await;
        let e = &r["errors"][0];
        assert_eq!(e["extensions"]["reason"], "PROVIDER_UNAVAILABLE", "{r:#}");
        let message = e["message"].as_str().unwrap();
        assert!(message.contains(code), "{channel}: {message}");
        assert!(!message.contains("forged"), "{message}");
        let placed = &r["data"]["placeOrder"];
        assert_eq!(placed["order"]["status"], "WAIT_PAY");
        assert!(placed["payment"].is_null());
    }
    // The reconciliation run says it too.
    let run = fitorder::reconciliation::run(&app.state, Provider::WechatPay, today(), None, &TraceId::new())
        .await
        .map_err(|e| e.message())
        .unwrap();
    assert_eq!(run.status, ReconciliationStatus::Failed);
    let why = run.error.unwrap_or_default();
    assert!(why.contains("SIGN_ERROR") && !why.contains("forged"), "{why}");
}

#[tokio::test]
async fn a_quiet_day_is_reconciled_empty_and_a_bill_being_made_waits() {
    let dir = statement_dir();
    let d = dir.clone();
    let app = TestApp::served_with(move |c| {
        c.statement_dir = d;
        c.timezone = chrono_tz::Asia::Shanghai;
    })
    .await;
    let state = app.state.clone();
    let run = |p| {
        let state = state.clone();
        async move {
            fitorder::reconciliation::run(&state, p, today(), None, &TraceId::new())
                .await
                .map_err(|e| e.message())
                .unwrap()
        }
    };
    // Nothing happened that day, at the provider or here.
    for (p, said) in [
        (Provider::WechatPay, "NO_STATEMENT_EXIST"),
        (Provider::Alipay, "isp.bill_not_exist"),
    ] {
        let r = run(p).await;
        assert_eq!(r.status, ReconciliationStatus::Succeeded, "{p}: {r:?}");
        assert_eq!((r.provider_rows, r.local_rows, r.tickets_opened), (0, 0, 0));
        assert!(r.error.as_deref().unwrap_or_default().contains(said), "{r:?}");
    }
    // A bill still being made is not a quiet day.
    app.sandbox.set_bill_controls(BillControls {
        not_ready: true,
        ..Default::default()
    });
    let r = run(Provider::WechatPay).await;
    assert_eq!(r.status, ReconciliationStatus::Waiting, "{r:?}");
    assert!(r.error.unwrap_or_default().contains("STATEMENT_CREATING"));
    app.sandbox.set_bill_controls(BillControls::default());
    // We have a payment that day, the provider's bill of the day has none: it is asked of the
    // provider, which confirms it, so there is no finding.
    let s = app.studio(0, None, 3).await;
    let no = order_no(&place(&app, &s, "WECHAT_NATIVE").await);
    app.sandbox.book_on_next_day("WECHAT_PAY", &no);
    app.sandbox.pay("WECHAT_PAY", &no).await.unwrap();
    let queries_before = app
        .sandbox
        .calls()
        .iter()
        .filter(|c| c.path.contains(&no) && c.method == "GET")
        .count();
    let r = run(Provider::WechatPay).await;
    assert_eq!(r.status, ReconciliationStatus::Succeeded, "{r:?}");
    assert_eq!((r.provider_rows, r.local_rows, r.tickets_opened), (0, 1, 0), "{r:?}");
    assert!(r.error.unwrap_or_default().contains("NO_STATEMENT_EXIST"));
    let queries = app
        .sandbox
        .calls()
        .iter()
        .filter(|c| c.path.contains(&no) && c.method == "GET")
        .count();
    assert_eq!(queries, queries_before + 1, "the payment was asked of the provider");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn wechat_requests_name_the_platform_key_they_verify_with_at_the_standin() {
    for mode in [StandInMode::PublicKey, StandInMode::Certificate] {
        let Some(standin) = StandIn::start_or_skip(mode) else {
            return;
        };
        let app = TestApp::with_config(|c| crate::client_vs_standin::point_at(c, &standin)).await;
        let s = app.studio(0, None, 3).await;
        // Certificate mode knows no certificate before the first answer names one.
        for _ in 0..2 {
            let r = place(&app, &s, "WECHAT_NATIVE").await;
            assert!(r.get("errors").is_none(), "{mode:?}: {r:#}");
        }
        let requests = standin.requests().await;
        let prepay = requests
            .iter()
            .rev()
            .find(|r| {
                r["path"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("/v3/pay/transactions/native")
            })
            .expect("a prepay");
        let named = prepay["headers"]
            .as_object()
            .unwrap()
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("wechatpay-serial"))
            .and_then(|(_, v)| v.as_str())
            .map(str::to_string);
        assert_eq!(named, Some(standin.wechat_serial()), "{mode:?}");
    }
}

#[tokio::test]
async fn a_renewed_alipay_certificate_is_downloaded_checked_against_the_root_and_shared() {
    let Some(standin) = StandIn::start_or_skip(StandInMode::Certificate) else {
        return;
    };
    let app = TestApp::served_with(|c| crate::client_vs_standin::point_at(c, &standin)).await;
    let s = app.studio(0, None, 3).await;
    let first = place(&app, &s, "ALIPAY_QR").await;
    assert!(first.get("errors").is_none(), "{first:#}");
    let downloads = |requests: &[Value]| {
        requests
            .iter()
            .filter(|r| r["params"]["method"] == "alipay.open.app.alipaycert.download")
            .count()
    };

    // Alipay renews its certificate: answers come under the new SN, signed by the new key.
    let renewed = standin.renew_alipay_cert(true).await;
    let new_sn = renewed["new_sn"].as_str().unwrap().to_string();
    let r = place(&app, &s, "ALIPAY_QR").await;
    assert!(r.get("errors").is_none(), "{r:#}");
    assert_eq!(downloads(&standin.requests().await), 1);
    let stored = app
        .sql_i64(&format!(
            "SELECT count(*) AS v FROM alipay_public_certs WHERE alipay_cert_sn = '{new_sn}'"
        ))
        .await;
    assert_eq!(stored, 1, "kept for every instance");
    // Its notifications are signed by the new key too: believed.
    let no = order_no(&r);
    standin.set_trade(Trade::alipay(&no, "TRADE_SUCCESS")).await;
    let (status, body) = standin.notify(&no).await;
    assert_eq!((status, body.as_str()), (200, "success"));
    assert_eq!(app.order(&no).await["status"], "PAID");

    // Another instance takes it from the database, without downloading it again.
    let other = TestApp::on_database(&app.db_url, |c| crate::client_vs_standin::point_at(c, &standin)).await;
    let r = place(&other, &s, "ALIPAY_QR").await;
    assert!(r.get("errors").is_none(), "{r:#}");
    assert_eq!(downloads(&standin.requests().await), 1);

    // A "renewal" that does not chain to ALIPAY_ROOT_CERT is refused and not kept.
    let forged = standin.renew_alipay_cert(false).await;
    let forged_sn = forged["new_sn"].as_str().unwrap().to_string();
    let third = TestApp::on_database(&app.db_url, |c| crate::client_vs_standin::point_at(c, &standin)).await;
    let r = place(&third, &s, "ALIPAY_QR").await;
    assert_eq!(r["errors"][0]["extensions"]["reason"], "PROVIDER_UNAVAILABLE", "{r:#}");
    assert!(r["data"]["placeOrder"]["payment"].is_null());
    assert_eq!(downloads(&standin.requests().await), 2, "it was asked for");
    let kept = app
        .sql_i64(&format!(
            "SELECT count(*) AS v FROM alipay_public_certs WHERE alipay_cert_sn = '{forged_sn}'"
        ))
        .await;
    assert_eq!(kept, 0);
}
