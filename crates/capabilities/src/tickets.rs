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
use crate::db::sql::StaticQuery;
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
    use diesel::sql_types::{BigInt, Jsonb, Nullable, Text};
    let opened: Option<ExceptionTicket> = StaticQuery::new(opening(include_str!("tickets/one.sql")))
        .bind::<Text, _>(t.kind)
        .bind::<Nullable<Text>, _>(t.provider)
        .bind::<Nullable<BigInt>, _>(t.order.map(|o| o.id))
        .bind::<Nullable<Text>, _>(t.order.map(|o| o.order_no.as_str()).or(t.order_no))
        .bind::<Nullable<BigInt>, _>(t.order.map(|o| o.store_id))
        .bind::<Nullable<Text>, _>(t.provider_txn_id)
        .bind::<Nullable<BigInt>, _>(t.local_amount_cents)
        .bind::<Nullable<BigInt>, _>(t.provider_amount_cents)
        .bind::<Jsonb, _>(t.detail)
        .bind::<Text, _>(&t.finding_key)
        .bind::<Text, _>(trace.as_str())
        .get_result(conn)
        .await
        .optional()?;
    if let Some(ticket) = &opened {
        tracing::warn!(ticket = ticket.id, kind = %t.kind, order_no = ?ticket.order_no, "exception ticket opened");
        metrics::counter!("fitorder_tickets_opened_total", "kind" => t.kind.as_str()).increment(1);
        crate::events::announce(crate::events::Announced::Ticket, ticket.id)
            .execute(conn)
            .await?;
    }
    Ok(opened)
}

/// The one statement that writes tickets (`tickets/open.sql`), fed by `findings`: a query whose
/// rows are the findings (the columns `open.sql` names), set-based for any number of them. Both
/// [`open`] (one finding) and the reconciliation's finding statements (every difference of a
/// bill) open their tickets through it, so a ticket is opened once per finding key, and
/// announced, however it was found. The text is made once per `findings` and kept (the
/// statement cache keys on it).
pub fn opening(findings: &'static str) -> &'static str {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static MADE: OnceLock<Mutex<HashMap<&'static str, &'static str>>> = OnceLock::new();
    let mut made = MADE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    made.entry(findings).or_insert_with(|| {
        let sql = format!(
            "WITH findings AS (\n{}\n)\n{}",
            findings.trim_end(),
            include_str!("tickets/open.sql")
        );
        Box::leak(sql.into_boxed_str())
    })
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
    crate::events::announce(crate::events::Announced::TicketChanged, id)
        .execute(conn)
        .await?;
    Ok(())
}
