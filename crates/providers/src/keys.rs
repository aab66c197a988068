//! The providers' keys, loaded once at start. A provider is configured whole or not at all:
//! with only part of its settings, the start is refused and the message names what is missing.

use std::path::Path;

use anyhow::{Context, Result};
use rsa::pkcs1::DecodeRsaPrivateKey;
use rsa::pkcs1::DecodeRsaPublicKey;
use rsa::pkcs8::DecodePrivateKey;
use rsa::pkcs8::DecodePublicKey;
use rsa::{RsaPrivateKey, RsaPublicKey};

use crate::config::{AlipayConfig, Config, WechatPayConfig};

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
    pub platform: super::platform_keys::SharedKeyring,
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

/// Alipay's certificate mode: the SNs requests carry and answers are checked against.
#[derive(Clone, Debug)]
pub struct AlipayCertSns {
    pub app_cert_sn: String,
    pub alipay_root_cert_sn: String,
    pub alipay_cert_sn: String,
}

/// Alipay, configured whole.
pub struct AlipayKeys {
    pub app_id: String,
    /// Signs every gateway request and order string.
    pub app_private_key: RsaPrivateKey,
    /// Verifies answers and notifications (in certificate mode, from the Alipay public-key certificate).
    pub public_key: RsaPublicKey,
    pub cert: Option<AlipayCertSns>,
    /// Certificate mode: the root file's text (`ALIPAY_ROOT_CERT`), which a renewed Alipay
    /// certificate must chain to.
    pub root_cert_pem: Option<String>,
    /// Certificate mode: the renewed Alipay certificates known so far (from the database or
    /// downloaded), by `alipay_cert_sn`.
    pub renewed: super::alipay::certs::RenewedCerts,
    pub api_base: String,
    /// Our seller id (`ALIPAY_SELLER_ID`); notifications naming another are refused.
    pub seller_id: Option<String>,
}

#[derive(Default, Clone)]
pub struct ProviderKeys {
    pub wechat: Option<std::sync::Arc<WechatKeys>>,
    pub alipay: Option<std::sync::Arc<AlipayKeys>>,
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

fn read_text(path: &Path, var: &str) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("{var}: cannot read {}", path.display()))
}

fn read_private(path: &Path, var: &str) -> Result<RsaPrivateKey> {
    parse_private_key(&read_text(path, var)?)
        .with_context(|| format!("{var}: {} is not an RSA private key", path.display()))
}

fn read_public(path: &Path, var: &str) -> Result<RsaPublicKey> {
    parse_public_key(&read_text(path, var)?)
        .with_context(|| format!("{var}: {} is not an RSA public key", path.display()))
}

/// The names of the settings that are missing when some but not all are set; `Ok(false)`
/// when none is set.
fn whole(provider: &str, settings: &[(&str, bool)]) -> Result<bool> {
    let missing: Vec<&str> = settings.iter().filter(|(_, set)| !set).map(|(name, _)| *name).collect();
    if missing.len() == settings.len() {
        return Ok(false);
    }
    anyhow::ensure!(
        missing.is_empty(),
        "{provider} is only partly configured: set {} as well (or none of its settings)",
        missing.join(", ")
    );
    Ok(true)
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
        let apiv3_key: [u8; 32] = apiv3
            .as_bytes()
            .try_into()
            .map_err(|_| anyhow::anyhow!("WECHATPAY_APIV3_KEY must be 32 bytes of text"))?;
        let public_key = match (&w.public_key_id, &w.platform_public_key) {
            (Some(id), Some(path)) => Some((id.clone(), read_public(path, "WECHATPAY_PLATFORM_PUBLIC_KEY")?)),
            _ => None,
        };
        let platform = super::platform_keys::SharedKeyring::new(public_key);
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

impl AlipayKeys {
    pub fn load(a: &AlipayConfig) -> Result<Option<AlipayKeys>> {
        let certs = [
            ("ALIPAY_APP_CERT", a.app_cert.is_some()),
            ("ALIPAY_PUBLIC_CERT", a.public_cert.is_some()),
            ("ALIPAY_ROOT_CERT", a.root_cert.is_some()),
        ];
        let cert_mode = certs.iter().any(|(_, set)| *set);
        let mut settings = vec![
            ("ALIPAY_APP_ID", a.app_id.is_some()),
            ("ALIPAY_APP_PRIVATE_KEY", a.app_private_key.is_some()),
        ];
        if cert_mode {
            settings.extend(certs);
            anyhow::ensure!(
                a.public_key.is_none(),
                "ALIPAY_PUBLIC_KEY and the certificates (ALIPAY_APP_CERT, ALIPAY_PUBLIC_CERT, ALIPAY_ROOT_CERT) exclude each other"
            );
        } else {
            settings.push((
                "ALIPAY_PUBLIC_KEY (or ALIPAY_APP_CERT, ALIPAY_PUBLIC_CERT and ALIPAY_ROOT_CERT)",
                a.public_key.is_some(),
            ));
        }
        if !whole("Alipay", &settings)? {
            return Ok(None);
        }
        let (Some(app_id), Some(key_path)) = (&a.app_id, &a.app_private_key) else {
            unreachable!("checked whole above")
        };
        let (public_key, cert, root_cert_pem) = match (&a.public_key, &a.app_cert, &a.public_cert, &a.root_cert) {
            (Some(path), ..) => (read_public(path, "ALIPAY_PUBLIC_KEY")?, None, None),
            (None, Some(app), Some(public), Some(root)) => {
                let root = read_text(root, "ALIPAY_ROOT_CERT")?;
                let (key, sns) = super::alipay::cert_mode(
                    &read_text(app, "ALIPAY_APP_CERT")?,
                    &read_text(public, "ALIPAY_PUBLIC_CERT")?,
                    &root,
                )?;
                (key, Some(sns), Some(root))
            }
            _ => unreachable!("checked whole above"),
        };
        check_base("ALIPAY_API_BASE", &a.api_base)?;
        Ok(Some(AlipayKeys {
            app_id: app_id.clone(),
            app_private_key: read_private(key_path, "ALIPAY_APP_PRIVATE_KEY")?,
            public_key,
            cert,
            root_cert_pem,
            renewed: Default::default(),
            api_base: a.api_base.clone(),
            seller_id: a.seller_id.clone(),
        }))
    }
}

/// A provider API base is `https://`, or `http://` for a local sandbox or proxy.
fn check_base(var: &str, base: &str) -> Result<()> {
    let lower = base.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Ok(());
    }
    anyhow::ensure!(lower.starts_with("http://"), "{var}={base:?} is not an http(s) URL");
    let host = lower["http://".len()..].split(['/', ':']).next().unwrap_or_default();
    if !(host == "localhost" || host.starts_with("127.") || host == "[") {
        tracing::warn!(
            "{var} is plain HTTP to {host}: only a local sandbox or a TLS-terminating proxy should be reached this way"
        );
    }
    Ok(())
}

impl ProviderKeys {
    /// Loads what the configuration names; a provider configured in part stops the start.
    pub fn load(config: &Config) -> Result<ProviderKeys> {
        Ok(ProviderKeys {
            wechat: WechatKeys::load(&config.wechatpay)?.map(std::sync::Arc::new),
            alipay: AlipayKeys::load(&config.alipay)?.map(std::sync::Arc::new),
        })
    }

    pub fn configured(&self, provider: crate::domain::payment::Provider) -> bool {
        match provider {
            crate::domain::payment::Provider::WechatPay => self.wechat.is_some(),
            crate::domain::payment::Provider::Alipay => self.alipay.is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(r: Result<Option<impl Sized>>) -> String {
        match r {
            Err(e) => format!("{e:#}"),
            Ok(Some(_)) => "configured".into(),
            Ok(None) => "unconfigured".into(),
        }
    }

    #[test]
    fn a_provider_is_configured_whole_or_the_start_is_refused_naming_what_is_missing() {
        assert_eq!(message(WechatKeys::load(&WechatPayConfig::default())), "unconfigured");
        assert_eq!(message(AlipayKeys::load(&AlipayConfig::default())), "unconfigured");
        let w = WechatPayConfig {
            mch_id: Some("1900000109".into()),
            apiv3_key: Some("0123456789abcdefghijABCDEFGHIJ01".into()),
            ..Default::default()
        };
        let m = message(WechatKeys::load(&w));
        assert!(m.contains("WECHATPAY_APP_ID"), "{m}");
        assert!(
            m.contains("WECHATPAY_MCH_PRIVATE_KEY") && m.contains("WECHATPAY_MCH_SERIAL"),
            "{m}"
        );
        assert!(!m.contains("WECHATPAY_MCH_ID,"), "{m}");
        let only_key = WechatPayConfig {
            platform_public_key: Some("/nonexistent.pem".into()),
            public_key_id: Some("PUB_KEY_ID_1".into()),
            ..Default::default()
        };
        assert!(message(WechatKeys::load(&only_key)).contains("WECHATPAY_MCH_ID"));
        let half_pair = WechatPayConfig {
            public_key_id: Some("PUB_KEY_ID_1".into()),
            ..Default::default()
        };
        assert!(message(WechatKeys::load(&half_pair)).contains("go together"));
        let a = AlipayConfig {
            app_id: Some("2021".into()),
            ..Default::default()
        };
        let m = message(AlipayKeys::load(&a));
        assert!(
            m.contains("ALIPAY_APP_PRIVATE_KEY") && m.contains("ALIPAY_PUBLIC_KEY"),
            "{m}"
        );
        let certs = AlipayConfig {
            app_id: Some("2021".into()),
            app_private_key: Some("/k.pem".into()),
            app_cert: Some("/a.crt".into()),
            ..Default::default()
        };
        let m = message(AlipayKeys::load(&certs));
        assert!(
            m.contains("ALIPAY_PUBLIC_CERT") && m.contains("ALIPAY_ROOT_CERT"),
            "{m}"
        );
    }

    #[test]
    fn api_bases_default_to_https_and_plain_http_is_for_loopback() {
        assert!(WechatPayConfig::default()
            .api_base
            .starts_with("https://api.mch.weixin.qq.com"));
        assert!(AlipayConfig::default()
            .api_base
            .starts_with("https://openapi.alipay.com/"));
        assert!(check_base("X", "http://127.0.0.1:9000/wechatpay").is_ok());
        assert!(check_base("X", "ftp://example.com").is_err());
    }
}
