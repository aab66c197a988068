//! A production deployment as docs/operations.md ("Running it in production") describes it: a `fitorder serve`
//! outside development mode, with its secret, both providers' keys, a password in its database
//! URL and a signed alert channel. It refuses to start without a secret, and its logs never show
//! a secret, a key or a password, even while it takes a payment.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;
use crate::providers;

#[tokio::test]
async fn without_a_jwt_secret_outside_development_mode_serve_refuses_to_start() {
    let app = TestApp::new().await;
    let out = Fitorder::serve()
        // Its own directory: no `.fitorder/jwt-secret` of a developer to fall back on.
        .in_own_dir()
        .env("DATABASE_URL", &app.db_url)
        .env_remove("FITORDER_JWT_SECRET")
        .env_remove("RUST_LOG")
        .output(Duration::from_secs(60))
        .await
        .expect("it started and kept running");
    let (stdout, stderr) = (&out.stdout, &out.stderr);
    assert!(!out.status.success(), "it started: {stdout}\n{stderr}");
    assert!(stderr.contains("FITORDER_JWT_SECRET is not set"), "{stderr}");
    // Nothing demo-only happened: no tokens printed, no demo data, no secret file made up.
    assert!(
        !stdout.contains("eyJ") && !stderr.contains("eyJ"),
        "a token was printed: {stdout}"
    );
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM stores").await,
        0,
        "demo data was seeded"
    );
    assert!(!out.dir().join(".fitorder/jwt-secret").exists());
}

#[tokio::test]
async fn serve_logs_no_secret_key_or_password_while_it_takes_a_payment() {
    let app = TestApp::with_config(providers::configure).await;
    let s = app.studio(100_000, None, 3).await;
    const JWT_SECRET: &str = "prodJWTsecret-4f9a0c7e1b2d-8c3e5a7f9b1d";
    const DB_PASSWORD: &str = "dbPASSWORDxyz";
    const ALERT_SECRET: &str = "SECalertSIGNING";
    // The test cluster trusts loopback: the password is accepted and must never be shown.
    let db_url = app.db_url.replacen("postgres@", &format!("postgres:{DB_PASSWORD}@"), 1);
    assert!(db_url.contains(DB_PASSWORD), "{db_url}");
    let server = Fitorder::serve().in_own_dir();
    let port = server.port();
    let server = server
        .env("DATABASE_URL", &db_url)
        .env("FITORDER_PUBLIC_URL", format!("http://127.0.0.1:{port}"))
        .env("FITORDER_JWT_SECRET", JWT_SECRET)
        .env(
            "FITORDER_ALERT_WEBHOOKS",
            format!("dingtalk:http://127.0.0.1:9/robot/send?access_token=ROBOTtoken42#{ALERT_SECRET}"),
        )
        .envs(providers::env_of(&app.state.config))
        .env("RUST_LOG", "debug")
        .env("FITORDER_LOG_FORMAT", "json")
        .spawn();
    let http = reqwest::Client::new();
    let base = server.base();
    let ready = server.ready(&http, Duration::from_secs(20)).await;
    assert!(ready, "{}", server.log());
    let token = fitorder::auth::issue_token(
        JWT_SECRET,
        fitorder::auth::Role::Member,
        &s.member,
        None,
        Duration::from_secs(600),
    );
    let r: Value = http
        .post(format!("{base}/graphql"))
        .bearer_auth(&token)
        .json(&json!({"query": "mutation($i: PlaceOrderInput!) { placeOrder(input: $i) { order { orderNo status amountCents } } }",
                      "variables": {"i": {"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WECHAT_PAY"}}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let order = &r["data"]["placeOrder"]["order"];
    let no = order["orderNo"].as_str().unwrap_or_else(|| panic!("{r}")).to_string();
    let fen = order["amountCents"].as_i64().unwrap();
    // WeChat Pay says it was paid: signed and encrypted by the test provider, posted to the process.
    let w = providers::wechat();
    let n = w.notification(
        "TRANSACTION.SUCCESS",
        &w.transaction(&no, "4200000000000000000000000777", fen),
        chrono::Utc::now().timestamp(),
    );
    let mut req = http
        .post(format!("{base}/pay/wechat/notify"))
        .header("content-type", "application/json")
        .body(n.body.clone());
    for (k, v) in &n.headers {
        req = req.header(*k, v.as_str());
    }
    let status = req.send().await.unwrap().status();
    assert!(status.is_success(), "{status}");
    let paid = app
        .sql_i64(&format!(
            "SELECT count(*) AS v FROM orders WHERE order_no = '{no}' AND status = 'PAID'"
        ))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = server.stop();
    assert_eq!(paid, 1, "the payment was not taken: {text}");
    // The configuration was logged (so the test sees what a leak would look like) …
    assert!(text.contains("\"configuration\""), "{text}");
    assert!(text.contains("<redacted>"), "{text}");
    // … and nothing secret is in any line.
    let merchant_pem =
        std::fs::read_to_string(app.state.config.wechatpay.merchant_private_key.as_ref().unwrap()).unwrap();
    let key_line = merchant_pem.lines().nth(1).unwrap();
    for (what, secret) in [
        ("the JWT secret", JWT_SECRET),
        ("the APIv3 key", providers::APIV3_KEY),
        ("the database password", DB_PASSWORD),
        ("the alert signing secret", ALERT_SECRET),
        ("the alert robot's token", "ROBOTtoken42"),
        ("private-key text", "PRIVATE KEY"),
        ("private-key text", key_line),
    ] {
        assert!(!text.contains(secret), "{what} ({secret}) is in the log");
    }
}
