//! Who may do what: every operation of the three clients against every role, with the example
//! variables, on seeded data. A refusal is FORBIDDEN (or UNAUTHENTICATED without a token); an
//! allowed operation may fail for other reasons (NOT_FOUND, ...), never for the role.

use fitorder::config::ExposeSecret;
use serde_json::Value;

use crate::harness::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    Nobody,
    Member,
    Admin,
    Ops,
}

/// The roles refused each operation (besides Nobody, refused everything).
fn refused(op: &str) -> &'static [Who] {
    use Who::*;
    match op {
        // The member app's own operations: members and staff at the desk.
        "PlaceOrder" | "StartPayment" | "CheckIn" | "CancelMyOrder" | "CancelOrder" => &[Ops],
        "MyAccount" | "Catalog" | "MyOrders" | "MyOrder" | "Orders" | "OrderChain" | "Member" | "Memberships" => &[],
        // Staff views and ops actions.
        "Tickets"
        | "Compensations"
        | "AnomalyStats"
        | "ReconciliationRuns"
        | "DeadCompensations"
        | "OpenTickets"
        | "Anomalies"
        | "ReplayCompensation"
        | "ReplayDeadCompensations"
        | "ResolveTicket"
        | "Replay" => &[Member],
        // Everything else changes the catalog, money or orders: admins only.
        _ => &[Member, Ops],
    }
}

#[tokio::test]
async fn every_operation_against_every_role() {
    let app = TestApp::new().await;
    let seeded = {
        let mut c = app.conn().await;
        fitorder::dev::seed::seed(&mut c)
            .await
            .map_err(|e| e.message())
            .unwrap()
    };
    let member = seeded.member_ids[0].to_string();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("playground");
    let mut checked = 0;
    for (audience, doc) in [("member", MEMBER_OPS), ("admin", ADMIN_OPS), ("ops", OPS_OPS)] {
        let vars: Value =
            serde_json::from_str(&std::fs::read_to_string(root.join(format!("variables/{audience}.json"))).unwrap())
                .unwrap();
        for line in doc.lines() {
            let mut words = line.split_whitespace();
            let (Some(kind), Some(name)) = (words.next(), words.next()) else {
                continue;
            };
            if !["query", "mutation"].contains(&kind) {
                continue;
            }
            let name = name.split('(').next().unwrap().trim_end_matches('{');
            for who in [Who::Nobody, Who::Member, Who::Admin, Who::Ops] {
                let token = match who {
                    Who::Nobody => None,
                    Who::Member => Some(app.member_token(&member)),
                    Who::Admin => Some(app.admin_token()),
                    Who::Ops => Some(app.ops_token()),
                };
                let r = app
                    .gql_named(token.as_deref(), doc, Some(name), vars[name].clone())
                    .await;
                let codes: Vec<&str> = r["errors"]
                    .as_array()
                    .map(|e| e.iter().filter_map(|e| e["extensions"]["code"].as_str()).collect())
                    .unwrap_or_default();
                let ctx = format!("{name} as {who:?}: {r}");
                if fitorder::graphql::ANONYMOUS_MUTATIONS
                    .iter()
                    .any(|m| name.eq_ignore_ascii_case(m))
                {
                    // Signing in needs no token and is refused to no role (the example's made-up
                    // refresh token is UNAUTHENTICATED for everyone; WeChat is not configured).
                    let expected: &[&str] = match name {
                        "SignInWithWechat" => &["INTERNAL"],
                        "RefreshSession" => &["UNAUTHENTICATED"],
                        _ => &[],
                    };
                    assert_eq!(codes, expected, "{ctx}");
                    assert_ne!(r["errors"][0]["message"], "a bearer token is required", "{ctx}");
                } else if who == Who::Nobody {
                    assert!(
                        !codes.is_empty() && codes.iter().all(|c| *c == "UNAUTHENTICATED"),
                        "{ctx}"
                    );
                } else if refused(name).contains(&who) {
                    assert_eq!(codes.first().copied(), Some("FORBIDDEN"), "{ctx}");
                } else {
                    assert!(
                        !codes.contains(&"FORBIDDEN") && !codes.contains(&"UNAUTHENTICATED"),
                        "{ctx}"
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 120, "{checked}");
}

#[tokio::test]
async fn fragment_and_alias_bombs_are_refused_before_they_run() {
    let app = TestApp::new().await;
    // A fragment that spreads itself through nested connections, many times over.
    let mut q = String::from("fragment F on Order { orderNo member { memberships { order { orderNo } } } }\nquery {");
    for i in 0..300 {
        q.push_str(&format!(" o{i}: orders(first: 100) {{ edges {{ node {{ ...F }} }} }}"));
    }
    q.push('}');
    let r = app.gql(Some(&app.admin_token()), &q, serde_json::json!({})).await;
    let msg = r["errors"][0]["message"].as_str().unwrap_or_default().to_lowercase();
    assert!(msg.contains("complex") || msg.contains("deep"), "{r}");
    assert!(r["data"].is_null());
}

// ---- Issue 13: what a black-box probe broke ----

use std::time::{Duration, Instant};

use fitorder::auth::{issue_token, Role};
use futures_util::StreamExt;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::ws::WsClient;

/// `query{...F0} fragment F0 on Query{...F1 ...F1} … fragment Fn on Query{__typename}`.
fn doubling_fragments(levels: usize) -> String {
    let mut q = String::from("query{...F0}");
    for i in 0..levels {
        q.push_str(&format!(" fragment F{i} on Query{{...F{n} ...F{n}}}", n = i + 1));
    }
    q.push_str(&format!(" fragment F{levels} on Query{{__typename}}"));
    q
}

/// Resident memory of this process, in MiB.
fn rss_mib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096 / (1024 * 1024)
}

/// Serves the app's router on a real port through the production server loop.
async fn listen(app: &TestApp) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let router = app.router.clone();
    let header_timeout = app.state.config.http_header_timeout;
    tokio::spawn(fitorder::http::serve(
        listener,
        router,
        header_timeout,
        std::future::pending(),
    ));
    addr
}

#[tokio::test]
async fn doubling_fragments_are_refused_in_milliseconds_with_flat_memory() {
    let app = TestApp::new().await;
    let admin = app.admin_token();
    let before = rss_mib();
    for levels in [24, 30] {
        let doc = doubling_fragments(levels);
        assert!(doc.len() < 1500, "{}", doc.len());
        for token in [None, Some(admin.as_str())] {
            let started = Instant::now();
            let r = app.gql(token, &doc, json!({})).await;
            let took = started.elapsed();
            assert!(r["data"].is_null(), "{r}");
            let code = error_code(&r);
            match token {
                None => assert_eq!(code, "UNAUTHENTICATED", "{r}"),
                Some(_) => {
                    assert_eq!(code, "BAD_USER_INPUT", "{r}");
                    assert!(
                        r["errors"][0]["message"].as_str().unwrap().contains("too complex"),
                        "{r}"
                    );
                }
            }
            assert!(took < Duration::from_millis(200), "{levels} levels took {took:?}");
        }
    }
    // Also over the WebSocket, where the document is not behind the HTTP handler.
    let addr = listen(&app).await;
    let mut ws = WsClient::connect(&addr, Some(&admin), false).await.unwrap();
    let started = Instant::now();
    ws.subscribe("1", &doubling_fragments(30), None, json!({})).await;
    let r = ws.next_payload(5).await.expect("an answer");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    assert!(r.to_string().contains("too complex"), "{r}");
    let grew = rss_mib().saturating_sub(before);
    assert!(grew < 64, "memory grew by {grew} MiB");
}

#[tokio::test]
async fn anonymous_requests_are_refused_before_parsing_but_introspection_works() {
    // Anonymous introspection: development mode or FITORDER_PUBLIC_INTROSPECTION=1 (issue 23).
    let app = TestApp::with_config(|c| c.public_introspection = true).await;
    // Not even valid GraphQL: refused for the missing token, not parsed.
    let r = app.gql(None, "query { orders(first: 1) { edges ", json!({})).await;
    assert_eq!(error_code(&r), "UNAUTHENTICATED", "{r}");
    // `__typename` alone is not introspection.
    assert_eq!(app.err_code(None, "{ __typename }", json!({})).await, "UNAUTHENTICATED");
    // GraphiQL's first request, before a token is pasted.
    let r = app
        .gql(None, "query { __schema { queryType { name } } }", json!({}))
        .await;
    assert_eq!(r["data"]["__schema"]["queryType"]["name"], "Query", "{r}");
    // The standard introspection query (nine levels of `ofType`, deeper than the API's 12)
    // runs; the same depth outside introspection is still refused.
    let full = include_str!("introspection.graphql");
    let r = app.gql(None, full, json!({})).await;
    assert!(r.get("errors").is_none(), "{r}");
    assert!(r["data"]["__schema"]["types"].as_array().unwrap().len() > 20);
    let mixed = full.replacen(
        "query IntrospectionQuery {",
        "query IntrospectionQuery { me { role }",
        1,
    );
    let r = app.gql(Some(&app.admin_token()), &mixed, json!({})).await;
    assert!(
        r["errors"][0]["message"].as_str().unwrap().contains("nested too deep"),
        "{r}"
    );
}

#[tokio::test]
async fn a_store_limited_admin_cannot_charge_or_read_another_stores_member() {
    let app = TestApp::new().await;
    let one = app.studio(100_000, None, 3).await;
    let two = app.studio(100_000, None, 3).await;
    let limited = issue_token(
        app.state.config.jwt_secret.expose_secret(),
        Role::Admin,
        "desk-1",
        Some(vec![one.store.clone()]),
        Duration::from_secs(600),
    );
    let balance = || async { app.member_view(&two.member).await["wallet"]["balanceCents"].clone() };
    let was = balance().await;
    let place = r#"mutation($i: PlaceOrderInput!) { placeOrder(input: $i) {
        order { orderNo member { phone orders: memberships { id } } } } }"#;
    let r = app
        .gql(
            Some(&limited),
            place,
            json!({"i": {"idempotencyKey": key(), "storeId": one.store, "memberId": two.member,
                         "item": {"classPackId": one.pack}, "paymentMethod": "WALLET"}}),
        )
        .await;
    assert_eq!(error_code(&r), "NOT_FOUND", "{r}");
    assert!(r["data"]["placeOrder"].is_null(), "{r}");
    assert_eq!(balance().await, was, "the wallet must not move");
    // Their own store's member: fine.
    let ok = app
        .gql(
            Some(&limited),
            place,
            json!({"i": {"idempotencyKey": key(), "storeId": one.store, "memberId": one.member,
                         "item": {"classPackId": one.pack}, "paymentMethod": "WALLET"}}),
        )
        .await;
    assert!(ok.get("errors").is_none(), "{ok}");
    // A store-2 member buying in store 1 themselves: the limited admin sees the order, not
    // the member behind it.
    let no = app
        .buy(&two.member, &one.store, json!({"classPackId": one.pack}), "WALLET")
        .await;
    let q = "query($n: String!) { order(orderNo: $n) { orderNo member { phone } } }";
    let r = app.gql(Some(&limited), q, json!({"n": no})).await;
    assert_eq!(error_code(&r), "FORBIDDEN", "{r}");
    assert!(!r.to_string().contains("139"), "no phone number may leak: {r}");
    // The unlimited admin still sees both.
    let r = app.admin(q, json!({"n": no})).await;
    assert!(r["order"]["member"]["phone"].as_str().unwrap().starts_with("139"));
}

fn sign(app: &TestApp, claims: serde_json::Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(app.state.config.jwt_secret.expose_secret().as_bytes()),
    )
    .unwrap()
}

#[tokio::test]
async fn tokens_nbf_canonical_subjects_scheme_and_plain_messages() {
    let app = TestApp::new().await;
    let me = "query { me { role subject } }";
    let now = chrono::Utc::now().timestamp();
    let later = sign(
        &app,
        json!({"sub": "1", "role": "admin", "exp": now + 3600, "nbf": now + 600}),
    );
    let r = app.gql(Some(&later), me, json!({})).await;
    assert_eq!(error_code(&r), "UNAUTHENTICATED", "{r}");
    for sub in ["+2", "02", " 2", "-2"] {
        let t = sign(&app, json!({"sub": sub, "role": "member", "exp": now + 3600}));
        assert_eq!(
            app.err_code(Some(&t), me, json!({})).await,
            "UNAUTHENTICATED",
            "{sub:?}"
        );
    }
    let t = sign(
        &app,
        json!({"sub": "1", "role": "admin", "exp": now + 3600, "stores": ["+1"]}),
    );
    assert_eq!(app.err_code(Some(&t), me, json!({})).await, "UNAUTHENTICATED");
    // The scheme is case-insensitive.
    let token = app.ops_token();
    for scheme in ["Bearer", "bearer", "BEARER", "BeArEr"] {
        let body = serde_json::to_vec(&json!({"query": me})).unwrap();
        let auth = format!("{scheme} {token}");
        let (_, _, bytes) = app
            .post(
                "/graphql",
                &[("content-type", "application/json"), ("authorization", &auth)],
                body,
            )
            .await;
        let r: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(r["data"]["me"]["role"], "ops", "{scheme}: {r}");
    }
    // Refusals say what is wrong in our words, not the library's.
    for bad in [
        "garbage".to_string(),
        sign(&app, json!({"sub": "1", "role": "admin", "exp": now - 3600})),
        issue_token("other", Role::Admin, "x", None, Duration::from_secs(60)),
    ] {
        let r = app.gql(Some(&bad), me, json!({})).await;
        let msg = r["errors"][0]["message"].as_str().unwrap();
        assert!(msg.starts_with("the token"), "{msg}");
        for internal in ["Error", "Kind", "Base64", "Json", "{", "("] {
            assert!(!msg.contains(internal), "{msg}");
        }
    }
}

#[tokio::test]
async fn a_websocket_session_ends_when_its_token_expires() {
    let app = TestApp::new().await;
    let addr = listen(&app).await;
    // An admin token that lasts 3 seconds (the verifier allows 5 s of clock skew at connect).
    let short = issue_token(
        app.state.config.jwt_secret.expose_secret(),
        Role::Admin,
        "staff-1",
        None,
        Duration::from_secs(3),
    );
    let mut ws = WsClient::connect(&addr, Some(&short), false).await.unwrap();
    ws.subscribe("1", "query { me { role } }", None, json!({})).await;
    let r = ws.next_payload(5).await.unwrap();
    assert_eq!(r["data"]["me"]["role"], "admin", "{r}");
    ws.subscribe("2", "subscription { ticketOpened { id } }", None, json!({}))
        .await;
    let started = Instant::now();
    let (code, _) = ws.close_code(8).await;
    assert_eq!(code, Some(4403));
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

#[tokio::test]
async fn websocket_init_timeout_reused_ids_and_the_subscription_cap() {
    let app = TestApp::with_config(|c| {
        c.ws_init_timeout = Duration::from_millis(800);
        c.ws_max_subscriptions = 3;
    })
    .await;
    let addr = listen(&app).await;
    // Never sends connection_init: closed with 4408.
    let mut silent = crate::ws::connect_silent(&addr).await;
    let started = Instant::now();
    let code = loop {
        match tokio::time::timeout(Duration::from_secs(5), silent.next()).await {
            Ok(Some(Ok(tokio_tungstenite::tungstenite::Message::Close(f)))) => break f.map(|f| u16::from(f.code)),
            Ok(Some(Ok(_))) => continue,
            other => panic!("no close: {other:?}"),
        }
    };
    assert_eq!(code, Some(4408));
    assert!(started.elapsed() < Duration::from_secs(3));
    let _ = silent.close(None).await;

    // The cap: a fourth running subscription is refused with an error, the others go on.
    let mut ws = WsClient::connect(&addr, Some(&app.ops_token()), false).await.unwrap();
    for id in ["a", "b", "c", "d"] {
        ws.subscribe(id, "subscription { ticketOpened { id } }", None, json!({}))
            .await;
    }
    let refused = ws.next_message(5).await.unwrap();
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["id"], "d", "{refused}");
    // Completing one frees a place.
    ws.send_raw(json!({"id": "a", "type": "complete"})).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    ws.subscribe("e", "subscription { ticketOpened { id } }", None, json!({}))
        .await;
    while let Some(m) = ws.next_message(1).await {
        assert_ne!(m["type"], "error", "e must be accepted: {m}");
    }
    // A reused id of a running subscription closes with 4409.
    ws.subscribe("b", "subscription { ticketOpened { id } }", None, json!({}))
        .await;
    let (code, _) = ws.close_code(5).await;
    assert_eq!(code, Some(4409));
}

/// Reads until the peer closes; how long it took (None: still open after `secs`).
async fn closed_within(stream: &mut tokio::net::TcpStream, secs: u64) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(secs), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => continue,
            Err(_) => return None,
        }
    }
}

#[tokio::test]
async fn slow_and_idle_http_connections_are_cut() {
    let app = TestApp::with_config(|c| {
        c.http_header_timeout = Duration::from_secs(1);
        c.http_body_timeout = Duration::from_secs(1);
    })
    .await;
    let addr = listen(&app).await;
    // Headers that never end.
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    assert!(closed_within(&mut slow, 5).await.is_some(), "slow headers kept open");
    // A connection that sends nothing at all.
    let mut idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    assert!(closed_within(&mut idle, 5).await.is_some(), "idle connection kept open");
    // An idle keep-alive connection after one request.
    let mut kept = tokio::net::TcpStream::connect(&addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(
        closed_within(&mut kept, 5).await.is_some(),
        "keep-alive connection kept open"
    );
    // A body that never arrives.
    let mut body = tokio::net::TcpStream::connect(&addr).await.unwrap();
    body.write_all(
        b"POST /graphql HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"qu",
    )
    .await
    .unwrap();
    let mut answer = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), body.read(&mut answer))
        .await
        .expect("an answer before the body arrives")
        .unwrap();
    let head = String::from_utf8_lossy(&answer[..n]).to_string();
    assert!(head.starts_with("HTTP/1.1 4"), "{head}");
}

#[tokio::test]
async fn refused_callbacks_answer_a_fixed_fail_and_keep_bounded_evidence_of_any_body() {
    let app = TestApp::with_config(crate::providers::configure).await;
    let count = || app.sql_i64("SELECT count(*) AS v FROM payment_callbacks");
    let big_sig = "A".repeat(8 * 1024);
    let wechat = |body: Vec<u8>| {
        let sig = big_sig.clone();
        let app = &app;
        async move {
            let ts = chrono::Utc::now().timestamp().to_string();
            app.post(
                "/pay/wechat/notify",
                &[
                    ("content-type", "application/json"),
                    ("wechatpay-timestamp", &ts),
                    ("wechatpay-nonce", "n"),
                    ("wechatpay-serial", "s"),
                    ("wechatpay-signature", &sig),
                ],
                body,
            )
            .await
        }
    };
    let mut bodies: Vec<Vec<u8>> = vec![
        b"{\"id\":\"\0\"}".to_vec(),
        br#"{"id":"\u0000"}"#.to_vec(),
        vec![b'{', 0xff, 0xfe, 0, b'}'],
    ];
    let mut huge = br#"{"id":""#.to_vec();
    huge.extend(std::iter::repeat_n(b'x', 1_000_000));
    huge.extend(br#""}"#);
    bodies.push(huge);
    for body in bodies {
        let before = count().await;
        let (status, _, answer) = wechat(body.clone()).await;
        assert_eq!(status.as_u16(), 401);
        let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(answer, json!({"code": "FAIL", "message": "notification refused"}));
        assert_eq!(count().await, before + 1, "evidence must be written");
    }
    // Only the beginning of an unverified body, and of its headers, is kept.
    let longest = app
        .sql_i64("SELECT max(octet_length(body))::bigint AS v FROM payment_callbacks")
        .await;
    assert!(longest < 4_096 + 100, "{longest}");
    let headers = app
        .sql_i64("SELECT max(octet_length(headers::text))::bigint AS v FROM payment_callbacks")
        .await;
    assert!(headers < 2_000, "{headers}");
    let nul = app
        .sql_i64(r"SELECT count(*) AS v FROM payment_callbacks WHERE position('\u0000' in body) > 0")
        .await;
    assert!(nul >= 2, "NULs are kept escaped");
    // Alipay: a NUL in the form.
    let before = count().await;
    let (status, _, answer) = app
        .post(
            "/pay/alipay/notify",
            &[("content-type", "application/x-www-form-urlencoded")],
            b"trade_status=%00&out_trade_no=%00&sign_type=RSA2&sign=AAAA".to_vec(),
        )
        .await;
    assert!(status.is_client_error(), "{status}");
    assert_eq!(answer, b"failure");
    assert_eq!(count().await, before + 1);

    // data:cleanup prunes unverified callbacks after a week; the verified stay.
    {
        use diesel_async::RunQueryDsl;
        let mut c = app.conn().await;
        diesel::sql_query("UPDATE payment_callbacks SET received_at = now() - interval '8 days' WHERE id IN (SELECT min(id) FROM payment_callbacks)")
            .execute(&mut c)
            .await
            .unwrap();
    }
    let before = count().await;
    fitorder::tasks::housekeeping::data_cleanup(app.state.clone())
        .await
        .map_err(|e| e.message())
        .unwrap();
    assert_eq!(count().await, before - 1);
}

#[tokio::test]
async fn members_see_their_order_without_other_systems_internals() {
    use crate::fakes::{FakeDownstream, Mode};
    let fake = FakeDownstream::start(Mode::AlwaysFail).await;
    let url = fake.url.clone();
    let app = TestApp::with_config(move |c| {
        crate::providers::configure(c);
        c.door_access_url = Some(url.clone().into());
        c.ai_access_url = Some(url.into());
        c.max_attempts = 1;
    })
    .await;
    app.expect_dead(); // the downstream is down: its grants end DEAD
    let s = app.studio(100_000, None, 3).await;
    let placed = app
        .place(
            &s.member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WECHAT_PAY"}),
        )
        .await;
    let no = placed["order"]["orderNo"].as_str().unwrap().to_string();
    let fen = placed["order"]["amountCents"].as_i64().unwrap_or(0);
    let fen = if fen > 0 {
        fen
    } else {
        app.order(&no).await["amountCents"].as_i64().unwrap()
    };
    assert_eq!(app.wechat_paid(&no, "4200000001", fen).await.as_u16(), 204);
    let worker = fitorder::compensation::worker::Worker::new(app.state.clone());
    for _ in 0..50 {
        worker.run_once().await.unwrap();
        if app
            .sql_i64("SELECT count(*) AS v FROM compensation_events WHERE status IN ('PENDING', 'RETRYING')")
            .await
            == 0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let q = "query($n: String!) { order(orderNo: $n) {
        callbacks { body outcome }
        compensation { status lastError attemptLog { ok error } }
        timeline { kind actor summary }
        tickets { id } } }";
    let staff = app.admin(q, json!({"n": no})).await["order"].clone();
    let member = app.ok(&app.member_token(&s.member), q, json!({"n": no})).await["order"].clone();
    // What staff see, so that the member's view is known to hide something.
    assert!(
        staff["callbacks"][0]["body"].as_str().unwrap().contains("mchid"),
        "{staff}"
    );
    assert!(staff["compensation"][0]["lastError"].is_string(), "{staff}");
    assert!(
        staff["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "TICKET"),
        "{staff}"
    );
    // The member's view.
    assert_eq!(member["callbacks"][0]["outcome"], "APPLIED", "{member}");
    assert_eq!(member["callbacks"][0]["body"], "", "{member}");
    for c in member["compensation"].as_array().unwrap() {
        assert_eq!(c["status"], "DEAD", "{member}");
        assert!(c["lastError"].is_null(), "{member}");
        assert!(
            c["attemptLog"].as_array().unwrap().iter().all(|a| a["error"].is_null()),
            "{member}"
        );
    }
    let timeline = member["timeline"].as_array().unwrap();
    assert!(timeline.iter().all(|e| e["kind"] != "TICKET"), "{member}");
    let attempts: Vec<&serde_json::Value> = timeline
        .iter()
        .filter(|e| e["kind"] == "COMPENSATION_ATTEMPT")
        .collect();
    assert!(!attempts.is_empty(), "{member}");
    let staff_attempt = staff["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "COMPENSATION_ATTEMPT")
        .unwrap()["summary"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(staff_attempt.contains(": "), "{staff_attempt}");
    for a in attempts {
        assert!(!a["summary"].as_str().unwrap().contains(": "), "{a}");
        assert_eq!(a["actor"], "system");
    }
    assert_eq!(member["tickets"], json!([]));
    assert!(!member.to_string().contains("openid") && !member.to_string().contains("mchid"));
}

#[tokio::test]
async fn html_pages_are_self_contained_and_never_framed() {
    let app = TestApp::new().await;
    assert!(
        fitorder::http::graphiql::available(),
        "this build must embed GraphiQL (npm ci in build.rs)"
    );
    for path in ["/graphql", "/ops"] {
        let resp = {
            use tower::ServiceExt;
            app.router
                .clone()
                .oneshot(
                    axum::http::Request::get(path)
                        .header("host", "127.0.0.1:8080")
                        .body(axum::body::Body::empty())
                        .unwrap(),
                )
                .await
                .unwrap()
        };
        let h = resp.headers().clone();
        let csp = h["content-security-policy"].to_str().unwrap().to_string();
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(h["x-frame-options"], "DENY", "{path}");
        if path == "/graphql" {
            assert!(csp.contains("script-src 'self';"), "{csp}");
            assert!(!csp.contains("unsafe-eval") && !csp.contains("https:"), "{csp}");
            let body = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .unwrap()
                .to_bytes();
            let html = String::from_utf8(body.to_vec()).unwrap();
            // Every script and stylesheet is this service's.
            for src in html.split("src=\"").skip(1).chain(html.split("href=\"").skip(1)) {
                assert!(src.starts_with("/graphql/assets/"), "{src}");
            }
            for asset in [
                "graphiql.min.js",
                "graphiql.min.css",
                "react.production.min.js",
                "react-dom.production.min.js",
                "graphql-ws.min.js",
            ] {
                assert!(html.contains(asset), "{asset}");
                let (s, bytes) = app.get(&format!("/graphql/assets/{asset}")).await;
                assert_eq!(s.as_u16(), 200, "{asset}");
                assert!(bytes.len() > 5_000, "{asset}: {} bytes", bytes.len());
            }
        }
    }
    let (s, _) = app.get("/graphql/assets/../Cargo.toml").await;
    assert!(s.is_client_error());
    // JSON answers are not sniffed either.
    let (_, h, _) = app
        .post("/graphql", &[("content-type", "application/json")], b"{}".to_vec())
        .await;
    assert_eq!(h["x-content-type-options"], "nosniff");
}

/// What a GET answers here: status, headers and body as text.
async fn fetch_page(app: &TestApp, path: &str) -> (u16, axum::http::HeaderMap, String) {
    use tower::ServiceExt;
    let resp = app
        .router
        .clone()
        .oneshot(
            axum::http::Request::get(path)
                .header("host", "127.0.0.1:8080")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    (status, headers, String::from_utf8(body.to_vec()).unwrap())
}

/// A policy's directives, each as one space-separated string.
fn directives(csp: &str) -> Vec<String> {
    csp.split(';')
        .map(|d| d.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|d| !d.is_empty())
        .collect()
}

/// The opening tags of a page (comments skipped), and each `<script>` with what it holds.
fn tags_and_scripts(html: &str) -> (Vec<String>, Vec<(String, String)>) {
    let (mut tags, mut scripts) = (Vec::new(), Vec::new());
    let mut rest = html;
    while let Some(i) = rest.find('<') {
        rest = &rest[i..];
        if rest.starts_with("<!--") {
            rest = &rest[rest.find("-->").expect("comment closed") + 3..];
            continue;
        }
        let end = rest.find('>').expect("tag closed");
        let tag = rest[..=end].to_string();
        rest = &rest[end + 1..];
        if tag.to_ascii_lowercase().starts_with("<script") {
            let close = rest.to_ascii_lowercase().find("</script>").expect("script closed");
            scripts.push((tag.clone(), rest[..close].to_string()));
            rest = &rest[close..];
        }
        tags.push(tag);
    }
    (tags, scripts)
}

/// Issue 34: the ops watch page runs no inline script and sets no inline style, so its policy
/// (the header's and the page's own `<meta>`) allows neither; its script and styles are files
/// under `/ops/assets/`, served as the workbench's are.
#[tokio::test]
async fn the_ops_page_needs_no_unsafe_inline() {
    let app = TestApp::new().await;
    let (status, h, html) = fetch_page(&app, "/ops").await;
    assert_eq!(status, 200);
    let csp = h["content-security-policy"].to_str().unwrap().to_string();
    assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{csp}");
    let header = directives(&csp);
    assert!(header.contains(&"script-src 'self'".to_string()), "{csp}");
    assert!(header.contains(&"style-src 'self'".to_string()), "{csp}");
    assert!(header.contains(&"frame-ancestors 'none'".to_string()), "{csp}");
    // The page's own policy says the same (a <meta> cannot say frame-ancestors).
    let meta = html
        .split(r#"<meta http-equiv="Content-Security-Policy" content=""#)
        .nth(1)
        .and_then(|m| m.split('"').next())
        .expect("the page carries its policy");
    let without_framing: Vec<String> = header
        .iter()
        .filter(|d| !d.starts_with("frame-ancestors"))
        .cloned()
        .collect();
    assert_eq!(directives(meta), without_framing, "<meta> {meta} vs header {csp}");

    let (tags, scripts) = tags_and_scripts(&html);
    let mut assets = Vec::new();
    for (tag, content) in &scripts {
        if content.trim().is_empty() {
            let src = tag.split("src=\"").nth(1).and_then(|s| s.split('"').next());
            let src = src.unwrap_or_else(|| panic!("an empty script without src: {tag}"));
            assert!(src.starts_with("/ops/assets/"), "{tag}");
            assets.push(src.to_string());
        } else {
            // The documents the page sends: data the browser does not run.
            assert!(
                tag.contains(r#"type="application/graphql""#),
                "an inline script runs: {tag}{content}"
            );
        }
    }
    for tag in &tags {
        let lower = tag.to_ascii_lowercase();
        assert!(!lower.starts_with("<style"), "an inline <style>");
        for attr in lower.split_whitespace().skip(1) {
            let name = attr.split('=').next().unwrap();
            let handler = name.len() > 2 && name.starts_with("on") && name.bytes().all(|b| b.is_ascii_lowercase());
            assert!(
                !(attr.contains('=') && (handler || name == "style")),
                "inline {name}: {tag}"
            );
        }
        if lower.starts_with("<link") {
            let href = tag.split("href=\"").nth(1).and_then(|s| s.split('"').next()).unwrap();
            assert!(href.starts_with("/ops/assets/"), "{tag}");
            assets.push(href.to_string());
        }
    }
    assert!(!html.to_ascii_lowercase().contains("javascript:"));
    assets.sort();
    assert_eq!(assets, ["/ops/assets/watch.css", "/ops/assets/watch.js"]);

    // Served as the workbench's files are; the script's own imports too.
    let (_, _, script) = fetch_page(&app, "/ops/assets/watch.js").await;
    let imports: Vec<String> = script
        .split("from './")
        .skip(1)
        .map(|s| format!("/ops/assets/{}", s.split('\'').next().unwrap()))
        .collect();
    assert_eq!(imports, ["/ops/assets/live.js"]);
    for path in assets.iter().chain(&imports) {
        let (status, h, body) = fetch_page(&app, path).await;
        assert_eq!(status, 200, "{path}");
        let kind = if path.ends_with(".js") {
            "text/javascript; charset=utf-8"
        } else {
            "text/css; charset=utf-8"
        };
        assert_eq!(h["content-type"], kind, "{path}");
        assert_eq!(h["cache-control"], "no-cache", "{path}");
        assert!(body.len() > 1_000, "{path}: {} bytes", body.len());
    }
}

#[tokio::test]
async fn metrics_scrapes_share_one_backlog_query() {
    let app = TestApp::new().await;
    let before = fitorder::http::metrics::backlog_reads();
    // The FITORDER_METRICS_ADDR listener's router (outside development mode the API port does
    // not serve /metrics without FITORDER_METRICS_TOKEN).
    let metrics = fitorder::http::ops_router(app.state.clone());
    for _ in 0..20 {
        use tower::ServiceExt;
        let resp = metrics
            .clone()
            .oneshot(
                axum::http::Request::get("/metrics")
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
    }
    let queried = fitorder::http::metrics::backlog_reads() - before;
    // One for this app (other tests' apps running at the same time may add theirs).
    assert!((1..=4).contains(&queried), "{queried} backlog queries for 20 scrapes");
}

#[tokio::test]
async fn smaller_findings_notes_chain_wide_runs_and_paths() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let limited = issue_token(
        app.state.config.jwt_secret.expose_secret(),
        Role::Admin,
        "desk-1",
        Some(vec![s.store.clone()]),
        Duration::from_secs(600),
    );
    let run = "mutation { runReconciliation(provider: WECHAT_PAY, date: \"2026-11-30\") { id status error } }";
    assert_eq!(app.err_code(Some(&limited), run, json!({})).await, "FORBIDDEN");
    // The chain-wide admin may; the missing bill's error names the file, not the server's path.
    let dir = std::env::temp_dir().join(format!("fitorder-secret-dir-{}", std::process::id()));
    let app2 = TestApp::with_config(|c| c.statement_dir = dir.clone()).await;
    let r = app2.gql(Some(&app2.admin_token()), run, json!({})).await;
    let text = r.to_string();
    assert!(
        !text.contains("fitorder-secret-dir") && !text.contains("/tmp"),
        "{text}"
    );
    assert!(
        text.contains("2026-11-30") || text.contains("20261130"),
        "the file is still named: {text}"
    );
    // A ticket note of 200 KB is refused, not stored.
    let ticket: i64 = {
        use diesel_async::RunQueryDsl;
        #[derive(diesel::QueryableByName)]
        struct Id {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            id: i64,
        }
        let mut c = app.conn().await;
        diesel::sql_query(
            "INSERT INTO exception_tickets (kind, status, detail, finding_key, trace_id)
             VALUES ('UNKNOWN_ORDER', 'OPEN', '{}', 'probe-1', 't') RETURNING id",
        )
        .get_result::<Id>(&mut c)
        .await
        .unwrap()
        .id
    };
    let resolve =
        "mutation($id: ID!, $n: String) { resolveTicket(id: $id, action: NO_ACTION, note: $n) { id status note } }";
    let r = app
        .gql(
            Some(&app.ops_token()),
            resolve,
            json!({"id": ticket.to_string(), "n": "x".repeat(200 * 1024)}),
        )
        .await;
    assert_eq!(
        error_code(&r),
        "BAD_USER_INPUT",
        "{}",
        &r.to_string()[..200.min(r.to_string().len())]
    );
    let stored = app
        .sql_i64(&format!(
            "SELECT coalesce(octet_length(note), 0)::bigint AS v FROM exception_tickets WHERE id = {ticket}"
        ))
        .await;
    assert_eq!(stored, 0);
    let r = app
        .gql(
            Some(&app.ops_token()),
            resolve,
            json!({"id": ticket.to_string(), "n": "checked by phone"}),
        )
        .await;
    assert!(r.get("errors").is_none(), "{r}");
}
