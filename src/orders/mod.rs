//! Orders: placing, paying, canceling, refunding and checking in. Every status change goes
//! through [`transition`], which asks the state machine, updates conditionally on the expected
//! status and writes the audit row in the same statement.

mod check_in;
mod lifecycle;
mod place;

pub use check_in::{check_in, CheckInOutcome};
pub use lifecycle::{apply_payment, cancel_order, confirm_offline_payment, refund_order, unused_share, PaymentApplied};
pub use place::{check_place_rate, place_order, PlaceOrder, PlacedItem};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::auth::Viewer;
use crate::db::models::Order;
use crate::db::schema::orders;
use crate::db::sql::StaticQuery;
use crate::domain::{order_status, Ctx, OrderStatus};
use crate::error::{AppError, AppResult};

/// What a transition sets besides the status.
#[derive(Debug, Default)]
pub struct Changes<'a> {
    pub provider_txn_id: Option<&'a str>,
    pub cancel_reason: Option<&'a str>,
    pub refund_amount_cents: Option<i64>,
    pub sessions_delta: i32,
}

/// Moves `order` (locked by the caller) to `to`. The state machine decides first; the UPDATE is
/// conditional on the status the caller saw, and the database trigger checks the pair once more.
/// The audit row is written by the same statement, so a change without its audit cannot exist.
pub async fn transition(
    conn: &mut AsyncPgConnection,
    order: &Order,
    to: OrderStatus,
    ctx: &Ctx,
    reason: &str,
    changes: Changes<'_>,
) -> AppResult<Order> {
    let from = order.status;
    order_status::check(from, to, ctx.actor.kind)?;
    let moved: Option<Order> = StaticQuery::new(include_str!("transition.sql"))
        .bind::<BigInt, _>(order.id) // $1
        .bind::<Text, _>(to) // $2
        .bind::<Text, _>(from) // $3
        .bind::<Text, _>(ctx.actor.to_string()) // $4
        .bind::<Text, _>(reason) // $5
        .bind::<Nullable<Text>, _>(changes.provider_txn_id) // $6
        .bind::<Nullable<Text>, _>(changes.cancel_reason) // $7
        .bind::<Nullable<BigInt>, _>(changes.refund_amount_cents) // $8
        .bind::<Integer, _>(changes.sessions_delta) // $9
        .bind::<Text, _>(ctx.trace.as_str()) // $10
        .get_result(conn)
        .await
        .optional()?;
    match moved {
        Some(o) => {
            metrics::counter!("fitorder_transitions_total", "from" => from.as_str(), "to" => to.as_str()).increment(1);
            Ok(o)
        }
        // Someone else changed it first (only possible when the caller did not lock the row).
        None => {
            let now = load_order_by_id(conn, order.id).await?;
            Err(AppError::illegal(now.status, to))
        }
    }
}

pub async fn load_order_by_id(conn: &mut AsyncPgConnection, id: i64) -> AppResult<Order> {
    Ok(orders::table
        .find(id)
        .select(Order::as_select())
        .get_result(conn)
        .await?)
}

pub async fn find_order(conn: &mut AsyncPgConnection, order_no: &str) -> AppResult<Option<Order>> {
    Ok(orders::table
        .filter(orders::order_no.eq(order_no))
        .select(Order::as_select())
        .get_result(conn)
        .await
        .optional()?)
}

/// Locks the order for the rest of the transaction. Members may only lock their own orders;
/// anyone else's is answered as not found. Store-limited admins only their stores'.
pub async fn lock_order(conn: &mut AsyncPgConnection, order_no: &str, viewer: Option<&Viewer>) -> AppResult<Order> {
    let order: Option<Order> = orders::table
        .filter(orders::order_no.eq(order_no))
        .select(Order::as_select())
        .for_update()
        .get_result(conn)
        .await
        .optional()?;
    let order = order.ok_or_else(|| AppError::NotFound(format!("order {order_no}")))?;
    if let Some(v) = viewer {
        if !viewer_sees_order(v, &order) {
            return Err(AppError::NotFound(format!("order {order_no}")));
        }
    }
    Ok(order)
}

/// [`Viewer::sees_owned`] of an order.
pub fn viewer_sees_order(viewer: &Viewer, order: &Order) -> bool {
    viewer.sees_owned(order.member_id, order.store_id)
}

/// Puts a held seat or stock unit back on sale (cancel, expiry, refund).
pub async fn release_item(conn: &mut AsyncPgConnection, order: &Order) -> AppResult<()> {
    use crate::db::schema::{class_packs, coach_slots};
    if let Some(slot) = order.coach_slot_id {
        diesel::update(coach_slots::table.find(slot))
            .set(coach_slots::remaining.eq(coach_slots::remaining + 1))
            .execute(conn)
            .await?;
    }
    if let Some(pack) = order.class_pack_id {
        diesel::update(class_packs::table.find(pack).filter(class_packs::stock.is_not_null()))
            .set(class_packs::stock.eq(class_packs::stock + 1))
            .execute(conn)
            .await?;
    }
    Ok(())
}

/// The audit row of an order's birth (NONE -> WAIT_PAY), so the history starts at placement.
pub async fn transition_audit_birth(conn: &mut AsyncPgConnection, order: &Order, ctx: &Ctx) -> AppResult<()> {
    use crate::db::schema::order_transitions as ot;
    let id: i64 = diesel::insert_into(ot::table)
        .values((
            ot::order_id.eq(order.id),
            ot::from_status.eq(None::<OrderStatus>),
            ot::to_status.eq(OrderStatus::WaitPay),
            ot::actor.eq(ctx.actor.to_string()),
            ot::reason.eq("order placed"),
            ot::trace_id.eq(ctx.trace.as_str()),
        ))
        .returning(ot::id)
        .get_result(conn)
        .await?;
    crate::events::notify_sql(&format!("order:{id}")).execute(conn).await?;
    Ok(())
}
