//! A provider on our side of the wire: signs and encrypts notifications exactly as WeChat Pay
//! and Alipay do, with keys we hold. The tests and `fitorder simulate-payment` use it; the
//! server never does.

use aes_gcm::aead::{Aead, Payload};
use aes_gcm::{Aes256Gcm, KeyInit, Nonce};
use base64::Engine;
use rsa::pkcs1v15::SigningKey;
use rsa::signature::{SignatureEncoding, Signer};
use rsa::RsaPrivateKey;
use serde_json::{json, Value};
use sha2::Sha256;

const B64: base64::engine::general_purpose::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn sign(key: &RsaPrivateKey, message: &[u8]) -> String {
    let sig = SigningKey::<Sha256>::new(key.clone()).sign(message);
    B64.encode(sig.to_bytes())
}

pub struct WechatSandbox {
    pub platform_key: RsaPrivateKey,
    pub apiv3_key: [u8; 32],
    pub mch_id: String,
    pub serial: String,
    /// The appid the merchant's trades are made under (`WECHATPAY_APP_ID`).
    pub app_id: String,
}

/// A signed WeChat Pay notification: its headers and body.
pub struct WechatNotification {
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl WechatSandbox {
    /// Encrypts `resource` (AEAD_AES_256_GCM, base64 of ciphertext‖tag) and signs the envelope
    /// over `timestamp\nnonce\nbody\n`.
    pub fn notification(&self, event_type: &str, resource: &Value, timestamp: i64) -> WechatNotification {
        let nonce: String = random_text(12);
        let aad = if event_type.starts_with("REFUND") {
            "refund"
        } else {
            "transaction"
        };
        let cipher = Aes256Gcm::new_from_slice(&self.apiv3_key).expect("32-byte key");
        let nonce_bytes: [u8; 12] = nonce.as_bytes().try_into().expect("12 ASCII characters");
        let sealed = cipher
            .encrypt(
                &Nonce::from(nonce_bytes),
                Payload {
                    msg: resource.to_string().as_bytes(),
                    aad: aad.as_bytes(),
                },
            )
            .expect("encryption cannot fail");
        let body = json!({
            "id": format!("EV-{}", random_text(16)),
            "create_time": chrono::Utc::now().to_rfc3339(),
            "resource_type": "encrypt-resource",
            "event_type": event_type,
            "summary": if event_type.starts_with("REFUND") { "退款成功" } else { "支付成功" },
            "resource": {
                "original_type": aad,
                "algorithm": "AEAD_AES_256_GCM",
                "ciphertext": B64.encode(sealed),
                "associated_data": aad,
                "nonce": nonce,
            }
        })
        .to_string();
        let header_nonce = random_text(32);
        let message = format!("{timestamp}\n{header_nonce}\n{body}\n");
        WechatNotification {
            headers: vec![
                ("Wechatpay-Timestamp", timestamp.to_string()),
                ("Wechatpay-Nonce", header_nonce),
                ("Wechatpay-Signature", sign(&self.platform_key, message.as_bytes())),
                ("Wechatpay-Serial", self.serial.clone()),
            ],
            body: body.into_bytes(),
        }
    }

    /// The decrypted resource of a successful payment.
    pub fn transaction(&self, out_trade_no: &str, transaction_id: &str, total_fen: i64) -> Value {
        json!({
            "appid": self.app_id,
            "mchid": self.mch_id,
            "out_trade_no": out_trade_no,
            "transaction_id": transaction_id,
            "trade_type": "JSAPI",
            "trade_state": "SUCCESS",
            "trade_state_desc": "支付成功",
            "bank_type": "OTHERS",
            "attach": "",
            "success_time": chrono::Utc::now().to_rfc3339(),
            "payer": {"openid": "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"},
            "amount": {"total": total_fen, "payer_total": total_fen, "currency": "CNY", "payer_currency": "CNY"}
        })
    }

    pub fn refund(
        &self,
        out_trade_no: &str,
        out_refund_no: &str,
        refund_id: &str,
        status: &str,
        refund_fen: i64,
        total_fen: i64,
    ) -> Value {
        json!({
            "mchid": self.mch_id,
            "out_trade_no": out_trade_no,
            "transaction_id": format!("42{}", random_digits(26)),
            "out_refund_no": out_refund_no,
            "refund_id": refund_id,
            "refund_status": status,
            "success_time": chrono::Utc::now().to_rfc3339(),
            "user_received_account": "支付用户零钱",
            "amount": {"total": total_fen, "refund": refund_fen, "payer_total": total_fen, "payer_refund": refund_fen}
        })
    }
}

pub struct AlipaySandbox {
    pub alipay_key: RsaPrivateKey,
    pub app_id: String,
}

impl AlipaySandbox {
    /// A form-encoded notification with `fields` (plus the usual envelope fields), signed RSA2.
    pub fn notification(&self, fields: &[(&str, &str)]) -> String {
        let mut all: Vec<(String, String)> = vec![
            (
                "notify_time".into(),
                chrono::Utc::now().format("%Y-%m-%d %H:%M:%S").to_string(),
            ),
            ("notify_type".into(), "trade_status_sync".into()),
            ("notify_id".into(), random_text(24)),
            ("app_id".into(), self.app_id.clone()),
            ("charset".into(), "utf-8".into()),
            ("version".into(), "1.0".into()),
            ("sign_type".into(), "RSA2".into()),
        ];
        for (k, v) in fields {
            all.retain(|(ek, _)| ek != k);
            all.push((k.to_string(), v.to_string()));
        }
        let content = notification_content(&all);
        all.push(("sign".into(), sign(&self.alipay_key, content.as_bytes())));
        form_urlencoded::Serializer::new(String::new())
            .extend_pairs(all)
            .finish()
    }

    pub fn payment(&self, out_trade_no: &str, trade_no: &str, status: &str, yuan: &str) -> String {
        self.notification(&[
            ("out_trade_no", out_trade_no),
            ("trade_no", trade_no),
            ("trade_status", status),
            ("total_amount", yuan),
            ("receipt_amount", yuan),
            ("buyer_id", "2088102177846880"),
            ("seller_id", "2088101106499364"),
            ("gmt_create", "2026-11-30 08:10:00"),
            ("gmt_payment", "2026-11-30 08:10:05"),
            ("subject", "fitorder"),
        ])
    }
}

/// What Alipay signs a notification over: every non-empty field but `sign` and `sign_type`,
/// sorted by key, `k=v` joined with `&`. Written here apart from the verifier
/// (`alipay::signed_content`) so that a test does not check the verifier against itself.
fn notification_content(fields: &[(String, String)]) -> String {
    let mut pairs: Vec<&(String, String)> = fields
        .iter()
        .filter(|(k, v)| k != "sign" && k != "sign_type" && !v.is_empty())
        .collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    let parts: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    parts.join("&")
}

fn random_text(n: usize) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..n)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

fn random_digits(n: usize) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..n).map(|_| char::from(b'0' + rng.random_range(0..10u8))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The notification rule (no `sign`, no `sign_type`) against a real notification and
    /// Alipay's published key.
    #[test]
    fn notification_content_matches_the_published_vector() {
        use rsa::pkcs1v15::{Signature, VerifyingKey};
        use rsa::pkcs8::DecodePublicKey;
        use rsa::signature::Verifier;
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/provider-samples/alipay/notify/alipay_sdk_nodejs_notify_sign_vectors.json"
        );
        let all: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let v = &all["vectors"][0];
        let fields: Vec<(String, String)> = v["params"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, x)| (k.clone(), x.as_str().unwrap().to_string()))
            .collect();
        let content = notification_content(&fields);
        assert_eq!(content, v["expected_content"].as_str().unwrap());
        let der = B64
            .decode(v["alipay_public_key_base64_spki"].as_str().unwrap())
            .unwrap();
        let key = rsa::RsaPublicKey::from_public_key_der(&der).unwrap();
        let sig = B64.decode(v["params"]["sign"].as_str().unwrap()).unwrap();
        let sig = Signature::try_from(sig.as_slice()).unwrap();
        assert!(VerifyingKey::<Sha256>::new(key)
            .verify(content.as_bytes(), &sig)
            .is_ok());
    }
}
