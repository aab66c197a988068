//! Exception tickets: what the system could not settle by itself, handed to staff with the
//! whole story attached. Opened once per finding, however often the finding is made.
//!
//! A leaf that the capabilities call: opening, taking and closing tickets. What the closing
//! actions do to orders and money is [`crate::ticket_resolution`]; the alert a ticket about money
//! raises is [`crate::alerts::open_ticket`].

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::db::models::{ExceptionTicket, Order};
use crate::db::schema::exception_tickets as et;
use crate::domain::{Provider, TicketAction, TicketKind, TicketStatus};
use crate::error::AppResult;
use crate::trace::TraceId;

pub struct NewTicket<'a> {
    pub kind: TicketKind,
    pub provider: Option<Provider>,
    pub order: Option<&'a Order>,
    pub order_no: Option<&'a str>,
    pub provider_txn_id: Option<&'a str>,
    pub local_amount_cents: Option<i64>,
    pub provider_amount_cents: Option<i64>,
    pub detail: serde_json::Value,
    /// Makes a finding the same finding: a second open with the same key does nothing.
    pub finding_key: String,
}

/// Opens a ticket unless one exists for the same finding; returns it when newly opened.
pub async fn open(
    conn: &mut AsyncPgConnection,
    t: NewTicket<'_>,
    trace: &TraceId,
) -> AppResult<Option<ExceptionTicket>> {
    let opened: Option<ExceptionTicket> = diesel::insert_into(et::table)
        .values((
            et::kind.eq(t.kind),
            et::provider.eq(t.provider),
            et::order_id.eq(t.order.map(|o| o.id)),
            et::order_no.eq(t.order.map(|o| o.order_no.as_str()).or(t.order_no)),
            et::store_id.eq(t.order.map(|o| o.store_id)),
            et::provider_txn_id.eq(t.provider_txn_id),
            et::local_amount_cents.eq(t.local_amount_cents),
            et::provider_amount_cents.eq(t.provider_amount_cents),
            et::detail.eq(t.detail),
            et::finding_key.eq(&t.finding_key),
            et::trace_id.eq(trace.as_str()),
        ))
        .on_conflict(et::finding_key)
        .do_nothing()
        .returning(ExceptionTicket::as_returning())
        .get_result(conn)
        .await
        .optional()?;
    if let Some(ticket) = &opened {
        tracing::warn!(ticket = ticket.id, kind = %t.kind, order_no = ?ticket.order_no, "exception ticket opened");
        metrics::counter!("fitorder_tickets_opened_total", "kind" => t.kind.as_str()).increment(1);
        crate::events::notify_sql(&format!("ticket:{}", ticket.id))
            .execute(conn)
            .await?;
    }
    Ok(opened)
}

use diesel_async::AsyncConnection;

use crate::auth::Viewer;
use crate::domain::Ctx;
use crate::error::AppError;

fn locked_ticket_error(t: &ExceptionTicket) -> AppError {
    AppError::Conflict(format!("ticket {} is already {}", t.id, t.status))
}

async fn lock(conn: &mut AsyncPgConnection, id: i64, viewer: &Viewer) -> AppResult<ExceptionTicket> {
    let t: ExceptionTicket = et::table
        .find(id)
        .select(ExceptionTicket::as_select())
        .for_update()
        .get_result(conn)
        .await
        .optional()?
        .ok_or_else(|| AppError::NotFound(format!("ticket {id}")))?;
    if !viewer.sees_store_of(t.store_id) {
        return Err(AppError::NotFound(format!("ticket {id}")));
    }
    Ok(t)
}

/// OPEN -> IN_PROGRESS: someone is on it.
pub async fn start(conn: &mut AsyncPgConnection, id: i64, viewer: &Viewer, ctx: &Ctx) -> AppResult<ExceptionTicket> {
    conn.transaction(async |conn| -> AppResult<ExceptionTicket> {
        let t = lock(conn, id, viewer).await?;
        match t.status {
            TicketStatus::InProgress => Ok(t),
            TicketStatus::Open => Ok({
                announce_change(conn, id).await?;
                diesel::update(et::table.find(id))
                    .set((
                        et::status.eq(TicketStatus::InProgress),
                        et::resolved_by.eq(ctx.actor.to_string()),
                        et::updated_at.eq(diesel::dsl::now),
                    ))
                    .returning(ExceptionTicket::as_returning())
                    .get_result(conn)
                    .await?
            }),
            TicketStatus::Resolved | TicketStatus::Dismissed => Err(locked_ticket_error(&t)),
        }
    })
    .await
}

/// Locks a ticket that is still open (OPEN or IN_PROGRESS) for the rest of the transaction; a
/// resolved or dismissed one is a conflict.
pub async fn lock_unresolved(conn: &mut AsyncPgConnection, id: i64, viewer: &Viewer) -> AppResult<ExceptionTicket> {
    let t = lock(conn, id, viewer).await?;
    if t.status.is_closed() {
        return Err(locked_ticket_error(&t));
    }
    Ok(t)
}

/// Records how a ticket was closed: DISMISSED for NO_ACTION, RESOLVED for any other action.
pub async fn close(
    conn: &mut AsyncPgConnection,
    id: i64,
    action: TicketAction,
    note: Option<&str>,
    ctx: &Ctx,
) -> AppResult<ExceptionTicket> {
    announce_change(conn, id).await?;
    Ok(diesel::update(et::table.find(id))
        .set((
            et::status.eq(action.closes_as()),
            et::resolution.eq(action),
            et::resolved_at.eq(diesel::dsl::now),
            et::resolved_by.eq(ctx.actor.to_string()),
            et::note.eq(note),
            et::updated_at.eq(diesel::dsl::now),
        ))
        .returning(ExceptionTicket::as_returning())
        .get_result(conn)
        .await?)
}

/// Tells subscribers (`ticketChanged`) about the change when the transaction commits.
async fn announce_change(conn: &mut AsyncPgConnection, id: i64) -> AppResult<()> {
    crate::events::notify_sql(&format!("ticketchange:{id}"))
        .execute(conn)
        .await?;
    Ok(())
}
