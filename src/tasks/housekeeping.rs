//! `alert:check` and `data:cleanup`.

use diesel::sql_types::BigInt;
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, RunQueryDsl};

use crate::app::AppState;
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
            let stuck: Vec<Stuck> = diesel::sql_query(format!(
                "WITH s AS (UPDATE task_runs SET status = 'FAILED', finished_at = now(),
                                detail = 'stuck: no outcome after {STUCK_MINUTES} minutes (instance died?)'
                             WHERE status = 'RUNNING' AND started_at < now() - interval '{STUCK_MINUTES} minutes'
                            RETURNING id, task, instance),
                      r AS (UPDATE reconciliation_runs SET status = 'FAILED', finished_at = now(),
                                error = 'stuck: no outcome after an hour (instance died?)'
                             WHERE status = 'RUNNING' AND started_at < now() - interval '1 hour'
                            RETURNING id, 'reconcile:' || provider AS task, '' AS instance)
                 SELECT id, task, instance, true AS task_run FROM s
                 UNION ALL SELECT id, task, instance, false FROM r"
            ))
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
    let dead: N = diesel::sql_query("SELECT count(*) AS n FROM compensation_events WHERE status = 'DEAD'")
        .get_result(&mut conn)
        .await?;
    metrics::gauge!("fitorder_compensation_dead").set(dead.n as f64);
    let backlog: N = diesel::sql_query(
        "SELECT count(*) AS n FROM compensation_events WHERE status IN ('PENDING', 'RETRYING') AND next_attempt_at < now() - interval '5 minutes'",
    )
    .get_result(&mut conn)
    .await?;
    metrics::gauge!("fitorder_compensation_overdue").set(backlog.n as f64);
    if dead.n > 0 {
        tracing::warn!(dead = dead.n, "DEAD compensation events wait for a replay");
    }
    if backlog.n > 0 {
        tracing::warn!(
            overdue = backlog.n,
            "compensation events overdue by more than 5 minutes (no worker running?)"
        );
    }
    Ok(stuck + raised + dead.n + backlog.n)
}

/// Prunes what is safe to prune: old idempotency keys, old successful attempt logs, delivered
/// outbox events past [`OUTBOX_RETENTION_DAYS`] with their attempts, old task runs, unverified
/// callbacks past their week (or beyond the newest [`UNVERIFIED_KEEP`]) — never anything an
/// open ticket's order needs.
pub async fn data_cleanup(state: AppState) -> AppResult<i64> {
    let mut conn = state.pool.get().await?;
    let r: N = diesel::sql_query(format!(
        "WITH open_orders AS (
            SELECT order_id FROM exception_tickets WHERE status IN ('OPEN', 'IN_PROGRESS') AND order_id IS NOT NULL
         ), keys AS (
            DELETE FROM payment_keys k USING payment_callbacks c
             WHERE k.callback_id = c.id AND k.created_at < now() - interval '{KEY_RETENTION_DAYS} days'
               AND (c.order_id IS NULL OR c.order_id NOT IN (SELECT order_id FROM open_orders))
            RETURNING 1
         ), delivered AS (
            SELECT e.id FROM compensation_events e
             WHERE e.status = 'SUCCEEDED' AND e.updated_at < now() - interval '{OUTBOX_RETENTION_DAYS} days'
               AND e.kind <> 'PROVIDER_REFUND'
               AND e.order_id NOT IN (SELECT order_id FROM open_orders)
               AND NOT EXISTS (SELECT 1 FROM compensation_replays r WHERE r.event_id = e.id)
             ORDER BY e.updated_at
             LIMIT {OUTBOX_PRUNE_BATCH}
         ), attempts AS (
            DELETE FROM compensation_attempts a USING compensation_events e
             WHERE a.event_id = e.id AND a.ok AND e.status = 'SUCCEEDED'
               AND a.at < now() - interval '{ATTEMPT_RETENTION_DAYS} days'
               AND e.order_id NOT IN (SELECT order_id FROM open_orders)
               AND e.id NOT IN (SELECT id FROM delivered)
            RETURNING 1
         ), delivered_attempts AS (
            DELETE FROM compensation_attempts a WHERE a.event_id IN (SELECT id FROM delivered)
            RETURNING 1
         ), events AS (
            -- With their attempts: the foreign key is checked at the end of the statement.
            DELETE FROM compensation_events e WHERE e.id IN (SELECT id FROM delivered)
            RETURNING 1
         ), unverified AS (
            DELETE FROM payment_callbacks c
             WHERE NOT c.verified AND c.order_id IS NULL
               AND (c.received_at < now() - interval '{UNVERIFIED_RETENTION_DAYS} days'
                    OR c.id <= (SELECT id FROM payment_callbacks WHERE NOT verified
                                 ORDER BY id DESC OFFSET {UNVERIFIED_KEEP} LIMIT 1))
               AND NOT EXISTS (SELECT 1 FROM payment_keys k WHERE k.callback_id = c.id)
            RETURNING 1
         ), runs AS (
            DELETE FROM task_runs WHERE status <> 'RUNNING' AND started_at < now() - interval '{TASK_RUN_RETENTION_DAYS} days'
            RETURNING 1
         )
         SELECT (SELECT count(*) FROM keys) + (SELECT count(*) FROM attempts) + (SELECT count(*) FROM runs)
                + (SELECT count(*) FROM unverified) + (SELECT count(*) FROM events)
                + (SELECT count(*) FROM delivered_attempts) AS n"
    ))
    .get_result(&mut conn)
    .await?;
    tracing::info!(pruned = r.n, "data cleanup");
    Ok(r.n)
}
