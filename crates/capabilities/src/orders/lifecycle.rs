//! Paying, canceling and refunding: each one transaction with its status change, money
//! movements, outbox rows and audit.

use chrono::Utc;
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use super::{lock_order, transition, Changes, Ctx};
use crate::auth::{Role, Viewer};
use crate::config::Config;
use crate::db::models::{Membership, MembershipFreeze, Order};
use crate::db::schema::{memberships, orders, payments, refunds};
use crate::db::sql::StaticQuery;
use crate::domain::{money, order_status, OrderStatus, PaymentMethod, Provider, Refusal, WalletMoveKind};
use crate::error::{AppError, AppResult, OnViolation, Violation};
use crate::events::OUTBOX_CHANNEL;
use crate::outbox::{self, Effect, RefundPayload};
use crate::wallet::{wallet_move, WalletMove};

/// A payment about to be applied to a waiting order.
#[derive(Debug, Clone)]
pub struct PaymentApplied<'a> {
    /// WALLET, OFFLINE, WECHAT_PAY, ALIPAY (MIXED orders are paid by their online provider).
    pub method: PaymentMethod,
    /// Unique forever: `out_trade_no:transaction_id` for providers, `wallet:`/`offline:` here.
    pub idempotency_key: String,
    pub provider_txn_id: Option<&'a str>,
    pub reference: Option<&'a str>,
    pub online_cents: i64,
    /// The provider's notification that brought the payment, if one did: its outcome
    /// (APPLIED) is written with the payment.
    pub callback_id: Option<i64>,
}

/// WAIT_PAY -> PAID with everything that comes with it, in the caller's transaction on an order
/// the caller has locked: the status change with its audit row, the payment row, the grant
/// events and the outcome of the callback that brought it, in one statement (`pay.sql`); then
/// the captured wallet part of a MIXED order and the membership a card opens (credits are the
/// live order's unused sessions).
pub async fn apply_payment(
    conn: &mut AsyncPgConnection,
    config: &Config,
    order: &Order,
    payment: PaymentApplied<'_>,
    ctx: &Ctx,
    reason: &str,
) -> AppResult<Order> {
    Ok(pay(conn, config, order, payment, ctx, reason, true).await?.0)
}

/// [`apply_payment`], whose announcements the caller sends after its transaction commits
/// ([`Announcements::send`]), for the payment path a provider's notification takes. A
/// transaction that notifies holds PostgreSQL's one notify-queue lock from just before its
/// commit until its WAL is flushed, so notifying commits are flushed one after another, never
/// together: at 16 concurrent payments that lock was where they waited (issue 29's B1). Sent
/// after the commit, in a statement that writes no WAL, they hold it for microseconds. The
/// price: a process killed between the commit and the send loses them; subscribers then
/// miss that change, and the outbox worker finds the grants on its next poll (≤ 5 s).
pub async fn apply_payment_announced_later(
    conn: &mut AsyncPgConnection,
    config: &Config,
    order: &Order,
    payment: PaymentApplied<'_>,
    ctx: &Ctx,
    reason: &str,
) -> AppResult<(Order, Announcements)> {
    pay(conn, config, order, payment, ctx, reason, false).await
}

/// What a payment applied with [`apply_payment_announced_later`] has still to announce.
#[derive(Debug, Default, Clone)]
pub struct Announcements {
    /// The audit row of the status change (`order:<id>`).
    pub transition: Option<i64>,
    /// The grant events written (`comp:<id>`, and the outbox's wake-up when there are any).
    pub events: Vec<i64>,
}

impl Announcements {
    /// Sends them in one autocommit statement (call it after the commit), through the one
    /// builder of notifications (`fitorder_announce`).
    pub async fn send(&self, conn: &mut AsyncPgConnection) -> AppResult<()> {
        use diesel::sql_types::{Array, BigInt, Nullable, Text};
        if self.transition.is_none() && self.events.is_empty() {
            return Ok(());
        }
        StaticQuery::new(
            "SELECT (SELECT count(fitorder_announce('order', $1)) WHERE $1 IS NOT NULL)
                  + (SELECT count(fitorder_announce('comp', e)) FROM unnest($2::bigint[]) AS e)
                  + (SELECT count(pg_notify($3, '')) WHERE cardinality($2::bigint[]) > 0) AS n",
        )
        .bind::<Nullable<BigInt>, _>(self.transition)
        .bind::<Array<BigInt>, _>(&self.events)
        .bind::<Text, _>(OUTBOX_CHANNEL)
        .execute(conn)
        .await?;
        Ok(())
    }
}

#[derive(diesel::QueryableByName)]
struct PaidRow {
    #[diesel(embed)]
    order: Order,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    audit_id: i64,
    #[diesel(sql_type = diesel::sql_types::Array<diesel::sql_types::BigInt>)]
    granted_ids: Vec<i64>,
}

async fn pay(
    conn: &mut AsyncPgConnection,
    config: &Config,
    order: &Order,
    payment: PaymentApplied<'_>,
    ctx: &Ctx,
    reason: &str,
    announce_on_commit: bool,
) -> AppResult<(Order, Announcements)> {
    use diesel::sql_types::{Array, BigInt, Bool, Integer, Jsonb, Nullable, Text};
    order_status::check(order.status, OrderStatus::Paid, ctx.actor.kind)?;
    let grants = outbox::encode(&outbox::grants(order));
    let paid: Option<PaidRow> = StaticQuery::new(include_str!("pay.sql"))
        .bind::<BigInt, _>(order.id) // $1
        .bind::<Text, _>(ctx.actor.to_string()) // $2
        .bind::<Text, _>(reason) // $3
        .bind::<Nullable<Text>, _>(payment.provider_txn_id) // $4
        .bind::<Text, _>(ctx.trace.as_str()) // $5
        .bind::<Text, _>(payment.method) // $6
        .bind::<Text, _>(&payment.idempotency_key) // $7
        .bind::<Nullable<Text>, _>(payment.reference) // $8
        .bind::<BigInt, _>(payment.online_cents) // $9
        .bind::<Array<Text>, _>(&grants.kinds) // $10
        .bind::<Array<Jsonb>, _>(&grants.payloads) // $11
        .bind::<Array<Text>, _>(&grants.keys) // $12
        .bind::<Integer, _>(config.max_attempts) // $13
        .bind::<Text, _>(OUTBOX_CHANNEL) // $14
        .bind::<Nullable<BigInt>, _>(payment.callback_id) // $15
        .bind::<Bool, _>(announce_on_commit) // $16
        .get_result(conn)
        .await
        .optional()
        .on_violation(|v| match v {
            Violation::Unique("payments_one_per_order" | "payments_idempotency_key") => {
                Some(AppError::Conflict("order already paid".into()))
            }
            _ => None,
        })?;
    let Some(PaidRow {
        order: paid,
        audit_id,
        granted_ids,
    }) = paid
    else {
        // Someone else changed it first (only possible when the caller did not lock the row).
        let now: OrderStatus = orders::table
            .find(order.id)
            .select(orders::status)
            .get_result(conn)
            .await?;
        return Err(AppError::illegal(now, OrderStatus::Paid));
    };
    metrics::counter!("fitorder_transitions_total", "from" => OrderStatus::WaitPay.as_str(), "to" => OrderStatus::Paid.as_str())
        .increment(1);
    if order.payment_method == PaymentMethod::Mixed && order.wallet_amount_cents > 0 {
        let w = order.wallet_amount_cents;
        wallet_move(
            conn,
            WalletMove {
                member_id: order.member_id,
                kind: WalletMoveKind::Capture,
                balance_delta: 0,
                frozen_delta: -w,
                order_id: Some(order.id),
                reference: None,
            },
            ctx,
        )
        .await?;
    }
    if let (Some(plan_id), Some(days)) = (order.membership_plan_id, order.plan_days) {
        crate::memberships::start(conn, &paid, plan_id, days, ctx).await?;
    }
    let later = if announce_on_commit {
        Announcements::default()
    } else {
        Announcements {
            transition: Some(audit_id),
            events: granted_ids,
        }
    };
    Ok((paid, later))
}

/// Staff confirm that an OFFLINE order was paid at the desk.
pub async fn confirm_offline_payment(
    conn: &mut AsyncPgConnection,
    config: &Config,
    viewer: &Viewer,
    order_no: &str,
    reference: &str,
    ctx: &Ctx,
) -> AppResult<Order> {
    viewer.require(&[Role::Admin])?;
    let reference = crate::error::required_text(reference, 128, "reference")?;
    conn.transaction(async |conn| -> AppResult<Order> {
        let order = lock_order(conn, order_no, Some(viewer)).await?;
        if order.payment_method != PaymentMethod::Offline {
            return Err(AppError::bad(format!(
                "only {} orders are confirmed at the desk",
                PaymentMethod::Offline
            )));
        }
        // A repeated confirmation with the same reference answers like the first.
        if order.status != OrderStatus::WaitPay {
            let same: Option<String> = payments::table
                .filter(payments::order_id.eq(order.id))
                .select(payments::reference)
                .get_result::<Option<String>>(conn)
                .await
                .optional()?
                .flatten();
            if same.as_deref() == Some(reference) {
                return Ok(order);
            }
            return Err(AppError::illegal(order.status, OrderStatus::Paid));
        }
        apply_payment(
            conn,
            config,
            &order,
            PaymentApplied {
                method: PaymentMethod::Offline,
                idempotency_key: format!("offline:{}", order.order_no),
                provider_txn_id: None,
                reference: Some(reference),
                online_cents: 0,
                callback_id: None,
            },
            ctx,
            &format!("paid at the desk, reference {reference}"),
        )
        .await
    })
    .await
}

/// WAIT_PAY -> CANCELED: the seat or stock unit goes back on sale and frozen wallet money is
/// unfrozen. Canceling an order that is already canceled answers with it unchanged (a double
/// tap), anything else is refused by the state machine.
pub async fn cancel_order(
    conn: &mut AsyncPgConnection,
    viewer: Option<&Viewer>,
    order_no: &str,
    cancel_reason: &str,
    ctx: &Ctx,
) -> AppResult<Order> {
    conn.transaction(async |conn| -> AppResult<Order> {
        let order = lock_order(conn, order_no, viewer).await?;
        if order.status == OrderStatus::Canceled {
            return Ok(order);
        }
        cancel_locked(conn, &order, cancel_reason, ctx).await
    })
    .await
}

/// Cancels an order the caller has locked: `transition.sql` puts its seat or stock unit back on
/// sale and unfreezes its frozen wallet money (expiry cancels its batches through
/// [`super::transition_all`], the same statement).
pub async fn cancel_locked(
    conn: &mut AsyncPgConnection,
    order: &Order,
    cancel_reason: &str,
    ctx: &Ctx,
) -> AppResult<Order> {
    let canceled = transition(
        conn,
        order,
        OrderStatus::Canceled,
        ctx,
        cancel_reason,
        Changes {
            cancel_reason: Some(cancel_reason),
            ..Default::default()
        },
    )
    .await?;
    Ok(canceled)
}

/// PAID or CONSUMING -> REFUNDED. Without an amount, the unused share is refunded; the wallet
/// part goes back at once, the online part through a PROVIDER_REFUND event; credits are taken
/// back (they are the live order's unused sessions), the membership is revoked, access revoked,
/// and the seat or stock unit goes back on sale.
pub async fn refund_order(
    conn: &mut AsyncPgConnection,
    config: &Config,
    viewer: &Viewer,
    order_no: &str,
    reason: &str,
    amount_cents: Option<i64>,
    ctx: &Ctx,
) -> AppResult<Order> {
    // Who may refund is the state machine's table (`refundOrder` itself is admin's; ops reach
    // here closing a ticket with REFUND).
    let refunders = order_status::actors_of(OrderStatus::Paid, OrderStatus::Refunded);
    if !refunders.contains(&viewer.actor().kind) {
        return Err(AppError::Forbidden(format!(
            "role {} may not refund",
            viewer.role.as_str()
        )));
    }
    // Members take their money back only in the cooling-off period ([`request_cooling_off_refund`]).
    if viewer.role == Role::Member {
        return Err(AppError::Forbidden("members may not refund".into()));
    }
    let reason = crate::error::required_text(reason, 500, "a refund's reason")?;
    conn.transaction(async |conn| -> AppResult<Order> {
        let order = lock_order(conn, order_no, Some(viewer)).await?;
        if order.status == OrderStatus::Refunded {
            return Ok(order);
        }
        refund_locked(conn, config, &order, reason, amount_cents, ctx).await
    })
    .await
}

/// Why a cooling-off refund is what it is (the order's audit row and the refund's reason).
pub const COOLING_OFF_REASON: &str = "cooling-off refund (七天冷静期): the whole amount back";

/// The member (their own order) or staff take back a prepaid order within its cooling-off
/// period (docs/prepaid-and-cards.md "Prepaid money"): nothing of it used, the whole amount back the way it came,
/// through [`refund_locked`] like any refund; the deadline of its money (`refundDueBy`) is the
/// sale's working days after today on the business calendar. A repeated request answers with
/// the order as the first left it.
pub async fn request_cooling_off_refund(
    conn: &mut AsyncPgConnection,
    config: &Config,
    viewer: &Viewer,
    order_no: &str,
    ctx: &Ctx,
) -> AppResult<Order> {
    use crate::db::schema::order_prepaid;
    viewer.require(&[Role::Member, Role::Admin])?;
    conn.transaction(async |conn| -> AppResult<Order> {
        let order = lock_order(conn, order_no, Some(viewer)).await?;
        let terms: Option<(i32, i32, Option<chrono::NaiveDate>)> = order_prepaid::table
            .find(order.id)
            .select((
                order_prepaid::cooling_off_days,
                order_prepaid::refund_within_working_days,
                order_prepaid::refund_due_by,
            ))
            .get_result(conn)
            .await
            .optional()?;
        let (days, working_days, due) = terms.unwrap_or((0, 5, None));
        if order.status == OrderStatus::Refunded && due.is_some() {
            return Ok(order);
        }
        let now = Utc::now();
        let Some(until) = cooling_off_until(&order, days, config.timezone) else {
            return match order.paid_at {
                None => Err(AppError::illegal(order.status, OrderStatus::Refunded)),
                Some(_) => Err(AppError::refused(
                    Refusal::CoolingOffEnded,
                    "this order has no cooling-off period (the store's rules give none, or it is no prepaid order)",
                )),
            };
        };
        match order.status {
            OrderStatus::Paid if order.sessions_used == 0 => {}
            OrderStatus::Paid | OrderStatus::Consuming | OrderStatus::Consumed => {
                return Err(AppError::refused(
                    Refusal::AlreadyUsed,
                    "part of this order was used: the cooling-off refund is for unused orders; staff refund the unused share",
                ))
            }
            other => return Err(AppError::illegal(other, OrderStatus::Refunded)),
        }
        if now >= until {
            return Err(AppError::refused(
                Refusal::CoolingOffEnded,
                format!("the cooling-off period ended at {}", until.with_timezone(&config.timezone).format("%Y-%m-%d %H:%M")),
            ));
        }
        let today = now.with_timezone(&config.timezone).date_naive();
        let due = crate::prepaid::calendar::deadline(conn, today, working_days).await?;
        diesel::update(order_prepaid::table.find(order.id))
            .set(order_prepaid::refund_due_by.eq(due))
            .execute(conn)
            .await?;
        refund_locked(conn, config, &order, COOLING_OFF_REASON, Some(order.amount_cents), ctx).await
    })
    .await
}

/// The end of an order's cooling-off period: the start of the date after the `days`-th day
/// after its payment date (business time zone). `None` when unpaid, no prepaid order or no days.
pub fn cooling_off_until(order: &Order, days: i32, tz: chrono_tz::Tz) -> Option<chrono::DateTime<Utc>> {
    use chrono::TimeZone;
    if !crate::domain::prepaid::is_prepaid(order.kind, order.sessions_total) {
        return None;
    }
    let paid = order.paid_at?.with_timezone(&tz).date_naive();
    let end = crate::domain::prepaid::cooling_off_ends(paid, days)?;
    tz.from_local_datetime(&end.and_hms_opt(0, 0, 0)?)
        .earliest()
        .map(|t| t.with_timezone(&Utc))
}

/// PAID or CONSUMING -> REFUNDED of an order the caller has locked: `amount_cents` (default:
/// the unused share) back the way it came, credits, card and access taken back. The one refund
/// path: staff's refunds, ticket actions and the cooling-off refund all come here.
async fn refund_locked(
    conn: &mut AsyncPgConnection,
    config: &Config,
    order: &Order,
    reason: &str,
    amount_cents: Option<i64>,
    ctx: &Ctx,
) -> AppResult<Order> {
    order_status::check(order.status, OrderStatus::Refunded, ctx.actor.kind)?;
    let membership: Option<Membership> = memberships::table
        .filter(memberships::order_id.eq(order.id))
        .select(Membership::as_select())
        .for_update()
        .get_result(conn)
        .await
        .optional()?;
    if membership.as_ref().is_some_and(|m| m.transferred_at.is_some()) {
        return Err(AppError::refused(
            Refusal::MembershipTransferred,
            "the card of this order was transferred: the order can no longer be refunded",
        ));
    }
    let freezes = match &membership {
        Some(m) => crate::memberships::freezes_of(conn, m.id).await?,
        None => Vec::new(),
    };
    let amount = match amount_cents {
        Some(a) if a < 0 || a > order.amount_cents => {
            return Err(AppError::bad(format!(
                "amountCents must be between 0 and {} (what was paid)",
                order.amount_cents
            )))
        }
        Some(a) => a,
        None => unused_share(order, membership.as_ref(), &freezes, config.timezone),
    };
    let (wallet_back, online_back) = match order.payment_method {
        PaymentMethod::Wallet => (amount, 0),
        PaymentMethod::Mixed => money::split_refund(amount, order.amount_cents, order.wallet_amount_cents),
        PaymentMethod::WechatPay | PaymentMethod::Alipay => (0, amount),
        // Paid at the desk, refunded at the desk: recorded, no money moves here.
        PaymentMethod::Offline => (0, 0),
    };
    let refunded = transition(
        conn,
        order,
        OrderStatus::Refunded,
        ctx,
        reason,
        Changes {
            refund_amount_cents: Some(amount),
            wallet_refund_cents: wallet_back,
            ..Default::default()
        },
    )
    .await?;
    let refund_id: i64 = diesel::insert_into(refunds::table)
        .values((
            refunds::order_id.eq(order.id),
            refunds::amount_cents.eq(amount),
            refunds::wallet_cents.eq(wallet_back),
            refunds::online_cents.eq(online_back),
            refunds::reason.eq(reason),
            refunds::actor.eq(ctx.actor.to_string()),
            refunds::trace_id.eq(ctx.trace.as_str()),
        ))
        .returning(refunds::id)
        .get_result(conn)
        .await
        .on_violation(|v| match v {
            Violation::Unique("refunds_one_per_order") => Some(AppError::Conflict("order already refunded".into())),
            _ => None,
        })?;
    if online_back > 0 {
        let provider = order.online_provider.unwrap_or(Provider::WechatPay);
        let refund = Effect::ProviderRefund(RefundPayload {
            order: (&refunded).into(),
            provider,
            refund_no: format!("RF{}", refund_id),
            amount_cents: online_back,
            total_cents: order.online_cents(),
            provider_txn_id: order.provider_txn_id.clone(),
            reason: reason.to_string(),
        });
        outbox::enqueue(conn, Some(refunded.id), &[refund], &ctx.trace, config.max_attempts).await?;
    }
    if membership.is_some() {
        crate::memberships::revoke_for_order(conn, order.id, config.timezone, reason, ctx).await?;
    }
    outbox::enqueue(
        conn,
        Some(refunded.id),
        &outbox::revokes(&refunded),
        &ctx.trace,
        config.max_attempts,
    )
    .await?;
    Ok(refunded)
}

/// The unused share of what was paid: sessions left of the total, or for a membership the
/// whole days left of the plan without its frozen ones (a started day counts as used; a card
/// that has not started yet is wholly unused).
pub fn unused_share(
    order: &Order,
    membership: Option<&Membership>,
    freezes: &[MembershipFreeze],
    tz: chrono_tz::Tz,
) -> i64 {
    match (order.plan_days, membership) {
        (Some(days), Some(m)) => {
            let unused_days = crate::memberships::unused_days(m, days, freezes, Utc::now(), tz);
            money::pro_rata(order.amount_cents, unused_days, i64::from(days))
        }
        (Some(_), None) => order.amount_cents,
        _ => money::pro_rata(
            order.amount_cents,
            i64::from(order.sessions_total - order.sessions_used),
            i64::from(order.sessions_total),
        ),
    }
}

/// An order booked on a coach's session that was canceled (`cancelCoachSlot`), settled in its
/// own transaction under its row lock, through the state machine: a waiting order is canceled
/// (its seat back, its frozen wallet money unfrozen), a paid one refunded whole (the wallet part
/// at once, the online part through a PROVIDER_REFUND event: [`refund_locked`], the one refund
/// path), one in use refunded its unused share; a consumed, canceled or refunded order is left
/// as it is. Asked again, it finds the order settled and changes nothing, so a settling resumed
/// after a crash, or run twice at once, settles each order once.
pub async fn settle_canceled_booking(
    conn: &mut AsyncPgConnection,
    config: &Config,
    order_id: i64,
    reason: &str,
    ctx: &Ctx,
) -> AppResult<Order> {
    conn.transaction(async |conn| -> AppResult<Order> {
        let order: Order = orders::table
            .find(order_id)
            .select(Order::as_select())
            .for_update()
            .get_result(conn)
            .await?;
        match order.status {
            OrderStatus::WaitPay => cancel_locked(conn, &order, reason, ctx).await,
            OrderStatus::Paid => refund_locked(conn, config, &order, reason, Some(order.amount_cents), ctx).await,
            OrderStatus::Consuming => refund_locked(conn, config, &order, reason, None, ctx).await,
            OrderStatus::Consumed | OrderStatus::Canceled | OrderStatus::Refunded => Ok(order),
        }
    })
    .await
}
