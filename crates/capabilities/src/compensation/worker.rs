//! The compensation worker: claims due outbox rows with `FOR UPDATE SKIP LOCKED` under a lease,
//! delivers them, and records every attempt. Failures retry with exponential backoff and
//! jitter; at the attempt limit the event is DEAD and a ticket opens. Any number of workers in
//! any number of processes may run: a claimed row is invisible to the others until its lease
//! runs out, so a worker killed mid-call delays its rows by one lease (the batch it had claimed
//! ahead, by two), never loses them. Alert deliveries are events like the others (one per
//! alert and chat channel); a chat message over its channel's rate goes back unattempted.

use std::time::{Duration, Instant};

use chrono::Utc;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Double, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde_json::json;

use super::downstream::{Delivered, Downstream, NotDelivered, Retry};
use crate::app::AppState;
use crate::db::models::{CompensationEvent, Order};
use crate::db::schema::{compensation_attempts, compensation_events, orders};
use crate::db::sql::StaticQuery;
use crate::domain::retry::backoff;
use crate::domain::{CompensationKind, CompensationStatus, Effect};
use crate::error::AppResult;
use crate::outbox;
use crate::tickets::{self, NewTicket};
use crate::trace::TraceId;

#[derive(Clone)]
pub struct Worker {
    state: AppState,
    downstream: Downstream,
    pub id: String,
    pub batch: i64,
    /// The providers this process can refund through: a `PROVIDER_REFUND` event of another is
    /// left for a process that has its keys (never claimed, never attempted here).
    served: Vec<String>,
    /// The chat channels this process can send alerts to (their ids): an alert delivery to
    /// another is left for a process that has it configured.
    channels: Vec<String>,
}

impl Worker {
    pub fn new(state: AppState) -> Worker {
        let downstream = Downstream::new(state.providers.clone(), state.config.clone());
        let id = format!("{}-{}", hostname(), &TraceId::new().0[..8]);
        let served = served_providers(&state)
            .iter()
            .map(|p| p.as_str().to_string())
            .collect();
        let channels = state.config.alert_channels.iter().map(|c| c.id.clone()).collect();
        Worker {
            served,
            channels,
            batch: state.config.outbox_batch,
            state,
            downstream,
            id,
        }
    }

    /// How long a claim holds: longer than any call can take.
    /// A provider refund is up to three provider calls (a retry's refund query, the refund,
    /// Alipay's refund query after `fund_change` N), each bounded by the provider timeout.
    fn lease(&self) -> Duration {
        let c = &self.state.config;
        let refund = if self.served.is_empty() {
            Duration::ZERO
        } else {
            c.provider_timeout * 3
        };
        (c.downstream_timeout * 2).max(refund) + Duration::from_secs(5)
    }

    /// Runs until `shutdown` flips, waking on outbox notifications and when the next retry is due.
    /// While a full batch is delivered the next one is claimed, so a backlog is worked through
    /// without waiting for the claim between batches.
    pub async fn run(self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        tracing::info!(worker = %self.id, refunds_through = ?self.served, "compensation worker started");
        let wake = self.state.events.outbox.clone();
        let mut prefetched: Option<Vec<CompensationEvent>> = None;
        loop {
            if *shutdown.borrow() {
                break;
            }
            let notified = wake.notified();
            let claimed = match prefetched.take() {
                Some(batch) => Ok(batch),
                None => self.claim(self.lease()).await,
            };
            let events = match claimed {
                Ok(batch) if batch.len() as i64 >= self.batch => {
                    // The next batch waits for this one to be delivered before its own delivery
                    // starts: its lease covers both.
                    let (n, next) = tokio::join!(self.deliver(batch), self.claim(self.lease() * 2));
                    match next {
                        Ok(next) if !next.is_empty() => prefetched = Some(next),
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e.message(), "compensation claim failed"),
                    }
                    n
                }
                Ok(batch) => self.deliver(batch).await,
                Err(e) => {
                    tracing::warn!(error = %e.message(), "compensation batch failed");
                    0
                }
            };
            if prefetched.is_some() || events as i64 >= self.batch {
                continue;
            }
            let wait = self.until_next_due().await.unwrap_or(Duration::from_secs(1));
            tokio::select! {
                _ = notified => {},
                _ = tokio::time::sleep(wait) => {},
                _ = shutdown.changed() => {},
            }
        }
        if let Some(batch) = prefetched {
            // Claimed but not attempted: let any worker have them now rather than after the lease.
            if let Err(e) = self.release(&batch).await {
                tracing::warn!(events = batch.len(), error = %e.message(), "claims not released; they wait for their lease");
            }
        }
        tracing::info!(worker = %self.id, "compensation worker stopped");
    }

    /// Time until the earliest waiting event is due (at most 5 s: the polling fallback).
    async fn until_next_due(&self) -> AppResult<Duration> {
        let mut conn = self.state.pool.get().await?;
        let next: Option<chrono::DateTime<Utc>> = compensation_events::table
            .filter(compensation_events::status.eq_any([CompensationStatus::Pending, CompensationStatus::Retrying]))
            // What this process may claim (see `claim.sql`): another provider's refund, or an
            // alert to a channel not configured here, is not due here, however overdue it is.
            .filter(
                diesel::dsl::sql::<diesel::sql_types::Bool>(
                    "(kind <> 'PROVIDER_REFUND' OR payload->>'provider' = ANY(",
                )
                .bind::<diesel::sql_types::Array<Text>, _>(&self.served)
                .sql(")) AND (kind <> 'ALERT_DELIVERY' OR payload->>'channel' = ANY(")
                .bind::<diesel::sql_types::Array<Text>, _>(&self.channels)
                .sql("))"),
            )
            .select(diesel::dsl::min(compensation_events::next_attempt_at))
            .get_result(&mut conn)
            .await?;
        let cap = Duration::from_secs(5);
        Ok(match next {
            None => cap,
            Some(t) => (t - Utc::now())
                .to_std()
                .unwrap_or(Duration::from_millis(10))
                .clamp(Duration::from_millis(10), cap),
        })
    }

    /// Claims one batch of due events and delivers them; returns how many were attempted.
    pub async fn run_once(&self) -> AppResult<usize> {
        let claimed = self.claim(self.lease()).await?;
        Ok(self.deliver(claimed).await)
    }

    /// The claimed events that may be attempted now: a chat message over its channel's rate
    /// ([`crate::alerts::take_send_slot`]) goes back, not attempted, due when the channel has
    /// room again.
    async fn admit(&self, claimed: Vec<CompensationEvent>) -> Vec<CompensationEvent> {
        let mut admitted = Vec::with_capacity(claimed.len());
        for e in claimed {
            let effect = Effect::decode(e.kind.as_str(), &e.payload).ok();
            let Some(channel) = effect.as_ref().and_then(crate::alerts::channel_of) else {
                admitted.push(e);
                continue;
            };
            let wait = async {
                let mut conn = self.state.pool.get().await?;
                crate::alerts::take_send_slot(&mut conn, channel, self.state.config.alert_rate_per_minute).await
            }
            .await;
            match wait {
                Ok(None) => admitted.push(e),
                Ok(Some(wait)) => {
                    if let Err(err) = self.defer(&e, wait).await {
                        tracing::warn!(event = e.id, error = %err.message(), "deferral not recorded; the lease will expire");
                    }
                }
                Err(err) => {
                    tracing::warn!(event = e.id, error = %err.message(), "rate not checked; the lease will expire")
                }
            }
        }
        admitted
    }

    /// Gives back a claimed event not attempted, due again after `wait`.
    async fn defer(&self, e: &CompensationEvent, wait: Duration) -> AppResult<()> {
        let mut conn = self.state.pool.get().await?;
        let at = Utc::now() + chrono::Duration::from_std(wait).unwrap_or_default();
        diesel::update(
            compensation_events::table
                .find(e.id)
                .filter(compensation_events::locked_by.eq(&self.id))
                .filter(compensation_events::attempts.eq(e.attempts)),
        )
        .set((
            compensation_events::next_attempt_at.eq(Some(at)),
            compensation_events::locked_until.eq(None::<chrono::DateTime<Utc>>),
            compensation_events::locked_by.eq(None::<String>),
        ))
        .execute(&mut conn)
        .await?;
        Ok(())
    }

    /// Delivers claimed events and records how each attempt went; returns how many were attempted.
    async fn deliver(&self, claimed: Vec<CompensationEvent>) -> usize {
        let claimed = self.admit(claimed).await;
        let n = claimed.len();
        if n == 0 {
            return 0;
        }
        let outcomes = futures_util::future::join_all(claimed.into_iter().map(|e| {
            let span = tracing::info_span!("compensation", trace_id = %e.trace_id, event = e.id);
            tracing::Instrument::instrument(
                async move {
                    let started = Instant::now();
                    let result = self.downstream.deliver(&e).await;
                    (e, result, started.elapsed())
                },
                span,
            )
        }))
        .await;
        let mut delivered = Vec::new();
        let mut failed = Vec::new();
        for (event, result, took) in outcomes {
            match result {
                Ok(how) => delivered.push((event, how, took)),
                Err(why) => failed.push((event, why, took)),
            }
        }
        if let Err(err) = self.complete_delivered(&delivered).await {
            tracing::warn!(events = delivered.len(), error = %err.message(), "deliveries not recorded; the lease will expire and they are tried again");
        }
        for (event, why, took) in failed {
            let span = tracing::info_span!("compensation", trace_id = %event.trace_id, event = event.id);
            let recorded = tracing::Instrument::instrument(self.complete_failed(&event, why, took), span).await;
            if let Err(err) = recorded {
                tracing::warn!(event = event.id, error = %err.message(), "attempt not recorded; the lease will expire and it is tried again");
            }
        }
        n
    }

    /// Claims the due events no one holds, at most one batch, for `lease`.
    async fn claim(&self, lease: Duration) -> AppResult<Vec<CompensationEvent>> {
        let mut conn = self.state.pool.get().await?;
        Ok(StaticQuery::new(include_str!("claim.sql"))
            .bind::<Text, _>(&self.id) // $1
            .bind::<Double, _>(lease.as_secs_f64()) // $2
            .bind::<BigInt, _>(self.batch) // $3
            .bind::<diesel::sql_types::Array<Text>, _>(&self.served) // $4
            .bind::<diesel::sql_types::Array<Text>, _>(&self.channels) // $5
            .load(&mut conn)
            .await?)
    }

    /// Gives back claimed events not attempted.
    async fn release(&self, events: &[CompensationEvent]) -> AppResult<()> {
        let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
        let mut conn = self.state.pool.get().await?;
        diesel::update(
            compensation_events::table
                .filter(compensation_events::id.eq_any(&ids))
                .filter(compensation_events::locked_by.eq(&self.id)),
        )
        .set((
            compensation_events::locked_until.eq(None::<chrono::DateTime<Utc>>),
            compensation_events::locked_by.eq(None::<String>),
        ))
        .execute(&mut conn)
        .await?;
        Ok(())
    }

    /// Records a batch of successful deliveries in one statement: each event the worker still
    /// holds becomes SUCCEEDED with its attempt logged and announced (atomically: a statement is
    /// its own transaction).
    async fn complete_delivered(&self, done: &[(CompensationEvent, Delivered, Duration)]) -> AppResult<()> {
        if done.is_empty() {
            return Ok(());
        }
        use diesel::sql_types::{Array, Integer};
        let ids: Vec<i64> = done.iter().map(|(e, ..)| e.id).collect();
        let attempts: Vec<i32> = done.iter().map(|(e, ..)| e.attempts).collect();
        let ms: Vec<i32> = done
            .iter()
            .map(|(.., t)| t.as_millis().min(i32::MAX as u128) as i32)
            .collect();
        let workers: Vec<String> = done
            .iter()
            .map(|(_, how, _)| match how {
                Delivered::Simulated => "simulator".to_string(),
                Delivered::Ok => self.id.clone(),
            })
            .collect();
        let mut conn = self.state.pool.get().await?;
        StaticQuery::new(include_str!("record_delivered.sql"))
            .bind::<Array<BigInt>, _>(&ids) // $1
            .bind::<Array<Integer>, _>(&attempts) // $2
            .bind::<Array<Integer>, _>(&ms) // $3
            .bind::<Array<Text>, _>(&workers) // $4
            .bind::<Text, _>(&self.id) // $5
            .execute(&mut conn)
            .await?;
        let now = Utc::now();
        for (e, ..) in done {
            metrics::counter!("fitorder_compensation_attempts_total", "kind" => e.kind.as_str(), "outcome" => "ok")
                .increment(1);
            // Outbox latency: from the change that wrote the event to its delivery.
            metrics::histogram!("fitorder_outbox_delivery_seconds", "kind" => e.kind.as_str())
                .record((now - e.created_at).num_milliseconds().max(0) as f64 / 1000.0);
        }
        Ok(())
    }

    /// Records a failed attempt and moves the event on, if this worker still holds it.
    /// (Successful ones are recorded together, by [`Worker::complete_delivered`].)
    async fn complete_failed(&self, e: &CompensationEvent, err: NotDelivered, took: Duration) -> AppResult<()> {
        let mut conn = self.state.pool.get().await?;
        let config = self.state.config.clone();
        let kind = e.kind.as_str();
        conn.transaction(async |conn| -> AppResult<()> {
            let attempt = e.attempts + 1;
            // The next attempt is scheduled, or the event dies at the limit. Only the worker
            // still holding the claim may write.
            let (status, next) = if attempt >= e.max_attempts || err.retry == Retry::Never {
                (CompensationStatus::Dead, None)
            } else {
                let jitter: f64 = {
                    use rand::Rng;
                    rand::rng().random_range(-1.0..=1.0)
                };
                let mut delay = backoff(retry_base(&config, e.kind), attempt, jitter);
                if let Retry::After(at_least) = err.retry {
                    delay = delay.max(at_least);
                }
                let delay = chrono::Duration::from_std(delay).unwrap_or_default();
                (CompensationStatus::Retrying, Some(Utc::now() + delay))
            };
            let updated: Option<CompensationEvent> = diesel::update(
                compensation_events::table
                    .find(e.id)
                    .filter(compensation_events::locked_by.eq(&self.id))
                    .filter(compensation_events::attempts.eq(e.attempts)),
            )
            .set((
                compensation_events::status.eq(status),
                compensation_events::attempts.eq(attempt),
                compensation_events::last_error.eq(&err.error),
                compensation_events::next_attempt_at.eq(next),
                compensation_events::locked_until.eq(None::<chrono::DateTime<Utc>>),
                compensation_events::locked_by.eq(None::<String>),
                compensation_events::updated_at.eq(Utc::now()),
            ))
            .returning(CompensationEvent::as_returning())
            .get_result(conn)
            .await
            .optional()?;
            let Some(updated) = updated else {
                // The lease ran out and another worker took over: its attempt counts, not ours.
                tracing::warn!(event = e.id, "lease lost before the attempt was recorded");
                return Ok(());
            };
            diesel::insert_into(compensation_attempts::table)
                .values((
                    compensation_attempts::event_id.eq(e.id),
                    compensation_attempts::ok.eq(false),
                    compensation_attempts::error.eq(&err.error),
                    compensation_attempts::duration_ms.eq(took.as_millis().min(i32::MAX as u128) as i32),
                    compensation_attempts::worker.eq(&self.id),
                ))
                .execute(conn)
                .await?;
            if updated.status == CompensationStatus::Dead {
                self.dead(conn, &updated).await?;
            }
            outbox::announce(conn, &[e.id]).await
        })
        .await?;
        metrics::counter!("fitorder_compensation_attempts_total", "kind" => kind, "outcome" => "failed").increment(1);
        Ok(())
    }

    /// What a DEAD event leaves behind, by its kind: an order's effect opens its ticket (and
    /// raises its alert); an alert delivery is logged and counted.
    async fn dead(&self, conn: &mut AsyncPgConnection, e: &CompensationEvent) -> AppResult<()> {
        match e.kind {
            CompensationKind::AlertDelivery => {
                crate::alerts::delivery_dead(e);
                Ok(())
            }
            CompensationKind::DoorAccessGrant
            | CompensationKind::DoorAccessRevoke
            | CompensationKind::AiAccessGrant
            | CompensationKind::AiAccessRevoke
            | CompensationKind::ProviderRefund => self.open_dead_ticket(conn, e).await,
        }
    }

    async fn open_dead_ticket(&self, conn: &mut AsyncPgConnection, e: &CompensationEvent) -> AppResult<()> {
        let Some(order_id) = e.order_id else {
            tracing::error!(event = e.id, kind = %e.kind, attempts = e.attempts, last_error = ?e.last_error,
                "compensation event of no order is DEAD");
            metrics::counter!("fitorder_compensation_dead_total", "kind" => e.kind.as_str()).increment(1);
            // A refund of a payment whose order a restore lost: money that did not go back is a
            // person's to send, on a ticket naming the trade.
            if e.kind == CompensationKind::ProviderRefund {
                tickets::open(
                    conn,
                    NewTicket {
                        kind: crate::domain::TicketKind::CompensationDead,
                        provider: None,
                        order: None,
                        order_no: e.payload["orderNo"].as_str(),
                        provider_txn_id: e.payload["providerTxnId"].as_str(),
                        local_amount_cents: None,
                        provider_amount_cents: e.payload["amountCents"].as_i64(),
                        detail: json!({"eventId": e.id.to_string(), "kind": e.kind, "attempts": e.attempts,
                                       "lastError": e.last_error, "idempotencyKey": e.idempotency_key}),
                        finding_key: format!("COMPENSATION_DEAD:{}:{}", e.id, e.attempts),
                    },
                    &TraceId(e.trace_id.clone()),
                )
                .await?;
            }
            return Ok(());
        };
        let order: Order = orders::table
            .find(order_id)
            .select(Order::as_select())
            .get_result(conn)
            .await?;
        tracing::error!(event = e.id, kind = %e.kind, order_no = %order.order_no, attempts = e.attempts,
            last_error = ?e.last_error, "compensation event is DEAD");
        metrics::counter!("fitorder_compensation_dead_total", "kind" => e.kind.as_str()).increment(1);
        tickets::open(
            conn,
            NewTicket {
                kind: crate::domain::TicketKind::CompensationDead,
                provider: None,
                order: Some(&order),
                order_no: None,
                provider_txn_id: None,
                local_amount_cents: None,
                provider_amount_cents: None,
                detail: json!({"eventId": e.id.to_string(), "kind": e.kind, "attempts": e.attempts,
                               "lastError": e.last_error, "idempotencyKey": e.idempotency_key}),
                finding_key: format!("COMPENSATION_DEAD:{}:{}", e.id, e.attempts),
            },
            &TraceId(e.trace_id.clone()),
        )
        .await?;
        if let Some(alert) = crate::alerts::Alert::compensation_dead(e, &order) {
            crate::alerts::raise(conn, &self.state.config, alert).await?;
        }
        Ok(())
    }
}

/// The base of an event's backoff: the chat channels' own (`FITORDER_ALERT_RETRY_BASE`) for an
/// alert delivery, the outbox's (`FITORDER_RETRY_BASE`) for the rest.
fn retry_base(config: &crate::config::Config, kind: CompensationKind) -> Duration {
    match kind {
        CompensationKind::AlertDelivery => config.alert_retry_base,
        CompensationKind::DoorAccessGrant
        | CompensationKind::DoorAccessRevoke
        | CompensationKind::AiAccessGrant
        | CompensationKind::AiAccessRevoke
        | CompensationKind::ProviderRefund => config.retry_base,
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".into())
        + &format!("-{}", std::process::id())
}

/// Starts `n` workers sharing the process's pool.
/// The providers whose refunds this process delivers: those it has the keys of.
pub fn served_providers(state: &AppState) -> Vec<crate::domain::Provider> {
    crate::domain::Provider::ALL
        .into_iter()
        .filter(|p| state.providers.configured(*p))
        .collect()
}

pub fn spawn(
    state: &AppState,
    n: usize,
    shutdown: &tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let w = Worker::new(state.clone());
            tokio::spawn(w.run(shutdown.clone()))
        })
        .collect()
}
