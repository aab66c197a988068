//! The providers configured here, their keys loaded once at start. A provider is configured
//! whole or not at all: with only part of its settings, the start is refused and the message
//! names what is missing. Each provider's keys and certificates live in one module: WeChat Pay's
//! in [`super::platform_keys`] ([`WechatKeys`]), Alipay's in [`super::alipay::certs`]
//! ([`AlipayKeys`]); the RSA and X.509 primitives both use in [`super::crypto`].

use std::path::Path;

use anyhow::{Context, Result};
use rsa::{RsaPrivateKey, RsaPublicKey};

pub use super::alipay::certs::{AlipayCertSns, AlipayKeys};
pub use super::crypto::{parse_private_key, parse_public_key};
pub use super::platform_keys::WechatKeys;
use crate::config::Config;

#[derive(Default, Clone)]
pub struct ProviderKeys {
    pub wechat: Option<std::sync::Arc<WechatKeys>>,
    pub alipay: Option<std::sync::Arc<AlipayKeys>>,
}

pub(crate) fn read_text(path: &Path, var: &str) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("{var}: cannot read {}", path.display()))
}

pub(crate) fn read_private(path: &Path, var: &str) -> Result<RsaPrivateKey> {
    parse_private_key(&read_text(path, var)?)
        .with_context(|| format!("{var}: {} is not an RSA private key", path.display()))
}

pub(crate) fn read_public(path: &Path, var: &str) -> Result<RsaPublicKey> {
    parse_public_key(&read_text(path, var)?)
        .with_context(|| format!("{var}: {} is not an RSA public key", path.display()))
}

/// The names of the settings that are missing when some but not all are set; `Ok(false)`
/// when none is set.
pub(crate) fn whole(provider: &str, settings: &[(&str, bool)]) -> Result<bool> {
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

/// A provider API base is `https://`, or `http://` for a local sandbox or proxy.
pub(crate) fn check_base(var: &str, base: &str) -> Result<()> {
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
    use crate::config::{AlipayConfig, WechatPayConfig};

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
