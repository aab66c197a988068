//! The database: the connection pools, the embedded migrations, the schema and its rows, and
//! the LISTEN loop ([`events`]). Rank 2 (ARCHITECTURE.md, "Layers").

pub mod events;
pub mod models;
pub mod replica;
pub mod schema;
pub mod sql;

// The lower layers, under the names every crate of the workspace uses (`crate::domain::…`).
use crate as db;
#[allow(unused_imports)]
use fitorder_base::{auth, config, error, logging, ratelimit, trace};
use fitorder_domain as domain;

use anyhow::{Context, Result};
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
use diesel_async::AsyncPgConnection;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

pub type DbPool = Pool<AsyncPgConnection>;
pub type DbConn = Object<AsyncPgConnection>;

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("../../migrations");

/// A pool whose checkouts give up after a few seconds, so a database that is down or a pool
/// that is exhausted answers INTERNAL quickly instead of hanging the request.
pub fn pool(url: &str, size: usize) -> Result<DbPool> {
    pool_with(url, size, DEFAULT_STATEMENT_TIMEOUT)
}

/// No statement of a request or a task runs longer than this: a slow query fails cleanly.
pub const DEFAULT_STATEMENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A pool whose connections refuse statements running longer than `statement_timeout`.
pub fn pool_with(url: &str, size: usize, statement_timeout: std::time::Duration) -> Result<DbPool> {
    build_pool(url, size, statement_timeout, false, CHECKOUT_TIMEOUT)
}

/// A small pool for evidence rows (raw callbacks) whose commits do not wait for the disk: the
/// business transaction that follows commits synchronously and flushes them with it, and a
/// duplicate's record that a crash would lose changes nothing.
pub fn evidence_pool(url: &str, size: usize, statement_timeout: std::time::Duration) -> Result<DbPool> {
    build_pool(url, size, statement_timeout, true, CHECKOUT_TIMEOUT)
}

/// How long a checkout may wait for a connection, or for a new one to be made.
const CHECKOUT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

fn build_pool(
    url: &str,
    size: usize,
    statement_timeout: std::time::Duration,
    async_commit: bool,
    checkout_timeout: std::time::Duration,
) -> Result<DbPool> {
    let mut config = ManagerConfig::default();
    // No test query on every checkout (it doubled the round trips of short requests): a
    // connection that broke is discarded when it reports the error, and the next checkout gets
    // a fresh one.
    config.recycling_method = diesel_async::pooled_connection::RecyclingMethod::Fast;
    let ms = statement_timeout.as_millis().max(1);
    config.custom_setup = Box::new(move |url| {
        let url = url.to_string();
        Box::pin(async move {
            use diesel_async::{AsyncConnection, SimpleAsyncConnection};
            let mut conn = AsyncPgConnection::establish(&url).await?;
            // The session's settings in one round trip (`ms` is a number, nothing to quote).
            let mut setup = format!("SET statement_timeout = {ms}");
            if async_commit {
                setup.push_str("; SET synchronous_commit = off");
            }
            conn.batch_execute(&setup)
                .await
                .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
            Ok(conn)
        })
    });
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(url, config);
    Pool::builder(manager)
        // Once a statement met a server that takes no writes (a primary draining before its
        // demotion), a connection made before it is not reused: the next checkout connects
        // anew, to the new primary (a multi-host URL with `target_session_attrs=read-write`). A
        // closed one is dropped anyway (it reports itself broken). One atomic read a checkout.
        .pre_recycle(deadpool::managed::Hook::sync_fn(|_, metrics| {
            if crate::error::made_before_read_only_met(metrics.created) {
                Err(deadpool::managed::HookError::message(
                    "made before a read-only server was met",
                ))
            } else {
                Ok(())
            }
        }))
        .max_size(size)
        .wait_timeout(Some(checkout_timeout))
        .create_timeout(Some(checkout_timeout))
        .recycle_timeout(Some(checkout_timeout))
        .runtime(deadpool::Runtime::Tokio1)
        .build()
        .context("building the database pool")
}

/// Applies every pending migration. Safe to call from several processes at once: an advisory
/// lock makes the second one wait and then find nothing to do.
///
/// diesel-async's migration harness blocks in place, which needs a multi-threaded runtime; it
/// runs on a thread of its own so that any caller (a test's current-thread runtime too) can
/// await it.
pub async fn migrate(url: &str) -> Result<()> {
    let url = url.to_string();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let result = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(migrate_here(&url)));
        let _ = tx.send(result);
    });
    rx.await.context("the migration thread died")?
}

async fn migrate_here(url: &str) -> Result<()> {
    use diesel_async::{AsyncConnection, RunQueryDsl};
    let mut conn = AsyncPgConnection::establish(url)
        .await
        .with_context(|| format!("connecting to {}", redact(url)))?;
    diesel::select(sql::pg_advisory_lock(sql::lock_keys::MIGRATIONS))
        .execute(&mut conn)
        .await?;
    let mut harness = diesel_async::AsyncMigrationHarness::new(conn);
    let result = harness
        .run_pending_migrations(MIGRATIONS)
        .map(|applied| applied.len())
        .map_err(|e| anyhow::anyhow!("migration failed: {e}"));
    let mut conn = harness.into_inner();
    let fenced = match &result {
        Ok(_) => fence(&mut conn).await,
        Err(_) => Ok(()),
    };
    diesel::select(sql::pg_advisory_unlock(sql::lock_keys::MIGRATIONS))
        .execute(&mut conn)
        .await?;
    let applied = result?;
    if applied > 0 {
        tracing::info!(applied, "migrations applied");
    }
    fenced
}

/// How far every sequence jumps on a new timeline: more than any number of orders (or ids) a
/// restore could lose (a chain's orders of weeks), a thousandth of the order numbers' ten
/// digits, so a thousand timelines fit. A promotion is a new timeline too: every switchover and
/// failover spends one jump at the next start.
pub const FENCE_JUMP: i64 = 10_000_000;

/// The timeline fence (`fence.sql`): on a new timeline or cluster, every sequence jumps ahead
/// and the order numbers that may have been lost are written down (issue 38).
async fn fence(conn: &mut AsyncPgConnection) -> Result<()> {
    use diesel_async::RunQueryDsl;
    #[derive(diesel::QueryableByName)]
    struct Fenced {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        timeline: i32,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
        lost_order_seq_from: Option<i64>,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
        lost_order_seq_to: Option<i64>,
    }
    let rows: Vec<Fenced> = sql::StaticQuery::new(include_str!("fence.sql"))
        .bind::<diesel::sql_types::BigInt, _>(FENCE_JUMP)
        .load(conn)
        .await
        .context("the timeline fence")?;
    for f in rows {
        if let (Some(from), Some(to)) = (f.lost_order_seq_from, f.lost_order_seq_to) {
            tracing::warn!(
                timeline = f.timeline,
                lost_order_seq_from = from,
                lost_order_seq_to = to,
                "the database runs on a new timeline (a restore or a promotion): every sequence jumped ahead; \
                 run the reconciliation of the days since the restore point"
            );
        }
    }
    Ok(())
}

/// A URL without its password, for logs and messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{}:***{}", &url[..scheme + 3], user, &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}
