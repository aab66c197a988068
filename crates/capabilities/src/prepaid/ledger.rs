//! The prepaid ledger (预收资金台账): per date, the money a store holds for its members — what
//! came in, what it earned by use, what went back out — for finance and the regulator's filing.
//! `ledger.sql` gives each day's collected, refunded and closing balance; earned is the rest of
//! the day's change, so `balance = previous + collected − earned − refunded` holds to the cent
//! for any range.

use chrono::NaiveDate;
use chrono_tz::Tz;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::db::sql::StaticQuery;
use crate::error::{AppError, AppResult};

/// The longest range one ledger answers (a year; a leap year's too).
pub const MAX_RANGE_DAYS: i64 = 366;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepaidDay {
    pub date: NaiveDate,
    pub collected_cents: i64,
    pub earned_cents: i64,
    pub refunded_cents: i64,
    pub balance_cents: i64,
}

#[derive(diesel::QueryableByName)]
struct Row {
    #[diesel(sql_type = diesel::sql_types::Date)]
    day: NaiveDate,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    collected_cents: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    refunded_cents: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    balance_cents: i64,
}

/// The ledger of `store_id` from `from` through `to` (inclusive), one row per date, ascending.
pub async fn ledger(
    conn: &mut AsyncPgConnection,
    store_id: i64,
    from: NaiveDate,
    to: NaiveDate,
    tz: Tz,
) -> AppResult<Vec<PrepaidDay>> {
    use diesel::sql_types::{BigInt, Date, Text};
    if to < from {
        return Err(AppError::bad("to must not be before from"));
    }
    if !super::calendar::in_range(from) || !super::calendar::in_range(to) {
        return Err(AppError::bad("dates must be within 2000-01-01..2100-12-31"));
    }
    if (to - from).num_days() >= MAX_RANGE_DAYS {
        return Err(AppError::bad(format!("a ledger covers at most {MAX_RANGE_DAYS} days")));
    }
    let rows: Vec<Row> = StaticQuery::new(include_str!("ledger.sql"))
        .bind::<BigInt, _>(store_id)
        .bind::<Date, _>(from)
        .bind::<Date, _>(to)
        .bind::<Text, _>(tz.name())
        .load(conn)
        .await?;
    Ok(rows
        .windows(2)
        .map(|w| {
            let (before, day) = (&w[0], &w[1]);
            PrepaidDay {
                date: day.day,
                collected_cents: day.collected_cents,
                refunded_cents: day.refunded_cents,
                earned_cents: before.balance_cents + day.collected_cents - day.refunded_cents - day.balance_cents,
                balance_cents: day.balance_cents,
            }
        })
        .collect())
}
