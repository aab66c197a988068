//! The other side of the certificate and signature tests is published material
//! (tests/provider-samples, see its SOURCES.md) or the openssl CLI, never this module.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use chrono::{TimeDelta, Utc};
use diesel_async::AsyncPgConnection;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use rsa::RsaPublicKey;
use serde_json::Value;

use super::certificates::rfc3339;
use super::*;
use crate::crypto;
use crate::crypto::test_samples::*;
use crate::crypto::{parse_certificate, CertError};
use crate::wechat::signing::answer_message;

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
