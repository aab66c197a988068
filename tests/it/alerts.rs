//! Alerts against a local stand-in for the robot APIs (tests/robots/standin.py, written from the
//! providers' documentation in Python, sharing no code with fitorder's client): message shapes,
//! DingTalk and Feishu signatures, robots that fail, one alert per cause under three instances.

use std::process::{Command, Stdio};
use std::time::Duration;

use fitorder::compensation::worker::Worker;
use serde_json::{json, Value};

use crate::fakes::{FakeDownstream, Mode};
use crate::harness::*;

pub struct Robots {
    _process: Helper,
    pub base: String,
}

impl Robots {
    pub fn start(config: Value) -> Robots {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/robots/standin.py");
        let process = Helper::start(
            Command::new("python3")
                .arg(script)
                .arg(config.to_string())
                .stderr(Stdio::inherit()),
            "python3 (the robot stand-in)",
        );
        let line = process.line(Duration::from_secs(60)).unwrap_or_default();
        let port: u16 = line.trim().parse().expect("the stand-in prints its port");
        Robots {
            _process: process,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    pub async fn log(&self) -> Vec<Value> {
        reqwest::get(format!("{}/_log", self.base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub async fn accepted(&self, name: &str) -> Vec<Value> {
        self.log()
            .await
            .into_iter()
            .filter(|r| r["name"] == name && r["accepted"] == true)
            .collect()
    }
}

async fn dead_app(fake: &FakeDownstream, webhooks: String) -> TestApp {
    let url = fake.url.clone();
    TestApp::with_config(move |c| {
        // No providers: their daily bills would add late-bill alerts to the count.
        crate::providers::unconfigure(c);
        c.door_access_url = Some(url.clone().into());
        c.ai_access_url = Some(url.into());
        c.max_attempts = 1;
        c.downstream_timeout = Duration::from_millis(1500);
        c.alert_channels = fitorder::alerts::channels::parse_list(&webhooks).unwrap();
        c.alert_retry_base = Duration::from_millis(100);
        c.alert_max_attempts = 3;
        c.public_url = "https://fit.example".into();
    })
    .await
}

async fn paid_order(app: &TestApp) -> String {
    let s = app.studio(100_000, None, 3).await;
    app.buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WALLET")
        .await
}

/// Runs the worker until no event and no alert delivery is waiting (or `secs` pass).
async fn settle(app: &TestApp, worker: &Worker, secs: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        worker.run_once().await.unwrap();
        let open = app
            .sql_i64(
                "SELECT (SELECT count(*) FROM compensation_events WHERE status IN ('PENDING', 'RETRYING'))
                      + (SELECT count(*) FROM alert_deliveries WHERE status IN ('PENDING', 'RETRYING'))
                      + (SELECT count(*) FROM alerts WHERE fanned_out_at IS NULL) AS v",
            )
            .await;
        if open == 0 || tokio::time::Instant::now() > deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

async fn order_trace(app: &TestApp, no: &str) -> String {
    let o = app
        .admin(
            "query($no: String!) { order(orderNo: $no) { traceId } }",
            json!({"no": no}),
        )
        .await;
    o["order"]["traceId"].as_str().unwrap().to_string()
}

fn text_of(record: &Value) -> String {
    record["body"].to_string()
}

#[tokio::test]
async fn a_dead_event_reaches_every_robot_signed_with_its_order_and_trace_id() {
    let robots =
        Robots::start(json!({"secrets": {"dd": "SECdingtalk-secret", "fs": "feishu-secret", "dd-wrong": "SECtheirs"}}));
    let b = &robots.base;
    let fake = FakeDownstream::start(Mode::AlwaysFail).await;
    let app = dead_app(
        &fake,
        format!(
            "wecom:{b}/wecom/wc, dingtalk:{b}/dingtalk/dd#SECdingtalk-secret, feishu:{b}/feishu/fs#feishu-secret, \
             webhook:{b}/webhook/am, dingtalk:{b}/dingtalk/dd-wrong#SECours"
        ),
    )
    .await;
    app.expect_dead(); // its DEAD events are the point
    let no = paid_order(&app).await;
    let trace = order_trace(&app, &no).await;
    let started = std::time::Instant::now();
    settle(&app, &Worker::new(app.state.clone()), 20).await;
    // Two events (door and AI) went DEAD: two alerts, one per event, each to every channel.
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM alerts WHERE cause = 'COMPENSATION_DEAD'")
            .await,
        2
    );
    for name in ["wc", "dd", "fs", "am"] {
        let got = robots.accepted(name).await;
        assert_eq!(got.len(), 2, "{name}: {got:?}");
        for r in &got {
            let t = text_of(r);
            assert!(t.contains(&no), "{name} names the order: {t}");
            assert!(t.contains(&trace), "{name} carries the trace id: {t}");
            assert!(t.contains("https://fit.example/ops"), "{name} links the ops page: {t}");
            assert!(t.contains("补偿事件已放弃"), "{name} speaks Chinese: {t}");
            assert_eq!(r["trace"].as_str(), Some(trace.as_str()));
        }
    }
    // The robot whose secret differs refused with errcode 310000 at HTTP 200: not delivered.
    let wrong: Vec<Value> = robots
        .log()
        .await
        .into_iter()
        .filter(|r| r["name"] == "dd-wrong")
        .collect();
    assert!(
        !wrong.is_empty() && wrong.iter().all(|r| r["problem"] == "signature"),
        "{wrong:?}"
    );
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM alert_deliveries WHERE channel LIKE 'dingtalk-%' AND status = 'DEAD'")
            .await,
        2
    );
    let err = app
        .sql_i64("SELECT count(*) AS v FROM alert_deliveries WHERE status = 'DEAD' AND last_error LIKE '%310000%'")
        .await;
    assert_eq!(err, 2);
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM alert_deliveries WHERE status = 'SUCCEEDED'")
            .await,
        8
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    // No token or secret in the database.
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM alert_deliveries WHERE channel LIKE '%SEC%' OR channel LIKE '%http%'")
            .await,
        0
    );
}

#[tokio::test]
async fn a_dead_alert_is_delivered_after_the_robot_failed_twice_and_a_lost_one_is_replayed() {
    let robots = Robots::start(json!({"fail_first": {"flaky": 2, "down": 3}}));
    let b = &robots.base;
    let fake = FakeDownstream::start(Mode::AlwaysFail).await;
    let app = dead_app(&fake, format!("wecom:{b}/wecom/flaky wecom:{b}/wecom/down")).await;
    app.expect_dead(); // its DEAD grant and alert deliveries are the point
    let s = app.studio(100_000, None, 3).await;
    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WALLET")
        .await;
    // Only the door event: keep one alert.
    app.sql_i64(&format!(
        "WITH d AS (DELETE FROM compensation_events WHERE kind = 'AI_ACCESS_GRANT'
                     AND order_id = (SELECT id FROM orders WHERE order_no = '{no}') RETURNING 1)
         SELECT count(*) AS v FROM d"
    ))
    .await;
    let started = std::time::Instant::now();
    settle(&app, &Worker::new(app.state.clone()), 30).await;
    let took = started.elapsed();
    let flaky = robots.accepted("flaky").await;
    assert_eq!(flaky.len(), 1, "exactly once");
    assert!(text_of(&flaky[0]).contains(&no));
    assert!(took < Duration::from_secs(60), "{took:?}");
    let attempts = app
        .sql_i64(
            "SELECT count(*) AS v FROM alert_attempts a JOIN alert_deliveries d ON d.id = a.delivery_id
              WHERE d.channel LIKE 'wecom-%' AND d.status = 'SUCCEEDED'",
        )
        .await;
    assert_eq!(
        attempts, 3,
        "two refusals (errcode 45009 at HTTP 200), then the delivery"
    );
    // The other robot failed three times: DEAD (visible), then replayed and delivered.
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM alert_deliveries WHERE status = 'DEAD'")
            .await,
        1
    );
    assert!(robots.accepted("down").await.is_empty());
    let mut conn = app.conn().await;
    let ctx = fitorder::domain::Ctx {
        actor: fitorder::domain::Actor::ops("ops-1"),
        trace: fitorder::trace::TraceId::new(),
    };
    assert_eq!(
        fitorder::compensation::replay_dead_alerts(&mut conn, None, &ctx, 3)
            .await
            .unwrap(),
        1
    );
    drop(conn);
    settle(&app, &Worker::new(app.state.clone()), 30).await;
    assert_eq!(robots.accepted("down").await.len(), 1);
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM alert_deliveries WHERE status = 'SUCCEEDED'")
            .await,
        2
    );
}

#[tokio::test]
async fn one_alert_per_cause_under_three_instances() {
    let robots = Robots::start(json!({}));
    let b = robots.base.clone();
    let fake = FakeDownstream::start(Mode::AlwaysFail).await;
    let hooks = format!("wecom:{b}/wecom/ops, feishu:{b}/feishu/dev");
    let first = dead_app(&fake, hooks.clone()).await;
    first.expect_dead(); // its DEAD grants are the point
    let mut apps = vec![];
    for _ in 0..2 {
        let h = hooks.clone();
        let url = fake.url.clone();
        apps.push(
            TestApp::on_database(&first.db_url, move |c| {
                crate::providers::unconfigure(c);
                c.door_access_url = Some(url.clone().into());
                c.ai_access_url = Some(url.into());
                c.max_attempts = 1;
                c.alert_channels = fitorder::alerts::channels::parse_list(&h).unwrap();
                c.alert_retry_base = Duration::from_millis(100);
            })
            .await,
        );
    }
    let no = paid_order(&first).await;
    // A second order's events held by a worker that died long ago: the outbox is overdue.
    let held = paid_order(&first).await;
    first
        .sql_i64(&format!(
            "WITH u AS (UPDATE compensation_events SET next_attempt_at = now() - interval '10 minutes',
                         locked_until = now() + interval '1 hour', locked_by = 'ghost'
                       WHERE order_id = (SELECT id FROM orders WHERE order_no = '{held}') RETURNING 1)
             SELECT count(*) AS v FROM u"
        ))
        .await;
    let states: Vec<_> = std::iter::once(first.state.clone())
        .chain(apps.iter().map(|a| a.state.clone()))
        .collect();
    // Every instance runs two workers and ticks its scheduler over ten minutes of ticks, all at once.
    let base = chrono::Utc::now();
    let mut runs = vec![];
    for (i, s) in states.iter().enumerate() {
        for _ in 0..2 {
            let w = Worker::new(s.clone());
            runs.push(tokio::spawn(async move {
                for _ in 0..40 {
                    w.run_once().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            }));
        }
        let mut sched = fitorder::tasks::Scheduler::standard(s.clone());
        sched.tasks.retain(|t| t.name == "alert:check");
        runs.push(tokio::spawn(async move {
            for minute in 0..10 {
                sched
                    .tick(base + chrono::Duration::seconds(60 * minute + i as i64))
                    .await;
            }
        }));
    }
    for r in runs {
        r.await.unwrap();
    }
    settle(&first, &Worker::new(first.state.clone()), 20).await;
    let n = |sql: &'static str| first.sql_i64(sql);
    assert_eq!(
        n("SELECT count(*) AS v FROM alerts WHERE cause = 'COMPENSATION_DEAD'").await,
        2
    );
    assert_eq!(
        n("SELECT count(*) AS v FROM alerts WHERE cause = 'OUTBOX_OVERDUE'").await,
        1
    );
    assert_eq!(n("SELECT count(*) AS v FROM alerts").await, 3);
    assert!(n("SELECT count(*) AS v FROM task_runs WHERE task = 'alert:check'").await >= 10);
    for name in ["ops", "dev"] {
        let got = robots.accepted(name).await;
        assert_eq!(got.len(), 3, "{name}: one message per alert: {got:?}");
        let overdue = got.iter().filter(|r| text_of(r).contains("积压")).count();
        assert_eq!(overdue, 1);
        assert_eq!(
            got.iter().filter(|r| text_of(r).contains(&no)).count(),
            2,
            "both DEAD events of {no}"
        );
    }
}

#[tokio::test]
async fn a_payment_after_cancel_alerts_in_the_transaction_of_its_ticket() {
    let robots = Robots::start(json!({"secrets": {"fs": "s3cr3t"}}));
    let b = robots.base.clone();
    let app = TestApp::with_config(move |c| {
        crate::providers::configure(c);
        c.alert_channels = fitorder::alerts::channels::parse_list(&format!("feishu:{b}/feishu/fs#s3cr3t")).unwrap();
    })
    .await;
    let s = app.studio(0, Some(1), 3).await;
    let placed = app
        .place(
            &s.member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WECHAT_PAY"}),
        )
        .await;
    let no = placed["order"]["orderNo"].as_str().unwrap().to_string();
    app.ok(
        &app.member_token(&s.member),
        "mutation($no: String!) { cancelOrder(orderNo: $no) { status } }",
        json!({"no": no}),
    )
    .await;
    app.wechat_paid(&no, "4200000000000000000000000999", 10_000).await;
    // The ticket and its alert, with the same trace id (the callback's).
    let same = app
        .sql_i64(
            "SELECT count(*) AS v FROM alerts a JOIN exception_tickets t ON a.dedupe_key = 'TICKET:' || t.id
              WHERE t.kind = 'PAID_AFTER_CANCEL' AND a.cause = 'PAID_AFTER_CANCEL' AND a.trace_id = t.trace_id",
        )
        .await;
    assert_eq!(same, 1);
    // The provider retrying its notification raises nothing new.
    app.wechat_paid(&no, "4200000000000000000000000999", 10_000).await;
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM alerts").await, 1);
    settle(&app, &Worker::new(app.state.clone()), 20).await;
    let got = robots.accepted("fs").await;
    assert_eq!(got.len(), 1, "{got:?}");
    let t = text_of(&got[0]);
    assert!(
        t.contains("订单已取消后收到付款") && t.contains(&no) && t.contains("100.00"),
        "{t}"
    );
}

#[tokio::test]
async fn a_failed_reconciliation_and_one_with_differences_alert_once_with_counts_by_kind() {
    let robots = Robots::start(json!({}));
    let b = robots.base.clone();
    let app = TestApp::with_config(move |c| {
        // No providers configured: yesterday's bills would be late at this hour, another alert.
        crate::providers::unconfigure(c);
        c.alert_channels = fitorder::alerts::channels::parse_list(&format!("wecom:{b}/wecom/fin")).unwrap();
    })
    .await;
    // A real run whose bill is missing: FAILED, and alerted where its outcome is known.
    let trace = fitorder::trace::TraceId::new();
    let date = chrono::NaiveDate::from_ymd_opt(2026, 11, 20).unwrap();
    let run = fitorder::reconciliation::run(
        &app.state,
        fitorder::domain::Provider::WechatPay,
        date,
        Some("/nonexistent/bill.csv".into()),
        &trace,
    )
    .await
    .unwrap();
    assert_eq!(run.status, fitorder::domain::ReconciliationStatus::Failed);
    let mut conn = app.conn().await;
    let id = fitorder::alerts::reconciliation_run(&mut conn, &app.state.config, run.id)
        .await
        .unwrap();
    assert!(id.is_some());
    assert!(
        fitorder::alerts::reconciliation_run(&mut conn, &app.state.config, run.id)
            .await
            .unwrap()
            .is_none(),
        "once"
    );
    drop(conn);
    // A run that found differences (two tickets of one kind, one of another), swept up by alert:check.
    app.sql_i64(
        "WITH r AS (INSERT INTO reconciliation_runs (provider, bill_date, status, finished_at, tickets_opened, trace_id)
                    VALUES ('ALIPAY', '2026-11-21', 'SUCCEEDED', now(), 3, 'recontrace0000001') RETURNING id),
              t AS (INSERT INTO exception_tickets (kind, provider, detail, finding_key, trace_id)
                    VALUES ('PROVIDER_PAID_LOCAL_UNPAID', 'ALIPAY', '{}', 'a', 'recontrace0000001'),
                           ('PROVIDER_PAID_LOCAL_UNPAID', 'ALIPAY', '{}', 'b', 'recontrace0000001'),
                           ('REFUND_MISMATCH', 'ALIPAY', '{}', 'c', 'recontrace0000001') RETURNING 1)
         SELECT (SELECT count(*) FROM t) AS v",
    )
    .await;
    let mut sched = fitorder::tasks::Scheduler::standard(app.state.clone());
    sched.tasks.retain(|t| t.name == "alert:check");
    let now = chrono::Utc::now();
    for m in 0..3 {
        sched.tick(now + chrono::Duration::minutes(m)).await;
    }
    settle(&app, &Worker::new(app.state.clone()), 20).await;
    let got = robots.accepted("fin").await;
    assert_eq!(got.len(), 2, "{got:?}");
    let failed = got
        .iter()
        .map(text_of)
        .find(|t| t.contains("对账失败"))
        .expect("the failed run");
    assert!(
        failed.contains("2026-11-20") && failed.contains(trace.as_str()),
        "{failed}"
    );
    let diff = got
        .iter()
        .map(text_of)
        .find(|t| t.contains("对账发现差异"))
        .expect("the differences");
    assert!(
        diff.contains("PROVIDER_PAID_LOCAL_UNPAID")
            && diff.contains("× 2")
            && diff.contains("REFUND_MISMATCH")
            && diff.contains("recontrace0000001"),
        "{diff}"
    );
}

#[tokio::test]
async fn each_channel_gets_at_most_its_rate_per_minute_across_workers() {
    let robots = Robots::start(json!({}));
    let b = robots.base.clone();
    let app = TestApp::with_config(move |c| {
        c.alert_channels = fitorder::alerts::channels::parse_list(&format!("wecom:{b}/wecom/busy")).unwrap();
        c.alert_rate_per_minute = 2;
    })
    .await;
    let mut conn = app.conn().await;
    for i in 0..5 {
        fitorder::alerts::raise(
            &mut conn,
            &app.state.config,
            fitorder::alerts::Alert {
                cause: fitorder::domain::AlertCause::TaskStuck,
                dedupe_key: format!("rate-test-{i}"),
                title: format!("测试 {i}"),
                lines: vec![],
                order_no: None,
                trace_id: "ratetest000000001".into(),
                detail: json!({}),
            },
        )
        .await
        .unwrap();
    }
    drop(conn);
    let workers: Vec<Worker> = (0..3).map(|_| Worker::new(app.state.clone())).collect();
    for _ in 0..10 {
        futures_util::future::join_all(workers.iter().map(|w| w.run_once())).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(robots.log().await.len(), 2, "two requests in the minute");
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM alert_deliveries WHERE status = 'PENDING'")
            .await,
        3,
        "the rest wait for the next minute"
    );
    // What an operator sees: `fitorder alerts`.
    let out = Fitorder::new(&["alerts", "--replay-dead"])
        .env("DATABASE_URL", &app.db_url)
        .env("FITORDER_LOG_FORMAT", "text")
        .output(Duration::from_secs(60))
        .await
        .expect("fitorder alerts ran on");
    assert!(out.status.success(), "{}", out.stderr);
    let text = out.stdout;
    assert!(text.starts_with("0 DEAD deliveries sent again"), "{text}");
    assert_eq!(text.matches("TASK_STUCK").count(), 5, "{text}");
    assert_eq!(text.matches(" SUCCEEDED x1").count(), 2, "{text}");
    assert_eq!(text.matches(" PENDING x0").count(), 3, "{text}");
}

async fn raise_test_alerts(app: &TestApp, n: usize, key: &str) {
    let mut conn = app.conn().await;
    for i in 0..n {
        fitorder::alerts::raise(
            &mut conn,
            &app.state.config,
            fitorder::alerts::Alert {
                cause: fitorder::domain::AlertCause::TaskStuck,
                dedupe_key: format!("{key}-{i}"),
                title: format!("测试 {key} {i}"),
                lines: vec![format!("第 {i} 条")],
                order_no: None,
                trace_id: format!("{key}trace0000001"),
                detail: json!({}),
            },
        )
        .await
        .unwrap()
        .expect("a new alert");
    }
}

/// An alert delivery is an outbox event of no order: the robot refusing it is retried with the
/// outbox's backoff, DEAD at the limit (no ticket, no alert about the alert), left out of the
/// API's outbox, and replayed by the outbox's replay.
#[tokio::test]
async fn a_failing_alert_delivery_is_retried_goes_dead_and_is_replayed_by_the_outbox() {
    let robots = Robots::start(json!({"fail_first": {"down": 3}}));
    let b = robots.base.clone();
    let app = TestApp::with_config(move |c| {
        crate::providers::unconfigure(c);
        c.alert_channels = fitorder::alerts::channels::parse_list(&format!("wecom:{b}/wecom/down")).unwrap();
        c.alert_retry_base = Duration::from_millis(100);
        c.alert_max_attempts = 3;
    })
    .await;
    raise_test_alerts(&app, 1, "outbox").await;
    // Enqueued with the alert, by the outbox's enqueue: one event, of no order.
    assert_eq!(
        app.sql_i64(
            "SELECT count(*) AS v FROM compensation_events
              WHERE kind = 'ALERT_DELIVERY' AND order_id IS NULL AND status = 'PENDING'
                AND payload->>'channel' LIKE 'wecom-%' AND idempotency_key LIKE 'ALERT-%:ALERT_DELIVERY:wecom-%'"
        )
        .await,
        1
    );
    settle(&app, &Worker::new(app.state.clone()), 30).await;
    assert!(robots.accepted("down").await.is_empty());
    assert_eq!(
        app.sql_i64(
            "SELECT count(*) AS v FROM compensation_events
              WHERE kind = 'ALERT_DELIVERY' AND status = 'DEAD' AND attempts = 3 AND last_error LIKE '%45009%'"
        )
        .await,
        1
    );
    assert_eq!(
        app.sql_i64(
            "SELECT count(*) AS v FROM compensation_attempts a JOIN compensation_events e ON e.id = a.event_id
              WHERE e.kind = 'ALERT_DELIVERY' AND NOT a.ok"
        )
        .await,
        3,
        "three attempts, each logged"
    );
    // Its delay grew with the outbox's backoff (100 ms × 2^(n−1), ± 20 %).
    let gaps = app
        .sql_i64(
            "SELECT count(*) AS v FROM (
                 SELECT at - lag(at) OVER (ORDER BY id) AS gap, row_number() OVER (ORDER BY id) AS n
                   FROM compensation_attempts) g
              WHERE (n = 2 AND gap >= interval '80 milliseconds') OR (n = 3 AND gap >= interval '160 milliseconds')",
        )
        .await;
    assert_eq!(gaps, 2, "each retry waited its backoff");
    // A dead chat message opens no ticket and raises no alert about itself.
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM exception_tickets").await, 0);
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM alerts").await, 1);
    // Not in the API's outbox (the contract's kinds are an order's effects).
    let listed = app
        .admin("{ compensationEvents { edges { node { id kind } } } }", json!({}))
        .await;
    assert_eq!(listed["compensationEvents"]["edges"], json!([]), "{listed}");
    // What an operator sees, and the CLI's replay, through the outbox.
    let out = Command::new(env!("CARGO_BIN_EXE_fitorder"))
        .args(["alerts", "--replay-dead"])
        .env("DATABASE_URL", &app.db_url)
        .env("FITORDER_LOG_FORMAT", "text")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("1 DEAD deliveries sent again"), "{text}");
    assert!(text.contains(" PENDING x3"), "{text}");
    assert_eq!(
        app.sql_i64(
            "SELECT count(*) AS v FROM compensation_replays r JOIN compensation_events e ON e.id = r.event_id
              WHERE e.kind = 'ALERT_DELIVERY' AND r.actor LIKE '%alerts --replay-dead%'"
        )
        .await,
        1
    );
    settle(&app, &Worker::new(app.state.clone()), 30).await;
    assert_eq!(robots.accepted("down").await.len(), 1);
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM alert_deliveries WHERE status = 'SUCCEEDED' AND attempts = 4")
            .await,
        1
    );
}

/// Workers of two processes claim alert deliveries from the one outbox (SKIP LOCKED under a
/// lease): every alert reaches the robot exactly once.
#[tokio::test]
async fn two_workers_never_deliver_one_alert_twice() {
    let robots = Robots::start(json!({}));
    let b = robots.base.clone();
    let hooks = format!("wecom:{b}/wecom/once");
    let h = hooks.clone();
    let first = TestApp::with_config(move |c| {
        crate::providers::unconfigure(c);
        c.alert_channels = fitorder::alerts::channels::parse_list(&h).unwrap();
        c.alert_rate_per_minute = 1000;
        c.outbox_batch = 3;
    })
    .await;
    let second = TestApp::on_database(&first.db_url, move |c| {
        crate::providers::unconfigure(c);
        c.alert_channels = fitorder::alerts::channels::parse_list(&hooks).unwrap();
        c.alert_rate_per_minute = 1000;
        c.outbox_batch = 3;
    })
    .await;
    raise_test_alerts(&first, 12, "once").await;
    let workers: Vec<Worker> = [&first, &second, &first, &second]
        .iter()
        .map(|a| Worker::new(a.state.clone()))
        .collect();
    for _ in 0..10 {
        futures_util::future::join_all(workers.iter().map(|w| w.run_once())).await;
    }
    settle(&first, &workers[0], 20).await;
    let got = robots.accepted("once").await;
    assert_eq!(got.len(), 12, "{got:?}");
    let mut titles: Vec<String> = got
        .iter()
        .map(|r| {
            r["body"]["markdown"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    titles.sort();
    titles.dedup();
    assert_eq!(titles.len(), 12, "each alert once: {titles:?}");
    assert_eq!(
        first
            .sql_i64(
                "SELECT count(*) AS v FROM compensation_attempts a JOIN compensation_events e ON e.id = a.event_id
                  WHERE e.kind = 'ALERT_DELIVERY'"
            )
            .await,
        12,
        "one attempt each"
    );
}
