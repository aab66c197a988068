//! Dev-mode provider keys: with no provider configured and no DATABASE_URL, fitorder makes
//! both sides' key pairs under `./.fitorder/dev-keys` — the providers' (which the development
//! sandbox signs answers and notifications with) and fitorder's own (which sign its calls) —
//! so an order can be paid end to end on a laptop.
//!
//! Files in the directory (each private key in PKCS#8 PEM, its public key beside it as
//! `*.pub.pem`, made on first use and kept):
//!
//! | file | whose | what it signs | who verifies with the `.pub.pem` |
//! | --- | --- | --- | --- |
//! | `wechatpay-platform.pem` | WeChat Pay's "微信支付公钥" key | answers, notifications | fitorder (`WECHATPAY_PLATFORM_PUBLIC_KEY`) |
//! | `alipay.pem` | Alipay's key | answers, notifications | fitorder (`ALIPAY_PUBLIC_KEY`) |
//! | `wechatpay-merchant.pem` | fitorder's WeChat Pay merchant API key | `Authorization`, pay parameters | the sandbox (`WECHATPAY_MCH_PRIVATE_KEY` is this file) |
//! | `alipay-app.pem` | fitorder's Alipay app key | gateway requests, order strings | the sandbox (`ALIPAY_APP_PRIVATE_KEY` is this file) |
//! | `apiv3.key` | shared | the APIv3 key (32 letters) | both |
//!
//! The identities: [`DEV_MCH_ID`], [`DEV_WECHAT_APP_ID`], [`DEV_MERCHANT_SERIAL`],
//! [`DEV_WECHAT_PUBLIC_KEY_ID`], [`DEV_APP_ID`] (Alipay). [`dev_sandbox_keys`] gives the
//! sandbox provider its side.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rsa::pkcs8::{DecodePrivateKey, EncodePrivateKey, EncodePublicKey, LineEnding};
use rsa::RsaPrivateKey;

use super::sandbox::{AlipaySandbox, WechatSandbox};
use super::sandbox_server::{SandboxKeys, SandboxProvider};
use crate::config::Config;

pub const DEV_MCH_ID: &str = "1900000109";
/// The Alipay app id.
pub const DEV_APP_ID: &str = "2021000000000000";
/// The WeChat appid trades are made under (`WECHATPAY_APP_ID`).
pub const DEV_WECHAT_APP_ID: &str = "wx0f1704de00000001";
/// The serial of the merchant API certificate (`WECHATPAY_MCH_SERIAL`).
pub const DEV_MERCHANT_SERIAL: &str = "3775B6A45ACD588826D15E583A95F5DD0DE7A0F0";
/// The id of the dev "微信支付公钥" (`WECHATPAY_PUBLIC_KEY_ID`), sent as `Wechatpay-Serial`.
pub const DEV_WECHAT_PUBLIC_KEY_ID: &str = "PUB_KEY_ID_0119000001092026120100000000000001";

pub const WECHAT_PLATFORM_KEY_FILE: &str = "wechatpay-platform.pem";
pub const ALIPAY_KEY_FILE: &str = "alipay.pem";
pub const WECHAT_MERCHANT_KEY_FILE: &str = "wechatpay-merchant.pem";
pub const ALIPAY_APP_KEY_FILE: &str = "alipay-app.pem";

pub struct DevKeys {
    pub dir: PathBuf,
    /// WeChat Pay's platform ("微信支付公钥") private key.
    pub wechat: RsaPrivateKey,
    /// Alipay's private key.
    pub alipay: RsaPrivateKey,
    pub apiv3_key: String,
    /// fitorder's WeChat Pay merchant API key.
    pub merchant: RsaPrivateKey,
    /// fitorder's Alipay app key.
    pub alipay_app: RsaPrivateKey,
}

fn load_or_make(path: &Path) -> Result<RsaPrivateKey> {
    if let Ok(text) = std::fs::read_to_string(path) {
        return RsaPrivateKey::from_pkcs8_pem(&text).with_context(|| format!("parsing {}", path.display()));
    }
    let key = RsaPrivateKey::new(&mut rand_core::OsRng, 2048)?;
    std::fs::write(path, key.to_pkcs8_pem(LineEnding::LF)?.as_bytes())?;
    std::fs::write(
        path.with_extension("pub.pem"),
        key.to_public_key().to_public_key_pem(LineEnding::LF)?,
    )?;
    Ok(key)
}

impl DevKeys {
    pub fn ensure(dir: &Path) -> Result<DevKeys> {
        std::fs::create_dir_all(dir)?;
        let apiv3_path = dir.join("apiv3.key");
        let apiv3_key = match std::fs::read_to_string(&apiv3_path) {
            Ok(k) if k.trim().len() == 32 => k.trim().to_string(),
            _ => {
                use rand::Rng;
                let key: String = (0..32)
                    .map(|_| char::from(rand::rng().random_range(b'a'..=b'z')))
                    .collect();
                std::fs::write(&apiv3_path, &key)?;
                key
            }
        };
        Ok(DevKeys {
            dir: dir.to_path_buf(),
            wechat: load_or_make(&dir.join(WECHAT_PLATFORM_KEY_FILE))?,
            alipay: load_or_make(&dir.join(ALIPAY_KEY_FILE))?,
            apiv3_key,
            merchant: load_or_make(&dir.join(WECHAT_MERCHANT_KEY_FILE))?,
            alipay_app: load_or_make(&dir.join(ALIPAY_APP_KEY_FILE))?,
        })
    }

    /// The merchant API private key fitorder signs WeChat Pay calls with (PEM).
    pub fn merchant_key_path(&self) -> PathBuf {
        self.dir.join(WECHAT_MERCHANT_KEY_FILE)
    }

    /// The app private key fitorder signs Alipay requests with (PEM).
    pub fn alipay_app_key_path(&self) -> PathBuf {
        self.dir.join(ALIPAY_APP_KEY_FILE)
    }

    /// Configures both providers whole against a running sandbox (`SandboxProvider::wechat_api_base`
    /// and `alipay_gateway`): its public keys verify, the dev merchant and app keys sign.
    pub fn configure_sandbox(&self, config: &mut Config, wechat_api_base: &str, alipay_gateway: &str) {
        self.configure(config);
        config.wechatpay.app_id = Some(DEV_WECHAT_APP_ID.into());
        config.wechatpay.public_key_id = Some(DEV_WECHAT_PUBLIC_KEY_ID.into());
        config.wechatpay.api_base = wechat_api_base.into();
        config.wechatpay.merchant_private_key = Some(self.merchant_key_path());
        config.wechatpay.merchant_serial = Some(DEV_MERCHANT_SERIAL.into());
        config.alipay.api_base = alipay_gateway.into();
        config.alipay.app_private_key = Some(self.alipay_app_key_path());
    }

    /// Development mode in one call: starts the sandbox provider with these keys on `addr`
    /// (`127.0.0.1:0` for any free port) and configures both providers whole against it. Keep
    /// the handle for as long as the server runs (the sandbox stops when it is dropped).
    pub async fn start_sandbox(&self, config: &mut Config, addr: &str) -> Result<SandboxProvider> {
        let sandbox = SandboxProvider::start(dev_sandbox_keys(self), addr).await?;
        self.configure_sandbox(config, &sandbox.wechat_api_base(), &sandbox.alipay_gateway());
        Ok(sandbox)
    }

    /// The environment that configures a `fitorder` process as [`DevKeys::configure_sandbox`]
    /// does (absolute paths), for `fitorder sandbox-provider`.
    pub fn sandbox_env(&self, wechat_api_base: &str, alipay_gateway: &str) -> Vec<(&'static str, String)> {
        let dir = std::fs::canonicalize(&self.dir).unwrap_or_else(|_| self.dir.clone());
        let path = |name: &str| dir.join(name).display().to_string();
        vec![
            ("WECHATPAY_MCH_ID", DEV_MCH_ID.into()),
            ("WECHATPAY_APP_ID", DEV_WECHAT_APP_ID.into()),
            ("WECHATPAY_APIV3_KEY", self.apiv3_key.clone()),
            ("WECHATPAY_MCH_PRIVATE_KEY", path(WECHAT_MERCHANT_KEY_FILE)),
            ("WECHATPAY_MCH_SERIAL", DEV_MERCHANT_SERIAL.into()),
            ("WECHATPAY_PLATFORM_PUBLIC_KEY", path("wechatpay-platform.pub.pem")),
            ("WECHATPAY_PUBLIC_KEY_ID", DEV_WECHAT_PUBLIC_KEY_ID.into()),
            ("WECHATPAY_API_BASE", wechat_api_base.into()),
            ("ALIPAY_APP_ID", DEV_APP_ID.into()),
            ("ALIPAY_APP_PRIVATE_KEY", path(ALIPAY_APP_KEY_FILE)),
            ("ALIPAY_PUBLIC_KEY", path("alipay.pub.pem")),
            ("ALIPAY_API_BASE", alipay_gateway.into()),
        ]
    }

    /// Points `config`'s callbacks at the dev keys.
    pub fn configure(&self, config: &mut Config) {
        config.wechatpay.mch_id = Some(DEV_MCH_ID.into());
        config.wechatpay.apiv3_key = Some(self.apiv3_key.clone().into());
        config.wechatpay.platform_public_key = Some(self.dir.join("wechatpay-platform.pub.pem"));
        config.alipay.app_id = Some(DEV_APP_ID.into());
        config.alipay.public_key = Some(self.dir.join("alipay.pub.pem"));
    }

    pub fn wechat(&self) -> WechatSandbox {
        WechatSandbox {
            platform_key: self.wechat.clone(),
            apiv3_key: self.apiv3_key.as_bytes().try_into().expect("32 bytes"),
            mch_id: DEV_MCH_ID.into(),
            serial: DEV_WECHAT_PUBLIC_KEY_ID.into(),
            app_id: DEV_WECHAT_APP_ID.into(),
        }
    }

    pub fn alipay(&self) -> AlipaySandbox {
        AlipaySandbox {
            alipay_key: self.alipay.clone(),
            app_id: DEV_APP_ID.into(),
        }
    }
}

/// The sandbox provider's side of the dev keys: it signs as WeChat Pay and Alipay and checks
/// fitorder's calls with the dev merchant and app public keys.
pub fn dev_sandbox_keys(keys: &DevKeys) -> SandboxKeys {
    SandboxKeys {
        mch_id: DEV_MCH_ID.into(),
        wechat_app_id: DEV_WECHAT_APP_ID.into(),
        wechat_mobile_app_id: DEV_WECHAT_APP_ID.into(),
        apiv3_key: keys.apiv3_key.as_bytes().try_into().expect("32 bytes"),
        wechat_platform_key: keys.wechat.clone(),
        wechat_public_key_id: DEV_WECHAT_PUBLIC_KEY_ID.into(),
        merchant_public_key: keys.merchant.to_public_key(),
        merchant_serial: DEV_MERCHANT_SERIAL.into(),
        alipay_app_id: DEV_APP_ID.into(),
        alipay_key: keys.alipay.clone(),
        app_public_key: keys.alipay_app.to_public_key(),
    }
}
