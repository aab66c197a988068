//! Reconciliation against bills in the providers' formats, and the ticket workflow that closes
//! what it finds.

use axum::http::StatusCode;
use chrono::Utc;
use fitorder::config::ExposeSecret;
use fitorder::dev::bill_writers;
use fitorder::providers::bills::{BillKind, BillRow};
use serde_json::json;

use crate::harness::*;
use crate::providers;

fn today() -> chrono::NaiveDate {
    Utc::now().with_timezone(&chrono_tz::Asia::Shanghai).date_naive()
}

fn row(kind: BillKind, no: &str, txn: &str, cents: i64, refund_no: Option<&str>) -> BillRow {
    BillRow {
        line: 0,
        kind,
        out_trade_no: no.into(),
        provider_txn_id: txn.into(),
        amount_cents: cents,
        refund_no: refund_no.map(str::to_string),
        provider_refund_id: refund_no.map(|r| format!("5030{r}")),
        trade_time: Some(Utc::now().naive_utc()),
    }
}

/// An Alipay 业务明细 bill as Alipay exports it (GBK, CRLF), laid out like the real sample in
/// `provider-samples/alipay/bill/`: four `#` lines, the 25-column header, identifier cells ending
/// in a tab, refunds as negative 退款 rows, and the `#交易合计`/`#退款合计` trailer. Written here,
/// apart from the project's own writers.
fn alipay_bill_gbk(rows: &[BillRow]) -> Vec<u8> {
    let yuan = |c: i64| format!("{}{}.{:02}", if c < 0 { "-" } else { "" }, c.abs() / 100, c.abs() % 100);
    let mut text = String::from(
        "#支付宝业务明细查询\r\n#账号：[20880211096256330156]\r\n\
         #起始日期：[2026年11月30日 00:00:00]   终止日期：[2026年12月01日 00:00:00]\r\n\
         #-----------------------------------------业务明细列表----------------------------------------\r\n\
         支付宝交易号,商户订单号,业务类型,商品名称,创建时间,完成时间,门店编号,门店名称,操作员,终端号,对方账户,\
         订单金额（元）,商家实收（元）,支付宝红包（元）,集分宝（元）,支付宝优惠（元）,商家优惠（元）,券核销金额（元）,\
         券名称,商家红包消费金额（元）,卡消费金额（元）,退款批次号/请求号,服务费（元）,分润（元）,备注\r\n",
    );
    let (mut paid, mut paid_n, mut refunded, mut refunded_n) = (0, 0, 0, 0);
    for r in rows {
        let (kind, cents, refund_no) = match r.kind {
            BillKind::Refund => {
                refunded_n += 1;
                refunded -= r.amount_cents;
                ("退款", -r.amount_cents, r.refund_no.clone().unwrap_or_default())
            }
            _ => {
                paid_n += 1;
                paid += r.amount_cents;
                ("交易", r.amount_cents, String::new())
            }
        };
        let t = r.trade_time.unwrap().format("%Y-%m-%d %H:%M:%S");
        let a = yuan(cents);
        text.push_str(&format!(
            "{}\t,{}\t,{kind}\t,健身课包,{t},{t},\t,\t,\t,\t,*津水(602***@qq.com)\t,{a},{a},0.00,0.00,0.00,0.00,0.00,,0.00\t,0.00,{refund_no}\t,0.00,0.00,健身课包\r\n",
            r.provider_txn_id, r.out_trade_no
        ));
    }
    text.push_str(&format!(
        "#-----------------------------------------业务明细列表结束------------------------------------\r\n\
         #交易合计：{paid_n}笔，商家实收共{}元，商家优惠共0.00元\r\n\
         #退款合计：{refunded_n}笔，商家实收退款共{}元，商家优惠退款共0.00元\r\n\
         #导出时间：[2026年12月01日 05:46:49]\r\n",
        yuan(paid),
        yuan(refunded)
    ));
    let (gbk, _, unmappable) = encoding_rs::GBK.encode(&text);
    assert!(!unmappable);
    gbk.into_owned()
}

struct Books {
    app: TestApp,
    dir: std::path::PathBuf,
    s: Studio,
}

async fn books() -> Books {
    let dir = std::env::temp_dir().join(format!("fitorder-bills-{}", key()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.clone();
    let app = TestApp::with_config(move |c| {
        providers::configure(c);
        c.statement_dir = d;
    })
    .await;
    let s = app.studio(0, None, 3).await;
    Books { app, dir, s }
}

impl Books {
    async fn order(&self, method: &str) -> String {
        let placed = self
            .app
            .place(
                &self.s.member,
                json!({"idempotencyKey": key(), "storeId": self.s.store, "item": {"classPackId": self.s.pack}, "paymentMethod": method}),
            )
            .await;
        placed["order"]["orderNo"].as_str().unwrap().to_string()
    }

    async fn paid(&self, txn: &str) -> String {
        let no = self.order("WECHAT_PAY").await;
        assert_eq!(self.app.wechat_paid(&no, txn, 10_000).await, StatusCode::NO_CONTENT);
        no
    }

    fn write_wechat(&self, rows: &[BillRow]) {
        let f = std::fs::File::create(self.dir.join(format!("wechatpay-{}.csv", today()))).unwrap();
        bill_writers::write_wechat_bill(f, rows, true, true).unwrap();
    }

    async fn run(&self, provider: &str) -> serde_json::Value {
        let r = self
            .app
            .op(
                &self.app.admin_token(),
                ADMIN_OPS,
                "RunReconciliation",
                json!({"provider": provider, "date": today().to_string()}),
            )
            .await;
        assert!(r.get("errors").is_none(), "{r}");
        r["data"]["runReconciliation"].clone()
    }

    /// The admin console's ResolveTicket, as `token`'s role.
    async fn resolve(&self, token: &str, vars: serde_json::Value) -> serde_json::Value {
        self.app.op(token, ADMIN_OPS, "ResolveTicket", vars).await
    }

    async fn tickets(&self) -> Vec<serde_json::Value> {
        let r = self
            .app
            .op(&self.app.admin_token(), ADMIN_OPS, "Tickets", json!({"first": 100}))
            .await;
        r["data"]["exceptionTickets"]["edges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["node"].clone())
            .collect()
    }
}

#[tokio::test]
async fn each_difference_becomes_one_ticket_and_reruns_open_nothing() {
    let b = books().await;
    let matched = b.paid("4200000000000000000000001001").await;
    let missing = b.paid("4200000000000000000000001002").await;
    // Waiting for an Alipay payment, yet in WeChat's bill: not safe to settle by itself (a
    // waiting WeChat order of the bill's amount would be; see bill_fetch.rs), so a ticket.
    let unpaid = b.order("ALIPAY").await;
    let mismatched = b.paid("4200000000000000000000001004").await;
    // A refund fitorder made (and the provider shows), and one the provider shows that it did not.
    let refunded = b.paid("4200000000000000000000001005").await;
    b.app.admin(REFUND, json!({"orderNo": refunded, "reason": "r"})).await;
    let refund_no: String = {
        let r = b
            .app
            .admin(
                "query($n: String!) { order(orderNo: $n) { compensation { kind } } }",
                json!({"n": refunded}),
            )
            .await;
        assert!(r["order"]["compensation"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "PROVIDER_REFUND"));
        let id = b.app.sql_i64("SELECT id AS v FROM refunds").await;
        format!("RF{id}")
    };
    // Paid after cancel: the callback already opened a ticket; the bill must not open another.
    let canceled = b.order("WECHAT_PAY").await;
    b.app.admin(CANCEL, json!({"orderNo": canceled})).await;
    assert_eq!(
        b.app
            .wechat_paid(&canceled, "4200000000000000000000001006", 10_000)
            .await,
        StatusCode::NO_CONTENT
    );

    b.write_wechat(&[
        row(
            BillKind::Payment,
            &matched,
            "4200000000000000000000001001",
            10_000,
            None,
        ),
        row(BillKind::Payment, &unpaid, "4200000000000000000000001003", 10_000, None),
        row(
            BillKind::Payment,
            &mismatched,
            "4200000000000000000000001004",
            9_000,
            None,
        ),
        row(
            BillKind::Payment,
            &refunded,
            "4200000000000000000000001005",
            10_000,
            None,
        ),
        row(
            BillKind::Payment,
            &canceled,
            "4200000000000000000000001006",
            10_000,
            None,
        ),
        row(
            BillKind::Refund,
            &refunded,
            "4200000000000000000000001005",
            10_000,
            Some(&refund_no),
        ),
        row(
            BillKind::Refund,
            &matched,
            "4200000000000000000000001001",
            2_000,
            Some("RF-UNKNOWN"),
        ),
    ]);
    let run = b.run("WECHAT_PAY").await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["providerRows"], 7);
    assert_eq!(run["ticketsOpened"], 4);
    assert_eq!(run["matched"], 3, "two payments and one refund agree");
    let tickets = b.tickets().await;
    let find = |kind: &str| {
        tickets
            .iter()
            .filter(|t| t["kind"] == kind)
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(find("LOCAL_PAID_PROVIDER_MISSING").len(), 1);
    assert_eq!(find("LOCAL_PAID_PROVIDER_MISSING")[0]["orderNo"], missing);
    let unpaid_t = find("PROVIDER_PAID_LOCAL_UNPAID");
    assert_eq!(unpaid_t.len(), 1);
    assert_eq!(unpaid_t[0]["orderNo"], unpaid);
    assert_eq!(unpaid_t[0]["order"]["status"], "WAIT_PAY");
    let am = find("AMOUNT_MISMATCH");
    assert_eq!(am.len(), 1);
    assert_eq!(
        (am[0]["localAmountCents"].clone(), am[0]["providerAmountCents"].clone()),
        (json!(10_000), json!(9_000))
    );
    assert_eq!(find("REFUND_MISMATCH").len(), 1);
    assert_eq!(
        find("PAID_AFTER_CANCEL").len(),
        1,
        "the callback's ticket, not a second one"
    );
    // The same day again, twice: nothing new.
    for _ in 0..2 {
        let again = b.run("WECHAT_PAY").await;
        assert_eq!(again["ticketsOpened"], 0);
    }
    assert_eq!(b.tickets().await.len(), tickets.len());
    let runs = b
        .app
        .op(
            &b.app.admin_token(),
            ADMIN_OPS,
            "ReconciliationRuns",
            json!({"first": 10}),
        )
        .await;
    assert_eq!(runs["data"]["reconciliationRuns"]["edges"].as_array().unwrap().len(), 3);
    let stats = b
        .app
        .op(
            &b.app.ops_token(),
            OPS_OPS,
            "Anomalies",
            json!({"from": "2000-01-01T00:00:00Z", "to": "2100-01-01T00:00:00Z"}),
        )
        .await;
    let count = |c: &str| {
        stats["data"]["anomalyStats"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["category"] == c)
            .unwrap()["count"]
            .clone()
    };
    assert_eq!(count("RECONCILIATION_FINDING"), 4);

    // Closing them: the unpaid one is marked paid (credits its sessions).
    let id = unpaid_t[0]["id"].as_str().unwrap();
    let ops_try = b
        .resolve(&b.app.ops_token(), json!({"id": id, "action": "MARK_PAID"}))
        .await;
    assert_eq!(error_code(&ops_try), "FORBIDDEN", "ops may not mark orders paid");
    let r = b
        .resolve(
            &b.app.admin_token(),
            json!({"id": id, "action": "MARK_PAID", "note": "bill shows it"}),
        )
        .await;
    assert_eq!(r["data"]["resolveTicket"]["status"], "RESOLVED", "{r}");
    assert_eq!(r["data"]["resolveTicket"]["resolution"], "MARK_PAID");
    let o = b.app.order(&unpaid).await;
    assert_eq!(o["status"], "PAID");
    assert_eq!(o["providerTxnId"], "4200000000000000000000001003");
    // Resolved is resolved.
    let again = b
        .resolve(&b.app.admin_token(), json!({"id": id, "action": "NO_ACTION"}))
        .await;
    assert_eq!(error_code(&again), "CONFLICT");
    // MARK_PAID where WAIT_PAY -> PAID is not legal is refused by the state machine.
    let missing_id = find("LOCAL_PAID_PROVIDER_MISSING")[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = b
        .resolve(&b.app.admin_token(), json!({"id": missing_id, "action": "MARK_PAID"}))
        .await;
    assert_eq!(error_code(&r), "ILLEGAL_TRANSITION");
    assert_eq!(r["errors"][0]["extensions"]["from"], "PAID");
    // The refund of money already on its way back opens no second refund.
    let pac = find("PAID_AFTER_CANCEL")[0]["id"].as_str().unwrap().to_string();
    let before = b
        .app
        .sql_i64("SELECT count(*) AS v FROM compensation_events WHERE kind = 'PROVIDER_REFUND'")
        .await;
    let r = b
        .resolve(&b.app.ops_token(), json!({"id": pac, "action": "REFUND"}))
        .await;
    assert_eq!(r["data"]["resolveTicket"]["status"], "RESOLVED", "{r}");
    assert_eq!(
        b.app
            .sql_i64("SELECT count(*) AS v FROM compensation_events WHERE kind = 'PROVIDER_REFUND'")
            .await,
        before
    );
    // REFUND of a mismatched order's own payment refunds the order.
    let am_id = am[0]["id"].as_str().unwrap().to_string();
    let r = b
        .resolve(&b.app.admin_token(), json!({"id": am_id, "action": "REFUND"}))
        .await;
    assert!(r.get("errors").is_none(), "{r}");
    assert_eq!(b.app.order(&mismatched).await["status"], "REFUNDED");
    // NO_ACTION dismisses; replay is only for dead compensation.
    let rm = find("REFUND_MISMATCH")[0]["id"].as_str().unwrap().to_string();
    let r = b
        .resolve(&b.app.admin_token(), json!({"id": rm, "action": "REPLAY_COMPENSATION"}))
        .await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT");
    let r = b
        .app
        .gql(
            Some(&b.app.ops_token()),
            "mutation($id: ID!) { startTicket(id: $id) { status } }",
            json!({"id": rm}),
        )
        .await;
    assert_eq!(r["data"]["startTicket"]["status"], "IN_PROGRESS");
    let r = b
        .resolve(
            &b.app.ops_token(),
            json!({"id": rm, "action": "NO_ACTION", "note": "bank delay"}),
        )
        .await;
    assert_eq!(r["data"]["resolveTicket"]["status"], "DISMISSED");
    assert_eq!(r["data"]["resolveTicket"]["note"], "bank delay");
    assert!(r["data"]["resolveTicket"]["resolvedAt"].is_string());
}

#[tokio::test]
async fn a_clean_alipay_day_in_gbk_opens_nothing() {
    let b = books().await;
    let mut rows = vec![];
    for i in 0..5 {
        let no = b.order("ALIPAY").await;
        let txn = format!("202611302200140000000000{i:04}");
        let form = providers::alipay().payment(&no, &txn, "TRADE_SUCCESS", "100.00");
        assert_eq!(b.app.alipay_notify(&form).await.1, "success");
        rows.push(row(BillKind::Payment, &no, &txn, 10_000, None));
    }
    std::fs::write(b.dir.join(format!("alipay-{}.csv", today())), alipay_bill_gbk(&rows)).unwrap();
    let run = b.run("ALIPAY").await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(
        (run["providerRows"].clone(), run["localRows"].clone()),
        (json!(5), json!(5))
    );
    assert_eq!(
        (run["matched"].clone(), run["ticketsOpened"].clone()),
        (json!(5), json!(0))
    );
}

#[tokio::test]
async fn a_malformed_or_missing_bill_fails_the_run_and_opens_nothing() {
    let b = books().await;
    let no = b.order("WECHAT_PAY").await;
    b.write_wechat(&[row(
        BillKind::Payment,
        &no,
        "4200000000000000000000002001",
        10_000,
        None,
    )]);
    // Cut the summary's last line: the file is truncated.
    let path = b.dir.join(format!("wechatpay-{}.csv", today()));
    let text = std::fs::read_to_string(&path).unwrap();
    let cut: String = text
        .lines()
        .take(text.lines().count() - 1)
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&path, cut).unwrap();
    let run = b.run("WECHAT_PAY").await;
    assert_eq!(run["status"], "FAILED");
    assert!(run["error"].as_str().unwrap().contains("line"), "{run}");
    assert_eq!(b.tickets().await.len(), 0, "no tickets from half a file");
    assert_eq!(b.app.sql_i64("SELECT count(*) AS v FROM bill_rows").await, 0);
    // A bad amount names its line.
    std::fs::write(&path, text.replace("`100.00", "`1O0.00")).unwrap();
    let run = b.run("WECHAT_PAY").await;
    assert_eq!(run["status"], "FAILED");
    assert!(run["error"].as_str().unwrap().contains("line 2"), "{run}");
    // No file: it is asked of the provider, which has no bill for a day without trades: a
    // quiet day, reconciled empty (nothing is paid here either).
    std::fs::remove_file(&path).unwrap();
    let run = b.run("WECHAT_PAY").await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert!(run["error"].as_str().unwrap().contains("NO_STATEMENT_EXIST"), "{run}");
    assert_eq!(b.tickets().await.len(), 0);
    // A run of the same day that is still going refuses a second one.
    b.app.sql_i64(&format!(
        "WITH r AS (INSERT INTO reconciliation_runs (provider, bill_date, status, trace_id) VALUES ('WECHAT_PAY', '{}', 'RUNNING', 't') RETURNING id) SELECT id AS v FROM r",
        today()
    ))
    .await;
    let r = b
        .app
        .op(
            &b.app.admin_token(),
            ADMIN_OPS,
            "RunReconciliation",
            json!({"provider": "WECHAT_PAY", "date": today().to_string()}),
        )
        .await;
    assert_eq!(error_code(&r), "CONFLICT");
}

#[tokio::test]
async fn the_command_line_reconciles_and_fails_loudly() {
    let b = books().await;
    let no = b.paid("4200000000000000000000003001").await;
    b.write_wechat(&[row(
        BillKind::Payment,
        &no,
        "4200000000000000000000003001",
        10_000,
        None,
    )]);
    let run = async |file: Option<&std::path::Path>| {
        let mut cmd = Fitorder::new(&["reconcile", "--provider", "wechatpay", "--date", &today().to_string()])
            .env("DATABASE_URL", &b.app.db_url)
            .env("FITORDER_STATEMENT_DIR", &b.dir)
            .env("FITORDER_JWT_SECRET", "x")
            .env("RUST_LOG", "error");
        if let Some(f) = file {
            cmd = cmd.arg("--file").arg(f);
        }
        cmd.output(std::time::Duration::from_secs(60))
            .await
            .expect("fitorder reconcile ran on")
    };
    let ok = run(None).await;
    assert!(ok.status.success(), "{}", ok.stderr);
    let out = &ok.stdout;
    assert!(
        out.contains("1 provider rows") && out.contains("1 matched") && out.contains("0 tickets opened"),
        "{out}"
    );
    let bad = b.dir.join("broken.csv");
    std::fs::write(&bad, "not a bill\n").unwrap();
    let failed = run(Some(&bad)).await;
    assert!(!failed.status.success());
    assert!(failed.stdout.contains("line 1"), "{}", failed.stdout);
}

#[tokio::test]
async fn the_daily_run_catches_up_missed_days_once() {
    let b = books().await;
    let tz = chrono_tz::Asia::Shanghai;
    let today = Utc::now().with_timezone(&tz).date_naive();
    // Bills for yesterday and three days ago are there; the days in between are not.
    for back in [1, 3] {
        let day = today - chrono::Duration::days(back);
        let f = std::fs::File::create(b.dir.join(format!("wechatpay-{day}.csv"))).unwrap();
        bill_writers::write_wechat_bill(f, &[], false, false).unwrap();
    }
    let runs = fitorder::reconciliation::daily(b.app.state.clone())
        .await
        .map_err(|e| e.message())
        .unwrap();
    // WeChat: yesterday and the missed day with a bill; Alipay: yesterday, of which it has no
    // bill (isp.bill_not_exist: a quiet day, reconciled empty).
    assert_eq!(runs, 3);
    // WeChat is still making bills now (STATEMENT_CREATING).
    b.app
        .sandbox
        .set_bill_controls(fitorder::dev::sandbox_server::BillControls {
            not_ready: true,
            ..Default::default()
        });
    let again = fitorder::reconciliation::daily(b.app.state.clone())
        .await
        .map_err(|e| e.message())
        .unwrap();
    // WeChat's day between two reconciled ones was missed and is asked of the provider now;
    // not made yet, it is left to `reconcile:waiting`.
    assert_eq!(again, 1);
    for (provider, waiting) in [("ALIPAY", 0), ("WECHAT_PAY", 1)] {
        let sql = format!(
            "SELECT count(*) AS v FROM reconciliation_runs WHERE status = 'WAITING' AND provider = '{provider}'"
        );
        assert_eq!(b.app.sql_i64(&sql).await, waiting, "{provider}");
    }
    let third = fitorder::reconciliation::daily(b.app.state.clone())
        .await
        .map_err(|e| e.message())
        .unwrap();
    assert_eq!(third, 0, "what waits is asked by reconcile:waiting, not again here");
    let ok = b
        .app
        .sql_i64("SELECT count(*) AS v FROM reconciliation_runs WHERE status = 'SUCCEEDED'")
        .await;
    assert_eq!(ok, 3);
}

/// One row of a hand-written WeChat ALL bill: 交易状态, 商户订单号, 微信订单号, 应结订单金额 (cents),
/// and for refund rows 商户退款单号, 退款金额 (cents), 退款状态.
struct WxRow<'a>(&'a str, &'a str, &'a str, i64, &'a str, i64, &'a str);

/// A WeChat Pay v3 ALL bill laid out like `provider-samples/wechat/bill/v3_tradebill_ALL_*`:
/// 27 columns, backticked cells, refund rows with 应结订单金额 0.00 and the money in 退款金额,
/// the 7-field summary. Written here, apart from the project's own writer.
fn wechat_all_bill(rows: &[WxRow]) -> String {
    let yuan = |c: i64| format!("{}.{:02}", c / 100, c % 100);
    let mut text = String::from(
        "交易时间,公众账号ID,商户号,特约商户号,设备号,微信订单号,商户订单号,用户标识,交易类型,交易状态,付款银行,货币种类,\
         应结订单金额,代金券金额,微信退款单号,商户退款单号,退款金额,充值券退款金额,退款类型,退款状态,商品名称,商户数据包,\
         手续费,费率,订单金额,申请退款金额,费率备注\r\n",
    );
    let (mut settle, mut refunded) = (0, 0);
    for (i, WxRow(state, no, txn, cents, refund_no, refund_cents, refund_state)) in rows.iter().enumerate() {
        settle += cents;
        refunded += refund_cents;
        let (refund_id, refund_no, kind) = if *state == "REFUND" {
            (format!("5030000{i:08}"), refund_no.to_string(), "ORIGINAL")
        } else {
            ("0".into(), "0".into(), "")
        };
        text.push_str(&format!(
            "`2026-12-01 10:00:{i:02},`wx81be3101902f7cb2,`1900000109,`0,`,`{txn},`{no},`ofyak5qR_1wYsC99CsWA6R9MJazA,`JSAPI,\
             `{state},`OTHERS,`CNY,`{},`0.00,`{refund_id},`{refund_no},`{},`0.00,`{kind},`{refund_state},`课包,`,`0.00000,`0.60%,\
             `{},`{},`\r\n",
            yuan(*cents),
            yuan(*refund_cents),
            yuan(*cents),
            yuan(*refund_cents)
        ));
    }
    text.push_str(&format!(
        "总交易单数,应结订单总金额,退款总金额,充值券退款总金额,手续费总金额,订单总金额,申请退款总金额\r\n\
         `{},`{},`{},`0.00,`0.00000,`{},`{}\r\n",
        rows.len(),
        yuan(settle),
        yuan(refunded),
        yuan(settle),
        yuan(refunded)
    ));
    text
}

impl Books {
    /// Refunds `no` (all of it when `cents` is `None`) and returns our refund number.
    async fn refund(&self, no: &str, cents: Option<i64>) -> String {
        let r = self
            .app
            .admin(REFUND, json!({"orderNo": no, "reason": "r", "amountCents": cents}))
            .await;
        assert_eq!(r["refundOrder"]["status"], "REFUNDED", "{r}");
        let id = self
            .app
            .sql_i64(&format!(
                "SELECT r.id AS v FROM refunds r JOIN orders o ON o.id = r.order_id WHERE o.order_no = '{no}'"
            ))
            .await;
        format!("RF{id}")
    }
}

#[tokio::test]
async fn bill_refunds_we_asked_for_match_whatever_their_status_and_others_are_findings() {
    let b = books().await;
    let processing = b.paid("4200000000000000000000004001").await;
    let other_amount = b.paid("4200000000000000000000004002").await;
    let never = b.paid("4200000000000000000000004003").await;
    let rf1 = b.refund(&processing, None).await;
    let rf2 = b.refund(&other_amount, Some(3_000)).await;
    let bill = wechat_all_bill(&[
        WxRow(
            "SUCCESS",
            &processing,
            "4200000000000000000000004001",
            10_000,
            "",
            0,
            "",
        ),
        WxRow(
            "SUCCESS",
            &other_amount,
            "4200000000000000000000004002",
            10_000,
            "",
            0,
            "",
        ),
        WxRow("SUCCESS", &never, "4200000000000000000000004003", 10_000, "", 0, ""),
        // Ours, still PROCESSING in the bill (WeChat never updates it): not a finding.
        WxRow(
            "REFUND",
            &processing,
            "4200000000000000000000004001",
            0,
            &rf1,
            10_000,
            "PROCESSING",
        ),
        // Ours, for 40.00 where we asked for 30.00.
        WxRow(
            "REFUND",
            &other_amount,
            "4200000000000000000000004002",
            0,
            &rf2,
            4_000,
            "SUCCESS",
        ),
        // One we never asked for.
        WxRow(
            "REFUND",
            &never,
            "4200000000000000000000004003",
            0,
            "RF-NEVER",
            1_000,
            "SUCCESS",
        ),
    ]);
    std::fs::write(b.dir.join(format!("wechatpay-{}.csv", today())), bill).unwrap();
    let run = b.run("WECHAT_PAY").await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["providerRows"], 6);
    assert_eq!(run["matched"], 4, "three payments and the PROCESSING refund");
    assert_eq!(run["ticketsOpened"], 2);
    let tickets = b.tickets().await;
    let mut found: Vec<(String, String)> = tickets
        .iter()
        .map(|t| {
            (
                t["kind"].as_str().unwrap().into(),
                t["orderNo"].as_str().unwrap().into(),
            )
        })
        .collect();
    found.sort();
    let mut expected = vec![
        ("REFUND_MISMATCH".to_string(), other_amount.clone()),
        ("REFUND_MISMATCH".to_string(), never.clone()),
    ];
    expected.sort();
    assert_eq!(found, expected);
    // The same day again opens nothing new.
    assert_eq!(b.run("WECHAT_PAY").await["ticketsOpened"], 0);
}

#[tokio::test]
async fn an_alipay_day_with_refund_rows_matches_them_by_request_number() {
    let b = books().await;
    let mut rows = vec![];
    for (i, refund) in [Some(3_000), None, Some(1_000), Some(2_000)].into_iter().enumerate() {
        let no = b.order("ALIPAY").await;
        let txn = format!("202612012200140000000000{i:04}");
        let form = providers::alipay().payment(&no, &txn, "TRADE_SUCCESS", "100.00");
        assert_eq!(b.app.alipay_notify(&form).await.1, "success");
        let refund_no = b.refund(&no, refund).await;
        rows.push(row(BillKind::Payment, &no, &txn, 10_000, None));
        // The third refund shows in the bill under a request number that is not ours.
        let (billed_no, cents) = match i {
            2 => ("RF-NOT-OURS".to_string(), 1_000),
            3 => ("RF-NOT-OURS-EITHER".to_string(), 2_000),
            _ => (refund_no, refund.unwrap_or(10_000)),
        };
        // The fourth one Alipay also notified: that callback opened the ticket already.
        if i == 3 {
            let n = crate::payments::alipay_refunded(&no, &txn, "TRADE_SUCCESS", "20.00", &billed_no);
            assert_eq!(b.app.alipay_notify(&n).await.1, "success");
        }
        rows.push(row(BillKind::Refund, &no, &txn, cents, Some(&billed_no)));
    }
    std::fs::write(b.dir.join(format!("alipay-{}.csv", today())), alipay_bill_gbk(&rows)).unwrap();
    let run = b.run("ALIPAY").await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["providerRows"], 8);
    assert_eq!(run["matched"], 6, "four payments and two refunds");
    assert_eq!(
        run["ticketsOpened"], 1,
        "the unknown refund; the notified one has its ticket"
    );
    let tickets = b.tickets().await;
    let kinds: Vec<&str> = tickets.iter().map(|t| t["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["REFUND_MISMATCH", "REFUND_MISMATCH"]);
}

/// The ops workbench asks each ticket what closing it can do (`actions`): exactly what
/// `resolveTicket` takes from that role, what REFUND sends back, and whether it takes an amount;
/// a ticket taken or closed reaches `ticketChanged` subscribers.
#[tokio::test]
async fn ticket_actions_are_what_resolve_takes_and_changes_are_streamed() {
    let b = books().await;
    let mismatched = b.paid("4200000000000000000000002001").await;
    let unpaid = b.order("ALIPAY").await;
    let canceled = b.order("WECHAT_PAY").await;
    b.app.admin(CANCEL, json!({"orderNo": canceled})).await;
    assert_eq!(
        b.app
            .wechat_paid(&canceled, "4200000000000000000000002003", 10_000)
            .await,
        StatusCode::NO_CONTENT
    );
    b.write_wechat(&[
        row(
            BillKind::Payment,
            &mismatched,
            "4200000000000000000000002001",
            9_000,
            None,
        ),
        row(BillKind::Payment, &unpaid, "4200000000000000000000002002", 10_000, None),
        row(
            BillKind::Payment,
            &canceled,
            "4200000000000000000000002003",
            10_000,
            None,
        ),
    ]);
    assert_eq!(b.run("WECHAT_PAY").await["status"], "SUCCEEDED");
    let tickets = b.tickets().await;
    let id = |kind: &str| {
        tickets
            .iter()
            .find(|t| t["kind"] == kind)
            .unwrap_or_else(|| panic!("{kind}: {tickets:?}"))["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    const ACTIONS: &str =
        "query($id: ID!) { exceptionTicket(id: $id) { actions { allowed refundCents refundAmountAdjustable } } }";
    let actions = |token: String, id: String| {
        let app = &b.app;
        async move {
            let r = app.gql(Some(&token), ACTIONS, json!({"id": id})).await;
            assert!(r.get("errors").is_none(), "{r}");
            r["data"]["exceptionTicket"]["actions"].clone()
        }
    };
    // The order's own payment, collected short: refund (the unused share, or an amount) or not.
    let am = id("AMOUNT_MISMATCH");
    assert_eq!(
        actions(b.app.ops_token(), am.clone()).await,
        json!({"allowed": ["REFUND", "NO_ACTION"], "refundCents": 10_000, "refundAmountAdjustable": true})
    );
    // Paid at the provider, waiting here: admin may mark it paid (crediting the pack's
    // sessions); ops may not, as resolveTicket says.
    let unpaid_t = id("PROVIDER_PAID_LOCAL_UNPAID");
    assert_eq!(
        actions(b.app.admin_token(), unpaid_t.clone()).await["allowed"],
        json!(["REFUND", "CREDIT_SESSIONS", "MARK_PAID", "NO_ACTION"])
    );
    assert_eq!(
        actions(b.app.ops_token(), unpaid_t.clone()).await["allowed"],
        json!(["REFUND", "NO_ACTION"])
    );
    let r = b
        .resolve(&b.app.ops_token(), json!({"id": unpaid_t, "action": "CREDIT_SESSIONS"}))
        .await;
    assert_eq!(error_code(&r), "FORBIDDEN");
    // Money for a canceled order goes back whole: no amount, no marking paid.
    let pac = id("PAID_AFTER_CANCEL");
    assert_eq!(
        actions(b.app.admin_token(), pac.clone()).await,
        json!({"allowed": ["REFUND", "NO_ACTION"], "refundCents": 10_000, "refundAmountAdjustable": false})
    );
    const REFUND_AMOUNT: &str =
        "mutation($id: ID!, $a: Int) { resolveTicket(id: $id, action: REFUND, amountCents: $a, note: \"short\") { status } }";
    let r = b
        .app
        .gql(Some(&b.app.ops_token()), REFUND_AMOUNT, json!({"id": pac, "a": 500}))
        .await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT", "{r}");

    // Closing streams the change; REFUND with an amount refunds that amount.
    let addr = crate::fakes::serve(b.app.router.clone()).await;
    let mut ws = crate::ws::WsClient::connect(&addr, Some(&b.app.ops_token()), false)
        .await
        .unwrap();
    ws.subscribe(
        "1",
        "subscription { ticketChanged { id status resolution } }",
        None,
        json!({}),
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let r = b
        .app
        .gql(Some(&b.app.ops_token()), REFUND_AMOUNT, json!({"id": am, "a": 2_500}))
        .await;
    assert_eq!(r["data"]["resolveTicket"]["status"], "RESOLVED", "{r}");
    let o = b.app.order(&mismatched).await;
    assert_eq!(
        (o["status"].clone(), o["refundAmountCents"].clone()),
        (json!("REFUNDED"), json!(2_500))
    );
    let p = ws.next_payload(10).await.expect("ticketChanged");
    assert_eq!(
        p["data"]["ticketChanged"],
        json!({"id": am, "status": "RESOLVED", "resolution": "REFUND"})
    );
    assert_eq!(actions(b.app.ops_token(), am).await["allowed"], json!([]));

    // The healed share per store, and the stores a caller sees: a store-limited admin of
    // another store sees neither this store nor its findings.
    const HEALING: &str = "query($s: ID) { stores { id } reconciliationHealing(from: \"2000-01-01T00:00:00Z\", to: \"2100-01-01T00:00:00Z\", storeId: $s) { category ticketed } }";
    let ticketed = |r: &serde_json::Value| -> i64 {
        r["data"]["reconciliationHealing"]
            .as_array()
            .unwrap_or_else(|| panic!("{r}"))
            .iter()
            .map(|h| h["ticketed"].as_i64().unwrap())
            .sum()
    };
    let mine = b
        .app
        .gql(Some(&b.app.ops_token()), HEALING, json!({"s": b.s.store}))
        .await;
    assert_eq!(ticketed(&mine), 2, "{mine}");
    assert!(mine["data"]["stores"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["id"] == b.s.store.as_str()));
    let elsewhere = fitorder::auth::issue_token(
        b.app.state.config.jwt_secret.expose_secret(),
        fitorder::auth::Role::Admin,
        "staff-elsewhere",
        Some(vec!["999999".to_string()]),
        std::time::Duration::from_secs(600),
    );
    let theirs = b.app.gql(Some(&elsewhere), HEALING, json!({"s": null})).await;
    assert_eq!(ticketed(&theirs), 0, "{theirs}");
    assert_eq!(theirs["data"]["stores"], json!([]));
    let r = b.app.gql(Some(&elsewhere), HEALING, json!({"s": b.s.store})).await;
    assert_eq!(error_code(&r), "FORBIDDEN", "{r}");
}
