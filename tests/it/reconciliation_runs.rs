//! Reconciliation runs that never stay RUNNING after their process stopped working on them, a
//! daily run that one provider's failure does not stop, a scheduler whose long task holds no
//! other back, and the one writer of tickets.

use std::time::{Duration, Instant};

use chrono::Utc;
use fitorder::domain::payment::Provider;
use fitorder::domain::ReconciliationStatus;
use fitorder::reconciliation;
use fitorder::trace::TraceId;
use serde_json::json;

use crate::harness::*;

fn today() -> chrono::NaiveDate {
    Utc::now().with_timezone(&chrono_tz::Asia::Shanghai).date_naive()
}

fn temp_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fitorder-runs-{}", key()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A provider stand-in that takes every connection and never answers.
async fn hanging() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = vec![];
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    format!("http://{addr}")
}

/// A provider stand-in that drops every connection at once.
async fn dropping() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            drop(socket);
        }
    });
    format!("http://{addr}")
}

/// An app in Asia/Shanghai with its own statement dir; `wechat` replaces WeChat Pay's API.
async fn app(served: bool, wechat: Option<String>, tweak: impl FnOnce(&mut fitorder::config::Config)) -> TestApp {
    let dir = temp_dir();
    let tweak = move |c: &mut fitorder::config::Config| {
        c.statement_dir = dir;
        c.timezone = chrono_tz::Asia::Shanghai;
        if let Some(base) = wechat {
            c.wechatpay.api_base = base;
        }
        tweak(c);
    };
    if served {
        TestApp::served_with(tweak).await
    } else {
        TestApp::with_config(tweak).await
    }
}

async fn running(app: &TestApp) -> i64 {
    app.sql_i64("SELECT count(*) AS v FROM reconciliation_runs WHERE status = 'RUNNING'")
        .await
}

#[tokio::test]
async fn a_reconciliation_run_whose_provider_errors_ends_failed_at_once() {
    let app = app(false, Some(dropping().await), |c| {
        c.provider_timeout = Duration::from_secs(30);
    })
    .await;
    let started = Instant::now();
    let r = app
        .op(
            &app.admin_token(),
            ADMIN_OPS,
            "RunReconciliation",
            json!({"provider": "WECHAT_PAY", "date": today().to_string()}),
        )
        .await;
    assert!(r.get("errors").is_none(), "{r}");
    let run = &r["data"]["runReconciliation"];
    assert_eq!(run["status"], "FAILED", "{run}");
    let why = run["error"].as_str().unwrap();
    assert!(why.contains("fetching the"), "{why}");
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    assert_eq!(running(&app).await, 0, "no run stays RUNNING");
    assert_eq!(
        app.sql_i64(
            "SELECT count(*) AS v FROM reconciliation_runs WHERE status = 'FAILED' AND finished_at IS NOT NULL"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn a_reconciliation_request_dropped_mid_run_leaves_no_running_row() {
    let app = app(true, None, |_| {}).await;
    // Every provider answer takes a while: the request goes away before the run ends.
    app.sandbox.set_delay(Duration::from_millis(3_000));
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let body = json!({"query": ADMIN_OPS, "operationName": "RunReconciliation",
                      "variables": {"provider": "WECHAT_PAY", "date": today().to_string()}});
    let request = http
        .post(format!("{}/graphql", app.state.config.public_url))
        .bearer_auth(app.admin_token())
        .header("x-forwarded-for", TEST_CLIENT_IP)
        .json(&body)
        .send();
    let client = tokio::spawn(request);
    until_running(&app).await;
    // The client disconnects mid-run.
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        app.sql_i64(
            "SELECT count(*) AS v FROM reconciliation_runs WHERE status = 'RUNNING' AND heartbeat_at IS NOT NULL"
        )
        .await,
        1,
        "the run goes on without the request, beating its heartbeat"
    );
    until_done(&app).await;
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM reconciliation_runs WHERE status = 'SUCCEEDED'")
            .await,
        1,
        "to its outcome"
    );

    // The caller's future dropped mid-run (not only a disconnected client): the same.
    let yesterday = today() - chrono::Duration::days(1);
    let trace = TraceId::new();
    tokio::select! {
        _ = reconciliation::run(&app.state, Provider::Alipay, yesterday, None, &trace) => {
            panic!("the run ended before it was dropped")
        }
        _ = until_running(&app) => {}
    }
    until_done(&app).await;
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM reconciliation_runs WHERE status = 'SUCCEEDED'")
            .await,
        2
    );
}

async fn until_running(app: &TestApp) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while running(app).await == 0 {
        assert!(Instant::now() < deadline, "the run did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn until_done(app: &TestApp) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while running(app).await > 0 {
        assert!(Instant::now() < deadline, "the run stayed RUNNING");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_reconciliation_run_whose_process_died_is_closed_within_a_minute() {
    let app = app(false, None, |_| {}).await;
    let yesterday = today() - chrono::Duration::days(1);
    // A process died while running these: their heartbeats stopped two minutes ago.
    for day in [today(), yesterday] {
        app.sql_i64(&format!(
            "WITH r AS (INSERT INTO reconciliation_runs (provider, bill_date, status, trace_id, started_at, heartbeat_at) \
             VALUES ('WECHAT_PAY', '{day}', 'RUNNING', 't', now() - interval '3 minutes', now() - interval '2 minutes') \
             RETURNING id) SELECT id AS v FROM r"
        ))
        .await;
    }
    // A run of that day starts anyway: the abandoned one is closed first.
    let r = reconciliation::run(&app.state, Provider::WechatPay, today(), None, &TraceId::new())
        .await
        .map_err(|e| e.message())
        .unwrap();
    assert_eq!(r.status, ReconciliationStatus::Succeeded, "{:?}", r.error);
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT count(*) AS v FROM reconciliation_runs WHERE bill_date = '{}' AND status = 'FAILED' \
             AND error LIKE 'abandoned: no heartbeat%'",
            today()
        ))
        .await,
        1
    );
    // The other is closed by the sweep of every minute, with its alert.
    fitorder::tasks::housekeeping::alert_check(app.state.clone())
        .await
        .map_err(|e| e.message())
        .unwrap();
    assert_eq!(running(&app).await, 0);
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM alerts WHERE cause = 'RECONCILIATION_FAILED'")
            .await,
        2,
        "each abandoned run is a FAILED run, alerted"
    );
    // A run whose process is alive (a fresh heartbeat, or none yet) is not anybody else's.
    app.sql_i64(&format!(
        "WITH r AS (INSERT INTO reconciliation_runs (provider, bill_date, status, trace_id, heartbeat_at) \
         VALUES ('ALIPAY', '{}', 'RUNNING', 't', now()) RETURNING id) SELECT id AS v FROM r",
        today()
    ))
    .await;
    let refused = reconciliation::run(&app.state, Provider::Alipay, today(), None, &TraceId::new()).await;
    assert_eq!(refused.err().map(|e| e.code()), Some("CONFLICT"));
    fitorder::tasks::housekeeping::alert_check(app.state.clone())
        .await
        .map_err(|e| e.message())
        .unwrap();
    assert_eq!(running(&app).await, 1);
}

#[tokio::test]
async fn the_daily_reconciliation_with_one_provider_failing_still_runs_the_other() {
    let app = app(false, Some(dropping().await), |_| {}).await;
    let yesterday = today() - chrono::Duration::days(1);
    let failed = reconciliation::daily(app.state.clone())
        .await
        .map(|n| format!("no failure reported ({n} runs)"))
        .unwrap_err()
        .message();
    assert!(failed.contains("1 of the reconciliations failed"), "{failed}");
    assert!(failed.contains(&yesterday.to_string()), "{failed}");
    assert!(failed.contains("fetching the"), "{failed}");
    for (provider, status) in [("WECHAT_PAY", "FAILED"), ("ALIPAY", "SUCCEEDED")] {
        assert_eq!(
            app.sql_i64(&format!(
                "SELECT count(*) AS v FROM reconciliation_runs WHERE provider = '{provider}' \
                 AND bill_date = '{yesterday}' AND status = '{status}'"
            ))
            .await,
            1,
            "{provider}"
        );
    }
    assert_eq!(running(&app).await, 0);
}

#[tokio::test]
async fn a_reconciliation_that_hangs_does_not_delay_expiry() {
    let app = app(false, Some(hanging().await), |c| {
        c.provider_timeout = Duration::from_secs(120);
        c.order_timeout = Duration::from_millis(500);
        c.scan_interval = Duration::from_secs(1);
    })
    .await;
    let s = app.studio(0, None, 3).await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let scheduler = tokio::spawn(fitorder::tasks::Scheduler::standard(app.state.clone()).run(stopped));
    // The daily reconciliation is claimed at once (its slot of today passed) and hangs on
    // WeChat Pay's bill.
    let deadline = Instant::now() + Duration::from_secs(20);
    while app
        .sql_i64("SELECT count(*) AS v FROM reconciliation_runs WHERE status = 'RUNNING' AND provider = 'WECHAT_PAY'")
        .await
        == 0
    {
        assert!(Instant::now() < deadline, "the daily reconciliation did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // An order waiting for its payment (whether its payment could start does not matter here).
    let placed = app
        .op(
            &app.member_token(&s.member),
            MEMBER_OPS,
            "PlaceOrder",
            json!({"input": {"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack},
                             "paymentMethod": "ALIPAY"}}),
        )
        .await;
    let no = placed["data"]["placeOrder"]["order"]["orderNo"]
        .as_str()
        .unwrap_or_else(|| panic!("{placed:#}"))
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(15);
    while app.order(&no).await["status"] != "CANCELED" {
        assert!(
            Instant::now() < deadline,
            "order:expire was held back by the hanging reconciliation"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM task_runs WHERE task = 'reconcile:daily' AND status = 'RUNNING'")
            .await,
        1,
        "the reconciliation still hangs"
    );
    stop.send(true).unwrap();
    scheduler.abort();
}

/// Every file of the crate(s) under `dir` ending in `.rs` or `.sql`.
fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries {
        let p = e.unwrap().path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "target" || n == "node_modules") {
                continue;
            }
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs" || x == "sql") {
            out.push(p);
        }
    }
}

/// Whether `path` is the tickets module (`tickets.rs`, `tickets/mod.rs` or a file under
/// `tickets/`), wherever its crate is.
fn in_tickets_module(path: &std::path::Path) -> bool {
    path.file_name().is_some_and(|n| n == "tickets.rs")
        || path
            .parent()
            .into_iter()
            .flat_map(|p| p.components())
            .any(|c| c.as_os_str() == "tickets")
}

#[test]
fn tickets_are_written_by_the_tickets_module_only() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![];
    sources(&root.join("src"), &mut files);
    sources(&root.join("crates"), &mut files);
    // The bench seeds its own databases; it is outside the layers.
    files.retain(|f| !f.starts_with(root.join("crates/bench")));
    assert!(files.len() > 50, "the sources were found");
    let mut writers = vec![];
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap().to_lowercase();
        let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        // Names the table goes by in this file (`exception_tickets as et`).
        let mut names = vec!["exception_tickets".to_string()];
        for (i, _) in flat.match_indices("exception_tickets as ") {
            let alias: String = flat[i + "exception_tickets as ".len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !alias.is_empty() {
                names.push(alias);
            }
        }
        let sql =
            flat.contains("insert into exception_tickets") || flat.contains("insert into public.exception_tickets");
        let dsl = flat.match_indices("insert_into(").any(|(i, _)| {
            let target: String = flat[i + "insert_into(".len()..]
                .chars()
                .take_while(|c| *c != ')')
                .collect();
            let target = target.replace(' ', "");
            names
                .iter()
                .any(|n| target == *n || target.ends_with(&format!("::{n}")) || target.contains(&format!("{n}::table")))
        });
        if (sql || dsl) && !in_tickets_module(f) {
            writers.push(f.strip_prefix(root).unwrap_or(f).display().to_string());
        }
    }
    assert!(
        writers.is_empty(),
        "tickets are opened through `tickets::open` / `tickets::opening` only; these write them themselves: {writers:?}"
    );
    // And the tickets module is where they are written.
    let ours: Vec<_> = files.iter().filter(|f| in_tickets_module(f)).collect();
    assert!(
        ours.iter().any(|f| std::fs::read_to_string(f)
            .unwrap()
            .contains("INSERT INTO exception_tickets")),
        "{ours:?}"
    );
}
