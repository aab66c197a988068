//! Anomaly statistics, computed from the rows the chain leaves behind (callbacks, transitions,
//! check-in replays, compensation attempts, tickets), never from in-memory counters that a
//! restart would lose.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use diesel::sql_types::{Array, BigInt, Nullable, Text, Timestamptz};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::db::sql::StaticQuery;
use crate::error::AppResult;

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = Text)]
    category: String,
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
) -> AppResult<HashMap<String, i64>> {
    let rows: Vec<Row> = StaticQuery::new(include_str!("anomalies/count.sql"))
        .bind::<Timestamptz, _>(from) // $1
        .bind::<Timestamptz, _>(to) // $2
        .bind::<Nullable<BigInt>, _>(store) // $3
        .bind::<Nullable<Array<BigInt>>, _>(scope) // $4
        .load(conn)
        .await?;
    Ok(rows.into_iter().map(|r| (r.category, r.n)).collect())
}
