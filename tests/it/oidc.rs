//! Staff tokens from an OpenID Connect issuer, against a real one: the npm `oidc-provider`
//! (OpenID Certified), started by each test from tests/oidc/issuer.mjs (pinned in
//! tests/oidc/package-lock.json), issuing RS256 and ES256 JWT access tokens through the
//! client_credentials grant. fitorder is configured with that issuer on loopback and finds its
//! keys itself (discovery, `jwks_uri`). Tokens the issuer would never make (expired, another
//! issuer, alg confusion, …) are made beside it with jose, the provider's own JOSE library,
//! with its current private key.

use std::io::Write;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fitorder::config::oidc::OidcConfig;
use serde_json::{json, Value};

use crate::harness::{error_code, free_port, Helper, TestApp};
use crate::standin::{need, root};
use crate::ws::WsClient;

const AUDIENCE: &str = "https://fitorder.test/api";
const OTHER_AUDIENCE: &str = "https://other.test/api";
const ME: &str = "query { me { role subject } }";
const MEMBER: &str = "query($id: ID!) { member(id: $id) { id } }";

fn issuer_installed() -> Result<(), String> {
    Command::new("node")
        .arg("--version")
        .output()
        .map_err(|e| format!("node: {e}"))?;
    let pkg = root().join("tests/oidc/node_modules/oidc-provider/package.json");
    std::fs::metadata(&pkg).map_err(|_| format!("{} is missing: (cd tests/oidc && npm ci)", pkg.display()))?;
    Ok(())
}

/// The running oidc-provider; ends with the test (its standard input closes).
struct Issuer {
    process: Helper,
    stdin: Option<ChildStdin>,
    url: String,
    http: reqwest::Client,
}

/// One client of the issuer: signs its tokens with `alg`, carries `role` and `stores`.
fn client(id: &str, alg: &str, role: &str, stores: Option<Vec<String>>) -> Value {
    json!({"client_id": id, "client_secret": format!("{id}-secret-0123456789abcdefghijklmnop"),
           "alg": alg, "role": role, "stores": stores})
}

impl Issuer {
    fn start(port: u16, clients: Vec<Value>) -> Issuer {
        let dir = crate::standin::scratch_dir("oidc-issuer");
        let input = dir.join("input.json");
        std::fs::write(
            &input,
            serde_json::to_vec(
                &json!({"port": port, "audience": AUDIENCE, "other_audience": OTHER_AUDIENCE,
                                       "role_claim": "role", "stores_claim": "stores", "clients": clients}),
            )
            .unwrap(),
        )
        .unwrap();
        let mut process = Helper::start(
            Command::new("node")
                .arg(root().join("tests/oidc/issuer.mjs"))
                .arg(&input)
                .current_dir(root().join("tests/oidc"))
                .stdin(Stdio::piped())
                .stderr(Stdio::null()),
            "node (the issuer)",
        );
        let mut issuer = Issuer {
            stdin: process.stdin(),
            process,
            url: String::new(),
            http: reqwest::Client::new(),
        };
        let hello = issuer.line();
        issuer.url = hello["issuer"].as_str().unwrap().to_string();
        issuer
    }

    /// The next JSON line the issuer prints (others are skipped).
    fn line(&self) -> Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self.process.line(left).expect("the issuer answers within 30 s");
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                return v;
            }
        }
    }

    /// An access token from the token endpoint (client_credentials, client_secret_basic).
    async fn token(&self, client_id: &str, resource: &str) -> String {
        let r = self
            .http
            .post(format!("{}/token", self.url))
            .basic_auth(
                client_id,
                Some(format!("{client_id}-secret-0123456789abcdefghijklmnop")),
            )
            .form(&[("grant_type", "client_credentials"), ("resource", resource)])
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        assert!(status.is_success(), "token endpoint: {status} {body}");
        assert_eq!(body["token_type"], "Bearer", "{body}");
        body["access_token"].as_str().unwrap().to_string()
    }

    async fn forge(&self, kind: &str, kid: Option<&str>, claims: Value) -> String {
        let r: Value = self
            .http
            .post(format!("{}/test/forge", self.url))
            .json(&json!({"kind": kind, "kid": kid, "claims": claims}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["token"].as_str().unwrap().to_string()
    }

    /// How often fitorder asked for the key set so far.
    async fn jwks_fetches(&self) -> u64 {
        let r: Value = self
            .http
            .get(format!("{}/test/stats", self.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["jwks"].as_u64().unwrap()
    }

    /// New signing keys, published before the old ones; their kids.
    fn rotate(&mut self) -> Value {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(b"rotate\n").unwrap();
        stdin.flush().unwrap();
        self.line()["rotated"].clone()
    }

    /// Claims as the issuer writes them, for tokens made beside it.
    fn claims(&self, role: &str) -> Value {
        let now = chrono::Utc::now().timestamp();
        json!({"iss": self.url, "aud": AUDIENCE, "sub": "desk-7", "iat": now, "exp": now + 600, "role": role})
    }
}

impl Drop for Issuer {
    fn drop(&mut self) {
        drop(self.stdin.take());
        self.process.kill();
    }
}

/// An app that trusts the issuer at `port` (not started yet: its clients need the stores).
async fn app_trusting(port: u16, cooldown: Option<Duration>) -> TestApp {
    TestApp::served_with(|c| {
        let mut o = OidcConfig::new(&format!("http://127.0.0.1:{port}"), AUDIENCE).unwrap();
        if let Some(d) = cooldown {
            o.refetch_cooldown = d;
        }
        c.oidc = Some(o);
    })
    .await
}

async fn me(app: &TestApp, token: &str) -> Value {
    app.gql(Some(token), ME, json!({})).await
}

fn addr(app: &TestApp) -> String {
    app.state.config.public_url.trim_start_matches("http://").to_string()
}

#[tokio::test]
async fn rs256_and_es256_staff_tokens_of_the_issuer_sign_in_with_their_role_and_stores() {
    if !need(
        "the OpenID Connect issuer (npm oidc-provider in tests/oidc)",
        issuer_installed,
    ) {
        return;
    }
    let port = free_port();
    let app = app_trusting(port, None).await;
    let one = app.studio(0, None, 1).await;
    let two = app.studio(0, None, 1).await;
    let issuer = Issuer::start(
        port,
        vec![
            client("console-rs", "RS256", "admin", None),
            client("desk-es", "ES256", "admin", Some(vec![one.store.clone()])),
            client("watch-es", "ES256", "ops", None),
        ],
    );
    let head = app.token(fitorder::auth::Role::Admin, "staff-1");

    // RS256, an admin of every store.
    let rs = issuer.token("console-rs", AUDIENCE).await;
    assert!(rs.starts_with("eyJhbGciOiJSUzI1NiIs"), "an RS256 token: {rs}");
    let r = me(&app, &rs).await;
    assert_eq!(
        r["data"]["me"],
        json!({"role": "admin", "subject": "console-rs"}),
        "{r}"
    );
    for m in [&one.member, &two.member] {
        let r = app.ok(&rs, MEMBER, json!({"id": m})).await;
        assert_eq!(r["member"]["id"], json!(m));
    }

    // ES256, an admin limited to store one: sees its member, not store two's, and may not
    // create a member there.
    let es = issuer.token("desk-es", AUDIENCE).await;
    assert!(es.starts_with("eyJhbGciOiJFUzI1NiIs"), "an ES256 token: {es}");
    assert_eq!(me(&app, &es).await["data"]["me"]["role"], "admin");
    assert_eq!(
        app.ok(&es, MEMBER, json!({"id": one.member})).await["member"]["id"],
        json!(one.member)
    );
    assert_eq!(
        app.ok(&es, MEMBER, json!({"id": two.member})).await["member"],
        json!(null)
    );
    let create = "mutation($i: CreateMemberInput!) { createMember(input: $i) { id } }";
    let r = app
        .gql(
            Some(&es),
            create,
            json!({"i": {"storeId": two.store, "name": "x", "phone": "13000000077"}}),
        )
        .await;
    assert_eq!(error_code(&r), "FORBIDDEN", "{r}");

    // ops: reads, may not do what only admins do.
    let ops = issuer.token("watch-es", AUDIENCE).await;
    assert_eq!(me(&app, &ops).await["data"]["me"]["role"], "ops");
    let r = app
        .gql(
            Some(&ops),
            create,
            json!({"i": {"storeId": one.store, "name": "x", "phone": "13000000078"}}),
        )
        .await;
    assert_eq!(error_code(&r), "FORBIDDEN", "{r}");

    // fitorder's own HS256 tokens keep working beside the issuer's.
    assert_eq!(me(&app, &head).await["data"]["me"]["role"], "admin");

    // Over WebSocket: the issuer's token in connection_init is accepted, a refused one closes
    // the connection with 4403.
    let mut ws = WsClient::connect(&addr(&app), Some(&ops), false)
        .await
        .expect("an ops token of the issuer is acknowledged");
    ws.subscribe("1", ME, None, json!({})).await;
    let got = ws.next_payload(10).await.expect("an answer over the socket");
    assert_eq!(got["data"]["me"]["role"], "ops", "{got}");
    let none = issuer.forge("none", None, issuer.claims("ops")).await;
    let refused = WsClient::connect(&addr(&app), Some(&none), false).await;
    assert_eq!(refused.err().and_then(|c| c.code), Some(4403));
}

#[tokio::test]
async fn tokens_of_another_audience_issuer_role_time_or_algorithm_are_refused() {
    if !need(
        "the OpenID Connect issuer (npm oidc-provider in tests/oidc)",
        issuer_installed,
    ) {
        return;
    }
    let port = free_port();
    let app = app_trusting(port, None).await;
    let issuer = Issuer::start(
        port,
        vec![
            client("console-rs", "RS256", "admin", None),
            client("member-es", "ES256", "member", None),
            client("cashier-rs", "RS256", "cashier", None),
        ],
    );
    let now = chrono::Utc::now().timestamp();
    let good = issuer.claims("admin");
    let with = |k: &str, v: Value| {
        let mut c = good.clone();
        c[k] = v;
        c
    };
    let without = |k: &str| {
        let mut c = good.clone();
        c.as_object_mut().unwrap().remove(k);
        c
    };
    // The control: what the issuer's key signs with these claims is accepted (so each refusal
    // below is for the one thing changed).
    for alg in ["RS256", "ES256"] {
        let t = issuer.forge(alg, None, good.clone()).await;
        assert_eq!(me(&app, &t).await["data"]["me"]["role"], "admin", "{alg}");
    }
    // What, why it is refused (the caller's message), the token.
    let cases: Vec<(&str, &str, String)> = vec![
        // Real tokens of the issuer that are not for us.
        (
            "another audience",
            "not meant for this service",
            issuer.token("console-rs", OTHER_AUDIENCE).await,
        ),
        (
            "a member role",
            "no staff role",
            issuer.token("member-es", AUDIENCE).await,
        ),
        (
            "a role fitorder has not",
            "no staff role",
            issuer.token("cashier-rs", AUDIENCE).await,
        ),
        // Made beside it with its own key.
        (
            "another issuer",
            "not from the configured issuer",
            issuer
                .forge("RS256", None, with("iss", json!("https://id.other.example")))
                .await,
        ),
        (
            "the issuer with a trailing slash",
            "not from the configured issuer",
            issuer
                .forge("ES256", None, with("iss", json!(format!("{}/", issuer.url))))
                .await,
        ),
        (
            "no aud",
            "lacks a required claim",
            issuer.forge("RS256", None, without("aud")).await,
        ),
        (
            "no iss",
            "lacks a required claim",
            issuer.forge("RS256", None, without("iss")).await,
        ),
        (
            "no exp",
            "lacks a required claim",
            issuer.forge("ES256", None, without("exp")).await,
        ),
        (
            "no role",
            "no staff role",
            issuer.forge("ES256", None, without("role")).await,
        ),
        (
            "expired",
            "has expired",
            issuer.forge("RS256", None, with("exp", json!(now - 120))).await,
        ),
        (
            "not yet valid",
            "not valid yet",
            issuer.forge("ES256", None, with("nbf", json!(now + 600))).await,
        ),
        (
            "stores that are not ids",
            "must be store ids",
            issuer.forge("RS256", None, with("stores", json!(["01"]))).await,
        ),
        // Issue 34: `null` read every store; fitorder's own tokens refuse it, so does this.
        (
            "stores: null",
            "stores claim is null",
            issuer.forge("RS256", None, with("stores", json!(null))).await,
        ),
        // Algorithm confusion: HS256 keyed with the issuer's public key, and no signature.
        (
            "HS256 with the public key",
            "signature is not valid",
            issuer.forge("hs256-public", None, good.clone()).await,
        ),
        (
            "alg none",
            "not a valid HS256 JWT",
            issuer.forge("none", None, good.clone()).await,
        ),
        // The right kid, another key.
        (
            "a key not the issuer's",
            "signature is not valid",
            issuer.forge("foreign", None, good.clone()).await,
        ),
    ];
    for (what, why, token) in cases {
        let r = me(&app, &token).await;
        assert_eq!(error_code(&r), "UNAUTHENTICATED", "{what}: {r}");
        let message = r["errors"][0]["message"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{what}: refused for another reason: {r}");
        assert!(r["data"].is_null() || r["data"]["me"].is_null(), "{what}: {r}");
    }
}

#[tokio::test]
async fn a_key_rotated_in_mid_run_is_fetched_and_accepted() {
    if !need(
        "the OpenID Connect issuer (npm oidc-provider in tests/oidc)",
        issuer_installed,
    ) {
        return;
    }
    let port = free_port();
    let cooldown = Duration::from_millis(1500);
    let app = app_trusting(port, Some(cooldown)).await;
    let mut issuer = Issuer::start(
        port,
        vec![
            client("console-rs", "RS256", "admin", None),
            client("watch-es", "ES256", "ops", None),
        ],
    );
    let old_rs = issuer.token("console-rs", AUDIENCE).await;
    let old_es = issuer.token("watch-es", AUDIENCE).await;
    assert_eq!(me(&app, &old_rs).await["data"]["me"]["role"], "admin");
    assert_eq!(me(&app, &old_es).await["data"]["me"]["role"], "ops");
    assert_eq!(issuer.jwks_fetches().await, 1, "one fetch serves both keys");

    let kids = issuer.rotate();
    tokio::time::sleep(cooldown + Duration::from_millis(200)).await;
    let new_rs = issuer.token("console-rs", AUDIENCE).await;
    let new_es = issuer.token("watch-es", AUDIENCE).await;
    let kid = |t: &str| jsonwebtoken::decode_header(t).unwrap().kid.unwrap();
    assert_eq!(kid(&new_rs), kids["RS256"].as_str().unwrap());
    assert_eq!(kid(&new_es), kids["ES256"].as_str().unwrap());
    assert_ne!(kid(&new_rs), kid(&old_rs));
    assert_eq!(me(&app, &new_rs).await["data"]["me"]["role"], "admin");
    assert_eq!(me(&app, &new_es).await["data"]["me"]["role"], "ops");
    assert_eq!(issuer.jwks_fetches().await, 2, "the new kid made one fetch");
    // The old keys are still published: their tokens still pass, with no fetch.
    assert_eq!(me(&app, &old_rs).await["data"]["me"]["role"], "admin");
    assert_eq!(issuer.jwks_fetches().await, 2);
}

#[tokio::test]
async fn a_flood_of_made_up_kids_costs_one_fetch_per_cooldown() {
    if !need(
        "the OpenID Connect issuer (npm oidc-provider in tests/oidc)",
        issuer_installed,
    ) {
        return;
    }
    let port = free_port();
    let cooldown = Duration::from_secs(3);
    let app = app_trusting(port, Some(cooldown)).await;
    let issuer = Issuer::start(port, vec![client("console-rs", "RS256", "admin", None)]);
    // Made first (a foreign key takes the issuer a moment to generate): the cooldown counts
    // from the fetch below.
    let mut forged = vec![];
    for i in 0..40 {
        let kind = if i % 2 == 0 { "foreign" } else { "ES256" };
        forged.push(
            issuer
                .forge(kind, Some(&format!("made-up-{i}")), issuer.claims("admin"))
                .await,
        );
    }
    let real = issuer.token("console-rs", AUDIENCE).await;
    assert_eq!(me(&app, &real).await["data"]["me"]["role"], "admin");
    assert_eq!(issuer.jwks_fetches().await, 1);
    // Within the cooldown of the first fetch: none at all.
    for t in &forged[..10] {
        assert_eq!(error_code(&me(&app, t).await), "UNAUTHENTICATED");
    }
    assert_eq!(
        issuer.jwks_fetches().await,
        1,
        "made-up kids within the cooldown fetch nothing"
    );
    // After it, thirty at once: one fetch between them.
    tokio::time::sleep(cooldown + Duration::from_millis(200)).await;
    let answers = futures_util::future::join_all(forged[10..].iter().map(|t| me(&app, t))).await;
    for r in answers {
        assert_eq!(error_code(&r), "UNAUTHENTICATED", "{r}");
    }
    assert_eq!(issuer.jwks_fetches().await, 2, "thirty unknown kids at once: one fetch");
    // The real key still works, with no fetch.
    assert_eq!(me(&app, &real).await["data"]["me"]["role"], "admin");
    assert_eq!(issuer.jwks_fetches().await, 2);
}

/// A discovery document served from loopback, written from OpenID Connect Discovery 1.0 (not
/// oidc-provider: what a misconfigured or hostile issuer might answer); counts key-set requests.
/// It listens on every interface: `doc` gets the loopback base URL and the port.
async fn discovery_standin(doc: impl Fn(&str, u16) -> Value + Send + Sync + 'static) -> (String, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let base = format!("http://127.0.0.1:{port}");
    let jwks = Arc::new(AtomicU64::new(0));
    let counted = jwks.clone();
    let body = doc(&base, port);
    let router = axum::Router::new()
        .route(
            "/.well-known/openid-configuration",
            axum::routing::get(move || {
                let body = body.clone();
                async move { axum::Json(body) }
            }),
        )
        .route(
            "/jwks",
            axum::routing::get(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { axum::Json(json!({"keys": []})) }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (base, jwks)
}

/// A token whose header says RS256 (its signature is never reached).
fn rs256_looking_token(kid: &str) -> String {
    use base64::Engine;
    let b64 = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    format!(
        "{}.{}.c2ln",
        b64(json!({"alg": "RS256", "kid": kid})),
        b64(json!({"sub": "x", "role": "admin"}))
    )
}

#[tokio::test]
async fn an_issuer_whose_discovery_names_another_issuer_or_plain_http_keys_is_not_trusted() {
    // The document names another issuer (OpenID Connect Discovery 1.0 §4.3: it must be the one
    // asked): its key set is never fetched.
    let (base, jwks) = discovery_standin(
        |base, _| json!({"issuer": "https://id.elsewhere.example", "jwks_uri": format!("{base}/jwks")}),
    )
    .await;
    let app = TestApp::with_config(|c| c.oidc = Some(OidcConfig::new(&base, AUDIENCE).unwrap())).await;
    let r = me(&app, &rs256_looking_token("k1")).await;
    assert_eq!(error_code(&r), "UNAUTHENTICATED", "{r}");
    assert_eq!(
        jwks.load(Ordering::SeqCst),
        0,
        "keys of an issuer that is not ours were fetched"
    );

    // Keys over plain HTTP off loopback are not taken: the stand-in's own key set at this
    // machine's network address (when it has one) is never asked.
    let outward = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.1:9").and_then(|_| s.local_addr()))
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified());
    let host = outward.map_or("keys.example.invalid".to_string(), |ip| ip.to_string());
    let (base, jwks) =
        discovery_standin(move |base, port| json!({"issuer": base, "jwks_uri": format!("http://{host}:{port}/jwks")}))
            .await;
    let app = TestApp::with_config(|c| c.oidc = Some(OidcConfig::new(&base, AUDIENCE).unwrap())).await;
    let r = me(&app, &rs256_looking_token("k1")).await;
    assert_eq!(error_code(&r), "UNAUTHENTICATED", "{r}");
    assert_eq!(
        jwks.load(Ordering::SeqCst),
        0,
        "keys were fetched over plain HTTP off loopback"
    );

    // The control: the same stand-in with a consistent document is asked for its keys.
    let (base, jwks) = discovery_standin(|base, _| json!({"issuer": base, "jwks_uri": format!("{base}/jwks")})).await;
    let app = TestApp::with_config(|c| c.oidc = Some(OidcConfig::new(&base, AUDIENCE).unwrap())).await;
    let r = me(&app, &rs256_looking_token("k1")).await;
    assert_eq!(error_code(&r), "UNAUTHENTICATED", "{r}");
    assert_eq!(jwks.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_unreachable_issuer_refuses_its_tokens_at_once_and_fitorders_own_still_pass() {
    let port = free_port();
    let app = app_trusting(port, None).await;
    let started = std::time::Instant::now();
    let r = me(&app, &rs256_looking_token("k1")).await;
    assert_eq!(error_code(&r), "UNAUTHENTICATED", "{r}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    let own = app.token(fitorder::auth::Role::Ops, "ops-1");
    assert_eq!(me(&app, &own).await["data"]["me"]["role"], "ops");
}
