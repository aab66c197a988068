//! The process's keyring ([`SharedKeyring`]) and its refresh policy: the 12-hour schedule,
//! unknown serials (single-flight, rate-limited, counted), the forced fetch claimed across
//! instances, and a fetched answer stored and reloaded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use anyhow::{Context, Result};
use chrono::{DateTime, TimeDelta, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use futures_util::future::{BoxFuture, Shared};
use futures_util::FutureExt;
use rsa::RsaPublicKey;

use super::certificates::decrypt_certificates;
use super::keyring::{Keyring, VerifyError};
use super::storage::{last_success, load, store, REFRESH_SCOPE};
use crate::db::schema::wechat_platform_cert_refreshes as refreshes;

/// The longest time between two fetches of the platform certificates (12 h).
pub const REFRESH_EVERY_SECS: i64 = 12 * 3600;
/// The shortest time between two forced fetches, per process and across instances (60 s).
pub const FORCE_MIN_INTERVAL_SECS: i64 = 60;
/// The shortest time between two refreshes started by unknown serials, per process (10 s): a
/// flood of forged notifications naming made-up serials costs at most one refresh this often
/// (one claim, and a fetch or a reload). WeChat retries a refused notification after 15 s, so a
/// serial that appeared meanwhile is looked for again by then.
pub const UNKNOWN_REFRESH_MIN_INTERVAL_SECS: i64 = 10;
/// How long a notification naming an unknown serial waits for the refresh in flight before it
/// is refused (the refresh goes on; WeChat retries).
pub const UNKNOWN_SERIAL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A refresh started by an unknown serial, shared by every request that waits for it.
pub type Refresh = Shared<BoxFuture<'static, ()>>;

struct Inner {
    ring: Keyring,
    last_success: Option<DateTime<Utc>>,
    last_forced: Option<DateTime<Utc>>,
    /// When an unknown serial last started a refresh in this process.
    last_unknown_refresh: Option<DateTime<Utc>>,
    /// That refresh (finished or not).
    refresh: Option<Refresh>,
}

/// What unknown serials have cost this process, for tests and the log (the metric
/// `fitorder_wechat_unknown_serials_total` counts the same by outcome).
#[derive(Default)]
struct UnknownSerialCounts {
    /// Lookups of a serial nobody knows.
    seen: AtomicU64,
    /// Refreshes they started.
    refreshes: AtomicU64,
    /// Pool checkouts those refreshes made.
    db_visits: AtomicU64,
}

fn within(last: Option<DateTime<Utc>>, now: DateTime<Utc>, secs: i64) -> bool {
    last.is_some_and(|t| now >= t && now - t < TimeDelta::seconds(secs))
}

/// The process's WeChat Pay keyring (public key + platform certificates), shared by handlers
/// and refreshed from the database.
#[derive(Clone)]
pub struct SharedKeyring {
    inner: Arc<RwLock<Inner>>,
    unknown: Arc<UnknownSerialCounts>,
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
                last_unknown_refresh: None,
                refresh: None,
            })),
            unknown: Arc::default(),
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

    /// A `Wechatpay-Serial` no key has, decided in memory (no database work here): the refresh to
    /// wait for — the one in flight, or one started now with `start` (spawned: it runs to its
    /// end whoever waits) when none was started in the last [`UNKNOWN_REFRESH_MIN_INTERVAL_SECS`]
    /// — or None: refused at once. Counted in `fitorder_wechat_unknown_serials_total`.
    pub fn unknown_serial(
        &self,
        now: DateTime<Utc>,
        start: impl FnOnce() -> BoxFuture<'static, ()>,
    ) -> Option<Refresh> {
        self.unknown.seen.fetch_add(1, Ordering::Relaxed);
        let mut inner = self.write();
        let in_flight = inner.refresh.as_ref().filter(|r| r.peek().is_none()).cloned();
        let (outcome, refresh) = if let Some(r) = in_flight {
            ("joined", Some(r))
        } else if within(inner.last_unknown_refresh, now, UNKNOWN_REFRESH_MIN_INTERVAL_SECS) {
            ("refused", None)
        } else {
            inner.last_unknown_refresh = Some(now);
            self.unknown.refreshes.fetch_add(1, Ordering::Relaxed);
            let task = tokio::spawn(start());
            let r = async move {
                let _ = task.await;
            }
            .boxed()
            .shared();
            inner.refresh = Some(r.clone());
            ("refresh", Some(r))
        };
        drop(inner);
        metrics::counter!("fitorder_wechat_unknown_serials_total", "outcome" => outcome).increment(1);
        refresh
    }

    /// A pool checkout made by a refresh an unknown serial started.
    pub fn count_unknown_serial_db_visit(&self) {
        self.unknown.db_visits.fetch_add(1, Ordering::Relaxed);
    }

    /// How many times an unknown serial was looked up.
    pub fn unknown_serials_seen(&self) -> u64 {
        AtomicU64::load(&self.unknown.seen, Ordering::Relaxed)
    }

    /// How many refreshes unknown serials started.
    pub fn unknown_serial_refreshes(&self) -> u64 {
        AtomicU64::load(&self.unknown.refreshes, Ordering::Relaxed)
    }

    /// How many pool checkouts those refreshes made.
    pub fn unknown_serial_db_visits(&self) -> u64 {
        AtomicU64::load(&self.unknown.db_visits, Ordering::Relaxed)
    }

    /// The refresh an unknown serial started last, to wait for (tests: before counting).
    pub fn unknown_serial_refresh(&self) -> Option<Refresh> {
        self.read().refresh.clone()
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
        let claimed: Vec<Claimed> = crate::db::sql::StaticQuery::new(include_str!("claim_refresh.sql"))
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
