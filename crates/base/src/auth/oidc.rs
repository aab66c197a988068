//! Staff tokens signed by the chain's OpenID Connect issuer (`FITORDER_OIDC_ISSUER`).
//!
//! The keys come from the `jwks_uri` of the issuer's `/.well-known/openid-configuration` and are
//! kept in memory. A token naming a `kid` we do not know makes one fetch, but no fetch happens
//! within `refetch_cooldown` of the last one and only one runs at a time, so a flood of made-up
//! `kid`s costs nothing much. Only RS256 and ES256 are accepted, each only with a key of its own
//! type (an RSA key for RS256, a P-256 key for ES256): `none` and HS* never reach this path (see
//! [`crate::auth::verify_bearer`]), and an `oct` key in the set is ignored. Signatures and the
//! registered claims are checked by jsonwebtoken; this module picks the key and reads the role
//! and stores from the configured claims.

use std::sync::RwLock;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use super::{canonical_id, Role, Viewer};
use crate::config::oidc::{check_url, OidcConfig};
use crate::error::{AppError, AppResult};

/// Largest discovery document or key set read.
const MAX_DOCUMENT_BYTES: usize = 256 * 1024;
/// Keys kept from one set at most.
const MAX_KEYS: usize = 64;
/// Longest `sub` taken (it is written in audit rows as the staff id).
const MAX_SUBJECT_BYTES: usize = 255;

/// Whether a token's header asks for one of the algorithms this path serves.
pub fn is_issuer_alg(alg: Algorithm) -> bool {
    matches!(alg, Algorithm::RS256 | Algorithm::ES256)
}

struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

#[derive(Default)]
struct KeySet {
    keys: Vec<Key>,
    /// The last fetch that brought a key set.
    fetched_at: Option<Instant>,
    /// The last fetch tried, whatever came of it (the cooldown counts from here).
    attempted_at: Option<Instant>,
    /// How many fetches were tried (tells a waiting task that one ran meanwhile).
    attempts: u64,
}

pub struct OidcVerifier {
    config: OidcConfig,
    http: reqwest::Client,
    /// Read by every token; never held across an await.
    keys: RwLock<KeySet>,
    /// Held while fetching: one fetch at a time.
    fetching: tokio::sync::Mutex<()>,
}

enum Lookup {
    Found(DecodingKey),
    Missing,
}

impl OidcVerifier {
    pub fn new(config: OidcConfig) -> anyhow::Result<OidcVerifier> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .timeout(Duration::from_secs(10))
            // A redirect could lead off HTTPS or to another host: the URLs are taken as given.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("fitorder/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(OidcVerifier {
            config,
            http,
            keys: RwLock::new(KeySet::default()),
            fetching: tokio::sync::Mutex::new(()),
        })
    }

    pub fn config(&self) -> &OidcConfig {
        &self.config
    }

    /// Checks a token whose header says RS256 or ES256; its viewer and `exp`.
    pub async fn verify(&self, token: &str) -> AppResult<(Viewer, i64)> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| refused("the token is not a valid JWT"))?;
        if !is_issuer_alg(header.alg) {
            return Err(refused("the token's algorithm is not accepted"));
        }
        let kid = header.kid.as_deref();
        let key = match self.lookup(kid, header.alg, false) {
            Lookup::Found(k) => k,
            Lookup::Missing => {
                self.refresh().await;
                match self.lookup(kid, header.alg, true) {
                    Lookup::Found(k) => k,
                    Lookup::Missing => return Err(refused("the token's signing key is not one of the issuer's")),
                }
            }
        };
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&[&self.config.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.validate_nbf = true;
        validation.leeway = self.config.leeway.as_secs();
        let data = jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, &key, &validation).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            tracing::debug!(error = %e, "issuer token refused");
            refused(match e.kind() {
                ErrorKind::ExpiredSignature => "the token has expired",
                ErrorKind::ImmatureSignature => "the token is not valid yet",
                ErrorKind::InvalidSignature => "the token's signature is not valid",
                ErrorKind::InvalidIssuer => "the token is not from the configured issuer",
                ErrorKind::InvalidAudience => "the token is not meant for this service",
                ErrorKind::MissingRequiredClaim(_) => "the token lacks a required claim",
                _ => "the token is not a valid issuer token",
            })
        })?;
        self.viewer(&data.claims)
    }

    /// The role, stores and subject of checked claims.
    fn viewer(&self, claims: &serde_json::Map<String, Value>) -> AppResult<(Viewer, i64)> {
        let role = staff_role(claims.get(&self.config.role_claim))?;
        let subject = match claims.get("sub") {
            Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_SUBJECT_BYTES => s.clone(),
            _ => return Err(refused("the token's sub is not a usable staff id")),
        };
        // As fitorder's own tokens: an admin is chain-wide only without the claim at all;
        // `null` is a malformed claim (an issuer's mapping that failed), not "every store".
        let stores = match claims.get(&self.config.stores_claim) {
            None => None,
            Some(Value::Null) => {
                return Err(refused(
                    "the token's stores claim is null: leave it out for every store",
                ))
            }
            Some(Value::Array(list)) => Some(
                list.iter()
                    .map(|v| match v {
                        Value::String(s) => canonical_id(s),
                        Value::Number(n) => n.as_i64().filter(|&i| i > 0),
                        _ => None,
                    })
                    .collect::<Option<Vec<i64>>>()
                    .ok_or_else(|| refused("the token's stores must be store ids"))?,
            ),
            Some(_) => return Err(refused("the token's stores must be a list of store ids")),
        };
        let exp = claims
            .get("exp")
            .and_then(Value::as_i64)
            .ok_or_else(|| refused("the token's exp is not a number"))?;
        Ok((
            Viewer {
                role,
                subject,
                member_id: None,
                stores,
                session: None,
            },
            exp,
        ))
    }

    /// The key for `kid` and `alg` if it is known (and, unless `stale_ok`, not too old). A token
    /// without `kid` is taken only when exactly one key of its algorithm is known.
    fn lookup(&self, kid: Option<&str>, alg: Algorithm, stale_ok: bool) -> Lookup {
        let set = self.keys.read().expect("oidc keys");
        let fresh = set.fetched_at.is_some_and(|t| t.elapsed() < self.config.keys_max_age);
        if !fresh && !stale_ok {
            return Lookup::Missing;
        }
        let mut candidates = set
            .keys
            .iter()
            .filter(|k| k.alg == alg && (kid.is_none() || k.kid.as_deref() == kid));
        match (candidates.next(), candidates.next()) {
            (Some(k), None) => Lookup::Found(k.key.clone()),
            _ => Lookup::Missing,
        }
    }

    /// Fetches the key set again, unless another task just did (it waited on the lock) or the
    /// last try is within the cooldown. A failed fetch keeps the keys known before.
    pub async fn refresh(&self) {
        let seen = self.keys.read().expect("oidc keys").attempts;
        let _one_at_a_time = self.fetching.lock().await;
        {
            let set = self.keys.read().expect("oidc keys");
            if set.attempts != seen {
                return;
            }
            if set
                .attempted_at
                .is_some_and(|t| t.elapsed() < self.config.refetch_cooldown)
            {
                return;
            }
        }
        let result = self.fetch().await;
        let mut set = self.keys.write().expect("oidc keys");
        set.attempts += 1;
        set.attempted_at = Some(Instant::now());
        match result {
            Ok(keys) => {
                tracing::info!(
                    issuer = %self.config.issuer,
                    keys = keys.len(),
                    kids = ?keys.iter().filter_map(|k| k.kid.as_deref()).collect::<Vec<_>>(),
                    "fetched the OpenID Connect issuer's signing keys"
                );
                set.keys = keys;
                set.fetched_at = Some(Instant::now());
            }
            Err(e) => tracing::warn!(
                issuer = %self.config.issuer,
                error = %e,
                kept = set.keys.len(),
                "could not fetch the OpenID Connect issuer's signing keys"
            ),
        }
    }

    /// The discovery document, then its `jwks_uri`: the usable signing keys.
    async fn fetch(&self) -> anyhow::Result<Vec<Key>> {
        let discovery_url = format!(
            "{}/.well-known/openid-configuration",
            self.config.issuer.trim_end_matches('/')
        );
        let doc: Value = serde_json::from_slice(&self.get(&discovery_url).await?)?;
        // OpenID Connect Discovery 1.0, §4.3: the issuer it names is exactly the one asked.
        anyhow::ensure!(
            doc.get("issuer").and_then(Value::as_str) == Some(self.config.issuer.as_str()),
            "the discovery document names another issuer: {:?}",
            doc.get("issuer")
        );
        let jwks_uri = doc
            .get("jwks_uri")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow::anyhow!("the discovery document has no jwks_uri"))?;
        check_url("jwks_uri", jwks_uri)?;
        let set: Value = serde_json::from_slice(&self.get(jwks_uri).await?)?;
        let listed = set
            .get("keys")
            .and_then(Value::as_array)
            .ok_or_else(|| anyhow::anyhow!("the key set has no keys array"))?;
        Ok(listed.iter().filter_map(usable_key).take(MAX_KEYS).collect())
    }

    async fn get(&self, url: &str) -> anyhow::Result<Vec<u8>> {
        let mut resp = self.http.get(url).header("accept", "application/json").send().await?;
        anyhow::ensure!(resp.status().is_success(), "{url} answered {}", resp.status());
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await? {
            anyhow::ensure!(
                body.len() + chunk.len() <= MAX_DOCUMENT_BYTES,
                "{url} answered more than {MAX_DOCUMENT_BYTES} bytes"
            );
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// A signing key of the set that RS256 or ES256 can use; anything else (encryption keys, `oct`,
/// other curves, keys for other algorithms, what does not parse) is left out.
fn usable_key(v: &Value) -> Option<Key> {
    let jwk: Jwk = serde_json::from_value(v.clone()).ok()?;
    if matches!(&jwk.common.public_key_use, Some(u) if *u != PublicKeyUse::Signature) {
        return None;
    }
    let alg = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        _ => return None,
    };
    let declared_ok = match jwk.common.key_algorithm {
        None => true,
        Some(KeyAlgorithm::RS256) => alg == Algorithm::RS256,
        Some(KeyAlgorithm::ES256) => alg == Algorithm::ES256,
        Some(_) => false,
    };
    if !declared_ok {
        return None;
    }
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    Some(Key {
        kid: jwk.common.key_id.clone(),
        alg,
        key,
    })
}

/// `admin` or `ops` from the role claim: a string, or a list of which the strongest staff role
/// counts. Anything else (a member role, no role, another shape) is refused.
fn staff_role(claim: Option<&Value>) -> AppResult<Role> {
    let staff = |s: &str| match Role::parse(s) {
        Some(r @ (Role::Admin | Role::Ops)) => Some(r),
        _ => None,
    };
    let role = match claim {
        Some(Value::String(s)) => staff(s),
        Some(Value::Array(list)) => {
            let roles: Vec<Role> = list.iter().filter_map(Value::as_str).filter_map(staff).collect();
            if roles.contains(&Role::Admin) {
                Some(Role::Admin)
            } else {
                roles.first().copied()
            }
        }
        _ => None,
    };
    role.ok_or_else(|| refused("the issuer's token carries no staff role (admin or ops)"))
}

fn refused(why: &str) -> AppError {
    AppError::Unauthenticated(why.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_signing_keys_of_rs256_and_es256_are_kept() {
        let rsa = json!({"kty": "RSA", "kid": "r", "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw", "e": "AQAB"});
        let ec = json!({"kty": "EC", "kid": "e", "crv": "P-256", "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"});
        assert_eq!(usable_key(&rsa).unwrap().alg, Algorithm::RS256);
        assert_eq!(usable_key(&ec).unwrap().alg, Algorithm::ES256);
        let with = |base: &Value, k: &str, v: Value| {
            let mut o = base.clone();
            o[k] = v;
            o
        };
        // Encryption keys, a declared algorithm of another kind, HMAC secrets, other curves.
        assert!(usable_key(&with(&rsa, "use", json!("enc"))).is_none());
        assert!(usable_key(&with(&rsa, "alg", json!("HS256"))).is_none());
        assert!(usable_key(&with(&rsa, "alg", json!("ES256"))).is_none());
        assert!(usable_key(&with(&ec, "alg", json!("RS256"))).is_none());
        assert!(usable_key(&json!({"kty": "oct", "kid": "h", "k": "c2VjcmV0"})).is_none());
        assert!(usable_key(&with(&ec, "crv", json!("P-384"))).is_none());
        assert!(usable_key(&json!({"kty": "RSA", "kid": "broken"})).is_none());
    }

    #[test]
    fn only_staff_roles_pass() {
        assert_eq!(staff_role(Some(&json!("admin"))).unwrap(), Role::Admin);
        assert_eq!(staff_role(Some(&json!("ops"))).unwrap(), Role::Ops);
        assert_eq!(staff_role(Some(&json!(["viewer", "ops"]))).unwrap(), Role::Ops);
        assert_eq!(staff_role(Some(&json!(["ops", "admin"]))).unwrap(), Role::Admin);
        for bad in [
            json!("member"),
            json!(["member"]),
            json!("Admin"),
            json!(1),
            json!(null),
            json!([]),
        ] {
            assert!(staff_role(Some(&bad)).is_err(), "{bad}");
        }
        assert!(staff_role(None).is_err());
    }
}
