//! Orders: placing, paying, canceling, refunding and checking in. Every status change goes
//! through [`transition`] (or [`transition_all`], its batch form), which asks the state machine
//! and runs `transition.sql`: the conditional UPDATE, its audit row, the release of what the
//! order held (seat or stock unit, frozen wallet money) and its NOTIFY in one statement. The
//! order's first audit row (its birth) is written by the same statement ([`record_birth`]).
//! The one exception is WAIT_PAY -> PAID, which [`apply_payment`] writes with the payment in one
//! statement (`pay.sql`, the fast payment path) after the same state machine check.

mod check_in;
mod lifecycle;
mod place;

pub use check_in::{check_in, CheckInOutcome};
pub use lifecycle::{
    apply_payment, apply_payment_announced_later, cancel_order, confirm_offline_payment, cooling_off_until,
    refund_order, request_cooling_off_refund, settle_canceled_booking, unused_share, Announcements, PaymentApplied,
    COOLING_OFF_REASON,
};
pub use place::{check_place_rate, place_order, PlaceOrder, PlacedItem};

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::auth::Viewer;
use crate::db::models::Order;
use crate::db::schema::orders;
use crate::db::sql::StaticQuery;
use crate::domain::{order_status, Ctx, OrderStatus};
use crate::error::{AppError, AppResult, OnViolation};

/// What a transition sets besides the status.
#[derive(Debug, Default)]
pub struct Changes<'a> {
    pub provider_txn_id: Option<&'a str>,
    pub cancel_reason: Option<&'a str>,
    pub refund_amount_cents: Option<i64>,
    pub sessions_delta: i32,
    /// Wallet money given back with a refund (REFUNDED only).
    pub wallet_refund_cents: i64,
}

/// Moves `order` (locked by the caller) to `to`. The state machine decides first; the UPDATE is
/// conditional on the status the caller saw, and the database trigger checks the pair once more.
/// The audit row, the release of what the order held (seat or stock unit, frozen wallet money)
/// and the announcement are written by the same statement (`transition.sql`), so a change
/// without them cannot exist.
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
    let moved = write_transition(conn, &[order.id], Some(from), to, ctx, reason, &changes).await?;
    match moved.into_iter().next() {
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

/// The same change of many orders the caller has locked (expiry's batch): one state machine
/// check, one statement. Orders no longer in `from` are left alone; returns those moved.
pub async fn transition_all(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
    from: OrderStatus,
    to: OrderStatus,
    ctx: &Ctx,
    reason: &str,
    changes: Changes<'_>,
) -> AppResult<Vec<Order>> {
    order_status::check(from, to, ctx.actor.kind)?;
    if changes.wallet_refund_cents != 0 {
        return Err(AppError::internal("a wallet refund is one order's"));
    }
    if ids.is_empty() {
        return Ok(vec![]);
    }
    let moved = write_transition(conn, ids, Some(from), to, ctx, reason, &changes).await?;
    if !moved.is_empty() {
        metrics::counter!("fitorder_transitions_total", "from" => from.as_str(), "to" => to.as_str())
            .increment(moved.len() as u64);
    }
    Ok(moved)
}

/// The audit row of an order's birth (NONE -> WAIT_PAY), written by the same statement as every
/// transition's, so the history starts at placement.
pub(crate) async fn record_birth(conn: &mut AsyncPgConnection, order: &Order, ctx: &Ctx) -> AppResult<Order> {
    let born = write_transition(
        conn,
        &[order.id],
        None,
        OrderStatus::WaitPay,
        ctx,
        "order placed",
        &Changes::default(),
    )
    .await?;
    born.into_iter()
        .next()
        .ok_or_else(|| AppError::internal(format!("order {} was not born WAIT_PAY", order.order_no)))
}

/// Runs `transition.sql`: the only code that writes an order's status (but `pay.sql`), its audit
/// rows, and what a change releases.
async fn write_transition(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
    from: Option<OrderStatus>,
    to: OrderStatus,
    ctx: &Ctx,
    reason: &str,
    changes: &Changes<'_>,
) -> AppResult<Vec<Order>> {
    StaticQuery::new(include_str!("transition.sql"))
        .bind::<Array<BigInt>, _>(ids) // $1
        .bind::<Text, _>(to) // $2
        .bind::<Nullable<Text>, _>(from) // $3
        .bind::<Text, _>(ctx.actor.to_string()) // $4
        .bind::<Text, _>(reason) // $5
        .bind::<Nullable<Text>, _>(changes.provider_txn_id) // $6
        .bind::<Nullable<Text>, _>(changes.cancel_reason) // $7
        .bind::<Nullable<BigInt>, _>(changes.refund_amount_cents) // $8
        .bind::<Integer, _>(changes.sessions_delta) // $9
        .bind::<Text, _>(ctx.trace.as_str()) // $10
        .bind::<BigInt, _>(changes.wallet_refund_cents) // $11
        .load(conn)
        .await
        // The ledger rows it writes are applied to the member's balances by the ledger trigger.
        .on_violation(crate::wallet::ledger_violation)
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

/// What a prepaid order kept of its store's rules at the sale (`order_prepaid`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaleTerms {
    pub accepted_terms_version: Option<String>,
    pub cooling_off_days: i32,
    pub refund_within_working_days: i32,
    /// Set by a cooling-off refund: when its money must have reached the payer.
    pub refund_due_by: Option<chrono::NaiveDate>,
}

/// The sale terms of orders (one statement for a page); an order sold without cooling-off or
/// terms has none.
pub async fn sale_terms(
    conn: &mut AsyncPgConnection,
    order_ids: &[i64],
) -> AppResult<std::collections::HashMap<i64, SaleTerms>> {
    use crate::db::schema::order_prepaid as op;
    type SaleRow = (i64, Option<String>, i32, i32, Option<chrono::NaiveDate>);
    let rows: Vec<SaleRow> = op::table
        .filter(op::order_id.eq_any(order_ids))
        .select((
            op::order_id,
            op::accepted_terms_version,
            op::cooling_off_days,
            op::refund_within_working_days,
            op::refund_due_by,
        ))
        .load(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(id, v, d, w, due)| {
            (
                id,
                SaleTerms {
                    accepted_terms_version: v,
                    cooling_off_days: d,
                    refund_within_working_days: w,
                    refund_due_by: due,
                },
            )
        })
        .collect())
}
