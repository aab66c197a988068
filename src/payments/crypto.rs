//! RSA-SHA256 (PKCS#1 v1.5, base64), the one signature both providers use: WeChat Pay v3
//! (`WECHATPAY2-SHA256-RSA2048`, client pay parameters, answers and notifications) and Alipay
//! (`RSA2`, requests, order strings, answers and notifications).

use base64::Engine;
use rsa::pkcs1v15::{Signature, SigningKey, VerifyingKey};
use rsa::signature::{SignatureEncoding, Signer, Verifier};
use rsa::{RsaPrivateKey, RsaPublicKey};
use sha2::Sha256;

const B64: base64::engine::general_purpose::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The base64 SHA256withRSA signature of `message`.
pub fn sign(key: &RsaPrivateKey, message: &[u8]) -> String {
    B64.encode(SigningKey::<Sha256>::new(key.clone()).sign(message).to_bytes())
}

/// Whether `signature_b64` is `key`'s SHA256withRSA signature of `message`.
pub fn verify(key: &RsaPublicKey, message: &[u8], signature_b64: &str) -> bool {
    let Ok(raw) = B64.decode(signature_b64.trim()) else {
        return false;
    };
    let Ok(sig) = Signature::try_from(raw.as_slice()) else {
        return false;
    };
    VerifyingKey::<Sha256>::new(key.clone()).verify(message, &sig).is_ok()
}

/// A random nonce of `n` letters and digits (WeChat Pay asks for at most 32).
pub fn nonce(n: usize) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::rng();
    (0..n)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}
