//! The matching of the staged bill against the books, in SQL, each difference a ticket.

use chrono::{NaiveDate, TimeZone, Utc};
use diesel::sql_types::{BigInt, Text, Timestamptz};
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};

use super::healing::heal;
use super::N;
use crate::app::AppState;
use crate::db::sql::StaticQuery;
use crate::domain::Provider;
use crate::error::{AppError, AppResult};
use crate::trace::TraceId;

pub(super) struct Matched {
    pub(super) local_rows: i64,
    pub(super) matched: i64,
    pub(super) tickets: i64,
}

/// The matching, in SQL: each statement finds one kind of finding and opens its tickets
/// through the tickets' one statement ([`crate::tickets::opening`]), returning the new ones. Ticket kinds that the callbacks already opened for the same provider
/// transaction (paid after cancel, unknown order, ...) are the same difference and are not
/// opened twice.
pub(super) async fn match_and_ticket(
    state: &AppState,
    run_id: i64,
    provider: Provider,
    date: NaiveDate,
    trace: &TraceId,
) -> AppResult<Matched> {
    let tz = state.config.timezone;
    let t0 = tz
        .from_local_datetime(&date.and_hms_opt(0, 0, 0).expect("midnight exists"))
        .earliest()
        .map(|t| t.with_timezone(&Utc))
        .ok_or_else(|| AppError::internal("no midnight on that day"))?;
    let t1 = t0 + chrono::Duration::days(1);
    let mut conn = state.pool.get().await?;
    // The staging rows were just COPYed: without statistics the planner would join a million
    // rows as if they were a handful.
    conn.batch_execute("ANALYZE bill_rows").await?;
    drop(conn);
    let confirmed = heal(state, run_id, provider, date, t0, t1, trace).await?;
    let mut conn = state.pool.get().await?;
    let findings = [
        include_str!("sql/provider_paid_local_unpaid.sql"),
        include_str!("sql/amount_mismatch.sql"),
        include_str!("sql/local_paid_provider_missing.sql"),
        include_str!("sql/refund_mismatch.sql"),
    ];
    let mut tickets = 0;
    for sql in findings {
        // The findings query feeds the tickets' one INSERT (which announces each new one).
        let ids: Vec<Id> = StaticQuery::new(crate::tickets::opening(sql))
            .bind::<BigInt, _>(run_id) // $1
            .bind::<Text, _>(provider) // $2
            .bind::<Text, _>(date.to_string()) // $3
            .bind::<Text, _>(trace.as_str()) // $4
            .bind::<Timestamptz, _>(t0) // $5
            .bind::<Timestamptz, _>(t1) // $6
            .bind::<diesel::sql_types::Array<Text>, _>(&confirmed) // $7
            .load(&mut conn)
            .await?;
        if !ids.is_empty() {
            tracing::info!(run = run_id, tickets = ?ids.iter().map(|i| i.id).collect::<Vec<_>>(), "reconciliation tickets opened");
        }
        tickets += ids.len() as i64;
    }
    let counts: N = StaticQuery::new(include_str!("sql/local_rows.sql"))
        .bind::<BigInt, _>(run_id)
        .bind::<Text, _>(provider)
        .bind::<Timestamptz, _>(t0)
        .bind::<Timestamptz, _>(t1)
        .get_result(&mut conn)
        .await?;
    let matched: N = StaticQuery::new(include_str!("sql/matched.sql"))
        .bind::<BigInt, _>(run_id)
        .bind::<Text, _>(provider)
        .get_result(&mut conn)
        .await?;
    Ok(Matched {
        local_rows: counts.n,
        matched: matched.n,
        tickets,
    })
}

#[derive(diesel::QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}
