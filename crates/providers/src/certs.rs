//! Certificates and key material of the providers, as pure building blocks: X.509 parsing, the
//! Alipay certificate SNs, WeChat Pay `/v3/certificates` answers (AEAD_AES_256_GCM with the
//! APIv3 key), SHA256withRSA verification and a keyring chosen by `Wechatpay-Serial`, and the
//! dev sandbox's self-signed platform certificate. No I/O here; `platform_keys` stores them.

use std::collections::HashMap;
use std::str::FromStr;

use aes_gcm::aead::{Aead, Payload};
use aes_gcm::{Aes128Gcm, Aes256Gcm, KeyInit, Nonce};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use chrono::{DateTime, FixedOffset, SecondsFormat, Utc};
use md5::Digest;
use rsa::pkcs1v15::{Signature, SigningKey, VerifyingKey};
use rsa::pkcs8::DecodePublicKey;
use rsa::signature::Verifier;
use rsa::{BigUint, RsaPrivateKey, RsaPublicKey};
use serde::Deserialize;
use sha2::Sha256;
use x509_cert::builder::{Builder, CertificateBuilder, Profile};
use x509_cert::der::{Decode, Encode, EncodePem};
use x509_cert::name::Name;
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::SubjectPublicKeyInfoOwned;
use x509_cert::time::Validity;
use x509_cert::Certificate;

/// The OID of `rsaEncryption` keys.
pub const RSA_ENCRYPTION_OID: &str = "1.2.840.113549.1.1.1";
/// The prefix of the PKCS#1 (RSA) signature algorithm OIDs.
pub const RSA_SIGNATURE_OID_PREFIX: &str = "1.2.840.113549.1.1.";
/// The only algorithm `/v3/certificates` answers and notifications name.
pub const WECHAT_AEAD_ALGORITHM: &str = "AEAD_AES_256_GCM";
/// The associated data WeChat Pay uses for encrypted certificates.
pub const CERTIFICATE_ASSOCIATED_DATA: &str = "certificate";

/// What can go wrong with certificates and key material; messages name nothing internal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    /// The input is not a PEM or DER X.509 certificate.
    #[error("not an X.509 certificate: {0}")]
    BadCertificate(String),
    /// The certificate's key is not an RSA key.
    #[error("the certificate's public key is not RSA")]
    NotRsa,
    /// A PEM bundle holds no certificate.
    #[error("no certificate in the bundle")]
    EmptyBundle,
    /// An AEAD key of another length than 16 or 32 bytes.
    #[error("the APIv3 key must be 32 bytes (16 accepted for the SDK test vectors), got {0}")]
    BadKeyLength(usize),
    /// An AEAD nonce of another length than 12 bytes.
    #[error("the nonce must be 12 bytes, got {0}")]
    BadNonce(usize),
    /// The ciphertext is not base64.
    #[error("the ciphertext is not base64")]
    BadBase64,
    /// AES-GCM authentication failed (wrong key, nonce, associated data or tampered data).
    #[error("decryption failed (wrong key or tampered data)")]
    Undecryptable,
    /// An answer that is not the JSON `/v3/certificates` answers with.
    #[error("malformed certificates answer: {0}")]
    BadAnswer(String),
    /// An encryption algorithm other than AEAD_AES_256_GCM.
    #[error("unsupported algorithm {0}")]
    UnsupportedAlgorithm(String),
    /// The answer's `serial_no` is not the decrypted certificate's own serial.
    #[error("serial_no {claimed} is not the certificate's serial {actual}")]
    SerialMismatch { claimed: String, actual: String },
    /// A sandbox certificate could not be made.
    #[error("cannot build the certificate: {0}")]
    Build(String),
    /// A certificate that does not chain to the configured root (or is out of its validity).
    #[error("the certificate is not trusted: {0}")]
    Untrusted(String),
}

fn bad(e: impl std::fmt::Display) -> CertError {
    CertError::BadCertificate(e.to_string())
}

/// What fitorder needs of one X.509 certificate.
#[derive(Debug, Clone)]
pub struct CertInfo {
    /// The certificate's DER encoding.
    pub der: Vec<u8>,
    /// The serial as WeChat Pay writes it: uppercase hex, no leading zero bytes.
    pub serial_hex: String,
    /// The serial in decimal, as Alipay's SN uses it.
    pub serial_decimal: String,
    /// The issuer DN, RFC 4514 (last RDN first: `CN=…,OU=…,O=…,C=…`).
    pub issuer: String,
    /// The subject DN, RFC 4514.
    pub subject: String,
    /// Start of validity.
    pub not_before: DateTime<Utc>,
    /// End of validity.
    pub not_after: DateTime<Utc>,
    /// The signature algorithm's OID, dotted (`1.2.840.113549.1.1.11` = sha256WithRSAEncryption).
    pub signature_algorithm: String,
    /// The subject's RSA public key; None for other key types (SM2, ECDSA roots).
    pub public_key: Option<RsaPublicKey>,
}

impl CertInfo {
    /// The RSA public key, or [`CertError::NotRsa`].
    pub fn rsa_public_key(&self) -> Result<RsaPublicKey, CertError> {
        self.public_key.clone().ok_or(CertError::NotRsa)
    }

    /// The certificate as PEM (`CERTIFICATE`, LF line ends).
    pub fn to_pem(&self) -> Result<String, CertError> {
        Certificate::from_der(&self.der)
            .and_then(|c| c.to_pem(x509_cert::der::pem::LineEnding::LF))
            .map_err(bad)
    }

    /// Whether `now` lies within the validity period.
    pub fn is_valid_at(&self, now: DateTime<Utc>) -> bool {
        self.not_before <= now && now <= self.not_after
    }
}

fn to_utc(t: x509_cert::time::Time) -> Result<DateTime<Utc>, CertError> {
    let d = t.to_unix_duration();
    DateTime::from_timestamp(d.as_secs() as i64, d.subsec_nanos()).ok_or_else(|| bad("validity out of range"))
}

fn info_of(cert: &Certificate) -> Result<CertInfo, CertError> {
    let tbs = &cert.tbs_certificate;
    let raw = tbs.serial_number.as_bytes();
    let start = raw.iter().position(|b| *b != 0).unwrap_or(raw.len().saturating_sub(1));
    let serial = &raw[start..];
    let spki = &tbs.subject_public_key_info;
    let public_key = if spki.algorithm.oid.to_string() == RSA_ENCRYPTION_OID {
        let der = spki.to_der().map_err(bad)?;
        Some(RsaPublicKey::from_public_key_der(&der).map_err(bad)?)
    } else {
        None
    };
    Ok(CertInfo {
        der: cert.to_der().map_err(bad)?,
        serial_hex: hex::encode_upper(serial),
        serial_decimal: BigUint::from_bytes_be(serial).to_str_radix(10),
        issuer: tbs.issuer.to_string(),
        subject: tbs.subject.to_string(),
        not_before: to_utc(tbs.validity.not_before)?,
        not_after: to_utc(tbs.validity.not_after)?,
        signature_algorithm: cert.signature_algorithm.oid.to_string(),
        public_key,
    })
}

/// The DER of every `CERTIFICATE` block of a PEM text. Lenient about line width: Alipay's
/// certificates are wrapped at 76 columns, which strict RFC 7468 decoders refuse.
pub fn pem_certificates(text: &str) -> Result<Vec<Vec<u8>>, CertError> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = vec![];
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let body = &rest[start + BEGIN.len()..];
        let end = body.find(END).ok_or_else(|| bad("PEM block without its END line"))?;
        let b64: String = body[..end].split_whitespace().collect();
        out.push(B64.decode(b64).map_err(|_| bad("PEM block is not base64"))?);
        rest = &body[end + END.len()..];
    }
    Ok(out)
}

/// Parses one certificate, PEM (`-----BEGIN CERTIFICATE-----`, the first block) or DER.
pub fn parse_certificate(input: &[u8]) -> Result<CertInfo, CertError> {
    let der = match std::str::from_utf8(input) {
        Ok(t) if t.contains("-----BEGIN") => pem_certificates(t)?.into_iter().next().ok_or(CertError::EmptyBundle)?,
        _ => input.to_vec(),
    };
    info_of(&Certificate::from_der(&der).map_err(bad)?)
}

/// Splits and parses a PEM bundle of several certificates (Alipay's root certificate file).
pub fn parse_pem_bundle(bundle: &str) -> Result<Vec<CertInfo>, CertError> {
    let ders = pem_certificates(bundle)?;
    if ders.is_empty() {
        return Err(CertError::EmptyBundle);
    }
    ders.iter()
        .map(|d| info_of(&Certificate::from_der(d).map_err(bad)?))
        .collect()
}

fn md5_hex(s: &str) -> String {
    hex::encode(md5::Md5::digest(s.as_bytes()))
}

/// Alipay's SN of one certificate: md5 hex of the issuer DN (RDNs reversed) + decimal serial.
pub fn alipay_sn(cert: &CertInfo) -> String {
    md5_hex(&format!("{}{}", cert.issuer, cert.serial_decimal))
}

/// `app_cert_sn` / `alipay_cert_sn` of a PEM certificate (the first one if it is a bundle).
pub fn alipay_cert_sn(pem: &str) -> Result<String, CertError> {
    let first = parse_pem_bundle(pem)?
        .into_iter()
        .next()
        .ok_or(CertError::EmptyBundle)?;
    Ok(alipay_sn(&first))
}

/// `alipay_root_cert_sn`: the SNs of the bundle's RSA-signed certificates joined by `_`.
pub fn alipay_root_cert_sn(bundle_pem: &str) -> Result<String, CertError> {
    let sns: Vec<String> = parse_pem_bundle(bundle_pem)?
        .iter()
        .filter(|c| c.signature_algorithm.starts_with(RSA_SIGNATURE_OID_PREFIX))
        .map(alipay_sn)
        .collect();
    if sns.is_empty() {
        return Err(CertError::EmptyBundle);
    }
    Ok(sns.join("_"))
}

/// The Alipay public key (verifies answers and notifications) from the 支付宝公钥证书.
pub fn alipay_public_key_from_cert(pem: &str) -> Result<RsaPublicKey, CertError> {
    parse_pem_bundle(pem)?
        .into_iter()
        .next()
        .ok_or(CertError::EmptyBundle)?
        .rsa_public_key()
}

/// Whether `issuer` signed `child` (sha256/384/512WithRSAEncryption; the other algorithms of
/// Alipay's root file, SM2 and ECDSA, are not used for the RSA chain) and names it as issuer.
pub fn is_issued_by(child: &CertInfo, issuer: &CertInfo) -> bool {
    if child.issuer != issuer.subject {
        return false;
    }
    let Some(key) = &issuer.public_key else { return false };
    let Ok(cert) = Certificate::from_der(&child.der) else {
        return false;
    };
    let Ok(tbs) = cert.tbs_certificate.to_der() else {
        return false;
    };
    let Some(sig) = cert.signature.as_bytes() else {
        return false;
    };
    let Ok(sig) = Signature::try_from(sig) else {
        return false;
    };
    match cert.signature_algorithm.oid.to_string().as_str() {
        "1.2.840.113549.1.1.11" => VerifyingKey::<Sha256>::new(key.clone()).verify(&tbs, &sig).is_ok(),
        "1.2.840.113549.1.1.12" => VerifyingKey::<sha2::Sha384>::new(key.clone())
            .verify(&tbs, &sig)
            .is_ok(),
        "1.2.840.113549.1.1.13" => VerifyingKey::<sha2::Sha512>::new(key.clone())
            .verify(&tbs, &sig)
            .is_ok(),
        _ => false,
    }
}

/// Checks an Alipay public-key certificate (`alipay.open.app.alipaycert.download`'s content: the
/// certificate, maybe followed by its intermediates) against the root file: the first
/// certificate, valid at `now`, must lead through valid intermediates of the same content to a
/// certificate of the root file that signed it. Returns the first certificate.
pub fn check_alipay_chain(content_pem: &str, root_bundle_pem: &str, now: DateTime<Utc>) -> Result<CertInfo, CertError> {
    let chain = parse_pem_bundle(content_pem)?;
    let roots = parse_pem_bundle(root_bundle_pem)?;
    let leaf = chain[0].clone();
    leaf.rsa_public_key()?;
    let untrusted = |why: String| CertError::Untrusted(why);
    let mut current = leaf.clone();
    for _ in 0..=chain.len() {
        if !current.is_valid_at(now) {
            return Err(untrusted(format!(
                "{} is valid {} to {}",
                current.subject, current.not_before, current.not_after
            )));
        }
        if roots.iter().any(|root| is_issued_by(&current, root)) {
            return Ok(leaf);
        }
        let Some(next) = chain[1..]
            .iter()
            .find(|c| c.der != current.der && is_issued_by(&current, c))
        else {
            return Err(untrusted(format!(
                "{} is not issued by the root certificate (ALIPAY_ROOT_CERT) nor by a certificate it issued",
                current.issuer
            )));
        };
        current = next.clone();
    }
    Err(untrusted("the chain does not end at the root".into()))
}

/// AES-GCM decryption as WeChat Pay does it: base64(ciphertext‖tag); AES-256 for a 32-byte key,
/// AES-128 for a 16-byte one (only the wechatpay-go test vectors use those).
pub fn aead_decrypt(
    key: &[u8],
    nonce: &[u8],
    associated_data: &[u8],
    ciphertext_b64: &str,
) -> Result<Vec<u8>, CertError> {
    let data = B64.decode(ciphertext_b64.trim()).map_err(|_| CertError::BadBase64)?;
    let nonce: [u8; 12] = nonce.try_into().map_err(|_| CertError::BadNonce(nonce.len()))?;
    let nonce = &Nonce::from(nonce);
    let payload = Payload {
        msg: &data,
        aad: associated_data,
    };
    let plain = match key.len() {
        32 => Aes256Gcm::new_from_slice(key)
            .map_err(|_| CertError::BadKeyLength(32))?
            .decrypt(nonce, payload),
        16 => Aes128Gcm::new_from_slice(key)
            .map_err(|_| CertError::BadKeyLength(16))?
            .decrypt(nonce, payload),
        n => return Err(CertError::BadKeyLength(n)),
    };
    plain.map_err(|_| CertError::Undecryptable)
}

/// The inverse of [`aead_decrypt`]: base64(ciphertext‖tag).
pub fn aead_encrypt(key: &[u8], nonce: &[u8], associated_data: &[u8], plaintext: &[u8]) -> Result<String, CertError> {
    let nonce: [u8; 12] = nonce.try_into().map_err(|_| CertError::BadNonce(nonce.len()))?;
    let nonce = &Nonce::from(nonce);
    let payload = Payload {
        msg: plaintext,
        aad: associated_data,
    };
    let sealed = match key.len() {
        32 => Aes256Gcm::new_from_slice(key)
            .map_err(|_| CertError::BadKeyLength(32))?
            .encrypt(nonce, payload),
        16 => Aes128Gcm::new_from_slice(key)
            .map_err(|_| CertError::BadKeyLength(16))?
            .encrypt(nonce, payload),
        n => return Err(CertError::BadKeyLength(n)),
    };
    Ok(B64.encode(sealed.map_err(|_| CertError::Undecryptable)?))
}

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

fn rfc3339(field: &str, s: &str) -> Result<DateTime<Utc>, CertError> {
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

/// The string WeChat Pay signs: `timestamp\nnonce\nbody\n`.
pub fn wechat_sign_message(timestamp: &str, nonce: &str, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(timestamp.len() + nonce.len() + body.len() + 3);
    m.extend_from_slice(timestamp.as_bytes());
    m.push(b'\n');
    m.extend_from_slice(nonce.as_bytes());
    m.push(b'\n');
    m.extend_from_slice(body);
    m.push(b'\n');
    m
}

/// SHA256withRSA (PKCS#1 v1.5) verification of a base64 signature over `message`.
pub fn verify_sha256_rsa(key: &RsaPublicKey, message: &[u8], signature_b64: &str) -> bool {
    let Ok(sig) = B64.decode(signature_b64.trim()) else {
        return false;
    };
    let Ok(sig) = Signature::try_from(sig.as_slice()) else {
        return false;
    };
    VerifyingKey::<Sha256>::new(key.clone()).verify(message, &sig).is_ok()
}

/// Verifies a WeChat Pay notification or answer: SHA256withRSA over `timestamp\nnonce\nbody\n`.
pub fn verify_wechat_signature(
    key: &RsaPublicKey,
    timestamp: &str,
    nonce: &str,
    body: &[u8],
    signature_b64: &str,
) -> bool {
    verify_sha256_rsa(key, &wechat_sign_message(timestamp, nonce, body), signature_b64)
}

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
        if verify_wechat_signature(key, timestamp, nonce, body, signature_b64) {
            Ok(())
        } else {
            Err(VerifyError::BadSignature)
        }
    }
}

fn escape_dn_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for (i, ch) in v.chars().enumerate() {
        if matches!(ch, ',' | '+' | '"' | '\\' | '<' | '>' | ';' | '=') || (i == 0 && matches!(ch, '#' | ' ')) {
            out.push('\\');
        }
        out.push(ch);
    }
    if out.ends_with(' ') {
        out.insert(out.len() - 1, '\\');
    }
    out
}

/// A self-signed platform certificate (SHA256withRSA) for the dev sandbox, as PEM.
pub fn self_signed_platform_cert(
    key: &RsaPrivateKey,
    serial_hex: &str,
    common_name: &str,
    valid_days: u32,
) -> Result<String, CertError> {
    let build = |e: &dyn std::fmt::Display| CertError::Build(e.to_string());
    let serial = hex::decode(serial_hex.trim()).map_err(|e| build(&e))?;
    let serial = SerialNumber::new(&serial).map_err(|e| build(&e))?;
    let validity =
        Validity::from_now(std::time::Duration::from_secs(u64::from(valid_days) * 86_400)).map_err(|e| build(&e))?;
    let subject = Name::from_str(&format!(
        "CN={},OU=fitorder sandbox,O=fitorder,C=CN",
        escape_dn_value(common_name)
    ))
    .map_err(|e| build(&e))?;
    let spki = SubjectPublicKeyInfoOwned::from_key(key.to_public_key()).map_err(|e| build(&e))?;
    let signer = SigningKey::<Sha256>::new(key.clone());
    let cert = CertificateBuilder::new(Profile::Root, serial, validity, subject, spki, &signer)
        .map_err(|e| build(&e))?
        .build::<Signature>()
        .map_err(|e| build(&e))?;
    cert.to_pem(x509_cert::der::pem::LineEnding::LF).map_err(|e| build(&e))
}

/// The JSON body `GET /v3/certificates` answers with, for `(serial_no, pem)` pairs (dev sandbox).
pub fn encrypt_certificates_answer(apiv3_key: &[u8], certs: &[(&str, &str)]) -> Result<String, CertError> {
    use rand::distr::{Alphanumeric, SampleString};
    let beijing = FixedOffset::east_opt(8 * 3600).expect("a valid offset");
    let time = |t: DateTime<Utc>| t.with_timezone(&beijing).to_rfc3339_opts(SecondsFormat::Secs, false);
    let mut data = Vec::with_capacity(certs.len());
    for (serial, pem) in certs {
        let info = parse_certificate(pem.as_bytes())?;
        let nonce = Alphanumeric.sample_string(&mut rand::rng(), 12);
        let ciphertext = aead_encrypt(
            apiv3_key,
            nonce.as_bytes(),
            CERTIFICATE_ASSOCIATED_DATA.as_bytes(),
            pem.as_bytes(),
        )?;
        data.push(serde_json::json!({
            "serial_no": serial,
            "effective_time": time(info.not_before),
            "expire_time": time(info.not_after),
            "encrypt_certificate": {
                "algorithm": WECHAT_AEAD_ALGORITHM,
                "nonce": nonce,
                "associated_data": CERTIFICATE_ASSOCIATED_DATA,
                "ciphertext": ciphertext,
            },
        }));
    }
    Ok(serde_json::json!({ "data": data }).to_string())
}

#[cfg(test)]
mod tests {
    //! The other side of every test is published material (tests/provider-samples, see its
    //! SOURCES.md) or the openssl CLI, never this module.

    use std::path::PathBuf;
    use std::process::Command;

    use rsa::pkcs8::EncodePublicKey;
    use serde_json::Value;

    use super::*;
    use crate::payments::alipay;
    use crate::payments::keys::AlipayKeys;

    fn samples() -> PathBuf {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/provider-samples");
        assert!(
            p.is_dir(),
            "{} is missing: the provider samples sit beside the checkout",
            p.display()
        );
        p
    }

    fn read(rel: &str) -> Vec<u8> {
        let p = samples().join(rel);
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn text(rel: &str) -> String {
        String::from_utf8(read(rel)).unwrap()
    }

    fn json(rel: &str) -> Value {
        serde_json::from_slice(&read(rel)).unwrap()
    }

    fn s<'a>(v: &'a Value, path: &str) -> &'a str {
        v.pointer(path)
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no string at {path}"))
    }

    fn flip_one_byte(data: &[u8], at: usize) -> Vec<u8> {
        let mut d = data.to_vec();
        d[at] ^= 0x01;
        d
    }

    fn openssl(args: &[&str]) -> Vec<u8> {
        let out = Command::new("openssl").args(args).output().expect("the openssl CLI");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    fn cert_key(rel: &str) -> RsaPublicKey {
        parse_certificate(&read(rel)).unwrap().rsa_public_key().unwrap()
    }

    fn pem_key(rel: &str) -> RsaPublicKey {
        RsaPublicKey::from_public_key_pem(&text(rel)).unwrap()
    }

    const CERT_FILES: &[&str] = &[
        "wechat/keys/gunsluo_mock_cert_9AD59953ADF1BABB.pem",
        "wechat/keys/wechatpay_go_platform_cert_D7CE59D1F522D701.pem",
        "wechat/keys/wechatpay_go_platform_cert_F5765756002FDD77.pem",
        "wechat/keys/wechatpay_java_downloaded_platform_cert_5DEA10EF55877E3CF6C33255C2E7DEFFF7E427EC.pem",
        "wechat/keys/wechatpay_java_merchant_certificate_5F1C72E2A8931B72A2E13AF8DEE92471EB397115.pem",
        "wechat/keys/wechatpay_java_wechat_pay_certificate_440024045C4A427599D09BB4E3DE0279F2E813FD.pem",
        "alipay/cert/alipayCertPublicKey_RSA2.crt",
        "alipay/cert/appCertPublicKey_2021001161683774.crt",
    ];

    /// openssl's `-startdate`/`-enddate` value (`Apr 27 08:55:23 2021 GMT`) as UTC.
    fn openssl_date(line: &str) -> DateTime<Utc> {
        let v = line.split_once('=').unwrap().1.trim();
        let v = v
            .strip_suffix(" GMT")
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        chrono::NaiveDateTime::parse_from_str(&v, "%b %d %H:%M:%S %Y")
            .unwrap()
            .and_utc()
    }

    #[test]
    fn certificates_parse_like_openssl_reads_them() {
        for rel in CERT_FILES {
            let path = samples().join(rel);
            let path = path.to_str().unwrap();
            let info = parse_certificate(&read(rel)).unwrap();
            let out = String::from_utf8(openssl(&[
                "x509",
                "-noout",
                "-serial",
                "-startdate",
                "-enddate",
                "-nameopt",
                "RFC2253",
                "-issuer",
                "-in",
                path,
            ]))
            .unwrap();
            let field = |name: &str| out.lines().find(|l| l.starts_with(name)).unwrap().to_string();
            assert_eq!(format!("serial={}", info.serial_hex), field("serial="), "{rel}");
            assert_eq!(info.not_before, openssl_date(&field("notBefore=")), "{rel}");
            assert_eq!(info.not_after, openssl_date(&field("notAfter=")), "{rel}");
            // The WeChat files are named after their serial.
            if rel.starts_with("wechat/") {
                assert!(rel.contains(&info.serial_hex), "{rel} vs {}", info.serial_hex);
            }
            // Same DER as openssl's, and the DER path parses to the same thing.
            let der = openssl(&["x509", "-outform", "DER", "-in", path]);
            assert_eq!(info.der, der, "{rel}");
            let again = parse_certificate(&der).unwrap();
            assert_eq!(again.serial_hex, info.serial_hex);
            assert_eq!(again.issuer, info.issuer);
            let text_out = String::from_utf8(openssl(&["x509", "-noout", "-text", "-in", path])).unwrap();
            let alg = text_out
                .lines()
                .find_map(|l| l.trim().strip_prefix("Signature Algorithm: "))
                .unwrap();
            let oid = match alg {
                "sha256WithRSAEncryption" => "1.2.840.113549.1.1.11",
                "sha1WithRSAEncryption" => "1.2.840.113549.1.1.5",
                other => panic!("{rel}: {other}"),
            };
            assert_eq!(info.signature_algorithm, oid, "{rel}: {alg}");
            // The key openssl extracts from the certificate.
            let spki = openssl(&["x509", "-noout", "-pubkey", "-in", path]);
            let expected = RsaPublicKey::from_public_key_pem(std::str::from_utf8(&spki).unwrap()).unwrap();
            assert_eq!(info.rsa_public_key().unwrap(), expected, "{rel}");
            assert_eq!(
                parse_certificate(info.to_pem().unwrap().as_bytes()).unwrap().der,
                info.der
            );
        }
        assert!(parse_certificate(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----").is_err());
        assert!(parse_certificate(b"\x30\x03\x02\x01\x01").is_err());
    }

    #[test]
    fn the_alipay_root_bundle_splits_into_its_four_certificates() {
        let bundle = text("alipay/cert/alipayRootCert.crt");
        let certs = parse_pem_bundle(&bundle).unwrap();
        let algs: Vec<&str> = certs.iter().map(|c| c.signature_algorithm.as_str()).collect();
        // SM2-with-SM3, sha256WithRSA, ecdsa-with-SHA384, sha1WithRSA (as `openssl pkcs7
        // -print_certs -text` names them).
        assert_eq!(
            algs,
            [
                "1.2.156.10197.1.501",
                "1.2.840.113549.1.1.11",
                "1.2.840.10045.4.3.3",
                "1.2.840.113549.1.1.5"
            ]
        );
        assert_eq!(
            certs.iter().map(|c| c.public_key.is_some()).collect::<Vec<_>>(),
            [false, true, false, true]
        );
        assert_eq!(certs[0].subject, "CN=ROOTCA,O=NRCAC,C=CN");
        assert_eq!(
            certs[3].issuer,
            "CN=iTrusChina Class 2 Root CA - G3,OU=China Trust Network,O=iTrusChina,C=CN"
        );
        assert!(parse_pem_bundle("").is_err());
    }

    #[test]
    fn alipay_sns_match_the_published_vectors() {
        let v = json("alipay/cert/alipay_cert_sn_vectors.json");
        for which in ["app_cert_sn", "alipay_cert_sn"] {
            let pem = text(&format!("alipay/cert/{}", s(&v, &format!("/{which}/file"))));
            let info = parse_certificate(pem.as_bytes()).unwrap();
            assert_eq!(
                format!("{}{}", info.issuer, info.serial_decimal),
                s(&v, &format!("/{which}/md5_input"))
            );
            assert_eq!(
                alipay_cert_sn(&pem).unwrap(),
                s(&v, &format!("/{which}/expected")),
                "{which}"
            );
        }
        let root = text(&format!("alipay/cert/{}", s(&v, "/alipay_root_cert_sn/file")));
        assert_eq!(
            alipay_root_cert_sn(&root).unwrap(),
            s(&v, "/alipay_root_cert_sn/expected")
        );

        let key = alipay_public_key_from_cert(&text("alipay/cert/alipayCertPublicKey_RSA2.crt")).unwrap();
        let published = B64.decode(s(&v, "/alipay_cert_sn/public_key_base64")).unwrap();
        assert_eq!(key.to_public_key_der().unwrap().as_bytes(), published.as_slice());
        // The SM2 root has no RSA key to take.
        let sm2 = parse_pem_bundle(&root).unwrap()[0].to_pem().unwrap();
        assert_eq!(alipay_public_key_from_cert(&sm2), Err(CertError::NotRsa));
    }

    #[test]
    fn certificates_answers_decrypt_to_the_published_certificates() {
        let cases = [
            (
                "wechat/notify/wechatpay_go_certificates_download_vector.json",
                "/apiv3_key",
                "/response_file",
                "wechat/keys/wechatpay_go_platform_cert_D7CE59D1F522D701.pem",
            ),
            (
                "wechat/notify/wechatpay_java_vectors.json",
                "/certificates_download/apiv3_key",
                "/certificates_download/response_file",
                "wechat/keys/wechatpay_java_downloaded_platform_cert_5DEA10EF55877E3CF6C33255C2E7DEFFF7E427EC.pem",
            ),
        ];
        for (vector, key_at, file_at, cert_file) in cases {
            let v = json(vector);
            let key = s(&v, key_at).as_bytes();
            let answer_rel = format!("wechat/notify/{}", s(&v, file_at));
            let answer = read(&answer_rel);
            let published = json(&answer_rel);
            let certs = decrypt_certificates(key, &answer).unwrap();
            assert_eq!(certs.len(), 1, "{vector}");
            let c = &certs[0];
            assert_eq!(c.serial_no, s(&published, "/data/0/serial_no"));
            assert_eq!(c.pem.trim(), text(cert_file).trim(), "{vector}");
            assert_eq!(
                parse_certificate(c.pem.as_bytes()).unwrap().der,
                parse_certificate(&read(cert_file)).unwrap().der
            );
            assert_eq!(c.public_key, cert_key(cert_file));
            assert_eq!(
                c.effective_time,
                rfc3339("", s(&published, "/data/0/effective_time")).unwrap()
            );
            assert_eq!(
                c.expire_time,
                rfc3339("", s(&published, "/data/0/expire_time")).unwrap()
            );

            // Another key, and a ciphertext with one byte changed, are refused.
            let mut wrong = key.to_vec();
            wrong[0] ^= 1;
            assert!(matches!(
                decrypt_certificates(&wrong, &answer),
                Err(CertError::Undecryptable)
            ));
            let ct = s(&published, "/data/0/encrypt_certificate/ciphertext");
            let tampered = B64.encode(flip_one_byte(&B64.decode(ct).unwrap(), 10));
            let tampered = String::from_utf8(answer.clone()).unwrap().replace(ct, &tampered);
            assert!(matches!(
                decrypt_certificates(key, tampered.as_bytes()),
                Err(CertError::Undecryptable)
            ));
            assert!(matches!(
                decrypt_certificates(&key[..12], &answer),
                Err(CertError::BadKeyLength(12))
            ));
        }
    }

    #[test]
    fn gunsluo_certificates_answer_decrypts_but_names_another_serial() {
        let v = json("wechat/notify/gunsluo_v3_notify_vectors.json");
        let key = s(&v, "/apiv3_key").as_bytes();
        let answer = read("wechat/notify/gunsluo_v3_certificates_response.json");
        // The SDK author listed the mock certificate under another serial_no: refused.
        assert_eq!(
            decrypt_certificates(key, &answer).unwrap_err(),
            CertError::SerialMismatch {
                claimed: "477ED0046A54F0360A72A63A8F2816312AAEAB53".into(),
                actual: "9AD59953ADF1BABB".into()
            }
        );
        // ... and its ciphertext is the published certificate all the same.
        let a: Value = serde_json::from_slice(&answer).unwrap();
        let e = &a["data"][0]["encrypt_certificate"];
        let plain = aead_decrypt(key, s(e, "/nonce").as_bytes(), b"certificate", s(e, "/ciphertext")).unwrap();
        let file = read("wechat/keys/gunsluo_mock_cert_9AD59953ADF1BABB.pem");
        assert_eq!(
            parse_certificate(&plain).unwrap().der,
            parse_certificate(&file).unwrap().der
        );
    }

    #[test]
    fn aes_gcm_vectors_decrypt_with_16_and_32_byte_keys() {
        let go = json("wechat/notify/wechatpay_go_aes_gcm_vector.json");
        let (key, nonce, ad) = (s(&go, "/apiv3_key"), s(&go, "/nonce"), s(&go, "/associated_data"));
        let ct = s(&go, "/ciphertext");
        assert_eq!(key.len(), 16);
        let plain = aead_decrypt(key.as_bytes(), nonce.as_bytes(), ad.as_bytes(), ct).unwrap();
        assert_eq!(plain, s(&go, "/plaintext").as_bytes());
        assert_eq!(
            aead_decrypt(b"testAPIv3Key1111", nonce.as_bytes(), ad.as_bytes(), ct),
            Err(CertError::Undecryptable)
        );
        assert_eq!(
            aead_decrypt(key.as_bytes(), nonce.as_bytes(), ad.as_bytes(), "SGVsbG8gV29ybGQK"),
            Err(CertError::Undecryptable)
        );
        assert_eq!(
            aead_decrypt(key.as_bytes(), nonce.as_bytes(), ad.as_bytes(), "invalid cipher"),
            Err(CertError::BadBase64)
        );

        let java = json("wechat/notify/wechatpay_java_vectors.json");
        let (key, nonce, ad) = (
            s(&java, "/aead/apiv3_key"),
            s(&java, "/aead/nonce"),
            s(&java, "/aead/associated_data"),
        );
        let ct = s(&java, "/aead/ciphertext");
        assert_eq!(key.len(), 32);
        let plain = aead_decrypt(key.as_bytes(), nonce.as_bytes(), ad.as_bytes(), ct).unwrap();
        assert_eq!(plain, s(&java, "/aead/plaintext").as_bytes());
        let k = key.as_bytes();
        assert!(aead_decrypt(k, nonce.as_bytes(), b"bad-associatedData", ct).is_err());
        assert!(aead_decrypt(k, b"bad-4a9R25RW", ad.as_bytes(), ct).is_err());
        assert!(aead_decrypt(k, nonce.as_bytes(), ad.as_bytes(), &B64.encode([0u8; 128])).is_err());
        assert_eq!(
            aead_decrypt(&k[..24], nonce.as_bytes(), ad.as_bytes(), ct),
            Err(CertError::BadKeyLength(24))
        );

        // The notifications' resources.
        let gl = json("wechat/notify/gunsluo_v3_notify_vectors.json");
        for case in gl["cases"].as_array().unwrap() {
            let body = json(&format!("wechat/notify/{}", s(case, "/body_file")));
            let r = &body["resource"];
            let plain = aead_decrypt(
                s(&gl, "/apiv3_key").as_bytes(),
                s(r, "/nonce").as_bytes(),
                s(r, "/associated_data").as_bytes(),
                s(r, "/ciphertext"),
            )
            .unwrap();
            let expected = read(&format!("wechat/notify/{}", s(case, "/expected_plaintext_file")));
            assert_eq!(
                String::from_utf8(plain).unwrap().trim(),
                String::from_utf8(expected).unwrap().trim()
            );
        }
        let ps = json("wechat/notify/wechatpay_go_payscore_notify_vector.json");
        for file in [
            "wechatpay_go_payscore_notify.body.json",
            "wechatpay_java_notification_envelope.json",
        ] {
            let r = json(&format!("wechat/notify/{file}"))["resource"].clone();
            let plain = aead_decrypt(
                s(&ps, "/apiv3_key").as_bytes(),
                s(&r, "/nonce").as_bytes(),
                s(&r, "/associated_data").as_bytes(),
                s(&r, "/ciphertext"),
            )
            .unwrap();
            assert_eq!(plain, s(&ps, "/expected_plaintext").as_bytes(), "{file}");
        }
    }

    #[test]
    fn wechat_notifications_verify_with_their_published_keys_and_fail_when_touched() {
        let gl = json("wechat/notify/gunsluo_v3_notify_vectors.json");
        let gl_key = cert_key("wechat/keys/gunsluo_mock_cert_9AD59953ADF1BABB.pem");
        let ps = json("wechat/notify/wechatpay_go_payscore_notify_vector.json");
        let ps_key = cert_key("wechat/keys/wechatpay_go_platform_cert_D7CE59D1F522D701.pem");
        let mut cases: Vec<(&Value, &RsaPublicKey)> =
            gl["cases"].as_array().unwrap().iter().map(|c| (c, &gl_key)).collect();
        cases.push((&ps, &ps_key));
        for (case, key) in cases {
            let body = read(&format!("wechat/notify/{}", s(case, "/body_file")));
            let (ts, nonce) = (
                s(case, "/headers/Wechatpay-Timestamp"),
                s(case, "/headers/Wechatpay-Nonce"),
            );
            let sig = s(case, "/headers/Wechatpay-Signature");
            assert_eq!(
                wechat_sign_message(ts, nonce, &body),
                s(case, "/verify_message").as_bytes()
            );
            assert!(verify_wechat_signature(key, ts, nonce, &body, sig));
            for at in [0, body.len() / 2, body.len() - 1] {
                assert!(
                    !verify_wechat_signature(key, ts, nonce, &flip_one_byte(&body, at), sig),
                    "body byte {at}"
                );
            }
            let sig_bytes = B64.decode(sig).unwrap();
            assert!(!verify_wechat_signature(
                key,
                ts,
                nonce,
                &body,
                &B64.encode(flip_one_byte(&sig_bytes, 7))
            ));
            assert!(!verify_wechat_signature(key, &format!("{}1", ts), nonce, &body, sig));
            assert!(!verify_wechat_signature(key, ts, nonce, &body, "not base64!"));
        }

        // Bare SHA256withRSA vectors.
        let go = json("wechat/notify/wechatpay_go_sha256withrsa_verify_vector.json");
        let sig = s(&go, "/signature");
        for key in [
            cert_key("wechat/keys/wechatpay_go_platform_cert_F5765756002FDD77.pem"),
            pem_key("wechat/keys/wechatpay_go_pubkey_F5765756002FDD77.pem"),
        ] {
            assert!(verify_sha256_rsa(&key, s(&go, "/message").as_bytes(), sig));
            assert!(!verify_sha256_rsa(&key, b"wrong source", sig));
        }
        let java = json("wechat/notify/wechatpay_java_vectors.json");
        let merchant =
            cert_key("wechat/keys/wechatpay_java_merchant_certificate_5F1C72E2A8931B72A2E13AF8DEE92471EB397115.pem");
        let (msg, sig) = (s(&java, "/rsa_verify/message"), s(&java, "/rsa_verify/signature"));
        assert!(verify_sha256_rsa(&merchant, msg.as_bytes(), sig));
        assert!(!verify_sha256_rsa(&merchant, b"messagf", sig));
        assert!(!verify_sha256_rsa(
            &pem_key("wechat/keys/wechatpay_java_wechat_pay_public_key.pem"),
            msg.as_bytes(),
            sig
        ));
    }

    #[test]
    fn the_keyring_chooses_the_key_by_wechatpay_serial_in_both_modes() {
        // Certificates as /v3/certificates delivers them, plus the 微信支付公钥 of another key.
        let mut certs = decrypt_certificates(
            b"mockAPIv3Key1234",
            &read("wechat/notify/wechatpay_go_v3_certificates_response.json"),
        )
        .unwrap();
        certs.extend(
            decrypt_certificates(
                b"a7cde1ZJB1kG2e7VfTs3jQzaWizur8Gb",
                &read("wechat/notify/wechatpay_java_v3_certificates_response.json"),
            )
            .unwrap(),
        );
        // (The wechatpay-go certificates and public key share one RSA key; the Java one differs.)
        let pub_id = "PUB_KEY_ID_0000000000000024101100397200000006";
        let pubkey = pem_key("wechat/keys/wechatpay_java_wechat_pay_public_key.pem");
        let ring = Keyring::from_certs(&certs).with_public_key(pub_id, pubkey.clone());
        assert_eq!(
            ring.cert_serials(),
            ["5DEA10EF55877E3CF6C33255C2E7DEFFF7E427EC", "D7CE59D1F522D701"]
        );
        assert_eq!(ring.key_for(pub_id), Some(&pubkey));
        assert_eq!(
            ring.key_for("d7ce59d1f522d701"),
            Some(&cert_key("wechat/keys/wechatpay_go_platform_cert_D7CE59D1F522D701.pem"))
        );
        assert_eq!(ring.key_for("PUB_KEY_ID_0000000000000024101100397200000007"), None);
        assert_eq!(ring.key_for("F5765756002FDD77"), None);
        assert_eq!(
            ring.newest_cert().unwrap().serial_no,
            "5DEA10EF55877E3CF6C33255C2E7DEFFF7E427EC"
        );

        // The payscore notification names D7CE59D1F522D701: found and verified; under the
        // public key's ID it fails (another key); under an unknown serial it is unknown.
        let ps = json("wechat/notify/wechatpay_go_payscore_notify_vector.json");
        let body = read("wechat/notify/wechatpay_go_payscore_notify.body.json");
        let h = |k: &str| s(&ps, &format!("/headers/{k}")).to_string();
        let (ts, nonce, sig) = (h("Wechatpay-Timestamp"), h("Wechatpay-Nonce"), h("Wechatpay-Signature"));
        assert_eq!(ring.verify(&h("Wechatpay-Serial"), &ts, &nonce, &body, &sig), Ok(()));
        assert_eq!(
            ring.verify(pub_id, &ts, &nonce, &body, &sig),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            ring.verify(&h("Wechatpay-Serial"), &ts, &nonce, &flip_one_byte(&body, 3), &sig),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            ring.verify("ABCDEF", &ts, &nonce, &body, &sig),
            Err(VerifyError::UnknownSerial("ABCDEF".into()))
        );

        // Public-key mode alone: the wechatpay-go key under its ID verifies its vector.
        let go = json("wechat/notify/wechatpay_go_sha256withrsa_verify_vector.json");
        let go_pub = pem_key("wechat/keys/wechatpay_go_pubkey_F5765756002FDD77.pem");
        let only_pub = Keyring::new().with_public_key(s(&go, "/serial_or_pubkey_id"), go_pub);
        let key = only_pub.key_for(s(&go, "/serial_or_pubkey_id")).unwrap();
        assert!(verify_sha256_rsa(
            key,
            s(&go, "/message").as_bytes(),
            s(&go, "/signature")
        ));
        assert!(only_pub.key_for("D7CE59D1F522D701").is_none());

        // A certificate kept under the serial the gunsluo SDK maps it to verifies its notifications.
        let gl = json("wechat/notify/gunsluo_v3_notify_vectors.json");
        let mut mock = PlatformCert::from_pem(&text("wechat/keys/gunsluo_mock_cert_9AD59953ADF1BABB.pem")).unwrap();
        mock.serial_no = "477ED0046A54F0360A72A63A8F2816312AAEAB53".into();
        let mut ring = ring;
        ring.insert_cert(mock);
        for case in gl["cases"].as_array().unwrap() {
            let body = read(&format!("wechat/notify/{}", s(case, "/body_file")));
            let h = |k: &str| s(case, &format!("/headers/{k}")).to_string();
            assert_eq!(
                ring.verify(
                    &h("Wechatpay-Serial"),
                    &h("Wechatpay-Timestamp"),
                    &h("Wechatpay-Nonce"),
                    &body,
                    &h("Wechatpay-Signature")
                ),
                Ok(())
            );
        }
    }

    #[test]
    fn the_alipay_verifier_accepts_the_published_notification() {
        let v = json("alipay/notify/alipay_sdk_nodejs_notify_sign_vectors.json");
        let vectors = v["vectors"].as_array().unwrap();
        let fields = |vec: &Value| -> Vec<(String, String)> {
            vec["params"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect()
        };
        // Only the app id and Alipay's public key take part in verifying a notification.
        let app_key = RsaPrivateKey::new(&mut rand_core::OsRng, 512).unwrap();
        let keys_of = |vec: &Value| AlipayKeys {
            app_id: vec["params"]["app_id"].as_str().unwrap().to_string(),
            public_key: crate::payments::keys::parse_public_key(s(vec, "/alipay_public_key_base64_spki")).unwrap(),
            app_private_key: app_key.clone(),
            cert: None,
            root_cert_pem: None,
            renewed: Default::default(),
            api_base: String::new(),
            seller_id: None,
        };
        // The real trade notification: same signing string as the SDK's, verified.
        let real = &vectors[0];
        let f = fields(real);
        assert_eq!(alipay::signed_content(&f), s(real, "/expected_content"));
        assert_eq!(alipay::verify(&keys_of(real), &f), Ok(()));
        // As a form body, URL-encoded, it still verifies (values are decoded before signing).
        let form: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&f)
            .finish();
        assert_eq!(
            alipay::verify(&keys_of(real), &alipay::parse_form(form.as_bytes()).unwrap()),
            Ok(())
        );
        let mut touched = f.clone();
        touched.iter_mut().find(|(k, _)| k == "total_amount").unwrap().1 = "0.11".into();
        assert_eq!(
            alipay::verify(&keys_of(real), &touched),
            Err(alipay::AlipayError::BadSignature)
        );
        // sign_type must stay out of the signed string.
        let with_type = format!("{}&sign_type=RSA2", s(real, "/expected_content"));
        assert!(!verify_sha256_rsa(
            &keys_of(real).public_key,
            with_type.as_bytes(),
            s(real, "/params/sign")
        ));

        // The must-fail case fails.
        let fail = &vectors[1];
        assert_eq!(fail["expect"], Value::Bool(false));
        assert_eq!(
            alipay::verify(&keys_of(fail), &fields(fail)),
            Err(alipay::AlipayError::BadSignature)
        );

        // The open-platform message signs sign_type too (rsaCheckV2): not a trade notification,
        // and alipay::signed_content (rsaCheckV1) leaves sign_type out, exactly that pair.
        let open = &vectors[2];
        let key =
            RsaPublicKey::from_public_key_pem(&text("alipay/notify/alipay-notify-sign-public-key-v2.pem")).unwrap();
        assert!(verify_sha256_rsa(
            &key,
            s(open, "/expected_content").as_bytes(),
            s(open, "/params/sign")
        ));
        let ours = alipay::signed_content(&fields(open));
        assert_eq!(s(open, "/expected_content").replace("&sign_type=RSA2", ""), ours);
    }

    #[test]
    fn sandbox_certificates_round_trip_and_openssl_reads_them() {
        let key = RsaPrivateKey::new(&mut rand_core::OsRng, 2048).unwrap();
        let apiv3 = b"0123456789abcdef0123456789abcdef";
        let serials = ["5DEA10EF55877E3CF6C33255C2E7DEFFF7E427EC", "D7CE59D1F522D701"];
        let pems: Vec<String> = serials
            .iter()
            .map(|sn| self_signed_platform_cert(&key, sn, "fitorder, dev \"sandbox\"", 30).unwrap())
            .collect();
        let pairs: Vec<(&str, &str)> = serials.iter().copied().zip(pems.iter().map(String::as_str)).collect();
        let answer = encrypt_certificates_answer(apiv3, &pairs).unwrap();
        let certs = decrypt_certificates(apiv3, answer.as_bytes()).unwrap();
        assert_eq!(certs.len(), 2);
        let dir = std::env::temp_dir().join(format!("fitorder-certs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for ((sn, pem), c) in pairs.iter().zip(&certs) {
            assert_eq!(c.serial_no, *sn);
            assert_eq!(&c.pem, pem);
            assert_eq!(c.public_key, key.to_public_key());
            let days = (c.expire_time - c.effective_time).num_days();
            assert_eq!(days, 30);
            let path = dir.join(format!("{sn}.pem"));
            std::fs::write(&path, pem).unwrap();
            let p = path.to_str().unwrap();
            let out = String::from_utf8(openssl(&[
                "x509", "-noout", "-serial", "-nameopt", "RFC2253", "-subject", "-in", p,
            ]))
            .unwrap();
            assert!(out.contains(&format!("serial={sn}\n")), "{out}");
            assert!(
                out.contains(r#"subject=CN=fitorder\, dev \"sandbox\",OU=fitorder sandbox,O=fitorder,C=CN"#),
                "{out}"
            );
            // openssl checks the self-signature too.
            let ok = String::from_utf8(openssl(&["verify", "-CAfile", p, p])).unwrap();
            assert_eq!(ok.trim(), format!("{p}: OK"));
        }
        std::fs::remove_dir_all(&dir).unwrap();
        // The answer is signed by nothing but carries WeChat's fields; a wrong key cannot open it.
        assert!(decrypt_certificates(b"0123456789abcdef0123456789abcdeX", answer.as_bytes()).is_err());
    }
}
