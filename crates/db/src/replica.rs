//! A streaming replica for reads (`FITORDER_READ_DATABASE_URL`): its pool, whether it may serve
//! a read now, and the read-your-writes positions kept in the primary.
//!
//! Which requests read it is decided in one place, `graphql::reads`; this module only answers
//! "may this replica serve a read that must see everything up to position L" and falls back
//! (metric `fitorder_read_replica_fallback_total{reason}`, a log line when the state changes)
//! when it may not: `unavailable` (no connection, a failing statement, or not a standby),
//! `lag` (further behind than `FITORDER_READ_MAX_LAG`, or its WAL receiver not running, so how
//! far behind is unknown), `read_your_writes` (it has not yet replayed the viewer's last write).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use diesel::sql_types::{Bool, Double, Nullable, Text};
use diesel_async::RunQueryDsl;

use super::sql::StaticQuery;
use super::{DbConn, DbPool};

/// After the replica could not be reached, reads skip it for this long (a replica that is down
/// costs a failed connection attempt once a second, not on every request).
pub const RETRY_DOWN_AFTER: Duration = Duration::from_secs(1);

/// How long a connection to the replica may take: a replica that does not answer must not hold
/// an admin page for the primary pool's five seconds.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a read that could have gone to the replica went to the primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    Unavailable,
    Lag,
    ReadYourWrites,
}

impl Fallback {
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::Unavailable => "unavailable",
            Fallback::Lag => "lag",
            Fallback::ReadYourWrites => "read_your_writes",
        }
    }
}

/// The replica as reads see it: its pool, the lag bound, and what it was last seen doing.
pub struct Replica {
    pool: DbPool,
    max_lag: Duration,
    /// Set when a connection or a statement failed: until then the replica is not tried.
    down_until: Mutex<Option<Instant>>,
    /// The last health state logged (0 serving, 1 unavailable, 2 lagging): one log line per
    /// change, not one per request.
    state: AtomicU8,
}

#[derive(diesel::QueryableByName)]
struct Status {
    #[diesel(sql_type = Bool)]
    standby: bool,
    #[diesel(sql_type = Bool)]
    streaming: bool,
    #[diesel(sql_type = Bool)]
    caught_up: bool,
    #[diesel(sql_type = Double)]
    lag_seconds: f64,
}

#[derive(diesel::QueryableByName)]
struct LastWrite {
    #[diesel(sql_type = Text)]
    lsn: String,
}

impl Replica {
    /// A replica pool of `size` connections (built without connecting).
    pub fn new(url: &str, size: usize, statement_timeout: Duration, max_lag: Duration) -> anyhow::Result<Replica> {
        Ok(Replica {
            pool: super::build_pool(url, size, statement_timeout, false, CONNECT_TIMEOUT)?,
            max_lag,
            down_until: Mutex::new(None),
            state: AtomicU8::new(0),
        })
    }

    pub fn pool(&self) -> &DbPool {
        &self.pool
    }

    /// Whether the replica may serve a read that must see every write up to `after` (a
    /// viewer's last write; None: no write to wait for). Counts and logs a fallback.
    pub async fn usable(&self, after: Option<&str>) -> Result<(), Fallback> {
        let result = self.check(after).await;
        match result {
            Ok(()) => self.note(0, || {
                tracing::info!("the read replica serves the admin console's reads again")
            }),
            Err(Fallback::Unavailable) => self.note(1, || {
                tracing::warn!(
                    reason = "unavailable",
                    "the read replica cannot be reached: reading the primary"
                )
            }),
            Err(Fallback::Lag) => self.note(2, || {
                tracing::warn!(
                    reason = "lag",
                    max_lag = ?self.max_lag,
                    "the read replica lags past FITORDER_READ_MAX_LAG: reading the primary"
                )
            }),
            Err(Fallback::ReadYourWrites) => {
                tracing::debug!(
                    reason = "read_your_writes",
                    "the replica has not replayed the viewer's last write"
                )
            }
        }
        if let Err(reason) = result {
            counted(reason);
        }
        result
    }

    /// A connection to the replica, for a request that [`Replica::usable`] let through; a
    /// failure is counted as a fallback and marks the replica down.
    pub async fn conn(&self) -> Result<DbConn, Fallback> {
        match self.pool.get().await {
            Ok(c) => {
                metrics::counter!("fitorder_read_replica_reads_total").increment(1);
                Ok(c)
            }
            Err(e) => {
                self.down(&e);
                counted(Fallback::Unavailable);
                Err(Fallback::Unavailable)
            }
        }
    }

    async fn check(&self, after: Option<&str>) -> Result<(), Fallback> {
        if self
            .down_until
            .lock()
            .expect("replica state")
            .is_some_and(|t| Instant::now() < t)
        {
            return Err(Fallback::Unavailable);
        }
        let mut conn = self.pool.get().await.map_err(|e| {
            self.down(&e);
            Fallback::Unavailable
        })?;
        let status: Status = match StaticQuery::new(include_str!("replica/status.sql"))
            .bind::<Nullable<Text>, _>(after)
            .get_result(&mut conn)
            .await
        {
            Ok(s) => s,
            Err(e) => {
                // A connection that failed (the replica restarted or went away) is not
                // returned, nor are the others opened before: they broke the same way.
                drop(deadpool::managed::Object::take(conn));
                self.pool.retain(|_, _| false);
                self.down(&e);
                return Err(Fallback::Unavailable);
            }
        };
        *self.down_until.lock().expect("replica state") = None;
        if !status.standby {
            // Promoted, or pointed at a primary by mistake: not the replica of this primary.
            return Err(Fallback::Unavailable);
        }
        if !status.streaming || status.lag_seconds > self.max_lag.as_secs_f64() {
            return Err(Fallback::Lag);
        }
        if !status.caught_up {
            return Err(Fallback::ReadYourWrites);
        }
        Ok(())
    }

    fn down(&self, e: &dyn std::fmt::Display) {
        tracing::debug!(error = %e, "the read replica failed");
        *self.down_until.lock().expect("replica state") = Some(Instant::now() + RETRY_DOWN_AFTER);
    }

    fn note(&self, state: u8, log: impl FnOnce()) {
        if self.state.swap(state, Ordering::Relaxed) != state {
            log();
        }
    }
}

fn counted(reason: Fallback) {
    metrics::counter!("fitorder_read_replica_fallback_total", "reason" => reason.as_str()).increment(1);
}

/// Remembers, in the primary, that `viewer` just wrote (after the write committed): until the
/// replica has replayed this far, that viewer's reads go to the primary.
pub async fn record_write(conn: &mut DbConn, viewer: &str) -> diesel::QueryResult<()> {
    StaticQuery::new(include_str!("replica/record_write.sql"))
        .bind::<Text, _>(viewer)
        .execute(conn)
        .await
        .map(|_| ())
}

/// Where `viewer`'s last write had reached (None: no write recorded), read from the primary.
pub async fn last_write(conn: &mut DbConn, viewer: &str) -> diesel::QueryResult<Option<String>> {
    use diesel::OptionalExtension;
    let row: Option<LastWrite> = StaticQuery::new(include_str!("replica/last_write.sql"))
        .bind::<Text, _>(viewer)
        .get_result(conn)
        .await
        .optional()?;
    Ok(row.map(|r| r.lsn))
}
