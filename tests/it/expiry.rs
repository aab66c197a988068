//! Expiry and the scheduler: on time, exactly once, whatever races or crashes.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use fitorder::app::AppState;
use fitorder::tasks::Scheduler;
use serde_json::json;

use crate::fakes::FakeProviderApi;
use crate::harness::*;
use crate::providers;

async fn short(timeout_ms: u64) -> TestApp {
    TestApp::with_config(move |c| {
        c.order_timeout = Duration::from_millis(timeout_ms);
        providers::configure(c);
    })
    .await
}

async fn expire(app: &TestApp) -> i64 {
    fitorder::expiry::expire_due(&app.state)
        .await
        .map_err(|e| e.message())
        .unwrap()
}

/// Another "process": its own pool and hub on the same database.
fn instance(app: &TestApp) -> AppState {
    let pool = fitorder::db::pool(&app.db_url, 4).unwrap();
    let events = fitorder::events::EventHub::start(app.db_url.clone(), pool.clone());
    AppState::with_keys(
        pool,
        (*app.state.config).clone(),
        (*app.state.keys).clone(),
        events,
        app.db_url.clone(),
    )
}

#[tokio::test]
async fn an_unpaid_order_expires_releasing_stock_and_frozen_money_once() {
    let app = Arc::new(short(1_300).await);
    let s = app.studio(5_000, Some(3), 3).await;
    let placed = app
        .place(
            &s.member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack},
                   "paymentMethod": "MIXED", "walletAmountCents": 2_000}),
        )
        .await;
    let no = placed["order"]["orderNo"].as_str().unwrap().to_string();
    assert_eq!(app.sql_i64("SELECT stock::bigint AS v FROM class_packs").await, 2);
    assert_eq!(expire(&app).await, 0, "not due yet");
    tokio::time::sleep(Duration::from_millis(1_400)).await;
    // Five expirers at once, as if five workers woke together.
    let mut tasks = vec![];
    for _ in 0..5 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move { expire(&app).await }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 1, "canceled exactly once");
    let o = app.order(&no).await;
    assert_eq!(o["status"], "CANCELED");
    assert_eq!(o["cancelReason"], "TIMEOUT");
    assert_eq!(o["isExpired"], true);
    assert_eq!(o["member"]["wallet"], json!({"balanceCents": 5000, "frozenCents": 0}));
    assert_eq!(app.sql_i64("SELECT stock::bigint AS v FROM class_packs").await, 3);
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM wallet_ledger WHERE kind = 'UNFREEZE'")
            .await,
        1
    );
    let expired = app
        .op(
            &app.admin_token(),
            ADMIN_OPS,
            "Orders",
            json!({"filter": {"isExpired": true}}),
        )
        .await;
    assert_eq!(expired["data"]["orders"]["totalCount"], 1);
    let stats = app
        .op(
            &app.ops_token(),
            OPS_OPS,
            "Anomalies",
            json!({"from": "2000-01-01T00:00:00Z", "to": "2100-01-01T00:00:00Z"}),
        )
        .await;
    let n = stats["data"]["anomalyStats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["category"] == "ORDER_EXPIRED")
        .unwrap()["count"]
        .clone();
    assert_eq!(n, 1);
    // The payment that arrives after the cancel never revives it.
    assert_eq!(
        app.wechat_paid(&no, "4200000000000000000000000900", 3_000).await,
        StatusCode::NO_CONTENT
    );
    let o = app.order(&no).await;
    assert_eq!(o["status"], "CANCELED");
    assert_eq!(o["tickets"][0]["kind"], "PAID_AFTER_CANCEL");
}

#[tokio::test]
async fn a_payment_just_before_the_deadline_wins_and_expiry_leaves_it_alone() {
    let app = short(1_500).await;
    let s = app.studio(0, None, 3).await;
    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WECHAT_PAY")
        .await;
    assert_eq!(
        app.wechat_paid(&no, "4200000000000000000000000901", 10_000).await,
        StatusCode::NO_CONTENT
    );
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    assert_eq!(expire(&app).await, 0);
    let o = app.order(&no).await;
    assert_eq!(o["status"], "PAID");
    assert!(o["expiresAt"].is_null(), "cleared when paid");
    assert_eq!(o["isExpired"], false);
}

#[tokio::test]
async fn two_hundred_orders_expire_once_with_three_instances_racing() {
    let app = short(1_500).await;
    let s = app.studio(1_000_000, Some(200), 3).await;
    for i in 0..200 {
        let input = if i % 2 == 0 {
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "ALIPAY"})
        } else {
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "MIXED", "walletAmountCents": 1000})
        };
        app.place(&s.member, input).await;
    }
    assert_eq!(app.sql_i64("SELECT stock::bigint AS v FROM class_packs").await, 0);
    assert_eq!(app.member_view(&s.member).await["wallet"]["frozenCents"], 100_000);
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    // Three instances: precise timers and scans all at once.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut handles = vec![];
    for _ in 0..3 {
        let st = instance(&app);
        handles.push(tokio::spawn(fitorder::expiry::run_timer(st.clone(), stop_rx.clone())));
        handles.push(tokio::spawn(async move {
            for _ in 0..5 {
                fitorder::expiry::expire_due(&st)
                    .await
                    .map_err(|e| e.message())
                    .unwrap();
            }
        }));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while app
        .sql_i64("SELECT count(*) AS v FROM orders WHERE status = 'WAIT_PAY'")
        .await
        > 0
    {
        assert!(tokio::time::Instant::now() < deadline, "orders outlived their deadline");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_tx.send(true).unwrap();
    for h in handles {
        let _ = tokio::time::timeout(Duration::from_secs(5), h).await;
    }
    assert_eq!(
        app.sql_i64("SELECT stock::bigint AS v FROM class_packs").await,
        200,
        "every unit back, once"
    );
    assert_eq!(
        app.member_view(&s.member).await["wallet"],
        json!({"balanceCents": 1_000_000, "frozenCents": 0})
    );
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM order_transitions WHERE to_status = 'CANCELED'")
            .await,
        200
    );
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM wallet_ledger WHERE kind = 'UNFREEZE'")
            .await,
        100
    );
}

#[tokio::test]
async fn the_precise_timer_cancels_on_time_without_a_scan() {
    let app = short(1_800).await;
    let s = app.studio(0, None, 3).await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let timer = tokio::spawn(fitorder::expiry::run_timer(app.state.clone(), stop_rx));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let no = app
        .buy(&s.member, &s.store, json!({"coachSlotId": s.slot}), "WECHAT_PAY")
        .await;
    tokio::time::sleep(Duration::from_millis(2_600)).await;
    let o = app.order(&no).await;
    assert_eq!(o["status"], "CANCELED", "canceled within the second after its deadline");
    let canceled = chrono::DateTime::parse_from_rfc3339(o["canceledAt"].as_str().unwrap()).unwrap();
    let due = chrono::DateTime::parse_from_rfc3339(o["expiresAt"].as_str().unwrap()).unwrap();
    let late = (canceled - due).num_milliseconds();
    assert!((0..1_000).contains(&late), "{late} ms late");
    assert_eq!(app.sql_i64("SELECT remaining::bigint AS v FROM coach_slots").await, 3);
    stop_tx.send(true).unwrap();
    timer.await.unwrap();
}

#[tokio::test]
async fn a_killed_instance_leaves_nothing_behind_after_one_scan() {
    let app = short(1_300).await;
    let s = app.studio(0, Some(10), 3).await;
    // The instance with the timer dies before the deadline.
    let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let doomed = tokio::spawn(fitorder::expiry::run_timer(instance(&app), stop_rx));
    for _ in 0..5 {
        app.place(
            &s.member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WECHAT_PAY"}),
        )
        .await;
    }
    doomed.abort();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM orders WHERE status = 'WAIT_PAY'")
            .await,
        5
    );
    // A restarted instance's scheduler runs the fallback scan on its first tick.
    let ran = Scheduler::standard(instance(&app)).tick(chrono::Utc::now()).await;
    assert!(ran.contains(&"order:expire"), "{ran:?}");
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM orders WHERE status = 'WAIT_PAY'")
            .await,
        0
    );
    assert_eq!(app.sql_i64("SELECT stock::bigint AS v FROM class_packs").await, 10);
    let runs = app
        .gql(
            Some(&app.admin_token()),
            "query { taskRuns(task: \"order:expire\") { task status rowsTouched } }",
            json!({}),
        )
        .await;
    assert_eq!(
        runs["data"]["taskRuns"][0],
        json!({"task": "order:expire", "status": "SUCCEEDED", "rowsTouched": 5})
    );
}

#[tokio::test]
async fn each_tick_runs_on_one_instance_only() {
    let app = TestApp::new().await;
    let (a, b, c) = (
        Scheduler::standard(instance(&app)),
        Scheduler::standard(instance(&app)),
        Scheduler::standard(instance(&app)),
    );
    let now = chrono::Utc::now();
    let (ra, rb, rc) = tokio::join!(a.tick(now), b.tick(now), c.tick(now));
    let mut all: Vec<&str> = ra.iter().chain(rb.iter()).chain(rc.iter()).copied().collect();
    all.sort();
    let mut names: Vec<&str> = a.tasks.iter().map(|t| t.name).collect();
    names.sort();
    assert_eq!(all, names, "every task ran once across the three");
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM task_runs").await,
        names.len() as i64
    );
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM task_runs WHERE status <> 'SUCCEEDED'")
            .await,
        0
    );
    // The same tick again: nobody runs anything.
    assert!(a.tick(now).await.is_empty());
}

#[tokio::test]
async fn before_canceling_the_provider_is_asked_and_a_late_payment_applied() {
    let api = FakeProviderApi::start(providers::merchant_public()).await;
    let base = api.base.clone();
    let gateway = format!("{}/gateway.do", api.base);
    let app = TestApp::with_config(move |c| {
        providers::configure_refunds(c, &base, &gateway);
        c.order_timeout = Duration::from_millis(200);
        c.downstream_timeout = Duration::from_millis(500);
        // Provider calls have their own limit.
        c.provider_timeout = Duration::from_millis(500);
    })
    .await;
    let s = app.studio(0, None, 3).await;
    let mut nos = vec![];
    for _ in 0..3 {
        let placed = app
            .place(
                &s.member,
                json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WECHAT_PAY"}),
            )
            .await;
        nos.push(placed["order"]["orderNo"].as_str().unwrap().to_string());
    }
    // The first was paid but its callback never came; the others were not paid.
    api.paid
        .lock()
        .unwrap()
        .insert(nos[0].clone(), ("4200000000000000000000000950".into(), 10_000));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(expire(&app).await, 3);
    let paid = app.order(&nos[0]).await;
    assert_eq!(paid["status"], "PAID");
    assert_eq!(paid["providerTxnId"], "4200000000000000000000000950");
    for no in &nos[1..] {
        assert_eq!(app.order(no).await["status"], "CANCELED");
    }
    let mut closed = api.closed.lock().unwrap().clone();
    closed.sort();
    let mut expected = nos[1..].to_vec();
    expected.sort();
    assert_eq!(closed, expected, "unpaid trades are closed at the provider");
    // The late callback, when it finally comes, is a duplicate.
    assert_eq!(
        app.wechat_paid(&nos[0], "4200000000000000000000000950", 10_000).await,
        StatusCode::NO_CONTENT
    );
    let chain = app
        .admin(
            "query($n: String!) { order(orderNo: $n) { callbacks { outcome } } }",
            json!({"n": nos[0]}),
        )
        .await;
    assert_eq!(
        chain["order"]["callbacks"],
        json!([{"outcome": "APPLIED"}, {"outcome": "DUPLICATE"}])
    );
    // A provider that does not answer does not hold expiry up.
    api.hang_queries.store(true, std::sync::atomic::Ordering::SeqCst);
    let placed = app
        .place(
            &s.member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WECHAT_PAY"}),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    assert_eq!(expire(&app).await, 1);
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(
        app.order(placed["order"]["orderNo"].as_str().unwrap()).await["status"],
        "CANCELED"
    );
}

#[tokio::test]
async fn three_hundred_due_orders_three_instances_a_slow_provider_each_trade_asked_once() {
    let app = short(1_300).await;
    let s = app.studio(0, Some(300), 3).await;
    let mut nos = vec![];
    for i in 0..300 {
        let method = if i % 2 == 0 { "WECHAT_PAY" } else { "ALIPAY" };
        nos.push(
            app.buy(&s.member, &s.store, json!({"classPackId": s.pack}), method)
                .await,
        );
    }
    tokio::time::sleep(Duration::from_millis(1_400)).await;
    // Every answer takes 200 ms.
    app.sandbox.set_delay(Duration::from_millis(200));
    let started = std::time::Instant::now();
    let mut handles = vec![];
    for _ in 0..3 {
        let st = instance(&app);
        handles.push(tokio::spawn(async move {
            fitorder::expiry::expire_due(&st)
                .await
                .map_err(|e| e.message())
                .unwrap()
        }));
    }
    let mut settled = 0;
    for h in handles {
        settled += h.await.unwrap();
    }
    let took = started.elapsed();
    assert_eq!(settled, 300, "each order settled by exactly one instance");
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM orders WHERE status = 'CANCELED'")
            .await,
        300
    );
    let mut asked = std::collections::HashMap::<String, usize>::new();
    for c in app.sandbox.calls() {
        if c.api == "/v3/pay/transactions/out-trade-no/{out_trade_no}" {
            for no in nos.iter().filter(|no| c.path.contains(no.as_str())) {
                *asked.entry(no.clone()).or_default() += 1;
            }
        }
    }
    let alipay_queries = app
        .sandbox
        .calls()
        .iter()
        .filter(|c| c.api == "alipay.trade.query")
        .count();
    let wechat_queried: usize = asked.values().sum();
    assert_eq!(wechat_queried + alipay_queries, 300, "each trade asked once: {asked:?}");
    assert!(asked.values().all(|n| *n == 1), "{asked:?}");
    // 300 queries and 300 closes of 200 ms each would take 120 s one after another; claimed in
    // batches and asked 8 at a time per instance they take seconds (a liveness bound, not a
    // speed measurement: that is bench B3's).
    eprintln!("300 due orders settled in {took:?}");
    assert!(took < Duration::from_secs(60), "took {took:?}");
}

/// Expiry cancels through the one writer of status changes: an expired order's history, seat
/// release and unfreeze are those of a member's cancel (same statement), born with the same
/// audit row as every order, written once per order even in one batch of several.
#[tokio::test]
async fn expiry_and_cancel_write_the_same_history_and_releases() {
    let app = short(1_300).await;
    let s = app.studio(10_000, Some(3), 3).await;
    let mut nos = vec![];
    for _ in 0..3 {
        let placed = app
            .place(
                &s.member,
                json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack},
                       "paymentMethod": "MIXED", "walletAmountCents": 1_000}),
            )
            .await;
        nos.push(placed["order"]["orderNo"].as_str().unwrap().to_string());
    }
    assert_eq!(app.sql_i64("SELECT stock::bigint AS v FROM class_packs").await, 0);
    app.ok(
        &app.member_token(&s.member),
        "mutation($no: String!) { cancelOrder(orderNo: $no) { status } }",
        json!({"no": nos[0]}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1_400)).await;
    assert_eq!(expire(&app).await, 2, "both left expire in one batch");
    assert_eq!(app.sql_i64("SELECT stock::bigint AS v FROM class_packs").await, 3);
    let o = app.order(&nos[0]).await;
    assert_eq!(o["member"]["wallet"], json!({"balanceCents": 10000, "frozenCents": 0}));
    for (i, no) in nos.iter().enumerate() {
        let (actor, reason) = if i == 0 {
            ("member:", "")
        } else {
            (
                "system:expiry",
                "AND t.reason = 'TIMEOUT' AND o.cancel_reason = 'TIMEOUT'",
            )
        };
        // Born WAIT_PAY with its audit row, then one cancel, nothing else.
        assert_eq!(
            app.sql_i64(&format!(
                "SELECT count(*) AS v FROM order_transitions t JOIN orders o ON o.id = t.order_id
                  WHERE o.order_no = '{no}'"
            ))
            .await,
            2,
            "{no}"
        );
        assert_eq!(
            app.sql_i64(&format!(
                "SELECT count(*) AS v FROM order_transitions t JOIN orders o ON o.id = t.order_id
                  WHERE o.order_no = '{no}' AND t.from_status IS NULL AND t.to_status = 'WAIT_PAY'
                    AND t.reason = 'order placed' AND t.actor LIKE 'member:%'"
            ))
            .await,
            1,
            "{no}: the birth"
        );
        assert_eq!(
            app.sql_i64(&format!(
                "SELECT count(*) AS v FROM order_transitions t JOIN orders o ON o.id = t.order_id
                  WHERE o.order_no = '{no}' AND t.from_status = 'WAIT_PAY' AND t.to_status = 'CANCELED'
                    AND t.actor LIKE '{actor}%' {reason}"
            ))
            .await,
            1,
            "{no}: the cancel"
        );
        // One unfreeze of its frozen part, by whoever canceled it.
        assert_eq!(
            app.sql_i64(&format!(
                "SELECT count(*) AS v FROM wallet_ledger l JOIN orders o ON o.id = l.order_id
                  WHERE o.order_no = '{no}' AND l.kind = 'UNFREEZE' AND l.balance_delta = 1000
                    AND l.frozen_delta = -1000 AND l.actor LIKE '{actor}%'"
            ))
            .await,
            1,
            "{no}: the unfreeze"
        );
    }
    assert_eq!(expire(&app).await, 0, "nothing twice");
}
