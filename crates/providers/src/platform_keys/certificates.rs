//! The platform certificates: one decrypted and checked ([`PlatformCert`]), and a
//! `GET /v3/certificates` answer decrypted into them.

use chrono::{DateTime, Utc};
use rsa::RsaPublicKey;
use serde::Deserialize;

use super::aead::{aead_decrypt, WECHAT_AEAD_ALGORITHM};
use crate::crypto::{bad, parse_certificate, CertError};

/// One WeChat Pay platform certificate, decrypted and checked.
#[derive(Debug, Clone)]
pub struct PlatformCert {
    /// `serial_no` of the answer (= the certificate's serial, uppercase hex): the `Wechatpay-Serial`.
    pub serial_no: String,
    /// From when WeChat Pay signs with it.
    pub effective_time: DateTime<Utc>,
    /// Until when it is valid.
    pub expire_time: DateTime<Utc>,
    /// The certificate, PEM, as decrypted.
    pub pem: String,
    /// Its RSA public key.
    pub public_key: RsaPublicKey,
}

impl PlatformCert {
    /// A platform certificate from its PEM, the serial and times taken from the certificate.
    pub fn from_pem(pem: &str) -> Result<PlatformCert, CertError> {
        let info = parse_certificate(pem.as_bytes())?;
        Ok(PlatformCert {
            serial_no: info.serial_hex.clone(),
            effective_time: info.not_before,
            expire_time: info.not_after,
            pem: pem.to_string(),
            public_key: info.rsa_public_key()?,
        })
    }
}

#[derive(Deserialize)]
struct CertificatesAnswer {
    data: Vec<AnswerEntry>,
}

#[derive(Deserialize)]
struct AnswerEntry {
    serial_no: String,
    effective_time: String,
    expire_time: String,
    encrypt_certificate: EncryptedCertificate,
}

#[derive(Deserialize)]
struct EncryptedCertificate {
    algorithm: String,
    nonce: String,
    #[serde(default)]
    associated_data: Option<String>,
    ciphertext: String,
}

pub(super) fn rfc3339(field: &str, s: &str) -> Result<DateTime<Utc>, CertError> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| CertError::BadAnswer(format!("{field} {s:?} is not RFC 3339")))
}

/// Decrypts a `GET /v3/certificates` answer body; every certificate's own serial must equal
/// its `serial_no`.
pub fn decrypt_certificates(apiv3_key: &[u8], answer_body: &[u8]) -> Result<Vec<PlatformCert>, CertError> {
    let answer: CertificatesAnswer =
        serde_json::from_slice(answer_body).map_err(|e| CertError::BadAnswer(e.to_string()))?;
    answer
        .data
        .into_iter()
        .map(|e| {
            let enc = &e.encrypt_certificate;
            if enc.algorithm != WECHAT_AEAD_ALGORITHM {
                return Err(CertError::UnsupportedAlgorithm(enc.algorithm.clone()));
            }
            let ad = enc.associated_data.as_deref().unwrap_or_default();
            let plain = aead_decrypt(apiv3_key, enc.nonce.as_bytes(), ad.as_bytes(), &enc.ciphertext)?;
            let pem = String::from_utf8(plain).map_err(|_| bad("decrypted certificate is not text"))?;
            let info = parse_certificate(pem.as_bytes())?;
            if !info.serial_hex.eq_ignore_ascii_case(e.serial_no.trim()) {
                return Err(CertError::SerialMismatch {
                    claimed: e.serial_no,
                    actual: info.serial_hex,
                });
            }
            Ok(PlatformCert {
                serial_no: info.serial_hex.clone(),
                effective_time: rfc3339("effective_time", &e.effective_time)?,
                expire_time: rfc3339("expire_time", &e.expire_time)?,
                pem,
                public_key: info.rsa_public_key()?,
            })
        })
        .collect()
}
