//! The providers' keys, loaded once at start.

use std::path::Path;

use anyhow::{Context, Result};
use rsa::pkcs1::DecodeRsaPrivateKey;
use rsa::pkcs1::DecodeRsaPublicKey;
use rsa::pkcs8::DecodePrivateKey;
use rsa::pkcs8::DecodePublicKey;
use rsa::{RsaPrivateKey, RsaPublicKey};

use crate::config::Config;

/// WeChat Pay API v3: the platform public key (verifies notifications) and the APIv3 key
/// (decrypts their resources).
#[derive(Clone)]
pub struct WechatKeys {
    pub mch_id: String,
    pub apiv3_key: [u8; 32],
    pub platform_public_key: RsaPublicKey,
    /// Signs calls to the API (refunds, queries); without it those are simulated.
    pub merchant_key: Option<RsaPrivateKey>,
    pub merchant_serial: Option<String>,
}

/// Alipay: the app id notifications must name and the Alipay public key that signs them.
#[derive(Clone)]
pub struct AlipayKeys {
    pub app_id: String,
    pub public_key: RsaPublicKey,
    /// Signs gateway calls (refunds, queries); without it those are simulated.
    pub app_private_key: Option<RsaPrivateKey>,
}

#[derive(Clone, Default)]
pub struct ProviderKeys {
    pub wechat: Option<WechatKeys>,
    pub alipay: Option<AlipayKeys>,
}

/// Reads an RSA public key in PEM (`PUBLIC KEY` or `RSA PUBLIC KEY`), or a bare base64 body
/// as Alipay's console hands it out.
pub fn parse_public_key(text: &str) -> Result<RsaPublicKey> {
    let text = text.trim();
    if text.contains("BEGIN RSA PUBLIC KEY") {
        return RsaPublicKey::from_pkcs1_pem(text).context("not an RSA PUBLIC KEY PEM");
    }
    if text.contains("BEGIN PUBLIC KEY") {
        return RsaPublicKey::from_public_key_pem(text).context("not a PUBLIC KEY PEM");
    }
    use base64::Engine;
    let der = base64::engine::general_purpose::STANDARD
        .decode(text.split_whitespace().collect::<String>())
        .context("neither PEM nor base64")?;
    RsaPublicKey::from_public_key_der(&der).context("not an RSA public key")
}

/// Reads an RSA private key in PEM (`PRIVATE KEY` or `RSA PRIVATE KEY`).
pub fn parse_private_key(text: &str) -> Result<RsaPrivateKey> {
    let text = text.trim();
    if text.contains("BEGIN RSA PRIVATE KEY") {
        return RsaPrivateKey::from_pkcs1_pem(text).context("not an RSA PRIVATE KEY PEM");
    }
    RsaPrivateKey::from_pkcs8_pem(text).context("not a PRIVATE KEY PEM")
}

fn read_private(path: Option<&std::path::PathBuf>) -> Result<Option<RsaPrivateKey>> {
    match path {
        None => Ok(None),
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            parse_private_key(&text)
                .with_context(|| format!("parsing {}", p.display()))
                .map(Some)
        }
    }
}

fn read_key(path: &Path) -> Result<RsaPublicKey> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_public_key(&text).with_context(|| format!("parsing {}", path.display()))
}

impl ProviderKeys {
    /// Loads what the configuration names. A provider whose settings are missing stays `None`
    /// (its callbacks are refused with 503); one whose settings are wrong stops the start.
    pub fn load(config: &Config) -> Result<ProviderKeys> {
        let w = &config.wechatpay;
        let wechat = match (&w.mch_id, &w.apiv3_key, &w.platform_public_key) {
            (Some(mch), Some(key), Some(path)) => {
                let apiv3_key: [u8; 32] = key
                    .as_bytes()
                    .try_into()
                    .map_err(|_| anyhow::anyhow!("WECHATPAY_APIV3_KEY must be 32 bytes of text"))?;
                Some(WechatKeys {
                    mch_id: mch.clone(),
                    apiv3_key,
                    platform_public_key: read_key(path)?,
                    merchant_key: read_private(w.merchant_private_key.as_ref())?,
                    merchant_serial: w.merchant_serial.clone(),
                })
            }
            (None, None, None) => None,
            _ => {
                tracing::warn!("WeChat Pay is partly configured (need WECHATPAY_MCH_ID, WECHATPAY_APIV3_KEY, WECHATPAY_PLATFORM_PUBLIC_KEY): its callbacks are refused");
                None
            }
        };
        let a = &config.alipay;
        let alipay = match (&a.app_id, &a.public_key) {
            (Some(app_id), Some(path)) => Some(AlipayKeys {
                app_id: app_id.clone(),
                public_key: read_key(path)?,
                app_private_key: read_private(a.app_private_key.as_ref())?,
            }),
            (None, None) => None,
            _ => {
                tracing::warn!(
                    "Alipay is partly configured (need ALIPAY_APP_ID and ALIPAY_PUBLIC_KEY): its callbacks are refused"
                );
                None
            }
        };
        Ok(ProviderKeys { wechat, alipay })
    }
}
