//! The keys WeChat Pay's answers and notifications are verified with, chosen by
//! `Wechatpay-Serial`.

use std::collections::HashMap;

use rsa::RsaPublicKey;

use super::certificates::PlatformCert;

/// Why a keyring refused a signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// No key has this `Wechatpay-Serial` (refresh the certificates, rate-limited, then retry).
    #[error("unknown Wechatpay-Serial {0}")]
    UnknownSerial(String),
    /// The key was found and the signature does not verify.
    #[error("signature verification failed")]
    BadSignature,
}

/// WeChat Pay's verification keys, chosen by `Wechatpay-Serial`: the 微信支付公钥 under its ID
/// (`PUB_KEY_ID_…`) and platform certificates under their serials, both live at once.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    public_key: Option<(String, RsaPublicKey)>,
    certs: HashMap<String, PlatformCert>,
}

impl Keyring {
    /// An empty keyring.
    pub fn new() -> Keyring {
        Keyring::default()
    }

    /// A keyring of these platform certificates.
    pub fn from_certs(certs: &[PlatformCert]) -> Keyring {
        let mut k = Keyring::new();
        k.replace_certs(certs.iter().cloned());
        k
    }

    /// Adds the 微信支付公钥 under its ID (`WECHATPAY_PUBLIC_KEY_ID`).
    pub fn with_public_key(mut self, id: impl Into<String>, key: RsaPublicKey) -> Keyring {
        self.set_public_key(Some((id.into(), key)));
        self
    }

    /// Sets or clears the 微信支付公钥.
    pub fn set_public_key(&mut self, key: Option<(String, RsaPublicKey)>) {
        self.public_key = key.map(|(id, k)| (id.trim().to_string(), k));
    }

    /// The 微信支付公钥 and its ID, if configured.
    pub fn public_key(&self) -> Option<(&str, &RsaPublicKey)> {
        self.public_key.as_ref().map(|(id, k)| (id.as_str(), k))
    }

    /// Adds (or replaces) one platform certificate under its serial.
    pub fn insert_cert(&mut self, cert: PlatformCert) {
        self.certs.insert(cert.serial_no.to_ascii_uppercase(), cert);
    }

    /// Replaces all platform certificates, keeping the public key.
    pub fn replace_certs(&mut self, certs: impl IntoIterator<Item = PlatformCert>) {
        self.certs.clear();
        for c in certs {
            self.insert_cert(c);
        }
    }

    /// The platform certificates' serials, sorted.
    pub fn cert_serials(&self) -> Vec<String> {
        let mut s: Vec<String> = self.certs.keys().cloned().collect();
        s.sort();
        s
    }

    /// The platform certificate with this serial.
    pub fn cert(&self, serial: &str) -> Option<&PlatformCert> {
        self.certs.get(&serial.trim().to_ascii_uppercase())
    }

    /// The newest platform certificate (latest `effective_time`): the one to encrypt with.
    pub fn newest_cert(&self) -> Option<&PlatformCert> {
        self.certs
            .values()
            .max_by_key(|c| (c.effective_time, c.serial_no.clone()))
    }

    /// No key at all.
    pub fn is_empty(&self) -> bool {
        self.public_key.is_none() && self.certs.is_empty()
    }

    /// The key a `Wechatpay-Serial` names: the public key when it is its ID, else the
    /// certificate with that serial; None when unknown.
    pub fn key_for(&self, serial: &str) -> Option<&RsaPublicKey> {
        let serial = serial.trim();
        match &self.public_key {
            Some((id, key)) if id == serial => Some(key),
            _ => self.cert(serial).map(|c| &c.public_key),
        }
    }

    /// Verifies a notification or answer with the key its `Wechatpay-Serial` names.
    pub fn verify(
        &self,
        serial: &str,
        timestamp: &str,
        nonce: &str,
        body: &[u8],
        signature_b64: &str,
    ) -> Result<(), VerifyError> {
        let key = self
            .key_for(serial)
            .ok_or_else(|| VerifyError::UnknownSerial(serial.trim().to_string()))?;
        let message = crate::wechat::signing::answer_message(timestamp, nonce, body);
        if crate::crypto::verify(key, &message, signature_b64) {
            Ok(())
        } else {
            Err(VerifyError::BadSignature)
        }
    }
}
