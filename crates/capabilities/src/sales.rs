//! The day's takings (`salesReport`): a store's money in from orders and back out, per business
//! date (`FITORDER_TIMEZONE`, the prepaid ledger's and the reconciliation's dates) and payment
//! method, each on the date the money moved (`sales/report.sql` says how each is dated).

use chrono::NaiveDate;
use diesel::sql_types::{BigInt, Date, Integer, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::auth::{Role, Viewer};
use crate::db::sql::StaticQuery;
use crate::domain::{PaymentMethod, Refusal};
use crate::error::{AppError, AppResult};

/// The longest range one report covers (a year, a leap day included).
pub const MAX_DAYS: i64 = 366;

/// One date and method of the report.
#[derive(Debug, Clone, PartialEq, Eq, diesel::QueryableByName)]
pub struct SalesDay {
    #[diesel(sql_type = Date)]
    pub day: NaiveDate,
    #[diesel(sql_type = Text)]
    pub method: PaymentMethod,
    #[diesel(sql_type = Integer)]
    pub orders_paid: i32,
    #[diesel(sql_type = BigInt)]
    pub taken_cents: i64,
    #[diesel(sql_type = BigInt)]
    pub refunded_cents: i64,
}

impl SalesDay {
    pub fn net_cents(&self) -> i64 {
        self.taken_cents - self.refunded_cents
    }
}

/// The report of `store_id` for the dates `from..=to`: admins (store-limited ones their
/// stores) and ops. Only dates and methods with money in or out have a row, in date and method
/// order. A range that ends before it starts or is longer than [`MAX_DAYS`] is refused
/// (`INVALID_RANGE`).
pub async fn report(
    conn: &mut AsyncPgConnection,
    viewer: &Viewer,
    tz: chrono_tz::Tz,
    store_id: i64,
    from: NaiveDate,
    to: NaiveDate,
) -> AppResult<Vec<SalesDay>> {
    viewer.require(&[Role::Admin, Role::Ops])?;
    if to < from {
        return Err(AppError::refused(Refusal::InvalidRange, "`to` is before `from`"));
    }
    if (to - from).num_days() + 1 > MAX_DAYS {
        return Err(AppError::refused(
            Refusal::InvalidRange,
            format!("a report covers at most {MAX_DAYS} days"),
        ));
    }
    if !crate::prepaid::calendar::in_range(from) || !crate::prepaid::calendar::in_range(to) {
        return Err(AppError::refused(
            Refusal::InvalidRange,
            "dates must be within 2000-01-01..2100-12-31",
        ));
    }
    viewer.require_store(store_id)?;
    crate::catalog::require_store(conn, store_id).await?;
    Ok(StaticQuery::new(include_str!("sales/report.sql"))
        .bind::<BigInt, _>(store_id) // $1
        .bind::<Date, _>(from) // $2
        .bind::<Date, _>(to) // $3
        .bind::<Text, _>(tz.name()) // $4
        .load(conn)
        .await?)
}
