//! Members signing in from the WeChat mini program, and their sessions.
//!
//! `signInWithWechat`: the `wx.login` code is exchanged at WeChat for the openid
//! (`miniprogram`); a member bound to it gets a new session. A first sign-in needs the
//! `getPhoneNumber` code: the openid is bound to the member with that phone or, with a store,
//! to a new member of it. Two first sign-ins of one openid take turns on a transaction lock
//! keyed by the openid, and the unique keys of `wechat_bindings` hold either way: one member.
//!
//! A session answers an access token (HS256, role `member`, `sub`, `exp`, `sid`) and a refresh
//! token: 256 random bits, of which only the SHA-256 is stored, and a tag (HMAC-SHA256 of the
//! bits under the JWT secret, 128 bits), so that a token this service did not make is refused
//! without a query and without costing any address's budget: a flood of junk from behind one
//! NAT does not lock its neighbours out. Tokens of 32 bytes without a tag (made before tags)
//! are still taken, under a per-address budget of their own, until they expire. `refreshSession` spends it for a
//! new pair in one statement; a spent one presented again ends the whole session, as a stolen
//! one would be (OAuth 2.0 Security BCP, refresh token rotation with reuse detection). An ended
//! session's access tokens are refused on their next use: every instance keeps the ended
//! sessions (`events::EndedSessions`, fed by NOTIFY), WebSockets of it are closed.

use crate::config::ExposeSecret;
use std::net::IpAddr;

use base64::Engine;
use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Bool, Bytea, Nullable, Text, Timestamptz};
use diesel_async::{AsyncConnection, RunQueryDsl};
use sha2::{Digest, Sha256};

use crate::app::AppState;
use crate::db::models::Member;
use crate::db::sql::StaticQuery;
use crate::domain::Refusal;
use crate::error::{AppError, AppResult, OnViolation, Violation};

/// What a sign-in or a refresh answers.
#[derive(Debug, Clone)]
pub struct Session {
    pub access_token: String,
    pub access_token_expires_at: DateTime<Utc>,
    pub refresh_token: String,
    pub refresh_token_expires_at: DateTime<Utc>,
    pub new_member: bool,
    pub member_id: i64,
}

/// A new refresh token: its text (given out once) and the hash that is stored.
struct RefreshToken {
    text: String,
    hash: Vec<u8>,
}

/// The bytes of a refresh token's tag.
const TAG_BYTES: usize = 16;

/// The tag of a refresh token's random bits: HMAC-SHA256 under the JWT secret, truncated.
fn tag(secret: &str, bits: &[u8]) -> hmac::Hmac<Sha256> {
    use hmac::Mac;
    let mut mac = <hmac::Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    mac.update(b"fitorder refresh token\0");
    mac.update(bits);
    mac
}

fn new_refresh_token(secret: &str) -> RefreshToken {
    use hmac::Mac;
    use rand::Rng;
    let bits: [u8; 32] = rand::rng().random();
    let mut token = bits.to_vec();
    token.extend_from_slice(&tag(secret, &bits).finalize().into_bytes()[..TAG_BYTES]);
    RefreshToken {
        text: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token),
        hash: Sha256::digest(bits).to_vec(),
    }
}

/// What a presented refresh token is.
#[derive(Debug, PartialEq, Eq)]
enum Presented {
    /// One this service made (its tag holds): the stored hash to look up.
    Tagged(Vec<u8>),
    /// 32 bytes without a tag, as tokens were made before tags: looked up under a budget.
    Untagged(Vec<u8>),
    /// Not a token this service could have made: refused without a query or a budget.
    NotOne,
}

/// Reads a presented refresh token (64 characters of URL-safe base64 for 32 bytes and their
/// tag; 43 for an untagged one).
fn presented(secret: &str, text: &str) -> Presented {
    use hmac::Mac;
    let decode = |t: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(t).ok();
    match text.len() {
        64 => match decode(text) {
            Some(b) if b.len() == 32 + TAG_BYTES => {
                let (bits, given) = b.split_at(32);
                match tag(secret, bits).verify_truncated_left(given) {
                    Ok(()) => Presented::Tagged(Sha256::digest(bits).to_vec()),
                    Err(_) => Presented::NotOne,
                }
            }
            _ => Presented::NotOne,
        },
        43 => match decode(text) {
            Some(bits) if bits.len() == 32 => Presented::Untagged(Sha256::digest(&bits).to_vec()),
            _ => Presented::NotOne,
        },
        _ => Presented::NotOne,
    }
}

/// The stored hash of a presented refresh token, when it is worth a query: a tagged one, or an
/// untagged one within its address's budget (`Err`: that budget is spent). `None`: not a token.
fn worth_a_query(state: &AppState, addr: Option<IpAddr>, text: &str) -> AppResult<Option<Vec<u8>>> {
    match presented(state.config.jwt_secret.expose_secret(), text) {
        Presented::Tagged(hash) => Ok(Some(hash)),
        Presented::Untagged(hash) => {
            state
                .sign_in_limits
                .untagged_per_address
                .check(&address_key(addr))
                .map_err(|wait| AppError::rate_limited("refresh tokens of the old form from this address", wait))?;
            Ok(Some(hash))
        }
        Presented::NotOne => Ok(None),
    }
}

fn new_session_id() -> String {
    use rand::Rng;
    let bits: [u8; 16] = rand::rng().random();
    hex::encode(bits)
}

/// The key the per-address limit counts under: the address, an IPv6 one by its /64 (one
/// subscriber's whole prefix); every caller whose address is unknown shares one key.
fn address_key(addr: Option<IpAddr>) -> String {
    match addr {
        Some(IpAddr::V4(v4)) => v4.to_string(),
        Some(IpAddr::V6(v6)) => {
            let s = v6.segments();
            format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
        }
        None => "unknown".into(),
    }
}

/// Counts a sign-in of `addr` (one that asks WeChat) against the per-address limit.
pub fn limit_address(state: &AppState, addr: Option<IpAddr>) -> AppResult<()> {
    state
        .sign_in_limits
        .per_address
        .check(&address_key(addr))
        .map_err(|wait| AppError::rate_limited("sign-in attempts from this address", wait))
}

fn ttl_secs(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 4)
}

#[derive(diesel::QueryableByName)]
struct Opened {
    #[diesel(sql_type = BigInt)]
    member_id: i64,
    #[diesel(sql_type = Timestamptz)]
    expires_at: DateTime<Utc>,
}

/// `signInWithWechat`.
pub async fn sign_in_with_wechat(
    state: &AppState,
    addr: Option<IpAddr>,
    code: &str,
    phone_code: Option<&str>,
    store_id: Option<i64>,
) -> AppResult<Session> {
    // A code that cannot be one is refused before it costs a budget or a call to WeChat.
    if !crate::miniprogram::plausible_code(code.trim()) {
        return Err(AppError::Unauthenticated("WeChat refused the sign-in code".into()));
    }
    limit_address(state, addr)?;
    let wechat = state
        .miniprogram
        .as_ref()
        .ok_or_else(|| AppError::ProviderUnavailable("signing in with WeChat is not configured here".into()))?;
    let user = wechat.code_to_user(code.trim()).await?;
    state
        .sign_in_limits
        .per_openid
        .check(&user.openid)
        .map_err(|wait| AppError::rate_limited("sign-ins of this WeChat account", wait))?;
    let sid = new_session_id();
    let refresh = new_refresh_token(state.config.jwt_secret.expose_secret());
    let ttl = ttl_secs(state.config.sign_in.refresh_token_ttl);
    let mut conn = state.pool.get().await?;
    // A member bound to this account: one statement.
    if let Some(opened) = open_bound(&mut conn, &user.openid, user.unionid.as_deref(), &sid, &refresh, ttl).await? {
        return Ok(session(state, opened, sid, refresh, false));
    }
    let phone_code = phone_code.map(str::trim).filter(|c| !c.is_empty()).ok_or_else(|| {
        AppError::refused(
            Refusal::PhoneRequired,
            "a first sign-in needs phoneCode (getPhoneNumber)",
        )
    })?;
    drop(conn);
    let phone = wechat.phone_number(phone_code, &user.openid).await?;
    let mut conn = state.pool.get().await?;
    let (opened, new_member) = conn
        .transaction(async |conn| -> AppResult<(Opened, bool)> {
            // First sign-ins of one openid take turns here; the loser finds the winner's binding.
            StaticQuery::new("SELECT 1 AS one FROM pg_advisory_xact_lock(26, hashtext($1))")
                .bind::<Text, _>(&user.openid)
                .execute(conn)
                .await?;
            if let Some(o) = open_bound(conn, &user.openid, user.unionid.as_deref(), &sid, &refresh, ttl).await? {
                return Ok((o, false));
            }
            let found: Option<Member> = StaticQuery::new(include_str!("by_phone.sql"))
                .bind::<Text, _>(&phone) // $1
                .bind::<Nullable<BigInt>, _>(store_id) // $2
                .get_result(conn)
                .await
                .map(Some)
                .or_else(|e| match e {
                    diesel::result::Error::NotFound => Ok(None),
                    e => Err(AppError::from(e)),
                })?;
            let (member, new_member) = match (found, store_id) {
                (Some(m), _) => (m, false),
                (None, Some(store)) => (
                    crate::catalog::create_member(conn, store, &new_member_name(&phone), &phone).await?,
                    true,
                ),
                (None, None) => {
                    return Err(AppError::refused(
                        Refusal::StoreRequired,
                        "no member has this phone: storeId names the store a new member joins",
                    ))
                }
            };
            StaticQuery::new(include_str!("bind.sql"))
                .bind::<Text, _>(&user.openid) // $1
                .bind::<Nullable<Text>, _>(user.unionid.as_deref()) // $2
                .bind::<BigInt, _>(member.id) // $3
                .execute(conn)
                .await
                .on_violation(|v| match v {
                    Violation::Unique("wechat_bindings_one_per_member") => Some(AppError::Conflict(
                        "the member with this phone is bound to another WeChat account".into(),
                    )),
                    Violation::Unique("wechat_bindings_unionid_key") => Some(AppError::Conflict(
                        "this WeChat account is bound to another member".into(),
                    )),
                    _ => None,
                })?;
            let opened = open_bound(conn, &user.openid, user.unionid.as_deref(), &sid, &refresh, ttl)
                .await?
                .ok_or_else(|| AppError::internal("a binding just made is not found"))?;
            Ok((opened, new_member))
        })
        .await?;
    if new_member {
        tracing::info!(member_id = opened.member_id, "new member signed up through WeChat");
    }
    Ok(session(state, opened, sid, refresh, new_member))
}

/// A new member's name until they change it: "WeChat member" and the phone's last four digits.
fn new_member_name(phone: &str) -> String {
    let tail: String = phone
        .chars()
        .rev()
        .take(4)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("WeChat member {tail}")
}

async fn open_bound(
    conn: &mut diesel_async::AsyncPgConnection,
    openid: &str,
    unionid: Option<&str>,
    sid: &str,
    refresh: &RefreshToken,
    ttl: i64,
) -> AppResult<Option<Opened>> {
    let r: Result<Opened, _> = StaticQuery::new(include_str!("bound.sql"))
        .bind::<Text, _>(openid) // $1
        .bind::<Nullable<Text>, _>(unionid) // $2
        .bind::<Text, _>(sid) // $3
        .bind::<Bytea, _>(&refresh.hash) // $4
        .bind::<BigInt, _>(ttl) // $5
        .get_result(conn)
        .await;
    match r {
        Ok(o) => Ok(Some(o)),
        Err(diesel::result::Error::NotFound) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn session(state: &AppState, opened: Opened, sid: String, refresh: RefreshToken, new_member: bool) -> Session {
    let access_ttl = ttl_secs(state.config.sign_in.access_token_ttl);
    let exp = Utc::now().timestamp() + access_ttl;
    Session {
        access_token: crate::auth::issue_session_token(
            state.config.jwt_secret.expose_secret(),
            opened.member_id,
            &sid,
            exp,
        ),
        access_token_expires_at: DateTime::from_timestamp(exp, 0).unwrap_or_else(Utc::now),
        refresh_token: refresh.text,
        refresh_token_expires_at: opened.expires_at,
        new_member,
        member_id: opened.member_id,
    }
}

#[derive(diesel::QueryableByName)]
struct Refreshed {
    #[diesel(sql_type = Text)]
    session_id: String,
    #[diesel(sql_type = BigInt)]
    member_id: i64,
    #[diesel(sql_type = Bool)]
    was_spent: bool,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    refresh_expires_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Bool)]
    reused: bool,
}

/// `refreshSession`: one statement.
pub async fn refresh(state: &AppState, addr: Option<IpAddr>, presented: &str) -> AppResult<Session> {
    let refused = || AppError::Unauthenticated("the refresh token is not valid: sign in again".into());
    let hash = worth_a_query(state, addr, presented.trim())?.ok_or_else(refused)?;
    let next = new_refresh_token(state.config.jwt_secret.expose_secret());
    let mut conn = state.pool.get().await?;
    let row: Option<Refreshed> = StaticQuery::new(include_str!("refresh.sql"))
        .bind::<Bytea, _>(&hash) // $1
        .bind::<Bytea, _>(&next.hash) // $2
        .bind::<BigInt, _>(ttl_secs(state.config.sign_in.refresh_token_ttl)) // $3
        .get_result(&mut conn)
        .await
        .map(Some)
        .or_else(|e| match e {
            diesel::result::Error::NotFound => Ok(None),
            e => Err(AppError::from(e)),
        })?;
    drop(conn);
    let Some(row) = row else {
        return Err(refused());
    };
    if row.reused {
        // This instance refuses the session's access tokens at once; the others on NOTIFY.
        state.events.ended_sessions.insert(&row.session_id);
        tracing::warn!(
            member_id = row.member_id,
            session = %row.session_id,
            "a spent refresh token was presented again: the session is ended (stolen token?)"
        );
        metrics::counter!("fitorder_refresh_token_reuse_total").increment(1);
    } else if row.was_spent {
        tracing::warn!(
            member_id = row.member_id,
            "a spent refresh token of an ended session was presented again"
        );
    }
    match row.refresh_expires_at {
        Some(expires_at) => Ok(session(
            state,
            Opened {
                member_id: row.member_id,
                expires_at,
            },
            row.session_id,
            next,
            false,
        )),
        None => Err(refused()),
    }
}

#[derive(diesel::QueryableByName)]
struct Ended {
    #[diesel(sql_type = Text)]
    id: String,
}

/// `signOut`: ends the session of `presented` (true), or finds nothing to end (false).
pub async fn sign_out(state: &AppState, addr: Option<IpAddr>, presented: &str) -> AppResult<bool> {
    let Some(hash) = worth_a_query(state, addr, presented.trim())? else {
        return Ok(false);
    };
    let mut conn = state.pool.get().await?;
    let ended: Vec<Ended> = StaticQuery::new(include_str!("sign_out.sql"))
        .bind::<Bytea, _>(&hash) // $1
        .load(&mut conn)
        .await?;
    for e in &ended {
        state.events.ended_sessions.insert(&e.id);
    }
    Ok(!ended.is_empty())
}

#[derive(diesel::QueryableByName)]
struct Pruned {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Refresh tokens expired for a day, and the sessions left without one (`data:cleanup`).
pub async fn prune(conn: &mut diesel_async::AsyncPgConnection) -> AppResult<i64> {
    let r: Pruned = StaticQuery::new(include_str!("prune.sql"))
        .bind::<BigInt, _>(10_000_i64) // $1
        .get_result(conn)
        .await?;
    Ok(r.n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refresh_token_is_known_for_ours_by_its_tag_alone() {
        let secret = "test-secret-not-for-production-0123456789";
        let t = new_refresh_token(secret);
        assert_eq!(t.text.len(), 64);
        assert_eq!(presented(secret, &t.text), Presented::Tagged(t.hash.clone()));
        // Under another secret, or with one character changed, it is not ours.
        assert_eq!(presented("another-secret", &t.text), Presented::NotOne);
        let mut forged = t.text.clone().into_bytes();
        forged[63] = if forged[63] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            presented(secret, std::str::from_utf8(&forged).unwrap()),
            Presented::NotOne
        );
        let mut forged = t.text.clone().into_bytes();
        forged[0] = if forged[0] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            presented(secret, std::str::from_utf8(&forged).unwrap()),
            Presented::NotOne
        );
        // The old form, 32 bytes without a tag, is looked up (under a budget of its own).
        let old = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([7u8; 32]);
        assert_eq!(
            presented(secret, &old),
            Presented::Untagged(Sha256::digest([7u8; 32]).to_vec())
        );
        for junk in ["", "x", "junk", &"A".repeat(44), &"!".repeat(64), &"A".repeat(200)] {
            assert_eq!(presented(secret, junk), Presented::NotOne, "{junk}");
        }
    }
}
