//! `alert:check` and `data:cleanup`.

use diesel::sql_types::BigInt;
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, RunQueryDsl};

use crate::app::AppState;
use crate::db::sql::StaticQuery;
use crate::error::AppResult;

#[derive(QueryableByName)]
struct Stuck {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    task: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    instance: String,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    task_run: bool,
}

#[derive(QueryableByName)]
struct N {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// How long a task run may stay RUNNING before it is declared stuck (its instance died).
const STUCK_MINUTES: i64 = 15;
/// Idempotency keys are kept well past the providers' retry windows (a day or so).
const KEY_RETENTION_DAYS: i64 = 90;
/// Successful delivery attempts are kept this long; failures and anything a ticket needs stay.
const ATTEMPT_RETENTION_DAYS: i64 = 90;
const TASK_RUN_RETENTION_DAYS: i64 = 30;
/// Delivered (SUCCEEDED) outbox events are kept this long after delivery, then pruned with
/// their attempts — except refunds (PROVIDER_REFUND: the money's evidence, read by refund
/// callbacks and the bills), events that were replayed by hand (their audit trail), and
/// anything about an order an open ticket is about.
pub const OUTBOX_RETENTION_DAYS: i64 = 90;
/// At most this many events per run (the daily run catches up over days, in bounded statements).
const OUTBOX_PRUNE_BATCH: i64 = 50_000;
/// Callbacks whose signature did not verify (anybody's traffic) are kept a week, and at most
/// this many of them (the newest): enough to look into an attack, not a way to fill the disk.
const UNVERIFIED_RETENTION_DAYS: i64 = 7;
pub const UNVERIFIED_KEEP: i64 = 100_000;

/// Looks for what needs a human: DEAD events, stuck task runs and reconciliations. Stuck runs
/// are closed as FAILED (so the next tick can run); every finding is logged as an alert.
pub async fn alert_check(state: AppState) -> AppResult<i64> {
    let mut conn = state.pool.get().await?;
    // Stuck runs are closed and alerted in one transaction (a stuck reconciliation becomes a
    // FAILED run, which the sweep alerts as such).
    let (stuck, raised) = conn
        .transaction(async |conn| -> AppResult<(i64, i64)> {
            let stuck: Vec<Stuck> = StaticQuery::new(include_str!("stuck_runs.sql"))
                .bind::<BigInt, _>(STUCK_MINUTES) // $1
                .bind::<BigInt, _>(crate::reconciliation::RUN_LEASE_SECS) // $2
                .load(conn)
                .await?;
            let task_runs: Vec<(i64, String, String)> = stuck
                .iter()
                .filter(|s| s.task_run)
                .map(|s| (s.id, s.task.clone(), s.instance.clone()))
                .collect();
            let raised = crate::alerts::sweep(
                conn,
                &state.config,
                &crate::reconciliation::configured_providers(&state),
                &task_runs,
            )
            .await?;
            Ok((stuck.len() as i64, raised))
        })
        .await?;
    if stuck > 0 {
        tracing::error!(runs = stuck, "stuck runs closed as FAILED");
    }
    #[derive(QueryableByName)]
    struct Outbox {
        #[diesel(sql_type = BigInt)]
        dead: i64,
        #[diesel(sql_type = BigInt)]
        overdue: i64,
    }
    let outbox: Outbox = StaticQuery::new(include_str!("outbox_counts.sql"))
        .get_result(&mut conn)
        .await?;
    let (dead, backlog) = (outbox.dead, outbox.overdue);
    metrics::gauge!("fitorder_compensation_dead").set(dead as f64);
    metrics::gauge!("fitorder_compensation_overdue").set(backlog as f64);
    if dead > 0 {
        tracing::warn!(dead, "DEAD compensation events wait for a replay");
    }
    if backlog > 0 {
        tracing::warn!(
            overdue = backlog,
            "compensation events overdue by more than 5 minutes (no worker running?)"
        );
    }
    Ok(stuck + raised + dead + backlog)
}

/// Prunes what is safe to prune: old idempotency keys, old successful attempt logs, delivered
/// outbox events past [`OUTBOX_RETENTION_DAYS`] with their attempts, old task runs, unverified
/// callbacks past their week (or beyond the newest [`UNVERIFIED_KEEP`]) — never anything an
/// open ticket's order needs.
pub async fn data_cleanup(state: AppState) -> AppResult<i64> {
    let mut conn = state.pool.get().await?;
    let r: N = StaticQuery::new(include_str!("data_cleanup.sql"))
        .bind::<BigInt, _>(KEY_RETENTION_DAYS) // $1
        .bind::<BigInt, _>(OUTBOX_RETENTION_DAYS) // $2
        .bind::<BigInt, _>(OUTBOX_PRUNE_BATCH) // $3
        .bind::<BigInt, _>(ATTEMPT_RETENTION_DAYS) // $4
        .bind::<BigInt, _>(UNVERIFIED_RETENTION_DAYS) // $5
        .bind::<BigInt, _>(UNVERIFIED_KEEP) // $6
        .bind::<BigInt, _>(TASK_RUN_RETENTION_DAYS) // $7
        .get_result(&mut conn)
        .await?;
    let sessions = crate::sessions::prune(&mut conn).await?;
    tracing::info!(pruned = r.n + sessions, "data cleanup");
    Ok(r.n + sessions)
}
