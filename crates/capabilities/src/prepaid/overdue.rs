//! Cooling-off refunds the provider has not paid back by their deadline (`orders.refund_due_by`,
//! working days on the business calendar): each gets a `REFUND_OVERDUE` ticket and an alert,
//! once (the ticket's finding key), however often the sweep runs and on however many instances.

use chrono::{NaiveDate, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde_json::json;

use crate::app::AppState;
use crate::db::models::Order;
use crate::db::schema::{compensation_events, exception_tickets, order_prepaid, orders};
use crate::domain::{CompensationKind, CompensationStatus, OrderStatus, TicketKind};
use crate::error::AppResult;
use crate::tickets::NewTicket;
use crate::trace::TraceId;

/// The finding key of an order's overdue refund: one ticket per order.
fn finding_key(order_id: i64) -> String {
    format!("REFUND_OVERDUE:{order_id}")
}

/// Opens the tickets of refunds due before `today` whose provider refund is not done. Returns
/// how many were opened.
pub async fn sweep_on(state: &AppState, today: NaiveDate) -> AppResult<i64> {
    let mut conn = state.pool.get().await?;
    let due = overdue(&mut conn, today).await?;
    let mut opened = 0;
    for (order, due_by, status) in due {
        let trace = TraceId::new();
        let t = conn
            .transaction(async |conn| {
                crate::alerts::open_ticket(
                    conn,
                    &state.config,
                    NewTicket {
                        kind: TicketKind::RefundOverdue,
                        provider: order.online_provider,
                        order: Some(&order),
                        order_no: None,
                        provider_txn_id: order.provider_txn_id.as_deref(),
                        local_amount_cents: order.refund_amount_cents,
                        provider_amount_cents: None,
                        detail: json!({
                            "refundDueBy": due_by.to_string(),
                            "refundStatus": status.as_str(),
                            "refundedAt": order.refunded_at,
                            "why": "cooling-off refund not confirmed by the provider by its deadline",
                        }),
                        finding_key: finding_key(order.id),
                    },
                    &trace,
                )
                .await
            })
            .await?;
        opened += i64::from(t.is_some());
    }
    Ok(opened)
}

/// The scheduler's task: today in the business time zone.
pub async fn sweep(state: AppState) -> AppResult<i64> {
    let today = Utc::now().with_timezone(&state.config.timezone).date_naive();
    sweep_on(&state, today).await
}

/// Refunded orders due before `today` whose PROVIDER_REFUND is not DONE, without their ticket.
async fn overdue(
    conn: &mut AsyncPgConnection,
    today: NaiveDate,
) -> AppResult<Vec<(Order, NaiveDate, CompensationStatus)>> {
    let rows: Vec<(Order, Option<NaiveDate>, CompensationStatus)> = orders::table
        .inner_join(order_prepaid::table)
        .inner_join(compensation_events::table)
        .filter(order_prepaid::refund_due_by.lt(today))
        .filter(orders::status.eq(OrderStatus::Refunded))
        .filter(compensation_events::kind.eq(CompensationKind::ProviderRefund))
        .filter(compensation_events::status.ne(CompensationStatus::Succeeded))
        .select((
            Order::as_select(),
            order_prepaid::refund_due_by,
            compensation_events::status,
        ))
        .order(orders::id)
        .limit(500)
        .load(conn)
        .await?;
    let keys: Vec<String> = rows.iter().map(|r| finding_key(r.0.id)).collect();
    let ticketed: Vec<String> = exception_tickets::table
        .filter(exception_tickets::finding_key.eq_any(&keys))
        .select(exception_tickets::finding_key)
        .load(conn)
        .await?;
    Ok(rows
        .into_iter()
        .filter(|(o, ..)| !ticketed.contains(&finding_key(o.id)))
        .filter_map(|(o, due, s)| Some((o, due?, s)))
        .collect())
}
