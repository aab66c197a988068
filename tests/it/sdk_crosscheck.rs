//! fitorder's signing primitives against the providers' own SDKs, and the provider stand-in
//! against the same SDKs used as its clients. The SDKs (pinned in tests/sdk/requirements.txt and
//! tests/sdk/package-lock.json) run as scripts in tests/sdk/: each gets its input as a JSON file
//! and answers one JSON object on stdout. RSA PKCS#1 v1.5 is deterministic, so where the SDK can
//! produce a signature with the same key the bytes must be equal; where it can only verify, it
//! verifies (and refuses a tampered parameter).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use fitorder::providers::alipay::gateway::{self, AnswerError};
use fitorder::providers::wechat::signing::{self, Merchant};
use fitorder::providers::{crypto, keys};
use rsa::pkcs8::{EncodePublicKey, LineEnding};
use rsa::RsaPublicKey;
use serde_json::{json, Value};

use crate::standin::{make_rsa_key, need, root, scratch_dir, Modes, StandIn, StandInMode};

fn python_sdk() -> Result<(), String> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import wechatpayv3, cryptography, requests; print(wechatpayv3.__version__)",
        ])
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "python3 cannot import wechatpayv3: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

fn node_sdk() -> Result<(), String> {
    Command::new("node")
        .arg("--version")
        .output()
        .map_err(|e| format!("node: {e}"))?;
    let pkg = root().join("tests/sdk/node_modules/alipay-sdk/package.json");
    std::fs::metadata(&pkg).map_err(|_| format!("{} is missing", pkg.display()))?;
    Ok(())
}

fn openssl() -> Result<(), String> {
    Command::new("openssl")
        .arg("version")
        .output()
        .map(|_| ())
        .map_err(|e| format!("openssl: {e}"))
}

/// Runs a script of tests/sdk with `input` written to a file; its JSON answer.
fn run(dir: &Path, program: &str, script: &str, input: &Value) -> Value {
    let file = dir.join(format!("{script}.input.json"));
    std::fs::write(&file, serde_json::to_vec_pretty(input).unwrap()).unwrap();
    let out = Command::new(program)
        .arg(root().join("tests/sdk").join(script))
        .arg(&file)
        .current_dir(root().join("tests/sdk"))
        .output()
        .unwrap_or_else(|e| panic!("{program} {script}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{script} answered no JSON ({e}): {stdout}"))
}

fn public_pem(key: &RsaPublicKey) -> String {
    key.to_public_key_pem(LineEnding::LF).unwrap()
}

#[test]
fn wechat_signatures_are_the_ones_wechatpayv3_makes_and_accepts() {
    if !need("the WeChat Pay SDK (PyPI wechatpayv3)", || {
        python_sdk().and_then(|_| openssl())
    }) {
        return;
    }
    let dir = scratch_dir("sdk-wechat");
    let merchant_pem = make_rsa_key(&dir.join("merchant_key.pem"));
    let platform_pem = make_rsa_key(&dir.join("platform_key.pem"));
    let merchant = keys::parse_private_key(&merchant_pem).unwrap();
    let platform = keys::parse_private_key(&platform_pem).unwrap();
    let platform_public = RsaPublicKey::from(&platform);
    let (mch_id, serial, appid) = (
        "1900000109",
        "3775B6A45ACD588826D15E583A95F5DD12345678",
        "wxd678efh567hg6787",
    );
    let m = Merchant {
        mch_id,
        serial,
        key: &merchant,
    };
    let ts = chrono::Utc::now().timestamp();
    let jsapi = signing::jsapi_params(
        &merchant,
        appid,
        "wx201410272009395522657a690389285100",
        ts,
        &crypto::nonce(32),
    );
    let app = signing::app_params(
        &merchant,
        appid,
        mch_id,
        "wx20261201100000abcdef0123456789",
        ts,
        &crypto::nonce(32),
    );

    let native = json!({"appid": appid, "mchid": mch_id, "description": "私教课 10 节 / Personal training",
        "out_trade_no": "FO20261201000001", "time_expire": "2026-12-01T18:00:00+08:00",
        "notify_url": "https://fitorder.example/pay/wechat/notify", "amount": {"total": 100, "currency": "CNY"}})
    .to_string();
    let calls = [
        ("POST", "/v3/pay/transactions/native".to_string(), native),
        (
            "GET",
            format!("/v3/pay/transactions/out-trade-no/FO20261201000001?mchid={mch_id}"),
            String::new(),
        ),
        (
            "POST",
            "/v3/pay/transactions/out-trade-no/FO20261201000001/close".into(),
            json!({"mchid": mch_id}).to_string(),
        ),
        ("GET", "/v3/certificates".into(), String::new()),
    ];
    let cases: Vec<Value> = calls
        .iter()
        .map(|(method, path, body)| {
            let nonce = crypto::nonce(32);
            json!({"method": method, "path": path, "timestamp": ts, "nonce": nonce, "body": body,
                "ours": signing::authorization(&m, method, path, ts, &nonce, body)})
        })
        .collect();

    let body = r#"{"appid":"wxd678efh567hg6787","mchid":"1900000109","out_trade_no":"FO20261201000001","trade_state":"SUCCESS","trade_state_desc":"支付成功","amount":{"total":100}}"#;
    let answer_nonce = crypto::nonce(32);
    let our_signature = crypto::sign(
        &platform,
        &signing::answer_message(&ts.to_string(), &answer_nonce, body.as_bytes()),
    );
    let input = json!({
        "merchant_key_pem": merchant_pem, "mchid": mch_id, "serial": serial, "appid": appid,
        "jsapi": {"prepay_id": "wx201410272009395522657a690389285100", "timestamp": ts, "nonce": jsapi.nonce_str},
        "app": {"prepay_id": app.prepay_id, "timestamp": ts, "nonce": app.nonce_str},
        "authorization": cases,
        "answer": {"platform_key_pem": platform_pem, "platform_public_pem": public_pem(&platform_public),
            "serial": "PUB_KEY_ID_0119000001092026120100000000000001", "timestamp": ts, "nonce": answer_nonce,
            "body": body, "our_signature": our_signature},
    });
    let out = run(&dir, "python3", "wechat_crosscheck.py", &input);

    // The client pay parameters: the SDK's helper signs the same bytes.
    assert_eq!(
        out["jsapi_pay_sign"].as_str(),
        Some(jsapi.pay_sign.as_str()),
        "JSAPI paySign"
    );
    assert_eq!(
        (jsapi.sign_type.as_str(), jsapi.package.as_str()),
        ("RSA", "prepay_id=wx201410272009395522657a690389285100")
    );
    assert_eq!(out["app_sign"].as_str(), Some(app.sign.as_str()), "APP sign");
    assert_eq!(app.package_value, "Sign=WXPay");
    // The Authorization header: the SDK builds the same string for POST, GET with a query, and
    // an empty GET body.
    for (case, sdk) in cases.iter().zip(out["authorization"].as_array().unwrap()) {
        assert_eq!(sdk, &case["ours"], "{} {}", case["method"], case["path"]);
    }
    // An answer: what the SDK side signs verifies with ours, and what we sign the SDK accepts.
    let sdk_signature = out["answer_signature_by_sdk_side"].as_str().unwrap();
    let message = signing::answer_message(&ts.to_string(), &answer_nonce, body.as_bytes());
    assert!(crypto::verify(&platform_public, &message, sdk_signature));
    assert_eq!(sdk_signature, our_signature);
    assert_eq!(out["sdk_accepts_sdk_side_signature"], true);
    assert_eq!(out["sdk_accepts_our_signature"], true);
    // Tampering is refused by the SDK, and by us.
    assert_eq!(out["sdk_accepts_tampered_body"], false);
    assert_eq!(out["sdk_accepts_tampered_timestamp"], false);
    let tampered = signing::answer_message(
        &ts.to_string(),
        &answer_nonce,
        body.replace("SUCCESS", "NOTPAY").as_bytes(),
    );
    assert!(!crypto::verify(&platform_public, &tampered, sdk_signature));
}

fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn form(s: &str) -> BTreeMap<String, String> {
    form_urlencoded::parse(s.as_bytes()).into_owned().collect()
}

#[test]
fn alipay_signatures_are_the_ones_alipay_sdk_makes_and_the_gateway_accepts() {
    if !need("the Alipay SDK (npm alipay-sdk)", || node_sdk().and_then(|_| openssl())) {
        return;
    }
    let dir = scratch_dir("sdk-alipay");
    let app_pem = make_rsa_key(&dir.join("app_key.pem"));
    let alipay_pem = make_rsa_key(&dir.join("alipay_key.pem"));
    let app = keys::parse_private_key(&app_pem).unwrap();
    let alipay = keys::parse_private_key(&alipay_pem).unwrap();
    let app_id = "2021000000000001";
    let timestamp = "2026-12-01 10:00:00";
    let notify = "https://fitorder.example/pay/alipay/notify";

    let precreate_biz =
        json!({"out_trade_no": "FO20261201000001", "subject": "私教课 10 节", "total_amount": "88.00"}).to_string();
    let mut precreate = params(&[
        ("app_id", app_id),
        ("method", "alipay.trade.precreate"),
        ("format", "JSON"),
        ("charset", "utf-8"),
        ("sign_type", "RSA2"),
        ("timestamp", timestamp),
        ("version", "1.0"),
        ("notify_url", notify),
        ("biz_content", &precreate_biz),
    ]);
    gateway::sign_params(&app, &mut precreate);
    let app_pay_biz = json!({"out_trade_no": "FO20261201000002", "product_code": "QUICK_MSECURITY_PAY",
        "subject": "会员卡 月卡", "time_expire": "2026-12-01 10:15:00", "total_amount": "199.00"})
    .to_string();
    let mut app_pay = params(&[
        ("app_id", app_id),
        ("method", "alipay.trade.app.pay"),
        ("charset", "utf-8"),
        ("sign_type", "RSA2"),
        ("timestamp", timestamp),
        ("version", "1.0"),
        ("notify_url", notify),
        ("biz_content", &app_pay_biz),
    ]);
    gateway::sign_params(&app, &mut app_pay);
    let order_string = gateway::encode(&app_pay);

    let response = json!({"code": "10000", "msg": "Success", "trade_no": "2026120122001400000000000001",
        "out_trade_no": "FO20261201000001", "buyer_logon_id": "159****5620", "trade_status": "TRADE_SUCCESS",
        "total_amount": "88.00", "send_pay_date": "2026-12-01 10:01:02", "qr_code": "https://qr.alipay.com/bax0"});
    let input = json!({
        "app_id": app_id, "app_key_pem": app_pem, "app_public_pem": public_pem(&RsaPublicKey::from(&app)),
        "requests": [
            {"method": "alipay.trade.precreate", "params": precreate},
            {"method": "alipay.trade.app.pay", "params": app_pay},
        ],
        "answer": {"alipay_key_pem": alipay_pem, "alipay_public_pem": public_pem(&RsaPublicKey::from(&alipay)),
            "method": "alipay.trade.query", "response": response},
    });
    let out = run(&dir, "node", "alipay_crosscheck.mjs", &input);
    let results = out["requests"].as_array().unwrap();
    for (ours, sdk) in [&precreate, &app_pay].into_iter().zip(results) {
        let method = &ours[1].1;
        let sign = &ours.iter().find(|(k, _)| k == "sign").unwrap().1;
        // The SDK's signer (the one exec/pageExec/sdkExec use) over the same parameters makes
        // the same signature: the same content, sign_type included.
        assert_eq!(sdk["sdk_sign"].as_str(), Some(sign.as_str()), "{method}: signature");
        let ours_map: BTreeMap<String, String> = ours.iter().cloned().collect();
        assert_eq!(
            form(sdk["sdk_string"].as_str().unwrap()),
            ours_map,
            "{method}: parameters"
        );
        // The gateway's check (every parameter but sign, sign_type kept) accepts it; a tampered
        // amount is refused, and so is the content without sign_type (it is signed).
        assert_eq!(sdk["ours_accepted"], true, "{method}");
        assert_eq!(sdk["tampered_accepted"], false, "{method}");
        assert_eq!(sdk["tampered_accepted_v2"], false, "{method}");
        assert_eq!(sdk["without_sign_type_accepted"], false, "{method}");
    }
    // The app order string carries what the SDK's sdkExec carries (encodings differ: `+` for a
    // space in ours, `%20` in the SDK's; both decode to the same signed values).
    assert_eq!(form(&order_string), form(results[1]["sdk_string"].as_str().unwrap()));

    // An answer signed on the gateway side over its raw `<method>_response` text (with `\/`
    // escapes as the gateway writes them): the SDK accepts it and so do we; tampered, neither.
    let answer = &out["answer"];
    assert_eq!(answer["sdk_accepts"], true);
    let alipay_public = RsaPublicKey::from(&alipay);
    let body = answer["body"].as_str().unwrap();
    assert!(body.contains(r"https:\/\/qr.alipay.com"), "{body}");
    let v = gateway::verify_answer(&alipay_public, None, "alipay.trade.query", body).unwrap();
    assert_eq!(v, response);
    assert_eq!(answer["sdk_accepts_tampered"], false);
    assert_eq!(
        gateway::verify_answer(
            &alipay_public,
            None,
            "alipay.trade.query",
            answer["tampered_body"].as_str().unwrap()
        ),
        Err(AnswerError::BadSignature)
    );
}

/// Serials as numbers (the SDK prints them without leading zeros), sorted.
fn serials(v: &Value) -> Vec<String> {
    let mut s: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().trim_start_matches('0').to_uppercase())
        .collect();
    s.sort();
    s
}

fn assert_no_error(steps: &Value) {
    for (name, step) in steps.as_object().unwrap() {
        assert!(step.get("error").is_none(), "{name}: {step}");
    }
}

/// The SDKs as clients of the stand-in: they accept its answers, certificates and notifications
/// with their own verification code, and the stand-in accepts their requests.
async fn sdks_use_the_standin(mode: StandInMode) {
    if !need("the providers' SDKs (wechatpayv3, alipay-sdk)", || {
        python_sdk().and_then(|_| node_sdk())
    }) {
        return;
    }
    let Some(s) = StandIn::start_or_skip(mode) else {
        return;
    };
    let mode_name = match mode {
        StandInMode::PublicKey => "public-key",
        StandInMode::Certificate => "certificate",
    };
    let input = |no: &str| {
        json!({"base": s.wechat_base(), "gateway": s.alipay_gateway(), "dir": s.dir(), "mode": mode_name,
            "merchant_key_path": s.merchant_key_path(), "app_key_path": s.app_key_path(), "out_trade_no": no})
    };

    let wx = run(s.dir(), "python3", "wechat_client.py", &input("SDKWX0001"));
    assert_no_error(&wx);
    assert!(
        wx["native"]["body"]["code_url"]
            .as_str()
            .unwrap()
            .starts_with("weixin://"),
        "{wx}"
    );
    for kind in ["jsapi", "app"] {
        assert!(
            wx[kind]["body"]["prepay_id"].as_str().unwrap().starts_with("wx"),
            "{kind}: {wx}"
        );
    }
    assert!(wx["h5"]["body"]["h5_url"].as_str().unwrap().starts_with("https://"));
    assert_eq!(wx["query_unpaid"]["body"]["trade_state"], "NOTPAY");
    assert_eq!(wx["close"]["code"], 204);
    assert_eq!(wx["query_paid"]["body"]["trade_state"], "SUCCESS");
    assert_eq!(wx["refund"]["body"]["status"], "PROCESSING");
    assert_eq!(wx["refund_query"]["body"]["status"], "SUCCESS");
    assert_eq!(wx["notify"]["status"], 204);
    assert_eq!(wx["notify"]["callback"]["event_type"], "TRANSACTION.SUCCESS");
    assert_eq!(wx["notify"]["callback"]["resource"]["out_trade_no"], "SDKWX0001");
    assert_eq!(wx["notify"]["callback"]["resource"]["trade_state"], "REFUND");
    assert_eq!(wx["refund_processing"]["body"]["status"], "PROCESSING");
    assert_eq!(wx["refund_query_processing"]["body"]["status"], "PROCESSING");
    assert_eq!(wx["refund_query_settled"]["body"]["status"], "SUCCESS");
    assert_eq!(wx["close_paid_meanwhile"]["code"], 400, "{wx}");
    assert_eq!(wx["close_paid_meanwhile"]["body"]["code"], "ORDERPAID");
    assert_eq!(wx["query_paid_meanwhile"]["body"]["trade_state"], "SUCCESS");
    if mode == StandInMode::Certificate {
        assert_eq!(
            serials(&wx["init"]["certificates"]),
            serials(&json!([s.wechat_serial()]))
        );
    }

    let ali = run(s.dir(), "node", "alipay_client.mjs", &input("SDKALI0001"));
    assert_no_error(&ali);
    assert_eq!(ali["precreate"]["code"], "10000", "{ali}");
    assert!(ali["precreate"]["qrCode"]
        .as_str()
        .unwrap()
        .starts_with("https://qr.alipay.com/"));
    assert_eq!(ali["query_before_scan"]["subCode"], "ACQ.TRADE_NOT_EXIST");
    assert_eq!(ali["query_paid"]["tradeStatus"], "TRADE_SUCCESS");
    assert_eq!(
        (
            ali["refund"]["fundChange"].as_str(),
            ali["refund"]["refundFee"].as_str()
        ),
        (Some("Y"), Some("8.00"))
    );
    assert_eq!(ali["refund_query"]["refundStatus"], "REFUND_SUCCESS");
    assert_eq!(ali["close_paid"]["subCode"], "ACQ.TRADE_HAS_SUCCESS");
    assert_eq!(ali["refund_pending"]["fundChange"], "N", "{ali}");
    assert_eq!(ali["refund_query_pending"]["code"], "10000");
    assert!(ali["refund_query_pending"].get("refundStatus").is_none(), "{ali}");
    assert_eq!(ali["refund_query_settled"]["refundStatus"], "REFUND_SUCCESS");
    assert_eq!(ali["close_paid_meanwhile"]["subCode"], "ACQ.TRADE_HAS_SUCCESS", "{ali}");
    assert_eq!(ali["query_paid_meanwhile"]["tradeStatus"], "TRADE_SUCCESS");
    assert_eq!(
        (ali["notify"]["status"].as_u64(), ali["notify"]["verified"].as_bool()),
        (Some(200), Some(true))
    );
    assert_eq!(ali["notify"]["fields"]["refund_fee"], "8.00");
    // Certificate mode: the SDK computed the SNs from the stand-in's certificates itself.
    assert_eq!(ali["sns"]["app_cert_sn"].as_str().map(str::to_string), s.app_cert_sn());
    assert_eq!(
        ali["sns"]["alipay_root_cert_sn"].as_str().map(str::to_string),
        s.alipay_root_cert_sn()
    );

    // Every request the SDKs made verified at the stand-in.
    let log = s.requests().await;
    assert!(log.len() >= 15, "{}", log.len()); // 9 WeChat calls (+ /v3/certificates), 6 Alipay
    for r in &log {
        assert_eq!(r["verified"], true, "{r}");
    }

    // Rotation (certificate mode: both certificates listed, the new one signs): a fresh SDK
    // client downloads both and verifies answers from the new one.
    if mode == StandInMode::Certificate {
        let rotated = s.rotate(false).await;
        let wx = run(s.dir(), "python3", "wechat_client.py", &input("SDKWX0002"));
        assert_no_error(&wx);
        assert_eq!(serials(&wx["init"]["certificates"]), serials(&rotated["serials"]));
    }

    // Answers signed with a wrong key, or naming a serial nobody published: the SDKs refuse them.
    s.set_mode(Modes {
        wrong_key: Some(true),
        ..Modes::default()
    })
    .await;
    let wx = run(s.dir(), "python3", "wechat_client.py", &input("SDKWX0003"));
    for step in ["native", "query_unpaid", "close", "refund"] {
        assert!(
            wx[step]["error"]
                .as_str()
                .unwrap()
                .contains("failed to verify the signature"),
            "{step}: {wx}"
        );
    }
    let ali = run(s.dir(), "node", "alipay_client.mjs", &input("SDKALI0003"));
    for step in ["precreate", "query_paid", "refund"] {
        assert!(
            ali[step]["error"].as_str().unwrap().contains("验签失败"),
            "{step}: {ali}"
        );
    }
    assert_eq!(ali["notify"]["verified"], false);
    s.set_mode(Modes {
        wrong_key: Some(false),
        unknown_serial: Some(true),
        ..Modes::default()
    })
    .await;
    let wx = run(s.dir(), "python3", "wechat_client.py", &input("SDKWX0004"));
    assert!(wx["native"].get("error").is_some(), "{wx}");
}

#[tokio::test]
async fn sdks_as_clients_accept_the_standin_in_public_key_mode() {
    sdks_use_the_standin(StandInMode::PublicKey).await;
}

#[tokio::test]
async fn sdks_as_clients_accept_the_standin_in_certificate_mode() {
    sdks_use_the_standin(StandInMode::Certificate).await;
}
