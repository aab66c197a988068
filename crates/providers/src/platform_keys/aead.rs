//! AEAD_AES_256_GCM as WeChat Pay uses it: notification resources and downloaded certificates.

use aes_gcm::aead::{Aead, Payload};
use aes_gcm::{Aes128Gcm, Aes256Gcm, KeyInit, Nonce};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;

use crate::crypto::CertError;

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
