//! Issue 16: what a production deployment would trip over, each with the test that failed
//! before its fix.

use serde_json::{json, Value};

use crate::harness::*;

const RESOLVE: &str =
    "mutation($id: ID!, $action: TicketAction!) { resolveTicket(id: $id, action: $action) { status resolution } }";

/// `n` open tickets about one payment `txn` of WeChat Pay that is not `order_no`'s own.
async fn stray_tickets(app: &TestApp, order_no: &str, txn: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = app
            .sql_i64(&format!(
                "INSERT INTO exception_tickets (kind, provider, order_id, order_no, store_id, provider_txn_id,
                                                provider_amount_cents, detail, finding_key, trace_id)
                 SELECT 'REJECTED_TRANSITION', 'WECHAT_PAY', id, order_no, store_id, '{txn}', 10000,
                        '{{}}'::jsonb, 'stray:{txn}:{i}', 'trace'
                   FROM orders WHERE order_no = '{order_no}' RETURNING id AS v"
            ))
            .await;
        ids.push(id.to_string());
    }
    ids
}

#[tokio::test]
async fn twenty_concurrent_refunds_of_one_stray_payment_queue_one_provider_refund() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WALLET")
        .await;
    let ids = stray_tickets(&app, &no, "4200000000000000000000000555", 20).await;
    let admin = app.admin_token();
    let results: Vec<Value> = futures_util::future::join_all(
        ids.iter()
            .map(|id| app.gql(Some(&admin), RESOLVE, json!({"id": id, "action": "REFUND"}))),
    )
    .await;
    for r in &results {
        assert_eq!(r["data"]["resolveTicket"]["status"], "RESOLVED", "{r}");
    }
    assert_eq!(
        app.sql_i64(
            "SELECT count(*) AS v FROM compensation_events WHERE kind = 'PROVIDER_REFUND'
               AND payload->>'providerTxnId' = '4200000000000000000000000555'"
        )
        .await,
        1,
        "one refund per provider transaction"
    );
    // Another stray payment is refunded on its own.
    let other = stray_tickets(&app, &no, "4200000000000000000000000556", 1).await;
    let r = app
        .gql(Some(&admin), RESOLVE, json!({"id": other[0], "action": "REFUND"}))
        .await;
    assert_eq!(r["data"]["resolveTicket"]["status"], "RESOLVED", "{r}");
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM compensation_events WHERE kind = 'PROVIDER_REFUND'")
            .await,
        2
    );
}

/// A ticket that `action` can close on an order of its own, as an admin would find it.
async fn ticket_for(app: &TestApp, s: &Studio, action: &str, n: usize) -> String {
    let txn = format!("42000000000000000000{:08}", n);
    let (no, kind, detail) = match action {
        // Paid by WeChat Pay, found again: the order's own payment, refunded through it.
        "REFUND" => {
            let no = app
                .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WECHAT_PAY")
                .await;
            assert!(app.wechat_paid(&no, &txn, 10_000).await.is_success());
            (no, "AMOUNT_MISMATCH", "{}".to_string())
        }
        // The provider has it, the order waits.
        "MARK_PAID" | "CREDIT_SESSIONS" => (
            app.buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WECHAT_PAY")
                .await,
            "PROVIDER_PAID_LOCAL_UNPAID",
            "{}".to_string(),
        ),
        "REPLAY_COMPENSATION" => {
            let no = app
                .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WALLET")
                .await;
            let event = app
                .sql_i64(&format!(
                    "INSERT INTO compensation_events (order_id, kind, status, attempts, max_attempts, payload,
                                                      idempotency_key, trace_id)
                     SELECT id, 'DOOR_ACCESS_GRANT', 'DEAD', 5, 5, '{{}}'::jsonb, 'dead:{n}', 'trace'
                       FROM orders WHERE order_no = '{no}' RETURNING id AS v"
                ))
                .await;
            (no, "COMPENSATION_DEAD", format!("{{\"eventId\": \"{event}\"}}"))
        }
        _ => (
            app.buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WALLET")
                .await,
            "REJECTED_TRANSITION",
            "{}".to_string(),
        ),
    };
    app.sql_i64(&format!(
        "INSERT INTO exception_tickets (kind, provider, order_id, order_no, store_id, provider_txn_id,
                                        provider_amount_cents, detail, finding_key, trace_id)
         SELECT '{kind}', 'WECHAT_PAY', id, order_no, store_id, '{txn}', 10000, '{detail}'::jsonb,
                'roles:{n}', 'trace'
           FROM orders WHERE order_no = '{no}' RETURNING id AS v"
    ))
    .await
    .to_string()
}

#[tokio::test]
async fn every_ticket_action_by_every_role_follows_the_one_table() {
    let app = TestApp::with_config(crate::providers::configure).await;
    app.expect_dead(); // it makes DEAD events to act on
    let s = app.studio(1_000_000, None, 3).await;
    let roles = [
        ("member", app.member_token(&s.member)),
        ("ops", app.ops_token()),
        ("admin", app.admin_token()),
    ];
    // What the contract says: ops resolve tickets, but marking an order paid is not theirs
    // (WAIT_PAY -> PAID is not an ops transition); refunds are (PAID -> REFUNDED is).
    let expected = |role: &str, action: &str| -> Result<&'static str, &'static str> {
        match (role, action) {
            ("member", _) => Err("FORBIDDEN"),
            ("ops", "MARK_PAID" | "CREDIT_SESSIONS") => Err("FORBIDDEN"),
            (_, "NO_ACTION") => Ok("DISMISSED"),
            _ => Ok("RESOLVED"),
        }
    };
    let mut n = 0;
    let mut seen = Vec::new();
    for action in [
        "NO_ACTION",
        "REPLAY_COMPENSATION",
        "MARK_PAID",
        "CREDIT_SESSIONS",
        "REFUND",
    ] {
        for (role, token) in &roles {
            n += 1;
            let id = ticket_for(&app, &s, action, n).await;
            let r = app.gql(Some(token), RESOLVE, json!({"id": id, "action": action})).await;
            let got = match r["data"]["resolveTicket"]["status"].as_str() {
                Some(status) => Ok(status.to_string()),
                None => Err(error_code(&r)),
            };
            let want = expected(role, action).map(str::to_string).map_err(str::to_string);
            seen.push(format!("{role} {action}: {got:?}"));
            assert_eq!(got, want, "{role} {action}: {r}");
            // What the action did happened (or, refused, did not).
            let order_status = app
                .sql_i64(&format!(
                    "SELECT (CASE o.status WHEN 'PAID' THEN 1 WHEN 'REFUNDED' THEN 2 WHEN 'WAIT_PAY' THEN 3 ELSE 0 END)::bigint AS v
                       FROM exception_tickets t JOIN orders o ON o.id = t.order_id WHERE t.id = {id}"
                ))
                .await;
            match (action, want.is_ok()) {
                ("REFUND", true) => assert_eq!(order_status, 2, "{role} refunded"),
                ("REFUND", false) => assert_eq!(order_status, 1, "{role} did not refund"),
                ("MARK_PAID" | "CREDIT_SESSIONS", true) => assert_eq!(order_status, 1, "{role} marked paid"),
                ("MARK_PAID" | "CREDIT_SESSIONS", false) => assert_eq!(order_status, 3, "{role} did not mark paid"),
                _ => {}
            }
        }
    }
    assert_eq!(seen.len(), 15, "{seen:?}");
}

#[tokio::test]
async fn amounts_past_32_bits_are_refused_on_input_and_an_error_on_output() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let admin = app.admin_token();
    // In: a variable and a literal past 2^31 - 1, each BAD_USER_INPUT and nothing created.
    let create = "mutation($i: CreateClassPackInput!) { createClassPack(input: $i) { id priceCents } }";
    let r = app
        .gql(
            Some(&admin),
            create,
            json!({"i": {"storeId": s.store, "name": "Huge", "sessions": 1, "priceCents": 3_000_000_000i64}}),
        )
        .await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT", "{r}");
    let literal = format!(
        "mutation {{ createClassPack(input: {{storeId: \"{}\", name: \"Huge\", sessions: 1, priceCents: 3000000000}}) {{ id }} }}",
        s.store
    );
    let r = app.gql(Some(&admin), &literal, json!({})).await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT", "{r}");
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM class_packs WHERE name = 'Huge'")
            .await,
        0
    );
    // Out: a balance that grew past 2^31 - 1 fen is an error on that field, never 2147483647.
    // The database refuses such a balance now (`wallet_balance_fits_int`); one written before
    // that constraint (it is NOT VALID: old rows stand) is what this reads.
    {
        use diesel_async::RunQueryDsl;
        let mut c = app.conn().await;
        let refused = diesel::sql_query(format!(
            "UPDATE members SET balance_cents = 3000000000 WHERE id = {}",
            s.member
        ))
        .execute(&mut c)
        .await;
        assert!(
            format!("{refused:?}").contains("wallet_balance_fits_int"),
            "{refused:?}"
        );
        diesel::sql_query("ALTER TABLE members DROP CONSTRAINT wallet_balance_fits_int")
            .execute(&mut c)
            .await
            .unwrap();
    }
    app.sql_i64(&format!(
        "UPDATE members SET balance_cents = 3000000000 WHERE id = {} RETURNING 0::bigint AS v",
        s.member
    ))
    .await;
    let q = "query($id: ID!) { member(id: $id) { id wallet { balanceCents } } }";
    let r = app.gql(Some(&admin), q, json!({"id": s.member})).await;
    assert!(
        !r.to_string().contains("2147483647"),
        "a capped amount was answered: {r}"
    );
    assert_eq!(error_code(&r), "INTERNAL", "{r}");
    assert_eq!(r["errors"][0]["path"], json!(["member", "wallet"]), "{r}");
    // The same amounts that fit are answered as they are.
    app.sql_i64(&format!(
        "UPDATE members SET balance_cents = 2147483647 WHERE id = {} RETURNING 0::bigint AS v",
        s.member
    ))
    .await;
    let r = app.gql(Some(&admin), q, json!({"id": s.member})).await;
    assert_eq!(r["data"]["member"]["wallet"]["balanceCents"], 2147483647, "{r}");
    // An order whose amount does not fit: its amount is an error, the rest of it still answers.
    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WALLET")
        .await;
    app.sql_i64(&format!(
        "UPDATE orders SET amount_cents = 4000000000, wallet_amount_cents = 4000000000 WHERE order_no = '{no}' RETURNING 0::bigint AS v"
    ))
    .await;
    let r = app
        .gql(
            Some(&admin),
            "query($no: String!) { order(orderNo: $no) { orderNo amountCents } }",
            json!({"no": no}),
        )
        .await;
    assert_eq!(error_code(&r), "INTERNAL", "{r}");
    assert!(!r.to_string().contains("2147483647"), "{r}");
}

#[tokio::test]
async fn replaying_dead_events_goes_in_bounded_batches_and_says_how_many() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WALLET")
        .await;
    let batch = fitorder::compensation::REPLAY_BATCH;
    let dead = batch + 37;
    app.sql_i64(&format!(
        "WITH e AS (INSERT INTO compensation_events (order_id, kind, status, attempts, max_attempts, payload,
                                                    idempotency_key, trace_id)
                    SELECT o.id, 'DOOR_ACCESS_GRANT', 'DEAD', 5, 5, '{{}}'::jsonb, 'dead-batch:' || g, 'trace'
                      FROM orders o, generate_series(1, {dead}) g WHERE o.order_no = '{no}' RETURNING 1)
         SELECT count(*) AS v FROM e"
    ))
    .await;
    let dead_before = app
        .sql_i64("SELECT count(*) AS v FROM compensation_events WHERE status = 'DEAD'")
        .await;
    assert!(dead_before >= dead, "{dead_before}");
    let replay = "mutation { replayDeadCompensations }";
    let mut answers = Vec::new();
    loop {
        let r = app.gql(Some(&app.ops_token()), replay, json!({})).await;
        let n = r["data"]["replayDeadCompensations"]
            .as_i64()
            .unwrap_or_else(|| panic!("{r}"));
        answers.push(n);
        assert!(n <= batch, "one call replayed {n}");
        if n == 0 || answers.len() > 5 {
            break;
        }
    }
    assert_eq!(answers.iter().sum::<i64>(), dead_before, "{answers:?}");
    assert_eq!(answers[0], batch, "{answers:?}");
    assert_eq!(*answers.last().unwrap(), 0, "{answers:?}");
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM compensation_events WHERE status = 'DEAD'")
            .await,
        0
    );
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM compensation_replays").await,
        dead_before
    );
}

/// A SUCCEEDED event of `order_no` delivered `days` ago, with one attempt; its id.
async fn delivered_event(app: &TestApp, order_no: &str, kind: &str, days: i64, key: &str) -> i64 {
    app.sql_i64(&format!(
        "WITH e AS (INSERT INTO compensation_events (order_id, kind, status, attempts, max_attempts, payload,
                                                    idempotency_key, trace_id, created_at, updated_at)
                    SELECT id, '{kind}', 'SUCCEEDED', 1, 5,
                           jsonb_build_object('provider', 'WECHAT_PAY', 'orderNo', order_no, 'refundNo', 'R{key}',
                                              'providerTxnId', 'T{key}'),
                           '{key}', 'trace', now() - interval '{days} days', now() - interval '{days} days'
                      FROM orders WHERE order_no = '{order_no}' RETURNING id),
              a AS (INSERT INTO compensation_attempts (event_id, at, ok, duration_ms, worker)
                    SELECT id, now() - interval '{days} days', true, 5, 'w' FROM e)
         SELECT id AS v FROM e"
    ))
    .await
}

#[tokio::test]
async fn delivered_events_are_pruned_after_retention_but_never_what_an_open_ticket_needs() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let buy = || app.buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WALLET");
    let (plain, ticketed) = (buy().await, buy().await);
    let days = fitorder::tasks::housekeeping::OUTBOX_RETENTION_DAYS;
    let old = delivered_event(&app, &plain, "DOOR_ACCESS_GRANT", days + 5, "old").await;
    let recent = delivered_event(&app, &plain, "AI_ACCESS_GRANT", days - 5, "recent").await;
    let refund = delivered_event(&app, &plain, "PROVIDER_REFUND", days + 5, "refund").await;
    let needed = delivered_event(&app, &ticketed, "DOOR_ACCESS_GRANT", days + 5, "needed").await;
    app.sql_i64(&format!(
        "INSERT INTO exception_tickets (kind, order_id, order_no, store_id, detail, finding_key, trace_id)
         SELECT 'REJECTED_TRANSITION', id, order_no, store_id, '{{}}'::jsonb, 'open:{ticketed}', 'trace'
           FROM orders WHERE order_no = '{ticketed}' RETURNING id AS v"
    ))
    .await;
    let pruned = fitorder::tasks::housekeeping::data_cleanup(app.state.clone())
        .await
        .map_err(|e| e.message())
        .unwrap();
    assert!(pruned >= 2, "the old event and its attempt: {pruned}");
    let exists = |id: i64| {
        let app = &app;
        async move {
            app.sql_i64(&format!(
                "SELECT (SELECT count(*) FROM compensation_events WHERE id = {id})
                      + (SELECT count(*) FROM compensation_attempts WHERE event_id = {id}) AS v"
            ))
            .await
        }
    };
    assert_eq!(
        exists(old).await,
        0,
        "delivered past retention: pruned with its attempts"
    );
    assert_eq!(exists(recent).await, 2, "within retention: kept");
    // Refunds are the money's evidence: kept (their old attempt logs go as they always did).
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT count(*) AS v FROM compensation_events WHERE id = {refund}"
        ))
        .await,
        1
    );
    assert_eq!(exists(needed).await, 2, "an open ticket's order: kept");
    // Once the ticket is closed its order's delivered events go too.
    app.sql_i64("UPDATE exception_tickets SET status = 'RESOLVED' RETURNING 0::bigint AS v")
        .await;
    fitorder::tasks::housekeeping::data_cleanup(app.state.clone())
        .await
        .map_err(|e| e.message())
        .unwrap();
    assert_eq!(exists(needed).await, 0);
}

#[tokio::test]
async fn payload_lookups_of_refund_events_use_an_index() {
    use diesel_async::{AsyncConnection, RunQueryDsl};
    #[derive(diesel::QueryableByName)]
    struct Plan {
        #[diesel(sql_type = diesel::sql_types::Text, column_name = "QUERY PLAN")]
        line: String,
    }
    let app = TestApp::new().await;
    let mut c = app.conn().await;
    let plans = c
        .transaction(async |c| -> diesel::QueryResult<Vec<String>> {
            // With sequential scans priced out, a plan without one of the indexes is a scan.
            diesel::sql_query("SET LOCAL enable_seqscan = off").execute(c).await?;
            let mut out = Vec::new();
            for q in [
                // tickets.rs: has this stray payment been refunded already?
                "SELECT count(*) FROM compensation_events WHERE kind = 'PROVIDER_REFUND' AND payload->>'providerTxnId' = 'T1'",
                // payments/mod.rs and the bill's refund rows: the refunds of an order at a provider.
                "SELECT * FROM compensation_events WHERE kind = 'PROVIDER_REFUND' AND payload->>'provider' = 'WECHAT_PAY' AND payload->>'orderNo' = 'O1'",
                // reconciliation: the day's refunds of a provider.
                "SELECT count(*) FROM compensation_events e WHERE e.kind = 'PROVIDER_REFUND' AND e.payload->>'provider' = 'ALIPAY' AND e.created_at >= now() - interval '1 day' AND e.created_at < now()",
                // reconciliation: the callback's REFUND_MISMATCH ticket of a refund.
                "SELECT 1 FROM exception_tickets t WHERE t.kind = 'REFUND_MISMATCH' AND t.order_no = 'O1' AND t.detail->>'refundNo' = 'R1'",
            ] {
                let plan: Vec<Plan> = diesel::sql_query(format!("EXPLAIN {q}")).load(c).await?;
                out.push(plan.into_iter().map(|p| p.line).collect::<Vec<_>>().join("\n"));
            }
            Ok(out)
        })
        .await
        .unwrap();
    for (plan, index) in plans.iter().zip([
        "compensation_refund_by_txn",
        "compensation_refund_by_order",
        "compensation_refund_by_order",
        "ticket_refund_mismatch",
    ]) {
        assert!(plan.contains(index), "{index} not used:\n{plan}");
        assert!(!plan.contains("Seq Scan"), "{plan}");
    }
}

#[tokio::test]
async fn a_page_of_orders_with_their_timelines_is_a_constant_number_of_statements() {
    use crate::sqlcount::{upstream_of, via, SqlCounter};
    let app = TestApp::new().await;
    let s = app.studio(1_000_000, None, 30).await;
    for _ in 0..12 {
        let no = app
            .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WALLET")
            .await;
        // Something in every part of the timeline but callbacks: a ticket and a replayed event.
        let id = app
            .sql_i64(&format!("SELECT id AS v FROM orders WHERE order_no = '{no}'"))
            .await;
        app.sql_i64(&format!(
            "WITH e AS (INSERT INTO compensation_events (order_id, kind, status, attempts, max_attempts, payload,
                                                        idempotency_key, trace_id)
                        VALUES ({id}, 'DOOR_ACCESS_GRANT', 'SUCCEEDED', 1, 5, '{{}}', 'tl:{id}', 'trace') RETURNING id),
                  a AS (INSERT INTO compensation_attempts (event_id, ok, duration_ms, worker) SELECT id, true, 3, 'w' FROM e),
                  r AS (INSERT INTO compensation_replays (event_id, actor, trace_id) SELECT id, 'ops:x', 'trace' FROM e),
                  t AS (INSERT INTO exception_tickets (kind, order_id, order_no, store_id, detail, finding_key, trace_id)
                        VALUES ('REJECTED_TRANSITION', {id}, '{no}', {store}, '{{}}', 'tl:{id}', 'trace'))
             SELECT 0::bigint AS v",
            store = s.store
        ))
        .await;
    }
    let counter = SqlCounter::start(upstream_of(&app.db_url).unwrap()).await.unwrap();
    let counted = TestApp::on_database(&via(&app.db_url, counter.port).unwrap(), |_| {}).await;
    let admin = counted.admin_token();
    let page =
        "query($n: Int!) { orders(first: $n) { edges { node { orderNo store { name } timeline { kind summary } } } } }";
    // Warm up (the pool's connections, prepared statements).
    counted.gql(Some(&admin), page, json!({"n": 1})).await;
    let mut per_page = Vec::new();
    for n in [1, 3, 12] {
        let before = counter.counts();
        let r = counted.gql(Some(&admin), page, json!({"n": n})).await;
        let after = counter.counts().since(&before);
        let edges = r["data"]["orders"]["edges"].as_array().unwrap_or_else(|| panic!("{r}"));
        assert_eq!(edges.len(), n as usize, "{r}");
        for e in edges {
            let kinds: Vec<&str> = e["node"]["timeline"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["kind"].as_str().unwrap())
                .collect();
            for k in ["STATUS_CHANGE", "COMPENSATION_ATTEMPT", "COMPENSATION_REPLAY", "TICKET"] {
                assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
            }
        }
        per_page.push((n, after.statements));
    }
    // However many orders: the page, its count, the stores, the six parts of the timelines.
    assert!(
        per_page.iter().all(|(_, c)| *c == per_page[0].1),
        "statements per page grow with the page: {per_page:?}"
    );
    assert!(per_page[0].1 <= 12, "{per_page:?}");
    drop(counted);
}
