//! The prepaid ledger (预收资金台账): per date, the money a store holds for its members — what
//! came in, what it earned by use, what went back out — for finance and the regulator's filing.
//! The statement (`ledger/*.sql`) gives each day's collected, refunded and closing balance;
//! earned is the rest of the day's change, so `balance = previous + collected − earned −
//! refunded` holds to the cent for any range.
//!
//! Days that are over are closed ([`close`], the `prepaid:close` task, every ten minutes): their figures
//! are kept in `prepaid_ledger_days`, and a range reads them, computing only the days after the
//! last closed one, from its balance and the orders that change in them. A store never closed
//! (or a range before its first closing) is computed from every order, as the closing itself
//! is the first time.

use chrono::{Duration, NaiveDate};
use chrono_tz::Tz;
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::db::schema::{members, orders, prepaid_ledger_days, wallet_ledger};
use crate::db::sql::StaticQuery;
use crate::error::{AppError, AppResult};

/// The longest range one ledger answers (a year; a leap year's too).
pub const MAX_RANGE_DAYS: i64 = 366;

/// How many days [`close`] computes in one statement.
const CLOSE_DAYS_AT_ONCE: i64 = 7;

impl Row {
    fn base(&self) -> Base {
        Base {
            balance: self.balance_cents,
            card_rate: self.card_rate_cents,
        }
    }
}

/// Every order live on the eve, the eve's balance computed.
const FROM_EVERY_ORDER: &str = concat!(
    include_str!("ledger/head.sql"),
    include_str!("ledger/prepaid.sql"),
    include_str!("ledger/prepaid_all.sql"),
    include_str!("ledger/ctes.sql"),
    include_str!("ledger/base_all.sql"),
    include_str!("ledger/select.sql"),
);

/// After a closed day: its balance ($5) and the orders that change in the range.
const SINCE_CLOSED: &str = concat!(
    include_str!("ledger/head.sql"),
    include_str!("ledger/prepaid.sql"),
    include_str!("ledger/prepaid_since.sql"),
    include_str!("ledger/ctes.sql"),
    include_str!("ledger/base_since.sql"),
    include_str!("ledger/select.sql"),
);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepaidDay {
    pub date: NaiveDate,
    pub collected_cents: i64,
    pub earned_cents: i64,
    pub refunded_cents: i64,
    pub balance_cents: i64,
}

/// One day's figures as the statement and the closed days keep them (earned is derived).
#[derive(Debug, Clone, Copy, PartialEq, Eq, diesel::QueryableByName, Queryable)]
struct Row {
    #[diesel(sql_type = diesel::sql_types::Date)]
    day: NaiveDate,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    collected_cents: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    refunded_cents: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    balance_cents: i64,
    /// What the cards held at the end of the day earn the next day.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    card_rate_cents: i64,
}

/// A closed day's columns, as [`Row`] reads them.
const CLOSED: (
    prepaid_ledger_days::day,
    prepaid_ledger_days::collected_cents,
    prepaid_ledger_days::refunded_cents,
    prepaid_ledger_days::balance_cents,
    prepaid_ledger_days::card_rate_cents,
) = (
    prepaid_ledger_days::day,
    prepaid_ledger_days::collected_cents,
    prepaid_ledger_days::refunded_cents,
    prepaid_ledger_days::balance_cents,
    prepaid_ledger_days::card_rate_cents,
);

/// A closed day as kept.
#[derive(Debug, Clone, Copy)]
struct Base {
    balance: i64,
    card_rate: i64,
}

/// The rows of `from`'s eve through `to`, computed: from every order, or after a closed day
/// (`base`: the eve's balance, the eve being closed).
async fn compute(
    conn: &mut AsyncPgConnection,
    store_id: i64,
    from: NaiveDate,
    to: NaiveDate,
    tz: Tz,
    base: Option<Base>,
) -> AppResult<Vec<Row>> {
    use diesel::sql_types::{BigInt, Date, Text};
    let q = |sql| {
        StaticQuery::new(sql)
            .bind::<BigInt, _>(store_id)
            .bind::<Date, _>(from)
            .bind::<Date, _>(to)
            .bind::<Text, _>(tz.name())
    };
    Ok(match base {
        None => q(FROM_EVERY_ORDER).load(conn).await?,
        Some(b) => {
            q(SINCE_CLOSED)
                .bind::<BigInt, _>(b.balance)
                .bind::<BigInt, _>(b.card_rate)
                .load(conn)
                .await?
        }
    })
}

/// The ledger of `store_id` from `from` through `to` (inclusive), one row per date, ascending.
pub async fn ledger(
    conn: &mut AsyncPgConnection,
    store_id: i64,
    from: NaiveDate,
    to: NaiveDate,
    tz: Tz,
) -> AppResult<Vec<PrepaidDay>> {
    if to < from {
        return Err(AppError::bad("to must not be before from"));
    }
    if !super::calendar::in_range(from) || !super::calendar::in_range(to) {
        return Err(AppError::bad("dates must be within 2000-01-01..2100-12-31"));
    }
    if (to - from).num_days() >= MAX_RANGE_DAYS {
        return Err(AppError::bad(format!("a ledger covers at most {MAX_RANGE_DAYS} days")));
    }
    let eve = from - Duration::days(1);
    // The closed days from the eve on, as long as they follow each other.
    let closed: Vec<Row> = prepaid_ledger_days::table
        .filter(prepaid_ledger_days::store_id.eq(store_id))
        .filter(prepaid_ledger_days::day.between(eve, to))
        .order(prepaid_ledger_days::day)
        .select(CLOSED)
        .load(conn)
        .await?;
    let mut rows: Vec<Row> = closed
        .into_iter()
        .enumerate()
        .take_while(|(i, r)| r.day == eve + Duration::days(*i as i64))
        .map(|(_, r)| r)
        .collect();
    match rows.last().copied() {
        Some(last) if last.day < to => {
            let more = compute(conn, store_id, last.day + Duration::days(1), to, tz, Some(last.base())).await?;
            rows.extend(more.into_iter().skip(1));
        }
        Some(_) => {}
        None => {
            // The eve is not closed: the last closed day before it, if a year or less back, is a
            // base; else every order.
            let before: Option<Row> = prepaid_ledger_days::table
                .filter(prepaid_ledger_days::store_id.eq(store_id))
                .filter(prepaid_ledger_days::day.lt(eve))
                .filter(prepaid_ledger_days::day.ge(eve - Duration::days(MAX_RANGE_DAYS)))
                .order(prepaid_ledger_days::day.desc())
                .select(CLOSED)
                .first(conn)
                .await
                .optional()?;
            rows = match before {
                Some(b) => compute(conn, store_id, b.day + Duration::days(1), to, tz, Some(b.base()))
                    .await?
                    .into_iter()
                    .filter(|r| r.day >= eve)
                    .collect(),
                None => compute(conn, store_id, from, to, tz, None).await?,
            };
        }
    }
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

/// Closes the days of `store_id` through `through` that are not closed yet: from the day after
/// the last closed one, or from the store's first prepaid money (nothing was held before it).
/// Returns how many days it closed. A day already closed stays as it was.
pub async fn close(conn: &mut AsyncPgConnection, store_id: i64, through: NaiveDate, tz: Tz) -> AppResult<usize> {
    let last: Option<Row> = prepaid_ledger_days::table
        .filter(prepaid_ledger_days::store_id.eq(store_id))
        .order(prepaid_ledger_days::day.desc())
        .select(CLOSED)
        .first(conn)
        .await
        .optional()?;
    let (mut base_day, mut base) = match last {
        Some(r) => (r.day, r.base()),
        None => {
            let first_paid: Option<chrono::DateTime<chrono::Utc>> = orders::table
                .filter(orders::store_id.eq(store_id))
                .select(diesel::dsl::min(orders::paid_at))
                .get_result(conn)
                .await?;
            let first_moved: Option<chrono::DateTime<chrono::Utc>> = wallet_ledger::table
                .inner_join(members::table.on(members::id.eq(wallet_ledger::member_id)))
                .filter(members::store_id.eq(store_id))
                .select(diesel::dsl::min(wallet_ledger::created_at))
                .get_result(conn)
                .await?;
            let Some(first) = [first_paid, first_moved].into_iter().flatten().min() else {
                return Ok(0);
            };
            let eve = first.with_timezone(&tz).date_naive() - Duration::days(1);
            diesel::insert_into(prepaid_ledger_days::table)
                .values((
                    prepaid_ledger_days::store_id.eq(store_id),
                    prepaid_ledger_days::day.eq(eve),
                    prepaid_ledger_days::collected_cents.eq(0),
                    prepaid_ledger_days::refunded_cents.eq(0),
                    prepaid_ledger_days::balance_cents.eq(0),
                    prepaid_ledger_days::card_rate_cents.eq(0),
                ))
                .on_conflict_do_nothing()
                .execute(conn)
                .await?;
            (
                eve,
                Base {
                    balance: 0,
                    card_rate: 0,
                },
            )
        }
    };
    let mut closed = 0;
    while base_day < through {
        // A week at a time: what a stretch reads is the orders that change in it.
        let to = through.min(base_day + Duration::days(CLOSE_DAYS_AT_ONCE));
        let rows = compute(conn, store_id, base_day + Duration::days(1), to, tz, Some(base)).await?;
        let new: Vec<_> = rows
            .iter()
            .skip(1)
            .map(|r| {
                (
                    prepaid_ledger_days::store_id.eq(store_id),
                    prepaid_ledger_days::day.eq(r.day),
                    prepaid_ledger_days::collected_cents.eq(r.collected_cents),
                    prepaid_ledger_days::refunded_cents.eq(r.refunded_cents),
                    prepaid_ledger_days::balance_cents.eq(r.balance_cents),
                    prepaid_ledger_days::card_rate_cents.eq(r.card_rate_cents),
                )
            })
            .collect();
        closed += diesel::insert_into(prepaid_ledger_days::table)
            .values(&new)
            .on_conflict_do_nothing()
            .execute(conn)
            .await?;
        let Some(end) = rows.last() else { break };
        base_day = end.day;
        base = end.base();
    }
    Ok(closed)
}

/// How long after midnight a day is closed: a transaction that began before midnight stamps its
/// rows with its start (`now()`) and may commit a little after.
const SETTLE: Duration = Duration::minutes(20);

/// The closing task: every store's days through yesterday (business time zone), once yesterday
/// has settled ([`SETTLE`]).
pub async fn close_all(state: crate::app::AppState) -> AppResult<i64> {
    use crate::db::schema::stores;
    let tz = state.config.timezone;
    let yesterday = (chrono::Utc::now() - SETTLE).with_timezone(&tz).date_naive() - Duration::days(1);
    let mut conn = state.pool.get().await?;
    let ids: Vec<i64> = stores::table
        .select(stores::id)
        .order(stores::id)
        .load(&mut conn)
        .await?;
    let mut n = 0;
    for id in ids {
        n += close(&mut conn, id, yesterday, tz).await? as i64;
    }
    Ok(n)
}
