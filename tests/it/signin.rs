//! Members signing in from the WeChat mini program (`signInWithWechat`, `refreshSession`,
//! `signOut`), against the independent stand-in of WeChat's mini-program API
//! (`tests/standin/wechat_miniprogram.py`, written from WeChat's documentation), through the
//! contract's own documents.

use fitorder::config::ExposeSecret;
use std::process::{Command, Stdio};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::harness::*;
use crate::ws::WsClient;

const APP_ID: &str = "wx5f0c1a2b3c4d5e6f";
const SECRET: &str = "standin-app-secret-0123456789abcdef";

/// The stand-in, killed when dropped.
pub struct WechatStandIn {
    _process: Helper,
    pub port: u16,
    http: reqwest::Client,
}

impl WechatStandIn {
    pub fn start() -> WechatStandIn {
        let script = crate::standin::root().join("tests/standin/wechat_miniprogram.py");
        let process = Helper::start(
            Command::new("python3")
                .arg(script)
                .args(["--appid", APP_ID, "--secret", SECRET])
                .stderr(Stdio::inherit()),
            "python3 (the WeChat stand-in)",
        );
        let line = process.line(std::time::Duration::from_secs(60)).unwrap_or_default();
        let port = serde_json::from_str::<Value>(&line).expect("the stand-in prints its port")["port"]
            .as_u64()
            .unwrap() as u16;
        WechatStandIn {
            _process: process,
            port,
            http: reqwest::Client::new(),
        }
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn control(&self, what: &str, body: Value) -> Value {
        self.http
            .post(format!("{}/_standin/{what}", self.base()))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// A `wx.login` code of `openid`.
    pub async fn login(&self, openid: &str) -> String {
        self.control("login", json!({"openid": openid})).await["code"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// A `getPhoneNumber` code of `phone`, given to `openid`.
    pub async fn phone(&self, phone: &str, openid: &str) -> String {
        self.control("phone", json!({"phone": phone, "openid": openid})).await["code"]
            .as_str()
            .unwrap()
            .to_string()
    }

    pub async fn busy(&self, n: u32) {
        self.control("mode", json!({"busy": n})).await;
    }

    pub async fn invalidate_tokens(&self) {
        self.control("invalidate", json!({})).await;
    }

    pub async fn stats(&self) -> Value {
        self.http
            .get(format!("{}/_standin/stats", self.base()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

fn python() -> bool {
    crate::standin::need("python3 (the WeChat mini-program stand-in)", || {
        Command::new("python3")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .map_err(|e| e.to_string())
            .and_then(|s| s.success().then_some(()).ok_or("python3 failed".into()))
    })
}

fn sign_in_config(c: &mut fitorder::config::Config, wechat: &WechatStandIn) {
    c.sign_in.app_id = Some(APP_ID.into());
    c.sign_in.secret = Some(SECRET.into());
    c.sign_in.api_base = wechat.base();
}

async fn app_with(wechat: &WechatStandIn) -> TestApp {
    TestApp::with_config(|c| sign_in_config(c, wechat)).await
}

/// The contract's `SignInWithWechat`, anonymous.
async fn sign_in(app: &TestApp, code: &str, phone_code: Option<&str>, store: Option<&str>) -> Value {
    app.gql_named(
        None,
        MEMBER_OPS,
        Some("SignInWithWechat"),
        json!({"code": code, "phoneCode": phone_code, "storeId": store}),
    )
    .await
}

async fn refresh(app: &TestApp, token: &str) -> Value {
    app.gql_named(None, MEMBER_OPS, Some("RefreshSession"), json!({"refreshToken": token}))
        .await
}

async fn sign_out(app: &TestApp, token: &str) -> Value {
    app.gql_named(None, MEMBER_OPS, Some("SignOut"), json!({"refreshToken": token}))
        .await
}

fn reason(r: &Value) -> &str {
    r["errors"][0]["extensions"]["reason"].as_str().unwrap_or_default()
}

/// `me` with an access token: the member id, or the error code.
async fn me(app: &TestApp, access: &str) -> Result<String, String> {
    let r = app.gql(Some(access), "{ me { member { id } } }", json!({})).await;
    match r["data"]["me"]["member"]["id"].as_str() {
        Some(id) => Ok(id.to_string()),
        None => Err(error_code(&r)),
    }
}

async fn phone_of(app: &TestApp, member: &str) -> String {
    app.member_view(member).await["phone"].as_str().unwrap().to_string()
}

/// A member who signed in: (member id, access token, refresh token).
async fn signed_in_member(app: &TestApp, wechat: &WechatStandIn, openid: &str) -> (String, String, String) {
    let s = app.studio(0, None, 1).await;
    let phone = phone_of(app, &s.member).await;
    let code = wechat.login(openid).await;
    let pc = wechat.phone(&phone, openid).await;
    let r = sign_in(app, &code, Some(&pc), None).await;
    assert!(r.get("errors").is_none(), "{r:#}");
    let sess = &r["data"]["signInWithWechat"];
    (
        sess["member"]["id"].as_str().unwrap().to_string(),
        sess["accessToken"].as_str().unwrap().to_string(),
        sess["refreshToken"].as_str().unwrap().to_string(),
    )
}

#[tokio::test]
async fn a_first_sign_in_binds_the_member_with_that_phone_and_later_ones_need_only_the_code() {
    if !python() {
        return;
    }
    let wechat = WechatStandIn::start();
    let app = app_with(&wechat).await;
    let s = app.studio(0, None, 1).await;
    let phone = phone_of(&app, &s.member).await;
    let openid = "oStandInUser0001";
    // Without a phone code nobody can be found for a new openid.
    let r = sign_in(&app, &wechat.login(openid).await, None, None).await;
    assert_eq!(
        (error_code(&r).as_str(), reason(&r)),
        ("BAD_USER_INPUT", "PHONE_REQUIRED"),
        "{r:#}"
    );
    let r = sign_in(
        &app,
        &wechat.login(openid).await,
        Some(&wechat.phone(&phone, openid).await),
        None,
    )
    .await;
    assert!(r.get("errors").is_none(), "{r:#}");
    let sess = &r["data"]["signInWithWechat"];
    assert_eq!(sess["member"]["id"], s.member.as_str());
    assert_eq!(sess["member"]["phone"], phone.as_str());
    assert_eq!(sess["newMember"], false);
    let access = sess["accessToken"].as_str().unwrap();
    assert_eq!(me(&app, access).await.unwrap(), s.member);
    // The token is a fitorder member token naming its session.
    let v = fitorder::auth::verify(app.state.config.jwt_secret.expose_secret(), &format!("Bearer {access}")).unwrap();
    assert_eq!(v.member_id, Some(s.member.parse().unwrap()));
    assert!(v.session.is_some());
    let exp: chrono::DateTime<chrono::Utc> = sess["accessTokenExpiresAt"].as_str().unwrap().parse().unwrap();
    let left = exp - chrono::Utc::now();
    assert!(
        left > chrono::Duration::minutes(119) && left <= chrono::Duration::hours(2),
        "{left}"
    );
    let rexp: chrono::DateTime<chrono::Utc> = sess["refreshTokenExpiresAt"].as_str().unwrap().parse().unwrap();
    assert!(rexp - chrono::Utc::now() > chrono::Duration::days(29));
    // The openid is the member's, for JSAPI payments, and bound once.
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT count(*) AS v FROM members WHERE id = {} AND wechat_open_id = '{openid}'",
            s.member
        ))
        .await,
        1
    );
    // Later: the code alone.
    let r = sign_in(&app, &wechat.login(openid).await, None, None).await;
    assert_eq!(
        r["data"]["signInWithWechat"]["member"]["id"],
        s.member.as_str(),
        "{r:#}"
    );
    // The refresh token is stored only as a hash (of its 32 random bytes; 16 bytes of tag follow).
    let refresh_token = r["data"]["signInWithWechat"]["refreshToken"].as_str().unwrap();
    assert_eq!(refresh_token.len(), 64);
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT count(*) AS v FROM refresh_tokens WHERE hash = sha256(substring(decode(translate('{refresh_token}', '-_', '+/'), 'base64') from 1 for 32))"
        ))
        .await,
        1
    );
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT count(*) AS v FROM refresh_tokens WHERE encode(hash, 'escape') LIKE '%{refresh_token}%'"
        ))
        .await,
        0
    );
}

#[tokio::test]
async fn an_unknown_phone_makes_a_member_of_the_store_given_and_none_without_one() {
    if !python() {
        return;
    }
    let wechat = WechatStandIn::start();
    let app = app_with(&wechat).await;
    let s = app.studio(0, None, 1).await;
    let openid = "oStandInNewcomer";
    let r = sign_in(
        &app,
        &wechat.login(openid).await,
        Some(&wechat.phone("13700001111", openid).await),
        None,
    )
    .await;
    assert_eq!(
        (error_code(&r).as_str(), reason(&r)),
        ("BAD_USER_INPUT", "STORE_REQUIRED"),
        "{r:#}"
    );
    let r = sign_in(
        &app,
        &wechat.login(openid).await,
        Some(&wechat.phone("13700001111", openid).await),
        Some(&s.store),
    )
    .await;
    assert!(r.get("errors").is_none(), "{r:#}");
    let sess = &r["data"]["signInWithWechat"];
    assert_eq!(sess["newMember"], true);
    assert_eq!(sess["member"]["store"]["id"], s.store.as_str());
    assert_eq!(sess["member"]["phone"], "13700001111");
    assert_ne!(sess["member"]["id"], s.member.as_str());
}

#[tokio::test]
async fn forged_reused_and_expired_codes_are_unauthenticated() {
    if !python() {
        return;
    }
    let wechat = WechatStandIn::start();
    let app = app_with(&wechat).await;
    let (_, _, _) = signed_in_member(&app, &wechat, "oStandInForged01").await;
    for forged in [
        "0a1b2c3d4e5f60718293a4b5c6d7e8f9",
        "not a code",
        "x'; DROP TABLE members; --",
        "",
    ] {
        let r = sign_in(&app, forged, None, None).await;
        assert_eq!(error_code(&r), "UNAUTHENTICATED", "{forged:?}: {r:#}");
    }
    let code = wechat.login("oStandInForged01").await;
    assert!(sign_in(&app, &code, None, None).await.get("errors").is_none());
    let r = sign_in(&app, &code, None, None).await;
    assert_eq!(error_code(&r), "UNAUTHENTICATED", "a used code: {r:#}");
    let old = wechat.login("oStandInForged01").await;
    wechat.control("expire", json!({"code": old})).await;
    assert_eq!(error_code(&sign_in(&app, &old, None, None).await), "UNAUTHENTICATED");
    // WeChat said 40029, 40163, 40029: nothing about them reaches the caller.
    let calls = wechat.stats().await["calls"].as_array().unwrap().clone();
    let codes: Vec<i64> = calls.iter().map(|c| c["errcode"].as_i64().unwrap()).collect();
    assert!(codes.contains(&40029) && codes.contains(&40163), "{codes:?}");
    // The forged texts that are no code were refused without asking WeChat.
    assert!(calls.len() < 4 + 4, "{calls:?}");
}

#[tokio::test]
async fn a_phone_code_given_to_another_user_binds_nobody() {
    if !python() {
        return;
    }
    let wechat = WechatStandIn::start();
    let app = app_with(&wechat).await;
    let s = app.studio(0, None, 1).await;
    let victim = phone_of(&app, &s.member).await;
    // The victim's phone code (given to their openid), presented with the attacker's login.
    let stolen = wechat.phone(&victim, "oStandInVictim01").await;
    let r = sign_in(&app, &wechat.login("oStandInAttacker").await, Some(&stolen), None).await;
    assert_eq!(error_code(&r), "UNAUTHENTICATED", "{r:#}");
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM wechat_bindings").await, 0);
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM member_sessions").await, 0);
}

#[tokio::test]
async fn a_refresh_token_works_once_and_presented_again_ends_the_whole_session() {
    if !python() {
        return;
    }
    let wechat = WechatStandIn::start();
    let app = app_with(&wechat).await;
    let (member, a1, r1) = signed_in_member(&app, &wechat, "oStandInRefresh1").await;
    let r = refresh(&app, &r1).await;
    assert!(r.get("errors").is_none(), "{r:#}");
    let a2 = r["data"]["refreshSession"]["accessToken"].as_str().unwrap().to_string();
    let r2 = r["data"]["refreshSession"]["refreshToken"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(r["data"]["refreshSession"]["member"]["id"], member.as_str());
    assert_ne!(r1, r2);
    assert_eq!(me(&app, &a2).await.unwrap(), member);
    assert_eq!(
        me(&app, &a1).await.unwrap(),
        member,
        "the first access token lives until it expires"
    );
    // The spent token again: refused, and the family dies with it.
    let r = refresh(&app, &r1).await;
    assert_eq!(error_code(&r), "UNAUTHENTICATED", "{r:#}");
    assert_eq!(error_code(&refresh(&app, &r2).await), "UNAUTHENTICATED");
    assert_eq!(me(&app, &a1).await.unwrap_err(), "UNAUTHENTICATED");
    assert_eq!(me(&app, &a2).await.unwrap_err(), "UNAUTHENTICATED");
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM member_sessions WHERE end_reason = 'REFRESH_REUSED'")
            .await,
        1
    );
    // A token that is not one of ours.
    assert_eq!(error_code(&refresh(&app, "forged").await), "UNAUTHENTICATED");
    assert_eq!(error_code(&refresh(&app, &"A".repeat(43)).await), "UNAUTHENTICATED");
}

#[tokio::test]
async fn a_refresh_is_at_most_two_statements_and_a_bound_sign_in_three() {
    use crate::sqlcount::{upstream_of, via, SqlCounter};
    if !python() {
        return;
    }
    let wechat = WechatStandIn::start();
    let app = app_with(&wechat).await;
    // A second instance of the app on the same database, talking through the counting proxy.
    let counter = SqlCounter::start(upstream_of(&app.db_url).unwrap()).await.unwrap();
    let counted = TestApp::on_database(&via(&app.db_url, counter.port).unwrap(), |c| {
        sign_in_config(c, &wechat);
        c.db_pool_size = 1;
    })
    .await;
    let openid = "oStandInCount001";
    let (member, _, mut token) = signed_in_member(&counted, &wechat, openid).await;
    // The first refresh and sign-in prepare their statements on the connection; then counted.
    let r = refresh(&counted, &token).await;
    token = r["data"]["refreshSession"]["refreshToken"]
        .as_str()
        .unwrap()
        .to_string();
    let r = sign_in(&counted, &wechat.login(openid).await, None, None).await;
    assert!(r.get("errors").is_none(), "{r:#}");
    let n = 3;
    let before = counter.counts();
    for _ in 0..n {
        let r = refresh(&counted, &token).await;
        assert!(r.get("errors").is_none(), "{r:#}");
        assert_eq!(r["data"]["refreshSession"]["member"]["id"], member.as_str());
        token = r["data"]["refreshSession"]["refreshToken"]
            .as_str()
            .unwrap()
            .to_string();
    }
    let refreshes = counter.counts().since(&before);
    // The token spent and the new one stored in one statement, the member (`member { id }`) in one.
    assert!(
        refreshes.all() <= 2 * n as u64 && refreshes.transaction_control == 0 && refreshes.parses == 0,
        "refreshSession: {}",
        refreshes.per(n, "refresh")
    );
    let before = counter.counts();
    for _ in 0..n {
        let r = sign_in(&counted, &wechat.login(openid).await, None, None).await;
        assert!(r.get("errors").is_none(), "{r:#}");
    }
    let sign_ins = counter.counts().since(&before);
    // A bound member's sign-in: the session opened in one statement, then the document's
    // `member { … store { … } }` in one each.
    assert!(
        sign_ins.all() <= 3 * n as u64 && sign_ins.parses == 0,
        "signInWithWechat: {}",
        sign_ins.per(n, "sign-in")
    );
}

#[tokio::test]
async fn two_presentations_of_one_refresh_token_at_once_end_the_session() {
    if !python() {
        return;
    }
    let wechat = WechatStandIn::start();
    let app = app_with(&wechat).await;
    let (_, _, r1) = signed_in_member(&app, &wechat, "oStandInRacer001").await;
    let (a, b) = tokio::join!(refresh(&app, &r1), refresh(&app, &r1));
    let won: Vec<&Value> = [&a, &b].into_iter().filter(|r| r.get("errors").is_none()).collect();
    assert!(won.len() <= 1, "one token, two new pairs: {a:#} {b:#}");
    // Whoever won, the other presentation was a reuse: nothing of the session works now.
    if let Some(w) = won.first() {
        let next = w["data"]["refreshSession"]["refreshToken"].as_str().unwrap();
        assert_eq!(error_code(&refresh(&app, next).await), "UNAUTHENTICATED");
    }
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM member_sessions WHERE ended_at IS NOT NULL")
            .await,
        1
    );
}

#[tokio::test]
async fn sign_out_ends_the_session_its_access_token_and_its_refresh_token() {
    if !python() {
        return;
    }
    let wechat = WechatStandIn::start();
    let app = app_with(&wechat).await;
    let (member, access, refresh_token) = signed_in_member(&app, &wechat, "oStandInSignOut1").await;
    // Another session of the same member is not touched.
    let other = sign_in(&app, &wechat.login("oStandInSignOut1").await, None, None).await;
    let other_access = other["data"]["signInWithWechat"]["accessToken"]
        .as_str()
        .unwrap()
        .to_string();
    let r = sign_out(&app, &refresh_token).await;
    assert_eq!(r["data"]["signOut"], true, "{r:#}");
    assert_eq!(me(&app, &access).await.unwrap_err(), "UNAUTHENTICATED");
    assert_eq!(me(&app, &other_access).await.unwrap(), member);
    assert_eq!(error_code(&refresh(&app, &refresh_token).await), "UNAUTHENTICATED");
    // Nothing left to end.
    assert_eq!(sign_out(&app, &refresh_token).await["data"]["signOut"], false);
    assert_eq!(sign_out(&app, "forged").await["data"]["signOut"], false);
}

#[tokio::test]
async fn another_instance_refuses_a_session_ended_here() {
    if !python() {
        return;
    }
    let wechat = WechatStandIn::start();
    let app = app_with(&wechat).await;
    let other = TestApp::on_database(&app.db_url, |c| sign_in_config(c, &wechat)).await;
    let (member, access, refresh_token) = signed_in_member(&app, &wechat, "oStandInCluster1").await;
    // The other instance's LISTEN connection is up once it serves the token.
    assert_eq!(me(&other, &access).await.unwrap(), member);
    assert_eq!(sign_out(&app, &refresh_token).await["data"]["signOut"], true);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match me(&other, &access).await {
            Err(code) => {
                assert_eq!(code, "UNAUTHENTICATED");
                break;
            }
            Ok(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            Ok(_) => panic!("the other instance still serves an ended session's token"),
        }
    }
    // A third instance started after the end knows it from the database.
    let late = TestApp::on_database(&app.db_url, |c| sign_in_config(c, &wechat)).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while me(&late, &access).await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "a late instance serves an ended session"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_open_websocket_of_an_ended_session_is_closed() {
    if !python() {
        return;
    }
    let wechat = WechatStandIn::start();
    let app = TestApp::served_with(|c| sign_in_config(c, &wechat)).await;
    let addr = app.state.config.public_url.trim_start_matches("http://").to_string();
    let (_, access, refresh_token) = signed_in_member(&app, &wechat, "oStandInSocket01").await;
    let mut ws = WsClient::connect(&addr, Some(&access), false).await.unwrap();
    ws.subscribe("1", "subscription { orderStatusChanged { orderNo } }", None, json!({}))
        .await;
    assert!(ws.next_message(1).await.is_none(), "the subscription runs");
    assert_eq!(sign_out(&app, &refresh_token).await["data"]["signOut"], true);
    let (code, _) = ws.close_code(5).await;
    assert_eq!(code, Some(4403));
    // And a new socket with that token is refused at connection_init.
    let refused = WsClient::connect(&addr, Some(&access), false)
        .await
        .err()
        .expect("refused");
    assert_eq!(refused.code, Some(4403));
}

/// A request from `peer` (as the server loop records it).
async fn post_from(app: &TestApp, peer: &str, body: Value) -> (StatusCode, axum::http::HeaderMap, Value) {
    let mut req = Request::post("/graphql")
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap();
    req.extensions_mut().insert(axum::extract::ConnectInfo(
        peer.parse::<std::net::SocketAddr>().unwrap(),
    ));
    let resp = app.router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, headers, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn sign_in_calls_are_rate_limited_per_address_and_per_openid() {
    if !python() {
        return;
    }
    let wechat = WechatStandIn::start();
    let app = TestApp::with_config(|c| {
        sign_in_config(c, &wechat);
        c.sign_in.rate_per_address = 3;
        c.sign_in.rate_per_openid = 2;
        c.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
    })
    .await;
    // Sign-ins WeChat is asked about count (a code it refuses, too).
    let body =
        json!({"query": MEMBER_OPS, "operationName": "SignInWithWechat", "variables": {"code": "refusedByWechat1"}});
    for _ in 0..3 {
        let (_, _, r) = post_from(&app, "203.0.113.5:4000", body.clone()).await;
        assert_eq!(error_code(&r), "UNAUTHENTICATED", "{r:#}");
    }
    let (status, headers, r) = post_from(&app, "203.0.113.5:4001", body.clone()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (error_code(&r).as_str(), reason(&r)),
        ("BAD_USER_INPUT", "RATE_LIMITED"),
        "{r:#}"
    );
    let after = r["errors"][0]["extensions"]["retryAfter"].as_u64().unwrap();
    assert!((1..=60).contains(&after), "{after}");
    assert_eq!(headers["retry-after"].to_str().unwrap(), after.to_string());
    // Another address has its own count; one behind the trusted proxy is counted as itself.
    let (_, _, r) = post_from(&app, "203.0.113.6:4000", body.clone()).await;
    assert_eq!(error_code(&r), "UNAUTHENTICATED", "{r:#}");
    let mut req = Request::post("/graphql")
        .header("content-type", "application/json")
        .header("x-forwarded-for", "203.0.113.5, 198.51.100.9")
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap();
    req.extensions_mut().insert(axum::extract::ConnectInfo(
        "10.1.1.1:80".parse::<std::net::SocketAddr>().unwrap(),
    ));
    let resp = app.router.clone().oneshot(req).await.unwrap();
    let r: Value = serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(
        error_code(&r),
        "UNAUTHENTICATED",
        "198.51.100.9 is not 203.0.113.5: {r:#}"
    );
    // Per openid: the third sign-in of one account within the minute, from anywhere.
    let (_, _, _) = signed_in_member(&app, &wechat, "oStandInLimited1").await;
    let r = sign_in(&app, &wechat.login("oStandInLimited1").await, None, None).await;
    assert!(r.get("errors").is_none(), "{r:#}");
    let r = sign_in(&app, &wechat.login("oStandInLimited1").await, None, None).await;
    assert_eq!(reason(&r), "RATE_LIMITED", "{r:#}");
}

/// Issue 34: thirty junk refreshes a minute from one address locked everyone behind it (a
/// carrier-grade or office NAT) out of refreshing, signing in and signing out.
#[tokio::test]
async fn junk_tokens_from_one_address_cost_no_budget_its_neighbours_need() {
    if !python() {
        return;
    }
    let wechat = WechatStandIn::start();
    let app = TestApp::with_config(|c| {
        sign_in_config(c, &wechat);
        c.sign_in.rate_per_address = 5;
        c.sign_in.rate_per_openid = 100;
    })
    .await;
    let nat = "198.51.100.77:5000";
    let (_, _, refresh_token) = signed_in_member(&app, &wechat, "oStandInBehindNat").await;
    // A forged token of the new form (64 characters, a tag that does not hold), junk of any
    // other length, a junk code: 40 of each from the address, none refused for the rate.
    let forged = format!("{}{}", &refresh_token[..32], "A".repeat(32));
    for junk in ["junk", forged.as_str(), &"x".repeat(300)] {
        for op in ["RefreshSession", "SignOut"] {
            let body = json!({"query": MEMBER_OPS, "operationName": op, "variables": {"refreshToken": junk}});
            for _ in 0..40 {
                let (_, _, r) = post_from(&app, nat, body.clone()).await;
                assert_ne!(reason(&r), "RATE_LIMITED", "{op} {junk}: {r:#}");
            }
        }
    }
    let junk_code =
        json!({"query": MEMBER_OPS, "operationName": "SignInWithWechat", "variables": {"code": "<script>"}});
    for _ in 0..40 {
        let (_, _, r) = post_from(&app, nat, junk_code.clone()).await;
        assert_eq!(error_code(&r), "UNAUTHENTICATED", "{r:#}");
    }
    // The neighbour's valid refresh, sign-in and sign-out from the same address all work.
    let body =
        json!({"query": MEMBER_OPS, "operationName": "RefreshSession", "variables": {"refreshToken": refresh_token}});
    let (_, _, r) = post_from(&app, nat, body).await;
    assert!(r.get("errors").is_none(), "{r:#}");
    let next = r["data"]["refreshSession"]["refreshToken"]
        .as_str()
        .unwrap()
        .to_string();
    let code = wechat.login("oStandInBehindNat").await;
    let body = json!({"query": MEMBER_OPS, "operationName": "SignInWithWechat", "variables": {"code": code}});
    let (_, _, r) = post_from(&app, nat, body).await;
    assert!(r.get("errors").is_none(), "{r:#}");
    let body = json!({"query": MEMBER_OPS, "operationName": "SignOut", "variables": {"refreshToken": next}});
    let (_, _, r) = post_from(&app, nat, body).await;
    assert_eq!(r["data"]["signOut"], true, "{r:#}");
    // Nothing of the junk reached the database: no session was ended by it.
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM member_sessions WHERE end_reason = 'REFRESH_REUSED'")
            .await,
        0
    );
}

#[tokio::test]
async fn without_a_token_only_the_sign_in_mutations_run() {
    let app = TestApp::new().await;
    // Signing in runs anonymous (not configured here: PROVIDER_UNAVAILABLE, not UNAUTHENTICATED).
    let r = app
        .gql(None, "mutation { signOut(refreshToken: \"x\") }", json!({}))
        .await;
    assert_eq!(r["data"]["signOut"], false, "{r:#}");
    let r = app
        .gql(
            None,
            "mutation { signInWithWechat(code: \"abc\") { accessToken } }",
            json!({}),
        )
        .await;
    assert_eq!(r["errors"][0]["extensions"]["reason"], "PROVIDER_UNAVAILABLE", "{r:#}");
    // Anything else is refused before it is parsed, sign-in beside it or not.
    for doc in [
        "{ me { role } }",
        "mutation { signOut(refreshToken: \"x\") createStore(input: {name: \"x\", code: \"x\"}) { id } }",
        "query Q { me { role } } mutation M { signOut(refreshToken: \"x\") }",
        "mutation { ...F } fragment F on Mutation { signOut(refreshToken: \"x\") }",
        "subscription { orderStatusChanged { orderNo } }",
        "mutation { signOut: createStore(input: {name: \"x\", code: \"x\"}) { id } }",
    ] {
        let r = app.gql(None, doc, json!({})).await;
        assert_eq!(error_code(&r), "UNAUTHENTICATED", "{doc}: {r:#}");
        assert!(r.get("data").is_none_or(|d| d.is_null()), "{doc}: {r:#}");
    }
    // In a document of several operations, the one named is what counts.
    let r = app.gql_named(None, MEMBER_OPS, Some("MyAccount"), json!({})).await;
    assert_eq!(error_code(&r), "UNAUTHENTICATED", "{r:#}");
    let r = app.gql_named(None, MEMBER_OPS, None, json!({})).await;
    assert_eq!(error_code(&r), "UNAUTHENTICATED", "{r:#}");
    let r = app
        .gql_named(None, MEMBER_OPS, Some("SignOut"), json!({"refreshToken": "x"}))
        .await;
    assert_eq!(r["data"]["signOut"], false, "{r:#}");
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM stores").await, 0);
}

#[tokio::test]
async fn concurrent_first_sign_ins_of_one_new_openid_make_one_member() {
    if !python() {
        return;
    }
    let wechat = WechatStandIn::start();
    let app = TestApp::with_config(|c| {
        sign_in_config(c, &wechat);
        c.db_pool_size = 12;
    })
    .await;
    let s = app.studio(0, None, 1).await;
    let openid = "oStandInChaos001";
    let mut calls = vec![];
    for _ in 0..8 {
        let code = wechat.login(openid).await;
        let pc = wechat.phone("13600002222", openid).await;
        calls.push((code, pc));
    }
    let runs = calls
        .iter()
        .map(|(code, pc)| sign_in(&app, code, Some(pc), Some(&s.store)));
    let answers = futures_util::future::join_all(runs).await;
    let mut members = std::collections::HashSet::new();
    let mut new = 0;
    for r in &answers {
        assert!(r.get("errors").is_none(), "{r:#}");
        members.insert(
            r["data"]["signInWithWechat"]["member"]["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        new += usize::from(r["data"]["signInWithWechat"]["newMember"] == true);
    }
    assert_eq!(members.len(), 1, "{members:?}");
    assert_eq!(new, 1);
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM members WHERE phone = '13600002222'")
            .await,
        1
    );
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM wechat_bindings").await, 1);
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM member_sessions").await, 8);
}

#[tokio::test]
async fn the_access_token_is_fetched_once_for_the_cluster_and_renewed_once_when_refused() {
    if !python() {
        return;
    }
    let wechat = WechatStandIn::start();
    let a = app_with(&wechat).await;
    let b = TestApp::on_database(&a.db_url, |c| sign_in_config(c, &wechat)).await;
    let s = a.studio(0, None, 1).await;
    let mut runs = vec![];
    for i in 0..6 {
        let openid = format!("oStandInPhone{i:03}");
        let phone = format!("1350000{i:04}");
        runs.push((wechat.login(&openid).await, wechat.phone(&phone, &openid).await, i));
    }
    let answers = futures_util::future::join_all(runs.iter().map(|(code, pc, i)| {
        let app = if i % 2 == 0 { &a } else { &b };
        sign_in(app, code, Some(pc), Some(&s.store))
    }))
    .await;
    for r in &answers {
        assert!(r.get("errors").is_none(), "{r:#}");
    }
    assert_eq!(wechat.stats().await["token_fetches"], 1, "one fetch for both instances");
    // WeChat drops the token (another fetch elsewhere, a reset): renewed once, then it works.
    wechat.invalidate_tokens().await;
    let r = sign_in(
        &b,
        &wechat.login("oStandInPhone100").await,
        Some(&wechat.phone("13500009999", "oStandInPhone100").await),
        Some(&s.store),
    )
    .await;
    assert!(r.get("errors").is_none(), "{r:#}");
    assert_eq!(wechat.stats().await["token_fetches"], 2);
    let paths: Vec<String> = wechat.stats().await["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["errcode"] == 40001)
        .map(|c| c["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(paths, vec!["/wxa/business/getuserphonenumber"]);
}

#[tokio::test]
async fn busy_is_asked_once_more_and_an_unreachable_wechat_is_provider_unavailable() {
    if !python() {
        return;
    }
    let wechat = WechatStandIn::start();
    let app = app_with(&wechat).await;
    let (member, _, _) = signed_in_member(&app, &wechat, "oStandInBusy0001").await;
    wechat.busy(1).await;
    let r = sign_in(&app, &wechat.login("oStandInBusy0001").await, None, None).await;
    assert_eq!(r["data"]["signInWithWechat"]["member"]["id"], member.as_str(), "{r:#}");
    wechat.busy(2).await;
    let r = sign_in(&app, &wechat.login("oStandInBusy0001").await, None, None).await;
    assert_eq!(
        (error_code(&r).as_str(), reason(&r)),
        ("INTERNAL", "PROVIDER_UNAVAILABLE"),
        "{r:#}"
    );
    let down = TestApp::with_config(|c| {
        sign_in_config(c, &wechat);
        c.sign_in.api_base = "http://127.0.0.1:9".into();
    })
    .await;
    let r = sign_in(&down, "0a1b2c3d4e5f60718293a4b5c6d7e8f9", None, None).await;
    assert_eq!(
        (error_code(&r).as_str(), reason(&r)),
        ("INTERNAL", "PROVIDER_UNAVAILABLE"),
        "{r:#}"
    );
    assert!(!r.to_string().contains("127.0.0.1"), "{r}");
}

#[tokio::test]
async fn a_refresh_is_at_most_two_statements() {
    use crate::sqlcount::{upstream_of, via, SqlCounter};
    if !python() {
        return;
    }
    let wechat = WechatStandIn::start();
    let app = app_with(&wechat).await;
    let (_, _, mut token) = signed_in_member(&app, &wechat, "oStandInCounted1").await;
    let counter = SqlCounter::start(upstream_of(&app.db_url).unwrap()).await.unwrap();
    let counted = TestApp::on_database(&via(&app.db_url, counter.port).unwrap(), |c| {
        sign_in_config(c, &wechat);
        c.db_pool_size = 1;
    })
    .await;
    // The first prepares the statements (and the LISTEN connection loads what it needs).
    let r = refresh(&counted, &token).await;
    token = r["data"]["refreshSession"]["refreshToken"]
        .as_str()
        .unwrap()
        .to_string();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let before = counter.counts();
    for _ in 0..5 {
        let r = refresh(&counted, &token).await;
        assert!(r.get("errors").is_none(), "{r:#}");
        token = r["data"]["refreshSession"]["refreshToken"]
            .as_str()
            .unwrap()
            .to_string();
    }
    let c = counter.counts().since(&before);
    eprintln!("refreshSession: {}", c.per(5, "refresh"));
    assert!(c.statements <= 2 * 5, "{}", c.per(5, "refresh"));
    assert_eq!(c.transaction_control, 0, "{}", c.per(5, "refresh"));
}

#[tokio::test]
async fn in_development_mode_the_sandbox_plays_wechat_so_a_demo_member_can_sign_in() {
    use fitorder::dev::sandbox_server::{miniprogram, SandboxProvider};
    let sandbox = SandboxProvider::start(crate::providers::sandbox_keys(), "127.0.0.1:0")
        .await
        .unwrap();
    let app = TestApp::with_config(|c| {
        c.sign_in.app_id = Some(miniprogram::DEV_MINIPROGRAM_APP_ID.into());
        c.sign_in.secret = Some(miniprogram::DEV_MINIPROGRAM_SECRET.into());
        c.sign_in.api_base = miniprogram::api_base(&sandbox.base_url);
    })
    .await;
    let seeded = {
        let mut c = app.conn().await;
        fitorder::dev::seed::seed(&mut c)
            .await
            .map_err(|e| e.message())
            .unwrap()
    };
    let http = reqwest::Client::new();
    let page = http
        .get(miniprogram::sign_in_page(&sandbox.base_url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("13800138001"), "{page}");
    let codes = |q: &'static str| {
        let url = format!("{}/wechat-mp/codes.json?{q}", sandbox.base_url);
        let http = http.clone();
        async move { http.get(url).send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let first = codes("openid=oDevMember0001&phone=13800138001").await;
    let r = sign_in(&app, first["code"].as_str().unwrap(), first["phoneCode"].as_str(), None).await;
    assert!(r.get("errors").is_none(), "{r:#}");
    assert_eq!(
        r["data"]["signInWithWechat"]["member"]["id"],
        seeded.member_ids[0].to_string().as_str()
    );
    // The code is spent; a new one signs in without a phone.
    let again = sign_in(&app, first["code"].as_str().unwrap(), None, None).await;
    assert_eq!(error_code(&again), "UNAUTHENTICATED");
    let next = codes("openid=oDevMember0001").await;
    let r = sign_in(&app, next["code"].as_str().unwrap(), None, None).await;
    let access = r["data"]["signInWithWechat"]["accessToken"].as_str().unwrap();
    assert_eq!(me(&app, access).await.unwrap(), seeded.member_ids[0].to_string());
}

#[tokio::test]
async fn data_cleanup_prunes_expired_refresh_tokens_and_their_sessions_only() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 1).await;
    let mut c = app.conn().await;
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut *c,
        &format!(
            "INSERT INTO member_sessions (id, member_id) VALUES (repeat('a', 32), {m}), (repeat('b', 32), {m});
             INSERT INTO refresh_tokens (hash, session_id, expires_at, spent_at) VALUES
               (sha256('old-1'), repeat('a', 32), now() - interval '3 days', now() - interval '33 days'),
               (sha256('old-2'), repeat('a', 32), now() - interval '2 days', NULL),
               (sha256('old-3'), repeat('b', 32), now() - interval '2 days', now() - interval '3 days'),
               (sha256('live'), repeat('b', 32), now() + interval '20 days', NULL);",
            m = s.member
        ),
    )
    .await
    .unwrap();
    drop(c);
    fitorder::tasks::housekeeping::data_cleanup(app.state.clone())
        .await
        .unwrap();
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM refresh_tokens").await, 1);
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM member_sessions WHERE id = repeat('b', 32)")
            .await,
        1,
        "a session with a live refresh token stays"
    );
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM member_sessions").await, 1);
}
