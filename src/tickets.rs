//! Exception tickets: what the system could not settle by itself, handed to staff with the
//! whole story attached. Opened once per finding, however often the finding is made.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::db::models::{ExceptionTicket, Order};
use crate::db::schema::exception_tickets as et;
use crate::domain::{OrderStatus, PaymentMethod, Provider, TicketAction, TicketKind, TicketStatus};
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
        // Money that needs a person now: told in the same transaction as the ticket.
        if let Some(alert) = crate::alerts::Alert::ticket(ticket) {
            crate::alerts::raise(conn, alert).await?;
        }
    }
    Ok(opened)
}

use diesel_async::AsyncConnection;

use crate::auth::Viewer;
use crate::config::Config;
use crate::error::AppError;
use crate::orders::{self, Ctx, PaymentApplied};

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
    if t.store_id.is_some_and(|s| !viewer.sees_store(s)) {
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
            TicketStatus::Open => Ok(diesel::update(et::table.find(id))
                .set((
                    et::status.eq(TicketStatus::InProgress),
                    et::resolved_by.eq(ctx.actor.to_string()),
                    et::updated_at.eq(diesel::dsl::now),
                ))
                .returning(ExceptionTicket::as_returning())
                .get_result(conn)
                .await?),
            TicketStatus::Resolved | TicketStatus::Dismissed => Err(locked_ticket_error(&t)),
        }
    })
    .await
}

/// Closes a ticket with an action, in one transaction with what the action does. Every action
/// goes through the state machine and the outbox like any other change: MARK_PAID and
/// CREDIT_SESSIONS apply the provider's payment to a waiting order (crediting its sessions);
/// REFUND refunds the order when the ticket is about its own payment, otherwise sends the stray
/// money back through a PROVIDER_REFUND event (once per provider transaction);
/// REPLAY_COMPENSATION replays a DEAD event; NO_ACTION dismisses.
pub async fn resolve(
    conn: &mut AsyncPgConnection,
    config: &Config,
    viewer: &Viewer,
    id: i64,
    action: TicketAction,
    note: Option<&str>,
    ctx: &Ctx,
) -> AppResult<ExceptionTicket> {
    let note = note
        .map(|n| n.trim().chars().take(2000).collect::<String>())
        .filter(|n| !n.is_empty());
    // The one table of who may take which action (the state machine's transitions).
    if !crate::domain::order_status::may_resolve_ticket(action, viewer.actor().kind) {
        return Err(AppError::Forbidden(format!(
            "role {} may not resolve a ticket with {action}",
            viewer.role.as_str()
        )));
    }
    conn.transaction(async |conn| -> AppResult<ExceptionTicket> {
        let t = lock(conn, id, viewer).await?;
        if t.status.is_closed() {
            return Err(locked_ticket_error(&t));
        }
        let order = match t.order_id {
            Some(order_id) => Some(orders::load_order_by_id(conn, order_id).await?),
            None => None,
        };
        match action {
            TicketAction::NoAction => {}
            TicketAction::ReplayCompensation => {
                let event_id = t.detail["eventId"]
                    .as_str()
                    .and_then(|s| s.parse::<i64>().ok())
                    .filter(|_| t.kind == TicketKind::CompensationDead)
                    .ok_or_else(|| {
                        AppError::bad(format!("{action} is for {} tickets", TicketKind::CompensationDead))
                    })?;
                crate::compensation::replay(conn, event_id, ctx, config.max_attempts).await?;
            }
            TicketAction::MarkPaid | TicketAction::CreditSessions => {
                let order = order.ok_or_else(|| AppError::bad("this ticket has no order to mark paid"))?;
                let locked = orders::lock_order(conn, &order.order_no, Some(viewer)).await?;
                if locked.status != OrderStatus::WaitPay {
                    return Err(AppError::illegal(locked.status, OrderStatus::Paid));
                }
                let method = t
                    .provider
                    .or(locked.online_provider)
                    .map_or(PaymentMethod::Offline, PaymentMethod::from);
                let key = match &t.provider_txn_id {
                    Some(txn) => format!("{}:{txn}", locked.order_no),
                    None => format!("ticket:{}", t.id),
                };
                orders::apply_payment(
                    conn,
                    config,
                    &locked,
                    PaymentApplied {
                        method,
                        idempotency_key: key,
                        provider_txn_id: t.provider_txn_id.as_deref(),
                        reference: Some(&format!("ticket {}", t.id)),
                        online_cents: t.provider_amount_cents.unwrap_or(locked.online_cents()),
                    },
                    ctx,
                    &format!("marked paid from ticket {} ({})", t.id, t.kind),
                )
                .await?;
            }
            TicketAction::Refund => {
                let order = order.ok_or_else(|| {
                    AppError::bad(
                        "no order to refund through: refund at the provider by hand and resolve with NO_ACTION",
                    )
                })?;
                let own_payment =
                    order.status.is_live() && t.provider_txn_id.is_some() && t.provider_txn_id == order.provider_txn_id;
                if own_payment {
                    orders::refund_order(
                        conn,
                        config,
                        viewer,
                        &order.order_no,
                        &format!("ticket {}", t.id),
                        None,
                        ctx,
                    )
                    .await?;
                } else {
                    let (Some(provider), Some(txn), Some(amount)) =
                        (t.provider, t.provider_txn_id.as_deref(), t.provider_amount_cents)
                    else {
                        return Err(AppError::bad("this ticket names no provider payment to refund"));
                    };
                    // The transaction's one refund: claimed by key, so that concurrent
                    // resolutions of other tickets about the same payment wait here and then
                    // find it claimed (a check-then-insert would let each of them through).
                    use crate::db::schema::stray_payment_refunds as spr;
                    let claimed = diesel::insert_into(spr::table)
                        .values((
                            spr::provider.eq(provider),
                            spr::provider_txn_id.eq(txn),
                            spr::ticket_id.eq(t.id),
                        ))
                        .on_conflict_do_nothing()
                        .execute(conn)
                        .await?
                        == 1;
                    // A refund of the same transaction queued another way (paid after cancel).
                    let already: i64 = crate::db::schema::compensation_events::table
                        .filter(
                            crate::db::schema::compensation_events::kind
                                .eq(crate::compensation::CompensationKind::ProviderRefund.as_str()),
                        )
                        .filter(
                            diesel::dsl::sql::<diesel::sql_types::Bool>("payload->>'providerTxnId' = ")
                                .bind::<diesel::sql_types::Text, _>(txn),
                        )
                        .count()
                        .get_result(conn)
                        .await?;
                    if claimed && already == 0 {
                        crate::compensation::enqueue_provider_refund(
                            conn,
                            &order,
                            provider.as_str(),
                            &format!("TK{}", t.id),
                            amount,
                            amount,
                            Some(txn),
                            note.as_deref().unwrap_or("refund of a payment that reached no order"),
                            ctx,
                            config.max_attempts,
                        )
                        .await?;
                    }
                }
            }
        }
        Ok(diesel::update(et::table.find(id))
            .set((
                et::status.eq(action.closes_as()),
                et::resolution.eq(action),
                et::resolved_at.eq(diesel::dsl::now),
                et::resolved_by.eq(ctx.actor.to_string()),
                et::note.eq(note.clone()),
                et::updated_at.eq(diesel::dsl::now),
            ))
            .returning(ExceptionTicket::as_returning())
            .get_result(conn)
            .await?)
    })
    .await
}
