//! WeChat Pay platform certificates in the database: two keyrings (two instances) on one
//! database, filled from the published `/v3/certificates` answers, and the forced-refresh rate
//! limit across them.

use std::path::PathBuf;

use chrono::{TimeDelta, Utc};
use diesel_async::RunQueryDsl;
use fitorder::providers::platform_keys::{self, SharedKeyring};
use fitorder::providers::platform_keys::{PlatformCert, VerifyError};
use rsa::pkcs8::DecodePublicKey;
use rsa::RsaPublicKey;
use serde_json::Value;

use crate::harness::TestApp;

fn sample(rel: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/provider-samples")
        .join(rel);
    std::fs::read(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the provider samples: tests/provider-samples, sources in its SOURCES.md)",
            p.display()
        )
    })
}

const GO_KEY: &[u8] = b"mockAPIv3Key1234";
const GO_ANSWER: &str = "wechat/notify/wechatpay_go_v3_certificates_response.json";
const JAVA_KEY: &[u8] = b"a7cde1ZJB1kG2e7VfTs3jQzaWizur8Gb";
const JAVA_ANSWER: &str = "wechat/notify/wechatpay_java_v3_certificates_response.json";
const GO_SERIAL: &str = "D7CE59D1F522D701";
const JAVA_SERIAL: &str = "5DEA10EF55877E3CF6C33255C2E7DEFFF7E427EC";
const PUB_ID: &str = "PUB_KEY_ID_0000000000000024101100397200000006";

#[derive(diesel::QueryableByName)]
struct N {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

#[tokio::test]
async fn two_instances_share_the_stored_certificates() {
    let app = TestApp::new().await;
    let mut c1 = app.conn().await;
    let mut c2 = app.conn().await;
    let pubkey = RsaPublicKey::from_public_key_pem(
        std::str::from_utf8(&sample("wechat/keys/wechatpay_java_wechat_pay_public_key.pem")).unwrap(),
    )
    .unwrap();
    let a = SharedKeyring::from_db(&mut c1, Some((PUB_ID.into(), pubkey.clone())))
        .await
        .unwrap();
    let b = SharedKeyring::from_db(&mut c2, None).await.unwrap();
    let now = Utc::now();
    assert!(a.snapshot().cert_serials().is_empty());
    assert_eq!(a.last_refresh(), None);
    assert!(a.needs_refresh(now) && b.needs_refresh(now));
    assert_eq!(a.key_for(PUB_ID), Some(pubkey));

    // Instance a fetches; b sees the certificate once it reloads.
    assert_eq!(
        a.refresh_from_answer(&mut c1, GO_KEY, &sample(GO_ANSWER))
            .await
            .unwrap(),
        1
    );
    assert_eq!(a.snapshot().cert_serials(), [GO_SERIAL]);
    assert!(b.key_for(GO_SERIAL).is_none());
    assert_eq!(b.reload(&mut c2).await.unwrap(), 1);
    assert!(b.key_for(GO_SERIAL).is_some());
    let fetched = a.last_refresh().expect("a refresh was recorded");
    assert_eq!(b.last_refresh(), Some(fetched));
    assert!((Utc::now() - fetched).num_seconds().abs() < 60);
    assert!(!b.needs_refresh(fetched + TimeDelta::hours(12) - TimeDelta::seconds(1)));
    assert!(b.needs_refresh(fetched + TimeDelta::hours(12)));

    // The published notification for that serial verifies through b; touched, it does not.
    let v: Value = serde_json::from_slice(&sample("wechat/notify/wechatpay_go_payscore_notify_vector.json")).unwrap();
    let body = sample("wechat/notify/wechatpay_go_payscore_notify.body.json");
    let h = |k: &str| v["headers"][k].as_str().unwrap().to_string();
    let (serial, ts, nonce, sig) = (
        h("Wechatpay-Serial"),
        h("Wechatpay-Timestamp"),
        h("Wechatpay-Nonce"),
        h("Wechatpay-Signature"),
    );
    assert_eq!(b.verify(&serial, &ts, &nonce, &body, &sig), Ok(()));
    let mut touched = body.clone();
    touched[20] ^= 1;
    assert_eq!(
        b.verify(&serial, &ts, &nonce, &touched, &sig),
        Err(VerifyError::BadSignature)
    );
    assert_eq!(
        b.verify(JAVA_SERIAL, &ts, &nonce, &body, &sig),
        Err(VerifyError::UnknownSerial(JAVA_SERIAL.into()))
    );

    // A switch: the new certificate comes while the old one is still live; both are kept.
    assert_eq!(
        b.refresh_from_answer(&mut c2, JAVA_KEY, &sample(JAVA_ANSWER))
            .await
            .unwrap(),
        1
    );
    assert_eq!(b.snapshot().cert_serials(), [JAVA_SERIAL, GO_SERIAL]);
    assert_eq!(a.reload(&mut c1).await.unwrap(), 2);
    assert_eq!(a.verify(&serial, &ts, &nonce, &body, &sig), Ok(()));
    assert!(a.key_for(PUB_ID).is_some(), "the public key survives reloads");
    assert!(a.last_refresh().unwrap() >= fetched);

    // Refreshing the same answer again updates, not duplicates.
    assert_eq!(
        a.refresh_from_answer(&mut c1, GO_KEY, &sample(GO_ANSWER))
            .await
            .unwrap(),
        1
    );
    let rows: N = diesel::sql_query("SELECT count(*) AS n FROM wechat_platform_certs")
        .get_result(&mut c1)
        .await
        .unwrap();
    assert_eq!(rows.n, 2);

    // Answers that do not decrypt or whose serial_no lies are refused and change nothing.
    let before = a.last_refresh();
    assert!(a
        .refresh_from_answer(&mut c1, JAVA_KEY, &sample(GO_ANSWER))
        .await
        .is_err());
    let gunsluo_key = b"AES256Key-32Characters1234567890";
    assert!(a
        .refresh_from_answer(
            &mut c1,
            gunsluo_key,
            &sample("wechat/notify/gunsluo_v3_certificates_response.json")
        )
        .await
        .is_err());
    assert_eq!(a.last_refresh(), before);
    assert_eq!(platform_keys::load(&mut c1).await.unwrap().len(), 2);

    // Expired certificates are stored but not loaded.
    let expired = PlatformCert::from_pem(
        std::str::from_utf8(&sample(
            "wechat/keys/wechatpay_java_merchant_certificate_5F1C72E2A8931B72A2E13AF8DEE92471EB397115.pem",
        ))
        .unwrap(),
    )
    .unwrap();
    assert!(expired.expire_time < Utc::now());
    assert_eq!(platform_keys::store(&mut c1, &[expired]).await.unwrap(), 1);
    let loaded: Vec<String> = platform_keys::load(&mut c1)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.serial_no)
        .collect();
    assert_eq!(loaded, [JAVA_SERIAL, GO_SERIAL]);
    assert_eq!(a.reload(&mut c1).await.unwrap(), 2);
}

#[tokio::test]
async fn forced_refreshes_are_rate_limited_per_process_and_across_instances() {
    let app = TestApp::new().await;
    let mut c1 = app.conn().await;
    let mut c2 = app.conn().await;
    let a = SharedKeyring::new(None);
    let b = SharedKeyring::new(None);
    let t0 = Utc::now();
    let s = TimeDelta::seconds;
    assert!(a.may_force_refresh(&mut c1, t0).await.unwrap(), "the first claim");
    assert!(
        !a.may_force_refresh(&mut c1, t0 + s(1)).await.unwrap(),
        "same process within 60 s"
    );
    assert!(
        !b.may_force_refresh(&mut c2, t0 + s(2)).await.unwrap(),
        "another instance within 60 s"
    );
    assert!(!b.may_force_refresh(&mut c2, t0 + s(59)).await.unwrap());
    assert!(
        a.may_force_refresh(&mut c1, t0 + s(61)).await.unwrap(),
        "a minute later"
    );
    // b's own last try was at t0+59: its process gate opens at t0+119, the database's at t0+121.
    assert!(!b.may_force_refresh(&mut c2, t0 + s(120)).await.unwrap());
    assert!(b.may_force_refresh(&mut c2, t0 + s(180)).await.unwrap());

    // Four instances racing for the same unknown serial: exactly one wins.
    let later = t0 + s(600);
    let rings: Vec<SharedKeyring> = (0..4).map(|_| SharedKeyring::new(None)).collect();
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(app.conn().await);
    }
    let claims = futures_util::future::join_all(
        rings
            .iter()
            .zip(conns.iter_mut())
            .map(|(r, c)| r.may_force_refresh(c, later)),
    )
    .await;
    let won = claims.into_iter().map(Result::unwrap).filter(|w| *w).count();
    assert_eq!(won, 1);
}
