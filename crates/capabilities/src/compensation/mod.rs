//! The delivery side of the transactional outbox: the events `outbox` wrote are delivered by
//! [`worker`] through [`downstream`] (retries with backoff, DEAD with a ticket), and DEAD ones
//! are replayed from here.

pub mod downstream;
pub mod worker;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use crate::db::models::CompensationEvent;
use crate::db::schema::compensation_events as ce;
use crate::domain::CompensationStatus;
use crate::domain::Ctx;
use crate::error::{AppError, AppResult};
use crate::outbox;

/// DEAD -> PENDING: the event is due now, with a fresh allowance of attempts (the count goes
/// on, so the log shows the whole history). Who asked is recorded.
pub async fn replay(
    conn: &mut AsyncPgConnection,
    event_id: i64,
    ctx: &Ctx,
    more_attempts: i32,
) -> AppResult<CompensationEvent> {
    use crate::db::schema::compensation_replays as cr;
    conn.transaction(async |conn| -> AppResult<CompensationEvent> {
        let event: CompensationEvent = ce::table
            .find(event_id)
            .select(CompensationEvent::as_select())
            .for_update()
            .get_result(conn)
            .await
            .optional()?
            .ok_or_else(|| AppError::NotFound(format!("compensation event {event_id}")))?;
        if event.status != CompensationStatus::Dead {
            return Err(AppError::Conflict(format!(
                "only DEAD events are replayed; event {event_id} is {}",
                event.status
            )));
        }
        let replayed: CompensationEvent = diesel::update(ce::table.find(event_id))
            .set((
                ce::status.eq(CompensationStatus::Pending),
                ce::next_attempt_at.eq(diesel::dsl::now),
                ce::max_attempts.eq(event.attempts + more_attempts),
                ce::locked_until.eq(None::<chrono::DateTime<chrono::Utc>>),
                ce::locked_by.eq(None::<String>),
                ce::updated_at.eq(diesel::dsl::now),
            ))
            .returning(CompensationEvent::as_returning())
            .get_result(conn)
            .await?;
        diesel::insert_into(cr::table)
            .values((
                cr::event_id.eq(event_id),
                cr::actor.eq(ctx.actor.to_string()),
                cr::trace_id.eq(ctx.trace.as_str()),
            ))
            .execute(conn)
            .await?;
        outbox::announce(conn, &[event_id]).await?;
        Ok(replayed)
    })
    .await
}

/// [`replay`] for a staff member: an event of an order outside their stores is answered as not
/// found, like one that does not exist.
pub async fn replay_seen_by(
    conn: &mut AsyncPgConnection,
    viewer: &crate::auth::Viewer,
    event_id: i64,
    ctx: &Ctx,
    more_attempts: i32,
) -> AppResult<CompensationEvent> {
    use crate::db::schema::orders;
    let order_store: Option<i64> = ce::table
        .inner_join(orders::table)
        .filter(ce::id.eq(event_id))
        .select(orders::store_id)
        .get_result(conn)
        .await
        .optional()?;
    match order_store {
        Some(s) if viewer.sees_store(s) => replay(conn, event_id, ctx, more_attempts).await,
        _ => Err(AppError::NotFound(format!("compensation event {event_id}"))),
    }
}

/// The most DEAD events one `replayDeadCompensations` call replays (each in a transaction of
/// its own): a call answers in bounded time however many died; the caller calls again until
/// the answer is 0.
pub const REPLAY_BATCH: i64 = 500;

/// Replays DEAD events of orders (of one order, or of all), the oldest [`REPLAY_BATCH`]; returns
/// how many. Alert deliveries are no order's: [`replay_dead_alerts`].
pub async fn replay_dead(
    conn: &mut AsyncPgConnection,
    order_id: Option<i64>,
    stores: Option<&[i64]>,
    ctx: &Ctx,
    more_attempts: i32,
) -> AppResult<i32> {
    use crate::db::schema::orders;
    let mut q = ce::table
        .filter(ce::status.eq(CompensationStatus::Dead))
        .filter(ce::order_id.is_not_null())
        .select(ce::id)
        .into_boxed();
    if let Some(id) = order_id {
        q = q.filter(ce::order_id.eq(id));
    }
    if let Some(stores) = stores {
        q = q.filter(
            ce::order_id.eq_any(
                orders::table
                    .filter(orders::store_id.eq_any(stores.to_vec()))
                    .select(orders::id.nullable()),
            ),
        );
    }
    let ids: Vec<i64> = q.order(ce::id).limit(REPLAY_BATCH).load(conn).await?;
    let mut n = 0;
    for id in ids {
        match replay(conn, id, ctx, more_attempts).await {
            Ok(_) => n += 1,
            // Replayed by someone else in the meantime.
            Err(AppError::Conflict(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Replays DEAD alert deliveries (of one alert, or of all), the oldest [`REPLAY_BATCH`], with
/// [`replay`] like any event; returns how many (`fitorder alerts --replay-dead`).
pub async fn replay_dead_alerts(
    conn: &mut AsyncPgConnection,
    alert_id: Option<i64>,
    ctx: &Ctx,
    more_attempts: i32,
) -> AppResult<usize> {
    let mut q = ce::table
        .filter(ce::status.eq(CompensationStatus::Dead.as_str()))
        .filter(ce::kind.eq(crate::domain::CompensationKind::AlertDelivery.as_str()))
        .select(ce::id)
        .into_boxed();
    if let Some(id) = alert_id {
        q = q.filter(
            diesel::dsl::sql::<diesel::sql_types::Bool>("payload->>'alertId' = ")
                .bind::<diesel::sql_types::Text, _>(id.to_string()),
        );
    }
    let ids: Vec<i64> = q.order(ce::id).limit(REPLAY_BATCH).load(conn).await?;
    let mut n = 0;
    for id in ids {
        match replay(conn, id, ctx, more_attempts).await {
            Ok(_) => n += 1,
            Err(AppError::Conflict(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
