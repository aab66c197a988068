//! When runs happen: the daily run (yesterday, and the missed days of the last
//! [`CATCH_UP_DAYS`]), and the WAITING days asked for again until the cut-off.

use std::path::Path;

use chrono::{NaiveDate, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use diesel_async::RunQueryDsl;

use super::run::{run, WAITING_NOTE};
use super::statement_path;
use crate::app::AppState;
use crate::db::schema::reconciliation_runs as rr;
use crate::db::sql::StaticQuery;
use crate::domain::{Provider, ReconciliationStatus};
use crate::error::{AppError, AppResult};
use crate::trace::TraceId;

/// Days back the daily run catches up when it missed some (a process down over a weekend).
pub const CATCH_UP_DAYS: i64 = 7;

/// The providers this instance reconciles: those whose callbacks are configured.
pub fn configured_providers(state: &AppState) -> Vec<Provider> {
    Provider::ALL
        .into_iter()
        .filter(|p| state.keys.configured(*p))
        .collect()
}

pub use crate::domain::schedule::BILL_WAIT_UNTIL as WAIT_UNTIL;

/// How often a WAITING bill is asked for again.
pub const WAIT_RETRY_SECS: i64 = 30 * 60;

/// The run at `FITORDER_RECONCILE_AT`: yesterday for each configured provider, and the missed
/// days of the last [`CATCH_UP_DAYS`] (never run since this provider's first run, or whose
/// bill was put in the statement dir since). Days still WAITING are left to [`retry_waiting`].
///
/// Every provider and day is tried whatever happened to the others, each in its own run (a
/// failure is that run's, FAILED with why). Returns how many ran, or, when any failed, an error
/// naming every provider and day that did, with why.
pub async fn daily(state: AppState) -> AppResult<i64> {
    let today = Utc::now().with_timezone(&state.config.timezone).date_naive();
    let mut runs = 0;
    let mut failed = vec![];
    for provider in configured_providers(&state) {
        let days = match days_due(&state, provider, today).await {
            Ok(days) => days,
            Err(e) => {
                tracing::error!(%provider, error = %e.message(), "daily reconciliation: the days due are unknown");
                failed.push(format!("{provider}: {}", e.public_message()));
                continue;
            }
        };
        for day in days {
            match run(&state, provider, day, None, &TraceId::new()).await {
                Ok(r) => {
                    tracing::info!(%provider, day = %day, status = %r.status, tickets = r.tickets_opened, "daily reconciliation");
                    runs += 1;
                    if r.status == ReconciliationStatus::Failed {
                        failed.push(format!("{provider} {day}: {}", r.error.unwrap_or_default()));
                    }
                }
                Err(e) => {
                    tracing::error!(%provider, day = %day, error = %e.message(), "daily reconciliation failed");
                    failed.push(format!("{provider} {day}: {}", e.public_message()));
                }
            }
        }
    }
    reported(runs, failed)
}

/// `Ok(runs)`, or the failures, all of them, as one error.
fn reported(runs: i64, failed: Vec<String>) -> AppResult<i64> {
    if failed.is_empty() {
        return Ok(runs);
    }
    Err(AppError::internal(format!(
        "{} of the reconciliations failed (each is its run, FAILED with why): {}",
        failed.len(),
        failed.join("; ")
    )))
}

/// The days of `provider` the daily run reconciles today, oldest first.
async fn days_due(state: &AppState, provider: Provider, today: NaiveDate) -> AppResult<Vec<NaiveDate>> {
    let mut conn = state.pool.get().await?;
    let tried: Vec<(NaiveDate, ReconciliationStatus)> = rr::table
        .filter(rr::provider.eq(provider))
        .filter(rr::bill_date.ge(today - chrono::Duration::days(CATCH_UP_DAYS)))
        .select((rr::bill_date, rr::status))
        .load(&mut conn)
        .await?;
    let first: Option<NaiveDate> = rr::table
        .filter(rr::provider.eq(provider))
        .select(diesel::dsl::min(rr::bill_date))
        .first(&mut conn)
        .await?;
    drop(conn);
    let mut due = vec![];
    for back in (1..=CATCH_UP_DAYS).rev() {
        let day = today - chrono::Duration::days(back);
        let of_day: Vec<ReconciliationStatus> = tried.iter().filter(|(d, _)| *d == day).map(|(_, s)| *s).collect();
        use ReconciliationStatus::{Running, Succeeded, Waiting};
        if of_day.iter().any(|s| matches!(s, Succeeded | Waiting | Running)) {
            continue;
        }
        let exists = statement_path(&state.config.statement_dir, provider, day).exists();
        let missed = of_day.is_empty() && first.is_some_and(|f| f < day);
        // Yesterday's bill is always asked for; older days when they were missed.
        if back > 1 && !exists && !missed {
            continue;
        }
        due.push(day);
    }
    Ok(due)
}

#[derive(diesel::QueryableByName)]
struct Waiting {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    provider: Provider,
    #[diesel(sql_type = diesel::sql_types::Date)]
    bill_date: NaiveDate,
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    error: Option<String>,
}

/// Every 30 minutes: the days whose latest run is WAITING are asked for again; from
/// [`WAIT_UNTIL`] on (or once the next day began) they are FAILED, with an alert.
pub async fn retry_waiting(state: AppState) -> AppResult<i64> {
    retry_waiting_at(&state, Utc::now()).await
}

/// [`retry_waiting`] as of `now`.
pub async fn retry_waiting_at(state: &AppState, now: chrono::DateTime<Utc>) -> AppResult<i64> {
    let local = now.with_timezone(&state.config.timezone);
    let mut conn = state.pool.get().await?;
    let waiting: Vec<Waiting> = StaticQuery::new(include_str!("sql/waiting_days.sql"))
        .load(&mut conn)
        .await?;
    drop(conn);
    let mut n = 0;
    let mut failed = vec![];
    for w in waiting {
        let late = local.time() >= WAIT_UNTIL || w.bill_date + chrono::Duration::days(1) < local.date_naive();
        if !late {
            // Each day is asked whatever happened to the others.
            match run(state, w.provider, w.bill_date, None, &TraceId::new()).await {
                Ok(r) => {
                    tracing::info!(provider = %w.provider, day = %w.bill_date, status = %r.status, "waiting bill asked again");
                    n += 1;
                }
                Err(e) => {
                    tracing::error!(provider = %w.provider, day = %w.bill_date, error = %e.message(), "waiting bill not asked again");
                    failed.push(format!("{} {}: {}", w.provider, w.bill_date, e.public_message()));
                }
            }
            continue;
        }
        let name = statement_path(Path::new(""), w.provider, w.bill_date);
        let why = format!(
            "the provider had not made the bill by {} ({}): download it from the merchant platform into the \
             statement directory as {}, then run the reconciliation again",
            WAIT_UNTIL.format("%H:%M"),
            w.error
                .as_deref()
                .unwrap_or_default()
                .trim_end_matches(WAITING_NOTE)
                .trim_end_matches("; "),
            name.display()
        );
        tracing::error!(provider = %w.provider, day = %w.bill_date, "bill not made by the cut-off: FAILED");
        let mut conn = state.pool.get().await?;
        let updated = diesel::update(
            rr::table
                .find(w.id)
                .filter(rr::status.eq(ReconciliationStatus::Waiting)),
        )
        .set((
            rr::status.eq(ReconciliationStatus::Failed),
            rr::finished_at.eq(Utc::now()),
            rr::error.eq(why),
        ))
        .execute(&mut conn)
        .await?;
        if updated == 1 {
            crate::alerts::reconciliation_run(&mut conn, &state.config, w.id).await?;
            n += 1;
        }
    }
    reported(n, failed)
}
