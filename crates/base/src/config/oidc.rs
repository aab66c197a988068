//! Staff tokens from an OpenID Connect issuer: `FITORDER_OIDC_ISSUER`, `FITORDER_OIDC_AUDIENCE`,
//! `FITORDER_OIDC_ROLE_CLAIM`, `FITORDER_OIDC_STORES_CLAIM` (the contract's table).

use std::time::Duration;

use anyhow::{bail, Context, Result};

#[derive(Clone, Debug)]
pub struct OidcConfig {
    /// The issuer exactly as its tokens' `iss` and its discovery document's `issuer` say it.
    pub issuer: String,
    /// What a token's `aud` must contain.
    pub audience: String,
    pub role_claim: String,
    pub stores_claim: String,
    /// After a fetch of the keys, no other for this long, whatever `kid` a token names (a flood
    /// of made-up `kid`s costs one fetch per period at most).
    pub refetch_cooldown: Duration,
    /// Keys older than this are fetched again at the next token (a key the issuer withdrew
    /// stops being trusted); if that fetch fails the known keys stay in use.
    pub keys_max_age: Duration,
    /// Clock skew allowed on `exp` and `nbf` (the issuer's clock is not ours).
    pub leeway: Duration,
}

impl OidcConfig {
    pub fn new(issuer: &str, audience: &str) -> Result<OidcConfig> {
        check_url("FITORDER_OIDC_ISSUER", issuer)?;
        if audience.trim().is_empty() {
            bail!("FITORDER_OIDC_AUDIENCE must be set with FITORDER_OIDC_ISSUER (a token's aud must contain it)");
        }
        Ok(OidcConfig {
            issuer: issuer.to_string(),
            audience: audience.to_string(),
            role_claim: "role".into(),
            stores_claim: "stores".into(),
            refetch_cooldown: Duration::from_secs(30),
            keys_max_age: Duration::from_secs(3600),
            leeway: Duration::from_secs(30),
        })
    }

    /// `None` without `FITORDER_OIDC_ISSUER`; an audience without an issuer is a mistake too.
    pub fn from_settings(s: &OidcSettings) -> Result<Option<OidcConfig>> {
        let Some(issuer) = &s.issuer else {
            if s.audience.is_some() {
                bail!("FITORDER_OIDC_AUDIENCE is set but FITORDER_OIDC_ISSUER is not");
            }
            return Ok(None);
        };
        let mut c = OidcConfig::new(issuer.trim(), s.audience.as_deref().unwrap_or_default().trim())?;
        c.role_claim = s.role_claim.trim().to_string();
        c.stores_claim = s.stores_claim.trim().to_string();
        Ok(Some(c))
    }
}

/// The settings of staff sign-in through an OpenID Connect issuer.
#[derive(Clone, Debug, clap::Args)]
pub struct OidcSettings {
    /// Staff tokens (RS256/ES256) from this OpenID Connect issuer (HTTPS; plain HTTP on loopback
    /// only); set together with `FITORDER_OIDC_AUDIENCE`. Unset: only HS256 tokens.
    #[arg(
        id = "oidc-issuer",
        long = "oidc-issuer",
        env = "FITORDER_OIDC_ISSUER",
        value_name = "URL"
    )]
    pub issuer: Option<String>,
    /// What those tokens' `aud` must contain.
    #[arg(
        id = "oidc-audience",
        long = "oidc-audience",
        env = "FITORDER_OIDC_AUDIENCE",
        value_name = "AUDIENCE"
    )]
    pub audience: Option<String>,
    /// The claim of those tokens that carries the role (`admin` or `ops`).
    #[arg(
        id = "oidc-role-claim",
        long = "oidc-role-claim",
        env = "FITORDER_OIDC_ROLE_CLAIM",
        value_name = "CLAIM",
        default_value = "role"
    )]
    pub role_claim: String,
    /// The claim of those tokens that carries the store ids.
    #[arg(
        id = "oidc-stores-claim",
        long = "oidc-stores-claim",
        env = "FITORDER_OIDC_STORES_CLAIM",
        value_name = "CLAIM",
        default_value = "stores"
    )]
    pub stores_claim: String,
}

/// The issuer's URLs (the issuer itself, its `jwks_uri`): HTTPS, or plain HTTP on loopback only
/// (a test issuer on this machine). No query or fragment in the issuer (OpenID Connect
/// Discovery 1.0, §2).
pub fn check_url(what: &str, url: &str) -> Result<reqwest::Url> {
    let parsed = reqwest::Url::parse(url).with_context(|| format!("{what}={url:?} is not a URL"))?;
    match parsed.scheme() {
        "https" => {}
        "http" if is_loopback(&parsed) => {}
        "http" => bail!("{what}={url:?}: plain http is allowed on loopback only, use https"),
        other => bail!("{what}={url:?}: scheme {other} is not https"),
    }
    if parsed.host().is_none() {
        bail!("{what}={url:?} has no host");
    }
    if what == "FITORDER_OIDC_ISSUER" && (parsed.query().is_some() || parsed.fragment().is_some()) {
        bail!("{what}={url:?}: an issuer has no query or fragment");
    }
    Ok(parsed)
}

fn is_loopback(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_everywhere_but_loopback() {
        for ok in [
            "https://id.example.com",
            "https://id.example.com/realms/staff",
            "http://127.0.0.1:9000",
            "http://127.8.0.1/x",
            "http://[::1]:9000",
            "http://localhost:9000",
        ] {
            assert!(check_url("FITORDER_OIDC_ISSUER", ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://id.example.com",
            "http://127.0.0.1.example.com",
            "http://localhost.example.com",
            "http://10.0.0.1",
            "ftp://id.example.com",
            "https://id.example.com/?tenant=1",
            "https://id.example.com/#x",
            "id.example.com",
        ] {
            assert!(check_url("FITORDER_OIDC_ISSUER", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_issuer_needs_its_audience() {
        let settings = |issuer: Option<&str>, audience: Option<&str>, role: &str| OidcSettings {
            issuer: issuer.map(str::to_string),
            audience: audience.map(str::to_string),
            role_claim: role.into(),
            stores_claim: "stores".into(),
        };
        assert!(OidcConfig::from_settings(&settings(None, None, "role"))
            .unwrap()
            .is_none());
        assert!(OidcConfig::from_settings(&settings(Some("https://id.example.com"), None, "role")).is_err());
        assert!(OidcConfig::from_settings(&settings(None, Some("fitorder"), "role")).is_err());
        let c = OidcConfig::from_settings(&settings(
            Some("https://id.example.com"),
            Some("fitorder"),
            "https://studio.example/role",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(c.role_claim, "https://studio.example/role");
        assert_eq!(c.stores_claim, "stores");
    }
}
