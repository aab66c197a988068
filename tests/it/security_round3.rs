//! Issue 34, security round 3: what a third black-box probe found. The first finding took the
//! whole process down with one anonymous 3 KB document; each test here sends the probe's
//! reproduction to one place that parses text from outside, and one runs the real binary
//! through all of them and checks that it is still there.

use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use sha2::Digest;

use crate::harness::*;
use crate::ws::WsClient;

/// The probe's document: a sign-in word in a comment (the anonymous gate let such text through
/// to the parser) and nested `[` (or `{a:`) in an argument's value. The probe's 1,500 levels
/// overflowed a worker of the release build; the test profile's frames are smaller, so the
/// tests send as many as overflow its parser on a 2 MiB stack (checked before the fix: 5,000
/// `[` and 2,000 `{a:` abort the test process; 1,500 `[` did not).
fn probe(braces: bool) -> String {
    let value = if braces {
        format!("{}1{}", "{a:".repeat(2_000), "}".repeat(2_000))
    } else {
        format!("{}1{}", "[".repeat(5_000), "]".repeat(5_000))
    };
    format!("# signOut\nquery S {{ __typename(x: {value}) }}")
}

/// JSON nested `levels` deep.
fn deep_json(levels: usize) -> String {
    format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
}

/// The answer to a document, whatever the status.
async fn post_any(app: &TestApp, token: Option<&str>, query: &str) -> Value {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("authorization", a.as_str()));
    }
    let body = serde_json::to_vec(&json!({ "query": query })).unwrap();
    let (_, _, bytes) = app.post("/graphql", &headers, body).await;
    serde_json::from_slice(&bytes).unwrap()
}

fn message(r: &Value) -> String {
    r["errors"][0]["message"].as_str().unwrap_or_default().to_string()
}

fn refused_as_nested(r: &Value, what: &str) {
    assert_eq!(error_code(r), "BAD_USER_INPUT", "{what}: {r}");
    assert!(message(r).contains("nested more than 32 deep"), "{what}: {r}");
    assert!(r["data"].is_null(), "{what}: {r}");
}

#[tokio::test]
async fn the_probe_is_refused_before_parsing_by_post_and_get_with_or_without_a_token() {
    // Development mode and public introspection: the most the anonymous gate lets through.
    let app = TestApp::with_config(|c| {
        c.dev_mode = true;
        c.public_introspection = true;
    })
    .await;
    let s = app.studio(0, None, 1).await;
    let member = app.member_token(&s.member);
    let admin = app.admin_token();
    for braces in [false, true] {
        let doc = probe(braces);
        // 10 KB of brackets, 8 KB of braces: inside every size bound.
        assert!(doc.len() < 12_000, "{}", doc.len());
        for (who, token) in [
            ("anonymous", None),
            ("member", Some(member.as_str())),
            ("admin", Some(admin.as_str())),
        ] {
            let r = app.gql(token, &doc, json!({})).await;
            refused_as_nested(&r, &format!("POST {who} braces={braces}"));
        }
        // By GET, from the URL.
        let url = format!(
            "/graphql?query={}",
            form_urlencoded::byte_serialize(doc.as_bytes()).collect::<String>()
        );
        let (status, body) = app.get(&url).await;
        let r: Value = serde_json::from_slice(&body).unwrap_or_else(|_| panic!("GET {status}: not JSON"));
        refused_as_nested(&r, "GET anonymous");
        // As introspection (the gate's other word), and in a variable's list type.
        let intro = doc.replace("# signOut", "# __schema");
        refused_as_nested(&app.gql(None, &intro, json!({})).await, "introspection");
    }
    let typed = format!(
        "mutation M($x: {}Int{}) {{ signOut(refreshToken: \"x\") }}",
        "[".repeat(5_000),
        "]".repeat(5_000)
    );
    refused_as_nested(&app.gql(None, &typed, json!({})).await, "a list type");
    // Just inside the bound, it parses (and is then refused for what it is, not crashed on).
    let inside = format!(
        "mutation M {{ signOut(refreshToken: \"x\", x: {}1{}) }}",
        "[".repeat(30),
        "]".repeat(30)
    );
    let r = app.gql(None, &inside, json!({})).await;
    assert!(!message(&r).contains("nested more than"), "{r}");
    // The server is still here and still answers.
    let r = app.gql(Some(&admin), "{ me { role } }", json!({})).await;
    assert_eq!(r["data"]["me"]["role"], "admin", "{r}");
}

#[tokio::test]
async fn deep_json_is_refused_in_variables_persisted_queries_callbacks_and_tokens() {
    let app = TestApp::new().await;
    let admin = app.admin_token();
    // Variables nested 1,500 deep: serde_json's own limit (128) refuses the body.
    let body = format!(
        r#"{{"query": "mutation {{ signOut(refreshToken: \"x\") }}", "variables": {{"x": {}}}}}"#,
        deep_json(1_500)
    );
    let (status, _, bytes) = app
        .post("/graphql", &[("content-type", "application/json")], body.into_bytes())
        .await;
    assert_eq!(status, 400);
    let r: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(error_code(&r), "BAD_USER_INPUT", "{r}");
    // A persisted query whose document is the probe: the hash holds, the bounds refuse it.
    let doc = probe(false);
    let hash = hex::encode(sha2::Sha256::digest(doc.as_bytes()));
    let body = json!({"query": doc, "extensions": {"persistedQuery": {"version": 1, "sha256Hash": hash}}});
    let auth = format!("Bearer {admin}");
    let (_, _, bytes) = app
        .post(
            "/graphql",
            &[("content-type", "application/json"), ("authorization", &auth)],
            serde_json::to_vec(&body).unwrap(),
        )
        .await;
    refused_as_nested(&serde_json::from_slice(&bytes).unwrap(), "persisted");
    // A provider's notification of deep JSON: refused as unsigned, nothing crashes.
    for path in ["/pay/wechat/notify", "/pay/alipay/notify"] {
        let (status, _, _) = app
            .post(
                path,
                &[("content-type", "application/json")],
                deep_json(1_500).into_bytes(),
            )
            .await;
        assert!(status.is_client_error() || status.is_server_error(), "{path}: {status}");
    }
    // A token whose header and claims are JSON nested 1,500 deep.
    let part = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(deep_json(1_500));
    let token = format!("{part}.{part}.c2ln");
    let r = app.gql(Some(&token), "{ me { role } }", json!({})).await;
    assert_eq!(error_code(&r), "UNAUTHENTICATED", "{r}");
    // And still answering.
    let r = app.gql(Some(&admin), "{ me { role } }", json!({})).await;
    assert_eq!(r["data"]["me"]["role"], "admin", "{r}");
}

#[tokio::test]
async fn the_probe_over_a_websocket_is_refused_and_the_connection_goes_on() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 1).await;
    let member = app.member_token(&s.member);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(fitorder::http::serve(
        listener,
        app.router.clone(),
        app.state.config.http_header_timeout,
        std::future::pending(),
    ));
    let mut ws = WsClient::connect(&addr, Some(&member), false).await.unwrap();
    let deep_subscription = format!(
        "subscription {{ orderStatusChanged(orderNo: \"x\", x: {}1{}) {{ orderNo }} }}",
        "[".repeat(5_000),
        "]".repeat(5_000)
    );
    ws.subscribe("1", &deep_subscription, None, json!({})).await;
    let r = ws.next_payload(5).await.expect("an answer");
    let r = if r.is_array() { json!({"errors": r}) } else { r };
    assert_eq!(error_code(&r), "BAD_USER_INPUT", "{r}");
    assert!(message(&r).contains("nested more than"), "{r}");
    // A member document over the member's token budget is refused the same way.
    let wide = format!(
        "subscription {{ orderStatusChanged(orderNo: \"x\", x: [{}]) {{ orderNo }} }}",
        "1 ".repeat(5_000)
    );
    ws.subscribe("2", &wide, None, json!({})).await;
    let r = ws.next_payload(5).await.expect("an answer");
    let r = if r.is_array() { json!({"errors": r}) } else { r };
    assert!(message(&r).contains("tokens"), "{r}");
    // The connection still serves.
    ws.subscribe("3", "subscription { orderStatusChanged { orderNo } }", None, json!({}))
        .await;
    let r = app.gql(Some(&app.admin_token()), "{ me { role } }", json!({})).await;
    assert_eq!(r["data"]["me"]["role"], "admin");
}

#[tokio::test]
async fn with_trusted_documents_the_probe_is_refused_before_it_is_measured_or_parsed() {
    let manifest = fitorder::config::TrustedDocuments::from_json(
        &json!({ "abc": "mutation SignOut($t: String!) { signOut(refreshToken: $t) }" }).to_string(),
    )
    .unwrap();
    let app = TestApp::with_config(|c| c.trusted_documents = Some(std::sync::Arc::new(manifest))).await;
    let s = app.studio(0, None, 1).await;
    let member = app.member_token(&s.member);
    for token in [None, Some(member.as_str())] {
        let r = post_any(&app, token, &probe(false)).await;
        assert_eq!(error_code(&r), "FORBIDDEN", "{r}");
    }
    // The manifest's own documents are bounded when it is read.
    let deep = json!({ "x": probe(false) }).to_string();
    let err = fitorder::config::TrustedDocuments::from_json(&deep).unwrap_err();
    assert!(format!("{err:#}").contains("nested more than"), "{err:#}");
}

#[tokio::test]
async fn documents_are_bounded_by_tokens_for_who_sends_them() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 1).await;
    let member = app.member_token(&s.member);
    let admin = app.admin_token();
    // The probe's three costly documents: 31,000 integers in signOut's argument (62 KB),
    // 6,000 variable definitions, 20,000 directives.
    let integers = format!(
        "mutation {{ signOut(refreshToken: \"x\", x: [{}]) }}",
        "1,".repeat(31_000)
    );
    assert!(integers.len() <= 65_536, "{}", integers.len());
    let variables: String = (0..6_000).map(|i| format!("$v{i}:I ")).collect();
    let variables = format!("mutation M({variables}) {{ signOut(refreshToken: \"x\") }}");
    let directives = format!("mutation {{ signOut(refreshToken: \"x\") {} }}", "@a ".repeat(20_000));
    for (what, doc) in [
        ("integers", &integers),
        ("variables", &variables),
        ("directives", &directives),
    ] {
        assert!(doc.len() <= 65_536, "{what}: {}", doc.len());
        // Without a token the body (over 32 KiB) is refused before its JSON is read.
        let body = serde_json::to_vec(&json!({ "query": doc })).unwrap();
        let (status, _, _) = app
            .post("/graphql", &[("content-type", "application/json")], body)
            .await;
        assert_eq!(status, 413, "{what}");
        for (who, token) in [("member", Some(member.as_str())), ("admin", Some(admin.as_str()))] {
            let r = app.gql(token, doc, json!({})).await;
            assert_eq!(error_code(&r), "BAD_USER_INPUT", "{what} {who}: {r}");
            assert!(message(&r).contains("tokens"), "{what} {who}: {r}");
        }
    }
    // Each caller's bound: 1,000 tokens without a token, 4,000 for a member, 20,000 for staff.
    let of = |n: usize| format!("mutation {{ signOut(refreshToken: \"x\", x: [{}]) }}", "1 ".repeat(n));
    let r = app.gql(None, &of(2_000), json!({})).await;
    assert!(message(&r).contains("more than 1000 tokens"), "{r}");
    let r = app.gql(Some(&member), &of(2_000), json!({})).await;
    assert!(!message(&r).contains("tokens"), "{r}");
    let r = app.gql(Some(&member), &of(5_000), json!({})).await;
    assert!(message(&r).contains("more than 4000 tokens"), "{r}");
    let r = app.gql(Some(&admin), &of(5_000), json!({})).await;
    assert!(!message(&r).contains("tokens"), "{r}");
    // The contract's sign-in documents (the whole member file, every operation in it) are
    // far inside the anonymous bound.
    let shape = fitorder::bounds::graphql_shape(
        MEMBER_OPS,
        fitorder::bounds::Shape {
            tokens: usize::MAX,
            nesting: usize::MAX,
        },
    );
    assert!(shape.tokens < 1_000 && shape.nesting < 32, "{shape:?}");
    // A body without a token is refused past 32 KiB before its JSON is read.
    let body = json!({"query": "mutation { signOut(refreshToken: \"x\") }", "variables": {"pad": "x".repeat(40_000)}});
    let (status, _, _) = app
        .post(
            "/graphql",
            &[("content-type", "application/json")],
            serde_json::to_vec(&body).unwrap(),
        )
        .await;
    assert_eq!(status, 413);
}

#[tokio::test]
async fn a_one_operation_sign_out_runs_without_operation_name() {
    let app = TestApp::new().await;
    let r = app
        .gql(None, "mutation SignOut { signOut(refreshToken: \"x\") }", json!({}))
        .await;
    assert_eq!(r["data"]["signOut"], false, "{r}");
    // Two operations still need a name, and only sign-in runs without a token.
    let two = "mutation A { signOut(refreshToken: \"x\") } mutation B { signOut(refreshToken: \"y\") }";
    assert_eq!(app.err_code(None, two, json!({})).await, "UNAUTHENTICATED");
    let r = app.gql_named(None, two, Some("B"), json!({})).await;
    assert_eq!(r["data"]["signOut"], false, "{r}");
    let mixed = "mutation SignOut { signOut(refreshToken: \"x\") } query Me { me { role } }";
    let r = app.gql_named(None, mixed, Some("Me"), json!({})).await;
    assert_eq!(error_code(&r), "UNAUTHENTICATED", "{r}");
}

/// The binary (production mode) takes the probe by every transport, and distinct documents that fail validation, and is still serving,
/// its cache of parsed documents empty of them and its memory where it was.
#[tokio::test]
async fn the_binary_survives_every_reproduction_and_keeps_no_refused_document() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 1).await;
    let secret = "round-three-probe-secret-0123456789abcdef";
    let hour = Duration::from_secs(3600);
    let member = fitorder::auth::issue_token(secret, fitorder::auth::Role::Member, &s.member, None, hour);
    let admin = fitorder::auth::issue_token(secret, fitorder::auth::Role::Admin, "1", None, hour);
    let mut server = Fitorder::serve()
        .in_own_dir()
        .env("DATABASE_URL", &app.db_url)
        .env("FITORDER_JWT_SECRET", secret)
        .env("FITORDER_METRICS_TOKEN", "probe-metrics-token")
        .env("RUST_LOG", "error")
        .spawn();
    let http = reqwest::Client::new();
    assert!(server.ready(&http, Duration::from_secs(60)).await, "{}", server.log());
    let base = server.base();
    let post = |token: Option<String>, body: Value| {
        let mut req = http.post(format!("{base}/graphql")).json(&body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    for braces in [false, true] {
        let doc = probe(braces);
        for token in [None, Some(member.clone()), Some(admin.clone())] {
            let resp = post(token, json!({"query": doc})).await.expect("an answer");
            let r: Value = resp.json().await.unwrap();
            refused_as_nested(&r, "POST");
        }
        let resp = http
            .get(format!("{base}/graphql"))
            .query(&[("query", doc.as_str())])
            .header("accept", "application/json")
            .send()
            .await
            .expect("an answer");
        refused_as_nested(&resp.json().await.unwrap(), "GET");
    }
    let mut ws = WsClient::connect(&server.addr(), Some(&member), false).await.unwrap();
    ws.subscribe("1", &probe(false).replace("query S", "subscription S"), None, json!({}))
        .await;
    let r = ws.next_payload(5).await.expect("an answer");
    assert!(r.to_string().contains("nested more than"), "{r}");
    drop(ws);
    // 200 distinct documents of a member that parse and fail validation: none is kept.
    let rss = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let kb = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap();
        kb / 1024
    };
    let before = rss(server.pid());
    let ints = "1 ".repeat(3_900);
    for i in 0..200 {
        let doc = format!("query Q{i} {{ noSuchField(x: [{ints}]) }}");
        let r: Value = post(Some(member.clone()), json!({"query": doc}))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(error_code(&r), "BAD_USER_INPUT", "{r}");
    }
    let grew = rss(server.pid()).saturating_sub(before);
    assert!(grew < 64, "memory grew by {grew} MiB");
    let metrics = || async {
        http.get(format!("{base}/metrics"))
            .bearer_auth("probe-metrics-token")
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let text = metrics().await;
    let kept = text
        .lines()
        .find_map(|l| l.strip_prefix("fitorder_graphql_documents_kept "))
        .map(|v| v.trim().parse::<f64>().unwrap())
        .unwrap_or(0.0);
    assert_eq!(kept, 0.0, "{text}");
    // A document that validates is kept (and so counted).
    let r: Value = post(Some(admin.clone()), json!({"query": "{ me { role } }"}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["data"]["me"]["role"], "admin");
    let text = metrics().await;
    assert!(text.contains("fitorder_graphql_documents_kept 1"), "{text}");
    // Still alive, still ready.
    assert!(server.alive(), "{}", server.log());
    assert!(server.ready(&http, Duration::from_secs(5)).await);
    let log = server.stop();
    assert!(!log.contains("overflowed its stack"), "{log}");
}
