//! Alipay certificate mode across a certificate renewal: an answer (or notification) naming an
//! `alipay_cert_sn` other than the configured `ALIPAY_PUBLIC_CERT` is verified with that
//! certificate, which fitorder takes from the database (another instance fetched it) or
//! downloads (`alipay.open.app.alipaycert.download`, done by the client), checks against
//! `ALIPAY_ROOT_CERT` ([`crate::payments::certs::check_alipay_chain`]: a certificate that does
//! not chain to the root is refused) and stores for every instance. Stored certificates are
//! checked against the root again when loaded.
//!
//! What an unknown SN may cost is decided in memory first: a database lookup at most every
//! [`LOOKUP_MIN_INTERVAL_SECS`] and a download at most every [`DOWNLOAD_MIN_INTERVAL_SECS`] per
//! process, so answers or notifications naming made-up SNs cost no more than that.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};

use anyhow::{Context, Result};
use chrono::{DateTime, TimeDelta, Utc};
use diesel::sql_types::{Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use rsa::RsaPublicKey;

use crate::payments::certs::{alipay_sn, check_alipay_chain, CertError};

/// Shortest time between two database lookups for unknown SNs, per process.
pub const LOOKUP_MIN_INTERVAL_SECS: i64 = 5;
/// Shortest time between two certificate downloads, per process.
pub const DOWNLOAD_MIN_INTERVAL_SECS: i64 = 60;

/// A checked Alipay public-key certificate.
#[derive(Clone, Debug)]
pub struct RenewedCert {
    pub sn: String,
    pub pem: String,
    pub public_key: RsaPublicKey,
    pub not_after: DateTime<Utc>,
}

/// Checks a downloaded (or stored) certificate against the root file; its SN is computed from
/// the certificate itself.
pub fn check(content_pem: &str, root_bundle_pem: &str, now: DateTime<Utc>) -> Result<RenewedCert, CertError> {
    let leaf = check_alipay_chain(content_pem, root_bundle_pem, now)?;
    Ok(RenewedCert {
        sn: alipay_sn(&leaf),
        pem: content_pem.trim().to_string(),
        public_key: leaf.rsa_public_key()?,
        not_after: leaf.not_after,
    })
}

/// What the process may do now about an SN it does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownSnStep {
    /// Look the SN up in the database, then download it.
    LookupThenDownload,
    /// Look it up in the database only (a download was made a moment ago).
    Lookup,
    /// Nothing: both were tried a moment ago.
    Nothing,
}

#[derive(Default)]
struct Gates {
    last_lookup: Option<DateTime<Utc>>,
    last_download: Option<DateTime<Utc>>,
}

fn within(last: Option<DateTime<Utc>>, now: DateTime<Utc>, secs: i64) -> bool {
    last.is_some_and(|t| now >= t && now - t < TimeDelta::seconds(secs))
}

/// The renewed Alipay certificates this process knows, by SN (the configured one is not here).
#[derive(Default)]
pub struct RenewedCerts {
    certs: RwLock<HashMap<String, RenewedCert>>,
    gates: Mutex<Gates>,
}

impl RenewedCerts {
    pub fn key_for(&self, sn: &str) -> Option<RsaPublicKey> {
        let certs = self.certs.read().unwrap_or_else(|e| e.into_inner());
        certs
            .get(sn)
            .filter(|c| c.not_after > Utc::now())
            .map(|c| c.public_key.clone())
    }

    /// Every known renewed key, newest certificate first (notifications name no SN).
    pub fn keys(&self) -> Vec<RsaPublicKey> {
        let certs = self.certs.read().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<&RenewedCert> = certs.values().filter(|c| c.not_after > Utc::now()).collect();
        all.sort_by_key(|c| std::cmp::Reverse(c.not_after));
        all.into_iter().map(|c| c.public_key.clone()).collect()
    }

    pub fn insert(&self, cert: RenewedCert) {
        let mut certs = self.certs.write().unwrap_or_else(|e| e.into_inner());
        certs.insert(cert.sn.clone(), cert);
    }

    /// Decided in memory: what an unknown SN may cost at `now`.
    pub fn unknown_sn_step(&self, now: DateTime<Utc>) -> UnknownSnStep {
        let mut g = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        if within(g.last_lookup, now, LOOKUP_MIN_INTERVAL_SECS) {
            return UnknownSnStep::Nothing;
        }
        g.last_lookup = Some(now);
        if within(g.last_download, now, DOWNLOAD_MIN_INTERVAL_SECS) {
            return UnknownSnStep::Lookup;
        }
        g.last_download = Some(now);
        UnknownSnStep::LookupThenDownload
    }
}

#[derive(diesel::QueryableByName)]
struct Stored {
    #[diesel(sql_type = Text)]
    alipay_cert_sn: String,
    #[diesel(sql_type = Text)]
    pem: String,
}

/// Loads the stored certificates that have not expired, each checked against the root again
/// (a row that does not chain is skipped and logged); returns how many are known after.
pub async fn reload(
    conn: &mut AsyncPgConnection,
    into: &RenewedCerts,
    root_bundle_pem: &str,
    now: DateTime<Utc>,
) -> Result<usize> {
    let rows: Vec<Stored> = diesel::sql_query(
        "SELECT alipay_cert_sn, pem FROM alipay_public_certs WHERE not_after > $1 ORDER BY alipay_cert_sn",
    )
    .bind::<Timestamptz, _>(now)
    .load(conn)
    .await
    .context("loading the stored Alipay certificates")?;
    for row in rows {
        match check(&row.pem, root_bundle_pem, now) {
            Ok(c) if c.sn == row.alipay_cert_sn => into.insert(c),
            Ok(c) => tracing::warn!(
                stored = row.alipay_cert_sn,
                actual = c.sn,
                "a stored Alipay certificate has another SN: skipped"
            ),
            Err(e) => {
                tracing::warn!(sn = row.alipay_cert_sn, error = %e, "a stored Alipay certificate is not trusted: skipped")
            }
        }
    }
    Ok(into.certs.read().unwrap_or_else(|e| e.into_inner()).len())
}

/// Stores a checked certificate for every instance (an SN already there is updated).
pub async fn store(conn: &mut AsyncPgConnection, cert: &RenewedCert) -> Result<()> {
    diesel::sql_query(
        "INSERT INTO alipay_public_certs (alipay_cert_sn, pem, not_after) VALUES ($1, $2, $3) \
         ON CONFLICT (alipay_cert_sn) DO UPDATE SET pem = EXCLUDED.pem, not_after = EXCLUDED.not_after, fetched_at = now()",
    )
    .bind::<Text, _>(&cert.sn)
    .bind::<Text, _>(&cert.pem)
    .bind::<Timestamptz, _>(cert.not_after)
    .execute(conn)
    .await
    .context("storing the Alipay certificate")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_sns_cost_a_lookup_every_few_seconds_and_a_download_a_minute() {
        let r = RenewedCerts::default();
        let t0 = Utc::now();
        let s = TimeDelta::seconds;
        assert_eq!(r.unknown_sn_step(t0), UnknownSnStep::LookupThenDownload);
        for i in 0..100 {
            assert_eq!(
                r.unknown_sn_step(t0 + TimeDelta::milliseconds(i * 40)),
                UnknownSnStep::Nothing
            );
        }
        assert_eq!(r.unknown_sn_step(t0 + s(6)), UnknownSnStep::Lookup);
        assert_eq!(r.unknown_sn_step(t0 + s(7)), UnknownSnStep::Nothing);
        assert_eq!(r.unknown_sn_step(t0 + s(61)), UnknownSnStep::LookupThenDownload);
    }
}
