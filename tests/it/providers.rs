//! Test providers: RSA keys made here (once per run), written where the configuration expects
//! them, and sandboxes that sign and encrypt notifications exactly as the providers do.

use std::sync::OnceLock;

use fitorder::config::Config;
use fitorder::payments::sandbox::{AlipaySandbox, WechatSandbox};
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

/// Points the configuration at the test providers' public keys.
pub fn configure(c: &mut Config) {
    let k = keys();
    c.wechatpay.mch_id = Some(MCH_ID.into());
    c.wechatpay.apiv3_key = Some(APIV3_KEY.into());
    c.wechatpay.platform_public_key = Some(k.dir.join("wechat.pem"));
    c.alipay.app_id = Some(APP_ID.into());
    c.alipay.public_key = Some(k.dir.join("alipay.pem"));
}

pub fn wechat() -> WechatSandbox {
    WechatSandbox {
        platform_key: keys().wechat.clone(),
        apiv3_key: APIV3_KEY.as_bytes().try_into().unwrap(),
        mch_id: MCH_ID.into(),
        serial: "5157F09EFDC096DE15EBE81A47057A7232F1B8E1".into(),
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
    let k = keys();
    c.wechatpay.api_base = wechat_base.into();
    c.wechatpay.merchant_private_key = Some(k.dir.join("merchant.pem"));
    c.wechatpay.merchant_serial = Some("MERCHANT-SERIAL-1".into());
    c.alipay.api_base = alipay_gateway.into();
    c.alipay.app_private_key = Some(k.dir.join("merchant.pem"));
}

pub fn merchant_public() -> rsa::RsaPublicKey {
    keys().merchant.to_public_key()
}
