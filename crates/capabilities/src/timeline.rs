//! The chain of one order: status changes, callbacks, check-ins, compensation attempts and
//! tickets merged by time, each with the trace id under which it happened.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::db::models::{CheckIn, OrderTransition, PaymentCallback};
use crate::db::schema::*;
use crate::domain::{CompensationKind, OrderStatus, TicketKind, TicketStatus, TimelineKind};
use crate::error::AppResult;

/// One happening in an order's chain.
#[derive(Clone, Debug)]
pub struct Entry {
    pub at: DateTime<Utc>,
    pub kind: TimelineKind,
    pub actor: String,
    pub from_status: Option<OrderStatus>,
    pub to_status: Option<OrderStatus>,
    pub summary: String,
    pub trace_id: String,
}

/// order, at, ok, error, duration, event kind, event trace id, worker.
type AttemptRow = (
    i64,
    DateTime<Utc>,
    bool,
    Option<String>,
    i32,
    CompensationKind,
    String,
    String,
);
/// order, opened at, kind, status, trace id.
type TicketRow = (Option<i64>, DateTime<Utc>, TicketKind, TicketStatus, String);

pub async fn for_order(conn: &mut AsyncPgConnection, order_id: i64) -> AppResult<Vec<Entry>> {
    Ok(for_orders(conn, &[order_id])
        .await?
        .remove(&order_id)
        .unwrap_or_default())
}

/// The timelines of many orders in six statements, whatever their number (a page of orders
/// asking for theirs goes through the `OrderTimeline` DataLoader to here).
pub async fn for_orders(conn: &mut AsyncPgConnection, order_ids: &[i64]) -> AppResult<HashMap<i64, Vec<Entry>>> {
    let mut all: HashMap<i64, Vec<Entry>> = order_ids.iter().map(|id| (*id, Vec::new())).collect();
    let ids = order_ids.to_vec();
    let transitions: Vec<OrderTransition> = order_transitions::table
        .filter(order_transitions::order_id.eq_any(&ids))
        .select(OrderTransition::as_select())
        .load(conn)
        .await?;
    for t in transitions {
        let out = all.entry(t.order_id).or_default();
        out.push(Entry {
            at: t.at,
            kind: TimelineKind::StatusChange,
            actor: t.actor,
            from_status: t.from_status,
            to_status: Some(t.to_status),
            summary: format!(
                "{} -> {}: {}",
                t.from_status.map_or("NONE", |s| s.as_str()),
                t.to_status,
                t.reason
            ),
            trace_id: t.trace_id,
        });
    }
    let checks: Vec<CheckIn> = check_ins::table
        .filter(check_ins::order_id.eq_any(&ids))
        .select(CheckIn::as_select())
        .load(conn)
        .await?;
    for c in checks {
        all.entry(c.order_id).or_default().push(Entry {
            at: c.at,
            kind: TimelineKind::CheckIn,
            actor: c.actor,
            from_status: None,
            to_status: None,
            summary: format!(
                "check-in {}: {} session(s), {} left",
                c.consume_txn_no, c.sessions, c.remaining_after
            ),
            trace_id: c.trace_id,
        });
    }
    let callbacks: Vec<PaymentCallback> = payment_callbacks::table
        .filter(payment_callbacks::order_id.eq_any(&ids))
        .select(PaymentCallback::as_select())
        .load(conn)
        .await?;
    for cb in callbacks {
        let Some(order_id) = cb.order_id else { continue };
        all.entry(order_id).or_default().push(Entry {
            at: cb.received_at,
            kind: TimelineKind::Callback,
            actor: format!("provider:{}", cb.provider),
            from_status: None,
            to_status: None,
            summary: format!(
                "{} {}: {}{}",
                cb.provider,
                cb.event_type.as_deref().unwrap_or("notification"),
                cb.outcome,
                cb.provider_txn_id.map(|t| format!(" ({t})")).unwrap_or_default()
            ),
            trace_id: cb.trace_id,
        });
    }
    let attempts: Vec<AttemptRow> = compensation_attempts::table
        .inner_join(compensation_events::table)
        .filter(compensation_events::order_id.eq_any(&ids))
        .select((
            // Loaded by order: every row has it.
            compensation_events::order_id.assume_not_null(),
            compensation_attempts::at,
            compensation_attempts::ok,
            compensation_attempts::error,
            compensation_attempts::duration_ms,
            compensation_events::kind,
            compensation_events::trace_id,
            compensation_attempts::worker,
        ))
        .load(conn)
        .await?;
    for (order_id, at, ok, error, ms, kind, trace, worker) in attempts {
        all.entry(order_id).or_default().push(Entry {
            at,
            kind: TimelineKind::CompensationAttempt,
            actor: format!("system:{}", if worker.is_empty() { "worker" } else { &worker }),
            from_status: None,
            to_status: None,
            summary: match error {
                None if ok => format!("{kind} delivered in {ms} ms"),
                e => format!("{kind} failed after {ms} ms: {}", e.unwrap_or_default()),
            },
            trace_id: trace,
        });
    }
    let replays: Vec<(i64, DateTime<Utc>, String, CompensationKind, String)> = compensation_replays::table
        .inner_join(compensation_events::table)
        .filter(compensation_events::order_id.eq_any(&ids))
        .select((
            // Loaded by order: every row has it.
            compensation_events::order_id.assume_not_null(),
            compensation_replays::at,
            compensation_replays::actor,
            compensation_events::kind,
            compensation_replays::trace_id,
        ))
        .load(conn)
        .await?;
    for (order_id, at, actor, kind, trace) in replays {
        all.entry(order_id).or_default().push(Entry {
            at,
            kind: TimelineKind::CompensationReplay,
            actor,
            from_status: None,
            to_status: None,
            summary: format!("{kind} sent back to the queue"),
            trace_id: trace,
        });
    }
    let tickets: Vec<TicketRow> = exception_tickets::table
        .filter(exception_tickets::order_id.eq_any(&ids))
        .select((
            exception_tickets::order_id,
            exception_tickets::opened_at,
            exception_tickets::kind,
            exception_tickets::status,
            exception_tickets::trace_id,
        ))
        .load(conn)
        .await?;
    for (order_id, at, kind, status, trace) in tickets {
        let Some(order_id) = order_id else { continue };
        all.entry(order_id).or_default().push(Entry {
            at,
            kind: TimelineKind::Ticket,
            actor: "system:tickets".into(),
            from_status: None,
            to_status: None,
            summary: format!("{kind} ticket opened (now {status})"),
            trace_id: trace,
        });
    }
    for out in all.values_mut() {
        out.sort_by_key(|e| e.at);
    }
    Ok(all)
}
