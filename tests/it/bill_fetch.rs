//! Reconciliation fetching the bills it lacks from the providers (the development sandbox on
//! loopback playing WeChat Pay and Alipay), and healing the differences that are safe to heal.

use chrono::{TimeZone, Utc};
use fitorder::dev::sandbox_server::BillControls;
use fitorder::domain::payment::Provider;
use fitorder::domain::ReconciliationStatus;
use fitorder::providers::provider::BillDownload;
use fitorder::reconciliation::{self, statement_path};
use fitorder::trace::TraceId;
use serde_json::json;

use crate::harness::*;

fn today() -> chrono::NaiveDate {
    Utc::now().with_timezone(&chrono_tz::Asia::Shanghai).date_naive()
}

fn temp_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fitorder-bills-{}", uuid_like()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn uuid_like() -> String {
    use rand::Rng;
    format!("{}-{:016x}", std::process::id(), rand::rng().random::<u64>())
}

/// An app in Asia/Shanghai (the providers' business day) with its own statement dir.
async fn app(served: bool) -> (TestApp, std::path::PathBuf) {
    let dir = temp_dir();
    let d = dir.clone();
    let tweak = move |c: &mut fitorder::config::Config| {
        c.statement_dir = d;
        c.timezone = chrono_tz::Asia::Shanghai;
    };
    let app = if served {
        TestApp::served_with(tweak).await
    } else {
        TestApp::with_config(tweak).await
    };
    (app, dir)
}

/// Places an order paid online through `channel` and returns its number.
async fn place(app: &TestApp, s: &Studio, channel: &str) -> String {
    let method = if channel.starts_with("WECHAT") {
        "WECHAT_PAY"
    } else {
        "ALIPAY"
    };
    let input = json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack},
                       "paymentMethod": method, "channel": channel});
    let r = app
        .op(
            &app.member_token(&s.member),
            MEMBER_OPS,
            "PlaceOrder",
            json!({"input": input}),
        )
        .await;
    r["data"]["placeOrder"]["order"]["orderNo"]
        .as_str()
        .unwrap_or_else(|| panic!("{r:#}"))
        .to_string()
}

async fn reconcile(app: &TestApp, provider: Provider) -> fitorder::db::models::ReconciliationRun {
    reconciliation::run(&app.state, provider, today(), None, &TraceId::new())
        .await
        .unwrap()
}

#[tokio::test]
async fn both_bills_are_fetched_unpacked_and_reconciled() {
    let (app, dir) = app(true).await;
    let s = app.studio(5_000, None, 5).await;
    let wx = place(&app, &s, "WECHAT_NATIVE").await;
    let ali = place(&app, &s, "ALIPAY_QR").await;
    app.sandbox.pay("WECHAT_PAY", &wx).await.unwrap();
    app.sandbox.pay("ALIPAY", &ali).await.unwrap();

    for provider in Provider::ALL {
        let path = statement_path(&dir, provider, today());
        assert!(!path.exists());
        let r = reconcile(&app, provider).await;
        assert_eq!(r.status, ReconciliationStatus::Succeeded, "{provider}: {:?}", r.error);
        assert_eq!(
            (r.provider_rows, r.local_rows, r.matched, r.tickets_opened),
            (1, 1, 1, 0),
            "{provider}"
        );
        assert!(
            path.exists(),
            "{provider}: the fetched bill is kept under the contract's name"
        );
        // Nothing but the bill is left in the directory (no archive, no temporary file).
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(names.iter().all(|n| !n.to_string_lossy().starts_with('.')), "{names:?}");
    }
    let wechat_bill = std::fs::read_to_string(statement_path(&dir, Provider::WechatPay, today())).unwrap();
    assert!(wechat_bill.contains(&format!("`{wx}")), "{wechat_bill}");
    let alipay_bill = std::fs::read(statement_path(&dir, Provider::Alipay, today())).unwrap();
    assert!(std::str::from_utf8(&alipay_bill).is_err(), "the Alipay bill stays GBK");
    assert!(encoding_rs::GBK.decode(&alipay_bill).0.contains(&ali));
    let calls = app.sandbox.calls();
    assert!(calls
        .iter()
        .any(|c| c.api == "/v3/bill/tradebill" && c.verified && c.status == 200));
    assert!(calls
        .iter()
        .any(|c| c.api == "/v3/billdownload/file" && c.verified && c.status == 200));
    assert!(calls
        .iter()
        .any(|c| c.api == "alipay.data.dataservice.bill.downloadurl.query" && c.verified));

    // The raw downloads as the providers pack them: a gzip with the SHA1 of what it holds, and
    // a zip whose entries are named in GBK (no UTF-8 flag), the 汇总 entry beside the detail.
    let raw = temp_dir();
    let g = app.state.providers.gateway(Provider::WechatPay).unwrap();
    let BillDownload::Downloaded {
        archive,
        sha1: Some(sha1),
    } = g.fetch_bill(today(), &raw, "t").await.unwrap()
    else {
        panic!("no gzip")
    };
    let mut unpacked = vec![];
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(&archive).unwrap()),
        &mut unpacked,
    )
    .unwrap();
    use sha1::Digest;
    assert_eq!(hex::encode(sha1::Sha1::digest(&unpacked)), sha1);
    let g = app.state.providers.gateway(Provider::Alipay).unwrap();
    let BillDownload::Downloaded { archive, sha1: None } = g.fetch_bill(today(), &raw, "t").await.unwrap() else {
        panic!("no zip")
    };
    let mut zip = zip::ZipArchive::new(std::fs::File::open(&archive).unwrap()).unwrap();
    let mut names = vec![];
    for i in 0..zip.len() {
        let e = zip.by_index_raw(i).unwrap();
        assert!(std::str::from_utf8(e.name_raw()).is_err(), "GBK names");
        names.push(encoding_rs::GBK.decode(e.name_raw()).0.into_owned());
    }
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.iter().any(|n| n.ends_with("_业务明细.csv")), "{names:?}");
    assert!(names.iter().any(|n| n.ends_with("_业务明细(汇总).csv")), "{names:?}");
    let _ = std::fs::remove_dir_all(raw);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_wrong_sha1_fails_the_run_with_what_to_do_and_keeps_no_file() {
    let (app, dir) = app(true).await;
    let s = app.studio(5_000, None, 5).await;
    let wx = place(&app, &s, "WECHAT_NATIVE").await;
    app.sandbox.pay("WECHAT_PAY", &wx).await.unwrap();
    app.sandbox.set_bill_controls(BillControls {
        wrong_sha1: true,
        ..Default::default()
    });
    let r = reconcile(&app, Provider::WechatPay).await;
    assert_eq!(r.status, ReconciliationStatus::Failed);
    let why = r.error.unwrap();
    assert!(why.contains("SHA1"), "{why}");
    assert!(why.contains("run the reconciliation again"), "{why}");
    assert!(!statement_path(&dir, Provider::WechatPay, today()).exists());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no archive or part left");
    // An answer signed by a key we do not trust is no answer: FAILED, saying what to check.
    app.sandbox.set_bill_controls(BillControls::default());
    app.sandbox.sign_answers_with_wrong_key(true);
    let r = reconcile(&app, Provider::WechatPay).await;
    assert_eq!(r.status, ReconciliationStatus::Failed);
    let why = r.error.unwrap();
    assert!(why.contains("not signed by the provider's key"), "{why}");
    assert!(!statement_path(&dir, Provider::WechatPay, today()).exists());
    app.sandbox.sign_answers_with_wrong_key(false);
    // The provider's answer is right again: the next run succeeds.
    assert_eq!(
        reconcile(&app, Provider::WechatPay).await.status,
        ReconciliationStatus::Succeeded
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_lapsed_download_url_is_asked_for_again() {
    let (app, dir) = app(true).await;
    let s = app.studio(5_000, None, 5).await;
    let wx = place(&app, &s, "WECHAT_NATIVE").await;
    let ali = place(&app, &s, "ALIPAY_QR").await;
    app.sandbox.pay("WECHAT_PAY", &wx).await.unwrap();
    app.sandbox.pay("ALIPAY", &ali).await.unwrap();
    for (provider, api) in [
        (Provider::WechatPay, "/v3/bill/tradebill"),
        (Provider::Alipay, "alipay.data.dataservice.bill.downloadurl.query"),
    ] {
        app.sandbox.set_bill_controls(BillControls {
            lapse_once: true,
            ..Default::default()
        });
        let r = reconcile(&app, provider).await;
        assert_eq!(r.status, ReconciliationStatus::Succeeded, "{provider}: {:?}", r.error);
        assert_eq!(r.matched, 1);
        let asked = app.sandbox.calls().iter().filter(|c| c.api == api).count();
        assert_eq!(
            asked, 2,
            "{provider}: the URL lapsed once, so the bill was asked for twice"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_bill_not_made_yet_waits_is_asked_again_and_fails_with_one_alert_at_18() {
    let (app, dir) = app(true).await;
    let s = app.studio(5_000, None, 5).await;
    let wx = place(&app, &s, "WECHAT_NATIVE").await;
    app.sandbox.pay("WECHAT_PAY", &wx).await.unwrap();
    app.sandbox.set_bill_controls(BillControls {
        not_ready: true,
        ..Default::default()
    });
    let r = reconcile(&app, Provider::WechatPay).await;
    assert_eq!(r.status, ReconciliationStatus::Waiting);
    assert!(
        r.error.as_deref().unwrap().contains("STATEMENT_CREATING"),
        "{:?}",
        r.error
    );
    let shown = app
        .admin(
            "{ reconciliationRuns(first: 5) { edges { node { status } } } }",
            json!({}),
        )
        .await;
    assert_eq!(
        shown["reconciliationRuns"]["edges"][0]["node"]["status"], "WAITING",
        "{shown:#}"
    );

    // Half an hour later, still not made: WAITING again, no alert.
    let tz = chrono_tz::Asia::Shanghai;
    let noon = tz
        .from_local_datetime(&today().and_hms_opt(12, 0, 0).unwrap())
        .unwrap()
        .with_timezone(&Utc);
    assert_eq!(reconciliation::retry_waiting_at(&app.state, noon).await.unwrap(), 1);
    let status = |app: &TestApp| {
        let pool = app.state.pool.clone();
        async move {
            use diesel::prelude::*;
            use diesel_async::RunQueryDsl;
            use fitorder::db::schema::reconciliation_runs as rr;
            let mut c = pool.get().await.unwrap();
            rr::table
                .order(rr::id.desc())
                .select(rr::status)
                .first::<String>(&mut c)
                .await
                .unwrap()
        }
    };
    assert_eq!(status(&app).await, "WAITING");
    // Made: the next round reconciles it.
    app.sandbox.set_bill_controls(BillControls::default());
    reconciliation::retry_waiting_at(&app.state, noon).await.unwrap();
    assert_eq!(status(&app).await, "SUCCEEDED");
    assert_eq!(
        reconciliation::retry_waiting_at(&app.state, noon).await.unwrap(),
        0,
        "nothing waits any more"
    );

    // Another day never made by 18:00: FAILED, one alert.
    app.sandbox.set_bill_controls(BillControls {
        not_ready: true,
        ..Default::default()
    });
    let yesterday = today().pred_opt().unwrap();
    // (WeChat: Alipay answers isp.bill_not_exist for a day it has no bill of, which is
    // reconciled as a quiet day.)
    let r = reconciliation::run(&app.state, Provider::WechatPay, yesterday, None, &TraceId::new())
        .await
        .unwrap();
    assert_eq!(r.status, ReconciliationStatus::Waiting, "{:?}", r.error);
    let six = tz
        .from_local_datetime(&today().and_hms_opt(18, 0, 0).unwrap())
        .unwrap()
        .with_timezone(&Utc);
    assert_eq!(reconciliation::retry_waiting_at(&app.state, six).await.unwrap(), 1);
    assert_eq!(status(&app).await, "FAILED");
    let alerts = app
        .sql_i64("SELECT count(*) AS v FROM alerts WHERE cause = 'RECONCILIATION_FAILED'")
        .await;
    assert_eq!(alerts, 1);
    // The bill-late sweep leaves that day to the run's alert.
    let mut c = app.conn().await;
    fitorder::alerts::sweep(&mut c, &app.state.config, &[Provider::WechatPay], &[])
        .await
        .unwrap();
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM alerts WHERE cause = 'BILL_NOT_RECONCILED'")
            .await,
        0
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn in_development_a_day_without_sandbox_payments_has_nothing_to_reconcile() {
    let dir = temp_dir();
    let d = dir.clone();
    let app = TestApp::with_config(move |c| {
        c.statement_dir = d;
        c.dev_mode = true;
    })
    .await;
    let r = reconcile(&app, Provider::WechatPay).await;
    assert_eq!(r.status, ReconciliationStatus::Succeeded);
    assert!(r.error.unwrap().contains("NO_STATEMENT_EXIST"));
    // Outside development the same answer is a quiet day too (issue 24): reconciled empty.
    let (app, dir2) = self::app(false).await;
    let r = reconcile(&app, Provider::WechatPay).await;
    assert_eq!(r.status, ReconciliationStatus::Succeeded, "{:?}", r.error);
    assert_eq!((r.provider_rows, r.local_rows, r.tickets_opened), (0, 0, 0));
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(dir2);
}

#[tokio::test]
async fn safe_differences_heal_under_the_runs_trace_and_the_rest_are_tickets() {
    // Not served: the sandbox's notifications reach nobody, as when callbacks are lost.
    let (app, dir) = app(false).await;
    let s = app.studio(5_000, None, 9).await;
    // Paid at the provider, callback lost: the order still waits.
    let unpaid = place(&app, &s, "WECHAT_NATIVE").await;
    let _ = app.sandbox.pay("WECHAT_PAY", &unpaid).await;
    // Paid at the provider, callback lost, then canceled here.
    let canceled = place(&app, &s, "WECHAT_NATIVE").await;
    let _ = app.sandbox.pay("WECHAT_PAY", &canceled).await;
    app.sql_i64(&format!(
        "WITH u AS (UPDATE orders SET status = 'CANCELED', canceled_at = now(), cancel_reason = 'EXPIRED'
                     WHERE order_no = '{canceled}' RETURNING 1) SELECT count(*) AS v FROM u"
    ))
    .await;
    // Paid here (its notification applied by hand below), booked by the provider on the next day.
    let late = place(&app, &s, "WECHAT_NATIVE").await;
    let _ = app.sandbox.pay("WECHAT_PAY", &late).await;
    app.sandbox.book_on_next_day("WECHAT_PAY", &late);
    // Paid here, but the provider says it is not paid: stays a ticket.
    let doubtful = place(&app, &s, "WECHAT_NATIVE").await;
    let _ = app.sandbox.pay("WECHAT_PAY", &doubtful).await;
    app.sandbox.book_on_next_day("WECHAT_PAY", &doubtful);
    for no in [&late, &doubtful] {
        // The payments as the lost callbacks would have applied them.
        let t = app.sandbox.trade("WECHAT_PAY", no).unwrap();
        let mut c = app.conn().await;
        let id = fitorder::payments::record(
            &mut c,
            fitorder::payments::Received {
                provider: Provider::WechatPay,
                verified: true,
                event_type: Some("TRANSACTION.SUCCESS"),
                body: "{}",
                headers: json!({}),
                error: None,
            },
            fitorder::payments::Outcome::Received,
            &TraceId::new(),
        )
        .await
        .unwrap();
        drop(c);
        let n = fitorder::payments::Notice::Paid {
            out_trade_no: no.to_string(),
            txn_id: t.txn_id.unwrap(),
            amount_cents: t.amount_cents,
        };
        let o = fitorder::payments::apply(&app.state, Provider::WechatPay, id, n, &TraceId::new())
            .await
            .unwrap();
        assert_eq!(o, fitorder::payments::Outcome::Applied);
    }
    app.sandbox.set_state("WECHAT_PAY", &doubtful, "NOTPAY");

    let trace = TraceId::new();
    let r = reconciliation::run(&app.state, Provider::WechatPay, today(), None, &trace)
        .await
        .unwrap();
    assert_eq!(r.status, ReconciliationStatus::Succeeded, "{:?}", r.error);
    assert_eq!(r.tickets_opened, 1, "only the doubtful payment needs a person");

    // The waiting order is paid, through the state machine, audited under the run's trace.
    assert_eq!(app.order(&unpaid).await["status"], "PAID");
    let audited = app
        .sql_i64(&format!(
            "SELECT count(*) AS v FROM order_transitions t JOIN orders o ON o.id = t.order_id
              WHERE o.order_no = '{unpaid}' AND t.to_status = 'PAID' AND t.trace_id = '{}'",
            trace.as_str()
        ))
        .await;
    assert_eq!(audited, 1);
    let evidence = app
        .sql_i64(&format!(
            "SELECT count(*) AS v FROM payment_callbacks WHERE event_type = 'BILL' AND trace_id = '{}'",
            trace.as_str()
        ))
        .await;
    assert_eq!(evidence, 2, "one recorded evidence row per bill payment applied");
    // The canceled one stays canceled and its money goes back.
    assert_eq!(app.order(&canceled).await["status"], "CANCELED");
    let refund = app
        .sql_i64(&format!(
            "SELECT count(*) AS v FROM compensation_events WHERE kind = 'PROVIDER_REFUND'
              AND payload->>'orderNo' = '{canceled}'"
        ))
        .await;
    assert_eq!(refund, 1);
    // The late-booked payment was confirmed by a signed query; the doubtful one is the ticket.
    let ticket = app
        .sql_i64(&format!(
            "SELECT count(*) AS v FROM exception_tickets WHERE kind = 'LOCAL_PAID_PROVIDER_MISSING' AND order_no = '{doubtful}'"
        ))
        .await;
    assert_eq!(ticket, 1);
    let heals = app
        .sql_i64(&format!(
            "SELECT count(*) AS v FROM reconciliation_heals WHERE trace_id = '{}'",
            trace.as_str()
        ))
        .await;
    assert_eq!(heals, 3);

    let from = (Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let to = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let h = app
        .admin(
            "query($from: DateTime!, $to: DateTime!) { reconciliationHealing(from: $from, to: $to) { category healed ticketed } }",
            json!({"from": from, "to": to}),
        )
        .await;
    let rows = h["reconciliationHealing"].as_array().unwrap_or_else(|| panic!("{h:#}"));
    let of = |cat: &str| rows.iter().find(|r| r["category"] == cat).cloned().unwrap();
    assert_eq!(
        of("PROVIDER_PAID_LOCAL_UNPAID"),
        json!({"category": "PROVIDER_PAID_LOCAL_UNPAID", "healed": 2, "ticketed": 0})
    );
    assert_eq!(
        of("LOCAL_PAID_PROVIDER_MISSING"),
        json!({"category": "LOCAL_PAID_PROVIDER_MISSING", "healed": 1, "ticketed": 1})
    );

    // Re-running the day heals and opens nothing new.
    let again = reconciliation::run(&app.state, Provider::WechatPay, today(), None, &TraceId::new())
        .await
        .unwrap();
    assert_eq!((again.status.as_str(), again.tickets_opened), ("SUCCEEDED", 0));
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM reconciliation_heals").await,
        3,
        "{again:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
