//! Who is calling: HS256 JWTs with `sub`, `role`, `exp` and an optional `stores` list.

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::domain::Actor;
use crate::error::{AppError, AppResult};

pub mod oidc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Member,
    Admin,
    Ops,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Member => "member",
            Role::Admin => "admin",
            Role::Ops => "ops",
        }
    }
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "member" => Some(Role::Member),
            "admin" => Some(Role::Admin),
            "ops" => Some(Role::Ops),
            _ => None,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub role: String,
    pub exp: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stores: Option<Vec<String>>,
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

    /// Whether this caller may see data of `store_id` (members are checked by ownership).
    pub fn sees_store(&self, store_id: i64) -> bool {
        match &self.stores {
            Some(list) if self.role == Role::Admin => list.contains(&store_id),
            _ => true,
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
    };
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("HS256 encoding cannot fail")
}

/// Checks a bearer token (with or without the `Bearer ` prefix, whose scheme is
/// case-insensitive as RFC 7235 says).
pub fn verify(secret: &str, header_value: &str) -> AppResult<Viewer> {
    verify_with_expiry(secret, header_value).map(|(v, _)| v)
}

/// [`verify`], also answering the token's `exp` (seconds since the epoch): a WebSocket
/// session ends then.
pub fn verify_with_expiry(secret: &str, header_value: &str) -> AppResult<(Viewer, i64)> {
    let token = bearer_token(header_value);
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
    Ok((
        Viewer {
            role,
            subject: claims.sub,
            member_id,
            stores,
        },
        claims.exp,
    ))
}

/// The token of an `Authorization` value, with or without its `Bearer ` scheme.
fn bearer_token(header_value: &str) -> &str {
    let value = header_value.trim();
    match value.split_once(' ') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest,
        _ => value,
    }
    .trim()
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
        let token = bearer_token(header_value);
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
fn canonical_id(s: &str) -> Option<i64> {
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

    #[test]
    fn ids_are_canonical() {
        assert_eq!(canonical_id("2"), Some(2));
        for bad in ["+2", "02", "-2", " 2", "2 ", "", "0", "99999999999999999999"] {
            assert_eq!(canonical_id(bad), None, "{bad:?}");
        }
    }
}
