//! RSA-SHA256 (PKCS#1 v1.5, base64), the one signature both providers use: WeChat Pay v3
//! (`WECHATPAY2-SHA256-RSA2048`, client pay parameters, answers and notifications) and Alipay
//! (`RSA2`, requests, order strings, answers and notifications).

use base64::Engine;
use rsa::pkcs1v15::{Signature, SigningKey, VerifyingKey};
use rsa::signature::{SignatureEncoding, Signer, Verifier};
use rsa::{RsaPrivateKey, RsaPublicKey};
use sha2::Sha256;

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
    use rsa::traits::PublicKeyParts;
    let Ok(raw) = B64.decode(signature_b64.trim()) else {
        return false;
    };
    let (n, e) = (key.n().to_bytes_be(), key.e().to_bytes_be());
    let seen = Seen::digest(&[&n, &e, message, &raw]);
    if VERIFIED.contains(&seen) {
        return true;
    }
    let ok = if n.len() >= 256 {
        let components = ring::signature::RsaPublicKeyComponents { n: &n, e: &e };
        components
            .verify(&ring::signature::RSA_PKCS1_2048_8192_SHA256, message, &raw)
            .is_ok()
    } else {
        Signature::try_from(raw.as_slice())
            .is_ok_and(|sig| VerifyingKey::<Sha256>::new(key.clone()).verify(message, &sig).is_ok())
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

#[cfg(test)]
mod tests {
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
}
