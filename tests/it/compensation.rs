//! The outbox worker against a local downstream that fails, hangs or succeeds; DEAD, tickets,
//! replay; workers racing; a worker killed mid-call; subscribers on another instance.

use std::sync::Arc;
use std::time::Duration;

use fitorder::compensation::worker::Worker;
use serde_json::json;

use crate::fakes::{FakeDownstream, Mode};
use crate::harness::*;
use crate::ws::WsClient;

async fn app_with(fake: &FakeDownstream, max_attempts: i32, timeout_ms: u64) -> TestApp {
    let url = fake.url.clone();
    TestApp::with_config(move |c| {
        c.door_access_url = Some(url.clone().into());
        c.ai_access_url = Some(url.into());
        c.retry_base = Duration::from_millis(100);
        c.max_attempts = max_attempts;
        c.downstream_timeout = Duration::from_millis(timeout_ms);
        // The worker's lease covers a refund's provider calls too.
        c.provider_timeout = Duration::from_millis(timeout_ms);
    })
    .await
}

async fn paid_order(app: &TestApp) -> (Studio, String) {
    let s = app.studio(100_000, None, 3).await;
    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WALLET")
        .await;
    (s, no)
}

/// Runs the worker until no event is PENDING or RETRYING (or `secs` pass).
async fn drain(app: &TestApp, worker: &Worker, secs: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        worker.run_once().await.unwrap();
        let open = app
            .sql_i64("SELECT count(*) AS v FROM compensation_events WHERE status IN ('PENDING', 'RETRYING')")
            .await;
        if open == 0 || tokio::time::Instant::now() > deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const COMPENSATIONS: &str = "query($no: String!) { order(orderNo: $no) { traceId compensation {
    id kind status attempts maxAttempts nextAttemptAt lastError idempotencyKey attemptLog { at ok error durationMs } } } }";

#[tokio::test]
async fn grants_reach_the_downstream_with_key_and_trace() {
    let fake = FakeDownstream::start(Mode::Healthy).await;
    let app = app_with(&fake, 5, 2000).await;
    let (s, no) = paid_order(&app).await;
    drain(&app, &Worker::new(app.state.clone()), 10).await;
    let o = app.admin(COMPENSATIONS, json!({"no": no})).await["order"].clone();
    for e in o["compensation"].as_array().unwrap() {
        assert_eq!(e["status"], "SUCCEEDED", "{e}");
        assert_eq!(e["attempts"], 1);
        assert!(e["nextAttemptAt"].is_null());
    }
    let calls = fake.calls();
    assert_eq!(calls.len(), 2);
    for c in &calls {
        assert_eq!(c.body["orderNo"], no);
        assert_eq!(c.body["memberId"], s.member);
        assert_eq!(c.body["storeId"], s.store);
        assert_eq!(c.body["action"], "GRANT");
        assert!(c.body["eventId"].is_string());
        assert_eq!(c.trace_id.as_deref(), o["traceId"].as_str());
    }
    let keys: std::collections::HashSet<_> = calls
        .iter()
        .map(|c| c.body["idempotencyKey"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(keys.len(), 2);
}

#[tokio::test]
async fn failures_back_off_exponentially_and_keep_their_key() {
    let fake = FakeDownstream::start(Mode::FailFirst(6)).await;
    let app = app_with(&fake, 10, 2000).await;
    let (_, no) = paid_order(&app).await;
    let worker = Worker::new(app.state.clone());
    // First round: both fail; the next attempt is due about one base later (±20%).
    worker.run_once().await.unwrap();
    let o = app.admin(COMPENSATIONS, json!({"no": no})).await["order"].clone();
    for e in o["compensation"].as_array().unwrap() {
        assert_eq!(e["status"], "RETRYING");
        assert_eq!(e["attempts"], 1);
        assert!(e["lastError"].as_str().unwrap().contains("503"), "{e}");
        let at = chrono::DateTime::parse_from_rfc3339(e["attemptLog"][0]["at"].as_str().unwrap()).unwrap();
        let next = chrono::DateTime::parse_from_rfc3339(e["nextAttemptAt"].as_str().unwrap()).unwrap();
        let gap = (next - at).num_milliseconds();
        assert!((70..=130).contains(&gap), "first gap {gap} ms");
    }
    drain(&app, &worker, 20).await;
    let o = app.admin(COMPENSATIONS, json!({"no": no})).await["order"].clone();
    for e in o["compensation"].as_array().unwrap() {
        assert_eq!(e["status"], "SUCCEEDED");
        let log = e["attemptLog"].as_array().unwrap();
        assert_eq!(log.len() as i64, e["attempts"].as_i64().unwrap());
        assert_eq!(log.last().unwrap()["ok"], true);
        // The gaps grow: every wait is at least 1.5× the one before (2× ± 20% jitter).
        let times: Vec<_> = log
            .iter()
            .map(|a| chrono::DateTime::parse_from_rfc3339(a["at"].as_str().unwrap()).unwrap())
            .collect();
        let gaps: Vec<i64> = times.windows(2).map(|w| (w[1] - w[0]).num_milliseconds()).collect();
        for g in gaps.windows(2) {
            assert!(g[1] as f64 >= g[0] as f64 * 1.3, "gaps {gaps:?}");
        }
    }
    // Every attempt of one event carried the same idempotency key.
    let mut keys_per_event: std::collections::HashMap<String, std::collections::HashSet<String>> = Default::default();
    for c in fake.calls() {
        keys_per_event
            .entry(c.body["eventId"].as_str().unwrap().to_string())
            .or_default()
            .insert(c.body["idempotencyKey"].as_str().unwrap().to_string());
    }
    assert_eq!(keys_per_event.len(), 2);
    assert!(keys_per_event.values().all(|k| k.len() == 1), "{keys_per_event:?}");
    assert!(fake.calls().len() >= 8, "six failures and two successes");
}

#[tokio::test]
async fn hopeless_events_die_open_a_ticket_and_replay_in_one_click() {
    let fake = FakeDownstream::start(Mode::AlwaysFail).await;
    let app = app_with(&fake, 3, 2000).await;
    let (_, no) = paid_order(&app).await;
    let worker = Worker::new(app.state.clone());
    drain(&app, &worker, 20).await;
    let dead = app.op(&app.ops_token(), OPS_OPS, "DeadCompensations", json!({})).await;
    let edges = dead["data"]["compensationEvents"]["edges"].as_array().unwrap().clone();
    assert_eq!(edges.len(), 2);
    assert!(edges
        .iter()
        .all(|e| e["node"]["attempts"] == 3 && e["node"]["orderNo"] == no));
    let tickets = app.op(&app.ops_token(), OPS_OPS, "OpenTickets", json!({})).await;
    let kinds: Vec<&str> = tickets["data"]["exceptionTickets"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["node"]["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["COMPENSATION_DEAD", "COMPENSATION_DEAD"]);
    // The door works again; ops replay one event, then the rest of the order's.
    fake.set(Mode::Healthy);
    let id = edges[0]["node"]["id"].as_str().unwrap().to_string();
    let r = app.op(&app.ops_token(), OPS_OPS, "Replay", json!({"id": id})).await;
    assert_eq!(r["data"]["replayCompensation"]["status"], "PENDING");
    assert_eq!(r["data"]["replayCompensation"]["attempts"], 3);
    let again = app.op(&app.ops_token(), OPS_OPS, "Replay", json!({"id": id})).await;
    assert_eq!(error_code(&again), "CONFLICT");
    let n = app
        .op(
            &app.admin_token(),
            ADMIN_OPS,
            "ReplayDeadCompensations",
            json!({"orderNo": no}),
        )
        .await;
    assert_eq!(n["data"]["replayDeadCompensations"], 1);
    drain(&app, &worker, 10).await;
    let o = app.admin(COMPENSATIONS, json!({"no": no})).await["order"].clone();
    for e in o["compensation"].as_array().unwrap() {
        assert_eq!(e["status"], "SUCCEEDED");
        assert_eq!(e["attempts"], 4, "attempts are counted on across the replay");
    }
    let chain = app.order(&no).await;
    assert!(chain["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["kind"] == "COMPENSATION_REPLAY" && e["actor"] == "ops:ops-1"));
    // Members may not replay.
    let r = app
        .op(&app.member_token("1"), OPS_OPS, "Replay", json!({"id": id}))
        .await;
    assert_eq!(error_code(&r), "FORBIDDEN");
}

#[tokio::test]
async fn a_hanging_downstream_is_a_timed_out_attempt() {
    let fake = FakeDownstream::start(Mode::Hang).await;
    let app = app_with(&fake, 5, 300).await;
    let (_, no) = paid_order(&app).await;
    let started = std::time::Instant::now();
    Worker::new(app.state.clone()).run_once().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    let o = app.admin(COMPENSATIONS, json!({"no": no})).await["order"].clone();
    for e in o["compensation"].as_array().unwrap() {
        assert_eq!(e["status"], "RETRYING");
        assert!(e["lastError"].as_str().unwrap().contains("no answer within"), "{e}");
    }
}

#[tokio::test]
async fn two_workers_racing_over_a_thousand_events_deliver_each_once() {
    let fake = FakeDownstream::start(Mode::Healthy).await;
    let app = Arc::new(app_with(&fake, 5, 5000).await);
    let (_, no) = paid_order(&app).await;
    let mut c = app.conn().await;
    // One event per order, on 998 more orders copied from the paid one (born WAIT_PAY, as every
    // order): one order's access events are claimed one after another (README "Membership
    // operations"), and this test is about the race of two claimers over independent events.
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(format!(
            "WITH copies AS (
                 INSERT INTO orders (member_id, store_id, kind, item_name, class_pack_id, amount_cents,
                                     payment_method, sessions_total, trace_id, idempotency_key, request_hash)
                 SELECT o.member_id, o.store_id, o.kind, o.item_name, o.class_pack_id, o.amount_cents,
                        o.payment_method, o.sessions_total, 'bulk', 'bulk-' || g, 'bulk'
                   FROM orders o, generate_series(1, 998) g WHERE o.order_no = '{no}'
                 RETURNING id, order_no, member_id, store_id, idempotency_key)
             INSERT INTO compensation_events (order_id, kind, max_attempts, payload, idempotency_key, trace_id)
             SELECT id, 'DOOR_ACCESS_GRANT', 5,
                    jsonb_build_object('orderNo', order_no, 'memberId', member_id::text, 'storeId', store_id::text, 'action', 'GRANT'),
                    idempotency_key, 'bulk'
               FROM copies"
        )),
        &mut c,
    )
    .await
    .unwrap();
    drop(c);
    let (a, b) = (Worker::new(app.state.clone()), Worker::new(app.state.clone()));
    let (app_a, app_b) = (app.clone(), app.clone());
    let ta = tokio::spawn(async move { drain(&app_a, &a, 60).await });
    let tb = tokio::spawn(async move { drain(&app_b, &b, 60).await });
    ta.await.unwrap();
    tb.await.unwrap();
    let delivered = fake.delivered_per_key();
    assert_eq!(delivered.len(), 1000);
    assert!(delivered.values().all(|n| *n == 1), "some event was delivered twice");
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM compensation_events WHERE status = 'SUCCEEDED'")
            .await,
        1000
    );
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM compensation_attempts").await,
        1000
    );
    let workers = app
        .sql_i64("SELECT count(DISTINCT worker) AS v FROM compensation_attempts")
        .await;
    assert_eq!(workers, 2, "both workers took part");
}

#[tokio::test]
async fn a_worker_killed_mid_call_leaves_the_event_to_another_after_its_lease() {
    let fake = FakeDownstream::start(Mode::Hang).await;
    let app = app_with(&fake, 5, 400).await;
    let (_, no) = paid_order(&app).await;
    // Worker A claims both events and is killed while the downstream hangs.
    let a = Worker::new(app.state.clone());
    let killed = tokio::spawn(async move { a.run_once().await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    killed.abort();
    let locked = app
        .sql_i64("SELECT count(*) AS v FROM compensation_events WHERE locked_until > now() AND status = 'PENDING'")
        .await;
    assert_eq!(locked, 2, "claimed under a lease");
    // Worker B finds nothing while the lease holds, and everything once it ran out.
    fake.set(Mode::Healthy);
    let b = Worker::new(app.state.clone());
    assert_eq!(b.run_once().await.unwrap(), 0);
    // Wait for the lease to run out (by the database's clock, as the claim reads it), however
    // long the worker's lease formula makes it, within a bound.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while app
        .sql_i64("SELECT count(*) AS v FROM compensation_events WHERE locked_until > now()")
        .await
        > 0
    {
        assert!(tokio::time::Instant::now() < deadline, "the lease never ran out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drain(&app, &b, 10).await;
    let o = app.admin(COMPENSATIONS, json!({"no": no})).await["order"].clone();
    for e in o["compensation"].as_array().unwrap() {
        assert_eq!(e["status"], "SUCCEEDED", "{e}");
    }
}

#[tokio::test]
async fn subscribers_on_another_instance_see_what_this_one_did() {
    let fake = FakeDownstream::start(Mode::AlwaysFail).await;
    let app = app_with(&fake, 2, 2000).await;
    app.expect_dead(); // the downstream is down: its grants end DEAD
                       // Instance B: its own pool and LISTEN connection on the same database, no workers.
    let b_state = {
        let pool = fitorder::db::pool(&app.db_url, 4).unwrap();
        let events = fitorder::events::EventHub::start(app.db_url.clone(), pool.clone());
        fitorder::app::AppState::with_keys(
            pool,
            (*app.state.config).clone(),
            Default::default(),
            events,
            app.db_url.clone(),
        )
    };
    let b_addr = crate::fakes::serve(fitorder::http::router(b_state)).await;

    let mut ops = WsClient::connect(&b_addr, Some(&app.ops_token()), false).await.unwrap();
    ops.subscribe("1", OPS_OPS, Some("CompensationUpdates"), json!({"status": ["DEAD"]}))
        .await;
    ops.subscribe("2", OPS_OPS, Some("TicketsOpened"), json!({})).await;
    let mut legacy = WsClient::connect(&b_addr, Some(&app.ops_token()), true).await.unwrap();
    legacy
        .subscribe("1", OPS_OPS, Some("OrderStatusChanges"), json!({}))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let (s, no) = paid_order(&app).await;
    // The legacy client sees the order born and paid (and so has instance B's hub).
    let mut seen = vec![];
    while seen.len() < 2 {
        let p = legacy.next_payload(10).await.expect("status change over graphql-ws");
        assert_eq!(p["data"]["orderStatusChanged"]["orderNo"], no);
        seen.push(
            p["data"]["orderStatusChanged"]["toStatus"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(seen, ["WAIT_PAY", "PAID"]);
    let mut member = WsClient::connect(&b_addr, Some(&app.member_token(&s.member)), false)
        .await
        .unwrap();
    member
        .subscribe("m", MEMBER_OPS, Some("MyOrderStatus"), json!({"orderNo": no}))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A check-in after the member subscribed reaches the member.
    app.admin(CHECK_IN, json!({"input": {"orderNo": no, "consumeTxnNo": "gate-1"}}))
        .await;
    let mine = member.next_payload(10).await.expect("member sees own order");
    assert_eq!(mine["data"]["orderStatusChanged"]["toStatus"], "CONSUMING");
    assert_eq!(mine["data"]["orderStatusChanged"]["fromStatus"], "PAID");
    // Instance A's worker kills both grants; B's ops subscriber sees DEAD events and tickets.
    drain(&app, &Worker::new(app.state.clone()), 20).await;
    let mut dead = 0;
    let mut tickets = 0;
    while dead < 2 || tickets < 2 {
        let p = ops.next_payload(10).await.expect("ops events");
        if let Some(e) = p["data"].get("compensationUpdates") {
            assert_eq!(e["status"], "DEAD");
            assert_eq!(e["orderNo"], no);
            dead += 1;
        }
        if let Some(t) = p["data"].get("ticketOpened") {
            assert_eq!(t["kind"], "COMPENSATION_DEAD");
            tickets += 1;
        }
    }
    // Another member's order never reaches this member.
    let other = app.new_member(&s.store, 100_000).await;
    app.place(
        &other,
        json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WALLET"}),
    )
    .await;
    assert!(member.next_payload(2).await.is_none());
}

#[tokio::test]
async fn websocket_connections_without_a_good_token_close_with_4403() {
    let app = TestApp::new().await;
    let addr = crate::fakes::serve(app.router.clone()).await;
    for legacy in [false, true] {
        for token in [None, Some("not-a-jwt")] {
            let r = WsClient::connect(&addr, token, legacy).await;
            let closed = r.err().expect("refused");
            assert_eq!(closed.code, Some(4403), "legacy={legacy} token={token:?}");
        }
    }
    // Members may not watch the ops streams.
    let mut m = WsClient::connect(&addr, Some(&app.member_token("1")), false)
        .await
        .unwrap();
    m.subscribe("1", OPS_OPS, Some("CompensationUpdates"), json!({})).await;
    let p = m.next_payload(5).await.unwrap();
    assert_eq!(p["errors"][0]["extensions"]["code"], "FORBIDDEN", "{p}");
}

#[tokio::test]
async fn provider_refunds_call_the_providers_signed_apis() {
    let api = crate::fakes::FakeProviderApi::start(crate::providers::merchant_public()).await;
    let (wechat_base, gateway) = (api.base.clone(), format!("{}/gateway.do", api.base));
    let app = TestApp::with_config(move |c| crate::providers::configure_refunds(c, &wechat_base, &gateway)).await;
    let s = app.studio(0, None, 3).await;
    let mut nos = vec![];
    for (method, txn) in [
        ("WECHAT_PAY", "4200000000000000000000000101"),
        ("ALIPAY", "2026113022001400000000000101"),
    ] {
        let placed = app
            .place(
                &s.member,
                json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": method}),
            )
            .await;
        let no = placed["order"]["orderNo"].as_str().unwrap().to_string();
        if method == "WECHAT_PAY" {
            assert_eq!(
                app.wechat_paid(&no, txn, 10_000).await,
                axum::http::StatusCode::NO_CONTENT
            );
        } else {
            let form = crate::providers::alipay().payment(&no, txn, "TRADE_SUCCESS", "100.00");
            assert_eq!(app.alipay_notify(&form).await.1, "success");
        }
        app.admin(
            CHECK_IN,
            json!({"input": {"orderNo": no, "consumeTxnNo": "g1", "sessions": 4}}),
        )
        .await;
        app.admin(REFUND, json!({"orderNo": no, "reason": "moving"})).await;
        nos.push(no);
    }
    drain(&app, &Worker::new(app.state.clone()), 10).await;
    let refunds = api.refunds.lock().unwrap().clone();
    assert_eq!(refunds.len(), 2, "{refunds:?}");
    let wx = refunds.iter().find(|r| r["provider"] == "WECHAT_PAY").unwrap();
    assert_eq!(wx["mchid"], crate::providers::MCH_ID);
    assert_eq!(wx["request"]["out_trade_no"], nos[0]);
    assert_eq!(wx["request"]["transaction_id"], "4200000000000000000000000101");
    assert_eq!(
        wx["request"]["amount"],
        json!({"refund": 6000, "total": 10000, "currency": "CNY"})
    );
    let ali = refunds.iter().find(|r| r["provider"] == "ALIPAY").unwrap();
    assert_eq!(ali["request"]["out_trade_no"], nos[1]);
    assert_eq!(ali["request"]["refund_amount"], "60.00");
    assert!(ali["request"]["out_request_no"].as_str().unwrap().starts_with("RF"));
    assert_eq!(
        app.sql_i64(
            "SELECT count(*) AS v FROM compensation_events WHERE kind = 'PROVIDER_REFUND' AND status = 'SUCCEEDED'"
        )
        .await,
        2
    );
}

/// The values a CHECK constraint of `compensation_events` allows for `column`, as the migrated
/// database states them (`pg_get_constraintdef`).
async fn checked_values(app: &TestApp, column: &str) -> std::collections::BTreeSet<String> {
    #[derive(diesel::QueryableByName)]
    struct Def {
        #[diesel(sql_type = diesel::sql_types::Text)]
        def: String,
    }
    let mut c = app.conn().await;
    let defs: Vec<Def> = diesel_async::RunQueryDsl::load(
        diesel::sql_query(
            "SELECT pg_get_constraintdef(c.oid) AS def FROM pg_constraint c
              WHERE c.conrelid = 'compensation_events'::regclass AND c.contype = 'c'
                AND c.conkey = ARRAY[(SELECT attnum FROM pg_attribute
                                       WHERE attrelid = 'compensation_events'::regclass AND attname = $1)]",
        )
        .bind::<diesel::sql_types::Text, _>(column),
        &mut c,
    )
    .await
    .unwrap();
    assert_eq!(defs.len(), 1, "one CHECK on compensation_events.{column}");
    // CHECK ((kind = ANY (ARRAY['DOOR_ACCESS_GRANT'::text, …]))): the quoted literals.
    defs[0].def.split('\'').skip(1).step_by(2).map(str::to_string).collect()
}

#[tokio::test]
async fn the_kind_and_status_checks_allow_exactly_the_effects_and_statuses_of_the_code() {
    use fitorder::domain::{CompensationKind, CompensationStatus};
    let app = TestApp::new().await;
    let kinds: std::collections::BTreeSet<String> =
        CompensationKind::ALL.iter().map(|k| k.as_str().to_string()).collect();
    assert_eq!(
        checked_values(&app, "kind").await,
        kinds,
        "an effect added to domain::effect needs a migration that widens the CHECK on compensation_events.kind"
    );
    let statuses: std::collections::BTreeSet<String> =
        CompensationStatus::ALL.iter().map(|s| s.as_str().to_string()).collect();
    assert_eq!(checked_values(&app, "status").await, statuses);
}

#[tokio::test]
async fn a_running_worker_works_through_a_backlog_batch_after_batch_and_stops_holding_nothing() {
    let fake = FakeDownstream::start(Mode::Healthy).await;
    let app = app_with(&fake, 5, 5000).await;
    let (_, no) = paid_order(&app).await;
    let mut c = app.conn().await;
    // One event per order, on 398 more orders copied from the paid one (born WAIT_PAY): one
    // order's access events are claimed one after another (docs/prepaid-and-cards.md "Freezing and transferring cards"),
    // and this test is about a worker working through independent events.
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(format!(
            "WITH copies AS (
                 INSERT INTO orders (member_id, store_id, kind, item_name, class_pack_id, amount_cents,
                                     payment_method, sessions_total, trace_id, idempotency_key, request_hash)
                 SELECT o.member_id, o.store_id, o.kind, o.item_name, o.class_pack_id, o.amount_cents,
                        o.payment_method, o.sessions_total, 'backlog', 'backlog-' || g, 'backlog'
                   FROM orders o, generate_series(1, 398) g WHERE o.order_no = '{no}'
                 RETURNING id, order_no, member_id, store_id, idempotency_key)
             INSERT INTO compensation_events (order_id, kind, max_attempts, payload, idempotency_key, trace_id)
             SELECT id, 'DOOR_ACCESS_GRANT', 5,
                    jsonb_build_object('orderNo', order_no, 'memberId', member_id::text, 'storeId', store_id::text, 'action', 'GRANT'),
                    idempotency_key, 'backlog'
               FROM copies"
        )),
        &mut c,
    )
    .await
    .unwrap();
    drop(c);
    // Small batches: the worker claims the next one while it delivers the current one.
    let mut worker = Worker::new(app.state.clone());
    worker.batch = 16;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(worker.run(stopped));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while app.sql_i64("SELECT count(*) AS v FROM compensation_attempts").await < 100 {
        assert!(tokio::time::Instant::now() < deadline, "the worker did not get going");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Stopped mid-backlog, it leaves no event claimed: what it had claimed ahead is given back.
    stop.send(true).unwrap();
    running.await.unwrap();
    assert_eq!(
        app.sql_i64(
            "SELECT count(*) AS v FROM compensation_events WHERE locked_by IS NOT NULL OR locked_until IS NOT NULL"
        )
        .await,
        0
    );
    let left = app
        .sql_i64("SELECT count(*) AS v FROM compensation_events WHERE status = 'PENDING'")
        .await;
    assert!(left > 0, "stopped before the end of the backlog");
    // Another worker finds the rest due at once, and every event was delivered exactly once.
    let other = Worker::new(app.state.clone());
    assert!(other.run_once().await.unwrap() > 0);
    drain(&app, &other, 60).await;
    let delivered = fake.delivered_per_key();
    assert_eq!(delivered.len(), 400);
    assert!(delivered.values().all(|n| *n == 1), "some event was delivered twice");
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM compensation_attempts").await,
        400
    );
}
