//! Dev-mode provider keys: with no provider configured and no DATABASE_URL, fitorder makes a
//! WeChat Pay and an Alipay key pair under `./.fitorder/dev-keys` and accepts notifications
//! signed with them, so `fitorder simulate-payment` can pay an order end to end on a laptop.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rsa::pkcs8::{DecodePrivateKey, EncodePrivateKey, EncodePublicKey, LineEnding};
use rsa::RsaPrivateKey;

use super::sandbox::{AlipaySandbox, WechatSandbox};
use crate::config::Config;

pub const DEV_MCH_ID: &str = "1900000109";
pub const DEV_APP_ID: &str = "2021000000000000";

pub struct DevKeys {
    pub dir: PathBuf,
    pub wechat: RsaPrivateKey,
    pub alipay: RsaPrivateKey,
    pub apiv3_key: String,
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
            wechat: load_or_make(&dir.join("wechatpay-platform.pem"))?,
            alipay: load_or_make(&dir.join("alipay.pem"))?,
            apiv3_key,
        })
    }

    /// Points `config`'s callbacks at the dev keys.
    pub fn configure(&self, config: &mut Config) {
        config.wechatpay.mch_id = Some(DEV_MCH_ID.into());
        config.wechatpay.apiv3_key = Some(self.apiv3_key.clone());
        config.wechatpay.platform_public_key = Some(self.dir.join("wechatpay-platform.pub.pem"));
        config.alipay.app_id = Some(DEV_APP_ID.into());
        config.alipay.public_key = Some(self.dir.join("alipay.pub.pem"));
    }

    pub fn wechat(&self) -> WechatSandbox {
        WechatSandbox {
            platform_key: self.wechat.clone(),
            apiv3_key: self.apiv3_key.as_bytes().try_into().expect("32 bytes"),
            mch_id: DEV_MCH_ID.into(),
            serial: "DEV-PLATFORM-SERIAL".into(),
        }
    }

    pub fn alipay(&self) -> AlipaySandbox {
        AlipaySandbox {
            alipay_key: self.alipay.clone(),
            app_id: DEV_APP_ID.into(),
        }
    }
}
