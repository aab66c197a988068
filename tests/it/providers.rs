//! Test providers: RSA keys made here (once per run), written where the configuration expects
//! them, and sandboxes that sign and encrypt notifications exactly as the providers do.

use fitorder::config::ExposeSecret;
use std::sync::OnceLock;

use fitorder::config::Config;
use fitorder::dev::sandbox::{AlipaySandbox, WechatSandbox};
use rsa::pkcs8::{EncodePublicKey, LineEnding};
use rsa::RsaPrivateKey;

pub const MCH_ID: &str = "1900000109";
pub const APIV3_KEY: &str = "0123456789abcdefghijABCDEFGHIJ01";
pub const APP_ID: &str = "2021000000000001";

struct Keys {
    wechat: RsaPrivateKey,
    alipay: RsaPrivateKey,
    /// Our side's keys: the WeChat Pay merchant key and the Alipay app key.
    merchant: RsaPrivateKey,
    dir: std::path::PathBuf,
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let mut rng = rand_core::OsRng;
        let wechat = RsaPrivateKey::new(&mut rng, 2048).unwrap();
        let alipay = RsaPrivateKey::new(&mut rng, 2048).unwrap();
        let merchant = RsaPrivateKey::new(&mut rng, 2048).unwrap();
        let dir = std::env::temp_dir().join(format!("fitorder-test-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("wechat.pem"),
            wechat.to_public_key().to_public_key_pem(LineEnding::LF).unwrap(),
        )
        .unwrap();
        std::fs::write(
            dir.join("alipay.pem"),
            alipay.to_public_key().to_public_key_pem(LineEnding::LF).unwrap(),
        )
        .unwrap();
        {
            use rsa::pkcs8::EncodePrivateKey;
            std::fs::write(
                dir.join("merchant.pem"),
                merchant.to_pkcs8_pem(LineEnding::LF).unwrap().as_bytes(),
            )
            .unwrap();
        }
        Keys {
            wechat,
            alipay,
            merchant,
            dir,
        }
    })
}

/// Configures both providers whole with the test keys (the API bases are left as they are:
/// a TestApp points them at its sandbox).
pub fn configure(c: &mut Config) {
    let k = keys();
    c.wechatpay.mch_id = Some(MCH_ID.into());
    // The tests' requests come through a load balancer on loopback (`TestApp::post`).
    c.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    c.wechatpay.app_id = Some(WECHAT_APP_ID.into());
    c.wechatpay.mobile_app_id = Some(WECHAT_MOBILE_APP_ID.into());
    c.wechatpay.apiv3_key = Some(APIV3_KEY.into());
    c.wechatpay.platform_public_key = Some(k.dir.join("wechat.pem"));
    c.wechatpay.public_key_id = Some(WECHAT_PUBLIC_KEY_ID.into());
    c.wechatpay.merchant_private_key = Some(k.dir.join("merchant.pem"));
    c.wechatpay.merchant_serial = Some(MERCHANT_SERIAL.into());
    c.alipay.app_id = Some(APP_ID.into());
    c.alipay.public_key = Some(k.dir.join("alipay.pem"));
    c.alipay.app_private_key = Some(k.dir.join("merchant.pem"));
}

/// The environment variables that configure `c`'s providers, for a `fitorder` process.
pub fn env_of(c: &Config) -> Vec<(String, String)> {
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
    let (w, a) = (&c.wechatpay, &c.alipay);
    [
        ("WECHATPAY_MCH_ID", w.mch_id.clone()),
        ("WECHATPAY_APP_ID", w.app_id.clone()),
        ("WECHATPAY_MOBILE_APP_ID", w.mobile_app_id.clone()),
        (
            "WECHATPAY_APIV3_KEY",
            w.apiv3_key.as_ref().map(|k| k.expose_secret().to_string()),
        ),
        ("WECHATPAY_MCH_PRIVATE_KEY", path(&w.merchant_private_key)),
        ("WECHATPAY_MCH_SERIAL", w.merchant_serial.clone()),
        ("WECHATPAY_PLATFORM_PUBLIC_KEY", path(&w.platform_public_key)),
        ("WECHATPAY_PUBLIC_KEY_ID", w.public_key_id.clone()),
        ("WECHATPAY_API_BASE", Some(w.api_base.clone())),
        ("ALIPAY_APP_ID", a.app_id.clone()),
        ("ALIPAY_APP_PRIVATE_KEY", path(&a.app_private_key)),
        ("ALIPAY_PUBLIC_KEY", path(&a.public_key)),
        ("ALIPAY_API_BASE", Some(a.api_base.clone())),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
    .collect()
}

/// No providers at all (their callbacks answer 503, online orders are refused).
pub fn unconfigure(c: &mut Config) {
    c.wechatpay = Default::default();
    c.alipay = Default::default();
}

pub fn unconfigure_alipay(c: &mut Config) {
    c.alipay = Default::default();
}

pub fn wechat_platform_private() -> RsaPrivateKey {
    keys().wechat.clone()
}

pub fn alipay_private() -> RsaPrivateKey {
    keys().alipay.clone()
}

pub fn wechat() -> WechatSandbox {
    WechatSandbox {
        platform_key: keys().wechat.clone(),
        apiv3_key: APIV3_KEY.as_bytes().try_into().unwrap(),
        mch_id: MCH_ID.into(),
        serial: WECHAT_PUBLIC_KEY_ID.into(),
        app_id: WECHAT_APP_ID.into(),
    }
}

pub fn alipay() -> AlipaySandbox {
    AlipaySandbox {
        alipay_key: keys().alipay.clone(),
        app_id: APP_ID.into(),
    }
}

/// The private key of the WeChat sandbox in PKCS#8 PEM, for cross-checks with openssl.
pub fn wechat_private_pem() -> String {
    use rsa::pkcs8::EncodePrivateKey;
    keys().wechat.to_pkcs8_pem(LineEnding::LF).unwrap().to_string()
}

/// Also points refunds at `base` (a fake provider API), signed with our merchant key.
pub fn configure_refunds(c: &mut Config, wechat_base: &str, alipay_gateway: &str) {
    configure(c);
    c.wechatpay.api_base = wechat_base.into();
    c.alipay.api_base = alipay_gateway.into();
}

pub fn merchant_public() -> rsa::RsaPublicKey {
    keys().merchant.to_public_key()
}

pub const WECHAT_APP_ID: &str = "wxd678efh567hg6787";
/// The mobile app's appid (`WECHAT_APP` trades), another than the mini program's.
pub const WECHAT_MOBILE_APP_ID: &str = "wx8888888888888888";
pub const MERCHANT_SERIAL: &str = "MERCHANT-SERIAL-1";
pub const WECHAT_PUBLIC_KEY_ID: &str = "PUB_KEY_ID_0000000000000024101100397200000006";

/// The sandbox provider's keys: it signs as the test providers above (so an app configured
/// with [`configure`] believes it) and checks our calls with the merchant/app public key.
pub fn sandbox_keys() -> fitorder::dev::sandbox_server::SandboxKeys {
    let k = keys();
    fitorder::dev::sandbox_server::SandboxKeys {
        mch_id: MCH_ID.into(),
        wechat_app_id: WECHAT_APP_ID.into(),
        wechat_mobile_app_id: WECHAT_MOBILE_APP_ID.into(),
        apiv3_key: APIV3_KEY.as_bytes().try_into().unwrap(),
        wechat_platform_key: k.wechat.clone(),
        wechat_public_key_id: WECHAT_PUBLIC_KEY_ID.into(),
        merchant_public_key: k.merchant.to_public_key(),
        merchant_serial: MERCHANT_SERIAL.into(),
        alipay_app_id: APP_ID.into(),
        alipay_key: k.alipay.clone(),
        app_public_key: k.merchant.to_public_key(),
    }
}

/// Our side's private key (WeChat Pay merchant key and Alipay app key alike).
pub fn merchant_private() -> RsaPrivateKey {
    keys().merchant.clone()
}

/// The public keys our client would verify the sandbox's answers with.
pub fn wechat_platform_public() -> rsa::RsaPublicKey {
    keys().wechat.to_public_key()
}

pub fn alipay_public() -> rsa::RsaPublicKey {
    keys().alipay.to_public_key()
}
