//! The business calendar: Monday to Friday are working days unless staff set a date otherwise
//! (China's public holidays, and the weekend days worked instead, 调休). [`deadline`] is the one
//! function every working-day deadline is computed with.

use chrono::{Duration, NaiveDate};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use crate::db::schema::business_days;
use crate::domain::prepaid::{is_working, nth_working_day_after};
use crate::domain::Ctx;
use crate::error::{AppError, AppResult};

/// The most dates one `setBusinessDays` call sets (a year and a bit).
pub const MAX_DAYS_PER_CALL: usize = 400;
/// The longest range `businessDays` lists.
pub const MAX_RANGE_DAYS: i64 = 366;
/// The dates the calendar takes.
pub fn in_range(d: NaiveDate) -> bool {
    (NaiveDate::from_ymd_opt(2000, 1, 1).unwrap_or(NaiveDate::MIN)
        ..=NaiveDate::from_ymd_opt(2100, 12, 31).unwrap_or(NaiveDate::MAX))
        .contains(&d)
}

/// One date as staff set it.
#[derive(Debug, Clone)]
pub struct SetDay {
    pub date: NaiveDate,
    pub working: bool,
    pub note: Option<String>,
}

/// Where a date's status comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Weekday,
    Weekend,
    Set,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Weekday => "WEEKDAY",
            Source::Weekend => "WEEKEND",
            Source::Set => "SET",
        }
    }
}

#[derive(Debug, Clone)]
pub struct BusinessDay {
    pub date: NaiveDate,
    pub working: bool,
    pub source: Source,
    pub note: Option<String>,
}

/// Sets dates (a later call for the same date wins), all or none; answers how many.
pub async fn set_days(conn: &mut AsyncPgConnection, days: Vec<SetDay>, ctx: &Ctx) -> AppResult<i32> {
    if days.is_empty() {
        return Err(AppError::bad("days must name at least one date"));
    }
    if days.len() > MAX_DAYS_PER_CALL {
        return Err(AppError::bad(format!(
            "at most {MAX_DAYS_PER_CALL} dates per call (split the calendar)"
        )));
    }
    let mut seen = std::collections::HashSet::new();
    let mut rows = Vec::with_capacity(days.len());
    for d in days {
        if !in_range(d.date) {
            return Err(AppError::bad(format!("{} is outside 2000-01-01..2100-12-31", d.date)));
        }
        if !seen.insert(d.date) {
            return Err(AppError::bad(format!("{} is named twice", d.date)));
        }
        let note = d.note.map(|n| n.trim().to_string()).filter(|n| !n.is_empty());
        if note.as_ref().is_some_and(|n| n.chars().count() > 200) {
            return Err(AppError::bad("a note is at most 200 characters"));
        }
        rows.push((
            business_days::day.eq(d.date),
            business_days::working.eq(d.working),
            business_days::note.eq(note),
            business_days::set_by.eq(ctx.actor.to_string()),
            business_days::trace_id.eq(ctx.trace.as_str().to_string()),
        ));
    }
    let n = rows.len() as i32;
    conn.transaction(async |conn| -> AppResult<()> {
        use diesel::upsert::excluded;
        diesel::insert_into(business_days::table)
            .values(&rows)
            .on_conflict(business_days::day)
            .do_update()
            .set((
                business_days::working.eq(excluded(business_days::working)),
                business_days::note.eq(excluded(business_days::note)),
                business_days::set_by.eq(excluded(business_days::set_by)),
                business_days::trace_id.eq(excluded(business_days::trace_id)),
                business_days::set_at.eq(diesel::dsl::now),
            ))
            .execute(conn)
            .await?;
        Ok(())
    })
    .await?;
    tracing::info!(dates = n, actor = %ctx.actor, "business calendar set");
    Ok(n)
}

async fn set_between(
    conn: &mut AsyncPgConnection,
    from: NaiveDate,
    to: NaiveDate,
) -> AppResult<std::collections::HashMap<NaiveDate, (bool, Option<String>)>> {
    let rows: Vec<(NaiveDate, bool, Option<String>)> = business_days::table
        .filter(business_days::day.between(from, to))
        .select((business_days::day, business_days::working, business_days::note))
        .load(conn)
        .await?;
    Ok(rows.into_iter().map(|(d, w, n)| (d, (w, n))).collect())
}

/// The calendar from `from` through `to`, each date with its source.
pub async fn days(conn: &mut AsyncPgConnection, from: NaiveDate, to: NaiveDate) -> AppResult<Vec<BusinessDay>> {
    if to < from {
        return Err(AppError::bad("to must not be before from"));
    }
    if !in_range(from) || !in_range(to) {
        return Err(AppError::bad("dates must be within 2000-01-01..2100-12-31"));
    }
    if (to - from).num_days() >= MAX_RANGE_DAYS {
        return Err(AppError::bad(format!("a range is at most {MAX_RANGE_DAYS} days")));
    }
    let set = set_between(conn, from, to).await?;
    Ok(from
        .iter_days()
        .take_while(|d| *d <= to)
        .map(|date| match set.get(&date) {
            Some((working, note)) => BusinessDay {
                date,
                working: *working,
                source: Source::Set,
                note: note.clone(),
            },
            None => {
                let working = is_working(date, None);
                BusinessDay {
                    date,
                    working,
                    source: if working { Source::Weekday } else { Source::Weekend },
                    note: None,
                }
            }
        })
        .collect())
}

/// The `n`-th working day after `from` (`from` not counted): the deadline of a refund asked for
/// on `from`. One read of the dates set in the stretch it can reach.
pub async fn deadline(conn: &mut AsyncPgConnection, from: NaiveDate, n: i32) -> AppResult<NaiveDate> {
    // n working days fit in n weeks plus a month of holidays; beyond that the weekdays decide.
    let reach = from + Duration::days(i64::from(n.max(0)) * 7 + 31);
    let set = set_between(conn, from, reach).await?;
    Ok(nth_working_day_after(from, n, |d| set.get(&d).map(|(w, _)| *w)))
}
