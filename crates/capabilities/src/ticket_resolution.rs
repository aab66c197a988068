//! Closing an exception ticket with an action, in one transaction with what the action does:
//! marking an order paid, refunding it or the stray money, replaying a DEAD outbox event. Above
//! `orders` and `compensation`, which it calls; [`crate::tickets`] keeps the tickets themselves.

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use crate::auth::Viewer;
use crate::config::Config;
use crate::db::models::ExceptionTicket;
use crate::domain::{CompensationKind, Ctx, OrderStatus, PaymentMethod, TicketAction, TicketKind};
use crate::error::{AppError, AppResult};
use crate::orders::{self, PaymentApplied};
use crate::outbox;
use crate::tickets;

/// Closes a ticket with an action, in one transaction with what the action does. Every action
/// goes through the state machine and the outbox like any other change: MARK_PAID and
/// CREDIT_SESSIONS apply the provider's payment to a waiting order (crediting its sessions);
/// REFUND refunds the order when the ticket is about its own payment, otherwise sends the stray
/// money back through a PROVIDER_REFUND event (once per provider transaction);
/// REPLAY_COMPENSATION replays a DEAD event; NO_ACTION dismisses.
///
/// `amount_cents` is REFUND's explicit amount; only a refund of the order's own payment takes
/// one (without it the refund is the unused share).
#[allow(clippy::too_many_arguments)]
pub async fn resolve(
    conn: &mut AsyncPgConnection,
    config: &Config,
    viewer: &Viewer,
    id: i64,
    action: TicketAction,
    note: Option<&str>,
    amount_cents: Option<i64>,
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
        let t = tickets::lock_unresolved(conn, id, viewer).await?;
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
                        callback_id: None,
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
                if own_payment(&t, &order) {
                    orders::refund_order(
                        conn,
                        config,
                        viewer,
                        &order.order_no,
                        &format!("ticket {}", t.id),
                        amount_cents,
                        ctx,
                    )
                    .await?;
                } else {
                    if amount_cents.is_some() {
                        return Err(AppError::bad(
                            "amountCents is for refunding the order's own payment; a stray payment goes back whole",
                        ));
                    }
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
                        .filter(crate::db::schema::compensation_events::kind.eq(CompensationKind::ProviderRefund))
                        .filter(
                            diesel::dsl::sql::<diesel::sql_types::Bool>("payload->>'providerTxnId' = ")
                                .bind::<diesel::sql_types::Text, _>(txn),
                        )
                        .count()
                        .get_result(conn)
                        .await?;
                    if claimed && already == 0 {
                        let refund = outbox::Effect::ProviderRefund(outbox::RefundPayload {
                            order: (&order).into(),
                            provider,
                            refund_no: format!("TK{}", t.id),
                            amount_cents: amount,
                            total_cents: amount,
                            provider_txn_id: Some(txn.to_string()),
                            reason: note
                                .as_deref()
                                .unwrap_or("refund of a payment that reached no order")
                                .to_string(),
                        });
                        outbox::enqueue(conn, Some(order.id), &[refund], &ctx.trace, config.max_attempts).await?;
                    }
                }
            }
        }
        tickets::close(conn, id, action, note.as_deref(), ctx).await
    })
    .await
}

/// The ticket is about the payment the order itself was paid with (and the order is live), so
/// REFUND refunds the order; otherwise REFUND sends back a payment that reached no live order.
fn own_payment(t: &ExceptionTicket, order: &crate::db::models::Order) -> bool {
    order.status.is_live() && t.provider_txn_id.is_some() && t.provider_txn_id == order.provider_txn_id
}

/// What [`resolve`] would do for this ticket now, asked by the ticket screen: the actions it
/// would take from this viewer (none once the ticket is closed), and what REFUND would send
/// back.
pub struct Offer {
    pub actions: Vec<TicketAction>,
    /// REFUND's amount without `amountCents`: the order's unused share for its own payment,
    /// the whole stray payment otherwise; `None` when REFUND is not offered.
    pub refund_cents: Option<i64>,
    /// REFUND takes an explicit amount (a refund of the order's own payment).
    pub refund_amount_adjustable: bool,
}

/// The same checks as [`resolve`], read-only: an action is offered only when `resolve` would
/// not refuse it as things stand.
pub async fn offer(
    conn: &mut AsyncPgConnection,
    viewer: &Viewer,
    t: &ExceptionTicket,
    tz: chrono_tz::Tz,
) -> AppResult<Offer> {
    use crate::db::schema::{compensation_events as ce, memberships};
    let mut out = Offer {
        actions: vec![],
        refund_cents: None,
        refund_amount_adjustable: false,
    };
    if t.status.is_closed() {
        return Ok(out);
    }
    let order = match t.order_id {
        Some(order_id) => Some(orders::load_order_by_id(conn, order_id).await?),
        None => None,
    };
    for action in TicketAction::ALL {
        if !crate::domain::order_status::may_resolve_ticket(action, viewer.actor().kind) {
            continue;
        }
        let ok = match action {
            TicketAction::NoAction => true,
            TicketAction::ReplayCompensation => {
                match t.detail["eventId"].as_str().and_then(|s| s.parse::<i64>().ok()) {
                    Some(event_id) if t.kind == TicketKind::CompensationDead => {
                        let status: Option<crate::domain::CompensationStatus> = ce::table
                            .find(event_id)
                            .select(ce::status)
                            .get_result(conn)
                            .await
                            .optional()?;
                        status == Some(crate::domain::CompensationStatus::Dead)
                    }
                    _ => false,
                }
            }
            TicketAction::MarkPaid => order.as_ref().is_some_and(|o| o.status == OrderStatus::WaitPay),
            // Paying the order credits its sessions: offered for orders that carry some.
            TicketAction::CreditSessions => order
                .as_ref()
                .is_some_and(|o| o.status == OrderStatus::WaitPay && o.sessions_total > 0),
            TicketAction::Refund => match &order {
                None => false,
                Some(o) if own_payment(t, o) => {
                    let membership: Option<crate::db::models::Membership> = memberships::table
                        .filter(memberships::order_id.eq(o.id))
                        .select(crate::db::models::Membership::as_select())
                        .get_result(conn)
                        .await
                        .optional()?;
                    let freezes = match &membership {
                        Some(m) => crate::memberships::freezes_of(conn, m.id).await?,
                        None => Vec::new(),
                    };
                    out.refund_cents = Some(orders::unused_share(o, membership.as_ref(), &freezes, tz));
                    out.refund_amount_adjustable = true;
                    true
                }
                Some(_) => match (t.provider, &t.provider_txn_id, t.provider_amount_cents) {
                    (Some(_), Some(_), Some(amount)) => {
                        out.refund_cents = Some(amount);
                        true
                    }
                    _ => false,
                },
            },
        };
        if ok {
            out.actions.push(action);
        }
    }
    Ok(out)
}
