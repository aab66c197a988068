//! fitorder's bill fetch (`Gateway::fetch_bill`, then the unpacking and the parser) against the
//! independent provider stand-in (`tests/standin/provider.py`, written from the providers'
//! documentation): the WeChat Pay trade bill as gzip with the SHA1 in a signed answer, and the
//! Alipay zip whose entries are named in GBK.

use fitorder::domain::{Provider, ReconciliationStatus};
use fitorder::reconciliation::{self, statement_path};
use fitorder::trace::TraceId;
use serde_json::json;

use crate::harness::*;
use crate::standin::{StandIn, StandInMode, Trade};

#[tokio::test]
async fn bills_fetched_from_the_standin_are_reconciled() {
    let Some(s) = StandIn::start_or_skip(StandInMode::PublicKey) else {
        return;
    };
    let dir = s.dir().join("statements");
    let (d, sd) = (dir.clone(), s.dir().to_path_buf());
    let (mch, appid, serial, v3, alipay_app) = (
        s.mch_id(),
        s.wechat_app_id(),
        s.merchant_serial(),
        s.apiv3_key(),
        s.alipay_app_id(),
    );
    let (wx_serial, wx_base, ali_gw) = (s.wechat_serial(), s.wechat_base(), s.alipay_gateway());
    let (mkey, akey) = (s.merchant_key_path(), s.app_key_path());
    let app = TestApp::with_config(move |c| {
        c.statement_dir = d;
        c.timezone = chrono_tz::Asia::Shanghai;
        c.wechatpay.mch_id = Some(mch);
        c.wechatpay.app_id = Some(appid);
        c.wechatpay.apiv3_key = Some(v3.into());
        c.wechatpay.merchant_private_key = Some(mkey);
        c.wechatpay.merchant_serial = Some(serial);
        c.wechatpay.platform_public_key = Some(sd.join("wechat_public_key.pem"));
        c.wechatpay.public_key_id = Some(wx_serial);
        c.wechatpay.api_base = wx_base;
        c.alipay.app_id = Some(alipay_app);
        c.alipay.app_private_key = Some(akey);
        c.alipay.public_key = Some(sd.join("alipay_public_key.pem"));
        c.alipay.api_base = ali_gw;
    })
    .await;
    let today = chrono::Utc::now()
        .with_timezone(&chrono_tz::Asia::Shanghai)
        .date_naive();

    // Not made yet at the stand-in: WeChat says STATEMENT_CREATING, WAITING.
    let mode = |on: bool| {
        let url = format!("{}/_standin/mode", s.wechat_base());
        async move {
            reqwest::Client::new()
                .post(url)
                .json(&json!({"bill_not_ready": on}))
                .send()
                .await
                .unwrap();
        }
    };
    // (Alipay answers isp.bill_not_exist for a bill it does not have, made or not: with
    // nothing paid here that day either it is a quiet day, reconciled empty.)
    mode(true).await;
    for (provider, expect) in [
        (Provider::WechatPay, ReconciliationStatus::Waiting),
        (Provider::Alipay, ReconciliationStatus::Succeeded),
    ] {
        let r = reconciliation::run(&app.state, provider, today, None, &TraceId::new())
            .await
            .unwrap();
        assert_eq!(r.status, expect, "{provider}: {:?}", r.error);
    }
    mode(false).await;

    // One paid trade each, which the books do not know: the bill is read, its row is a finding.
    s.set_trade(Trade::wechat("FOSTANDINBILL1", "SUCCESS").amount(1_234))
        .await;
    s.set_trade(Trade::alipay("FOSTANDINBILL2", "TRADE_SUCCESS").amount(5_678))
        .await;
    for (provider, no) in [
        (Provider::WechatPay, "FOSTANDINBILL1"),
        (Provider::Alipay, "FOSTANDINBILL2"),
    ] {
        let r = reconciliation::run(&app.state, provider, today, None, &TraceId::new())
            .await
            .unwrap();
        assert_eq!(r.status, ReconciliationStatus::Succeeded, "{provider}: {:?}", r.error);
        assert_eq!((r.provider_rows, r.tickets_opened), (1, 1), "{provider}");
        let t = app
            .sql_i64(&format!(
                "SELECT provider_amount_cents AS v FROM exception_tickets
                  WHERE kind = 'PROVIDER_PAID_LOCAL_UNPAID' AND order_no = '{no}'"
            ))
            .await;
        assert_eq!(t, if provider == Provider::Alipay { 5_678 } else { 1_234 });
        assert!(statement_path(&dir, provider, today).exists());
    }
    let log = s.requests().await;
    let download = log
        .iter()
        .find(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/v3/billdownload/file"))
        })
        .expect("the WeChat bill was downloaded");
    assert_eq!(
        download["verified"], true,
        "the download is a signed request: {download:#}"
    );
    assert!(log.iter().any(|r| r["path"]
        .as_str()
        .is_some_and(|p| p.starts_with("/downloadBillFile.resource"))));
}
