//! The provider stand-in (`tests/standin/provider.py`): WeChat Pay API v3 and the Alipay open
//! gateway on 127.0.0.1, written from the providers' documentation and sharing no code with
//! fitorder. Start one per test:
//!
//! ```ignore
//! let Some(s) = StandIn::start_or_skip(StandInMode::PublicKey) else { return };
//! // point the client at s.wechat_base() / s.alipay_gateway(), sign with s.merchant_key() /
//! // s.app_key(), trust s.wechat_public_key() + s.wechat_serial() / s.alipay_public_key()
//! s.set_trade(Trade::wechat("FO1", "SUCCESS").amount(100)).await;
//! let (status, body) = s.notify("FO1").await; // the signed notification, sent to its notify_url
//! ```
//!
//! Files in [`StandIn::dir`] (the stand-in rewrites the provider ones on `rotate`):
//!
//! | file | what |
//! | --- | --- |
//! | `merchant_key.pem`, `merchant_public.pem` | our WeChat merchant API key (PKCS#8), made here with openssl |
//! | `app_key.pem`, `app_public.pem` | our Alipay app key (PKCS#8), made here with openssl |
//! | `config.json` | ids and serials: `wechat.{mchid, appid, merchant_serial, apiv3_key, serial, serials}`, `alipay.{app_id, alipay_cert_sn, app_cert_sn, alipay_root_cert_sn}` |
//! | `wechat_merchant_cert.pem`, `wechat_merchant_serial.txt` | the merchant API certificate the stand-in issued for our key (its serial goes in `serial_no`) |
//! | `wechat_apiv3_key.txt` | the APIv3 key (32 characters): notifications and `/v3/certificates` are encrypted with it |
//! | `wechat_public_key.pem`, `wechat_serial.txt` | the key that signs answers now, and its `Wechatpay-Serial` (`PUB_KEY_ID_…` in public-key mode, the certificate serial in certificate mode) |
//! | `wechat_platform_cert.pem`, `wechat_platform_cert_<serial>.pem` | certificate mode: the current platform certificate, and each one listed |
//! | `alipay_public_key.pem` | the Alipay public key (both modes) |
//! | `alipayCertPublicKey_RSA2.crt`, `alipayRootCert.crt`, `appCertPublicKey.crt`, `*_sn.txt` | certificate mode: Alipay's certificate, the root file (an RSA root and an EC root, the latter left out of the root SN), our app's certificate, and their SNs |
//!
//! Control API (JSON), all under `/_standin/`: `GET requests` (every provider request with
//! `provider`, `method`, `path`, `headers`, `body`, `params` (Alipay), `verified`, `error`,
//! `status`, `answer`), `DELETE requests`, `GET config`, `POST trade` (see [`Trade`]),
//! `GET trade?provider=&out_trade_no=`, `POST mode` (see [`Modes`]), `POST rotate`
//! (`{"drop_old": bool}`: a new platform key/certificate with a new serial signs from now on, the
//! old one stays listed unless dropped), `POST notify` (`{"out_trade_no", "provider"?}`: sends the
//! trade's signed notification and answers `{"status", "body"}` of the receiver).

// Part of this API is for the client tests the lead writes against it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use fitorder::providers::alipay::gateway;
use fitorder::providers::wechat::signing::{self, Merchant};
use fitorder::providers::{crypto, keys};
use rsa::{RsaPrivateKey, RsaPublicKey};
use serde_json::{json, Value};

/// What the two providers authenticate with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandInMode {
    /// WeChat signs with a 微信支付公钥 (`Wechatpay-Serial: PUB_KEY_ID_…`); Alipay with a bare key.
    PublicKey,
    /// WeChat platform certificates (`GET /v3/certificates`); Alipay public-key certificates
    /// (`app_cert_sn` + `alipay_root_cert_sn` required on requests, `alipay_cert_sn` on answers).
    Certificate,
}

/// Whether a test that needs an outside tool may run: true when it is there; otherwise a skip
/// message on a developer machine, and a failure when `CI=true`.
pub fn need(what: &str, check: impl FnOnce() -> Result<(), String>) -> bool {
    match check() {
        Ok(()) => true,
        Err(why) => {
            let hint = "install with: python3 -m pip install -r tests/sdk/requirements.txt; (cd tests/sdk && npm ci)";
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{what} is required under CI=true but missing: {why} ({hint})");
            }
            eprintln!("SKIPPED: {what} not available: {why} ({hint})");
            false
        }
    }
}

fn run_ok(cmd: &mut Command) -> Result<(), String> {
    match cmd.stdout(Stdio::null()).stderr(Stdio::null()).status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("{cmd:?} exited with {s}")),
        Err(e) => Err(format!("{cmd:?}: {e}")),
    }
}

/// python3 with `cryptography`, and openssl: what the stand-in needs.
pub fn standin_tools() -> Result<(), String> {
    run_ok(Command::new("python3").args(["-c", "import cryptography"]))?;
    run_ok(Command::new("openssl").arg("version"))
}

/// The root of the repository.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh scratch directory under the target dir.
pub fn scratch_dir(name: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A new RSA-2048 key made by openssl (PKCS#8 PEM at `path`, the public half next to it as
/// `<stem>_public.pem`); returns the private PEM.
pub fn make_rsa_key(path: &Path) -> String {
    let status = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(path)
        .stderr(Stdio::null())
        .status()
        .expect("openssl");
    assert!(status.success(), "openssl genpkey failed");
    let public = public_path(path);
    let status = Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(path)
        .arg("-out")
        .arg(&public)
        .status()
        .expect("openssl");
    assert!(status.success(), "openssl pkey -pubout failed");
    std::fs::read_to_string(path).unwrap()
}

fn public_path(private: &Path) -> PathBuf {
    let stem = private.file_stem().unwrap().to_string_lossy().replace("_key", "");
    private.with_file_name(format!("{stem}_public.pem"))
}

/// A running stand-in; killed on drop.
pub struct StandIn {
    process: crate::harness::Helper,
    port: u16,
    dir: PathBuf,
    pub mode: StandInMode,
    http: reqwest::Client,
}

/// A trade's state as the provider holds it (`POST /_standin/trade`). Amounts are in fen for
/// both providers (the stand-in writes Alipay's yuan strings). A trade the stand-in has not seen
/// is created (give `amount`, and `notify_url` if it is to be notified).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Trade {
    /// `wechat` or `alipay`.
    pub provider: String,
    pub out_trade_no: String,
    /// WeChat: SUCCESS / USERPAYING / NOTPAY / CLOSED / REFUND (also PAYERROR, REVOKED);
    /// Alipay: WAIT_BUYER_PAY / TRADE_SUCCESS / TRADE_CLOSED (also TRADE_FINISHED).
    pub state: String,
    /// WeChat `transaction_id` / Alipay `trade_no` (made up when paid and not given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transaction_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount: Option<i64>,
    /// Alipay: the total refunded, in fen (TRADE_SUCCESS + refund_fee is a partial refund,
    /// TRADE_CLOSED + refund_fee a full one, TRADE_CLOSED without it an unpaid close).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refund_fee: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notify_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub openid: Option<String>,
}

impl Trade {
    pub fn wechat(out_trade_no: &str, state: &str) -> Trade {
        Trade {
            provider: "wechat".into(),
            out_trade_no: out_trade_no.into(),
            state: state.into(),
            ..Trade::default()
        }
    }
    pub fn alipay(out_trade_no: &str, state: &str) -> Trade {
        Trade {
            provider: "alipay".into(),
            ..Trade::wechat(out_trade_no, state)
        }
    }
    pub fn amount(mut self, fen: i64) -> Trade {
        self.amount = Some(fen);
        self
    }
    pub fn transaction_id(mut self, id: &str) -> Trade {
        self.transaction_id = Some(id.into());
        self
    }
    pub fn refund_fee(mut self, fen: i64) -> Trade {
        self.refund_fee = Some(fen);
        self
    }
    pub fn notify_url(mut self, url: &str) -> Trade {
        self.notify_url = Some(url.into());
        self
    }
}

/// How the stand-in misbehaves (`POST /_standin/mode`); fields left `None` stay as they are.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Modes {
    /// Sign answers and notifications with a key nobody published (same serial).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wrong_key: Option<bool>,
    /// Name a serial (WeChat `Wechatpay-Serial`; Alipay `alipay_cert_sn` in certificate mode)
    /// that was never published, signing correctly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown_serial: Option<bool>,
    /// Wait this long before answering a provider call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
}

impl StandIn {
    /// Starts a stand-in, or `None` (with a skip message; a failure under `CI=true`) when
    /// python3 + cryptography or openssl are missing.
    pub fn start_or_skip(mode: StandInMode) -> Option<StandIn> {
        need("the provider stand-in (python3 + cryptography, openssl)", standin_tools).then(|| StandIn::start(mode))
    }

    /// Makes our keys, spawns `python3 tests/standin/provider.py` and waits for its port.
    pub fn start(mode: StandInMode) -> StandIn {
        let dir = scratch_dir("standin");
        make_rsa_key(&dir.join("merchant_key.pem"));
        make_rsa_key(&dir.join("app_key.pem"));
        let process = crate::harness::Helper::start(
            Command::new("python3")
                .arg(root().join("tests/standin/provider.py"))
                .arg("--dir")
                .arg(&dir)
                .arg("--mode")
                .arg(match mode {
                    StandInMode::PublicKey => "public-key",
                    StandInMode::Certificate => "certificate",
                })
                .arg("--merchant-public-key")
                .arg(dir.join("merchant_public.pem"))
                .arg("--app-public-key")
                .arg(dir.join("app_public.pem"))
                .stderr(Stdio::inherit()),
            "python3 tests/standin/provider.py",
        );
        // Not started (killed as `process` drops) when its first line names no port.
        let line = process.line(std::time::Duration::from_secs(60)).unwrap_or_default();
        let port = serde_json::from_str::<Value>(&line)
            .ok()
            .and_then(|v| v["port"].as_u64())
            .unwrap_or_else(|| panic!("the stand-in did not start (first line {line:?}); see its stderr above"))
            as u16;
        StandIn {
            process,
            port,
            dir,
            mode,
            http: reqwest::Client::new(),
        }
    }

    /// `http://127.0.0.1:<port>`: the WeChat Pay API base (paths start with `/v3/`).
    pub fn wechat_base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
    /// `http://127.0.0.1:<port>/gateway.do`: the Alipay gateway.
    pub fn alipay_gateway(&self) -> String {
        format!("http://127.0.0.1:{}/gateway.do", self.port)
    }
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// Our WeChat merchant API private key (PKCS#8 PEM).
    pub fn merchant_key_path(&self) -> PathBuf {
        self.dir.join("merchant_key.pem")
    }
    /// Our Alipay app private key (PKCS#8 PEM).
    pub fn app_key_path(&self) -> PathBuf {
        self.dir.join("app_key.pem")
    }
    pub fn merchant_key(&self) -> RsaPrivateKey {
        keys::parse_private_key(&std::fs::read_to_string(self.merchant_key_path()).unwrap()).unwrap()
    }
    pub fn app_key(&self) -> RsaPrivateKey {
        keys::parse_private_key(&std::fs::read_to_string(self.app_key_path()).unwrap()).unwrap()
    }
    /// `config.json` as it is now.
    pub fn config(&self) -> Value {
        serde_json::from_str(&std::fs::read_to_string(self.dir.join("config.json")).unwrap()).unwrap()
    }
    fn text(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap()
    }
    pub fn mch_id(&self) -> String {
        self.config()["wechat"]["mchid"].as_str().unwrap().into()
    }
    pub fn wechat_app_id(&self) -> String {
        self.config()["wechat"]["appid"].as_str().unwrap().into()
    }
    /// The serial of our merchant API certificate (`serial_no` in `Authorization`).
    pub fn merchant_serial(&self) -> String {
        self.text("wechat_merchant_serial.txt")
    }
    pub fn apiv3_key(&self) -> String {
        self.text("wechat_apiv3_key.txt")
    }
    /// The key that signs WeChat answers now, and the serial they name.
    pub fn wechat_public_key(&self) -> RsaPublicKey {
        keys::parse_public_key(&self.text("wechat_public_key.pem")).unwrap()
    }
    pub fn wechat_serial(&self) -> String {
        self.text("wechat_serial.txt")
    }
    pub fn alipay_app_id(&self) -> String {
        self.config()["alipay"]["app_id"].as_str().unwrap().into()
    }
    pub fn alipay_public_key(&self) -> RsaPublicKey {
        keys::parse_public_key(&self.text("alipay_public_key.pem")).unwrap()
    }
    /// Certificate mode: the SNs (`None` in public-key mode).
    pub fn alipay_cert_sn(&self) -> Option<String> {
        self.config()["alipay"]["alipay_cert_sn"].as_str().map(str::to_string)
    }
    pub fn app_cert_sn(&self) -> Option<String> {
        self.config()["alipay"]["app_cert_sn"].as_str().map(str::to_string)
    }
    pub fn alipay_root_cert_sn(&self) -> Option<String> {
        self.config()["alipay"]["alipay_root_cert_sn"]
            .as_str()
            .map(str::to_string)
    }

    async fn control(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let r = self
            .http
            .request(method, format!("{}/_standin/{path}", self.wechat_base()))
            .json(&body)
            .send()
            .await
            .expect("stand-in control API");
        let status = r.status();
        let v: Value = r.json().await.unwrap();
        assert!(status.is_success(), "stand-in /_standin/{path}: {status} {v}");
        v
    }
    /// Every provider request so far, oldest first, with its verification result.
    pub async fn requests(&self) -> Vec<Value> {
        match self.control(reqwest::Method::GET, "requests", json!({})).await {
            Value::Array(a) => a,
            v => panic!("requests: {v}"),
        }
    }
    pub async fn clear_requests(&self) {
        self.control(reqwest::Method::DELETE, "requests", json!({})).await;
    }
    /// Sets a trade's state; answers the stand-in's view of the trade.
    pub async fn set_trade(&self, t: Trade) -> Value {
        self.control(reqwest::Method::POST, "trade", serde_json::to_value(t).unwrap())
            .await
    }
    /// Changes the modes; answers all of them.
    pub async fn set_mode(&self, m: Modes) -> Value {
        self.control(reqwest::Method::POST, "mode", serde_json::to_value(m).unwrap())
            .await
    }
    /// A new platform key (certificate mode: certificate) with a new serial signs from now on;
    /// the old one stays listed in `/v3/certificates` unless `drop_old`.
    pub async fn rotate(&self, drop_old: bool) -> Value {
        self.control(reqwest::Method::POST, "rotate", json!({ "drop_old": drop_old }))
            .await
    }
    /// Money's hard cases (`POST /_standin/money`): `alipay_refund_pending` (new Alipay refunds
    /// answer `fund_change` N, the money moves when ended), `wechat_refund_hold` (WeChat refunds
    /// stay PROCESSING when queried), `pay_on_close` (trades the member pays just before a close).
    pub async fn money(&self, modes: Value) -> Value {
        self.control(reqwest::Method::POST, "money", modes).await
    }
    /// Ends a refund (`POST /_standin/refund`): `{"provider":"alipay","out_request_no"}` or
    /// `{"provider":"wechat","out_refund_no","status"}`.
    pub async fn end_refund(&self, refund: Value) -> Value {
        self.control(reqwest::Method::POST, "refund", refund).await
    }
    /// Certificate mode: Alipay renews its certificate (a new key under a new SN signs from
    /// now on); `trusted: false` issues it from a CA that is not the configured root. Answers
    /// the old and new SNs.
    pub async fn renew_alipay_cert(&self, trusted: bool) -> Value {
        self.control(
            reqwest::Method::POST,
            "renew_alipay_cert",
            json!({ "trusted": trusted }),
        )
        .await
    }
    /// Sends the trade's signed payment notification to its notify_url; the receiver's status
    /// (0 when unreachable) and body.
    pub async fn notify(&self, out_trade_no: &str) -> (u16, String) {
        let v = self
            .control(reqwest::Method::POST, "notify", json!({ "out_trade_no": out_trade_no }))
            .await;
        (
            v["status"].as_u64().unwrap() as u16,
            v["body"].as_str().unwrap_or_default().into(),
        )
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.process.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------- smoke test

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

async fn wechat_call(
    s: &StandIn,
    key: &RsaPrivateKey,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
    let (mch_id, serial) = (s.mch_id(), s.merchant_serial());
    let m = Merchant {
        mch_id: &mch_id,
        serial: &serial,
        key,
    };
    let nonce = crypto::nonce(32);
    let auth = signing::authorization(&m, method, path, now(), &nonce, body);
    let req = match method {
        "GET" => reqwest::Client::new().get(format!("{}{path}", s.wechat_base())),
        _ => reqwest::Client::new()
            .post(format!("{}{path}", s.wechat_base()))
            .header("Content-Type", "application/json")
            .body(body.to_string()),
    };
    let r = req
        .header("Authorization", auth)
        .header("Accept", "application/json")
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.bytes().await.unwrap().to_vec())
}

fn wechat_answer_verifies(s: &StandIn, headers: &reqwest::header::HeaderMap, body: &[u8]) -> bool {
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    h("Wechatpay-Serial") == s.wechat_serial()
        && crypto::verify(
            &s.wechat_public_key(),
            &signing::answer_message(&h("Wechatpay-Timestamp"), &h("Wechatpay-Nonce"), body),
            &h("Wechatpay-Signature"),
        )
}

#[tokio::test]
async fn standin_accepts_our_signed_calls_and_refuses_a_wrong_key() {
    let Some(s) = StandIn::start_or_skip(StandInMode::PublicKey) else {
        return;
    };
    let key = s.merchant_key();
    let expire = (chrono::Utc::now() + chrono::Duration::minutes(15))
        .with_timezone(&chrono::FixedOffset::east_opt(8 * 3600).unwrap())
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, false);
    let body = json!({
        "appid": s.wechat_app_id(), "mchid": s.mch_id(), "description": "私教课 10 节",
        "out_trade_no": "FO20261201SMOKE1", "time_expire": expire,
        "notify_url": "http://127.0.0.1:9/pay/wechat/notify", "amount": {"total": 100, "currency": "CNY"},
    })
    .to_string();

    // A signed Native prepay is accepted, and its answer verifies with the published key.
    let (status, headers, answer) = wechat_call(&s, &key, "POST", "/v3/pay/transactions/native", &body).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    assert!(wechat_answer_verifies(&s, &headers, &answer));
    assert!(s.wechat_serial().starts_with("PUB_KEY_ID_"));
    let v: Value = serde_json::from_slice(&answer).unwrap();
    assert!(
        v["code_url"]
            .as_str()
            .unwrap()
            .starts_with("weixin://wxpay/bizpayurl?pr="),
        "{v}"
    );
    // The same request again answers the same code; a different one with the same number is refused.
    let (_, _, again) = wechat_call(&s, &key, "POST", "/v3/pay/transactions/native", &body).await;
    assert_eq!(serde_json::from_slice::<Value>(&again).unwrap(), v);
    let other = body.replace("\"total\":100", "\"total\":200");
    let (status, _, refused) = wechat_call(&s, &key, "POST", "/v3/pay/transactions/native", &other).await;
    assert_eq!(
        (
            status,
            serde_json::from_slice::<Value>(&refused).unwrap()["code"].clone()
        ),
        (403, json!("OUT_TRADE_NO_USED"))
    );

    // A signature by another key is refused as WeChat does: 401 SIGN_ERROR, unsigned.
    let stranger = keys::parse_private_key(&make_rsa_key(&s.dir().join("stranger_key.pem"))).unwrap();
    let (status, headers, answer) = wechat_call(&s, &stranger, "POST", "/v3/pay/transactions/native", &body).await;
    assert_eq!(status, 401);
    assert_eq!(serde_json::from_slice::<Value>(&answer).unwrap()["code"], "SIGN_ERROR");
    assert!(headers.get("Wechatpay-Signature").is_none());

    // The trade paid: the query answers SUCCESS, signed; with the wrong-key mode it no longer verifies.
    s.set_trade(Trade::wechat("FO20261201SMOKE1", "SUCCESS").transaction_id("4200000000202612010000000001"))
        .await;
    let path = format!(
        "/v3/pay/transactions/out-trade-no/FO20261201SMOKE1?mchid={}",
        s.mch_id()
    );
    let (status, headers, answer) = wechat_call(&s, &key, "GET", &path, "").await;
    assert_eq!(status, 200);
    assert!(wechat_answer_verifies(&s, &headers, &answer));
    let v: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(
        (v["trade_state"].as_str(), v["amount"]["total"].as_i64()),
        (Some("SUCCESS"), Some(100))
    );
    assert_eq!(v["transaction_id"], "4200000000202612010000000001");
    s.set_mode(Modes {
        wrong_key: Some(true),
        ..Modes::default()
    })
    .await;
    let (_, headers, answer) = wechat_call(&s, &key, "GET", &path, "").await;
    assert!(!wechat_answer_verifies(&s, &headers, &answer));
    s.set_mode(Modes {
        wrong_key: Some(false),
        ..Modes::default()
    })
    .await;

    // Alipay: a precreate signed with the app key (sign_type signed) is accepted, a stranger's refused.
    for (key, accepted) in [(s.app_key(), true), (stranger, false)] {
        let mut params: Vec<(String, String)> = [
            ("app_id", s.alipay_app_id()),
            ("method", "alipay.trade.precreate".into()),
            ("charset", "utf-8".into()),
            ("sign_type", "RSA2".into()),
            ("timestamp", chrono::Utc::now().format("%Y-%m-%d %H:%M:%S").to_string()),
            ("version", "1.0".into()),
            ("notify_url", "http://127.0.0.1:9/pay/alipay/notify".into()),
            (
                "biz_content",
                json!({"out_trade_no": "FO20261201SMOKE2", "total_amount": "88.00", "subject": "会员卡"}).to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        gateway::sign_params(&key, &mut params);
        let text = reqwest::Client::new()
            .post(s.alipay_gateway())
            .header("Content-Type", "application/x-www-form-urlencoded;charset=utf-8")
            .body(gateway::encode(&params))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let v = gateway::verify_answer(&s.alipay_public_key(), None, "alipay.trade.precreate", &text).unwrap();
        if accepted {
            assert_eq!(v["code"], "10000", "{text}");
            assert!(v["qr_code"].as_str().unwrap().starts_with("https://qr.alipay.com/"));
        } else {
            assert_eq!(
                (v["code"].as_str(), v["sub_code"].as_str()),
                (Some("40002"), Some("isv.invalid-signature"))
            );
        }
    }

    let log = s.requests().await;
    let verified: Vec<bool> = log.iter().map(|r| r["verified"].as_bool().unwrap()).collect();
    assert_eq!(verified, [true, true, true, false, true, true, true, false], "{log:#?}");
    assert_eq!(
        log[3]["error"].as_str().map(|e| e.starts_with("SIGN_ERROR")),
        Some(true)
    );
}

fn alipay_params(s: &StandIn, method: &str, biz: Value, with_sns: bool) -> Vec<(String, String)> {
    let mut p: Vec<(String, String)> = [
        ("app_id", s.alipay_app_id()),
        ("method", method.into()),
        ("charset", "utf-8".into()),
        ("sign_type", "RSA2".into()),
        ("timestamp", chrono::Utc::now().format("%Y-%m-%d %H:%M:%S").to_string()),
        ("version", "1.0".into()),
        ("biz_content", biz.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if with_sns {
        p.push(("app_cert_sn".into(), s.app_cert_sn().unwrap()));
        p.push(("alipay_root_cert_sn".into(), s.alipay_root_cert_sn().unwrap()));
    }
    gateway::sign_params(&s.app_key(), &mut p);
    p
}

async fn alipay_call(s: &StandIn, params: &[(String, String)]) -> String {
    reqwest::Client::new()
        .post(s.alipay_gateway())
        .header("Content-Type", "application/x-www-form-urlencoded;charset=utf-8")
        .body(gateway::encode(params))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn standin_certificate_mode_wants_the_sns_and_names_its_own() {
    let Some(s) = StandIn::start_or_skip(StandInMode::Certificate) else {
        return;
    };
    let (public, sn) = (s.alipay_public_key(), s.alipay_cert_sn().unwrap());
    let biz = json!({"out_trade_no": "FO20261201CERT1", "total_amount": "0.01", "subject": "团课"});
    let text = alipay_call(&s, &alipay_params(&s, "alipay.trade.precreate", biz.clone(), true)).await;
    let v = gateway::verify_answer(&public, Some(&sn), "alipay.trade.precreate", &text).unwrap();
    assert_eq!(v["code"], "10000", "{text}");
    // Without the SNs the gateway refuses (still a signed answer).
    let text = alipay_call(&s, &alipay_params(&s, "alipay.trade.precreate", biz, false)).await;
    let v = gateway::verify_answer(&public, Some(&sn), "alipay.trade.precreate", &text).unwrap();
    assert_eq!(v["sub_code"], "isv.app-cert-not-exist", "{text}");
    // An answer naming another certificate.
    s.set_mode(Modes {
        unknown_serial: Some(true),
        latency_ms: Some(300),
        ..Modes::default()
    })
    .await;
    let started = std::time::Instant::now();
    let query = alipay_params(
        &s,
        "alipay.trade.query",
        json!({"out_trade_no": "FO20261201CERT1"}),
        true,
    );
    let text = alipay_call(&s, &query).await;
    assert!(started.elapsed() >= std::time::Duration::from_millis(300));
    assert!(matches!(
        gateway::verify_answer(&public, Some(&sn), "alipay.trade.query", &text),
        Err(gateway::AnswerError::WrongCertificate { .. })
    ));

    // WeChat: the platform certificate names the serial the answers carry; after a rotation
    // both are listed and the new one signs.
    let (old, key) = (s.wechat_serial(), s.merchant_key());
    assert_eq!(old.len(), 40);
    s.set_mode(Modes {
        unknown_serial: Some(false),
        latency_ms: Some(0),
        ..Modes::default()
    })
    .await;
    let rotated = s.rotate(false).await;
    assert_eq!(rotated["serials"], json!([old, s.wechat_serial()]));
    let (status, headers, answer) = wechat_call(&s, &key, "GET", "/v3/certificates", "").await;
    assert_eq!(status, 200);
    assert!(wechat_answer_verifies(&s, &headers, &answer));
    let listed: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(listed["data"].as_array().unwrap().len(), 2);
    assert_eq!(
        listed["data"][1]["encrypt_certificate"]["associated_data"],
        "certificate"
    );
}
