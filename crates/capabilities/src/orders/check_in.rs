//! Check-ins: idempotent by `orderNo + consumeTxnNo`, consuming credits under the order's row
//! lock so that concurrent check-ins can never take more than there is.

use chrono::Utc;
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use super::{lock_order, transition, Changes, Ctx};
use crate::auth::{Role, Viewer};
use crate::db::models::{CheckIn, Membership, Order};
use crate::db::schema::{anomaly_events, check_ins, memberships, orders};
use crate::domain::{AnomalyCategory, MembershipStatus, OrderKind, OrderStatus, Refusal};
use crate::error::{AppError, AppResult, OnViolation, Violation};

pub struct CheckInOutcome {
    pub order: Order,
    pub duplicate: bool,
    pub remaining_sessions: i32,
}

pub async fn check_in(
    conn: &mut AsyncPgConnection,
    viewer: &Viewer,
    order_no: &str,
    consume_txn_no: &str,
    sessions: i32,
    ctx: &Ctx,
) -> AppResult<CheckInOutcome> {
    viewer.require(&[Role::Member, Role::Admin])?;
    let txn = crate::error::required_text(consume_txn_no, 64, "consumeTxnNo")?;
    if !(1..=100).contains(&sessions) {
        return Err(AppError::bad("sessions must be between 1 and 100"));
    }
    conn.transaction(async |conn| -> AppResult<CheckInOutcome> {
        let order = lock_order(conn, order_no, Some(viewer)).await?;
        let is_membership = order.kind == OrderKind::Membership;
        let recorded_sessions = if is_membership { 0 } else { sessions };

        // The same consumption serial number again: nothing changes, the first answer stands.
        let earlier: Option<CheckIn> = check_ins::table
            .filter(check_ins::order_id.eq(order.id))
            .filter(check_ins::consume_txn_no.eq(txn))
            .select(CheckIn::as_select())
            .get_result(conn)
            .await
            .optional()?;
        if let Some(earlier) = earlier {
            if earlier.sessions != recorded_sessions {
                return Err(AppError::Conflict(format!(
                    "consumeTxnNo {txn} was already used for {} session(s)",
                    earlier.sessions
                )));
            }
            diesel::insert_into(anomaly_events::table)
                .values((
                    anomaly_events::category.eq(AnomalyCategory::DuplicateCheckIn),
                    anomaly_events::order_id.eq(order.id),
                    anomaly_events::store_id.eq(order.store_id),
                    anomaly_events::detail.eq(format!("{}:{txn}", order.order_no)),
                    anomaly_events::trace_id.eq(ctx.trace.as_str()),
                ))
                .execute(conn)
                .await?;
            metrics::counter!("fitorder_duplicate_check_ins_total").increment(1);
            return Ok(CheckInOutcome {
                order,
                duplicate: true,
                remaining_sessions: earlier.remaining_after,
            });
        }

        let status = order.status;
        if !status.is_live() {
            return Err(AppError::illegal(status, OrderStatus::Consuming));
        }
        // A booking of a coach's session that was canceled is being refunded (`cancelCoachSlot`
        // settles it): nothing to check in to.
        if let Some(slot) = order.coach_slot_id {
            use crate::db::schema::coach_slots;
            let canceled: Option<chrono::DateTime<Utc>> = coach_slots::table
                .find(slot)
                .select(coach_slots::canceled_at)
                .get_result(conn)
                .await?;
            if canceled.is_some() {
                return Err(AppError::refused(
                    Refusal::SlotCanceled,
                    "this coach's session was canceled",
                ));
            }
        }
        let (order, remaining) = if is_membership {
            check_in_membership(conn, order, ctx).await?
        } else {
            use_credits(conn, order, sessions, ctx).await?
        };
        diesel::insert_into(check_ins::table)
            .values((
                check_ins::order_id.eq(order.id),
                check_ins::consume_txn_no.eq(txn),
                check_ins::sessions.eq(recorded_sessions),
                check_ins::remaining_after.eq(remaining),
                check_ins::actor.eq(ctx.actor.to_string()),
                check_ins::trace_id.eq(ctx.trace.as_str()),
            ))
            .execute(conn)
            .await
            .on_violation(|v| match v {
                Violation::Unique("check_ins_order_txn_key") => {
                    Some(AppError::Conflict("check-in already recorded".into()))
                }
                _ => None,
            })?;
        metrics::counter!("fitorder_check_ins_total").increment(1);
        Ok(CheckInOutcome {
            order,
            duplicate: false,
            remaining_sessions: remaining,
        })
    })
    .await
}

/// A membership has no credits: any number of check-ins within its validity.
async fn check_in_membership(conn: &mut AsyncPgConnection, order: Order, ctx: &Ctx) -> AppResult<(Order, i32)> {
    // The card's row shared-locked: a freeze (which locks it for update) and a check-in do not
    // pass each other, so no check-in succeeds on a card frozen before it committed.
    let m: Option<Membership> = memberships::table
        .filter(memberships::order_id.eq(order.id))
        .select(Membership::as_select())
        .for_share()
        .get_result(conn)
        .await
        .optional()?;
    let now = Utc::now();
    match m {
        Some(m) if m.status == MembershipStatus::Frozen => {
            return Err(AppError::refused(
                Refusal::MembershipFrozen,
                "this membership is frozen",
            ))
        }
        Some(m) if m.status == MembershipStatus::Active && m.valid_from <= now && now < m.valid_to => {}
        Some(m) if m.valid_from > now => {
            return Err(AppError::bad(format!(
                "this membership starts at {}",
                m.valid_from.to_rfc3339()
            )))
        }
        _ => return Err(AppError::bad("this membership is not valid now")),
    }
    let order = if order.status == OrderStatus::Paid {
        transition(
            conn,
            &order,
            OrderStatus::Consuming,
            ctx,
            "first check-in",
            Changes::default(),
        )
        .await?
    } else {
        order
    };
    Ok((order, 0))
}

/// Takes `sessions` credits of a class pack or private session order. The order is locked and
/// its credits counted first; the row's CHECK would refuse using more than there are all the
/// same, which the client is told as BAD_USER_INPUT too.
async fn use_credits(conn: &mut AsyncPgConnection, order: Order, sessions: i32, ctx: &Ctx) -> AppResult<(Order, i32)> {
    take_credits(conn, order, sessions, ctx)
        .await
        .on_violation(|v| match v {
            Violation::Check("orders_sessions_in_range") => Some(AppError::bad("not enough sessions left")),
            _ => None,
        })
}

async fn take_credits(conn: &mut AsyncPgConnection, order: Order, sessions: i32, ctx: &Ctx) -> AppResult<(Order, i32)> {
    let left = order.sessions_total - order.sessions_used;
    if sessions > left {
        return Err(AppError::bad(format!("only {left} session(s) left on this order")));
    }
    let remaining = left - sessions;
    let mut order = order;
    let mut delta = sessions;
    if order.status == OrderStatus::Paid {
        let reason = "first check-in";
        order = transition(
            conn,
            &order,
            OrderStatus::Consuming,
            ctx,
            reason,
            Changes {
                sessions_delta: delta,
                ..Default::default()
            },
        )
        .await?;
        delta = 0;
    }
    if remaining == 0 {
        order = transition(
            conn,
            &order,
            OrderStatus::Consumed,
            ctx,
            "last session used",
            Changes {
                sessions_delta: delta,
                ..Default::default()
            },
        )
        .await?;
    } else if delta > 0 {
        order = diesel::update(orders::table.find(order.id))
            .set((
                orders::sessions_used.eq(orders::sessions_used + delta),
                orders::updated_at.eq(diesel::dsl::now),
            ))
            .returning(Order::as_returning())
            .get_result(conn)
            .await?;
    }
    Ok((order, remaining))
}
