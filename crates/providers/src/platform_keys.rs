//! WeChat Pay's keys and certificates: the configuration loaded ([`WechatKeys`]), the
//! `/v3/certificates` answer decrypted (AEAD_AES_256_GCM with the APIv3 key) into platform
//! certificates, the [`Keyring`] chosen by `Wechatpay-Serial`, the dev sandbox's self-signed
//! certificate, and the platform certificates kept in the database, so every instance verifies
//! with the same set, and the in-process [`SharedKeyring`] filled from it. The HTTP call to
//! `GET /v3/certificates` is the caller's: hand its answer body to
//! [`SharedKeyring::refresh_from_answer`].
//!
//! Refresh policy: at least every [`REFRESH_EVERY_SECS`] (WeChat: "间隔应小于12小时"), by the
//! background task, and when a notification or answer names an unknown `Wechatpay-Serial` — in
//! both modes: with a 微信支付公钥 configured, certificates still come during WeChat's switch.
//! The known serials are held in memory; an unknown one costs no database work on the request
//! path: it may start one refresh ([`SharedKeyring::unknown_serial`]), single-flight and at most
//! once per [`UNKNOWN_REFRESH_MIN_INTERVAL_SECS`] per process, run in a task of its own, which
//! the request waits for (bounded) before it looks the serial up again in memory. That refresh
//! fetches the certificates when it wins the claim ([`SharedKeyring::may_force_refresh`]: at most
//! once per [`FORCE_MIN_INTERVAL_SECS`] per process and across instances), else reloads what
//! another instance stored. Unknown serials are counted (`fitorder_wechat_unknown_serials_total`,
//! by outcome), so forged notifications naming made-up serials cost one refresh per interval
//! however many there are.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use aes_gcm::aead::{Aead, Payload};
use aes_gcm::{Aes128Gcm, Aes256Gcm, KeyInit, Nonce};
use anyhow::{Context, Result};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use chrono::{DateTime, FixedOffset, SecondsFormat, TimeDelta, Utc};
use diesel::prelude::*;
use diesel::upsert::excluded;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use futures_util::future::{BoxFuture, Shared};
use futures_util::FutureExt;
use rsa::pkcs1v15::{Signature, SigningKey};
use rsa::{RsaPrivateKey, RsaPublicKey};
use serde::Deserialize;
use sha2::Sha256;
use x509_cert::builder::{Builder, CertificateBuilder, Profile};
use x509_cert::der::EncodePem;
use x509_cert::name::Name;
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::SubjectPublicKeyInfoOwned;
use x509_cert::time::Validity;

use crate::config::WechatPayConfig;
use crate::db::schema::{wechat_platform_cert_refreshes as refreshes, wechat_platform_certs as certs};
use crate::payments::crypto::{bad, parse_certificate, CertError};
use crate::payments::keys::{check_base, read_private, read_public, whole};

/// The longest time between two fetches of the platform certificates (12 h).
pub const REFRESH_EVERY_SECS: i64 = 12 * 3600;
/// The shortest time between two forced fetches, per process and across instances (60 s).
pub const FORCE_MIN_INTERVAL_SECS: i64 = 60;
/// The shortest time between two refreshes started by unknown serials, per process (10 s): a
/// flood of forged notifications naming made-up serials costs at most one refresh this often
/// (one claim, and a fetch or a reload). WeChat retries a refused notification after 15 s, so a
/// serial that appeared meanwhile is looked for again by then.
pub const UNKNOWN_REFRESH_MIN_INTERVAL_SECS: i64 = 10;
/// How long a notification naming an unknown serial waits for the refresh in flight before it
/// is refused (the refresh goes on; WeChat retries).
pub const UNKNOWN_SERIAL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// The `wechat_platform_cert_refreshes` row this store uses.
pub const REFRESH_SCOPE: &str = "wechat";

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

/// The only algorithm `/v3/certificates` answers and notifications name.
pub const WECHAT_AEAD_ALGORITHM: &str = "AEAD_AES_256_GCM";

/// The associated data WeChat Pay uses for encrypted certificates.
pub const CERTIFICATE_ASSOCIATED_DATA: &str = "certificate";

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
        let message = crate::payments::wechat::signing::answer_message(timestamp, nonce, body);
        if crate::payments::crypto::verify(key, &message, signature_b64) {
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

/// Upserts platform certificates by serial (`fetched_at` becomes now); returns how many.
pub async fn store(conn: &mut AsyncPgConnection, platform_certs: &[PlatformCert]) -> Result<usize> {
    if platform_certs.is_empty() {
        return Ok(0);
    }
    let rows: Vec<_> = platform_certs
        .iter()
        .map(|c| {
            (
                certs::serial_no.eq(c.serial_no.to_ascii_uppercase()),
                certs::pem.eq(&c.pem),
                certs::effective_at.eq(Some(c.effective_time)),
                certs::expire_at.eq(Some(c.expire_time)),
            )
        })
        .collect();
    let n = diesel::insert_into(certs::table)
        .values(rows)
        .on_conflict(certs::serial_no)
        .do_update()
        .set((
            certs::pem.eq(excluded(certs::pem)),
            certs::effective_at.eq(excluded(certs::effective_at)),
            certs::expire_at.eq(excluded(certs::expire_at)),
            certs::fetched_at.eq(diesel::dsl::now),
        ))
        .execute(conn)
        .await
        .context("storing the platform certificates")?;
    Ok(n)
}

/// The stored platform certificates that have not expired (unreadable rows are skipped, logged).
pub async fn load(conn: &mut AsyncPgConnection) -> Result<Vec<PlatformCert>> {
    type Row = (String, String, Option<DateTime<Utc>>, Option<DateTime<Utc>>);
    let rows: Vec<Row> = certs::table
        .filter(certs::expire_at.is_null().or(certs::expire_at.gt(diesel::dsl::now)))
        .select((certs::serial_no, certs::pem, certs::effective_at, certs::expire_at))
        .order(certs::serial_no)
        .load(conn)
        .await
        .context("loading the platform certificates")?;
    let now = Utc::now();
    let mut out = Vec::with_capacity(rows.len());
    for (serial_no, pem, effective_at, expire_at) in rows {
        let parsed = parse_certificate(pem.as_bytes()).and_then(|info| Ok((info.rsa_public_key()?, info)));
        let (public_key, info) = match parsed {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(serial_no, error = %e, "skipping an unreadable stored platform certificate");
                continue;
            }
        };
        let expire_time = expire_at.unwrap_or(info.not_after);
        if expire_time <= now {
            continue;
        }
        out.push(PlatformCert {
            serial_no,
            effective_time: effective_at.unwrap_or(info.not_before),
            expire_time,
            pem,
            public_key,
        });
    }
    Ok(out)
}

/// When the certificates were last fetched successfully, by any instance.
pub async fn last_success(conn: &mut AsyncPgConnection) -> Result<Option<DateTime<Utc>>> {
    let t: Option<Option<DateTime<Utc>>> = refreshes::table
        .find(REFRESH_SCOPE)
        .select(refreshes::last_success_at)
        .first(conn)
        .await
        .optional()
        .context("reading the last certificate refresh")?;
    Ok(t.flatten())
}

/// A refresh started by an unknown serial, shared by every request that waits for it.
pub type Refresh = Shared<BoxFuture<'static, ()>>;

struct Inner {
    ring: Keyring,
    last_success: Option<DateTime<Utc>>,
    last_forced: Option<DateTime<Utc>>,
    /// When an unknown serial last started a refresh in this process.
    last_unknown_refresh: Option<DateTime<Utc>>,
    /// That refresh (finished or not).
    refresh: Option<Refresh>,
}

/// What unknown serials have cost this process, for tests and the log (the metric
/// `fitorder_wechat_unknown_serials_total` counts the same by outcome).
#[derive(Default)]
struct UnknownSerialCounts {
    /// Lookups of a serial nobody knows.
    seen: AtomicU64,
    /// Refreshes they started.
    refreshes: AtomicU64,
    /// Pool checkouts those refreshes made.
    db_visits: AtomicU64,
}

fn within(last: Option<DateTime<Utc>>, now: DateTime<Utc>, secs: i64) -> bool {
    last.is_some_and(|t| now >= t && now - t < TimeDelta::seconds(secs))
}

/// The process's WeChat Pay keyring (public key + platform certificates), shared by handlers
/// and refreshed from the database.
#[derive(Clone)]
pub struct SharedKeyring {
    inner: Arc<RwLock<Inner>>,
    unknown: Arc<UnknownSerialCounts>,
}

impl SharedKeyring {
    /// A keyring with the configured 微信支付公钥 (if any) and no certificates yet.
    pub fn new(public_key: Option<(String, RsaPublicKey)>) -> SharedKeyring {
        let mut ring = Keyring::new();
        ring.set_public_key(public_key);
        SharedKeyring {
            inner: Arc::new(RwLock::new(Inner {
                ring,
                last_success: None,
                last_forced: None,
                last_unknown_refresh: None,
                refresh: None,
            })),
            unknown: Arc::default(),
        }
    }

    /// [`SharedKeyring::new`], then [`SharedKeyring::reload`].
    pub async fn from_db(
        conn: &mut AsyncPgConnection,
        public_key: Option<(String, RsaPublicKey)>,
    ) -> Result<SharedKeyring> {
        let k = SharedKeyring::new(public_key);
        k.reload(conn).await?;
        Ok(k)
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the certificates with the stored, unexpired ones; returns how many.
    pub async fn reload(&self, conn: &mut AsyncPgConnection) -> Result<usize> {
        let loaded = load(conn).await?;
        let last = last_success(conn).await?;
        let n = loaded.len();
        let mut inner = self.write();
        inner.ring.replace_certs(loaded);
        inner.last_success = last;
        Ok(n)
    }

    /// A copy of the current keyring.
    pub fn snapshot(&self) -> Keyring {
        self.read().ring.clone()
    }

    /// The key a `Wechatpay-Serial` names (see [`Keyring::key_for`]).
    pub fn key_for(&self, serial: &str) -> Option<RsaPublicKey> {
        self.read().ring.key_for(serial).cloned()
    }

    /// Verifies with the key the `Wechatpay-Serial` names (see [`Keyring::verify`]).
    pub fn verify(
        &self,
        serial: &str,
        timestamp: &str,
        nonce: &str,
        body: &[u8],
        signature_b64: &str,
    ) -> Result<(), VerifyError> {
        self.read().ring.verify(serial, timestamp, nonce, body, signature_b64)
    }

    /// When the certificates were last fetched (by any instance, as of the last reload).
    pub fn last_refresh(&self) -> Option<DateTime<Utc>> {
        self.read().last_success
    }

    /// True when the last fetch is [`REFRESH_EVERY_SECS`] old or there was none.
    pub fn needs_refresh(&self, now: DateTime<Utc>) -> bool {
        self.last_refresh()
            .is_none_or(|t| now - t >= TimeDelta::seconds(REFRESH_EVERY_SECS))
    }

    /// A `Wechatpay-Serial` no key has, decided in memory (no database work here): the refresh to
    /// wait for — the one in flight, or one started now with `start` (spawned: it runs to its
    /// end whoever waits) when none was started in the last [`UNKNOWN_REFRESH_MIN_INTERVAL_SECS`]
    /// — or None: refused at once. Counted in `fitorder_wechat_unknown_serials_total`.
    pub fn unknown_serial(
        &self,
        now: DateTime<Utc>,
        start: impl FnOnce() -> BoxFuture<'static, ()>,
    ) -> Option<Refresh> {
        self.unknown.seen.fetch_add(1, Ordering::Relaxed);
        let mut inner = self.write();
        let in_flight = inner.refresh.as_ref().filter(|r| r.peek().is_none()).cloned();
        let (outcome, refresh) = if let Some(r) = in_flight {
            ("joined", Some(r))
        } else if within(inner.last_unknown_refresh, now, UNKNOWN_REFRESH_MIN_INTERVAL_SECS) {
            ("refused", None)
        } else {
            inner.last_unknown_refresh = Some(now);
            self.unknown.refreshes.fetch_add(1, Ordering::Relaxed);
            let task = tokio::spawn(start());
            let r = async move {
                let _ = task.await;
            }
            .boxed()
            .shared();
            inner.refresh = Some(r.clone());
            ("refresh", Some(r))
        };
        drop(inner);
        metrics::counter!("fitorder_wechat_unknown_serials_total", "outcome" => outcome).increment(1);
        refresh
    }

    /// A pool checkout made by a refresh an unknown serial started.
    pub fn count_unknown_serial_db_visit(&self) {
        self.unknown.db_visits.fetch_add(1, Ordering::Relaxed);
    }

    /// How many times an unknown serial was looked up.
    pub fn unknown_serials_seen(&self) -> u64 {
        AtomicU64::load(&self.unknown.seen, Ordering::Relaxed)
    }

    /// How many refreshes unknown serials started.
    pub fn unknown_serial_refreshes(&self) -> u64 {
        AtomicU64::load(&self.unknown.refreshes, Ordering::Relaxed)
    }

    /// How many pool checkouts those refreshes made.
    pub fn unknown_serial_db_visits(&self) -> u64 {
        AtomicU64::load(&self.unknown.db_visits, Ordering::Relaxed)
    }

    /// The refresh an unknown serial started last, to wait for (tests: before counting).
    pub fn unknown_serial_refresh(&self) -> Option<Refresh> {
        self.read().refresh.clone()
    }

    /// Claims a forced fetch (unknown serial): false when this process tried in the last
    /// [`FORCE_MIN_INTERVAL_SECS`], or another instance claimed one in that time.
    pub async fn may_force_refresh(&self, conn: &mut AsyncPgConnection, now: DateTime<Utc>) -> Result<bool> {
        let gap = TimeDelta::seconds(FORCE_MIN_INTERVAL_SECS);
        {
            let mut inner = self.write();
            if within(inner.last_forced, now, FORCE_MIN_INTERVAL_SECS) {
                return Ok(false);
            }
            inner.last_forced = Some(now);
        }
        // One statement: the row lock of ON CONFLICT DO UPDATE serializes racing instances, and
        // the WHERE is evaluated on the latest row, so exactly one of them gets a row back.
        #[derive(QueryableByName)]
        struct Claimed {
            #[diesel(sql_type = diesel::sql_types::Text)]
            #[allow(dead_code)]
            scope: String,
        }
        use diesel::sql_types::{Text, Timestamptz};
        let claimed: Vec<Claimed> = crate::db::sql::StaticQuery::new(include_str!("platform_keys/claim_refresh.sql"))
            .bind::<Text, _>(REFRESH_SCOPE) // $1
            .bind::<Timestamptz, _>(now) // $2
            .bind::<Timestamptz, _>(now - gap) // $3
            .load(conn)
            .await
            .context("claiming a platform certificate refresh")?;
        Ok(!claimed.is_empty())
    }

    /// Takes a fetched `/v3/certificates` answer: decrypts and checks it, stores the
    /// certificates, records the fetch and reloads; returns how many certificates it held.
    pub async fn refresh_from_answer(
        &self,
        conn: &mut AsyncPgConnection,
        apiv3_key: &[u8],
        body: &[u8],
    ) -> Result<usize> {
        let fetched = decrypt_certificates(apiv3_key, body).context("reading the /v3/certificates answer")?;
        conn.transaction(async |conn| -> Result<()> {
            store(conn, &fetched).await?;
            diesel::insert_into(refreshes::table)
                .values((
                    refreshes::scope.eq(REFRESH_SCOPE),
                    refreshes::last_success_at.eq(diesel::dsl::now),
                ))
                .on_conflict(refreshes::scope)
                .do_update()
                .set(refreshes::last_success_at.eq(diesel::dsl::now))
                .execute(conn)
                .await
                .context("recording the certificate refresh")?;
            Ok(())
        })
        .await?;
        self.reload(conn).await?;
        Ok(fetched.len())
    }
}

#[cfg(test)]
mod tests {
    //! The other side of the certificate and signature tests is published material
    //! (tests/provider-samples, see its SOURCES.md) or the openssl CLI, never this module.

    use serde_json::Value;

    use super::*;
    use crate::payments::crypto;
    use crate::payments::crypto::test_samples::*;
    use crate::payments::wechat::signing::answer_message;

    /// A WeChat Pay signature over `timestamp\nnonce\nbody\n`, checked as the clients and the
    /// callback check do it: the one message builder, the one RSA-SHA256 verification.
    fn verify_wechat_signature(key: &RsaPublicKey, ts: &str, nonce: &str, body: &[u8], sig: &str) -> bool {
        crypto::verify(key, &answer_message(ts, nonce, body), sig)
    }

    /// Handlers run on tokio's multi-threaded runtime: the keyring's futures must be Send
    /// (no lock guard held across an await). A compile-time check.
    #[allow(dead_code)]
    fn futures_are_send(k: &SharedKeyring, c: &mut AsyncPgConnection) {
        fn send<T: Send>(_: T) {}
        send(k.reload(c));
        send(k.may_force_refresh(c, Utc::now()));
        send(k.refresh_from_answer(c, b"", b""));
        send(store(c, &[]));
        send(load(c));
        fn shared<T: Send + Sync + Clone>() {}
        shared::<SharedKeyring>();
    }

    fn never() -> BoxFuture<'static, ()> {
        panic!("no second refresh may start")
    }

    #[tokio::test]
    async fn unknown_serials_start_one_refresh_per_interval_and_join_the_one_in_flight() {
        let k = SharedKeyring::new(None);
        let t0 = Utc::now();
        let (release, hold) = tokio::sync::oneshot::channel::<()>();
        let first = k
            .unknown_serial(t0, move || {
                async move {
                    let _ = hold.await;
                }
                .boxed()
            })
            .expect("the first unknown serial starts a refresh");
        // While it runs, every other unknown serial waits for that same refresh.
        for i in 0..100 {
            let joined = k.unknown_serial(t0 + TimeDelta::milliseconds(i * 50), never);
            assert!(joined.is_some_and(|r| r.peek().is_none()));
        }
        release.send(()).unwrap();
        first.await;
        // Done: refused at once until the interval has passed, then one more.
        let s = TimeDelta::seconds;
        assert!(k
            .unknown_serial(t0 + s(UNKNOWN_REFRESH_MIN_INTERVAL_SECS - 1), never)
            .is_none());
        let again = k.unknown_serial(t0 + s(UNKNOWN_REFRESH_MIN_INTERVAL_SECS + 1), || async {}.boxed());
        again.expect("a refresh a while later").await;
        assert_eq!((k.unknown_serials_seen(), k.unknown_serial_refreshes()), (103, 2));
        assert_eq!(
            k.unknown_serial_db_visits(),
            0,
            "counted by whoever goes to the database"
        );
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
            assert_eq!(answer_message(ts, nonce, &body), s(case, "/verify_message").as_bytes());
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
            assert!(crypto::verify(&key, s(&go, "/message").as_bytes(), sig));
            assert!(!crypto::verify(&key, b"wrong source", sig));
        }
        let java = json("wechat/notify/wechatpay_java_vectors.json");
        let merchant =
            cert_key("wechat/keys/wechatpay_java_merchant_certificate_5F1C72E2A8931B72A2E13AF8DEE92471EB397115.pem");
        let (msg, sig) = (s(&java, "/rsa_verify/message"), s(&java, "/rsa_verify/signature"));
        assert!(crypto::verify(&merchant, msg.as_bytes(), sig));
        assert!(!crypto::verify(&merchant, b"messagf", sig));
        assert!(!crypto::verify(
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
        assert!(crypto::verify(key, s(&go, "/message").as_bytes(), s(&go, "/signature")));
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
