//! A run's lifecycle: its RUNNING row (one per provider and day, an abandoned one closed), its
//! task with the heartbeat beside it, its outcome recorded whatever happens (SUCCEEDED, WAITING,
//! FAILED), and its staging rows dropped.

use std::path::{Path, PathBuf};

use chrono::{NaiveDate, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use diesel_async::RunQueryDsl;

use super::fetch::{bill_file, Fetched};
use super::load::load_bill;
use super::matching::match_and_ticket;
use super::{bills, statement_path, N};
use crate::app::AppState;
use crate::db::models::ReconciliationRun;
use crate::db::schema::{bill_rows, reconciliation_runs as rr};
use crate::db::sql::StaticQuery;
use crate::domain::{Provider, ReconciliationStatus};
use crate::error::{AppError, AppResult, OnViolation, Violation};
use crate::trace::TraceId;

/// A RUNNING run says it is still being worked on this often ([`RUN_LEASE_SECS`]).
pub const HEARTBEAT_SECS: u64 = 10;

/// A RUNNING run whose heartbeat is older than this is abandoned (its process died or stopped
/// working on it): the `alert:check` sweep and the next run of its day close it as FAILED.
pub const RUN_LEASE_SECS: i64 = 60;

/// Reconciles `provider`'s bill for business day `date`; `file` overrides the statement dir.
/// A run that could not read its bill is recorded FAILED with the line and the reason.
///
/// The run's work is a task of its own, not the caller's future: a caller that goes away (a
/// dropped `runReconciliation` request) leaves it running to its outcome. While it works, it
/// beats its heartbeat; any error ends it FAILED at once with the error's public message (and
/// is returned); a task that stops without an outcome (a panic, the runtime shutting down)
/// marks it FAILED as it goes, and a process that died is found by its stale heartbeat.
pub async fn run(
    state: &AppState,
    provider: Provider,
    date: NaiveDate,
    file: Option<PathBuf>,
    trace: &TraceId,
) -> AppResult<ReconciliationRun> {
    let started = start(state, provider, date, trace).await?;
    let run_id = started.id;
    let work = tokio::spawn({
        let state = state.clone();
        let trace = trace.clone();
        async move { owned(state, run_id, provider, date, file, trace).await }
    });
    match work.await {
        Ok(result) => result,
        Err(e) => Err(AppError::internal(format!(
            "the {provider} reconciliation of {date} (run {run_id}) stopped without an outcome: {e}"
        ))),
    }
}

/// Inserts the RUNNING run. A run of the same day already RUNNING refuses it, unless that one
/// is abandoned (its heartbeat is stale): then it is closed as FAILED and this one starts.
async fn start(state: &AppState, provider: Provider, date: NaiveDate, trace: &TraceId) -> AppResult<ReconciliationRun> {
    let mut retried = false;
    loop {
        let mut conn = state.pool.get().await?;
        let inserted = diesel::insert_into(rr::table)
            .values((
                rr::provider.eq(provider),
                rr::bill_date.eq(date),
                rr::status.eq(ReconciliationStatus::Running),
                rr::trace_id.eq(trace.as_str()),
            ))
            .returning(ReconciliationRun::as_returning())
            .get_result(&mut conn)
            .await
            .on_violation(|v| match v {
                Violation::Unique("reconciliation_one_running") => Some(AppError::Conflict(format!(
                    "a {provider} reconciliation of {date} is already running"
                ))),
                _ => None,
            });
        match inserted {
            Err(AppError::Conflict(_)) if !retried => {
                retried = true;
                let closed: N = StaticQuery::new(include_str!("sql/close_abandoned.sql"))
                    .bind::<Text, _>(provider)
                    .bind::<diesel::sql_types::Date, _>(date)
                    .bind::<BigInt, _>(RUN_LEASE_SECS)
                    .get_result(&mut conn)
                    .await?;
                if closed.n == 0 {
                    return inserted;
                }
                tracing::error!(%provider, %date, "an abandoned reconciliation run was closed as FAILED");
            }
            other => return other,
        }
    }
}

/// The run's task: the work, its heartbeat beside it, and its outcome recorded whatever
/// happens.
async fn owned(
    state: AppState,
    run_id: i64,
    provider: Provider,
    date: NaiveDate,
    file: Option<PathBuf>,
    trace: TraceId,
) -> AppResult<ReconciliationRun> {
    let mut guard = Unfinished {
        pool: state.pool.clone(),
        run_id,
        armed: true,
    };
    let result = tokio::select! {
        r = work(&state, run_id, provider, date, file, &trace) => r,
        never = heartbeat(&state, run_id) => match never {},
    };
    match result {
        Ok(run) => {
            guard.armed = false;
            Ok(run)
        }
        Err(e) => {
            let why = e.public_message();
            tracing::error!(%provider, %date, run = run_id, error = %e.message(), "reconciliation failed");
            match fail(&state.pool, run_id, &why).await {
                Ok(_) => guard.armed = false,
                Err(f) => tracing::warn!(run = run_id, error = %f.message(), "the failed run not recorded yet"),
            }
            Err(e)
        }
    }
}

/// Beats the run's heartbeat until dropped (with the work).
async fn heartbeat(state: &AppState, run_id: i64) -> std::convert::Infallible {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(HEARTBEAT_SECS));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let beat = async {
            let mut conn = state.pool.get().await?;
            StaticQuery::new(include_str!("sql/heartbeat.sql"))
                .bind::<BigInt, _>(run_id)
                .execute(&mut conn)
                .await?;
            Ok::<_, AppError>(())
        };
        if let Err(e) = beat.await {
            tracing::warn!(run = run_id, error = %e.message(), "reconciliation heartbeat missed");
        }
    }
}

/// Closes a RUNNING run as FAILED with `why`, and drops its staging rows.
async fn fail(pool: &crate::db::DbPool, run_id: i64, why: &str) -> AppResult<()> {
    let mut conn = pool.get().await?;
    diesel::update(
        rr::table
            .find(run_id)
            .filter(rr::status.eq(ReconciliationStatus::Running)),
    )
    .set((
        rr::status.eq(ReconciliationStatus::Failed),
        rr::finished_at.eq(Utc::now()),
        rr::error.eq(why),
    ))
    .execute(&mut conn)
    .await?;
    diesel::delete(bill_rows::table.filter(bill_rows::run_id.eq(run_id)))
        .execute(&mut conn)
        .await?;
    Ok(())
}

/// A run's task that ends without an outcome (a panic unwinding it, the runtime dropping it)
/// marks its run FAILED on the way out, so no run stays RUNNING after its work stopped.
struct Unfinished {
    pool: crate::db::DbPool,
    run_id: i64,
    armed: bool,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (pool, run_id) = (self.pool.clone(), self.run_id);
        tracing::error!(run = run_id, "reconciliation run stopped without an outcome");
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let why = "the run stopped without an outcome (interrupted); run the reconciliation again";
                if let Err(e) = fail(&pool, run_id, why).await {
                    tracing::warn!(run = run_id, error = %e.message(), "the interrupted run not recorded; the sweep closes it");
                }
            });
        }
    }
}

/// The run's work, once its RUNNING row is in.
async fn work(
    state: &AppState,
    run_id: i64,
    provider: Provider,
    date: NaiveDate,
    file: Option<PathBuf>,
    trace: &TraceId,
) -> AppResult<ReconciliationRun> {
    let mut note = None;
    let path = match file {
        Some(path) => Ok(Some(path)),
        None => match bill_file(state, provider, date, trace).await {
            Ok(Fetched::Ready(path)) => Ok(Some(path)),
            Ok(Fetched::NotMade(why)) => return waiting(state, run_id, provider, date, &why).await,
            Ok(Fetched::NoBill(why)) => {
                note = Some(why);
                Ok(None)
            }
            Err(e) => Err(e),
        },
    };
    let outcome = match path {
        Ok(Some(path)) => match load_bill(state, run_id, provider, &path).await {
            Ok(summary) => match_and_ticket(state, run_id, provider, date, trace)
                .await
                .map(|m| (summary, m)),
            Err(e) => Err(e),
        },
        // No bill because nothing happened: an empty bill. Without a local payment that day
        // the run is empty; every local payment is asked of the provider (and is no finding
        // when it confirms it).
        Ok(None) => match_and_ticket(state, run_id, provider, date, trace)
            .await
            .map(|m| (bills::BillSummary::default(), m)),
        Err(e) => Err(e),
    };
    let note = note.map(|why| {
        let name = statement_path(Path::new(""), provider, date);
        format!(
            "the provider has no bill {} of that day ({why}): reconciled as an empty bill, each local payment asked of the provider",
            name.display()
        )
    });
    let mut conn = state.pool.get().await?;
    diesel::delete(bill_rows::table.filter(bill_rows::run_id.eq(run_id)))
        .execute(&mut conn)
        .await?;
    let finished = match outcome {
        Ok((summary, m)) => {
            metrics::counter!("fitorder_reconciliation_findings_total", "provider" => provider.as_str())
                .increment(m.tickets as u64);
            diesel::update(rr::table.find(run_id))
                .set((
                    rr::status.eq(ReconciliationStatus::Succeeded),
                    rr::finished_at.eq(Utc::now()),
                    rr::provider_rows.eq(summary.rows as i32),
                    rr::local_rows.eq(m.local_rows as i32),
                    rr::matched.eq(m.matched as i32),
                    rr::tickets_opened.eq(m.tickets as i32),
                    rr::error.eq(note),
                ))
                .returning(ReconciliationRun::as_returning())
                .get_result(&mut conn)
                .await?
        }
        Err(e) => {
            let why = e.message();
            tracing::error!(%provider, %date, error = %why, "reconciliation failed");
            diesel::update(rr::table.find(run_id))
                .set((
                    rr::status.eq(ReconciliationStatus::Failed),
                    rr::finished_at.eq(Utc::now()),
                    rr::error.eq(why),
                ))
                .returning(ReconciliationRun::as_returning())
                .get_result(&mut conn)
                .await?
        }
    };
    Ok(finished)
}

/// The text a WAITING run carries.
pub const WAITING_NOTE: &str = "asked again every 30 minutes until 18:00";

/// Records the run as WAITING: the provider has not made the bill yet. In development mode a
/// day without a sandbox payment has nothing to reconcile: that is said (INFO) and the run is
/// done.
async fn waiting(
    state: &AppState,
    run_id: i64,
    provider: Provider,
    date: NaiveDate,
    why: &str,
) -> AppResult<ReconciliationRun> {
    let nothing =
        state.config.dev_mode && (why.starts_with("NO_STATEMENT_EXIST") || why.starts_with("isp.bill_not_exist"));
    let (status, text) = if nothing {
        tracing::info!(%provider, %date, "development: the sandbox took no payment that day, nothing to reconcile");
        (
            ReconciliationStatus::Succeeded,
            format!("nothing to reconcile: the sandbox took no payment that day ({why})"),
        )
    } else {
        tracing::info!(%provider, %date, why, "the provider has not made the bill yet: WAITING");
        let name = statement_path(Path::new(""), provider, date);
        (
            ReconciliationStatus::Waiting,
            format!(
                "the provider has not made the bill {} yet ({why}); {WAITING_NOTE}",
                name.display()
            ),
        )
    };
    let mut conn = state.pool.get().await?;
    Ok(diesel::update(rr::table.find(run_id))
        .set((
            rr::status.eq(status),
            rr::finished_at.eq(Utc::now()),
            rr::provider_rows.eq(0),
            rr::local_rows.eq(0),
            rr::matched.eq(0),
            rr::tickets_opened.eq(0),
            rr::error.eq(text),
        ))
        .returning(ReconciliationRun::as_returning())
        .get_result(&mut conn)
        .await?)
}
