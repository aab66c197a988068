//! WeChat Pay platform certificates kept in the database, so every instance verifies with the
//! same set, and the in-process [`SharedKeyring`] filled from it. The HTTP call to
//! `GET /v3/certificates` is the caller's: hand its answer body to
//! [`SharedKeyring::refresh_from_answer`].
//!
//! Refresh policy: at least every [`REFRESH_EVERY_SECS`] (WeChat: "间隔应小于12小时"), and at
//! once when a notification or answer names an unknown `Wechatpay-Serial` — in both modes: with
//! a 微信支付公钥 configured, certificates still come during WeChat's switch — at most once per
//! [`FORCE_MIN_INTERVAL_SECS`] per process and across instances ([`SharedKeyring::may_force_refresh`]).
//! An instance that is refused the forced fetch reloads a little later (the instance that won
//! stores what it fetched), at most every [`UNKNOWN_RELOAD_MIN_INTERVAL_SECS`]: what an unknown
//! serial may cost is decided in memory first ([`SharedKeyring::unknown_serial_step`]), so forged
//! notifications naming made-up serials cost no database work beyond that.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use anyhow::{Context, Result};
use chrono::{DateTime, TimeDelta, Utc};
use diesel::prelude::*;
use diesel::upsert::excluded;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use rsa::RsaPublicKey;

use super::certs::{decrypt_certificates, parse_certificate, Keyring, PlatformCert, VerifyError};
use crate::db::schema::{wechat_platform_cert_refreshes as refreshes, wechat_platform_certs as certs};

/// The longest time between two fetches of the platform certificates (12 h).
pub const REFRESH_EVERY_SECS: i64 = 12 * 3600;
/// The shortest time between two forced fetches, per process and across instances (60 s).
pub const FORCE_MIN_INTERVAL_SECS: i64 = 60;
/// The shortest time between two reloads from the database for an unknown serial, per process
/// (5 s): a flood of forged notifications naming made-up serials costs at most this.
pub const UNKNOWN_RELOAD_MIN_INTERVAL_SECS: i64 = 5;
/// The `wechat_platform_cert_refreshes` row this store uses.
pub const REFRESH_SCOPE: &str = "wechat";

/// Upserts platform certificates by serial (`fetched_at` becomes now); returns how many.
pub async fn store(conn: &mut AsyncPgConnection, platform_certs: &[PlatformCert]) -> Result<usize> {
    if platform_certs.is_empty() {
        return Ok(0);
    }
    let rows: Vec<_> = platform_certs
        .iter()
        .map(|c| {
            (
                certs::serial_no.eq(c.serial_no.to_ascii_uppercase()),
                certs::pem.eq(&c.pem),
                certs::effective_at.eq(Some(c.effective_time)),
                certs::expire_at.eq(Some(c.expire_time)),
            )
        })
        .collect();
    let n = diesel::insert_into(certs::table)
        .values(rows)
        .on_conflict(certs::serial_no)
        .do_update()
        .set((
            certs::pem.eq(excluded(certs::pem)),
            certs::effective_at.eq(excluded(certs::effective_at)),
            certs::expire_at.eq(excluded(certs::expire_at)),
            certs::fetched_at.eq(diesel::dsl::now),
        ))
        .execute(conn)
        .await
        .context("storing the platform certificates")?;
    Ok(n)
}

/// The stored platform certificates that have not expired (unreadable rows are skipped, logged).
pub async fn load(conn: &mut AsyncPgConnection) -> Result<Vec<PlatformCert>> {
    type Row = (String, String, Option<DateTime<Utc>>, Option<DateTime<Utc>>);
    let rows: Vec<Row> = certs::table
        .filter(certs::expire_at.is_null().or(certs::expire_at.gt(diesel::dsl::now)))
        .select((certs::serial_no, certs::pem, certs::effective_at, certs::expire_at))
        .order(certs::serial_no)
        .load(conn)
        .await
        .context("loading the platform certificates")?;
    let now = Utc::now();
    let mut out = Vec::with_capacity(rows.len());
    for (serial_no, pem, effective_at, expire_at) in rows {
        let parsed = parse_certificate(pem.as_bytes()).and_then(|info| Ok((info.rsa_public_key()?, info)));
        let (public_key, info) = match parsed {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(serial_no, error = %e, "skipping an unreadable stored platform certificate");
                continue;
            }
        };
        let expire_time = expire_at.unwrap_or(info.not_after);
        if expire_time <= now {
            continue;
        }
        out.push(PlatformCert {
            serial_no,
            effective_time: effective_at.unwrap_or(info.not_before),
            expire_time,
            pem,
            public_key,
        });
    }
    Ok(out)
}

/// When the certificates were last fetched successfully, by any instance.
pub async fn last_success(conn: &mut AsyncPgConnection) -> Result<Option<DateTime<Utc>>> {
    let t: Option<Option<DateTime<Utc>>> = refreshes::table
        .find(REFRESH_SCOPE)
        .select(refreshes::last_success_at)
        .first(conn)
        .await
        .optional()
        .context("reading the last certificate refresh")?;
    Ok(t.flatten())
}

struct Inner {
    ring: Keyring,
    last_success: Option<DateTime<Utc>>,
    last_forced: Option<DateTime<Utc>>,
    last_unknown_reload: Option<DateTime<Utc>>,
}

/// What an unknown `Wechatpay-Serial` may cost now ([`SharedKeyring::unknown_serial_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownSerialStep {
    /// Claim a forced fetch of `/v3/certificates` (nobody in this process tried within
    /// [`FORCE_MIN_INTERVAL_SECS`]).
    Fetch,
    /// Reload what another instance may have stored (at most every
    /// [`UNKNOWN_RELOAD_MIN_INTERVAL_SECS`]).
    Reload,
    /// Nothing: the database was asked a moment ago.
    Nothing,
}

fn within(last: Option<DateTime<Utc>>, now: DateTime<Utc>, secs: i64) -> bool {
    last.is_some_and(|t| now >= t && now - t < TimeDelta::seconds(secs))
}

/// The process's WeChat Pay keyring (public key + platform certificates), shared by handlers
/// and refreshed from the database.
#[derive(Clone)]
pub struct SharedKeyring {
    inner: Arc<RwLock<Inner>>,
    /// How often an unknown serial made this process go to the database (fetch claims and
    /// reloads): bounded by the gates of [`SharedKeyring::unknown_serial_step`].
    unknown_db_visits: Arc<std::sync::atomic::AtomicU64>,
}

impl SharedKeyring {
    /// A keyring with the configured 微信支付公钥 (if any) and no certificates yet.
    pub fn new(public_key: Option<(String, RsaPublicKey)>) -> SharedKeyring {
        let mut ring = Keyring::new();
        ring.set_public_key(public_key);
        SharedKeyring {
            inner: Arc::new(RwLock::new(Inner {
                ring,
                last_success: None,
                last_forced: None,
                last_unknown_reload: None,
            })),
            unknown_db_visits: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        }
    }

    /// [`SharedKeyring::new`], then [`SharedKeyring::reload`].
    pub async fn from_db(
        conn: &mut AsyncPgConnection,
        public_key: Option<(String, RsaPublicKey)>,
    ) -> Result<SharedKeyring> {
        let k = SharedKeyring::new(public_key);
        k.reload(conn).await?;
        Ok(k)
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the certificates with the stored, unexpired ones; returns how many.
    pub async fn reload(&self, conn: &mut AsyncPgConnection) -> Result<usize> {
        let loaded = load(conn).await?;
        let last = last_success(conn).await?;
        let n = loaded.len();
        let mut inner = self.write();
        inner.ring.replace_certs(loaded);
        inner.last_success = last;
        Ok(n)
    }

    /// A copy of the current keyring.
    pub fn snapshot(&self) -> Keyring {
        self.read().ring.clone()
    }

    /// The key a `Wechatpay-Serial` names (see [`Keyring::key_for`]).
    pub fn key_for(&self, serial: &str) -> Option<RsaPublicKey> {
        self.read().ring.key_for(serial).cloned()
    }

    /// Verifies with the key the `Wechatpay-Serial` names (see [`Keyring::verify`]).
    pub fn verify(
        &self,
        serial: &str,
        timestamp: &str,
        nonce: &str,
        body: &[u8],
        signature_b64: &str,
    ) -> Result<(), VerifyError> {
        self.read().ring.verify(serial, timestamp, nonce, body, signature_b64)
    }

    /// When the certificates were last fetched (by any instance, as of the last reload).
    pub fn last_refresh(&self) -> Option<DateTime<Utc>> {
        self.read().last_success
    }

    /// True when the last fetch is [`REFRESH_EVERY_SECS`] old or there was none.
    pub fn needs_refresh(&self, now: DateTime<Utc>) -> bool {
        self.last_refresh()
            .is_none_or(|t| now - t >= TimeDelta::seconds(REFRESH_EVERY_SECS))
    }

    /// What an unknown serial may cost at `now`, decided in memory before any database work:
    /// a fetch claim at most every [`FORCE_MIN_INTERVAL_SECS`], a reload at most every
    /// [`UNKNOWN_RELOAD_MIN_INTERVAL_SECS`], otherwise nothing. A step other than `Nothing` is
    /// counted as a database visit.
    pub fn unknown_serial_step(&self, now: DateTime<Utc>) -> UnknownSerialStep {
        let mut inner = self.write();
        let step = if !within(inner.last_forced, now, FORCE_MIN_INTERVAL_SECS) {
            UnknownSerialStep::Fetch
        } else if !within(inner.last_unknown_reload, now, UNKNOWN_RELOAD_MIN_INTERVAL_SECS) {
            inner.last_unknown_reload = Some(now);
            UnknownSerialStep::Reload
        } else {
            UnknownSerialStep::Nothing
        };
        if step != UnknownSerialStep::Nothing {
            self.unknown_db_visits
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        step
    }

    /// How many times an unknown serial made this process go to the database.
    pub fn unknown_serial_db_visits(&self) -> u64 {
        std::sync::atomic::AtomicU64::load(&self.unknown_db_visits, std::sync::atomic::Ordering::Relaxed)
    }

    /// Claims a forced fetch (unknown serial): false when this process tried in the last
    /// [`FORCE_MIN_INTERVAL_SECS`], or another instance claimed one in that time.
    pub async fn may_force_refresh(&self, conn: &mut AsyncPgConnection, now: DateTime<Utc>) -> Result<bool> {
        let gap = TimeDelta::seconds(FORCE_MIN_INTERVAL_SECS);
        {
            let mut inner = self.write();
            if within(inner.last_forced, now, FORCE_MIN_INTERVAL_SECS) {
                return Ok(false);
            }
            inner.last_forced = Some(now);
            inner.last_unknown_reload = Some(now);
        }
        // One statement: the row lock of ON CONFLICT DO UPDATE serializes racing instances, and
        // the WHERE is evaluated on the latest row, so exactly one of them gets a row back.
        #[derive(QueryableByName)]
        struct Claimed {
            #[diesel(sql_type = diesel::sql_types::Text)]
            #[allow(dead_code)]
            scope: String,
        }
        use diesel::sql_types::{Text, Timestamptz};
        let claimed: Vec<Claimed> = crate::db::sql::StaticQuery::new(include_str!("platform_keys/claim_refresh.sql"))
            .bind::<Text, _>(REFRESH_SCOPE) // $1
            .bind::<Timestamptz, _>(now) // $2
            .bind::<Timestamptz, _>(now - gap) // $3
            .load(conn)
            .await
            .context("claiming a platform certificate refresh")?;
        Ok(!claimed.is_empty())
    }

    /// Takes a fetched `/v3/certificates` answer: decrypts and checks it, stores the
    /// certificates, records the fetch and reloads; returns how many certificates it held.
    pub async fn refresh_from_answer(
        &self,
        conn: &mut AsyncPgConnection,
        apiv3_key: &[u8],
        body: &[u8],
    ) -> Result<usize> {
        let fetched = decrypt_certificates(apiv3_key, body).context("reading the /v3/certificates answer")?;
        conn.transaction(async |conn| -> Result<()> {
            store(conn, &fetched).await?;
            diesel::insert_into(refreshes::table)
                .values((
                    refreshes::scope.eq(REFRESH_SCOPE),
                    refreshes::last_success_at.eq(diesel::dsl::now),
                ))
                .on_conflict(refreshes::scope)
                .do_update()
                .set(refreshes::last_success_at.eq(diesel::dsl::now))
                .execute(conn)
                .await
                .context("recording the certificate refresh")?;
            Ok(())
        })
        .await?;
        self.reload(conn).await?;
        Ok(fetched.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Handlers run on tokio's multi-threaded runtime: the keyring's futures must be Send
    /// (no lock guard held across an await). A compile-time check.
    #[allow(dead_code)]
    fn futures_are_send(k: &SharedKeyring, c: &mut AsyncPgConnection) {
        fn send<T: Send>(_: T) {}
        send(k.reload(c));
        send(k.may_force_refresh(c, Utc::now()));
        send(k.refresh_from_answer(c, b"", b""));
        send(store(c, &[]));
        send(load(c));
        fn shared<T: Send + Sync + Clone>() {}
        shared::<SharedKeyring>();
    }
}
