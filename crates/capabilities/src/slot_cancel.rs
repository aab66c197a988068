//! A coach falls ill: `cancelCoachSlot` cancels a session and every order booked on it, each
//! through the order state machine (`order_ops::settle_canceled_booking`): a waiting order is
//! canceled (its trade closed first, its frozen wallet money unfrozen), a paid one refunded
//! whole (provider refunds through the outbox, wallet money at once), a consumed one left as
//! it is. Each booked member hears of it through `orderStatusChanged` (`transition.sql`'s
//! announcement).
//!
//! Never half, and resumable (docs/operations.md "Canceling a coach's session"): the cancel is
//! a durable mark on the slot, written once in its own transaction with who asked, why and the
//! trace ([`mark`], `slot_cancel/mark.sql`); from then on the slot takes no booking and is no
//! longer offered. Its bookings are then settled one transaction per order, each under the
//! order's lock and decided by the status it finds, so settling again changes nothing that was
//! settled. When none is left open the slot is marked settled (`slot_cancel/settled.sql`).
//! A process killed in between leaves the mark: the scheduler's `coach_slot:cancel` ([`resume`])
//! settles every marked, unsettled slot, as the actor who asked and under their trace. Closing
//! a trade at a provider is a network call, which one database transaction could not hold:
//! that is why it is not one transaction for all.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use crate::app::AppState;
use crate::auth::{Role, Viewer};
use crate::db::models::{CoachSlot, Order};
use crate::db::schema::{coach_slots, orders, payment_trades};
use crate::db::sql::StaticQuery;
use crate::domain::{Actor, ActorKind, Ctx, OrderStatus, Provider, Refusal};
use crate::error::{required_text, AppError, AppResult};
use crate::orders as order_ops;
use crate::payments::closing::{self, Closing};
use crate::trace::TraceId;

/// A canceled slot and the orders booked on it, as they are now.
#[derive(Debug)]
pub struct CanceledSlot {
    pub slot: CoachSlot,
    pub orders: Vec<Order>,
}

/// Trades closed at once, per settling.
const CLOSE_CONCURRENCY: usize = 8;

/// How long a marked slot is left to the request that marked it before the resuming task
/// settles it too (settling twice is harmless, only wasteful).
pub const RESUME_AFTER: Duration = Duration::from_secs(10);

/// `cancelCoachSlot`: admins, store-limited ones their stores' slots. Marks the slot (once;
/// asked again, the mark stays as the first call wrote it) and settles its bookings; answers
/// the slot and its orders as they are now. A slot that has started is refused
/// (`SLOT_STARTED`) unless it was canceled before.
pub async fn cancel(
    state: &AppState,
    viewer: &Viewer,
    slot_id: i64,
    reason: &str,
    ctx: &Ctx,
) -> AppResult<CanceledSlot> {
    viewer.require(&[Role::Admin])?;
    let reason = required_text(reason, 500, "a cancel's reason")?;
    let mut conn = state.pool.get().await?;
    let slot = conn
        .transaction(async |conn| mark(conn, viewer, slot_id, reason, ctx).await)
        .await?;
    drop(conn);
    if slot.cancel_settled_at.is_none() {
        settle(state, &slot).await?;
    }
    let mut conn = state.pool.get().await?;
    let slot = coach_slots::table
        .find(slot_id)
        .select(CoachSlot::as_select())
        .get_result(&mut conn)
        .await?;
    let orders = bookings(&mut conn, slot_id).await?;
    Ok(CanceledSlot { slot, orders })
}

/// Locks the slot and marks it canceled, or finds it canceled already (changed by nothing).
async fn mark(
    conn: &mut AsyncPgConnection,
    viewer: &Viewer,
    slot_id: i64,
    reason: &str,
    ctx: &Ctx,
) -> AppResult<CoachSlot> {
    let slot: CoachSlot = coach_slots::table
        .find(slot_id)
        .select(CoachSlot::as_select())
        .for_update()
        .get_result(conn)
        .await
        .optional()?
        .filter(|s| viewer.sees_store(s.store_id))
        .ok_or_else(|| AppError::NotFound(format!("coach slot {slot_id}")))?;
    if slot.canceled_at.is_some() {
        return Ok(slot);
    }
    if slot.starts_at <= chrono::Utc::now() {
        return Err(AppError::refused(
            Refusal::SlotStarted,
            "this coach's session has started: it can no longer be canceled (refund its orders one by one)",
        ));
    }
    let marked: Option<CoachSlot> = StaticQuery::new(include_str!("slot_cancel/mark.sql"))
        .bind::<BigInt, _>(slot_id) // $1
        .bind::<Text, _>(reason) // $2
        .bind::<Text, _>(ctx.actor.to_string()) // $3
        .bind::<Text, _>(ctx.trace.as_str()) // $4
        .get_result(conn)
        .await
        .optional()?;
    // Locked and checked above: only a clock passing `starts_at` meanwhile leaves it unmarked.
    marked.ok_or_else(|| {
        AppError::refused(
            Refusal::SlotStarted,
            "this coach's session has started: it can no longer be canceled",
        )
    })
}

/// The orders booked on a slot, oldest first.
async fn bookings(conn: &mut AsyncPgConnection, slot_id: i64) -> AppResult<Vec<Order>> {
    Ok(orders::table
        .filter(orders::coach_slot_id.eq(slot_id))
        .order(orders::id)
        .select(Order::as_select())
        .load(conn)
        .await?)
}

/// The actor who asked for the cancel, as the mark recorded them (`admin:staff-7`): the
/// bookings are settled in their name whoever settles them.
fn actor_of(recorded: &str) -> AppResult<Actor> {
    recorded
        .split_once(':')
        .and_then(|(kind, id)| {
            ActorKind::parse(kind).map(|kind| Actor {
                kind,
                id: id.to_string(),
            })
        })
        .ok_or_else(|| AppError::internal(format!("a coach slot's cancel recorded the actor {recorded:?}")))
}

/// Settles the bookings of a marked slot: the open trades of its waiting online orders closed
/// first (one found paid meanwhile is paid, then refunded whole below), then each open order
/// in its own transaction; the slot marked settled when none is left open. Answers how many
/// orders could not be settled this time (logged; the resuming task tries them again).
pub async fn settle(state: &AppState, slot: &CoachSlot) -> AppResult<usize> {
    let (Some(reason), Some(by), Some(trace)) = (&slot.cancel_reason, &slot.canceled_by, &slot.cancel_trace_id) else {
        return Err(AppError::internal(format!("coach slot {} is not canceled", slot.id)));
    };
    let ctx = Ctx {
        actor: actor_of(by)?,
        trace: TraceId(trace.clone()),
    };
    let mut conn = state.pool.get().await?;
    let open_trades: Vec<(String, Option<Provider>)> = orders::table
        .filter(orders::coach_slot_id.eq(slot.id))
        .filter(orders::status.eq(OrderStatus::WaitPay))
        .filter(orders::online_provider.is_not_null())
        .filter(diesel::dsl::exists(
            payment_trades::table.filter(payment_trades::order_id.eq(orders::id)),
        ))
        .order(orders::id)
        .select((orders::order_no, orders::online_provider))
        .load(&mut conn)
        .await?;
    drop(conn);
    close_trades(state, open_trades, &ctx.trace).await;

    let mut conn = state.pool.get().await?;
    let open: Vec<i64> = orders::table
        .filter(orders::coach_slot_id.eq(slot.id))
        .filter(orders::status.eq_any([OrderStatus::WaitPay, OrderStatus::Paid, OrderStatus::Consuming]))
        .order(orders::id)
        .select(orders::id)
        .load(&mut conn)
        .await?;
    let mut failed = 0;
    for id in open {
        if let Err(e) = order_ops::settle_canceled_booking(&mut conn, &state.config, id, reason, &ctx).await {
            failed += 1;
            tracing::warn!(slot = slot.id, order = id, error = %e.message(), "a booking of a canceled coach slot was not settled; tried again later");
        }
    }
    let settled = StaticQuery::new(include_str!("slot_cancel/settled.sql"))
        .bind::<BigInt, _>(slot.id) // $1
        .execute(&mut conn)
        .await?;
    if settled > 0 {
        tracing::info!(
            slot = slot.id,
            trace = ctx.trace.as_str(),
            "coach slot canceled: every booking settled"
        );
    }
    Ok(failed)
}

/// Closes the trades of waiting online orders at their providers, a few at a time, holding no
/// connection. Whatever the answer, the orders are canceled next: a trade the provider paid
/// meanwhile was applied here (the order is PAID, and refunded whole); a member paying right
/// now, or a provider that does not answer, leaves a payment that may still arrive, which is
/// then a paid-after-cancel like any other.
async fn close_trades(state: &AppState, trades: Vec<(String, Option<Provider>)>, trace: &TraceId) {
    use futures_util::StreamExt;
    let asked: Vec<(String, Provider)> = trades
        .into_iter()
        .filter_map(|(no, p)| p.filter(|p| state.providers.configured(*p)).map(|p| (no, p)))
        .collect();
    futures_util::stream::iter(asked)
        .map(|(no, provider)| async move {
            match closing::close_trade(state, provider, &no, trace).await {
                Closing::Closed => {}
                Closing::Paid => {
                    tracing::info!(order_no = no, "paid while its coach slot was canceled: refunded whole")
                }
                Closing::NotApplied(outcome) => {
                    tracing::warn!(
                        order_no = no,
                        outcome = outcome.as_str(),
                        "paid during the close, payment not applied"
                    )
                }
                Closing::Paying => tracing::warn!(order_no = no, "the member is paying right now; canceling anyway"),
                Closing::NoAnswer(e) => {
                    tracing::warn!(order_no = no, error = %e, "closing the trade failed; canceling anyway")
                }
            }
        })
        .buffer_unordered(CLOSE_CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
}

/// The scheduler's `coach_slot:cancel`: settles every canceled slot whose bookings are not all
/// settled, marked at least [`RESUME_AFTER`] ago (a request killed mid-way, a booking that
/// failed). Answers how many slots it settled.
pub async fn resume(state: AppState) -> AppResult<i64> {
    let mut conn = state.pool.get().await?;
    let since = chrono::Utc::now() - RESUME_AFTER;
    let slots: Vec<CoachSlot> = coach_slots::table
        .filter(coach_slots::canceled_at.le(since))
        .filter(coach_slots::cancel_settled_at.is_null())
        .order(coach_slots::canceled_at)
        .limit(100)
        .select(CoachSlot::as_select())
        .load(&mut conn)
        .await?;
    drop(conn);
    let mut settled = 0;
    for slot in slots {
        tracing::info!(slot = slot.id, "resuming the cancel of a coach slot");
        if settle(&state, &slot).await? == 0 {
            settled += 1;
        }
    }
    Ok(settled)
}
