//! The development sandbox as a provider on loopback (`payments::sandbox_server`), driven over
//! HTTP the way fitorder's client drives WeChat Pay and Alipay.
//!
//! The client side here is written from the providers' documentation with the `rsa` crate
//! alone: nothing from `fitorder::payments` signs a request or checks an answer, so the
//! sandbox is checked against an independent implementation. Notifications go to the real
//! `/pay/wechat/notify` and `/pay/alipay/notify` of a TestApp served on a port, and the order
//! is read back through GraphQL.

use std::sync::OnceLock;
use std::time::Duration;

use base64::Engine;
use chrono::Utc;
use fitorder::dev::sandbox_server::{RefundFlow, SandboxProvider};
use rsa::pkcs1v15::{Signature, SigningKey, VerifyingKey};
use rsa::signature::{SignatureEncoding, Signer, Verifier};
use rsa::{RsaPrivateKey, RsaPublicKey};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::harness::*;
use crate::providers;

const B64: base64::engine::general_purpose::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn sign(key: &RsaPrivateKey, message: &[u8]) -> String {
    B64.encode(SigningKey::<Sha256>::new(key.clone()).sign(message).to_bytes())
}

fn verifies(key: &RsaPublicKey, message: &[u8], signature: &str) -> bool {
    let Ok(raw) = B64.decode(signature) else { return false };
    let Ok(sig) = Signature::try_from(raw.as_slice()) else {
        return false;
    };
    VerifyingKey::<Sha256>::new(key.clone()).verify(message, &sig).is_ok()
}

/// A key neither side knows.
fn stranger() -> &'static RsaPrivateKey {
    static KEY: OnceLock<RsaPrivateKey> = OnceLock::new();
    KEY.get_or_init(|| RsaPrivateKey::new(&mut rand_core::OsRng, 2048).unwrap())
}

fn nonce() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..32)
        .map(|_| char::from(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"[rng.random_range(0..36)]))
        .collect()
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn sandbox() -> SandboxProvider {
    SandboxProvider::start(providers::sandbox_keys(), "127.0.0.1:0")
        .await
        .unwrap()
}

/// A TestApp that believes the sandbox's notifications, served on a real port; its base URL.
async fn app_on_port() -> (TestApp, String) {
    let app = TestApp::with_config(providers::configure).await;
    let addr = crate::fakes::serve(app.router.clone()).await;
    (app, format!("http://{addr}"))
}

struct WechatAnswer {
    status: u16,
    body: String,
    verified: bool,
    serial: String,
}

impl WechatAnswer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// One WeChat Pay v3 call: `Authorization` signed by `key` over
/// `METHOD\npath?query\ntimestamp\nnonce\nbody\n`; the answer's signature checked with the
/// platform public key over `timestamp\nnonce\nbody\n`.
async fn wechat_call(
    sb: &SandboxProvider,
    method: &str,
    path: &str,
    body: Option<&Value>,
    key: &RsaPrivateKey,
) -> WechatAnswer {
    let body_text = body.map(|b| b.to_string()).unwrap_or_default();
    let ts = Utc::now().timestamp();
    let nonce = nonce();
    let signature = sign(
        key,
        format!("{method}\n{path}\n{ts}\n{nonce}\n{body_text}\n").as_bytes(),
    );
    let auth = format!(
        "WECHATPAY2-SHA256-RSA2048 mchid=\"{}\",nonce_str=\"{nonce}\",signature=\"{signature}\",timestamp=\"{ts}\",serial_no=\"{}\"",
        providers::MCH_ID,
        providers::MERCHANT_SERIAL
    );
    let url = format!("{}{path}", sb.wechat_api_base());
    let mut req = http()
        .request(method.parse().unwrap(), url)
        .header("authorization", auth)
        .header("accept", "application/json");
    if body.is_some() {
        req = req.header("content-type", "application/json").body(body_text);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let h = |n: &str| {
        resp.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let (t, n, s, serial) = (
        h("wechatpay-timestamp"),
        h("wechatpay-nonce"),
        h("wechatpay-signature"),
        h("wechatpay-serial"),
    );
    let body = resp.text().await.unwrap();
    let verified = verifies(
        &providers::wechat_platform_public(),
        format!("{t}\n{n}\n{body}\n").as_bytes(),
        &s,
    );
    WechatAnswer {
        status,
        body,
        verified,
        serial,
    }
}

fn expire_in(seconds: i64) -> String {
    (Utc::now() + chrono::Duration::seconds(seconds))
        .with_timezone(&chrono_tz::Asia::Shanghai)
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, false)
}

fn prepay_body(no: &str, fen: i64, notify_url: &str, channel: &str) -> Value {
    // APP trades are made under the mobile app's appid, the others under the mini program's.
    let appid = if channel == "app" {
        providers::WECHAT_MOBILE_APP_ID
    } else {
        providers::WECHAT_APP_ID
    };
    let mut body = json!({
        "appid": appid, "mchid": providers::MCH_ID,
        "description": "Ten sessions", "out_trade_no": no, "time_expire": expire_in(900),
        "notify_url": notify_url, "amount": {"total": fen, "currency": "CNY"},
    });
    if channel == "jsapi" {
        body["payer"] = json!({"openid": "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"});
    }
    if channel == "h5" {
        body["scene_info"] = json!({"payer_client_ip": "127.0.0.1", "h5_info": {"type": "Wap"}});
    }
    body
}

fn shanghai_now() -> String {
    Utc::now()
        .with_timezone(&chrono_tz::Asia::Shanghai)
        .format("%Y-%m-%d %H:%M:%S")
        .to_string()
}

fn shanghai_in(seconds: i64) -> String {
    (Utc::now() + chrono::Duration::seconds(seconds))
        .with_timezone(&chrono_tz::Asia::Shanghai)
        .format("%Y-%m-%d %H:%M:%S")
        .to_string()
}

/// Alipay's request parameters for `method`, signed by `key` over every non-empty parameter
/// but `sign`, sorted, `k=v` joined with `&`.
fn alipay_params(method: &str, biz: &Value, notify_url: Option<&str>, key: &RsaPrivateKey) -> Vec<(String, String)> {
    let mut params: Vec<(String, String)> = vec![
        ("app_id".into(), providers::APP_ID.into()),
        ("method".into(), method.into()),
        ("format".into(), "JSON".into()),
        ("charset".into(), "utf-8".into()),
        ("sign_type".into(), "RSA2".into()),
        ("timestamp".into(), shanghai_now()),
        ("version".into(), "1.0".into()),
        ("biz_content".into(), biz.to_string()),
    ];
    if let Some(url) = notify_url {
        params.push(("notify_url".into(), url.into()));
    }
    let mut sorted: Vec<&(String, String)> = params.iter().collect();
    sorted.sort();
    let content = sorted
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let signature = sign(key, content.as_bytes());
    params.push(("sign".into(), signature));
    params
}

fn form(params: &[(String, String)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params)
        .finish()
}

/// The `<method>_response` object of an Alipay answer and whether its `sign` verifies over
/// the object's exact text.
fn alipay_answer(method: &str, body: &str) -> (Value, bool) {
    let fields: std::collections::HashMap<String, Box<serde_json::value::RawValue>> =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not the gateway's JSON ({e}): {body}"));
    let name = format!("{}_response", method.replace('.', "_"));
    let raw = fields
        .get(&name)
        .unwrap_or_else(|| panic!("no {name} in {body}"))
        .get()
        .to_string();
    let verified = fields
        .get("sign")
        .and_then(|s| serde_json::from_str::<String>(s.get()).ok())
        .is_some_and(|s| verifies(&providers::alipay_public(), raw.as_bytes(), &s));
    (serde_json::from_str(&raw).unwrap(), verified)
}

async fn alipay_call(
    sb: &SandboxProvider,
    method: &str,
    biz: Value,
    notify_url: Option<&str>,
    key: &RsaPrivateKey,
) -> (Value, bool) {
    let params = alipay_params(method, &biz, notify_url, key);
    let body = http()
        .post(sb.alipay_gateway())
        .header("content-type", "application/x-www-form-urlencoded;charset=utf-8")
        .body(form(&params))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    alipay_answer(method, &body)
}

async fn pack_order(app: &TestApp, method: &str) -> (String, i64) {
    let s = app.studio(0, None, 1).await;
    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), method)
        .await;
    let order = app.order(&no).await;
    (no, order["amountCents"].as_i64().unwrap())
}

#[tokio::test]
async fn wechat_prepay_for_every_channel_is_signed_and_checked() {
    let sb = sandbox().await;
    let me = providers::merchant_private();
    for channel in ["jsapi", "native", "app", "h5"] {
        let no = format!("FOT{channel}{}", std::process::id());
        let path = format!("/v3/pay/transactions/{channel}");
        let body = prepay_body(&no, 1234, "http://127.0.0.1:9/pay/wechat/notify", channel);

        let a = wechat_call(&sb, "POST", &path, Some(&body), &me).await;
        assert_eq!(a.status, 200, "{channel}: {}", a.body);
        assert!(
            a.verified,
            "{channel}: the answer's signature must verify with the platform key"
        );
        assert_eq!(a.serial, providers::WECHAT_PUBLIC_KEY_ID);
        let v = a.json();
        match channel {
            "native" => assert_eq!(v["code_url"], json!(sb.cashier_url("WECHAT_PAY", &no))),
            "h5" => assert!(v["h5_url"]
                .as_str()
                .unwrap()
                .starts_with(&sb.cashier_url("WECHAT_PAY", &no))),
            _ => assert!(v["prepay_id"].as_str().unwrap().starts_with("wx"), "{v}"),
        }
        // The same request again: the same trade.
        let again = wechat_call(&sb, "POST", &path, Some(&body), &me).await;
        assert_eq!(again.json(), v, "{channel}: a repeated prepay answers the same trade");
        let t = sb.trade("WECHAT_PAY", &no).unwrap();
        assert_eq!(t.channel, format!("WECHAT_{}", channel.to_uppercase()));
        assert_eq!(t.amount_cents, 1234);
        assert_eq!(t.state, "NOTPAY");
        assert_eq!(t.notify_url, "http://127.0.0.1:9/pay/wechat/notify");
        assert_eq!(t.time_expire_text, body["time_expire"].as_str().unwrap());

        // Signed by someone else: 401 SIGN_ERROR, itself signed.
        let forged = wechat_call(&sb, "POST", &path, Some(&body), stranger()).await;
        assert_eq!(forged.status, 401, "{channel}");
        assert_eq!(forged.json()["code"], "SIGN_ERROR");
        assert!(forged.verified);
    }

    // The body is signed: the same Authorization over another body is refused.
    let body = prepay_body("FOTAMPER000001", 100, "http://127.0.0.1:9/n", "native");
    let ts = Utc::now().timestamp();
    let n = nonce();
    let sig = sign(
        &me,
        format!("POST\n/v3/pay/transactions/native\n{ts}\n{n}\n{body}\n").as_bytes(),
    );
    let auth = format!(
        "WECHATPAY2-SHA256-RSA2048 mchid=\"{}\",nonce_str=\"{n}\",signature=\"{sig}\",timestamp=\"{ts}\",serial_no=\"{}\"",
        providers::MCH_ID,
        providers::MERCHANT_SERIAL
    );
    let mut tampered = body.clone();
    tampered["amount"]["total"] = json!(1);
    let status = http()
        .post(format!("{}/v3/pay/transactions/native", sb.wechat_api_base()))
        .header("authorization", auth)
        .header("content-type", "application/json")
        .body(tampered.to_string())
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 401);
    assert!(sb.trade("WECHAT_PAY", "FOTAMPER000001").is_none());

    // Refused as WeChat refuses.
    let mut no_expiry = prepay_body("FOTNOEXPIRE01", 100, "http://127.0.0.1:9/n", "native");
    no_expiry.as_object_mut().unwrap().remove("time_expire");
    let a = wechat_call(&sb, "POST", "/v3/pay/transactions/native", Some(&no_expiry), &me).await;
    assert_eq!((a.status, a.json()["code"].clone()), (400, json!("PARAM_ERROR")));
    assert_eq!(a.json()["detail"]["field"], "/time_expire");
    let mut no_openid = prepay_body("FOTNOOPENID01", 100, "http://127.0.0.1:9/n", "jsapi");
    no_openid.as_object_mut().unwrap().remove("payer");
    let a = wechat_call(&sb, "POST", "/v3/pay/transactions/jsapi", Some(&no_openid), &me).await;
    assert_eq!(
        (a.status, a.json()["detail"]["field"].clone()),
        (400, json!("/payer/openid"))
    );
    let mut other_app = prepay_body("FOTOTHERAPP01", 100, "http://127.0.0.1:9/n", "native");
    other_app["appid"] = json!("wx0000000000000000");
    let a = wechat_call(&sb, "POST", "/v3/pay/transactions/native", Some(&other_app), &me).await;
    assert_eq!(
        (a.status, a.json()["code"].clone()),
        (400, json!("APPID_MCHID_NOT_MATCH"))
    );
    let no = format!("FOTnative{}", std::process::id());
    let changed = prepay_body(&no, 999, "http://127.0.0.1:9/pay/wechat/notify", "native");
    let a = wechat_call(&sb, "POST", "/v3/pay/transactions/native", Some(&changed), &me).await;
    assert_eq!((a.status, a.json()["code"].clone()), (400, json!("INVALID_REQUEST")));

    let calls = sb.calls();
    assert_eq!(calls.iter().filter(|c| !c.verified).count(), 5, "{calls:#?}");
    assert!(calls
        .iter()
        .all(|c| c.verified || c.code.as_deref() == Some("SIGN_ERROR")));
}

#[tokio::test]
async fn wrong_key_mode_and_failures_are_visible_to_the_client() {
    let sb = sandbox().await;
    let me = providers::merchant_private();
    let body = prepay_body("FOWRONGKEY0001", 100, "http://127.0.0.1:9/n", "native");
    sb.sign_answers_with_wrong_key(true);
    let a = wechat_call(&sb, "POST", "/v3/pay/transactions/native", Some(&body), &me).await;
    assert_eq!(a.status, 200);
    assert!(
        !a.verified,
        "wrong-key mode: the answer must not verify with the platform key"
    );
    let biz = json!({"out_trade_no": "FOWRONGKEY0001", "total_amount": "1.00", "subject": "x", "time_expire": shanghai_in(900)});
    let (v, ok) = alipay_call(
        &sb,
        "alipay.trade.precreate",
        biz.clone(),
        Some("http://127.0.0.1:9/n"),
        &me,
    )
    .await;
    assert_eq!(v["code"], "10000");
    assert!(!ok, "wrong-key mode: the Alipay answer must not verify");
    sb.sign_answers_with_wrong_key(false);
    let a = wechat_call(&sb, "POST", "/v3/pay/transactions/native", Some(&body), &me).await;
    assert!(a.verified);
    let (_, ok) = alipay_call(&sb, "alipay.trade.precreate", biz, Some("http://127.0.0.1:9/n"), &me).await;
    assert!(ok);

    sb.fail_with(Some(503));
    let a = wechat_call(
        &sb,
        "GET",
        "/v3/pay/transactions/out-trade-no/FOWRONGKEY0001?mchid=1900000109",
        None,
        &me,
    )
    .await;
    assert_eq!((a.status, a.json()["code"].clone()), (503, json!("SYSTEM_ERROR")));
    assert!(a.verified);
    let (v, ok) = alipay_call(
        &sb,
        "alipay.trade.query",
        json!({"out_trade_no": "FOWRONGKEY0001"}),
        None,
        &me,
    )
    .await;
    assert_eq!((v["code"].clone(), ok), (json!("20000"), true));
    sb.fail_with(None);

    sb.set_delay(Duration::from_millis(300));
    let started = std::time::Instant::now();
    let a = wechat_call(
        &sb,
        "GET",
        "/v3/pay/transactions/out-trade-no/FOWRONGKEY0001?mchid=1900000109",
        None,
        &me,
    )
    .await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(a.json()["trade_state"], "NOTPAY");
}

#[tokio::test]
async fn wechat_query_close_pay_and_refund_against_fitorder() {
    let (app, base) = app_on_port().await;
    let sb = sandbox().await;
    let me = providers::merchant_private();
    let notify = format!("{base}/pay/wechat/notify");
    let (no, fen) = pack_order(&app, "WECHAT_PAY").await;
    let a = wechat_call(
        &sb,
        "POST",
        "/v3/pay/transactions/native",
        Some(&prepay_body(&no, fen, &notify, "native")),
        &me,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);

    let query = format!("/v3/pay/transactions/out-trade-no/{no}?mchid={}", providers::MCH_ID);
    let q = wechat_call(&sb, "GET", &query, None, &me).await;
    assert!(q.verified);
    assert_eq!(q.json()["trade_state"], "NOTPAY");
    assert_eq!(q.json()["amount"]["total"], fen);
    assert!(q.json().get("transaction_id").is_none());
    sb.set_state("WECHAT_PAY", &no, "USERPAYING");
    assert_eq!(
        wechat_call(&sb, "GET", &query, None, &me).await.json()["trade_state"],
        "USERPAYING"
    );
    let missing = wechat_call(
        &sb,
        "GET",
        "/v3/pay/transactions/out-trade-no/NOSUCHTRADE1?mchid=1900000109",
        None,
        &me,
    )
    .await;
    assert_eq!(
        (missing.status, missing.json()["code"].clone()),
        (404, json!("ORDER_NOT_EXIST"))
    );
    assert!(missing.verified);

    // Pay, as the cashier's button does: fitorder's real callback marks the order paid.
    sb.pay("WECHAT_PAY", &no).await.unwrap();
    let order = app.order(&no).await;
    assert_eq!(order["status"], "PAID", "{order:#}");
    let q = wechat_call(&sb, "GET", &query, None, &me).await.json();
    assert_eq!(q["trade_state"], "SUCCESS");
    assert_eq!(q["transaction_id"], order["providerTxnId"]);
    assert_eq!(q["trade_type"], "NATIVE");
    let by_id = format!(
        "/v3/pay/transactions/id/{}?mchid={}",
        q["transaction_id"].as_str().unwrap(),
        providers::MCH_ID
    );
    assert_eq!(
        wechat_call(&sb, "GET", &by_id, None, &me).await.json()["out_trade_no"],
        json!(no)
    );
    // A second press resends the same notification: fitorder records a duplicate.
    sb.pay("WECHAT_PAY", &no).await.unwrap();
    assert_eq!(app.order(&no).await["status"], "PAID");

    // Close: a paid trade cannot be closed; an open one can (204, signed over an empty body).
    let close = format!("/v3/pay/transactions/out-trade-no/{no}/close");
    let mchid = json!({"mchid": providers::MCH_ID});
    let c = wechat_call(&sb, "POST", &close, Some(&mchid), &me).await;
    assert_eq!((c.status, c.json()["code"].clone()), (400, json!("ORDERPAID")));
    let (other, other_fen) = pack_order(&app, "WECHAT_PAY").await;
    wechat_call(
        &sb,
        "POST",
        "/v3/pay/transactions/app",
        Some(&prepay_body(&other, other_fen, &notify, "app")),
        &me,
    )
    .await;
    let c = wechat_call(
        &sb,
        "POST",
        &format!("/v3/pay/transactions/out-trade-no/{other}/close"),
        Some(&mchid),
        &me,
    )
    .await;
    assert_eq!((c.status, c.body.as_str(), c.verified), (204, "", true));
    assert_eq!(sb.trade("WECHAT_PAY", &other).unwrap().state, "CLOSED");
    let refused = sb.pay("WECHAT_PAY", &other).await.unwrap_err().to_string();
    assert!(refused.contains("CLOSED"), "{refused}");
    assert_eq!(app.order(&other).await["status"], "WAIT_PAY");

    // Refund part of it: PROCESSING, then SUCCESS with a REFUND.SUCCESS notification fitorder acknowledges.
    let refund = json!({"out_trade_no": no, "out_refund_no": format!("{no}R1"), "reason": "test",
                        "amount": {"refund": 3000, "total": fen, "currency": "CNY"}});
    let r = wechat_call(&sb, "POST", "/v3/refund/domestic/refunds", Some(&refund), &me).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.verified);
    assert_eq!(r.json()["status"], "PROCESSING");
    assert_eq!(r.json()["amount"]["refund"], 3000);
    let sent = sb.wait_notifications(3, Duration::from_secs(5)).await.unwrap();
    let last = sent.last().unwrap();
    assert_eq!(last.event, "REFUND.SUCCESS");
    assert!(last.acknowledged, "{last:?}");
    let rq = wechat_call(&sb, "GET", &format!("/v3/refund/domestic/refunds/{no}R1"), None, &me).await;
    assert_eq!((rq.json()["status"].clone(), rq.verified), (json!("SUCCESS"), true));
    assert!(rq.json()["success_time"].is_string());
    assert_eq!(
        wechat_call(&sb, "GET", &query, None, &me).await.json()["trade_state"],
        "REFUND"
    );
    // The same refund again answers the same refund; more than is left is refused.
    let again = wechat_call(&sb, "POST", "/v3/refund/domestic/refunds", Some(&refund), &me).await;
    assert_eq!(again.json()["refund_id"], r.json()["refund_id"]);
    let too_much = json!({"out_trade_no": no, "out_refund_no": format!("{no}R2"),
                          "amount": {"refund": fen, "total": fen, "currency": "CNY"}});
    let t = wechat_call(&sb, "POST", "/v3/refund/domestic/refunds", Some(&too_much), &me).await;
    assert_eq!((t.status, t.json()["code"].clone()), (400, json!("INVALID_REQUEST")));
    let unknown = wechat_call(&sb, "GET", "/v3/refund/domestic/refunds/NOSUCHREFUND", None, &me).await;
    assert_eq!(
        (unknown.status, unknown.json()["code"].clone()),
        (404, json!("RESOURCE_NOT_EXISTS"))
    );

    // A held refund stays PROCESSING until the test ends it.
    sb.set_refund_flow(RefundFlow::Hold);
    let held = json!({"out_trade_no": no, "out_refund_no": format!("{no}R3"),
                      "amount": {"refund": 100, "total": fen, "currency": "CNY"}});
    wechat_call(&sb, "POST", "/v3/refund/domestic/refunds", Some(&held), &me).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let rq = wechat_call(&sb, "GET", &format!("/v3/refund/domestic/refunds/{no}R3"), None, &me).await;
    assert_eq!(rq.json()["status"], "PROCESSING");
    let n = sb.finish_refund(&format!("{no}R3"), "ABNORMAL").await.unwrap();
    assert_eq!((n.event.as_str(), n.acknowledged), ("REFUND.ABNORMAL", true));
    assert_eq!(sb.trade("WECHAT_PAY", &no).unwrap().refunds.len(), 2);
}

#[tokio::test]
async fn alipay_precreate_query_pay_and_refund_against_fitorder() {
    let (app, base) = app_on_port().await;
    let sb = sandbox().await;
    let me = providers::merchant_private();
    let notify = format!("{base}/pay/alipay/notify");
    let (no, cents) = pack_order(&app, "ALIPAY").await;
    let yuan = format!("{}.{:02}", cents / 100, cents % 100);
    let biz =
        json!({"out_trade_no": no, "total_amount": yuan, "subject": "Ten sessions", "time_expire": shanghai_in(900)});

    let (v, ok) = alipay_call(&sb, "alipay.trade.precreate", biz.clone(), Some(&notify), &me).await;
    assert!(ok, "the answer's sign must verify over the raw response text");
    assert_eq!(v["code"], "10000", "{v}");
    assert_eq!(v["qr_code"], json!(sb.cashier_url("ALIPAY", &no)));
    let (again, _) = alipay_call(&sb, "alipay.trade.precreate", biz.clone(), Some(&notify), &me).await;
    assert_eq!(again["qr_code"], v["qr_code"]);
    let (forged, _) = alipay_call(&sb, "alipay.trade.precreate", biz.clone(), Some(&notify), stranger()).await;
    assert_eq!(forged["code"], "40002");
    assert_eq!(forged["sub_code"], "isv.invalid-signature");

    // Nobody scanned it yet: Alipay does not know the trade.
    let q = json!({"out_trade_no": no});
    let (v, ok) = alipay_call(&sb, "alipay.trade.query", q.clone(), None, &me).await;
    assert_eq!((v["sub_code"].clone(), ok), (json!("ACQ.TRADE_NOT_EXIST"), true));
    // Opening the QR code's URL is the scan.
    let page = http().get(sb.cashier_url("ALIPAY", &no)).send().await.unwrap();
    assert_eq!(page.status().as_u16(), 200);
    let csp = page.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    let html = page.text().await.unwrap();
    assert!(
        html.contains("id=\"pay\"") && html.contains(&format!("¥{yuan}")),
        "{html}"
    );
    let (v, _) = alipay_call(&sb, "alipay.trade.query", q.clone(), None, &me).await;
    assert_eq!(v["trade_status"], "WAIT_BUYER_PAY");

    sb.pay("ALIPAY", &no).await.unwrap();
    let order = app.order(&no).await;
    assert_eq!(order["status"], "PAID", "{order:#}");
    let (v, _) = alipay_call(&sb, "alipay.trade.query", q.clone(), None, &me).await;
    assert_eq!(v["trade_status"], "TRADE_SUCCESS");
    assert_eq!(v["trade_no"], order["providerTxnId"]);
    assert_eq!(v["total_amount"], json!(yuan));
    let (v, _) = alipay_call(&sb, "alipay.trade.close", q.clone(), None, &me).await;
    assert_eq!(v["sub_code"], "ACQ.TRADE_STATUS_ERROR");

    // A partial refund: synchronous, then TRADE_SUCCESS + refund_fee notified (fitorder says success).
    let refund = json!({"out_trade_no": no, "refund_amount": "30.00", "out_request_no": "RF1"});
    let (v, ok) = alipay_call(&sb, "alipay.trade.refund", refund.clone(), None, &me).await;
    assert!(ok);
    assert_eq!(
        (v["code"].clone(), v["fund_change"].clone(), v["refund_fee"].clone()),
        (json!("10000"), json!("Y"), json!("30.00"))
    );
    let sent = sb.wait_notifications(2, Duration::from_secs(5)).await.unwrap();
    assert_eq!(sent[1].event, "TRADE_SUCCESS+refund");
    assert!(sent[1].acknowledged, "{:?}", sent[1]);
    let (v, _) = alipay_call(&sb, "alipay.trade.refund", refund, None, &me).await;
    assert_eq!(
        (v["fund_change"].clone(), v["refund_fee"].clone()),
        (json!("N"), json!("30.00"))
    );
    let (v, _) = alipay_call(
        &sb,
        "alipay.trade.fastpay.refund.query",
        json!({"out_trade_no": no, "out_request_no": "RF1"}),
        None,
        &me,
    )
    .await;
    assert_eq!(
        (v["refund_status"].clone(), v["refund_amount"].clone()),
        (json!("REFUND_SUCCESS"), json!("30.00"))
    );
    let (v, _) = alipay_call(
        &sb,
        "alipay.trade.fastpay.refund.query",
        json!({"out_trade_no": no, "out_request_no": "NONE"}),
        None,
        &me,
    )
    .await;
    assert_eq!(v["code"], "10000");
    assert!(
        v.get("refund_status").is_none() && v.get("refund_amount").is_none(),
        "{v}"
    );
    // The rest: the trade closes, TRADE_CLOSED notified.
    let rest = format!("{}.{:02}", (cents - 3000) / 100, (cents - 3000) % 100);
    let (v, _) = alipay_call(
        &sb,
        "alipay.trade.refund",
        json!({"out_trade_no": no, "refund_amount": rest, "out_request_no": "RF2"}),
        None,
        &me,
    )
    .await;
    assert_eq!(v["refund_fee"], json!(yuan));
    let sent = sb.wait_notifications(3, Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        (sent[2].event.as_str(), sent[2].acknowledged),
        ("TRADE_CLOSED+refund", true)
    );
    let (v, _) = alipay_call(&sb, "alipay.trade.query", q, None, &me).await;
    assert_eq!(v["trade_status"], "TRADE_CLOSED");
    let (v, _) = alipay_call(
        &sb,
        "alipay.trade.refund",
        json!({"out_trade_no": no, "refund_amount": "0.01", "out_request_no": "RF3"}),
        None,
        &me,
    )
    .await;
    assert_eq!(v["sub_code"], "ACQ.TRADE_STATUS_ERROR");
}

#[tokio::test]
async fn alipay_wap_page_and_app_order_string_open_the_cashier() {
    let (app, base) = app_on_port().await;
    let sb = sandbox().await;
    let me = providers::merchant_private();
    let notify = format!("{base}/pay/alipay/notify");

    // WAP: the payUrl is the gateway with the signed query; it renders the cashier.
    let (no, cents) = pack_order(&app, "ALIPAY").await;
    let yuan = format!("{}.{:02}", cents / 100, cents % 100);
    let biz = json!({"out_trade_no": no, "total_amount": yuan, "subject": "Ten sessions",
                     "product_code": "QUICK_WAP_WAY", "time_expire": shanghai_in(900)});
    let params = alipay_params("alipay.trade.wap.pay", &biz, Some(&notify), &me);
    let url = format!("{}?{}", sb.alipay_gateway(), form(&params));
    let page = http().get(&url).send().await.unwrap();
    assert_eq!(page.status().as_u16(), 200);
    assert!(page.text().await.unwrap().contains("id=\"pay\""));
    assert_eq!(sb.trade("ALIPAY", &no).unwrap().channel, "ALIPAY_WAP");
    let forged = alipay_params("alipay.trade.wap.pay", &biz, Some(&notify), stranger());
    let page = http()
        .get(format!("{}?{}", sb.alipay_gateway(), form(&forged)))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status().as_u16(), 400);
    assert!(page.text().await.unwrap().contains("isv.invalid-signature"));
    sb.pay("ALIPAY", &no).await.unwrap();
    assert_eq!(app.order(&no).await["status"], "PAID");

    // App: the order string is what the app submits; the sandbox opens the cashier for it.
    let (no, cents) = pack_order(&app, "ALIPAY").await;
    let yuan = format!("{}.{:02}", cents / 100, cents % 100);
    let biz = json!({"out_trade_no": no, "total_amount": yuan, "subject": "Ten sessions",
                     "product_code": "QUICK_MSECURITY_PAY", "time_expire": shanghai_in(900)});
    let order_string = form(&alipay_params("alipay.trade.app.pay", &biz, Some(&notify), &me));
    let r = http()
        .post(sb.alipay_app_pay_url())
        .body(order_string)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(r.headers()["location"].to_str().unwrap(), sb.cashier_url("ALIPAY", &no));
    // The cashier's own button, over HTTP: the page's token with it.
    let page = http()
        .get(sb.cashier_url("ALIPAY", &no))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let token = page
        .split("data-token=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string();
    let paid: Value = http()
        .post(format!("{}/pay", sb.cashier_url("ALIPAY", &no)))
        .header("x-cashier-token", token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(paid["ok"], true, "{paid}");
    assert_eq!(app.order(&no).await["status"], "PAID");
    // An app.pay order string is never a gateway call.
    let (v, _) = alipay_answer(
        "alipay.trade.app.pay",
        &http()
            .post(sb.alipay_gateway())
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(&alipay_params("alipay.trade.app.pay", &biz, Some(&notify), &me)))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
            .replace("error_response", "alipay_trade_app_pay_response"),
    );
    assert_eq!(v["sub_code"], "isv.invalid-method");
}

#[tokio::test]
async fn the_provider_refuses_payment_after_time_expire_and_fitorder_refuses_a_forged_notification() {
    let (app, base) = app_on_port().await;
    let sb = sandbox().await;
    let me = providers::merchant_private();
    let notify = format!("{base}/pay/wechat/notify");
    let (no, fen) = pack_order(&app, "WECHAT_PAY").await;
    let mut body = prepay_body(&no, fen, &notify, "native");
    body["time_expire"] = json!(expire_in(2));
    assert_eq!(
        wechat_call(&sb, "POST", "/v3/pay/transactions/native", Some(&body), &me)
            .await
            .status,
        200
    );
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let refused = sb.pay("WECHAT_PAY", &no).await.unwrap_err().to_string();
    assert!(refused.contains("expired"), "{refused}");
    let html = http()
        .get(sb.cashier_url("WECHAT_PAY", &no))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        html.contains("id=\"expired\"") && !html.contains("id=\"pay\""),
        "{html}"
    );
    assert_eq!(sb.trade("WECHAT_PAY", &no).unwrap().state, "NOTPAY");

    // A notification signed with another key: fitorder says 401 and the order stays unpaid.
    let (no, fen) = pack_order(&app, "WECHAT_PAY").await;
    wechat_call(
        &sb,
        "POST",
        "/v3/pay/transactions/native",
        Some(&prepay_body(&no, fen, &notify, "native")),
        &me,
    )
    .await;
    sb.sign_notifications_with_wrong_key(true);
    let err = sb.pay("WECHAT_PAY", &no).await.unwrap_err().to_string();
    assert!(err.contains("401"), "{err}");
    assert_eq!(app.order(&no).await["status"], "WAIT_PAY");
    // Pressed again with the right key: the provider's retry goes through.
    sb.sign_notifications_with_wrong_key(false);
    sb.pay("WECHAT_PAY", &no).await.unwrap();
    assert_eq!(app.order(&no).await["status"], "PAID");
}

// ----- the cashier page in headless Chromium, over the DevTools protocol -----

struct Cdp {
    ws: tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    next: u64,
    session: Option<String>,
}

impl Cdp {
    async fn call(&mut self, method: &str, params: Value) -> Value {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        self.next += 1;
        let id = self.next;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = &self.session {
            msg["sessionId"] = json!(s);
        }
        self.ws.send(Message::Text(msg.to_string().into())).await.unwrap();
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(20), self.ws.next())
                .await
                .expect("DevTools answers")
                .expect("DevTools stays connected")
                .unwrap();
            if let Message::Text(t) = frame {
                let v: Value = serde_json::from_str(&t).unwrap();
                if v["id"] == json!(id) {
                    assert!(v.get("error").is_none(), "{method}: {v}");
                    return v["result"].clone();
                }
            }
        }
    }

    async fn eval(&mut self, expression: &str) -> Value {
        self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true}),
        )
        .await["result"]["value"]
            .clone()
    }

    async fn until(&mut self, expression: &str, what: &str) -> Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            let v = self.eval(expression).await;
            if !(v.is_null() || v == json!(false) || v == json!("")) {
                return v;
            }
            assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Opens `url` in headless Chromium, clicks `#pay` with the mouse and returns the page's
/// verdict (`#paid` or `#error` text). None when there is no Chromium outside CI.
async fn click_pay_in_chromium(url: &str) -> Option<String> {
    use tokio::io::AsyncBufReadExt;
    let exe = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    if !std::path::Path::new(&exe).exists() {
        assert!(std::env::var_os("CI").is_none(), "CI must have Chromium at {exe}");
        eprintln!("SKIPPED: no Chromium at {exe} (set CHROMIUM)");
        return None;
    }
    let profile = std::env::temp_dir().join(format!("fitorder-cashier-{}-{}", std::process::id(), key()));
    let mut child = tokio::process::Command::new(&exe)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--remote-debugging-port=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("about:blank")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let ws_url = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(url) = line.split("DevTools listening on ").nth(1) {
                return url.trim().to_string();
            }
        }
        panic!("Chromium exited without a DevTools URL");
    })
    .await
    .expect("Chromium starts");
    // Keep draining Chromium's log so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let (ws, _) = tokio_tungstenite::connect_async(ws_url.as_str()).await.unwrap();
    let mut cdp = Cdp {
        ws,
        next: 0,
        session: None,
    };
    let target = cdp.call("Target.createTarget", json!({"url": "about:blank"})).await["targetId"].clone();
    let session = cdp
        .call("Target.attachToTarget", json!({"targetId": target, "flatten": true}))
        .await["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    cdp.session = Some(session);
    cdp.call("Page.navigate", json!({"url": url})).await;
    cdp.until(
        "document.readyState === 'complete' && !!document.getElementById('pay')",
        "the Pay button",
    )
    .await;
    let at = cdp
        .eval("(() => { const r = document.getElementById('pay').getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        .await;
    let (x, y) = (at[0].as_f64().unwrap(), at[1].as_f64().unwrap());
    for kind in ["mouseMoved", "mousePressed", "mouseReleased"] {
        cdp.call(
            "Input.dispatchMouseEvent",
            json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
        )
        .await;
    }
    let verdict = cdp
        .until(
            "(document.getElementById('paid') || document.getElementById('error') || {}).textContent || ''",
            "Paid or an error on the page",
        )
        .await;
    let _ = child.kill().await;
    let _ = std::fs::remove_dir_all(&profile);
    Some(verdict.as_str().unwrap_or_default().to_string())
}

#[tokio::test]
async fn cashier_page_in_headless_chromium_pays_the_order() {
    let (app, base) = app_on_port().await;
    let sb = sandbox().await;
    let me = providers::merchant_private();
    let (no, fen) = pack_order(&app, "WECHAT_PAY").await;
    let a = wechat_call(
        &sb,
        "POST",
        "/v3/pay/transactions/native",
        Some(&prepay_body(&no, fen, &format!("{base}/pay/wechat/notify"), "native")),
        &me,
    )
    .await;
    let code_url = a.json()["code_url"].as_str().unwrap().to_string();
    let Some(verdict) = click_pay_in_chromium(&code_url).await else {
        return;
    };
    assert_eq!(verdict, "Paid");
    assert_eq!(app.order(&no).await["status"], "PAID");
    let sent = sb.notifications();
    assert_eq!(sent.len(), 1);
    assert!(sent[0].acknowledged && sent[0].status == Some(204), "{sent:?}");
}

/// Not independent (it uses fitorder's own client primitives on purpose): shows that
/// `wechat::signing`, `alipay::gateway` and `crypto` of the client fit the sandbox, so the
/// client built on them can be pointed at it.
#[tokio::test]
async fn fitorders_client_primitives_fit_the_sandbox() {
    use fitorder::providers::alipay::gateway;
    use fitorder::providers::crypto;
    use fitorder::providers::wechat::signing;
    let sb = sandbox().await;
    let me = providers::merchant_private();
    let m = signing::Merchant {
        mch_id: providers::MCH_ID,
        serial: providers::MERCHANT_SERIAL,
        key: &me,
    };
    let body = prepay_body("FOCLIENT000001", 4200, "http://127.0.0.1:9/n", "jsapi").to_string();
    let ts = Utc::now().timestamp();
    let n = crypto::nonce(32);
    let auth = signing::authorization(&m, "POST", "/v3/pay/transactions/jsapi", ts, &n, &body);
    let resp = http()
        .post(format!("{}/v3/pay/transactions/jsapi", sb.wechat_api_base()))
        .header("authorization", auth)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let h = |k: &str| resp.headers()[k].to_str().unwrap().to_string();
    let (t, nn, sig) = (h("wechatpay-timestamp"), h("wechatpay-nonce"), h("wechatpay-signature"));
    let text = resp.text().await.unwrap();
    let message = signing::answer_message(&t, &nn, text.as_bytes());
    assert!(crypto::verify(&providers::wechat_platform_public(), &message, &sig));

    let mut params: Vec<(String, String)> = vec![
        ("app_id".into(), providers::APP_ID.into()),
        ("method".into(), "alipay.trade.precreate".into()),
        ("charset".into(), "utf-8".into()),
        ("sign_type".into(), "RSA2".into()),
        ("timestamp".into(), shanghai_now()),
        ("version".into(), "1.0".into()),
        ("notify_url".into(), "http://127.0.0.1:9/n".into()),
        (
            "biz_content".into(),
            json!({"out_trade_no": "FOCLIENT000001", "total_amount": "42.00", "subject": "Ten", "time_expire": shanghai_in(900)})
                .to_string(),
        ),
    ];
    gateway::sign_params(&me, &mut params);
    let text = http()
        .post(sb.alipay_gateway())
        .header("content-type", "application/x-www-form-urlencoded;charset=utf-8")
        .body(gateway::encode(&params))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let v = gateway::verify_answer(&providers::alipay_public(), None, "alipay.trade.precreate", &text).unwrap();
    assert_eq!(v["code"], "10000", "{v}");
}

/// AEAD_AES_256_GCM as WeChat Pay documents it: base64 of ciphertext‖tag, 12-byte nonce.
fn wechat_decrypt(resource: &Value) -> String {
    use aes_gcm::aead::{Aead, Payload};
    use aes_gcm::{Aes256Gcm, KeyInit, Nonce};
    let cipher = Aes256Gcm::new_from_slice(providers::APIV3_KEY.as_bytes()).unwrap();
    let nonce: [u8; 12] = resource["nonce"].as_str().unwrap().as_bytes().try_into().unwrap();
    let data = B64.decode(resource["ciphertext"].as_str().unwrap()).unwrap();
    let plain = cipher
        .decrypt(
            &Nonce::from(nonce),
            Payload {
                msg: &data,
                aad: resource["associated_data"].as_str().unwrap().as_bytes(),
            },
        )
        .unwrap();
    String::from_utf8(plain).unwrap()
}

#[tokio::test]
async fn certificates_list_the_platform_key_and_answers_can_name_the_certificate() {
    use fitorder::dev::sandbox_server::WechatSerialMode;
    use rsa::pkcs8::{EncodePublicKey, LineEnding};
    let sb = sandbox().await;
    let me = providers::merchant_private();
    let a = wechat_call(&sb, "GET", "/v3/certificates", None, &me).await;
    assert_eq!((a.status, a.verified), (200, true), "{}", a.body);
    assert_eq!(a.serial, providers::WECHAT_PUBLIC_KEY_ID);
    let listed = a.json();
    let entry = &listed["data"][0];
    let serial = sb.wechat_cert_serial();
    assert_eq!(serial.len(), 40);
    assert_eq!(entry["serial_no"], json!(serial));
    assert_eq!(entry["encrypt_certificate"]["algorithm"], "AEAD_AES_256_GCM");
    assert_eq!(entry["encrypt_certificate"]["associated_data"], "certificate");
    let pem = wechat_decrypt(&entry["encrypt_certificate"]);
    // openssl reads the certificate: its serial, and the platform key inside.
    let mut child = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-serial", "-pubkey"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(pem.as_bytes()).unwrap();
    let out = String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap();
    assert!(out.contains(&format!("serial={serial}")), "{out}");
    let public = providers::wechat_platform_public()
        .to_public_key_pem(LineEnding::LF)
        .unwrap();
    assert!(out.contains(public.trim()), "{out}");
    assert!(sb.calls().iter().any(|c| c.api == "/v3/certificates" && c.verified));

    // Answers name the certificate, then alternate as during a migration; the key is the same.
    sb.set_wechat_serial_mode(WechatSerialMode::Certificate);
    let q = "/v3/pay/transactions/out-trade-no/NOSUCHTRADE1?mchid=1900000109";
    let a = wechat_call(&sb, "GET", q, None, &me).await;
    assert_eq!((a.serial.as_str(), a.verified), (serial.as_str(), true));
    sb.set_wechat_serial_mode(WechatSerialMode::Alternate);
    let first = wechat_call(&sb, "GET", q, None, &me).await.serial;
    let second = wechat_call(&sb, "GET", q, None, &me).await.serial;
    assert_ne!(first, second);
    assert!([first, second]
        .iter()
        .all(|s| *s == serial || s == providers::WECHAT_PUBLIC_KEY_ID));
}

/// fitorder without a 微信支付公钥 downloads the platform certificates: against the sandbox
/// naming its certificate, a Native order gets its code_url and is paid.
#[tokio::test]
async fn fitorder_in_certificate_mode_downloads_the_sandbox_certificate_and_is_paid() {
    use fitorder::dev::sandbox_server::WechatSerialMode;
    let app = TestApp::served_with(|c| {
        c.wechatpay.platform_public_key = None;
        c.wechatpay.public_key_id = None;
    })
    .await;
    app.sandbox.set_wechat_serial_mode(WechatSerialMode::Certificate);
    let s = app.studio(0, None, 1).await;
    let placed = app
        .place(
            &s.member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack},
                   "paymentMethod": "WECHAT_PAY", "channel": "WECHAT_NATIVE"}),
        )
        .await;
    let no = placed["order"]["orderNo"].as_str().unwrap().to_string();
    assert_eq!(
        placed["payment"]["qrCode"],
        json!(app.sandbox.cashier_url("WECHAT_PAY", &no)),
        "{placed:#}"
    );
    let fetches = |app: &TestApp| {
        app.sandbox
            .calls()
            .iter()
            .filter(|c| c.api == "/v3/certificates")
            .count()
    };
    assert_eq!(
        fetches(&app),
        1,
        "the unknown serial of the prepay answer fetched the certificates once"
    );
    app.sandbox.pay("WECHAT_PAY", &no).await.unwrap();
    assert_eq!(app.order(&no).await["status"], "PAID");
    assert_eq!(fetches(&app), 1, "the notification names a certificate now known");
    // A notification naming a serial nobody knows: refused, and no second fetch within the minute.
    let mut forged = providers::wechat();
    forged.serial = "7A1B2C3D4E5F60718293A4B5C6D7E8F901234567".into();
    let n = forged.notification(
        "TRANSACTION.SUCCESS",
        &forged.transaction(&no, "4200000000000000000000009999", 1),
        Utc::now().timestamp(),
    );
    let headers: Vec<(&str, &str)> = n.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (status, _, _) = app.post("/pay/wechat/notify", &headers, n.body.clone()).await;
    assert_eq!(status.as_u16(), 401);
    assert_eq!(fetches(&app), 1, "forced refreshes are rate-limited");
}

/// Development mode's keys: `DevKeys::start_sandbox` leaves both providers configured whole,
/// and an app configured so places a Native order at that sandbox and is paid from its cashier.
#[tokio::test]
async fn dev_keys_configure_both_providers_whole_against_their_sandbox() {
    use fitorder::dev::devkeys::DevKeys;
    let dir = std::env::temp_dir().join(format!("fitorder-devkeys-{}-{}", std::process::id(), key()));
    let d = dir.clone();
    let keys = tokio::task::spawn_blocking(move || DevKeys::ensure(&d))
        .await
        .unwrap()
        .unwrap();
    for file in [
        "wechatpay-merchant.pem",
        "alipay-app.pem",
        "wechatpay-platform.pub.pem",
        "alipay.pub.pem",
    ] {
        assert!(dir.join(file).exists(), "{file}");
    }
    let mut config = fitorder::config::Config::for_tests("postgres://unused".into());
    let dev = keys.start_sandbox(&mut config, "127.0.0.1:0").await.unwrap();
    let loaded = fitorder::providers::keys::ProviderKeys::load(&config).unwrap();
    assert!(
        loaded.wechat.is_some() && loaded.alipay.is_some(),
        "both providers whole"
    );

    let (wechat_base, alipay_gateway) = (dev.wechat_api_base(), dev.alipay_gateway());
    let app = TestApp::served_with(|c| keys.configure_sandbox(c, &wechat_base, &alipay_gateway)).await;
    let s = app.studio(0, None, 1).await;
    let placed = app
        .place(
            &s.member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack},
                   "paymentMethod": "WECHAT_PAY", "channel": "WECHAT_NATIVE"}),
        )
        .await;
    let no = placed["order"]["orderNo"].as_str().unwrap().to_string();
    assert_eq!(placed["payment"]["qrCode"], json!(dev.cashier_url("WECHAT_PAY", &no)));
    dev.pay("WECHAT_PAY", &no).await.unwrap();
    assert_eq!(app.order(&no).await["status"], "PAID");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The demo's stories (`dev::stories`, told on the first start of `cargo run --release`) end
/// where staff must look, through the real routes: a payment after cancel at Alipay, and a
/// WeChat Pay bill that differs from the books in an amount and a payment never heard of.
#[tokio::test]
async fn the_demo_stories_leave_the_workbench_three_tickets() {
    use fitorder::dev::devkeys::DevKeys;
    let dir = std::env::temp_dir().join(format!("fitorder-stories-{}-{}", std::process::id(), key()));
    let d = dir.clone();
    let keys = tokio::task::spawn_blocking(move || DevKeys::ensure(&d))
        .await
        .unwrap()
        .unwrap();
    let mut config = fitorder::config::Config::for_tests("postgres://unused".into());
    let dev = keys.start_sandbox(&mut config, "127.0.0.1:0").await.unwrap();
    let (wechat_base, alipay_gateway) = (dev.wechat_api_base(), dev.alipay_gateway());
    let statements = dir.join("statements");
    let app = TestApp::served_with(|c| {
        keys.configure_sandbox(c, &wechat_base, &alipay_gateway);
        c.statement_dir = statements.clone();
    })
    .await;
    let mut conn = app.state.pool.get().await.unwrap();
    let seeded = fitorder::dev::seed::seed(&mut conn).await.unwrap();
    drop(conn);
    assert!(seeded.created);
    let told = fitorder::dev::stories::tell(app.state.clone(), &keys, &seeded)
        .await
        .unwrap();
    assert_eq!(told.tickets, 3);
    let tickets = app
        .admin(
            "{ exceptionTickets(first: 10) { edges { node { kind status } } } }",
            json!({}),
        )
        .await;
    let mut kinds: Vec<String> = tickets["exceptionTickets"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["node"]["kind"].as_str().unwrap().to_string())
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        ["AMOUNT_MISMATCH", "PAID_AFTER_CANCEL", "PROVIDER_PAID_LOCAL_UNPAID"],
        "{tickets:#}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
