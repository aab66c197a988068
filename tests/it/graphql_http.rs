//! GraphQL over HTTP as the specification (and its audit, `tests/clients/audit.test.mjs`) asks:
//! the media type `Accept` asks for, request errors as 400 without `data`, GET, persisted
//! documents and the trusted documents manifest, for each role.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sha2::Digest;
use tower::ServiceExt;

use crate::harness::*;

const GRAPHQL_RESPONSE: &str = "application/graphql-response+json";

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    text: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("{e}: {}", self.text))
    }
    fn content_type(&self) -> &str {
        self.headers
            .get("content-type")
            .map(|v| v.to_str().unwrap())
            .unwrap_or("")
    }
    fn code(&self) -> String {
        error_code(&self.json())
    }
}

async fn send(app: &TestApp, req: Request<Body>) -> Reply {
    let resp = app.router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        text: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

async fn post(app: &TestApp, token: Option<&str>, accept: Option<&str>, body: Value) -> Reply {
    let mut req = Request::post("/graphql").header("content-type", "application/json");
    if let Some(a) = accept {
        req = req.header("accept", a);
    }
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    send(app, req.body(Body::from(body.to_string())).unwrap()).await
}

async fn get(app: &TestApp, token: Option<&str>, accept: Option<&str>, params: &[(&str, &str)]) -> Reply {
    let query: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params)
        .finish();
    let mut req = Request::get(format!("/graphql?{query}"));
    if let Some(a) = accept {
        req = req.header("accept", a);
    }
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    send(app, req.body(Body::empty()).unwrap()).await
}

fn sha256_hex(text: &str) -> String {
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// Nothing of Rust's own formatting, and nothing of the document sent, in an error reply.
fn assert_clean(reply: &Reply, sent: &str) {
    for leak in ["Error(", "Error {", "rejection", "Some(", "serde", "pest", "--> ", sent] {
        assert!(!reply.text.contains(leak), "{leak:?} in {}", reply.text);
    }
}

#[tokio::test]
async fn accept_decides_the_media_type_and_a_request_that_cannot_run_is_400_without_data() {
    let app = TestApp::new().await;
    let admin = app.admin_token();
    let ok = json!({"query": "{ __typename }"});
    for (accept, want) in [
        (None, "application/json"),
        (Some("application/json"), "application/json"),
        (Some("*/*"), "application/json"),
        (Some(GRAPHQL_RESPONSE), GRAPHQL_RESPONSE),
        (
            Some("application/graphql-response+json,application/json;q=0.9"),
            GRAPHQL_RESPONSE,
        ),
    ] {
        let r = post(&app, Some(&admin), accept, ok.clone()).await;
        assert_eq!(r.status, StatusCode::OK, "{accept:?}");
        assert!(r.content_type().starts_with(want), "{accept:?}: {}", r.content_type());
        assert!(r.content_type().contains("charset=utf-8"));
        assert_eq!(r.json()["data"]["__typename"], "Query");
    }

    // Does not parse: 400 without data, a code and where; the document is not echoed.
    let broken = "{ me { secretWord( }";
    let r = post(&app, Some(&admin), Some(GRAPHQL_RESPONSE), json!({"query": broken})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.json().get("data").is_none(), "{}", r.text);
    assert_eq!(r.code(), "BAD_USER_INPUT");
    assert!(r.json()["errors"][0]["locations"][0]["line"].is_number(), "{}", r.text);
    assert_clean(&r, "secretWord");
    // The same as application/json: 200, still without data.
    let r = post(&app, Some(&admin), Some("application/json"), json!({"query": broken})).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.json().get("data").is_none(), "{}", r.text);
    assert_eq!(r.code(), "BAD_USER_INPUT");

    // Does not validate.
    let r = post(
        &app,
        Some(&admin),
        Some(GRAPHQL_RESPONSE),
        json!({"query": "{ noSuchField }"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.json().get("data").is_none());
    assert_eq!(r.code(), "BAD_USER_INPUT");
    assert!(r.json()["errors"][0]["locations"].is_array(), "{}", r.text);

    // Variables that do not coerce: a wrong type, a required one missing or null.
    let doc = "query Page($first: Int!) { orders(first: $first) { totalCount } }";
    for vars in [json!({"first": "ten"}), json!({}), json!({"first": null})] {
        let r = post(
            &app,
            Some(&admin),
            Some(GRAPHQL_RESPONSE),
            json!({"query": doc, "variables": vars}),
        )
        .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{vars}: {}", r.text);
        assert!(r.json().get("data").is_none());
        assert_eq!(r.code(), "BAD_USER_INPUT", "{}", r.text);
        let r = post(&app, Some(&admin), None, json!({"query": doc, "variables": vars})).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.code(), "BAD_USER_INPUT");
    }
    // An operation that is not in the document.
    let r = post(
        &app,
        Some(&admin),
        Some(GRAPHQL_RESPONSE),
        json!({"query": "query A { __typename }", "operationName": "B"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    // An error while running is 200 with data (null where it failed), and has its path.
    let r = post(
        &app,
        Some(&admin),
        Some(GRAPHQL_RESPONSE),
        json!({"query": r#"mutation { cancelOrder(orderNo: "FO-nope") { orderNo } }"#}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let body = r.json();
    assert!(body.get("data").is_some(), "{}", r.text);
    assert_eq!(body["errors"][0]["path"][0], "cancelOrder", "{}", r.text);
    assert_eq!(error_code(&body), "NOT_FOUND");
}

#[tokio::test]
async fn requests_that_are_not_graphql_over_http_are_refused_clearly() {
    let app = TestApp::new().await;
    let admin = app.admin_token();
    let auth = format!("Bearer {admin}");
    // No content type, or another one: 415.
    for ct in [None, Some("text/plain"), Some("application/x-www-form-urlencoded")] {
        let mut req = Request::post("/graphql").header("authorization", &auth);
        if let Some(ct) = ct {
            req = req.header("content-type", ct);
        }
        let r = send(&app, req.body(Body::from(r#"{"query":"{ __typename }"}"#)).unwrap()).await;
        assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct:?}");
        assert_eq!(r.code(), "BAD_USER_INPUT");
    }
    // A batch.
    let r = post(
        &app,
        Some(&admin),
        None,
        json!([{"query": "{ __typename }"}, {"query": "{ __typename }"}]),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.json()["errors"][0]["message"]
        .as_str()
        .unwrap()
        .contains("batched requests are not supported"));
    // Not JSON, no body, wrong parameter types, no query.
    for body in [
        "{ \"not a JSON",
        "",
        r#"{"query": 0}"#,
        r#"{"query": "{ __typename }", "variables": "x"}"#,
        r#"{"query": "{ __typename }", "operationName": false}"#,
        r#"{"query": "{ __typename }", "extensions": ["x"]}"#,
        r#"{"qeury": "{ __typename }"}"#,
    ] {
        let req = Request::post("/graphql")
            .header("authorization", &auth)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap();
        let r = send(&app, req).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(r.code(), "BAD_USER_INPUT", "{body}");
        assert_clean(&r, "qeury");
    }
    // null parameters are absent parameters.
    let r = post(
        &app,
        Some(&admin),
        Some(GRAPHQL_RESPONSE),
        json!({"query": "{ __typename }", "variables": null, "operationName": null, "extensions": null}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.json().get("errors").is_none(), "{}", r.text);
}

#[tokio::test]
async fn get_runs_queries_from_the_url_refuses_mutations_and_shows_browsers_graphiql() {
    let app = TestApp::new().await;
    let admin = app.admin_token();
    let r = get(
        &app,
        Some(&admin),
        Some("application/json"),
        &[
            (
                "query",
                "query Page($first: Int) { orders(first: $first) { totalCount } }",
            ),
            ("variables", r#"{"first": 5}"#),
            ("operationName", "Page"),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.json()["data"]["orders"]["totalCount"].is_number(), "{}", r.text);
    // No Accept at all with a query: JSON.
    let r = get(&app, Some(&admin), None, &[("query", "{ __typename }")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.content_type().starts_with("application/json"));

    let mutation = "mutation { createStore(input: {name: \"x\", code: \"GET-1\"}) { id } }";
    for accept in [Some("application/json"), Some(GRAPHQL_RESPONSE), None] {
        let r = get(&app, Some(&admin), accept, &[("query", mutation)]).await;
        assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{accept:?}: {}", r.text);
        assert_eq!(r.headers["allow"], "POST");
        assert_eq!(r.code(), "BAD_USER_INPUT");
    }
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM stores WHERE code = 'GET-1'")
            .await,
        0
    );
    // Bad URL parameters.
    let r = get(
        &app,
        Some(&admin),
        Some(GRAPHQL_RESPONSE),
        &[("query", "{ __typename }"), ("variables", "{")],
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    // A browser, even with a query in the URL, and a bare GET: the page.
    let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
    for (accept, params) in [
        (Some(browser), vec![("query", "{ __typename }")]),
        (Some(browser), vec![]),
        (None, vec![]),
    ] {
        let r = get(&app, None, accept, &params).await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(r.content_type().starts_with("text/html"), "{accept:?} {params:?}");
        assert!(r.text.contains("/graphql/assets/tabs.js"), "{}", r.text);
    }
    // JSON without a query: 400, not the page.
    let r = get(&app, Some(&admin), Some("application/json"), &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn persisted_queries_are_found_by_hash_once_sent() {
    let app = TestApp::new().await;
    let admin = app.admin_token();
    let doc = "query Count { orders(first: 1) { totalCount } }";
    let hash = sha256_hex(doc);
    let pq = json!({"persistedQuery": {"version": 1, "sha256Hash": hash}});

    // Unknown hash, no document: what Apollo's link retries on.
    for accept in [None, Some(GRAPHQL_RESPONSE)] {
        let r = post(&app, Some(&admin), accept, json!({"extensions": pq})).await;
        let body = r.json();
        assert_eq!(body["errors"][0]["message"], "PersistedQueryNotFound", "{}", r.text);
        assert_eq!(error_code(&body), "PERSISTED_QUERY_NOT_FOUND");
        assert!(body.get("data").is_none());
    }
    // A document with somebody else's hash is refused and not kept under it.
    let other = "query Other { __typename }";
    let r = post(&app, Some(&admin), None, json!({"query": other, "extensions": pq})).await;
    assert_eq!(
        r.json()["errors"][0]["message"],
        "provided sha does not match query",
        "{}",
        r.text
    );
    assert_eq!(r.code(), "BAD_USER_INPUT");
    let r = post(&app, Some(&admin), None, json!({"extensions": pq})).await;
    assert_eq!(r.code(), "PERSISTED_QUERY_NOT_FOUND");

    // Sent once with its hash: then by hash alone, over POST and GET.
    let r = post(&app, Some(&admin), None, json!({"query": doc, "extensions": pq})).await;
    assert!(r.json()["data"]["orders"]["totalCount"].is_number(), "{}", r.text);
    let r = post(&app, Some(&admin), Some(GRAPHQL_RESPONSE), json!({"extensions": pq})).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.json()["data"]["orders"]["totalCount"].is_number(), "{}", r.text);
    let r = get(
        &app,
        Some(&admin),
        Some(GRAPHQL_RESPONSE),
        &[("extensions", &pq.to_string())],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.json()["data"]["orders"]["totalCount"].is_number(), "{}", r.text);

    // A malformed persistedQuery.
    let r = post(
        &app,
        Some(&admin),
        None,
        json!({"extensions": {"persistedQuery": {"version": 2, "sha256Hash": hash}}}),
    )
    .await;
    assert_eq!(r.code(), "BAD_USER_INPUT");
    // A hash is no way around the token.
    let r = post(&app, None, None, json!({"extensions": pq})).await;
    assert_eq!(r.code(), "UNAUTHENTICATED", "{}", r.text);
}

const MANIFEST_DOC: &str = "query MyAccount { me { role subject } }";
/// A staff document no manifest holds.
const ANY_ORDERS: &str = "{ orders(first: 1) { totalCount } }";

fn manifest(extra: &[&str]) -> std::sync::Arc<fitorder::config::TrustedDocuments> {
    let mut map = serde_json::Map::new();
    for doc in std::iter::once(&MANIFEST_DOC).chain(extra) {
        map.insert(sha256_hex(doc), Value::String(doc.to_string()));
    }
    std::sync::Arc::new(fitorder::config::TrustedDocuments::from_json(&Value::Object(map).to_string()).unwrap())
}

#[tokio::test]
async fn trusted_documents_bind_members_while_staff_and_graphiql_keep_working() {
    let app = TestApp::with_config(|c| c.trusted_documents = Some(manifest(&[]))).await;
    let s = app.studio(10_000, None, 1).await;
    let member = app.member_token(&s.member);
    let admin = app.admin_token();
    let by_hash = json!({"extensions": {"persistedQuery": {"version": 1, "sha256Hash": sha256_hex(MANIFEST_DOC)}}});

    // The member app: the manifest's document by hash, and by identical text.
    let r = post(&app, Some(&member), Some(GRAPHQL_RESPONSE), by_hash.clone()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["data"]["me"]["role"], "member", "{}", r.text);
    let r = post(&app, Some(&member), None, json!({"query": MANIFEST_DOC})).await;
    assert_eq!(r.json()["data"]["me"]["role"], "member", "{}", r.text);

    // Anything else is refused before it is parsed or run, whether text or a new hash.
    let unknown = "query Mine { me { role subject member { id } } }";
    let r = post(&app, Some(&member), Some(GRAPHQL_RESPONSE), json!({"query": unknown})).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    assert_eq!(r.code(), "FORBIDDEN");
    assert!(r.json().get("data").is_none());
    let r = post(&app, Some(&member), None, json!({"query": format!("{MANIFEST_DOC} ")})).await;
    assert_eq!(r.code(), "FORBIDDEN", "one more space is another document");
    let pq = json!({"persistedQuery": {"version": 1, "sha256Hash": sha256_hex(unknown)}});
    let r = post(&app, Some(&member), None, json!({"query": unknown, "extensions": pq})).await;
    assert_eq!(r.code(), "FORBIDDEN", "{}", r.text);
    let r = post(&app, Some(&member), None, json!({"extensions": pq})).await;
    assert_eq!(
        r.code(),
        "PERSISTED_QUERY_NOT_FOUND",
        "registering it was refused: {}",
        r.text
    );
    // A manifest id with another document is a mismatch.
    let mut forged = by_hash.clone();
    forged["query"] = json!(unknown);
    let r = post(&app, Some(&member), None, forged).await;
    assert_eq!(r.code(), "BAD_USER_INPUT", "{}", r.text);

    // Staff run any document, and may register persisted queries.
    let r = post(&app, Some(&admin), None, json!({"query": unknown})).await;
    assert_eq!(r.json()["data"]["me"]["role"], "admin", "{}", r.text);
    let r = post(&app, Some(&admin), None, json!({"query": ANY_ORDERS})).await;
    assert!(r.json()["data"]["orders"]["totalCount"].is_number(), "{}", r.text);
    let r = post(&app, Some(&app.ops_token()), None, json!({"query": "{ me { role } }"})).await;
    assert_eq!(r.json()["data"]["me"]["role"], "ops", "{}", r.text);
    let r = post(&app, Some(&admin), None, json!({"query": unknown, "extensions": pq})).await;
    assert!(r.json().get("data").is_some(), "{}", r.text);

    // GraphiQL: the page, and the schema with a staff token pasted (outside development mode
    // introspection without a token is refused, manifest or not: security_round2).
    let r = get(&app, None, Some("text/html"), &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.content_type().starts_with("text/html"));
    let r = post(
        &app,
        Some(&admin),
        None,
        json!({"query": "{ __schema { queryType { name } } }"}),
    )
    .await;
    assert_eq!(r.json()["data"]["__schema"]["queryType"]["name"], "Query", "{}", r.text);
    // Without a token nothing else runs, manifest or not.
    let r = post(&app, None, None, json!({"query": MANIFEST_DOC})).await;
    assert_eq!(r.code(), "UNAUTHENTICATED", "{}", r.text);
}

#[tokio::test]
async fn trusted_documents_for_all_bind_staff_too() {
    let app = TestApp::with_config(|c| {
        c.trusted_documents = Some(manifest(&[]));
        c.trusted_documents_for = fitorder::config::TrustedDocumentsFor::All;
    })
    .await;
    let admin = app.admin_token();
    let r = post(&app, Some(&admin), None, json!({"query": ANY_ORDERS})).await;
    assert_eq!(r.code(), "FORBIDDEN", "{}", r.text);
    let r = post(&app, Some(&admin), None, json!({"query": MANIFEST_DOC})).await;
    assert_eq!(r.json()["data"]["me"]["role"], "admin", "{}", r.text);
}

#[test]
fn a_manifest_that_does_not_parse_is_refused_at_start() {
    let bad = json!({ "abc": "query { me { " }).to_string();
    let err = fitorder::config::TrustedDocuments::from_json(&bad).unwrap_err();
    assert!(format!("{err:#}").contains("abc"), "{err:#}");
    assert!(fitorder::config::TrustedDocuments::from_json("[]").is_err());
    // Relay / codegen ids may carry the algorithm.
    let ok = json!({ "sha256:ABCD": "{ __typename }" }).to_string();
    assert_eq!(
        fitorder::config::TrustedDocuments::from_json(&ok).unwrap().entries[0].0,
        "abcd"
    );
}

#[tokio::test]
async fn trusted_documents_bind_member_subscriptions_too() {
    let sub = "subscription Watch($orderNo: String!) { orderStatusChanged(orderNo: $orderNo) { orderNo toStatus } }";
    let app = TestApp::served_with(|c| c.trusted_documents = Some(manifest(&[sub, MEMBER_OPS]))).await;
    let addr = app.state.config.public_url.trim_start_matches("http://").to_string();
    let s = app.studio(100_000, None, 3).await;
    // The member app's own documents run (PlaceOrder by identical text of the manifest's).
    let order_no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WALLET")
        .await;
    let member = app.member_token(&s.member);

    let mut ws = crate::ws::WsClient::connect(&addr, Some(&member), false).await.unwrap();
    // Not in the manifest: refused with FORBIDDEN, never started.
    ws.subscribe("x", "subscription { orderStatusChanged { orderNo } }", None, json!({}))
        .await;
    let refused = ws.next_payload(5).await.expect("an answer");
    assert_eq!(refused["errors"][0]["extensions"]["code"], "FORBIDDEN", "{refused}");
    // By the manifest's id alone: the manifest's document runs.
    ws.send_raw(json!({"id": "1", "type": "subscribe", "payload": {
        "variables": {"orderNo": order_no},
        "extensions": {"persistedQuery": {"version": 1, "sha256Hash": sha256_hex(sub)}}}}))
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    app.ok(
        &app.admin_token(),
        "mutation($i: CheckInInput!) { checkIn(input: $i) { duplicate } }",
        json!({"i": {"orderNo": order_no, "consumeTxnNo": "GATE-ws-trusted-1"}}),
    )
    .await;
    let event = ws.next_payload(10).await.expect("the transition");
    assert_eq!(event["data"]["orderStatusChanged"]["orderNo"], order_no, "{event}");

    // Staff are not bound.
    let mut ops = crate::ws::WsClient::connect(&addr, Some(&app.ops_token()), false)
        .await
        .unwrap();
    ops.subscribe(
        "o",
        "subscription { orderStatusChanged { orderNo toStatus } }",
        None,
        json!({}),
    )
    .await;
    // The check-in's own event may still reach a staff subscriber that came just after it (the
    // LISTEN connection fans out late under load); what must not come is a refusal.
    let first = ops.next_payload(1).await;
    assert!(
        first.as_ref().is_none_or(|p| p.get("errors").is_none()),
        "no refusal for staff: {first:?}"
    );
}
