//! RSA-SHA256 (PKCS#1 v1.5, base64), the one signature both providers use: WeChat Pay v3
//! (`WECHATPAY2-SHA256-RSA2048`, client pay parameters, answers, notifications and the
//! `/v3/certificates` answer) and Alipay (`RSA2`, requests, order strings, answers and
//! notifications). Beside it what else both providers' key material needs: RSA keys from PEM,
//! and X.509 certificates read. What is one provider's own is in its module: WeChat Pay's in
//! `platform_keys`, Alipay's in `alipay::certs` (with the chain check, by webpki).

use anyhow::Context;
use base64::Engine;
use chrono::{DateTime, Utc};
use rsa::pkcs1::{DecodeRsaPrivateKey, DecodeRsaPublicKey};
use rsa::pkcs1v15::{Signature, SigningKey, VerifyingKey};
use rsa::pkcs8::{DecodePrivateKey, DecodePublicKey};
use rsa::signature::{SignatureEncoding, Signer, Verifier};
use rsa::{BigUint, RsaPrivateKey, RsaPublicKey};
use sha2::Sha256;
use x509_cert::der::{Decode, Encode, EncodePem};
use x509_cert::Certificate;

use super::seen::Seen;

const B64: base64::engine::general_purpose::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The base64 SHA256withRSA signature of `message`. Signed by `ring` (already in the tree
/// through rustls) with the key pair parsed once per key: the `rsa` crate's private-key
/// operation is several times slower (BENCHMARKS.md, "RSA").
pub fn sign(key: &RsaPrivateKey, message: &[u8]) -> String {
    let by_ring = ring_key_pair(key).and_then(|pair| {
        let mut sig = vec![0u8; pair.public().modulus_len()];
        let rng = ring::rand::SystemRandom::new();
        pair.sign(&ring::signature::RSA_PKCS1_SHA256, &rng, message, &mut sig)
            .ok()
            .map(|()| sig)
    });
    // ring refuses keys under 2048 bits (only test keys are): the rsa crate signs those.
    let sig = by_ring.unwrap_or_else(|| SigningKey::<Sha256>::new(key.clone()).sign(message).to_vec());
    B64.encode(sig)
}

/// ring's key pair for `key`, parsed once: a private key is a configuration value, so the few
/// there are (the merchant's, the app's) stay parsed for the life of the process.
fn ring_key_pair(key: &RsaPrivateKey) -> Option<std::sync::Arc<ring::rsa::KeyPair>> {
    use rsa::pkcs1::EncodeRsaPrivateKey;
    use rsa::traits::PublicKeyParts;
    use std::sync::{Arc, Mutex};
    type Parsed = Vec<(Vec<u8>, Option<Arc<ring::rsa::KeyPair>>)>;
    static PARSED: Mutex<Parsed> = Mutex::new(Vec::new());
    let modulus = key.n().to_bytes_be();
    let mut parsed = PARSED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, pair)) = parsed.iter().find(|(n, _)| *n == modulus) {
        return pair.clone();
    }
    let pair = key
        .to_pkcs1_der()
        .ok()
        .and_then(|der| ring::rsa::KeyPair::from_der(der.as_bytes()).ok())
        .map(Arc::new);
    // Bounded: a process holds a handful of keys; a test generating many starts afresh.
    if parsed.len() >= 64 {
        parsed.clear();
    }
    parsed.push((modulus, pair.clone()));
    pair
}

/// Whether `signature_b64` is `key`'s SHA256withRSA signature of `message`. Verified by
/// `ring` (from the public key's modulus and exponent), about 10× faster than the `rsa` crate
/// on this path (BENCHMARKS.md, "RSA"); keys under 2048 bits fall back to the `rsa` crate.
pub fn verify(key: &RsaPublicKey, message: &[u8], signature_b64: &str) -> bool {
    B64.decode(signature_b64.trim())
        .is_ok_and(|raw| verify_bytes(key, message, &raw))
}

/// [`verify`] of a signature as bytes.
pub fn verify_bytes(key: &RsaPublicKey, message: &[u8], raw: &[u8]) -> bool {
    use rsa::traits::PublicKeyParts;
    let (n, e) = (key.n().to_bytes_be(), key.e().to_bytes_be());
    let seen = Seen::digest(&[&n, &e, message, raw]);
    if VERIFIED.contains(&seen) {
        return true;
    }
    let ok = if n.len() >= 256 {
        let components = ring::signature::RsaPublicKeyComponents { n: &n, e: &e };
        components
            .verify(&ring::signature::RSA_PKCS1_2048_8192_SHA256, message, raw)
            .is_ok()
    } else {
        Signature::try_from(raw).is_ok_and(|sig| VerifyingKey::<Sha256>::new(key.clone()).verify(message, &sig).is_ok())
    };
    if ok {
        VERIFIED.insert(seen);
    }
    ok
}

/// The signatures verified lately, by the SHA-256 of (key, message, signature): a provider
/// sends the same notification again and again until it hears our answer (B2 in
/// BENCHMARKS.md), and the same bytes under the same key verify the same way. Only successes
/// are kept, so a forgery is checked every time; bounded, oldest out first.
static VERIFIED: Seen = Seen::new(VERIFIED_KEEP);

const VERIFIED_KEEP: usize = super::seen::KEEP;

/// A random nonce of `n` letters and digits (WeChat Pay asks for at most 32).
pub fn nonce(n: usize) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::rng();
    (0..n)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Reads an RSA public key in PEM (`PUBLIC KEY` or `RSA PUBLIC KEY`), or a bare base64 body
/// as Alipay's console hands it out.
pub fn parse_public_key(text: &str) -> anyhow::Result<RsaPublicKey> {
    let text = text.trim();
    if text.contains("BEGIN RSA PUBLIC KEY") {
        return RsaPublicKey::from_pkcs1_pem(text).context("not an RSA PUBLIC KEY PEM");
    }
    if text.contains("BEGIN PUBLIC KEY") {
        return RsaPublicKey::from_public_key_pem(text).context("not a PUBLIC KEY PEM");
    }
    let der = B64
        .decode(text.split_whitespace().collect::<String>())
        .context("neither PEM nor base64")?;
    RsaPublicKey::from_public_key_der(&der).context("not an RSA public key")
}

/// Reads an RSA private key in PEM (`PRIVATE KEY` or `RSA PRIVATE KEY`).
pub fn parse_private_key(text: &str) -> anyhow::Result<RsaPrivateKey> {
    let text = text.trim();
    if text.contains("BEGIN RSA PRIVATE KEY") {
        return RsaPrivateKey::from_pkcs1_pem(text).context("not an RSA PRIVATE KEY PEM");
    }
    RsaPrivateKey::from_pkcs8_pem(text).context("not a PRIVATE KEY PEM")
}

/// The OID of `rsaEncryption` keys.
pub const RSA_ENCRYPTION_OID: &str = "1.2.840.113549.1.1.1";

/// The prefix of the PKCS#1 (RSA) signature algorithm OIDs.
pub const RSA_SIGNATURE_OID_PREFIX: &str = "1.2.840.113549.1.1.";

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

pub(crate) fn bad(e: impl std::fmt::Display) -> CertError {
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

/// The provider samples the key material's tests check against (`tests/provider-samples`,
/// sources in its SOURCES.md), and the openssl CLI.
#[cfg(test)]
pub(crate) mod test_samples {
    use std::path::PathBuf;
    use std::process::Command;

    use super::parse_certificate;
    use rsa::pkcs8::DecodePublicKey;
    use rsa::RsaPublicKey;
    use serde_json::Value;

    pub(crate) fn samples() -> PathBuf {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/provider-samples");
        assert!(
            p.is_dir(),
            "{} is missing: the provider samples sit beside the checkout",
            p.display()
        );
        p
    }

    pub(crate) fn read(rel: &str) -> Vec<u8> {
        let p = samples().join(rel);
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    pub(crate) fn text(rel: &str) -> String {
        String::from_utf8(read(rel)).unwrap()
    }

    pub(crate) fn json(rel: &str) -> Value {
        serde_json::from_slice(&read(rel)).unwrap()
    }

    pub(crate) fn s<'a>(v: &'a Value, path: &str) -> &'a str {
        v.pointer(path)
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no string at {path}"))
    }

    pub(crate) fn flip_one_byte(data: &[u8], at: usize) -> Vec<u8> {
        let mut d = data.to_vec();
        d[at] ^= 0x01;
        d
    }

    pub(crate) fn openssl(args: &[&str]) -> Vec<u8> {
        let out = Command::new("openssl").args(args).output().expect("the openssl CLI");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    pub(crate) fn cert_key(rel: &str) -> RsaPublicKey {
        parse_certificate(&read(rel)).unwrap().rsa_public_key().unwrap()
    }

    pub(crate) fn pem_key(rel: &str) -> RsaPublicKey {
        RsaPublicKey::from_public_key_pem(&text(rel)).unwrap()
    }
}

#[cfg(test)]
mod tests {
    //! The certificates' other side is published material (tests/provider-samples) or the
    //! openssl CLI, never this module.

    use super::test_samples::*;
    use super::*;
    use rsa::traits::PublicKeyParts;

    fn key() -> RsaPrivateKey {
        RsaPrivateKey::new(&mut rand_core::OsRng, 2048).unwrap()
    }

    #[test]
    fn ring_signs_what_the_rsa_crate_verifies_and_the_other_way() {
        let k = key();
        let msg = b"GET\n/v3/certificates\n1554208460\n593BEC0C930BF1AFEB40B4A08C8FB242\n\n";
        let ours = sign(&k, msg);
        // PKCS#1 v1.5 is deterministic: ring's signature is the rsa crate's, byte for byte.
        let theirs = B64.encode(SigningKey::<Sha256>::new(k.clone()).sign(msg).to_bytes());
        assert_eq!(ours, theirs);
        assert!(verify(&k.to_public_key(), msg, &ours));
    }

    #[test]
    fn a_cached_success_never_lets_a_forgery_or_another_key_through() {
        let (k, other) = (key(), key());
        let msg = b"1554208460\nnonce\n{\"id\":\"EV-2018022511223320873\"}\n";
        let sig = sign(&k, msg);
        assert!(verify(&k.to_public_key(), msg, &sig));
        // Again: answered from the cache, still true.
        assert!(verify(&k.to_public_key(), msg, &sig));
        // The same signature under another key, another message, or a changed signature: false.
        assert!(!verify(&other.to_public_key(), msg, &sig));
        assert!(!verify(&k.to_public_key(), b"another message", &sig));
        let mut raw = B64.decode(&sig).unwrap();
        raw[10] ^= 1;
        assert!(!verify(&k.to_public_key(), msg, &B64.encode(&raw)));
        assert!(!verify(&k.to_public_key(), msg, "not base64!"));
        assert_eq!(k.n().to_bytes_be().len(), 256);
    }

    #[test]
    fn the_cache_is_bounded() {
        for i in 0..(VERIFIED_KEEP + 10) {
            VERIFIED.insert(Seen::digest(&[b"n", b"e", &i.to_be_bytes(), b"s"]));
        }
        assert!(VERIFIED.count() <= VERIFIED_KEEP);
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
}
