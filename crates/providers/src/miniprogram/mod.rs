//! WeChat's mini-program server API, for members signing in (`sessions`):
//! `GET /sns/jscode2session` (a `wx.login` code → openid, unionid), `POST
//! /wxa/business/getuserphonenumber` (a `getPhoneNumber` code → the phone), and the
//! `access_token` that call needs (`POST /cgi-bin/stable_token`), kept in the database for every
//! instance (`wechat_access_tokens`): one fetch per expiry across the cluster.
//!
//! Errors are WeChat's `errcode`s: a code it refuses (40029 invalid, 40163 used, 40226 risky
//! user) is `UNAUTHENTICATED`; 45011 (its per-user minute quota) is `RATE_LIMITED`; -1 (busy) is
//! asked once more; anything else, or no answer, is `INTERNAL` / `PROVIDER_UNAVAILABLE` with
//! the errcode in the log. The `session_key` jscode2session answers is never read into memory
//! we keep: it is not even deserialized.

use std::time::Duration;

use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncConnection, RunQueryDsl};
use serde::Deserialize;

use crate::db::sql::StaticQuery;
use crate::db::DbPool;
use crate::error::{AppError, AppResult};

/// An access token is renewed when it has less than this left.
const RENEW_BEFORE: Duration = Duration::from_secs(5 * 60);

/// What a `wx.login` code says about the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WechatUser {
    pub openid: String,
    pub unionid: Option<String>,
}

/// The client, configured by `WECHAT_MINIPROGRAM_APP_ID`, `WECHAT_MINIPROGRAM_SECRET` and
/// `WECHAT_API_BASE`.
pub struct MiniProgram {
    http: reqwest::Client,
    app_id: String,
    secret: String,
    base: String,
    pool: DbPool,
}

/// An answer's `errcode`/`errmsg` (absent or 0 on success).
#[derive(Debug, Deserialize, Default)]
struct Status {
    #[serde(default)]
    errcode: i64,
    #[serde(default)]
    errmsg: String,
}

#[derive(Debug, Deserialize)]
struct Code2Session {
    #[serde(flatten)]
    status: Status,
    openid: Option<String>,
    unionid: Option<String>,
    // `session_key` is left out on purpose: it never leaves WeChat's answer.
}

#[derive(Debug, Deserialize)]
struct Token {
    #[serde(flatten)]
    status: Status,
    access_token: Option<String>,
    expires_in: Option<i64>,
}

#[derive(Debug, Deserialize)]
struct PhoneAnswer {
    #[serde(flatten)]
    status: Status,
    phone_info: Option<PhoneInfo>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PhoneInfo {
    pure_phone_number: String,
    country_code: serde_json::Value,
    watermark: Option<Watermark>,
}

#[derive(Debug, Deserialize)]
struct Watermark {
    appid: String,
}

/// What went wrong at WeChat, before it is told to the caller.
#[derive(Debug)]
enum Failure {
    /// An `errcode` other than 0.
    Code(i64, String),
    /// No answer, or not one WeChat writes.
    Transport(String),
}

impl MiniProgram {
    pub fn new(app_id: String, secret: String, base: String, pool: DbPool) -> MiniProgram {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("an HTTP client without custom TLS builds");
        MiniProgram {
            http,
            app_id,
            secret,
            base: base.trim_end_matches('/').to_string(),
            pool,
        }
    }

    pub fn app_id(&self) -> &str {
        &self.app_id
    }

    /// `GET /sns/jscode2session`: the user a `wx.login` code belongs to.
    pub async fn code_to_user(&self, code: &str) -> AppResult<WechatUser> {
        if !plausible_code(code) {
            return Err(AppError::Unauthenticated("WeChat refused the sign-in code".into()));
        }
        let url = format!("{}/sns/jscode2session", self.base);
        let query = [
            ("appid", self.app_id.as_str()),
            ("secret", self.secret.as_str()),
            ("js_code", code),
            ("grant_type", "authorization_code"),
        ];
        let answer: Code2Session = self
            .twice_if_busy(|| async {
                let a: Code2Session = self.json(self.http.get(&url).query(&query)).await?;
                match a.status.errcode {
                    0 => Ok(a),
                    c => Err(Failure::Code(c, a.status.errmsg)),
                }
            })
            .await
            .map_err(|f| told("jscode2session", f, "sign-in code"))?;
        let openid = answer
            .openid
            .filter(|o| plausible_id(o))
            .ok_or_else(|| AppError::ProviderUnavailable("WeChat's answer has no openid".into()))?;
        Ok(WechatUser {
            openid,
            unionid: answer.unionid.filter(|u| plausible_id(u)),
        })
    }

    /// `POST /wxa/business/getuserphonenumber`: the phone of a `getPhoneNumber` code, which
    /// WeChat checks was given to `openid` (the code of another user is refused). Answers the
    /// number as members keep it: the bare number for +86, `+<country><number>` otherwise.
    pub async fn phone_number(&self, phone_code: &str, openid: &str) -> AppResult<String> {
        if !plausible_code(phone_code) {
            return Err(AppError::Unauthenticated("WeChat refused the phone code".into()));
        }
        let body = serde_json::json!({"code": phone_code, "openid": openid});
        let mut stale: Option<String> = None;
        for _ in 0..2 {
            let token = self.access_token(stale.as_deref()).await?;
            let url = format!("{}/wxa/business/getuserphonenumber", self.base);
            let r = self
                .twice_if_busy(|| async {
                    let a: PhoneAnswer = self
                        .json(
                            self.http
                                .post(&url)
                                .query(&[("access_token", token.as_str())])
                                .json(&body),
                        )
                        .await?;
                    match a.status.errcode {
                        0 => Ok(a),
                        c => Err(Failure::Code(c, a.status.errmsg)),
                    }
                })
                .await;
            match r {
                Ok(a) => return self.phone_of(a),
                // The token was invalidated (another fetch, a reset): renew once, ask again.
                Err(Failure::Code(40001 | 42001, _)) if stale.is_none() => stale = Some(token),
                Err(f) => return Err(told("getuserphonenumber", f, "phone code")),
            }
        }
        Err(AppError::ProviderUnavailable(
            "WeChat refused a freshly fetched access_token".into(),
        ))
    }

    fn phone_of(&self, a: PhoneAnswer) -> AppResult<String> {
        let info = a
            .phone_info
            .ok_or_else(|| AppError::ProviderUnavailable("WeChat's answer has no phone_info".into()))?;
        if info.watermark.as_ref().is_some_and(|w| w.appid != self.app_id) {
            tracing::warn!("getuserphonenumber answered for another appid");
            return Err(AppError::ProviderUnavailable(
                "WeChat answered for another mini program".into(),
            ));
        }
        let country = match &info.country_code {
            serde_json::Value::String(s) => s.trim().trim_start_matches('+').to_string(),
            serde_json::Value::Number(n) => n.to_string(),
            _ => String::new(),
        };
        let pure = info.pure_phone_number.trim();
        let phone = if country.is_empty() || country == "86" {
            pure.to_string()
        } else {
            format!("+{country}{pure}")
        };
        let digits = phone.trim_start_matches('+');
        if !(5..=20).contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(AppError::ProviderUnavailable("WeChat's phone number is not one".into()));
        }
        Ok(phone)
    }

    /// The mini program's access_token: the one in the database while it has more than
    /// [`RENEW_BEFORE`] left (and is not `stale`, the one WeChat just refused); otherwise the
    /// instance holding the row's lock fetches a new one and the others wait for it and read it.
    async fn access_token(&self, stale: Option<&str>) -> AppResult<String> {
        #[derive(diesel::QueryableByName)]
        struct Held {
            #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
            token: Option<String>,
        }
        let mut conn = self.pool.get().await?;
        let fresh: Option<Held> = StaticQuery::new(include_str!("token_fresh.sql"))
            .bind::<Text, _>(&self.app_id) // $1
            .bind::<BigInt, _>(RENEW_BEFORE.as_secs() as i64) // $2
            .get_result(&mut conn)
            .await
            .optional_row()?;
        if let Some(t) = fresh.and_then(|h| h.token).filter(|t| Some(t.as_str()) != stale) {
            return Ok(t);
        }
        StaticQuery::new(include_str!("token_row.sql"))
            .bind::<Text, _>(&self.app_id) // $1
            .execute(&mut conn)
            .await?;
        conn.transaction(async |conn| -> AppResult<String> {
            let held: Held = StaticQuery::new(include_str!("token_lock.sql"))
                .bind::<Text, _>(&self.app_id) // $1
                .bind::<BigInt, _>(RENEW_BEFORE.as_secs() as i64) // $2
                .get_result(conn)
                .await?;
            if let Some(t) = held.token.filter(|t| Some(t.as_str()) != stale) {
                return Ok(t);
            }
            let (token, expires_in) = self.fetch_token(stale.is_some()).await?;
            StaticQuery::new(include_str!("token_store.sql"))
                .bind::<Text, _>(&self.app_id) // $1
                .bind::<Text, _>(&token) // $2
                .bind::<BigInt, _>(expires_in) // $3
                .execute(conn)
                .await?;
            metrics::counter!("fitorder_wechat_access_token_fetches_total").increment(1);
            Ok(token)
        })
        .await
    }

    /// `POST /cgi-bin/stable_token` (`force_refresh` when WeChat refused the one we hold).
    async fn fetch_token(&self, force: bool) -> AppResult<(String, i64)> {
        let url = format!("{}/cgi-bin/stable_token", self.base);
        let body = serde_json::json!({
            "grant_type": "client_credential",
            "appid": self.app_id,
            "secret": self.secret,
            "force_refresh": force,
        });
        let a: Token = self
            .twice_if_busy(|| async {
                let a: Token = self.json(self.http.post(&url).json(&body)).await?;
                match a.status.errcode {
                    0 => Ok(a),
                    c => Err(Failure::Code(c, a.status.errmsg)),
                }
            })
            .await
            .map_err(|f| told("stable_token", f, "access_token"))?;
        match (a.access_token, a.expires_in) {
            (Some(t), Some(e)) if !t.is_empty() && e > 0 => Ok((t, e)),
            _ => Err(AppError::ProviderUnavailable(
                "WeChat's token answer is incomplete".into(),
            )),
        }
    }

    /// One call; WeChat's "system busy" (-1) is asked once more.
    async fn twice_if_busy<T, F, Fut>(&self, call: F) -> Result<T, Failure>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, Failure>>,
    {
        match call().await {
            Err(Failure::Code(-1, _)) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                call().await
            }
            other => other,
        }
    }

    async fn json<T: serde::de::DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> Result<T, Failure> {
        let resp = req
            .send()
            .await
            .map_err(|e| Failure::Transport(e.without_url().to_string()))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| Failure::Transport(e.without_url().to_string()))?;
        if !status.is_success() {
            return Err(Failure::Transport(format!("HTTP {status}")));
        }
        serde_json::from_slice(&bytes).map_err(|_| Failure::Transport("an answer that is not WeChat's JSON".into()))
    }
}

/// What the caller is told of a failure at WeChat; the errcode and errmsg go to the log.
fn told(api: &str, f: Failure, what: &str) -> AppError {
    match f {
        Failure::Code(code @ (40029 | 40163 | 40226), msg) if what != "access_token" => {
            tracing::info!(api, errcode = code, errmsg = %msg, "WeChat refused a {what}");
            AppError::Unauthenticated(format!("WeChat refused the {what}"))
        }
        Failure::Code(45011, msg) => {
            tracing::warn!(api, errcode = 45011, errmsg = %msg, "WeChat's rate limit");
            AppError::rate_limited("sign-ins at WeChat", Duration::from_secs(60))
        }
        Failure::Code(code, msg) => {
            tracing::warn!(api, errcode = code, errmsg = %msg, "WeChat answered an error");
            AppError::ProviderUnavailable(format!("WeChat answered errcode {code}"))
        }
        Failure::Transport(why) => {
            tracing::warn!(api, error = %why, "WeChat unreachable");
            AppError::ProviderUnavailable("WeChat could not be reached; try again".into())
        }
    }
}

/// A code as wx.login and getPhoneNumber hand them out: short printable ASCII. Anything else
/// is refused without asking WeChat.
pub fn plausible_code(code: &str) -> bool {
    (1..=128).contains(&code.len())
        && code
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// An openid or unionid: letters, digits, `-`, `_` (what `wechat_bindings` allows).
fn plausible_id(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

trait OptionalRow<T> {
    fn optional_row(self) -> AppResult<Option<T>>;
}

impl<T> OptionalRow<T> for Result<T, diesel::result::Error> {
    fn optional_row(self) -> AppResult<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(diesel::result::Error::NotFound) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}
