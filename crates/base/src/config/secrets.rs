//! Secrets in the settings: the JWT secret's strength, URLs whose password `Debug` hides, the
//! development secret kept on disk.

use anyhow::Result;

/// A URL (or libpq connection string) that may carry a password: `Debug` shows it with the
/// password replaced ([`redact_url`]); the text is read through `Deref`.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl(String);

impl std::ops::Deref for SecretUrl {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<String> for SecretUrl {
    fn from(url: String) -> Self {
        SecretUrl(url)
    }
}

impl From<&str> for SecretUrl {
    fn from(url: &str) -> Self {
        SecretUrl(url.to_string())
    }
}

impl std::fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", redact_url(&self.0))
    }
}

/// Shown instead of a secret in `Debug`.
const REDACTED: &str = "<redacted>";

/// A URL with its password (`scheme://user:PASSWORD@host…`) replaced, and a libpq key/value
/// string's `password=…` too; anything else as it is.
pub fn redact_url(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        if let Some((userinfo, host)) = authority.rsplit_once('@') {
            if let Some((user, _password)) = userinfo.split_once(':') {
                return format!("{scheme}://{user}:{REDACTED}@{host}{}", redact_query_password(tail));
            }
        }
        return format!("{scheme}://{authority}{}", redact_query_password(tail));
    }
    url.split_whitespace()
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}={REDACTED}"),
            _ => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `?password=…` (PostgreSQL URLs take it as a parameter too).
fn redact_query_password(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_string();
    };
    let query = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}={REDACTED}"),
            _ => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&");
    format!("{path}?{query}")
}

/// The shortest `FITORDER_JWT_SECRET` accepted outside development mode, in bytes.
pub const MIN_JWT_SECRET_BYTES: usize = 32;
/// The fewest different bytes it must contain (`aaaa…` or `0101…` is no secret).
pub const MIN_JWT_SECRET_DISTINCT: usize = 8;

/// Outside development mode a token signed with a guessable secret is as good as any: a secret
/// shorter than [`MIN_JWT_SECRET_BYTES`] or with fewer than [`MIN_JWT_SECRET_DISTINCT`]
/// different bytes stops the start, naming the setting (never showing the secret).
pub fn check_jwt_secret(secret: &str) -> Result<()> {
    let bytes = secret.as_bytes();
    anyhow::ensure!(
        bytes.len() >= MIN_JWT_SECRET_BYTES,
        "FITORDER_JWT_SECRET is too short: {} bytes, at least {MIN_JWT_SECRET_BYTES} are needed outside \
         development mode (e.g. `openssl rand -hex 32`)",
        bytes.len()
    );
    anyhow::ensure!(
        !secret.trim().to_ascii_lowercase().starts_with("change-me"),
        "FITORDER_JWT_SECRET is still the example's placeholder: set a random one (e.g. `openssl rand -hex 32`)"
    );
    let distinct = bytes.iter().collect::<std::collections::HashSet<_>>().len();
    anyhow::ensure!(
        distinct >= MIN_JWT_SECRET_DISTINCT,
        "FITORDER_JWT_SECRET is too simple: {distinct} different characters, at least \
         {MIN_JWT_SECRET_DISTINCT} are needed outside development mode (e.g. `openssl rand -hex 32`)"
    );
    Ok(())
}

/// Without FITORDER_JWT_SECRET a random secret is made once and kept in
/// `./.fitorder/jwt-secret`, so that `fitorder token` in another terminal signs tokens the
/// running dev server accepts, and tokens survive a restart. Reading the configuration only
/// reads the file: it is written by [`super::Config::keep_dev_secret`] once the start is known to be
/// development mode (a production start without a secret stops and leaves nothing behind).
pub(super) fn dev_secret() -> String {
    let path = std::path::Path::new(DEV_SECRET_PATH);
    if let Ok(s) = std::fs::read_to_string(path) {
        if s.trim().len() >= 32 {
            return s.trim().to_string();
        }
    }
    use rand::Rng;
    let bytes: [u8; 32] = rand::rng().random();
    hex::encode(bytes)
}

const DEV_SECRET_PATH: &str = ".fitorder/jwt-secret";

/// Development mode: keeps the made-up secret in `./.fitorder/jwt-secret` (see `dev_secret`).
pub(super) fn keep_dev_secret(secret: &str) {
    {
        let path = std::path::Path::new(DEV_SECRET_PATH);
        if std::fs::read_to_string(path).is_ok_and(|s| s.trim() == secret) {
            return;
        }
        if std::fs::create_dir_all(".fitorder").is_ok() {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(path)
            {
                let _ = f.write_all(secret.as_bytes());
            }
        }
    }
}

#[cfg(test)]
mod redaction_tests {
    use super::*;

    #[test]
    fn key_value_connection_strings_lose_their_password() {
        assert_eq!(
            redact_url("host=db user=app password=hunter2 dbname=x"),
            "host=db user=app password=<redacted> dbname=x"
        );
        assert_eq!(
            redact_url("postgres://app@db/x?password=hunter2&sslmode=require"),
            "postgres://app@db/x?password=<redacted>&sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1:5432/postgres"),
            "postgres://postgres@127.0.0.1:5432/postgres"
        );
    }
}

#[cfg(test)]
mod jwt_secret_tests {
    use super::*;

    #[test]
    fn weak_secrets_are_refused_by_name() {
        for (weak, why) in [
            ("a", "too short"),
            ("change-me", "too short"),
            (&"x".repeat(64) as &str, "too simple"),
            ("0101010101010101010101010101010101", "too simple"),
        ] {
            let e = check_jwt_secret(weak).unwrap_err().to_string();
            assert!(e.contains("FITORDER_JWT_SECRET") && e.contains(why), "{weak}: {e}");
            assert!(!e.contains(weak) || weak.len() == 1, "the secret is not shown: {e}");
        }
        assert!(check_jwt_secret("change-me-to-64-random-hex-characters")
            .unwrap_err()
            .to_string()
            .contains("placeholder"));
        check_jwt_secret("3f9a1c7e5b2d4f6a8c0e1b3d5f7a9c2e").unwrap();
    }
}
