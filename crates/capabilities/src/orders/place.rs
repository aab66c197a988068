//! Placing an order: idempotent by the member's key, reserving the seat or stock unit and the
//! wallet money atomically with the order row.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use sha2::{Digest, Sha256};

use super::{lifecycle, record_birth, Ctx, PaymentApplied};
use crate::auth::{Role, Viewer};
use crate::config::Config;
use crate::db::models::{ClassPack, CoachSlot, Member, MembershipPlan, Order};
use crate::db::schema::{class_packs, coach_slots, members, membership_plans, order_prepaid, orders};
use crate::domain::{OrderKind, OrderStatus, PaymentMethod, Provider, Refusal, WalletMoveKind};
use crate::error::{AppError, AppResult, OnViolation, Violation};
use crate::wallet::{wallet_move, WalletMove};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlacedItem {
    MembershipPlan(i64),
    ClassPack(i64),
    CoachSlot(i64),
}

#[derive(Debug, Clone)]
pub struct PlaceOrder {
    pub idempotency_key: String,
    pub store_id: i64,
    pub item: PlacedItem,
    pub payment_method: PaymentMethod,
    pub wallet_amount_cents: Option<i64>,
    pub member_id: Option<i64>,
    /// The online provider of a MIXED order (WECHAT_PAY unless the client says otherwise).
    pub online_provider: Option<Provider>,
    /// The version of the store's terms the member accepted (a prepaid order of a store that
    /// asks for terms needs the current one).
    pub accepted_terms_version: Option<String>,
}

struct Priced {
    kind: OrderKind,
    name: String,
    amount: i64,
    sessions: i32,
    plan_days: Option<i32>,
    /// A class pack without a stock: placing it takes nothing, so it locks no row.
    unlimited: bool,
}

impl PlaceOrder {
    /// What the key stands for: the same key with another request is refused, not served
    /// with the first request's order.
    fn request_hash(&self, member_id: i64) -> String {
        let canon = format!(
            "{}|{}|{:?}|{}|{:?}|{:?}",
            member_id,
            self.store_id,
            self.item,
            self.payment_method,
            self.wallet_amount_cents,
            self.online_provider.map(Provider::as_str)
        );
        hex::encode(Sha256::digest(canon.as_bytes()))
    }
}

/// Counts a member's placement against the per-member rate (`FITORDER_PLACE_RATE` a minute):
/// over it, BAD_USER_INPUT with `extensions.reason` `RATE_LIMITED`. Staff at the desk are not
/// limited (they are few, and answerable for what they place).
pub fn check_place_rate(limiter: &crate::ratelimit::RateLimiter, viewer: &Viewer) -> AppResult<()> {
    let (Role::Member, Some(member)) = (viewer.role, viewer.member_id) else {
        return Ok(());
    };
    limiter
        .check(&member.to_string())
        .map_err(|wait| AppError::rate_limited("orders placed in a short time", wait))
}

/// Places an order, or returns the order already placed with this key.
pub async fn place_order(
    conn: &mut AsyncPgConnection,
    config: &Config,
    viewer: &Viewer,
    req: PlaceOrder,
    ctx: &Ctx,
) -> AppResult<Order> {
    let member_id = match viewer.role {
        Role::Member => {
            let own = viewer.member_id.expect("member tokens carry a member id");
            if req.member_id.is_some_and(|m| m != own) {
                return Err(AppError::Forbidden("members place orders for themselves only".into()));
            }
            own
        }
        Role::Admin => req
            .member_id
            .ok_or_else(|| AppError::bad("memberId is required when staff place an order"))?,
        Role::Ops => return Err(AppError::Forbidden("ops may not place orders".into())),
    };
    viewer.require_store(req.store_id)?;
    let key = crate::error::required_text(&req.idempotency_key, 128, "idempotencyKey")?.to_string();
    let method = req.payment_method;
    let online_provider = match method {
        PaymentMethod::Mixed => Some(req.online_provider.unwrap_or(Provider::WechatPay)),
        m => m.provider(),
    };
    if method != PaymentMethod::Mixed && req.wallet_amount_cents.is_some_and(|w| w != 0) {
        return Err(AppError::bad("walletAmountCents is for MIXED orders only"));
    }
    let hash = req.request_hash(member_id);

    // The common retry: the order exists already. Answer as the first time did.
    if let Some(existing) = find_by_key(conn, member_id, &key).await? {
        return same_request(existing, &hash);
    }

    let placed = conn
        .transaction(async |conn| -> AppResult<Option<Order>> {
            // The member's row is locked for the placement: placements of one member take
            // turns, so the open-order count below cannot be passed by two at once (NO KEY
            // UPDATE: the order's and ledger's foreign keys still take their share locks).
            let member: Option<Member> = members::table
                .find(member_id)
                .select(Member::as_select())
                .for_no_key_update()
                .get_result(conn)
                .await
                .optional()?;
            // A store-limited admin may place orders only for members of their stores (another
            // store's member is answered as missing, as `member(id)` answers it).
            if !member.as_ref().is_some_and(|m| viewer.sees_store(m.store_id)) {
                return Err(AppError::NotFound(format!("member {member_id}")));
            }
            // A placement with this key that committed while we waited for the lock: answered
            // below as the first one was, not counted against the cap.
            if find_by_key(conn, member_id, &key).await?.is_some() {
                return Ok(None);
            }
            check_open_orders(conn, config, member_id).await?;
            let now = Utc::now();
            let priced = price_item(conn, req.store_id, &req.item, now).await?;
            let prepaid = crate::domain::prepaid::is_prepaid(priced.kind, priced.sessions);
            // The store's rules and what the member holds under them, in one read; the
            // member's row lock above serializes their placements and top-ups, so two orders
            // placed at once never pass a total together.
            let (store, held) =
                crate::prepaid::rules_and_holdings(conn, req.store_id, member_id, prepaid, config.timezone).await?;
            if prepaid {
                crate::prepaid::check_terms(&store.rules, req.accepted_terms_version.as_deref())?;
            }
            let wallet_part = match method {
                PaymentMethod::Wallet => priced.amount,
                PaymentMethod::Mixed => {
                    let w = req
                        .wallet_amount_cents
                        .ok_or_else(|| AppError::bad("MIXED orders need walletAmountCents"))?;
                    if w <= 0 || w >= priced.amount {
                        return Err(AppError::bad(format!(
                            "walletAmountCents must be between 1 and {} for this item",
                            priced.amount - 1
                        )));
                    }
                    w
                }
                _ => 0,
            };
            crate::prepaid::check_held(
                &store,
                held.as_ref(),
                crate::domain::prepaid::Adding::Order {
                    kind: priced.kind,
                    amount_cents: priced.amount,
                    plan_days: priced.plan_days.unwrap_or(0),
                    sessions: priced.sessions,
                    wallet_cents: wallet_part,
                },
            )?;
            let (cooling_off_days, terms) = if prepaid {
                (
                    store.rules.cooling_off_days,
                    store
                        .rules
                        .terms_version
                        .as_ref()
                        .and(req.accepted_terms_version.as_deref()),
                )
            } else {
                (0, None)
            };
            let expires_at = expiry_of(config, viewer, method, online_provider.is_some(), now);
            let (plan, pack, slot) = match req.item {
                PlacedItem::MembershipPlan(id) => (Some(id), None, None),
                PlacedItem::ClassPack(id) => (None, Some(id), None),
                PlacedItem::CoachSlot(id) => (None, None, Some(id)),
            };
            let inserted: Option<Order> = diesel::insert_into(orders::table)
                .values((
                    orders::member_id.eq(member_id),
                    orders::store_id.eq(req.store_id),
                    orders::kind.eq(priced.kind),
                    // The status is the column's default, WAIT_PAY (the trigger allows no other
                    // birth): only `transition.sql` (and `pay.sql`) write it.
                    orders::item_name.eq(&priced.name),
                    orders::membership_plan_id.eq(plan),
                    orders::class_pack_id.eq(pack),
                    orders::coach_slot_id.eq(slot),
                    orders::plan_days.eq(priced.plan_days),
                    orders::amount_cents.eq(priced.amount),
                    orders::wallet_amount_cents.eq(wallet_part),
                    orders::payment_method.eq(method),
                    orders::online_provider.eq(online_provider),
                    orders::sessions_total.eq(priced.sessions),
                    orders::expires_at.eq(expires_at),
                    orders::trace_id.eq(ctx.trace.as_str()),
                    orders::idempotency_key.eq(&key),
                    orders::request_hash.eq(&hash),
                ))
                .on_conflict_do_nothing()
                .returning(Order::as_returning())
                .get_result(conn)
                .await
                .optional()?;
            // A concurrent request with the same key won; we answer with its order below.
            let Some(inserted) = inserted else {
                return Ok(None);
            };
            let order = record_birth(conn, &inserted, ctx).await?;
            // What the sale keeps of the store's rules (a store without cooling-off or terms
            // writes nothing).
            if cooling_off_days > 0 || terms.is_some() {
                diesel::insert_into(order_prepaid::table)
                    .values((
                        order_prepaid::order_id.eq(order.id),
                        order_prepaid::accepted_terms_version.eq(terms.map(str::trim)),
                        order_prepaid::cooling_off_days.eq(cooling_off_days),
                        order_prepaid::refund_within_working_days.eq(store.rules.refund_within_working_days),
                    ))
                    .execute(conn)
                    .await?;
            }
            if !priced.unlimited {
                reserve_item(conn, &order).await?;
            }
            if order.expires_at.is_some() {
                // Wakes the expiry timers of every instance for the new deadline.
                crate::events::wake_expiry().execute(conn).await?;
            }
            match method {
                PaymentMethod::Wallet => {
                    wallet_move(
                        conn,
                        WalletMove {
                            member_id,
                            kind: WalletMoveKind::Pay,
                            balance_delta: -priced.amount,
                            frozen_delta: 0,
                            order_id: Some(order.id),
                            reference: None,
                        },
                        ctx,
                    )
                    .await?;
                    let paid = lifecycle::apply_payment(
                        conn,
                        config,
                        &order,
                        PaymentApplied {
                            method: PaymentMethod::Wallet,
                            idempotency_key: format!("wallet:{}", order.order_no),
                            provider_txn_id: None,
                            reference: None,
                            online_cents: 0,
                            callback_id: None,
                        },
                        ctx,
                        "paid from the wallet",
                    )
                    .await?;
                    Ok(Some(paid))
                }
                PaymentMethod::Mixed => {
                    wallet_move(
                        conn,
                        WalletMove {
                            member_id,
                            kind: WalletMoveKind::Freeze,
                            balance_delta: -wallet_part,
                            frozen_delta: wallet_part,
                            order_id: Some(order.id),
                            reference: None,
                        },
                        ctx,
                    )
                    .await?;
                    Ok(Some(order))
                }
                _ => Ok(Some(order)),
            }
        })
        .await?;
    match placed {
        Some(order) => {
            metrics::counter!("fitorder_orders_placed_total", "method" => method.as_str()).increment(1);
            Ok(order)
        }
        None => {
            let existing = find_by_key(conn, member_id, &key)
                .await?
                .ok_or_else(|| AppError::Conflict("the order with this key was rolled back; retry".into()))?;
            same_request(existing, &hash)
        }
    }
}

/// When an order placed now expires: an online one after the order timeout, an OFFLINE one a
/// member placed after the offline timeout (so an unconfirmed desk payment does not hold a seat
/// for ever); WALLET orders and OFFLINE orders staff placed never.
fn expiry_of(
    config: &Config,
    viewer: &Viewer,
    method: PaymentMethod,
    online: bool,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let after = |d: std::time::Duration| now + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX);
    if online {
        Some(after(config.order_timeout))
    } else if method == PaymentMethod::Offline && viewer.role == Role::Member {
        Some(after(config.offline_order_timeout))
    } else {
        None
    }
}

/// Refuses one more WAIT_PAY order for a member who holds `max_open_orders` already, whoever
/// places it (the member or the desk). The caller holds the member's row lock.
async fn check_open_orders(conn: &mut AsyncPgConnection, config: &Config, member_id: i64) -> AppResult<()> {
    let open: i64 = orders::table
        .filter(orders::member_id.eq(member_id))
        .filter(orders::status.eq(OrderStatus::WaitPay))
        .count()
        .get_result(conn)
        .await?;
    if open >= config.max_open_orders {
        return Err(AppError::refused(
            Refusal::TooManyOpenOrders,
            format!(
                "this member already has {open} unpaid orders (at most {}): pay or cancel one first",
                config.max_open_orders
            ),
        ));
    }
    Ok(())
}

fn same_request(existing: Order, hash: &str) -> AppResult<Order> {
    if existing.request_hash == hash {
        Ok(existing)
    } else {
        Err(AppError::Conflict(format!(
            "idempotencyKey was already used for order {} with a different request",
            existing.order_no
        )))
    }
}

async fn find_by_key(conn: &mut AsyncPgConnection, member_id: i64, key: &str) -> AppResult<Option<Order>> {
    Ok(orders::table
        .filter(orders::member_id.eq(member_id))
        .filter(orders::idempotency_key.eq(key))
        .select(Order::as_select())
        .get_result(conn)
        .await
        .optional()?)
}

async fn price_item(
    conn: &mut AsyncPgConnection,
    store_id: i64,
    item: &PlacedItem,
    now: DateTime<Utc>,
) -> AppResult<Priced> {
    let wrong_store = || AppError::bad("the item is not sold by this store");
    let retired = |what: &str, id: i64| {
        AppError::refused(
            crate::domain::Refusal::Retired,
            format!("{what} {id} is retired: it is sold no more"),
        )
    };
    Ok(match *item {
        PlacedItem::MembershipPlan(id) => {
            let p: MembershipPlan = membership_plans::table
                .find(id)
                .select(MembershipPlan::as_select())
                .get_result(conn)
                .await
                .optional()?
                .ok_or_else(|| AppError::NotFound(format!("membership plan {id}")))?;
            if p.store_id != store_id {
                return Err(wrong_store());
            }
            if p.retired_at.is_some() {
                return Err(retired("membership plan", id));
            }
            Priced {
                kind: OrderKind::Membership,
                name: p.name,
                amount: p.price_cents,
                sessions: 0,
                plan_days: Some(p.duration_days),
                unlimited: false,
            }
        }
        PlacedItem::ClassPack(id) => {
            let p: ClassPack = class_packs::table
                .find(id)
                .select(ClassPack::as_select())
                .get_result(conn)
                .await
                .optional()?
                .ok_or_else(|| AppError::NotFound(format!("class pack {id}")))?;
            if p.store_id != store_id {
                return Err(wrong_store());
            }
            if p.retired_at.is_some() {
                return Err(retired("class pack", id));
            }
            Priced {
                kind: OrderKind::ClassPack,
                name: p.name,
                amount: p.price_cents,
                sessions: p.sessions,
                plan_days: None,
                unlimited: p.stock.is_none(),
            }
        }
        PlacedItem::CoachSlot(id) => {
            let s: CoachSlot = coach_slots::table
                .find(id)
                .select(CoachSlot::as_select())
                .get_result(conn)
                .await
                .optional()?
                .ok_or_else(|| AppError::NotFound(format!("coach slot {id}")))?;
            if s.store_id != store_id {
                return Err(wrong_store());
            }
            if s.canceled_at.is_some() {
                return Err(AppError::refused(
                    Refusal::SlotCanceled,
                    "this coach's session was canceled",
                ));
            }
            if s.starts_at <= now {
                return Err(AppError::bad("this coach slot has already started"));
            }
            Priced {
                kind: OrderKind::PrivateSession,
                name: format!("{} · {}", s.coach_name, s.starts_at.format("%Y-%m-%d %H:%M UTC")),
                amount: s.price_cents,
                sessions: 1,
                plan_days: None,
                unlimited: false,
            }
        }
    })
}

/// Takes the seat or stock unit, only while one is left; concurrent buyers serialize on the
/// item's row lock (a class pack read without a stock is not asked: nothing to take). The row's CHECK constraint would refuse going below zero all the same,
/// which the client is told as SOLD_OUT too.
async fn reserve_item(conn: &mut AsyncPgConnection, order: &Order) -> AppResult<()> {
    let sold_out = |v: Violation<'_>| match v {
        Violation::Check("coach_slot_seats_in_range" | "class_pack_stock_not_negative") => {
            Some(AppError::SoldOut("sold out".into()))
        }
        _ => None,
    };
    if let Some(slot) = order.coach_slot_id {
        // A slot canceled meanwhile (`cancelCoachSlot` marks it under the same row lock) takes
        // no booking: the UPDATE re-reads the row it waited for.
        let taken = diesel::update(
            coach_slots::table
                .find(slot)
                .filter(coach_slots::remaining.gt(0))
                .filter(coach_slots::canceled_at.is_null()),
        )
        .set(coach_slots::remaining.eq(coach_slots::remaining - 1))
        .execute(conn)
        .await
        .on_violation(sold_out)?;
        if taken == 0 {
            let canceled: Option<chrono::DateTime<chrono::Utc>> = coach_slots::table
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
            return Err(AppError::SoldOut("no seats left in this coach slot".into()));
        }
    }
    if let Some(pack) = order.class_pack_id {
        let taken = diesel::update(
            class_packs::table
                .find(pack)
                .filter(class_packs::stock.is_null().or(class_packs::stock.gt(0))),
        )
        .set(class_packs::stock.eq(class_packs::stock - 1))
        .execute(conn)
        .await
        .on_violation(sold_out)?;
        if taken == 0 {
            return Err(AppError::SoldOut("this class pack is sold out".into()));
        }
    }
    Ok(())
}
