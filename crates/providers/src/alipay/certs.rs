//! Alipay's keys and certificates: the configuration loaded ([`AlipayKeys`]), certificate mode's
//! SNs and chain check, and certificate mode across a certificate renewal: an answer (or
//! notification) naming an `alipay_cert_sn` other than the configured `ALIPAY_PUBLIC_CERT` is
//! verified with that certificate, which fitorder takes from the database (another instance
//! fetched it) or downloads (`alipay.open.app.alipaycert.download`, done by the client), checks
//! against `ALIPAY_ROOT_CERT` ([`check_alipay_chain`]: a certificate that does not chain to the
//! root is refused) and stores for every instance. Stored certificates are checked against the
//! root again when loaded.
//!
//! What an unknown SN may cost is decided in memory first: a database lookup at most every
//! [`LOOKUP_MIN_INTERVAL_SECS`] and a download at most every [`DOWNLOAD_MIN_INTERVAL_SECS`] per
//! process, so answers or notifications naming made-up SNs cost no more than that.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};

use anyhow::{Context, Result};
use chrono::{DateTime, TimeDelta, Utc};
use diesel::sql_types::{Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use md5::Digest;
use rsa::{RsaPrivateKey, RsaPublicKey};

use crate::config::AlipayConfig;
use crate::payments::crypto::{is_issued_by, parse_pem_bundle, CertError, CertInfo, RSA_SIGNATURE_OID_PREFIX};
use crate::payments::keys::{check_base, read_private, read_public, read_text, whole};

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
    use crate::payments::alipay;
    use crate::payments::crypto::test_samples::*;
    use crate::payments::crypto::{self, parse_certificate};

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
