//! Alipay's keys and certificates: the configuration loaded ([`AlipayKeys`]), certificate mode's
//! SNs and chain check, and certificate mode across a certificate renewal: an answer (or
//! notification) naming an `alipay_cert_sn` other than the configured `ALIPAY_PUBLIC_CERT` is
//! verified with that certificate, which fitorder takes from the database (another instance
//! fetched it) or downloads (`alipay.open.app.alipaycert.download`, done by the client), checks
//! against `ALIPAY_ROOT_CERT` ([`check_alipay_chain`], a path validation by webpki: a certificate
//! that does not chain to the root through CAs is refused) and stores for every instance. Stored
//! certificates are checked against the root again when loaded.
//!
//! What an unknown SN may cost is decided in memory first: a database lookup at most every
//! [`LOOKUP_MIN_INTERVAL_SECS`] and a download at most every [`DOWNLOAD_MIN_INTERVAL_SECS`] per
//! process, so answers or notifications naming made-up SNs cost no more than that.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Mutex, RwLock};

use anyhow::{Context, Result};
use chrono::{DateTime, TimeDelta, Utc};
use diesel::sql_types::{Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use md5::Digest;
use rsa::{RsaPrivateKey, RsaPublicKey};
use rustls_pki_types::{CertificateDer, SignatureVerificationAlgorithm, TrustAnchor, UnixTime};
use x509_cert::der::oid::AssociatedOid;
use x509_cert::der::Decode;
use x509_cert::ext::pkix::{BasicConstraints, KeyUsage};
use x509_cert::Certificate;

use crate::config::AlipayConfig;
use crate::crypto::{parse_pem_bundle, CertError, CertInfo, RSA_SIGNATURE_OID_PREFIX};
use crate::keys::{check_base, read_private, read_public, read_text, whole};

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
    pub renewed: RenewedCerts,
    pub api_base: String,
    /// Our seller id (`ALIPAY_SELLER_ID`); notifications naming another are refused.
    pub seller_id: Option<String>,
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
                let (key, sns) = self::cert_mode(
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

/// Certificate mode: the Alipay public key from its public-key certificate, and the SNs
/// requests carry (`app_cert_sn`, `alipay_root_cert_sn`) and answers must name.
pub fn cert_mode(app_cert: &str, public_cert: &str, root_cert: &str) -> Result<(RsaPublicKey, AlipayCertSns)> {
    let sns = AlipayCertSns {
        app_cert_sn: alipay_cert_sn(app_cert).context("ALIPAY_APP_CERT")?,
        alipay_root_cert_sn: alipay_root_cert_sn(root_cert).context("ALIPAY_ROOT_CERT")?,
        alipay_cert_sn: alipay_cert_sn(public_cert).context("ALIPAY_PUBLIC_CERT")?,
    };
    let key = alipay_public_key_from_cert(public_cert).context("ALIPAY_PUBLIC_CERT")?;
    Ok((key, sns))
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

/// The signature algorithms a chain may be signed with: RSA PKCS#1 v1.5 with SHA-256, 384 or 512,
/// by 2048- to 8192-bit keys. Alipay's RSA chain is sha256WithRSAEncryption throughout; the root
/// file's SM2 and ECDSA roots sign nothing in it, and its sha1WithRSA root's own signature is never
/// checked (a trust anchor is trusted as it is).
static CHAIN_ALGORITHMS: &[&dyn SignatureVerificationAlgorithm] = &[
    webpki::ring::RSA_PKCS1_2048_8192_SHA256,
    webpki::ring::RSA_PKCS1_2048_8192_SHA384,
    webpki::ring::RSA_PKCS1_2048_8192_SHA512,
];

/// The extended key usage an Alipay chain may name: any. Alipay's public-key certificates are
/// neither TLS server nor client certificates and name no EKU (nor do the intermediates above
/// them, nor do Alipay's SDKs ask for one), so requiring serverAuth or clientAuth, as webpki's
/// `KeyUsage` does when the extension is present, would refuse a renewal for a reason that is no
/// part of Alipay's scheme. What makes a certificate Alipay's is the path to `ALIPAY_ROOT_CERT`.
/// The extension must still be well formed (an empty one is refused by webpki itself).
struct AnyExtendedKeyUsage;

impl webpki::ExtendedKeyUsageValidator for AnyExtendedKeyUsage {
    fn validate(&self, purposes: webpki::KeyPurposeIdIter<'_, '_>) -> Result<(), webpki::Error> {
        for purpose in purposes {
            purpose?;
        }
        Ok(())
    }
}

/// The keyUsage extension of a certificate, if it has one (webpki does not look at it).
fn key_usage(der: &[u8]) -> Result<Option<KeyUsage>, String> {
    let cert = Certificate::from_der(der).map_err(|e| e.to_string())?;
    let Some(ext) = cert
        .tbs_certificate
        .extensions
        .iter()
        .flatten()
        .find(|e| e.extn_id == KeyUsage::OID)
    else {
        return Ok(None);
    };
    KeyUsage::from_der(ext.extn_value.as_bytes())
        .map(Some)
        .map_err(|e| format!("{} has a malformed keyUsage: {e}", cert.tbs_certificate.subject))
}

/// The certificates of the root file webpki can take as trust anchors; the others are left out.
/// webpki reads an anchor's subject and key without looking into the key, so all four of Alipay's
/// root file are anchors; its SM2 and ECDSA roots verify nothing here ([`CHAIN_ALGORITHMS`] are RSA
/// only), which is what the root SN (RSA-signed roots only) says too.
fn trust_anchors(roots: &[CertInfo]) -> Vec<TrustAnchor<'static>> {
    roots
        .iter()
        .filter_map(|root| {
            webpki::anchor_from_trusted_cert(&CertificateDer::from(root.der.as_slice()))
                .ok()
                .map(|anchor| anchor.to_owned())
        })
        .collect()
}

/// Whether a certificate says it is a CA (basicConstraints cA=true), for an error message.
fn is_ca(der: &[u8]) -> bool {
    Certificate::from_der(der).is_ok_and(|cert| {
        cert.tbs_certificate
            .extensions
            .iter()
            .flatten()
            .filter(|e| e.extn_id == BasicConstraints::OID)
            .any(|e| BasicConstraints::from_der(e.extn_value.as_bytes()).is_ok_and(|bc| bc.ca))
    })
}

/// Checks an Alipay public-key certificate (`alipay.open.app.alipaycert.download`'s content: the
/// certificate, maybe followed by its intermediates) against the root file, and returns the first
/// certificate. The path is validated by webpki (rustls-webpki): the first certificate is the end
/// entity, the others of the content are the intermediates it may use, and every certificate of
/// the root file webpki can take as a trust anchor is one. Every certificate of the path must be
/// valid at `now`, every signature sha256/384/512WithRSAEncryption and good, every issuer a CA
/// (basicConstraints cA=true) whose pathLenConstraint the path keeps to, the end entity not a CA,
/// and no extension critical that webpki does not know. On top of webpki: an intermediate with a
/// keyUsage must allow keyCertSign (RFC 5280 4.2.1.3; webpki leaves keyUsage alone), and the end
/// entity, whose key verifies Alipay's signatures, digitalSignature. Any extended key usage is
/// accepted ([`AnyExtendedKeyUsage`]).
pub fn check_alipay_chain(content_pem: &str, root_bundle_pem: &str, now: DateTime<Utc>) -> Result<CertInfo, CertError> {
    let untrusted = CertError::Untrusted;
    let chain = parse_pem_bundle(content_pem)?;
    let roots = parse_pem_bundle(root_bundle_pem)?;
    let leaf = chain[0].clone();
    leaf.rsa_public_key()?;
    let anchors = trust_anchors(&roots);
    if anchors.is_empty() {
        return Err(untrusted(
            "no certificate of the root file (ALIPAY_ROOT_CERT) can be a trust anchor".into(),
        ));
    }
    let intermediates: Vec<CertificateDer<'_>> = chain[1..]
        .iter()
        .map(|c| CertificateDer::from(c.der.as_slice()))
        .collect();
    let leaf_der = CertificateDer::from(leaf.der.as_slice());
    let end_entity = webpki::EndEntityCert::try_from(&leaf_der)
        .map_err(|e| untrusted(format!("{} cannot be validated: {e:?}", leaf.subject)))?;
    let time = UnixTime::since_unix_epoch(std::time::Duration::from_secs(
        u64::try_from(now.timestamp()).unwrap_or(0),
    ));
    // webpki calls this for each path it has validated up to an anchor; a refusal makes it try
    // the next path, and the reason is kept for the error.
    let refused: RefCell<Option<String>> = RefCell::new(None);
    let keyusage_allows_signing_certificates = |path: &webpki::VerifiedPath<'_>| -> Result<(), webpki::Error> {
        for ca in path.intermediate_certificates() {
            let why = match key_usage(ca.der().as_ref()) {
                Ok(Some(usage)) if !usage.key_cert_sign() => format!(
                    "{} issued a certificate of the chain but its keyUsage does not allow keyCertSign",
                    chain
                        .iter()
                        .find(|c| c.der == ca.der().as_ref())
                        .map_or("a certificate", |c| c.subject.as_str())
                ),
                Ok(_) => continue,
                Err(e) => e,
            };
            *refused.borrow_mut() = Some(why);
            // webpki's nearest word: a certificate that may not act as a CA did.
            return Err(webpki::Error::EndEntityUsedAsCa);
        }
        Ok(())
    };
    let verified = end_entity.verify_for_usage(
        CHAIN_ALGORITHMS,
        &anchors,
        &intermediates,
        time,
        AnyExtendedKeyUsage,
        None,
        Some(&keyusage_allows_signing_certificates),
    );
    let error = match verified {
        Ok(_) => {
            // Its key verifies Alipay's signatures: a keyUsage must allow that.
            return match key_usage(&leaf.der).map_err(untrusted)? {
                Some(usage) if !usage.digital_signature() => Err(untrusted(format!(
                    "{} has a keyUsage without digitalSignature: its key may not verify signatures",
                    leaf.subject
                ))),
                _ => Ok(leaf),
            };
        }
        Err(e) => e,
    };
    let why = match error {
        webpki::Error::EndEntityUsedAsCa => refused.take().unwrap_or_else(|| {
            let issuer_not_ca = chain[1..]
                .iter()
                .find(|c| !is_ca(&c.der) && chain.iter().any(|child| child.issuer == c.subject));
            match issuer_not_ca {
                Some(c) => format!(
                    "{} issued a certificate of the chain but is not a CA (no basicConstraints cA=true)",
                    c.subject
                ),
                None => {
                    "a certificate that is not a CA (no basicConstraints cA=true) issued another of the chain".into()
                }
            }
        }),
        webpki::Error::CertExpired { .. } | webpki::Error::CertNotValidYet { .. } => chain
            .iter()
            .find(|c| now < c.not_before || c.not_after < now)
            .map(|c| format!("{} is valid {} to {}", c.subject, c.not_before, c.not_after))
            .unwrap_or_else(|| format!("a certificate of the chain is not valid at {now}")),
        webpki::Error::PathLenConstraintViolated => {
            "the chain has more CAs below a CA than its basicConstraints pathLenConstraint allows".into()
        }
        webpki::Error::CaUsedAsEndEntity => format!(
            "{} is a CA certificate (basicConstraints cA=true), not an end entity",
            leaf.subject
        ),
        webpki::Error::UnknownIssuer => format!(
            "{} is not issued by the root certificate (ALIPAY_ROOT_CERT) nor by a certificate it issued",
            leaf.issuer
        ),
        webpki::Error::InvalidSignatureForPublicKey => {
            "a signature of the chain does not verify: a certificate names an issuer whose key did not sign it".into()
        }
        webpki::Error::UnsupportedCriticalExtension => {
            "a certificate of the chain has a critical extension webpki does not know".into()
        }
        other => format!("the chain does not validate: {other:?}"),
    };
    Err(untrusted(why))
}

/// Shortest time between two database lookups for unknown SNs, per process.
pub const LOOKUP_MIN_INTERVAL_SECS: i64 = 5;
/// Shortest time between two certificate downloads, per process.
pub const DOWNLOAD_MIN_INTERVAL_SECS: i64 = 60;

/// A checked Alipay public-key certificate.
#[derive(Clone, Debug)]
pub struct RenewedCert {
    pub sn: String,
    pub pem: String,
    pub public_key: RsaPublicKey,
    pub not_after: DateTime<Utc>,
}

/// Checks a downloaded (or stored) certificate against the root file; its SN is computed from
/// the certificate itself.
pub fn check(content_pem: &str, root_bundle_pem: &str, now: DateTime<Utc>) -> Result<RenewedCert, CertError> {
    let leaf = check_alipay_chain(content_pem, root_bundle_pem, now)?;
    Ok(RenewedCert {
        sn: alipay_sn(&leaf),
        pem: content_pem.trim().to_string(),
        public_key: leaf.rsa_public_key()?,
        not_after: leaf.not_after,
    })
}

/// What the process may do now about an SN it does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownSnStep {
    /// Look the SN up in the database, then download it.
    LookupThenDownload,
    /// Look it up in the database only (a download was made a moment ago).
    Lookup,
    /// Nothing: both were tried a moment ago.
    Nothing,
}

#[derive(Default)]
struct Gates {
    last_lookup: Option<DateTime<Utc>>,
    last_download: Option<DateTime<Utc>>,
}

fn within(last: Option<DateTime<Utc>>, now: DateTime<Utc>, secs: i64) -> bool {
    last.is_some_and(|t| now >= t && now - t < TimeDelta::seconds(secs))
}

/// The renewed Alipay certificates this process knows, by SN (the configured one is not here).
#[derive(Default)]
pub struct RenewedCerts {
    certs: RwLock<HashMap<String, RenewedCert>>,
    gates: Mutex<Gates>,
}

impl RenewedCerts {
    pub fn key_for(&self, sn: &str) -> Option<RsaPublicKey> {
        let certs = self.certs.read().unwrap_or_else(|e| e.into_inner());
        certs
            .get(sn)
            .filter(|c| c.not_after > Utc::now())
            .map(|c| c.public_key.clone())
    }

    /// Every known renewed key, newest certificate first (notifications name no SN).
    pub fn keys(&self) -> Vec<RsaPublicKey> {
        let certs = self.certs.read().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<&RenewedCert> = certs.values().filter(|c| c.not_after > Utc::now()).collect();
        all.sort_by_key(|c| std::cmp::Reverse(c.not_after));
        all.into_iter().map(|c| c.public_key.clone()).collect()
    }

    pub fn insert(&self, cert: RenewedCert) {
        let mut certs = self.certs.write().unwrap_or_else(|e| e.into_inner());
        certs.insert(cert.sn.clone(), cert);
    }

    /// Decided in memory: what an unknown SN may cost at `now`.
    pub fn unknown_sn_step(&self, now: DateTime<Utc>) -> UnknownSnStep {
        let mut g = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        if within(g.last_lookup, now, LOOKUP_MIN_INTERVAL_SECS) {
            return UnknownSnStep::Nothing;
        }
        g.last_lookup = Some(now);
        if within(g.last_download, now, DOWNLOAD_MIN_INTERVAL_SECS) {
            return UnknownSnStep::Lookup;
        }
        g.last_download = Some(now);
        UnknownSnStep::LookupThenDownload
    }
}

#[derive(diesel::QueryableByName)]
struct Stored {
    #[diesel(sql_type = Text)]
    alipay_cert_sn: String,
    #[diesel(sql_type = Text)]
    pem: String,
}

/// Loads the stored certificates that have not expired, each checked against the root again
/// (a row that does not chain is skipped and logged); returns how many are known after.
pub async fn reload(
    conn: &mut AsyncPgConnection,
    into: &RenewedCerts,
    root_bundle_pem: &str,
    now: DateTime<Utc>,
) -> Result<usize> {
    let rows: Vec<Stored> = diesel::sql_query(
        "SELECT alipay_cert_sn, pem FROM alipay_public_certs WHERE not_after > $1 ORDER BY alipay_cert_sn",
    )
    .bind::<Timestamptz, _>(now)
    .load(conn)
    .await
    .context("loading the stored Alipay certificates")?;
    for row in rows {
        match check(&row.pem, root_bundle_pem, now) {
            Ok(c) if c.sn == row.alipay_cert_sn => into.insert(c),
            Ok(c) => tracing::warn!(
                stored = row.alipay_cert_sn,
                actual = c.sn,
                "a stored Alipay certificate has another SN: skipped"
            ),
            Err(e) => {
                tracing::warn!(sn = row.alipay_cert_sn, error = %e, "a stored Alipay certificate is not trusted: skipped")
            }
        }
    }
    Ok(into.certs.read().unwrap_or_else(|e| e.into_inner()).len())
}

/// Stores a checked certificate for every instance (an SN already there is updated).
pub async fn store(conn: &mut AsyncPgConnection, cert: &RenewedCert) -> Result<()> {
    diesel::sql_query(
        "INSERT INTO alipay_public_certs (alipay_cert_sn, pem, not_after) VALUES ($1, $2, $3) \
         ON CONFLICT (alipay_cert_sn) DO UPDATE SET pem = EXCLUDED.pem, not_after = EXCLUDED.not_after, fetched_at = now()",
    )
    .bind::<Text, _>(&cert.sn)
    .bind::<Text, _>(&cert.pem)
    .bind::<Timestamptz, _>(cert.not_after)
    .execute(conn)
    .await
    .context("storing the Alipay certificate")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The other side of the certificate tests is published material (tests/provider-samples,
    //! see its SOURCES.md), never this module.

    use base64::engine::general_purpose::STANDARD as B64;
    use base64::Engine;
    use rsa::pkcs8::{DecodePublicKey, EncodePublicKey};
    use serde_json::Value;

    use super::*;
    use crate::alipay;
    use crate::crypto::test_samples::*;
    use crate::crypto::{self, parse_certificate};

    #[test]
    fn unknown_sns_cost_a_lookup_every_few_seconds_and_a_download_a_minute() {
        let r = RenewedCerts::default();
        let t0 = Utc::now();
        let s = TimeDelta::seconds;
        assert_eq!(r.unknown_sn_step(t0), UnknownSnStep::LookupThenDownload);
        for i in 0..100 {
            assert_eq!(
                r.unknown_sn_step(t0 + TimeDelta::milliseconds(i * 40)),
                UnknownSnStep::Nothing
            );
        }
        assert_eq!(r.unknown_sn_step(t0 + s(6)), UnknownSnStep::Lookup);
        assert_eq!(r.unknown_sn_step(t0 + s(7)), UnknownSnStep::Nothing);
        assert_eq!(r.unknown_sn_step(t0 + s(61)), UnknownSnStep::LookupThenDownload);
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
            public_key: crate::keys::parse_public_key(s(vec, "/alipay_public_key_base64_spki")).unwrap(),
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
        assert!(!crypto::verify(
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
        assert!(crypto::verify(
            &key,
            s(open, "/expected_content").as_bytes(),
            s(open, "/params/sign")
        ));
        let ours = alipay::signed_content(&fields(open));
        assert_eq!(s(open, "/expected_content").replace("&sign_type=RSA2", ""), ours);
    }
}

#[cfg(test)]
mod chain_tests {
    //! [`check_alipay_chain`] against a real Alipay chain (tests/provider-samples, see its
    //! README.md and SOURCES.md) and against chains made here with x509-cert's builder and signed
    //! by the rsa crate, never by the code under test: a leaf used as a CA, a pathLenConstraint
    //! exceeded, an expired intermediate, keyUsage that forbids what the chain does, extended key
    //! usages. Each refused chain has a twin that differs only in what is checked and is accepted.

    use std::str::FromStr;
    use std::sync::OnceLock;
    use std::time::Duration;

    use chrono::TimeZone;
    use rsa::pkcs1v15::{Signature, SigningKey};
    use rsa::signature::{SignatureEncoding, Signer};
    use sha2::Sha256;
    use x509_cert::builder::{Builder, CertificateBuilder, Profile};
    use x509_cert::der::asn1::{BitString, OctetString, UtcTime};
    use x509_cert::der::oid::ObjectIdentifier;
    use x509_cert::der::{Encode, EncodePem};
    use x509_cert::ext::pkix::{ExtendedKeyUsage, KeyUsages};
    use x509_cert::name::Name;
    use x509_cert::serial_number::SerialNumber;
    use x509_cert::spki::SubjectPublicKeyInfoOwned;
    use x509_cert::time::{Time, Validity};
    use x509_cert::TbsCertificate;

    use super::*;
    use crate::crypto::test_samples::text;

    const ROOT: &str = "CN=Test Root R1,OU=Certification Authority,O=Test,C=CN";
    const CA: &str = "CN=Test Class 2 R1,OU=Certification Authority,O=Test,C=CN";
    const CA2: &str = "CN=Test Class 2 R1 Sub,OU=Certification Authority,O=Test,C=CN";
    const LEAF: &str = "CN=Alipay-2088000000000000,OU=Alipay,O=Test,C=CN";
    const LEAF2: &str = "CN=Forged-2088000000000001,OU=Alipay,O=Test,C=CN";
    /// A merchant's app certificate under the same root (as Alipay's Class 1 R1 issues them).
    const MERCHANT: &str = "CN=2088000000000002-2021000000000000,OU=Alipay,O=Merchant,C=CN";

    fn at(y: i32, m: u32, d: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, m, d, 0, 0, 0).unwrap()
    }

    /// When the made-up chains are checked.
    fn now() -> DateTime<Utc> {
        at(2026, 6, 1)
    }

    /// Five 2048-bit keys (webpki takes no RSA signature by a smaller key), made once.
    fn key(i: usize) -> &'static RsaPrivateKey {
        static KEYS: OnceLock<Vec<RsaPrivateKey>> = OnceLock::new();
        &KEYS.get_or_init(|| {
            (0..5)
                .map(|_| RsaPrivateKey::new(&mut rand_core::OsRng, 2048).unwrap())
                .collect()
        })[i]
    }

    fn validity(from: DateTime<Utc>, to: DateTime<Utc>) -> Validity {
        let time = |t: DateTime<Utc>| {
            Time::UtcTime(UtcTime::from_unix_duration(Duration::from_secs(t.timestamp() as u64)).unwrap())
        };
        Validity {
            not_before: time(from),
            not_after: time(to),
        }
    }

    fn years() -> Validity {
        validity(at(2020, 1, 1), at(2040, 1, 1))
    }

    fn name(dn: &str) -> Name {
        Name::from_str(dn).unwrap()
    }

    /// A certificate of `subject` for `subject_key`, signed (sha256WithRSAEncryption) by `signer`
    /// as x509-cert's builder makes it for `profile` (Root: CA, keyCertSign; SubCA: CA with its
    /// pathLenConstraint, keyCertSign; Leaf: cA=false, digitalSignature), with `extra` extensions.
    fn issue(
        profile: Profile,
        subject: &str,
        subject_key: &RsaPrivateKey,
        signer: &RsaPrivateKey,
        validity: Validity,
        extra: Option<ExtendedKeyUsage>,
    ) -> Certificate {
        static SERIAL: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let signing = SigningKey::<Sha256>::new(signer.clone());
        let spki = SubjectPublicKeyInfoOwned::from_key(subject_key.to_public_key()).unwrap();
        let mut builder = CertificateBuilder::new(
            profile,
            SerialNumber::from(serial),
            validity,
            name(subject),
            spki,
            &signing,
        )
        .unwrap();
        if let Some(eku) = extra {
            builder.add_extension(&eku).unwrap();
        }
        builder.build::<Signature>().unwrap()
    }

    fn root() -> Certificate {
        issue(Profile::Root, ROOT, key(0), key(0), years(), None)
    }

    fn sub_ca(subject: &str, subject_key: usize, issuer: &str, signer: usize, path_len: Option<u8>) -> Certificate {
        let profile = Profile::SubCA {
            issuer: name(issuer),
            path_len_constraint: path_len,
        };
        issue(profile, subject, key(subject_key), key(signer), years(), None)
    }

    fn leaf_profile(issuer: &str) -> Profile {
        Profile::Leaf {
            issuer: name(issuer),
            enable_key_agreement: false,
            enable_key_encipherment: true,
        }
    }

    fn leaf(subject: &str, subject_key: usize, issuer: &str, signer: usize) -> Certificate {
        issue(
            leaf_profile(issuer),
            subject,
            key(subject_key),
            key(signer),
            years(),
            None,
        )
    }

    /// `cert` changed by `edit` and signed again by `signer` (its issuer's key).
    fn edited(mut cert: Certificate, signer: usize, edit: impl FnOnce(&mut TbsCertificate)) -> Certificate {
        edit(&mut cert.tbs_certificate);
        let tbs = cert.tbs_certificate.to_der().unwrap();
        let signature = SigningKey::<Sha256>::new(key(signer).clone()).sign(&tbs);
        cert.signature = BitString::from_bytes(&signature.to_bytes()).unwrap();
        cert
    }

    fn without_basic_constraints(tbs: &mut TbsCertificate) {
        tbs.extensions
            .as_mut()
            .unwrap()
            .retain(|e| e.extn_id != BasicConstraints::OID);
    }

    fn with_key_usage(
        usages: impl Into<x509_cert::der::flagset::FlagSet<KeyUsages>>,
    ) -> impl FnOnce(&mut TbsCertificate) {
        let value = KeyUsage(usages.into()).to_der().unwrap();
        move |tbs| {
            let ext = tbs
                .extensions
                .as_mut()
                .unwrap()
                .iter_mut()
                .find(|e| e.extn_id == KeyUsage::OID)
                .unwrap();
            ext.extn_value = OctetString::new(value).unwrap();
        }
    }

    fn pem(certs: &[&Certificate]) -> String {
        certs
            .iter()
            .map(|c| c.to_pem(x509_cert::der::pem::LineEnding::LF).unwrap())
            .collect()
    }

    fn roots() -> String {
        pem(&[&root()])
    }

    fn check_at(content: &[&Certificate], now: DateTime<Utc>) -> Result<CertInfo, CertError> {
        check_alipay_chain(&pem(content), &roots(), now)
    }

    #[track_caller]
    fn refused(result: Result<CertInfo, CertError>, why: &str) {
        match result {
            Err(CertError::Untrusted(reason)) => assert!(reason.contains(why), "{reason:?} does not say {why:?}"),
            other => panic!("expected Untrusted({why:?}), got {other:?}"),
        }
    }

    #[test]
    fn the_sdks_sample_certificate_alone_does_not_reach_the_real_root_file() {
        // alipayCertPublicKey_RSA2.crt (2020 to 2022) is issued by Alipay's "Class 2 R1"
        // intermediate, which the root file does not hold: alone, within its validity, it is
        // refused, naming the issuer it could not find.
        let root_file = text("alipay/cert/alipayRootCert.crt");
        let sample = text("alipay/cert/alipayCertPublicKey_RSA2.crt");
        refused(
            check_alipay_chain(&sample, &root_file, at(2021, 6, 1)),
            "CN=Ant Financial Certification Authority Class 2 R1,OU=Certification Authority,O=Ant Financial,C=CN is not issued by",
        );
    }

    #[test]
    fn every_root_of_the_real_root_file_is_an_anchor() {
        let roots = parse_pem_bundle(&text("alipay/cert/alipayRootCert.crt")).unwrap();
        let anchors = trust_anchors(&roots);
        assert_eq!(anchors.len(), 4);
        for (root, anchor) in roots.iter().zip(&anchors) {
            assert_eq!(anchor.subject.as_ref(), subject_der(&root.der), "{}", root.subject);
        }
        // What webpki cannot read is left out (a root file left with no anchor is refused).
        let mut broken = roots[1].clone();
        broken.der.truncate(40);
        assert!(trust_anchors(&[broken]).is_empty());
    }

    fn subject_der(der: &[u8]) -> Vec<u8> {
        let cert = Certificate::from_der(der).unwrap();
        // A trust anchor's subject is the Name's content, without its SEQUENCE header.
        cert.tbs_certificate
            .subject
            .0
            .iter()
            .flat_map(|rdn| rdn.to_der().unwrap())
            .collect()
    }

    #[test]
    fn a_chain_made_here_is_accepted() {
        let ca = sub_ca(CA, 1, ROOT, 0, None);
        let leaf = leaf(LEAF, 2, CA, 1);
        let info = check_at(&[&leaf, &ca], now()).unwrap();
        assert_eq!(info.subject, LEAF);
        // A certificate the root issued itself needs no intermediate.
        assert!(check_at(&[&self::leaf(LEAF, 2, ROOT, 0)], now()).is_ok());
        // The intermediates may come in any order, with others that lead nowhere.
        let ca2 = sub_ca(CA2, 3, CA, 1, None);
        let under_ca2 = self::leaf(LEAF, 2, CA2, 3);
        let stray = sub_ca("CN=Stray,O=Test,C=CN", 4, "CN=Nobody,O=Test,C=CN", 4, None);
        assert!(check_at(&[&under_ca2, &stray, &ca, &ca2], now()).is_ok());
    }

    #[test]
    fn a_leaf_signed_leaf_is_refused() {
        // A merchant's certificate under the root (basicConstraints cA=false) signs one of its own.
        let merchant = leaf(MERCHANT, 1, ROOT, 0);
        let forged = leaf(LEAF2, 2, MERCHANT, 1);
        let not_a_ca = format!("{MERCHANT} issued a certificate of the chain but is not a CA");
        refused(check_at(&[&forged, &merchant], now()), &not_a_ca);
        // Without basicConstraints at all, it is no CA either.
        let bare = edited(leaf(MERCHANT, 1, ROOT, 0), 0, without_basic_constraints);
        assert!(bare
            .tbs_certificate
            .extensions
            .iter()
            .flatten()
            .all(|e| e.extn_id != BasicConstraints::OID));
        refused(check_at(&[&forged, &bare], now()), &not_a_ca);
        // The same two certificates, the first made a CA by the root: accepted.
        assert!(check_at(&[&forged, &sub_ca(MERCHANT, 1, ROOT, 0, None)], now()).is_ok());
    }

    #[test]
    fn a_ca_below_a_path_length_of_zero_is_refused() {
        let leaf = leaf(LEAF, 3, CA2, 2);
        let ca2 = sub_ca(CA2, 2, CA, 1, None);
        let zero = sub_ca(CA, 1, ROOT, 0, Some(0));
        refused(check_at(&[&leaf, &ca2, &zero], now()), "pathLenConstraint");
        // A pathLenConstraint of 1 allows that one CA below it.
        assert!(check_at(&[&leaf, &ca2, &sub_ca(CA, 1, ROOT, 0, Some(1))], now()).is_ok());
        // And a pathLenConstraint of 0 allows the leaf right below it.
        assert!(check_at(&[&self::leaf(LEAF, 3, CA, 1), &zero], now()).is_ok());
    }

    #[test]
    fn an_expired_or_not_yet_valid_intermediate_is_refused() {
        let leaf = leaf(LEAF, 2, CA, 1);
        let profile = || Profile::SubCA {
            issuer: name(ROOT),
            path_len_constraint: None,
        };
        let expired = issue(
            profile(),
            CA,
            key(1),
            key(0),
            validity(at(2016, 1, 1), at(2026, 1, 1)),
            None,
        );
        refused(
            check_at(&[&leaf, &expired], now()),
            &format!("{CA} is valid 2016-01-01"),
        );
        let early = issue(
            profile(),
            CA,
            key(1),
            key(0),
            validity(at(2027, 1, 1), at(2037, 1, 1)),
            None,
        );
        refused(check_at(&[&leaf, &early], now()), &format!("{CA} is valid 2027-01-01"));
        // Within their validity both are good.
        assert!(check_at(&[&leaf, &expired], at(2025, 6, 1)).is_ok());
        assert!(check_at(&[&leaf, &early], at(2028, 6, 1)).is_ok());
    }

    #[test]
    fn an_intermediate_whose_key_usage_does_not_allow_signing_certificates_is_refused() {
        let leaf = leaf(LEAF, 2, CA, 1);
        let ca = edited(
            sub_ca(CA, 1, ROOT, 0, None),
            0,
            with_key_usage(KeyUsages::DigitalSignature),
        );
        refused(check_at(&[&leaf, &ca], now()), "does not allow keyCertSign");
        let ca = edited(sub_ca(CA, 1, ROOT, 0, None), 0, with_key_usage(KeyUsages::KeyCertSign));
        assert!(check_at(&[&leaf, &ca], now()).is_ok());
    }

    #[test]
    fn a_certificate_whose_key_usage_does_not_allow_signatures_is_refused() {
        let ca = sub_ca(CA, 1, ROOT, 0, None);
        let leaf = edited(leaf(LEAF, 2, CA, 1), 1, with_key_usage(KeyUsages::KeyEncipherment));
        refused(check_at(&[&leaf, &ca], now()), "without digitalSignature");
    }

    #[test]
    fn a_ca_certificate_is_no_alipay_certificate() {
        let ca = sub_ca(CA, 1, ROOT, 0, None);
        refused(check_at(&[&ca], now()), "is a CA certificate");
    }

    #[test]
    fn a_certificate_signed_by_another_key_under_the_roots_name_is_refused() {
        let forged = leaf(LEAF, 2, ROOT, 4);
        refused(check_at(&[&forged], now()), "a signature of the chain does not verify");
    }

    #[test]
    fn no_extended_key_usage_is_required() {
        let code_signing = || {
            Some(ExtendedKeyUsage(vec![ObjectIdentifier::new_unwrap(
                "1.3.6.1.5.5.7.3.3",
            )]))
        };
        let server_auth = || {
            Some(ExtendedKeyUsage(vec![ObjectIdentifier::new_unwrap(
                "1.3.6.1.5.5.7.3.1",
            )]))
        };
        let leaf = issue(leaf_profile(CA), LEAF, key(2), key(1), years(), code_signing());
        let ca_profile = Profile::SubCA {
            issuer: name(ROOT),
            path_len_constraint: None,
        };
        let ca = issue(ca_profile, CA, key(1), key(0), years(), server_auth());
        assert!(check_at(&[&leaf, &ca], now()).is_ok());
    }
}
