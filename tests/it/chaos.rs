//! Chaos: thousands of random actions over several real `fitorder` processes — callbacks
//! duplicated, reordered and late, check-ins racing, cancels, refunds, expiries, a downstream
//! failing a third of the time, processes killed -9 and restarted, PostgreSQL restarted once —
//! then an invariant checker reads the books and fails on any violation.
//!
//! Seeded and reproducible in what it asks (the interleaving is the machine's): it prints its
//! seed. CI runs a short version; the long one:
//! `CHAOS_ACTIONS=20000 CHAOS_SEED=7 cargo test --release --test it chaos -- --nocapture`.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fitorder::auth::{issue_token, Role};
use fitorder::db::dev_pg::DevPostgres;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::fakes::{FakeDownstream, Mode};
use crate::harness::wait_ready;
use crate::providers;

const SECRET: &str = "chaos-secret";

/// One `fitorder` process.
struct Proc {
    args: Vec<&'static str>,
    port: Option<u16>,
    child: Option<Child>,
}

struct Cluster {
    env: Vec<(String, String)>,
    procs: Vec<Proc>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Cluster {
    fn start(&mut self, i: usize) {
        let p = &mut self.procs[i];
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fitorder"));
        cmd.args(&p.args).stdout(Stdio::null()).stderr(Stdio::null());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if let Some(port) = p.port {
            cmd.env("FITORDER_ADDR", format!("127.0.0.1:{port}"));
        }
        p.child = Some(cmd.spawn().expect("start fitorder"));
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.procs[i].child.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }

    fn urls(&self) -> Vec<String> {
        self.procs
            .iter()
            .filter_map(|p| p.port.map(|port| format!("http://127.0.0.1:{port}")))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.procs.len() {
            self.kill(i);
        }
    }
}

/// What the simulated providers believe: trades they collected money for.
#[derive(Default)]
struct Provider {
    /// (order, txn) -> fen, for every payment the provider took.
    paid: HashMap<(String, String), i64>,
    /// Notifications not yet acknowledged with a 2xx: the provider retries them.
    pending: Vec<Notification>,
}

#[derive(Clone)]
struct Notification {
    alipay: bool,
    order_no: String,
    txn: String,
    fen: i64,
}

struct World {
    http: reqwest::Client,
    urls: Vec<String>,
    store: String,
    members: Vec<String>,
    packs: Vec<String>,
    slots: Vec<String>,
    plan: String,
    orders: Vec<(String, String, String)>, // (order_no, member, method)
    keys: Vec<(String, Value)>,            // used idempotency keys and their inputs
}

impl World {
    fn url(&self, rng: &mut StdRng) -> String {
        self.urls[rng.random_range(0..self.urls.len())].clone()
    }

    async fn gql(&self, url: &str, token: &str, query: &str, vars: Value) -> Option<Value> {
        let r = self
            .http
            .post(format!("{url}/graphql"))
            .bearer_auth(token)
            .json(&json!({"query": query, "variables": vars}))
            .send()
            .await
            .ok()?;
        r.json().await.ok()
    }
}

async fn send(http: &reqwest::Client, url: &str, n: &Notification) -> bool {
    let req = if n.alipay {
        let form = providers::alipay().payment(
            &n.order_no,
            &n.txn,
            "TRADE_SUCCESS",
            &fitorder::domain::money::format_yuan(n.fen),
        );
        http.post(format!("{url}/pay/alipay/notify"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form)
    } else {
        let w = providers::wechat();
        let sealed = w.notification(
            "TRANSACTION.SUCCESS",
            &w.transaction(&n.order_no, &n.txn, n.fen),
            chrono::Utc::now().timestamp(),
        );
        let mut r = http
            .post(format!("{url}/pay/wechat/notify"))
            .header("content-type", "application/json");
        for (k, v) in &sealed.headers {
            r = r.header(*k, v);
        }
        r.body(sealed.body)
    };
    matches!(req.send().await, Ok(r) if r.status().is_success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_keeps_the_books_right() {
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let actions: usize = std::env::var("CHAOS_ACTIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    eprintln!("chaos: seed {seed}, {actions} actions (CHAOS_SEED={seed} reproduces the script)");
    let mut rng = StdRng::seed_from_u64(seed);

    // A PostgreSQL of our own, to restart mid-run.
    let dir = std::env::temp_dir().join(format!("fitorder-chaos-{}", std::process::id()));
    let d = dir.clone();
    let pg = tokio::task::spawn_blocking(move || DevPostgres::ensure(&d))
        .await
        .unwrap()
        .expect("private cluster");
    fitorder::server::ensure_database(&pg.url("postgres"), "chaos")
        .await
        .unwrap();
    let db = pg.url("chaos");
    fitorder::db::migrate(&db).await.unwrap();

    let downstream = FakeDownstream::start(Mode::Flaky).await;
    let mut config = fitorder::config::Config::for_tests(db.clone());
    providers::configure(&mut config);
    let mut env: Vec<(String, String)> = vec![
        ("DATABASE_URL".into(), db.clone()),
        ("FITORDER_JWT_SECRET".into(), SECRET.into()),
        ("FITORDER_ORDER_TIMEOUT".into(), "3s".into()),
        ("FITORDER_SCAN_INTERVAL".into(), "2s".into()),
        ("FITORDER_RETRY_BASE".into(), "200ms".into()),
        ("FITORDER_MAX_ATTEMPTS".into(), "4".into()),
        ("FITORDER_DOWNSTREAM_TIMEOUT".into(), "1s".into()),
        ("FITORDER_DOOR_ACCESS_URL".into(), downstream.url.clone()),
        ("FITORDER_AI_ACCESS_URL".into(), downstream.url.clone()),
        ("FITORDER_DB_POOL_SIZE".into(), "8".into()),
        ("RUST_LOG".into(), "error".into()),
    ];
    // The providers' APIs: a sandbox in this process, both providers configured whole.
    let sandbox = fitorder::payments::sandbox_server::SandboxProvider::start(providers::sandbox_keys(), "127.0.0.1:0")
        .await
        .unwrap();
    config.wechatpay.api_base = sandbox.wechat_api_base();
    config.alipay.api_base = sandbox.alipay_gateway();
    env.extend(providers::env_of(&config));
    let mut cluster = Cluster {
        env,
        procs: vec![
            Proc {
                args: vec!["serve"],
                port: Some(free_port()),
                child: None,
            },
            Proc {
                args: vec!["serve", "--no-workers"],
                port: Some(free_port()),
                child: None,
            },
            Proc {
                args: vec!["worker"],
                port: None,
                child: None,
            },
        ],
    };
    for i in 0..cluster.procs.len() {
        cluster.start(i);
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let urls = cluster.urls();
    for u in &urls {
        assert!(
            wait_ready(&http, u, Duration::from_secs(60)).await,
            "{u} never became ready"
        );
    }
    let admin = issue_token(SECRET, Role::Admin, "chaos", None, Duration::from_secs(3600));
    let mut w = World {
        http: http.clone(),
        urls: urls.clone(),
        store: String::new(),
        members: vec![],
        packs: vec![],
        slots: vec![],
        plan: String::new(),
        orders: vec![],
        keys: vec![],
    };
    // The studio.
    let u = urls[0].clone();
    let r = w
        .gql(
            &u,
            &admin,
            "mutation { createStore(input: {name: \"Chaos\", code: \"CHAOS\"}) { id } }",
            json!({}),
        )
        .await
        .unwrap();
    w.store = r["data"]["createStore"]["id"].as_str().unwrap().to_string();
    for i in 0..6 {
        let r = w
            .gql(
                &u,
                &admin,
                "mutation($i: CreateMemberInput!) { createMember(input: $i) { id } }",
                json!({"i": {"storeId": w.store, "name": format!("M{i}"), "phone": format!("1380000{i:04}")}}),
            )
            .await
            .unwrap();
        let m = r["data"]["createMember"]["id"].as_str().unwrap().to_string();
        w.gql(
            &u,
            &admin,
            "mutation($m: ID!) { topUpWallet(memberId: $m, amountCents: 500000, reference: \"init\") { id } }",
            json!({"m": m}),
        )
        .await;
        w.members.push(m);
    }
    let stocks = [Some(40), None];
    for stock in stocks {
        let r = w
            .gql(
                &u,
                &admin,
                "mutation($i: CreateClassPackInput!) { createClassPack(input: $i) { id } }",
                json!({"i": {"storeId": w.store, "name": "Pack", "sessions": 5, "priceCents": 5000, "stock": stock}}),
            )
            .await
            .unwrap();
        w.packs
            .push(r["data"]["createClassPack"]["id"].as_str().unwrap().to_string());
    }
    let starts = chrono::Utc::now() + chrono::Duration::days(2);
    for cap in [3, 8] {
        let r = w
            .gql(&u, &admin, "mutation($i: CreateCoachSlotInput!) { createCoachSlot(input: $i) { id } }",
                 json!({"i": {"storeId": w.store, "coachName": "Coach", "startsAt": starts.to_rfc3339(),
                              "endsAt": (starts + chrono::Duration::hours(1)).to_rfc3339(), "capacity": cap, "priceCents": 20000}}))
            .await
            .unwrap();
        w.slots
            .push(r["data"]["createCoachSlot"]["id"].as_str().unwrap().to_string());
    }
    let r = w
        .gql(
            &u,
            &admin,
            "mutation($i: CreateMembershipPlanInput!) { createMembershipPlan(input: $i) { id } }",
            json!({"i": {"storeId": w.store, "name": "Month", "durationDays": 30, "priceCents": 30000}}),
        )
        .await
        .unwrap();
    w.plan = r["data"]["createMembershipPlan"]["id"].as_str().unwrap().to_string();

    let mut provider = Provider::default();
    let mut late: Vec<(usize, Notification)> = vec![];
    let pg_restart_at = actions / 2;
    let mut pg_handle = Some(pg);
    for step in 0..actions {
        // Processes die and come back.
        if step > 0 && step % (actions / 4).max(50) == 0 {
            let victim = rng.random_range(0..cluster.procs.len());
            eprintln!(
                "chaos: step {step}: kill -9 process {victim} ({:?})",
                cluster.procs[victim].args
            );
            cluster.kill(victim);
            tokio::time::sleep(Duration::from_millis(300)).await;
            cluster.start(victim);
        }
        if step == pg_restart_at {
            eprintln!("chaos: step {step}: restarting PostgreSQL");
            let p = pg_handle.take().unwrap();
            let d = dir.clone();
            pg_handle = Some(
                tokio::task::spawn_blocking(move || {
                    p.stop();
                    std::thread::sleep(Duration::from_millis(500));
                    DevPostgres::ensure(&d).unwrap()
                })
                .await
                .unwrap(),
            );
        }
        // Late notifications whose time has come.
        let (due, rest): (Vec<_>, Vec<_>) = late.drain(..).partition(|(at, _)| *at <= step);
        late = rest;
        for (_, n) in due {
            provider.pending.push(n);
        }
        if !provider.pending.is_empty() && rng.random_bool(0.5) {
            let i = rng.random_range(0..provider.pending.len());
            let n = provider.pending[i].clone();
            let url = w.url(&mut rng);
            if send(&http, &url, &n).await {
                provider.pending.swap_remove(i);
            }
        }
        let member = w.members[rng.random_range(0..w.members.len())].clone();
        let token = issue_token(SECRET, Role::Member, &member, None, Duration::from_secs(3600));
        let url = w.url(&mut rng);
        match rng.random_range(0..100) {
            // Place an order (sometimes a double tap with a used key).
            0..=34 => {
                let input = if !w.keys.is_empty() && rng.random_bool(0.1) {
                    w.keys[rng.random_range(0..w.keys.len())].1.clone()
                } else {
                    let method = ["WECHAT_PAY", "ALIPAY", "WALLET", "OFFLINE", "MIXED"][rng.random_range(0..5)];
                    let item = match rng.random_range(0..3) {
                        0 => json!({"classPackId": w.packs[rng.random_range(0..w.packs.len())]}),
                        1 => json!({"coachSlotId": w.slots[rng.random_range(0..w.slots.len())]}),
                        _ => json!({"membershipPlanId": w.plan}),
                    };
                    let mut input = json!({"idempotencyKey": format!("k{step}"), "storeId": w.store, "item": item,
                                           "paymentMethod": method, "memberId": member});
                    if method == "MIXED" {
                        input["walletAmountCents"] = json!(1000);
                        input["onlineProvider"] = json!(if rng.random_bool(0.5) { "ALIPAY" } else { "WECHAT_PAY" });
                    }
                    input
                };
                let owner = input["memberId"].as_str().unwrap().to_string();
                let t = issue_token(SECRET, Role::Member, &owner, None, Duration::from_secs(3600));
                let q = "mutation($input: PlaceOrderInput!) { placeOrder(input: $input) { order { orderNo paymentMethod } payment { provider amountCents } } }";
                if let Some(r) = w.gql(&url, &t, q, json!({"input": input.clone()})).await {
                    if let Some(o) = r["data"]["placeOrder"]["order"].as_object() {
                        let no = o["orderNo"].as_str().unwrap().to_string();
                        if !w.orders.iter().any(|(n, ..)| *n == no) {
                            w.orders.push((
                                no.clone(),
                                owner.clone(),
                                o["paymentMethod"].as_str().unwrap().to_string(),
                            ));
                            w.keys.push((no.clone(), input));
                        }
                        // The member pays online (sometimes twice, late, or never).
                        let pay = &r["data"]["placeOrder"]["payment"];
                        if pay.is_object() && rng.random_bool(0.8) {
                            let n = Notification {
                                alipay: pay["provider"] == "ALIPAY",
                                order_no: no.clone(),
                                txn: format!("T{step}"),
                                fen: pay["amountCents"].as_i64().unwrap(),
                            };
                            provider.paid.insert((n.order_no.clone(), n.txn.clone()), n.fen);
                            let copies = rng.random_range(1..=3);
                            for _ in 0..copies {
                                if rng.random_bool(0.3) {
                                    late.push((step + rng.random_range(1..200), n.clone()));
                                } else {
                                    provider.pending.push(n.clone());
                                }
                            }
                        }
                    }
                }
            }
            // Check in (sometimes the same serial number again, sometimes racing).
            35..=59 if !w.orders.is_empty() => {
                let (no, owner, _) = w.orders[rng.random_range(0..w.orders.len())].clone();
                let t = issue_token(SECRET, Role::Member, &owner, None, Duration::from_secs(3600));
                let txn = format!("G{}", rng.random_range(0..(step + 1) / 3 + 1));
                let q = "mutation($i: CheckInInput!) { checkIn(input: $i) { duplicate } }";
                let vars = json!({"i": {"orderNo": no, "consumeTxnNo": txn, "sessions": rng.random_range(1..=2)}});
                let (a, b) = (w.url(&mut rng), w.url(&mut rng));
                let _ = tokio::join!(w.gql(&a, &t, q, vars.clone()), w.gql(&b, &t, q, vars));
            }
            60..=69 if !w.orders.is_empty() => {
                let (no, owner, _) = w.orders[rng.random_range(0..w.orders.len())].clone();
                let t = issue_token(SECRET, Role::Member, &owner, None, Duration::from_secs(3600));
                w.gql(
                    &url,
                    &t,
                    "mutation($n: String!) { cancelOrder(orderNo: $n) { status } }",
                    json!({"n": no}),
                )
                .await;
            }
            70..=77 if !w.orders.is_empty() => {
                let (no, ..) = w.orders[rng.random_range(0..w.orders.len())].clone();
                w.gql(
                    &url,
                    &admin,
                    "mutation($n: String!) { refundOrder(orderNo: $n, reason: \"chaos\") { status } }",
                    json!({"n": no}),
                )
                .await;
            }
            78..=85 if !w.orders.is_empty() => {
                let (no, ..) = w.orders[rng.random_range(0..w.orders.len())].clone();
                w.gql(
                    &url,
                    &admin,
                    "mutation($n: String!) { confirmOfflinePayment(orderNo: $n, reference: \"POS\") { status } }",
                    json!({"n": no}),
                )
                .await;
            }
            _ => {
                let _ = token;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    // Settle: every process up, the provider delivers everything it still owes (retrying on 5xx),
    // orders expire, the outbox drains.
    for i in 0..cluster.procs.len() {
        if cluster.procs[i].child.is_none() {
            cluster.start(i);
        }
    }
    for (_, n) in late.drain(..) {
        provider.pending.push(n);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while let Some(n) = provider.pending.pop() {
        let mut ok = false;
        while !ok {
            assert!(
                Instant::now() < deadline,
                "the server kept refusing a genuine notification"
            );
            let url = urls[rng.random_range(0..urls.len())].clone();
            ok = send(&http, &url, &n).await;
            if !ok {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let mut conn = loop {
        match <diesel_async::AsyncPgConnection as diesel_async::AsyncConnection>::establish(&db).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    loop {
        let open = scalar(
            &mut conn,
            "SELECT count(*) AS v FROM orders WHERE status = 'WAIT_PAY' AND expires_at IS NOT NULL",
        )
        .await
            + scalar(
                &mut conn,
                "SELECT count(*) AS v FROM compensation_events WHERE status IN ('PENDING', 'RETRYING')",
            )
            .await;
        if open == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{open} orders or events never settled");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let violations = check_invariants(&mut conn, &provider).await;
    let orders = scalar(&mut conn, "SELECT count(*) AS v FROM orders").await;
    let callbacks = scalar(&mut conn, "SELECT count(*) AS v FROM payment_callbacks").await;
    eprintln!(
        "chaos: seed {seed}: {orders} orders, {callbacks} callbacks, {} violations",
        violations.len()
    );
    drop(conn);
    drop(cluster);
    let p = pg_handle.take().unwrap();
    tokio::task::spawn_blocking(move || {
        p.stop();
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .unwrap();
    assert!(
        orders > (actions / 10) as i64,
        "the run did too little to mean anything: {orders} orders"
    );
    assert!(
        violations.is_empty(),
        "seed {seed}: invariants violated:\n{}",
        violations.join("\n")
    );
}

#[derive(diesel::QueryableByName)]
struct V {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    v: i64,
}

#[derive(diesel::QueryableByName)]
struct Bad {
    #[diesel(sql_type = diesel::sql_types::Text)]
    what: String,
}

async fn scalar(conn: &mut diesel_async::AsyncPgConnection, sql: &str) -> i64 {
    use diesel_async::RunQueryDsl;
    diesel::sql_query(sql).get_result::<V>(conn).await.unwrap().v
}

/// Reads the books; returns every violation found.
async fn check_invariants(conn: &mut diesel_async::AsyncPgConnection, provider: &Provider) -> Vec<String> {
    use diesel_async::RunQueryDsl;
    let checks = [
        // A status history with an illegal step, or one that does not end where the order is.
        "WITH h AS (SELECT order_id, from_status, to_status,
                           lag(to_status) OVER (PARTITION BY order_id ORDER BY id) AS prev,
                           row_number() OVER (PARTITION BY order_id ORDER BY id DESC) AS last
                      FROM order_transitions)
         SELECT 'illegal step in ' || o.order_no || ': ' || coalesce(h.from_status, 'NONE') || ' -> ' || h.to_status AS what
           FROM h JOIN orders o ON o.id = h.order_id
          WHERE (h.prev IS NULL AND NOT (h.from_status IS NULL AND h.to_status = 'WAIT_PAY'))
             OR (h.prev IS NOT NULL AND h.from_status IS DISTINCT FROM h.prev)
             OR (h.from_status, h.to_status) NOT IN (('WAIT_PAY','PAID'),('WAIT_PAY','CANCELED'),('PAID','CONSUMING'),
                   ('PAID','REFUNDED'),('CONSUMING','CONSUMED'),('CONSUMING','REFUNDED'))
                AND h.from_status IS NOT NULL
             OR (h.last = 1 AND h.to_status <> o.status)",
        // Two applied payments, or a paid order without its payment.
        "SELECT 'payments of ' || o.order_no || ': ' || count(p.id) AS what FROM orders o LEFT JOIN payments p ON p.order_id = o.id
          WHERE o.paid_at IS NOT NULL OR o.status IN ('PAID','CONSUMING','CONSUMED','REFUNDED')
          GROUP BY o.order_no HAVING count(p.id) <> 1",
        // Credits: used sessions are exactly the checked-in ones, never more than bought.
        "SELECT 'sessions of ' || o.order_no || ': used ' || o.sessions_used || ', checked in ' || coalesce(sum(c.sessions), 0) AS what
           FROM orders o LEFT JOIN check_ins c ON c.order_id = o.id
          WHERE o.kind <> 'MEMBERSHIP' GROUP BY o.id HAVING o.sessions_used <> coalesce(sum(c.sessions), 0)",
        // A wallet whose balance differs from its ledger.
        "SELECT 'wallet of member ' || m.id || ' differs from its ledger' AS what FROM members m
          WHERE m.balance_cents <> (SELECT coalesce(sum(balance_delta), 0) FROM wallet_ledger l WHERE l.member_id = m.id)
             OR m.frozen_cents <> (SELECT coalesce(sum(frozen_delta), 0) FROM wallet_ledger l WHERE l.member_id = m.id)",
        // Frozen money with no waiting order.
        "SELECT 'member ' || m.id || ' has ' || m.frozen_cents || ' frozen for waiting orders of ' ||
                coalesce((SELECT sum(wallet_amount_cents) FROM orders o WHERE o.member_id = m.id AND o.status = 'WAIT_PAY'
                           AND o.payment_method = 'MIXED'), 0) AS what
           FROM members m
          WHERE m.frozen_cents <> coalesce((SELECT sum(wallet_amount_cents) FROM orders o WHERE o.member_id = m.id
                                             AND o.status = 'WAIT_PAY' AND o.payment_method = 'MIXED'), 0)",
        // Seats that differ from capacity minus holders.
        "SELECT 'slot ' || s.id || ': remaining ' || s.remaining || ' of ' || s.capacity || ', holders ' ||
                (SELECT count(*) FROM orders o WHERE o.coach_slot_id = s.id AND o.status IN ('WAIT_PAY','PAID','CONSUMING','CONSUMED')) AS what
           FROM coach_slots s
          WHERE s.remaining <> s.capacity - (SELECT count(*) FROM orders o WHERE o.coach_slot_id = s.id
                                             AND o.status IN ('WAIT_PAY','PAID','CONSUMING','CONSUMED'))",
        // Stock that differs from the initial 40 minus holders.
        "SELECT 'pack ' || p.id || ': stock ' || p.stock AS what FROM class_packs p
          WHERE p.stock IS NOT NULL AND p.stock <> 40 - (SELECT count(*) FROM orders o WHERE o.class_pack_id = p.id
                                             AND o.status IN ('WAIT_PAY','PAID','CONSUMING','CONSUMED'))",
        // A paid order whose grants were neither delivered nor DEAD with a ticket.
        "SELECT 'grants of ' || o.order_no || ' not settled' AS what FROM orders o JOIN payments p ON p.order_id = o.id
          WHERE (SELECT count(*) FROM compensation_events e WHERE e.order_id = o.id AND e.kind IN ('DOOR_ACCESS_GRANT','AI_ACCESS_GRANT')
                   AND (e.status = 'SUCCEEDED' OR (e.status = 'DEAD' AND EXISTS (SELECT 1 FROM exception_tickets t
                        WHERE t.kind = 'COMPENSATION_DEAD' AND t.detail->>'eventId' = e.id::text)))) <> 2",
        // A late payment without its ticket and its refund.
        "SELECT 'late payment ' || c.provider_txn_id || ' of ' || c.order_no || ' lacks ticket or refund' AS what
           FROM payment_callbacks c
          WHERE c.outcome = 'PAID_AFTER_CANCEL'
            AND (NOT EXISTS (SELECT 1 FROM exception_tickets t WHERE t.kind = 'PAID_AFTER_CANCEL' AND t.provider_txn_id = c.provider_txn_id)
              OR NOT EXISTS (SELECT 1 FROM compensation_events e WHERE e.kind = 'PROVIDER_REFUND'
                              AND e.payload->>'providerTxnId' = c.provider_txn_id))",
    ];
    let mut out = vec![];
    for sql in checks {
        match diesel::sql_query(sql).load::<Bad>(conn).await {
            Ok(rows) => out.extend(rows.into_iter().map(|r| r.what)),
            Err(e) => out.push(format!("check failed to run: {e}: {sql}")),
        }
    }
    // No callback lost: every payment the provider took was processed (its key claimed).
    for ((order_no, txn), _) in provider.paid.iter() {
        let key = format!("{order_no}:{txn}");
        let n = diesel::sql_query("SELECT count(*) AS v FROM payment_keys WHERE key = $1")
            .bind::<diesel::sql_types::Text, _>(&key)
            .get_result::<V>(conn)
            .await
            .map(|v| v.v)
            .unwrap_or(0);
        if n != 1 {
            out.push(format!("payment {key} taken by the provider but never processed"));
        }
    }
    out
}

/// The checker itself must see broken books, or a green chaos run means nothing.
#[tokio::test]
async fn the_invariant_checker_catches_broken_books() {
    use diesel_async::RunQueryDsl;
    let app = crate::harness::TestApp::new().await;
    let s = app.studio(100_000, Some(40), 3).await;
    let placed = app
        .place(
            &s.member,
            json!({"idempotencyKey": crate::harness::key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WALLET"}),
        )
        .await;
    let no = placed["order"]["orderNo"].as_str().unwrap().to_string();
    let mut conn = <diesel_async::AsyncPgConnection as diesel_async::AsyncConnection>::establish(&app.db_url)
        .await
        .unwrap();
    // The grants of a paid order were delivered (by the simulator, here by hand).
    diesel::sql_query("UPDATE compensation_events SET status = 'SUCCEEDED'")
        .execute(&mut conn)
        .await
        .unwrap();
    let mut provider = Provider::default();
    assert!(
        check_invariants(&mut conn, &provider).await.is_empty(),
        "a clean book has no violations"
    );
    // Now break it, one invariant at a time (each in a transaction rolled back afterwards), and
    // each check must see its own breakage: all nine checks of the books and the lost callback.
    let breakages: [(&str, &[&str]); 9] = [
        (
            "illegal step in",
            &[
                "ALTER TABLE order_transitions DISABLE TRIGGER ALL",
                "UPDATE order_transitions SET to_status = 'CONSUMED' WHERE from_status = 'WAIT_PAY'",
            ],
        ),
        ("payments of", &["ALTER TABLE payments DISABLE TRIGGER ALL", "DELETE FROM payments"]),
        (
            "sessions of",
            &["ALTER TABLE orders DISABLE TRIGGER USER", "UPDATE orders SET sessions_used = 1"],
        ),
        (
            "differs from its ledger",
            &["ALTER TABLE members DISABLE TRIGGER USER", "UPDATE members SET balance_cents = balance_cents + 7"],
        ),
        (
            "frozen for waiting orders",
            &[
                "ALTER TABLE members DISABLE TRIGGER USER",
                "ALTER TABLE wallet_ledger DISABLE TRIGGER ALL",
                "UPDATE members SET frozen_cents = frozen_cents + 7",
                // The ledger agrees (so only the frozen check can see it).
                "INSERT INTO wallet_ledger (member_id, kind, balance_delta, frozen_delta, actor, trace_id)
                 SELECT id, 'FREEZE', 0, 7, 'broken', 'broken' FROM members",
            ],
        ),
        ("slot ", &["UPDATE coach_slots SET remaining = remaining - 1"]),
        ("pack ", &["UPDATE class_packs SET stock = stock - 1"]),
        (
            "grants of",
            &[
                "ALTER TABLE compensation_events DISABLE TRIGGER ALL",
                "DELETE FROM compensation_events WHERE kind = 'AI_ACCESS_GRANT'",
            ],
        ),
        (
            "late payment",
            &["INSERT INTO payment_callbacks (provider, verified, outcome, body, headers, order_no, provider_txn_id, trace_id)
               VALUES ('WECHAT_PAY', true, 'PAID_AFTER_CANCEL', '{}', '{}', 'FO-late', 'T-late', 'broken')"],
        ),
    ];
    let clean = Provider::default();
    for (expected, sqls) in breakages {
        diesel::sql_query("BEGIN").execute(&mut conn).await.unwrap();
        for sql in sqls {
            diesel::sql_query(*sql)
                .execute(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        let found = check_invariants(&mut conn, &clean).await;
        diesel::sql_query("ROLLBACK").execute(&mut conn).await.unwrap();
        assert!(
            found.iter().any(|f| f.contains(expected)),
            "the checker missed '{expected}':\n{}",
            found.join("\n")
        );
        assert!(
            !found.iter().any(|f| f.starts_with("check failed to run")),
            "{}",
            found.join("\n")
        );
        assert!(
            check_invariants(&mut conn, &clean).await.is_empty(),
            "rolled back, the book is clean again"
        );
    }
    // The tenth: a payment the provider took that never reached fitorder.
    provider.paid.insert((no.clone(), "T-never-sent".into()), 100);
    let found = check_invariants(&mut conn, &provider).await.join("\n");
    assert!(
        found.contains("never processed"),
        "the checker missed a lost callback:\n{found}"
    );
}
