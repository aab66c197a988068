//! WeChat Pay API v3's configuration, loaded whole ([`WechatKeys`]).

use anyhow::Result;
use rsa::RsaPrivateKey;

use super::refresh::SharedKeyring;
use crate::config::WechatPayConfig;
use crate::keys::{check_base, read_private, read_public, whole};

/// WeChat Pay API v3, configured whole.
pub struct WechatKeys {
    pub mch_id: String,
    /// The appid JSAPI, Native and H5 trades are made under (mini program or official account).
    pub app_id: String,
    /// The appid `WECHAT_APP` trades are made under (`WECHATPAY_MOBILE_APP_ID`, default `app_id`).
    pub mobile_app_id: String,
    /// Decrypts notification resources and downloaded certificates.
    pub apiv3_key: [u8; 32],
    /// Signs every API call and the client pay parameters.
    pub merchant_key: RsaPrivateKey,
    pub merchant_serial: String,
    /// The keys that verify WeChat Pay's answers and notifications, chosen by `Wechatpay-Serial`:
    /// the 微信支付公钥 and the platform certificates (kept in the database, shared by instances).
    pub platform: SharedKeyring,
    pub api_base: String,
}

impl WechatKeys {
    /// The appids fitorder's trades are made under: a payment notification naming another is
    /// not ours.
    pub fn app_ids(&self) -> Vec<&str> {
        // The mini program / official account's, and the mobile app's (`WECHAT_APP` trades).
        vec![self.app_id.as_str(), self.mobile_app_id.as_str()]
    }
}

impl WechatKeys {
    /// Whether platform certificates are fetched on the 12-hour schedule: without a 微信支付公钥,
    /// or while certificates are in use beside it (a switch in progress: some answer or
    /// notification named one). An unknown serial fetches them in every mode.
    pub fn downloads_certificates(&self) -> bool {
        let ring = self.platform.snapshot();
        ring.public_key().is_none() || !ring.cert_serials().is_empty()
    }

    /// The appid a trade on `channel` is made under.
    pub fn app_id_for(&self, channel: crate::domain::payment::PayChannel) -> &str {
        if channel == crate::domain::payment::PayChannel::WechatApp {
            &self.mobile_app_id
        } else {
            &self.app_id
        }
    }

    /// The `Wechatpay-Serial` a request carries: the platform key fitorder verifies with — the
    /// 微信支付公钥's ID when one is configured, else the newest platform certificate's serial;
    /// None before any key is known (the first `/v3/certificates`). During WeChat's switch the
    /// answers follow the serial the request named.
    pub fn request_serial(&self) -> Option<String> {
        let ring = self.platform.snapshot();
        if let Some((id, _)) = ring.public_key() {
            return Some(id.to_string());
        }
        ring.newest_cert().map(|c| c.serial_no.to_ascii_uppercase())
    }

    pub fn load(w: &WechatPayConfig) -> Result<Option<WechatKeys>> {
        let configured = whole(
            "WeChat Pay",
            &[
                ("WECHATPAY_MCH_ID", w.mch_id.is_some()),
                ("WECHATPAY_APP_ID", w.app_id.is_some()),
                ("WECHATPAY_APIV3_KEY", w.apiv3_key.is_some()),
                ("WECHATPAY_MCH_PRIVATE_KEY", w.merchant_private_key.is_some()),
                ("WECHATPAY_MCH_SERIAL", w.merchant_serial.is_some()),
            ],
        )?;
        anyhow::ensure!(
            w.platform_public_key.is_some() == w.public_key_id.is_some(),
            "WECHATPAY_PLATFORM_PUBLIC_KEY and WECHATPAY_PUBLIC_KEY_ID go together (or neither, to download platform certificates)"
        );
        if !configured {
            anyhow::ensure!(
                w.platform_public_key.is_none(),
                "WECHATPAY_PLATFORM_PUBLIC_KEY is set but WeChat Pay is not: set WECHATPAY_MCH_ID, WECHATPAY_APP_ID, WECHATPAY_APIV3_KEY, WECHATPAY_MCH_PRIVATE_KEY and WECHATPAY_MCH_SERIAL"
            );
            return Ok(None);
        }
        let (Some(mch_id), Some(app_id), Some(apiv3), Some(key_path), Some(serial)) = (
            &w.mch_id,
            &w.app_id,
            &w.apiv3_key,
            &w.merchant_private_key,
            &w.merchant_serial,
        ) else {
            unreachable!("checked whole above")
        };
        let apiv3_key: [u8; 32] = crate::config::ExposeSecret::expose_secret(apiv3)
            .as_bytes()
            .try_into()
            .map_err(|_| anyhow::anyhow!("WECHATPAY_APIV3_KEY must be 32 bytes of text"))?;
        let public_key = match (&w.public_key_id, &w.platform_public_key) {
            (Some(id), Some(path)) => Some((id.clone(), read_public(path, "WECHATPAY_PLATFORM_PUBLIC_KEY")?)),
            _ => None,
        };
        let platform = SharedKeyring::new(public_key);
        check_base("WECHATPAY_API_BASE", &w.api_base)?;
        Ok(Some(WechatKeys {
            mch_id: mch_id.clone(),
            app_id: app_id.clone(),
            mobile_app_id: w.mobile_app_id.clone().unwrap_or_else(|| app_id.clone()),
            apiv3_key,
            merchant_key: read_private(key_path, "WECHATPAY_MCH_PRIVATE_KEY")?,
            merchant_serial: serial.clone(),
            platform,
            api_base: w.api_base.trim_end_matches('/').to_string(),
        }))
    }
}
