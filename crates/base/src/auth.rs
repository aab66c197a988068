//! Who is calling: HS256 JWTs with `sub`, `role`, `exp` and an optional `stores` list; and
//! what of the stored rows they see ([`Viewer::scope`], written once here for every query,
//! row check and subscription).

use diesel::dsl;
use diesel::query_dsl::methods::FilterDsl;
use diesel::sql_types::BigInt;
use diesel::{Expression, ExpressionMethods};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::domain::Actor;
use crate::error::{AppError, AppResult};

pub mod oidc;

crate::domain::vocabulary::vocabulary! {
    /// Who a token's `role` claim says its caller is: a member (signed in through the mini
    /// program), staff of the admin console, or ops.
    pub enum Role {
        Member = "member",
        Admin = "admin",
        Ops = "ops",
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub role: String,
    pub exp: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stores: Option<Vec<String>>,
    /// A signed-in member's session (`sessions`): refused once the session has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sid: Option<String>,
}

/// What of the stored rows a caller sees ([`Viewer::scope`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// A member: their own rows (orders, memberships, themselves) and nothing of staff's.
    Own(i64),
    /// An admin limited to some stores (the token's `stores` claim): those stores' rows.
    Stores(&'a [i64]),
    /// Chain-wide staff: an admin without a `stores` claim, ops.
    Chain,
}

/// How much of a record a caller sees once it may see the record at all (which rows it sees is
/// [`Viewer`]'s `sees_*`): every field redaction asks this, never the role itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    /// Staff: everything of their scope, other systems' answers and staff's working material
    /// (tickets, raw callbacks) included.
    Staff,
    /// A member, or a caller without a token (signing in): their own things, less of them.
    Member,
}

impl Detail {
    pub fn of(viewer: Option<&Viewer>) -> Detail {
        match viewer.map(|v| v.role) {
            Some(Role::Admin | Role::Ops) => Detail::Staff,
            Some(Role::Member) | None => Detail::Member,
        }
    }
}

/// How a member's phone number is shown to a caller who sees the member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhoneView {
    Whole,
    /// The last four digits (`mask_phone`).
    Masked,
}

impl PhoneView {
    pub fn of(viewer: Option<&Viewer>) -> PhoneView {
        match viewer.map(|v| v.role) {
            // Ops watch the floor: the last four digits tell members apart.
            Some(Role::Ops) => PhoneView::Masked,
            // Admins serve members; a member (or one signing in) sees their own number.
            Some(Role::Admin | Role::Member) | None => PhoneView::Whole,
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Viewer {
    pub role: Role,
    pub subject: String,
    /// For members: their member id.
    pub member_id: Option<i64>,
    /// For admins limited to some stores.
    pub stores: Option<Vec<i64>>,
    /// The sign-in session the token belongs to (`sid`); `None` for tokens minted with
    /// `fitorder token`.
    pub session: Option<String>,
}

impl Viewer {
    pub fn actor(&self) -> Actor {
        match self.role {
            Role::Member => Actor::member(self.member_id.unwrap_or_default()),
            Role::Admin => Actor::admin(self.subject.clone()),
            Role::Ops => Actor::ops(self.subject.clone()),
        }
    }

    pub fn require(&self, roles: &[Role]) -> AppResult<()> {
        if roles.contains(&self.role) {
            Ok(())
        } else {
            Err(AppError::Forbidden(format!(
                "role {} may not do this",
                self.role.as_str()
            )))
        }
    }

    /// What of the stored rows this caller sees: the one rule every query, row check and
    /// subscription reads (through the methods below).
    pub fn scope(&self) -> Scope<'_> {
        match (self.role, &self.stores) {
            (Role::Member, _) => Scope::Own(self.member_id.unwrap_or_default()),
            (Role::Admin, Some(list)) => Scope::Stores(list),
            _ => Scope::Chain,
        }
    }

    /// The stores a store-limited admin is limited to; `None` for everyone else (chain-wide
    /// staff, and members, who are limited by ownership instead).
    pub fn store_scope(&self) -> Option<&[i64]> {
        match self.scope() {
            Scope::Stores(list) => Some(list),
            Scope::Own(_) | Scope::Chain => None,
        }
    }

    /// Whether this caller may see data of `store_id` (members are checked by ownership).
    pub fn sees_store(&self, store_id: i64) -> bool {
        self.store_scope().is_none_or(|list| list.contains(&store_id))
    }

    /// Whether this caller may see a row of a store or of none (a ticket of a payment for an
    /// order fitorder does not know): a store's by whoever sees that store, one of no store
    /// only by those not limited to stores, as no store's staff can be told it is theirs.
    pub fn sees_store_of(&self, store_id: Option<i64>) -> bool {
        match store_id {
            Some(s) => self.sees_store(s),
            None => self.store_scope().is_none(),
        }
    }

    /// Whether this caller may see a row that belongs to member `member_id` of store
    /// `store_id` (an order, a membership, the member): a member only their own, staff by
    /// the store.
    pub fn sees_owned(&self, member_id: i64, store_id: i64) -> bool {
        match self.scope() {
            Scope::Own(me) => me == member_id,
            Scope::Stores(list) => list.contains(&store_id),
            Scope::Chain => true,
        }
    }

    /// [`Viewer::sees_owned`] as a filter: `query` over rows with a `member` and a `store`
    /// column, narrowed to what this caller sees.
    pub fn owned_rows<Q, M, S>(&self, query: Q, member: M, store: S) -> Q
    where
        M: Expression<SqlType = BigInt>,
        S: Expression<SqlType = BigInt>,
        Q: FilterDsl<dsl::Eq<M, i64>, Output = Q> + FilterDsl<dsl::EqAny<S, Vec<i64>>, Output = Q>,
    {
        match self.scope() {
            Scope::Own(me) => query.filter(member.eq(me)),
            Scope::Stores(list) => query.filter(store.eq_any(list.to_vec())),
            Scope::Chain => query,
        }
    }

    /// [`Viewer::sees_store_of`] as a filter: `query` over rows with a `store` column (a
    /// nullable one as `.assume_not_null()`: a row of no store is left out for store-limited
    /// staff all the same, as `= ANY` is not true of NULL).
    pub fn store_rows<Q, S>(&self, query: Q, store: S) -> Q
    where
        S: Expression<SqlType = BigInt>,
        Q: FilterDsl<dsl::EqAny<S, Vec<i64>>, Output = Q>,
    {
        match self.store_scope() {
            Some(list) => query.filter(store.eq_any(list.to_vec())),
            None => query,
        }
    }

    /// Refuses a staff member acting on a store outside their `stores` claim.
    pub fn require_store(&self, store_id: i64) -> AppResult<()> {
        if self.sees_store(store_id) {
            Ok(())
        } else {
            Err(AppError::Forbidden(format!("no access to store {store_id}")))
        }
    }
}

pub fn issue_token(
    secret: &str,
    role: Role,
    sub: &str,
    stores: Option<Vec<String>>,
    ttl: std::time::Duration,
) -> String {
    let claims = Claims {
        sub: sub.to_string(),
        role: role.as_str().to_string(),
        exp: chrono::Utc::now().timestamp() + ttl.as_secs() as i64,
        stores,
        sid: None,
    };
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("HS256 encoding cannot fail")
}

/// A signed-in member's access token: role `member`, `sub` = the member id, `sid` = the session,
/// expiring at `exp` (seconds since the epoch).
pub fn issue_session_token(secret: &str, member_id: i64, sid: &str, exp: i64) -> String {
    let claims = Claims {
        sub: member_id.to_string(),
        role: Role::Member.as_str().to_string(),
        exp,
        stores: None,
        sid: Some(sid.to_string()),
    };
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("HS256 encoding cannot fail")
}

/// The session check, apart from the signature and claim checks: a token naming a session
/// that has ended (signed out, or its refresh token reused) is refused on its next use.
/// `ended` answers for a session id (the cache of ended sessions, `events::EndedSessions`).
pub fn refuse_ended_session(viewer: &Viewer, ended: impl FnOnce(&str) -> bool) -> AppResult<()> {
    match viewer.session.as_deref() {
        Some(sid) if ended(sid) => Err(AppError::Unauthenticated("the session has ended: sign in again".into())),
        _ => Ok(()),
    }
}

/// A session id as `sessions` makes them: 32 lowercase hex digits.
fn session_id(s: &str) -> Option<String> {
    (s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then(|| s.to_string())
}

/// Checks a bearer token (`Bearer <JWT>`, the scheme case-insensitive as RFC 7235 says).
pub fn verify(secret: &str, header_value: &str) -> AppResult<Viewer> {
    verify_with_expiry(secret, header_value).map(|(v, _)| v)
}

/// [`verify`], also answering the token's `exp` (seconds since the epoch): a WebSocket
/// session ends then.
pub fn verify_with_expiry(secret: &str, header_value: &str) -> AppResult<(Viewer, i64)> {
    let token = bearer_token(header_value)?;
    let mut validation = Validation::new(Algorithm::HS256);
    validation.set_required_spec_claims(&["exp", "sub"]);
    validation.validate_nbf = true;
    validation.leeway = 5;
    // The library's own words (and its internals) stay in the log; the caller learns the kind.
    let data = jsonwebtoken::decode::<Claims>(token, &DecodingKey::from_secret(secret.as_bytes()), &validation)
        .map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            tracing::debug!(error = %e, "token refused");
            AppError::Unauthenticated(
                match e.kind() {
                    ErrorKind::ExpiredSignature => "the token has expired",
                    ErrorKind::ImmatureSignature => "the token is not valid yet",
                    ErrorKind::InvalidSignature => "the token's signature is not valid",
                    ErrorKind::MissingRequiredClaim(_) => "the token lacks a required claim",
                    _ => "the token is not a valid HS256 JWT",
                }
                .into(),
            )
        })?;
    check_claim_bounds(token, chrono::Utc::now().timestamp())?;
    let claims = data.claims;
    let role = Role::parse(&claims.role)
        .ok_or_else(|| AppError::Unauthenticated("the token's role is not member, admin or ops".into()))?;
    if claims.sub.is_empty() {
        return Err(AppError::Unauthenticated("empty subject".into()));
    }
    let member_id = match role {
        Role::Member => Some(
            canonical_id(&claims.sub)
                .ok_or_else(|| AppError::Unauthenticated("a member token's sub must be a member id".into()))?,
        ),
        _ => None,
    };
    let stores = match claims.stores {
        None => None,
        Some(list) => Some(
            list.iter()
                .map(|s| canonical_id(s))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| AppError::Unauthenticated("stores must be store ids".into()))?,
        ),
    };
    let session = match claims.sid {
        None => None,
        Some(sid) if role == Role::Member => Some(
            session_id(&sid).ok_or_else(|| AppError::Unauthenticated("the token's sid is not a session id".into()))?,
        ),
        Some(_) => return Err(AppError::Unauthenticated("only member tokens name a session".into())),
    };
    Ok((
        Viewer {
            role,
            subject: claims.sub,
            member_id,
            stores,
            session,
        },
        claims.exp,
    ))
}

/// The token of an `Authorization` value: `Bearer <token>` and nothing else (a bare token is
/// refused: the contract's one form, and what every client sends).
fn bearer_token(header_value: &str) -> AppResult<&str> {
    match header_value.trim().split_once(' ') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") && !rest.trim().is_empty() => Ok(rest.trim()),
        _ => Err(AppError::Unauthenticated(
            "the token must be sent as \"Authorization: Bearer <token>\"".into(),
        )),
    }
}

/// The longest a fitorder token may live: an `exp` further ahead is no token we issue.
pub const MAX_TOKEN_LIFETIME_SECS: i64 = 366 * 24 * 3600;
/// How far ahead of this clock another instance's `iat` may be.
const IAT_LEEWAY_SECS: i64 = 60;

/// What the signature check leaves open, on the claims of a token whose signature is good:
/// an `exp` more than [`MAX_TOKEN_LIFETIME_SECS`] ahead (10^18 was accepted), an `iat` that is
/// not a number or lies in the future, and `stores: null` (a malformed claim, not "every
/// store": an admin is chain-wide only without a `stores` claim at all).
fn check_claim_bounds(token: &str, now: i64) -> AppResult<()> {
    use base64::Engine;
    let refuse = |why: &str| AppError::Unauthenticated(format!("the token's {why}"));
    let payload = token
        .split('.')
        .nth(1)
        .and_then(|p| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(p.trim_end_matches('='))
                .ok()
        })
        .and_then(|b| serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&b).ok())
        .ok_or_else(|| refuse("claims are not a JSON object"))?;
    match payload.get("exp").and_then(|v| v.as_i64()) {
        Some(exp) if exp <= now.saturating_add(MAX_TOKEN_LIFETIME_SECS) => {}
        Some(_) => return Err(refuse("exp lies more than a year ahead")),
        None => return Err(refuse("exp is not a number of seconds")),
    }
    match payload.get("iat") {
        None => {}
        Some(v) => match v.as_i64() {
            Some(iat) if iat <= now.saturating_add(IAT_LEEWAY_SECS) => {}
            Some(_) => return Err(refuse("iat lies in the future")),
            None => return Err(refuse("iat is not a number of seconds")),
        },
    }
    match payload.get("stores") {
        None | Some(serde_json::Value::Array(_)) => {}
        Some(_) => return Err(refuse("stores claim must be a list of store ids")),
    }
    Ok(())
}

/// Every way in (HTTP and WebSocket): with an OpenID Connect issuer configured, a token whose
/// header says RS256 or ES256 is the issuer's staff token ([`oidc::OidcVerifier`], which may
/// fetch its keys); anything else — and everything without an issuer — is fitorder's own HS256
/// token, checked on the spot as before. `none` and HS* never meet the issuer's public keys.
pub async fn verify_bearer(
    secret: &str,
    issuer: Option<&oidc::OidcVerifier>,
    header_value: &str,
) -> AppResult<(Viewer, i64)> {
    if let Some(issuer) = issuer {
        let token = bearer_token(header_value)?;
        // fitorder's own header, as `issue_token` writes it, is decided without decoding it.
        let own = token.strip_prefix(OWN_HEADER).is_some_and(|rest| rest.starts_with('.'));
        if !own && jsonwebtoken::decode_header(token).is_ok_and(|h| oidc::is_issuer_alg(h.alg)) {
            return issuer.verify(token).await;
        }
    }
    verify_with_expiry(secret, header_value)
}

/// `{"typ":"JWT","alg":"HS256"}` in base64url: the header of every token [`issue_token`] makes.
const OWN_HEADER: &str = "eyJ0eXAiOiJKV1QiLCJhbGciOiJIUzI1NiJ9";

/// An id written the one way ids are written: decimal digits, no sign, no leading zero.
pub fn canonical_id(s: &str) -> Option<i64> {
    let ok = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && !s.starts_with('0');
    ok.then(|| s.parse::<i64>().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_header_is_the_one_issue_token_writes() {
        let t = issue_token("s", Role::Ops, "o", None, std::time::Duration::from_secs(60));
        assert_eq!(t.split('.').next(), Some(OWN_HEADER));
        let h = jsonwebtoken::decode_header(&t).unwrap();
        assert_eq!(h.alg, Algorithm::HS256);
    }

    fn viewer(role: Role, member_id: Option<i64>, stores: Option<Vec<i64>>) -> Viewer {
        Viewer {
            role,
            subject: "s".into(),
            member_id,
            stores,
            session: None,
        }
    }

    #[test]
    fn who_sees_what() {
        let member = viewer(Role::Member, Some(7), None);
        let limited = viewer(Role::Admin, None, Some(vec![1, 2]));
        let admin = viewer(Role::Admin, None, None);
        // A stores claim limits admins only.
        let ops = viewer(Role::Ops, None, Some(vec![1]));
        assert_eq!(member.scope(), Scope::Own(7));
        assert_eq!(limited.scope(), Scope::Stores(&[1, 2]));
        assert_eq!(admin.scope(), Scope::Chain);
        assert_eq!(ops.scope(), Scope::Chain);
        // (member, store) rows: a member's own, staff's by store.
        assert!(member.sees_owned(7, 3) && !member.sees_owned(8, 1));
        assert!(limited.sees_owned(8, 2) && !limited.sees_owned(8, 3));
        assert!(admin.sees_owned(8, 3) && ops.sees_owned(8, 3));
        // Rows of a store, or of none.
        for v in [&member, &admin, &ops] {
            assert!(v.sees_store(3) && v.sees_store_of(Some(3)) && v.sees_store_of(None));
        }
        assert!(limited.sees_store_of(Some(1)) && !limited.sees_store_of(Some(3)));
        assert!(!limited.sees_store_of(None));
        assert_eq!(limited.store_scope(), Some(&[1, 2][..]));
        assert_eq!(ops.store_scope(), None);
        assert_eq!(member.store_scope(), None);
    }

    #[test]
    fn ids_are_canonical() {
        assert_eq!(canonical_id("2"), Some(2));
        for bad in ["+2", "02", "-2", " 2", "2 ", "", "0", "99999999999999999999"] {
            assert_eq!(canonical_id(bad), None, "{bad:?}");
        }
    }
}
