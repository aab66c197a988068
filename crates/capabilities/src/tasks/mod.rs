//! The scheduler: periodic tasks registered by name with a schedule. Each tick of each task
//! runs once across the whole cluster: the instance that inserts the `(task, tick)` row runs it
//! and records how it went; the others find the row taken. Any number of processes may run the
//! scheduler; none is a leader.

pub mod housekeeping;

use std::time::Duration;

use chrono::{DateTime, Timelike, Utc};
use diesel::prelude::*;
use diesel_async::RunQueryDsl;
use futures_util::future::BoxFuture;

use crate::app::AppState;
use crate::db::schema::task_runs;
use crate::domain::schedule::Schedule;
use crate::domain::TaskRunStatus;
use crate::error::{AppError, AppResult};

/// A task body: returns how many rows it touched.
pub type TaskFn = fn(AppState) -> BoxFuture<'static, AppResult<i64>>;

#[derive(Clone)]
pub struct Task {
    pub name: &'static str,
    pub schedule: Schedule,
    pub run: TaskFn,
}

#[derive(Clone)]
pub struct Scheduler {
    state: AppState,
    instance: String,
    pub tasks: Vec<Task>,
}

/// Every configured provider's own keys kept current (`Gateway::refresh_keys`: WeChat Pay's
/// platform certificates); answers how many were fetched.
pub async fn refresh_provider_keys(s: AppState) -> AppResult<i64> {
    let trace = crate::trace::TraceId::new();
    let mut fetched = 0;
    for g in s.providers.gateways() {
        let n = g
            .refresh_keys(trace.as_str())
            .await
            .map_err(|e| AppError::internal(format!("{}: {e:#}", g.provider())))?;
        fetched += n as i64;
    }
    Ok(fetched)
}

/// Everything that runs in the background of `fitorder serve` and `fitorder worker`, started in
/// this one place: the outbox workers, the expiry timer and the scheduler with every periodic
/// task ([`Scheduler::standard`]).
pub fn spawn_background(
    state: &AppState,
    shutdown: &tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut running = crate::compensation::worker::spawn(state, state.config.outbox_workers, shutdown);
    running.push(tokio::spawn(crate::expiry::run_timer(state.clone(), shutdown.clone())));
    running.push(tokio::spawn(Scheduler::standard(state.clone()).run(shutdown.clone())));
    running
}

impl Scheduler {
    /// fitorder's periodic tasks.
    pub fn standard(state: AppState) -> Scheduler {
        let scan = state.config.scan_interval.as_secs().max(1) as i64;
        let tasks = vec![
            Task {
                name: "order:expire",
                schedule: Schedule::Every { secs: scan },
                run: |s| Box::pin(async move { crate::expiry::expire_due(&s).await }),
            },
            // Membership cards: freezes starting and ending on time, cards expiring.
            Task {
                name: "membership:tick",
                schedule: Schedule::Every { secs: scan },
                run: |s| Box::pin(crate::memberships::tick::run(s)),
            },
            // Coach slots canceled whose bookings are not all settled (a request killed mid-way).
            Task {
                name: "coach_slot:cancel",
                schedule: Schedule::Every { secs: scan },
                run: |s| Box::pin(crate::slot_cancel::resume(s)),
            },
            Task {
                name: "provider:keys",
                schedule: Schedule::Every { secs: 3600 },
                run: |s| Box::pin(refresh_provider_keys(s)),
            },
            Task {
                name: "alert:check",
                schedule: Schedule::Every { secs: 60 },
                run: |s| Box::pin(housekeeping::alert_check(s)),
            },
            // Cooling-off refunds past their working-day deadline: a ticket and an alert each.
            // Every ten expiry scans (FITORDER_SCAN_INTERVAL, default 60 s: every 10 minutes),
            // so that a test with a short scan interval sees it run within seconds.
            Task {
                name: "refund:overdue",
                schedule: Schedule::Every { secs: scan * 10 },
                run: |s| Box::pin(crate::prepaid::overdue::sweep(s)),
            },
            // The prepaid ledger's days before today, closed once they are over (and settled:
            // see `close_all`). Every ten expiry scans, so that days a worker finds open (a
            // deploy on a store with history, a night the workers were down) are closed within
            // minutes, not at the next midnight; a store with nothing to close costs one read.
            Task {
                name: "prepaid:close",
                schedule: Schedule::Every { secs: scan * 10 },
                run: |s| Box::pin(crate::prepaid::ledger::close_all(s)),
            },
            Task {
                name: "data:cleanup",
                schedule: Schedule::DailyAt { hour: 3, minute: 30 },
                run: |s| Box::pin(housekeeping::data_cleanup(s)),
            },
            // The daily reconciliation at `FITORDER_RECONCILE_AT` (local time), and the
            // re-asking of bills not made yet.
            Task {
                name: "reconcile:daily",
                schedule: Schedule::DailyAt {
                    hour: state.config.reconcile_at.hour(),
                    minute: state.config.reconcile_at.minute(),
                },
                run: |s| Box::pin(crate::reconciliation::daily(s)),
            },
            Task {
                name: "reconcile:waiting",
                schedule: Schedule::Every {
                    secs: crate::reconciliation::WAIT_RETRY_SECS,
                },
                run: |s| Box::pin(crate::reconciliation::retry_waiting(s)),
            },
        ];
        Scheduler {
            instance: format!("{}-{}", std::process::id(), &crate::trace::TraceId::new().0[..6]),
            state,
            tasks,
        }
    }

    /// Runs every task whose current tick nobody has claimed yet. Returns the tasks this
    /// instance ran.
    pub async fn tick(&self, now: DateTime<Utc>) -> Vec<&'static str> {
        let mut ran = vec![];
        for task in &self.tasks {
            if self.tick_task(task, now).await {
                ran.push(task.name);
            }
        }
        ran
    }

    /// Runs `task`'s current tick unless another instance claimed it. Whether this one ran it.
    async fn tick_task(&self, task: &Task, now: DateTime<Utc>) -> bool {
        let tick = task.schedule.current_tick(now, self.state.config.timezone);
        match self.claim(task.name, tick).await {
            Ok(Some(id)) => {
                self.execute(task, id).await;
                true
            }
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(task = task.name, error = %e.message(), "could not claim a tick");
                false
            }
        }
    }

    async fn claim(&self, task: &str, tick: DateTime<Utc>) -> AppResult<Option<i64>> {
        let mut conn = self.state.pool.get().await?;
        Ok(diesel::insert_into(task_runs::table)
            .values((
                task_runs::task.eq(task),
                task_runs::tick.eq(tick),
                task_runs::instance.eq(&self.instance),
            ))
            .on_conflict_do_nothing()
            .returning(task_runs::id)
            .get_result(&mut conn)
            .await
            .optional()?)
    }

    async fn execute(&self, task: &Task, run_id: i64) {
        let started = std::time::Instant::now();
        // Every line the run logs carries one trace id (the JSON log's `trace_id`).
        let span = tracing::info_span!("task", task = task.name, run = run_id,
            trace_id = %crate::trace::TraceId::new());
        let result = tracing::Instrument::instrument((task.run)(self.state.clone()), span).await;
        let (status, rows, detail) = match &result {
            Ok(n) => (TaskRunStatus::Succeeded, *n, None),
            Err(e) => (TaskRunStatus::Failed, 0, Some(e.message())),
        };
        if let Some(d) = &detail {
            tracing::error!(task = task.name, error = %d, "scheduled task failed");
        }
        metrics::counter!("fitorder_task_runs_total", "task" => task.name, "status" => status.as_str()).increment(1);
        metrics::histogram!("fitorder_task_seconds", "task" => task.name).record(started.elapsed().as_secs_f64());
        let recorded = async {
            let mut conn = self.state.pool.get().await?;
            diesel::update(task_runs::table.find(run_id))
                .set((
                    task_runs::status.eq(status),
                    task_runs::finished_at.eq(Utc::now()),
                    task_runs::rows_touched.eq(rows),
                    task_runs::detail.eq(detail),
                ))
                .execute(&mut conn)
                .await?;
            Ok::<_, AppError>(())
        }
        .await;
        if let Err(e) = recorded {
            tracing::warn!(task = task.name, error = %e.message(), "task outcome not recorded");
        }
        // A reconciliation that failed or found differences is told right away, not at the
        // next `alert:check`.
        if task.name.starts_with("reconcile:") {
            let raised = async {
                let mut conn = self.state.pool.get().await?;
                crate::alerts::reconciliation_recent(&mut conn, &self.state.config).await
            }
            .await;
            if let Err(e) = raised {
                tracing::warn!(task = task.name, error = %e.message(), "reconciliation alerts not raised; alert:check retries");
            }
        }
    }

    /// Runs every task until `shutdown` flips, each on its own: its own loop, sleeping until its
    /// own next tick, so a long run of one task (a reconciliation against a provider that does
    /// not answer) holds no other back. Each tick is still claimed in the database, once across
    /// the cluster. Returns when every loop has finished the run it was in.
    pub async fn run(self, shutdown: tokio::sync::watch::Receiver<bool>) {
        tracing::info!(tasks = ?self.tasks.iter().map(|t| t.name).collect::<Vec<_>>(), "scheduler started");
        let loops: Vec<_> = self
            .tasks
            .iter()
            .cloned()
            .map(|task| tokio::spawn(self.clone().run_task(task, shutdown.clone())))
            .collect();
        for l in loops {
            if let Err(e) = l.await {
                tracing::error!(error = %e, "a scheduler loop stopped");
            }
        }
    }

    /// One task's loop: its tick, then sleep until its next one (or `shutdown`).
    async fn run_task(self, task: Task, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        loop {
            if *shutdown.borrow() {
                return;
            }
            let now = Utc::now();
            self.tick_task(&task, now).await;
            let next = task.schedule.next_tick(now, self.state.config.timezone);
            let wait = (next - Utc::now())
                .to_std()
                .unwrap_or_default()
                .clamp(Duration::from_millis(50), Duration::from_secs(60));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {},
                _ = shutdown.changed() => {},
            }
        }
    }
}
