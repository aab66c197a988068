//! Anomaly statistics, computed from the rows the chain leaves behind (callbacks, transitions,
//! check-in replays, compensation attempts, tickets), never from in-memory counters that a
//! restart would lose.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Nullable, Text, Timestamptz};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::db::schema::anomaly_events;
use crate::domain::{AnomalyCategory, TraceId};
use crate::error::{AppError, AppResult};

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = Text)]
    category: AnomalyCategory,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// `store` narrows to one store; `scope` to a store-limited admin's stores.
pub async fn count(
    conn: &mut AsyncPgConnection,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    store: Option<i64>,
    scope: Option<Vec<i64>>,
) -> AppResult<HashMap<AnomalyCategory, i64>> {
    let rows: Vec<Row> = diesel::sql_query(
        "WITH f AS (SELECT $1::timestamptz AS t0, $2::timestamptz AS t1),
         counted(category, store_id) AS (
            SELECT CASE outcome
                     WHEN 'DUPLICATE' THEN 'DUPLICATE_CALLBACK'
                     WHEN 'BAD_SIGNATURE' THEN 'BAD_SIGNATURE'
                     WHEN 'REJECTED_TRANSITION' THEN 'ILLEGAL_TRANSITION'
                     WHEN 'PAID_AFTER_CANCEL' THEN 'PAID_AFTER_CANCEL'
                     WHEN 'AMOUNT_MISMATCH' THEN 'AMOUNT_MISMATCH'
                   END, store_id
              FROM payment_callbacks, f WHERE received_at >= f.t0 AND received_at < f.t1
               AND outcome IN ('DUPLICATE', 'BAD_SIGNATURE', 'REJECTED_TRANSITION', 'PAID_AFTER_CANCEL', 'AMOUNT_MISMATCH')
            UNION ALL
            SELECT category, store_id FROM anomaly_events, f WHERE at >= f.t0 AND at < f.t1
            UNION ALL
            SELECT 'ORDER_EXPIRED', o.store_id FROM order_transitions t JOIN orders o ON o.id = t.order_id, f
             WHERE t.to_status = 'CANCELED' AND t.reason = 'TIMEOUT' AND t.at >= f.t0 AND t.at < f.t1
            UNION ALL
            SELECT 'COMPENSATION_RETRY', o.store_id FROM compensation_attempts a
              JOIN compensation_events e ON e.id = a.event_id JOIN orders o ON o.id = e.order_id, f
             WHERE NOT a.ok AND a.at >= f.t0 AND a.at < f.t1
            UNION ALL
            SELECT CASE WHEN kind = 'COMPENSATION_DEAD' THEN 'COMPENSATION_DEAD' ELSE 'RECONCILIATION_FINDING' END, store_id
              FROM exception_tickets, f WHERE opened_at >= f.t0 AND opened_at < f.t1
               AND (kind IN ('COMPENSATION_DEAD', 'PROVIDER_PAID_LOCAL_UNPAID', 'LOCAL_PAID_PROVIDER_MISSING', 'REFUND_MISMATCH')
                    OR (kind = 'AMOUNT_MISMATCH' AND detail->>'source' = 'reconciliation'))
         )
         SELECT category, count(*) AS n FROM counted
          WHERE ($3::bigint IS NULL OR store_id = $3)
            AND ($4::bigint[] IS NULL OR store_id = ANY($4))
          GROUP BY category",
    )
    .bind::<Timestamptz, _>(from)
    .bind::<Timestamptz, _>(to)
    .bind::<Nullable<BigInt>, _>(store)
    .bind::<Nullable<Array<BigInt>>, _>(scope)
    .load(conn)
    .await?;
    Ok(rows.into_iter().map(|r| (r.category, r.n)).collect())
}

/// A status change the state machine refused leaves no row in its rolled-back transaction, so
/// it is counted here (ILLEGAL_TRANSITION) for `anomalyStats` to show how often callers try.
/// `result` is the change's and is returned as it was: not being able to count it is logged,
/// and never changes the caller's answer.
pub async fn note_refused<T>(
    conn: &mut AsyncPgConnection,
    order_no: &str,
    trace: &TraceId,
    result: AppResult<T>,
) -> AppResult<T> {
    if let Err(AppError::IllegalTransition { from, to }) = &result {
        let order = crate::orders::find_order(conn, order_no).await.unwrap_or_else(|e| {
            tracing::warn!(order_no, error = %e.message(), "refused transition: order not found again");
            None
        });
        let counted = diesel::insert_into(anomaly_events::table)
            .values((
                anomaly_events::category.eq(AnomalyCategory::IllegalTransition),
                anomaly_events::order_id.eq(order.as_ref().map(|o| o.id)),
                anomaly_events::store_id.eq(order.as_ref().map(|o| o.store_id)),
                anomaly_events::detail.eq(format!("{order_no}: {from} -> {to}")),
                anomaly_events::trace_id.eq(trace.as_str()),
            ))
            .execute(conn)
            .await;
        if let Err(e) = counted {
            tracing::warn!(order_no, error = %AppError::from(e).message(), "refused transition not counted");
        }
    }
    result
}
