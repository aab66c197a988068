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
use crate::db::sql::StaticQuery;
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
    let rows: Vec<Row> = StaticQuery::new(include_str!("anomalies/count.sql"))
        .bind::<Timestamptz, _>(from) // $1
        .bind::<Timestamptz, _>(to) // $2
        .bind::<Nullable<BigInt>, _>(store) // $3
        .bind::<Nullable<Array<BigInt>>, _>(scope) // $4
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
    if let Err(AppError::IllegalTransition(transition)) = &result {
        let order = crate::orders::find_order(conn, order_no).await.unwrap_or_else(|e| {
            tracing::warn!(order_no, error = %e.message(), "refused transition: order not found again");
            None
        });
        let counted = diesel::insert_into(anomaly_events::table)
            .values((
                anomaly_events::category.eq(AnomalyCategory::IllegalTransition),
                anomaly_events::order_id.eq(order.as_ref().map(|o| o.id)),
                anomaly_events::store_id.eq(order.as_ref().map(|o| o.store_id)),
                anomaly_events::detail.eq(format!("{order_no}: {transition}")),
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
