//! The sandbox's WeChat Pay platform certificates: self-signed (SHA256withRSA) for its platform
//! keys, and the `GET /v3/certificates` answer that lists them, encrypted with the APIv3 key
//! (AEAD_AES_256_GCM, associated data `certificate`) as WeChat Pay lists them. Development only:
//! fitorder's client reads such answers (`providers::platform_keys`), never makes them.

use std::str::FromStr;

use aes_gcm::aead::{Aead, Payload};
use aes_gcm::{Aes128Gcm, Aes256Gcm, KeyInit, Nonce};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use chrono::{DateTime, FixedOffset, SecondsFormat, Utc};
use rsa::pkcs1v15::{Signature, SigningKey};
use rsa::RsaPrivateKey;
use sha2::Sha256;
use x509_cert::builder::{Builder, CertificateBuilder, Profile};
use x509_cert::der::EncodePem;
use x509_cert::name::Name;
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::SubjectPublicKeyInfoOwned;
use x509_cert::time::Validity;

use crate::providers::crypto::{parse_certificate, CertError};
use crate::providers::platform_keys::{CERTIFICATE_ASSOCIATED_DATA, WECHAT_AEAD_ALGORITHM};

/// The inverse of fitorder's `platform_keys::aead_decrypt`: base64(ciphertext‖tag).
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
    //! The other side is fitorder's client (`platform_keys::decrypt_certificates`) and the
    //! openssl CLI.

    use std::process::Command;

    use super::*;
    use crate::providers::platform_keys::decrypt_certificates;

    fn openssl(args: &[&str]) -> Vec<u8> {
        let out = Command::new("openssl").args(args).output().expect("the openssl CLI");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
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
