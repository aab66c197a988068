//! Development mode: the sandbox also plays WeChat's mini-program server API, so that a member
//! can sign in on `cargo run` without a mini program. `GET {base}/wechat-mp/` is a small
//! sign-in page standing in for the phone: it hands out a `wx.login` code for an openid and a
//! `getPhoneNumber` code for a phone (the demo members' phones are listed), to paste into the
//! contract's `SignInWithWechat` in GraphiQL. Under the same prefix: `GET /sns/jscode2session`,
//! `POST /cgi-bin/stable_token`, `GET /cgi-bin/token`, `POST /wxa/business/getuserphonenumber`,
//! answering as WeChat documents them (codes used once, 5 minutes; 40029, 40163, 40001).
//! `GET /wechat-mp/codes.json?openid=&phone=` hands out the same codes to scripts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{alnum, html_escape};

/// The mini program's appid and AppSecret in development mode.
pub const DEV_MINIPROGRAM_APP_ID: &str = crate::devkeys::DEV_WECHAT_APP_ID;
pub const DEV_MINIPROGRAM_SECRET: &str = "dev-miniprogram-app-secret-not-for-production";

/// The demo members' phones (`seed`), offered on the sign-in page.
const DEMO_PHONES: [(&str, &str); 4] = [
    ("Li Na", "13800138001"),
    ("Wang Fang", "13800138002"),
    ("Zhang Wei", "13800138003"),
    ("Chen Jie", "13900139001"),
];

const CODE_LIFETIME: Duration = Duration::from_secs(300);

struct Code {
    subject: String,
    /// The openid a phone code was given to (for a login code: none).
    openid: Option<String>,
    at: Instant,
    used: bool,
}

#[derive(Default)]
struct Mp {
    login: HashMap<String, Code>,
    phone: HashMap<String, Code>,
    token: Option<(String, Instant)>,
}

type Shared = Arc<Mutex<Mp>>;

pub(super) fn router() -> Router {
    Router::new()
        .route("/", get(page))
        .route("/codes", get(codes_page))
        .route("/codes.json", get(codes_json))
        .route("/sns/jscode2session", get(jscode2session))
        .route("/cgi-bin/stable_token", post(stable_token))
        .route("/cgi-bin/token", get(token))
        .route("/wxa/business/getuserphonenumber", post(phone_number))
        .with_state(Shared::default())
}

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Mp> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

fn err(code: i64, msg: &str) -> Json<Value> {
    Json(json!({"errcode": code, "errmsg": msg}))
}

#[derive(Deserialize)]
struct Ask {
    openid: Option<String>,
    phone: Option<String>,
}

fn plausible(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Codes for an openid (and a phone): `(code, phoneCode)`.
fn hand_out(s: &Shared, ask: &Ask) -> Result<(String, Option<String>, String), String> {
    let openid = ask.openid.clone().unwrap_or_else(|| "oDevMember0001".into());
    if !plausible(&openid) {
        return Err("an openid is 1 to 64 letters, digits, - or _".into());
    }
    let phone = ask.phone.as_deref().map(str::trim).filter(|p| !p.is_empty());
    if phone.is_some_and(|p| !(5..=20).contains(&p.len()) || !p.bytes().all(|b| b.is_ascii_digit())) {
        return Err("a phone is 5 to 20 digits".into());
    }
    let mut mp = lock(s);
    let code = alnum(32);
    mp.login.insert(
        code.clone(),
        Code {
            subject: openid.clone(),
            openid: None,
            at: Instant::now(),
            used: false,
        },
    );
    let phone_code = phone.map(|p| {
        let c = alnum(64);
        mp.phone.insert(
            c.clone(),
            Code {
                subject: p.to_string(),
                openid: Some(openid.clone()),
                at: Instant::now(),
                used: false,
            },
        );
        c
    });
    Ok((code, phone_code, openid))
}

async fn codes_json(State(s): State<Shared>, Query(ask): Query<Ask>) -> Response {
    match hand_out(&s, &ask) {
        Ok((code, phone_code, openid)) => {
            Json(json!({"openid": openid, "code": code, "phoneCode": phone_code})).into_response()
        }
        Err(why) => (axum::http::StatusCode::BAD_REQUEST, why).into_response(),
    }
}

fn html(body: &str) -> Response {
    let page = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>WeChat sign-in (sandbox)</title></head>\
         <body style=\"font-family:system-ui,sans-serif;max-width:40rem;margin:2rem auto;padding:0 1rem\">{body}</body></html>"
    );
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
            ),
        ],
        page,
    )
        .into_response()
}

async fn page() -> Response {
    let mut rows = String::new();
    for (i, (name, phone)) in DEMO_PHONES.iter().enumerate() {
        rows.push_str(&format!(
            "<li><a href=\"codes?openid=oDevMember{n:04}&amp;phone={phone}\">{name}</a> ({phone}, openid oDevMember{n:04})</li>",
            n = i + 1,
            name = html_escape(name),
        ));
    }
    html(&format!(
        "<h1>Sign in with WeChat (sandbox)</h1>\
         <p>This page stands in for the member's phone: it hands out what <code>wx.login</code> and the \
         <code>getPhoneNumber</code> button would. Paste them into <code>SignInWithWechat</code> in GraphiQL \
         (no Authorization header needed). A code works once, for 5 minutes.</p>\
         <h2>A demo member</h2><ul>{rows}</ul>\
         <h2>Someone else</h2>\
         <form action=\"codes\" method=\"get\"><p><label>openid <input name=\"openid\" value=\"oDevNewcomer01\"></label></p>\
         <p><label>phone <input name=\"phone\" value=\"13700000001\"></label> (leave empty for a returning member)</p>\
         <p><button>Hand out codes</button></p></form>\
         <p>A new phone needs <code>storeId</code> (the demo stores are 1 and 2).</p>"
    ))
}

async fn codes_page(State(s): State<Shared>, Query(ask): Query<Ask>) -> Response {
    match hand_out(&s, &ask) {
        Ok((code, phone_code, openid)) => {
            let vars = json!({"code": code, "phoneCode": phone_code, "storeId": "1"});
            html(&format!(
                "<h1>Codes for {openid}</h1><p>wx.login code: <code id=\"code\">{code}</code></p>\
                 <p>getPhoneNumber code: <code id=\"phoneCode\">{pc}</code></p>\
                 <p>Variables for <code>SignInWithWechat</code>:</p><pre id=\"variables\">{vars}</pre>\
                 <p>Then use the answer's <code>accessToken</code> as <code>Authorization: Bearer …</code>; \
                 <code>RefreshSession</code> takes the <code>refreshToken</code>.</p><p><a href=\"./\">back</a></p>",
                openid = html_escape(&openid),
                pc = html_escape(phone_code.as_deref().unwrap_or("(none)")),
                vars = html_escape(&vars.to_string()),
            ))
        }
        Err(why) => html(&format!("<p>{}</p><p><a href=\"./\">back</a></p>", html_escape(&why))),
    }
}

#[derive(Deserialize)]
struct LoginQuery {
    appid: Option<String>,
    secret: Option<String>,
    js_code: Option<String>,
    grant_type: Option<String>,
}

async fn jscode2session(State(s): State<Shared>, Query(q): Query<LoginQuery>) -> Json<Value> {
    if q.appid.as_deref() != Some(DEV_MINIPROGRAM_APP_ID) {
        return err(40013, "invalid appid");
    }
    if q.secret.as_deref() != Some(DEV_MINIPROGRAM_SECRET) {
        return err(40125, "invalid appsecret");
    }
    if q.grant_type.as_deref() != Some("authorization_code") {
        return err(40002, "invalid grant_type");
    }
    let mut mp = lock(&s);
    match mp.login.get_mut(q.js_code.as_deref().unwrap_or_default()) {
        Some(c) if c.at.elapsed() <= CODE_LIFETIME && c.used => err(40163, "code been used"),
        Some(c) if c.at.elapsed() <= CODE_LIFETIME => {
            c.used = true;
            Json(json!({"openid": c.subject, "session_key": alnum(24)}))
        }
        _ => err(40029, "invalid code"),
    }
}

fn new_token(mp: &mut Mp) -> Value {
    let t = alnum(100);
    mp.token = Some((t.clone(), Instant::now() + Duration::from_secs(7200)));
    json!({"access_token": t, "expires_in": 7200})
}

fn credentials_ok(appid: Option<&str>, secret: Option<&str>) -> Option<Json<Value>> {
    if appid != Some(DEV_MINIPROGRAM_APP_ID) {
        return Some(err(40013, "invalid appid"));
    }
    if secret != Some(DEV_MINIPROGRAM_SECRET) {
        return Some(err(40125, "invalid appsecret"));
    }
    None
}

async fn stable_token(State(s): State<Shared>, Json(body): Json<Value>) -> Json<Value> {
    if let Some(refused) = credentials_ok(body["appid"].as_str(), body["secret"].as_str()) {
        return refused;
    }
    let mut mp = lock(&s);
    let force = body["force_refresh"].as_bool().unwrap_or(false);
    match &mp.token {
        Some((t, until)) if !force && *until > Instant::now() => {
            let left = until.saturating_duration_since(Instant::now()).as_secs();
            Json(json!({"access_token": t, "expires_in": left}))
        }
        _ => Json(new_token(&mut mp)),
    }
}

async fn token(State(s): State<Shared>, Query(q): Query<LoginQuery>) -> Json<Value> {
    if let Some(refused) = credentials_ok(q.appid.as_deref(), q.secret.as_deref()) {
        return refused;
    }
    Json(new_token(&mut lock(&s)))
}

#[derive(Deserialize)]
struct TokenQuery {
    access_token: Option<String>,
}

async fn phone_number(State(s): State<Shared>, Query(q): Query<TokenQuery>, Json(body): Json<Value>) -> Json<Value> {
    let mut mp = lock(&s);
    let valid = matches!(
        (&mp.token, q.access_token.as_deref()),
        (Some((t, until)), Some(given)) if t == given && *until > Instant::now()
    );
    if !valid {
        return err(40001, "invalid credential, access_token is invalid or not latest");
    }
    let openid = body["openid"].as_str().map(str::to_string);
    match mp.phone.get_mut(body["code"].as_str().unwrap_or_default()) {
        Some(c) if !c.used && c.at.elapsed() <= CODE_LIFETIME && (openid.is_none() || openid == c.openid) => {
            c.used = true;
            Json(json!({"errcode": 0, "errmsg": "ok", "phone_info": {
                "phoneNumber": c.subject, "purePhoneNumber": c.subject, "countryCode": "86",
                "watermark": {"timestamp": chrono::Utc::now().timestamp(), "appid": DEV_MINIPROGRAM_APP_ID}}}))
        }
        _ => err(40029, "invalid code"),
    }
}

/// The sign-in page's address for a sandbox at `base_url`.
pub fn sign_in_page(base_url: &str) -> String {
    format!("{base_url}/wechat-mp/")
}

/// WECHAT_API_BASE for a sandbox at `base_url`.
pub fn api_base(base_url: &str) -> String {
    format!("{base_url}/wechat-mp")
}
