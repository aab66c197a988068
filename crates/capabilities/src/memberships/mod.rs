//! Membership cards (docs/prepaid-and-cards.md "Freezing and transferring cards (停卡, 转卡)"): their birth when their order
//! is paid, freezing, unfreezing, transferring, expiring and revoking. The state machine is
//! `domain::membership` (who may ask for which change); every change of a card's status, dates,
//! holder and history is written by one statement, `change.sql`, run only by [`change`] (its
//! birth by `start.sql`, [`start`]); `tests/it/state_machine.rs` fails on any other writer.
//! Door and AI-device access follow the card through the outbox, each grant or revoke with a
//! key of its own. The scheduler's part (freezes starting and ending on time, cards expiring)
//! is [`tick`].

pub mod tick;

use chrono::{DateTime, NaiveDate, TimeZone, Utc};
use chrono_tz::Tz;
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use crate::auth::{Role, Viewer};
use crate::config::Config;
use crate::db::models::{Member, Membership, MembershipFreeze, MembershipPlan, Order};
use crate::db::schema::{members, membership_freezes, membership_plans, memberships, orders, stores};
use crate::db::sql::StaticQuery;
use crate::domain::membership::{self as rules, FreezeCheck, FreezeRefusal, FreezeSpan};
use crate::domain::{Ctx, FreezeState, MembershipEventKind, MembershipStatus, Refusal, TraceId, WalletMoveKind};
use crate::error::{AppError, AppResult, OnViolation, Transition, Violation};
use crate::outbox::{self, AccessAction};

/// One change of a card for [`change`]: from the status seen to the new one (the same for a
/// transfer or a scheduled freeze), its dates moved, its holder, and its history row.
#[derive(Debug, Clone)]
pub struct Change {
    pub id: i64,
    pub from: MembershipStatus,
    pub to: MembershipStatus,
    /// Days `valid_to` moves (negative: back).
    pub shift_days: i32,
    /// Days added to `frozen_days` (negative: given back).
    pub frozen_delta: i32,
    pub to_member: Option<i64>,
    pub kind: MembershipEventKind,
    pub reason: Option<String>,
    pub summary: String,
}

/// Writes `changes` (one statement, `change.sql`) after asking the state machine for each;
/// returns the ids of the cards changed (one whose status moved on meanwhile is left out).
pub async fn change(
    conn: &mut AsyncPgConnection,
    changes: &[Change],
    actor: &crate::domain::Actor,
    trace: &TraceId,
) -> AppResult<Vec<i64>> {
    use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text};
    #[derive(diesel::QueryableByName)]
    struct Changed {
        #[diesel(sql_type = BigInt)]
        id: i64,
    }
    if changes.is_empty() {
        return Ok(Vec::new());
    }
    for c in changes {
        rules::check(c.from, c.to, actor.kind).map_err(|e| match e {
            rules::MembershipTransitionError::Illegal { from, to } => {
                AppError::IllegalTransition(Transition::Membership { from, to })
            }
            other => AppError::Forbidden(other.to_string()),
        })?;
    }
    let ids: Vec<i64> = changes.iter().map(|c| c.id).collect();
    let from: Vec<&str> = changes.iter().map(|c| c.from.as_str()).collect();
    let to: Vec<&str> = changes.iter().map(|c| c.to.as_str()).collect();
    let shift: Vec<i32> = changes.iter().map(|c| c.shift_days).collect();
    let frozen: Vec<i32> = changes.iter().map(|c| c.frozen_delta).collect();
    let to_member: Vec<Option<i64>> = changes.iter().map(|c| c.to_member).collect();
    let kinds: Vec<&str> = changes.iter().map(|c| c.kind.as_str()).collect();
    let reasons: Vec<Option<&str>> = changes.iter().map(|c| c.reason.as_deref()).collect();
    let summaries: Vec<&str> = changes.iter().map(|c| c.summary.as_str()).collect();
    let rows: Vec<Changed> = StaticQuery::new(include_str!("change.sql"))
        .bind::<Array<BigInt>, _>(&ids)
        .bind::<Array<Text>, _>(&from)
        .bind::<Array<Text>, _>(&to)
        .bind::<Array<Integer>, _>(&shift)
        .bind::<Array<Integer>, _>(&frozen)
        .bind::<Array<Nullable<BigInt>>, _>(&to_member)
        .bind::<Array<Text>, _>(&kinds)
        .bind::<Array<Nullable<Text>>, _>(&reasons)
        .bind::<Array<Text>, _>(&summaries)
        .bind::<Text, _>(actor.to_string())
        .bind::<Text, _>(trace.as_str())
        .load(conn)
        .await?;
    Ok(rows.into_iter().map(|r| r.id).collect())
}

/// A paid card order's card: it starts now, or when the member's current card of this store
/// ends, so that renewing early loses no days. Its history starts with it.
pub async fn start(conn: &mut AsyncPgConnection, order: &Order, plan_id: i64, days: i32, ctx: &Ctx) -> AppResult<i64> {
    use diesel::sql_types::{BigInt, Text, Timestamptz};
    #[derive(diesel::QueryableByName)]
    struct Started {
        #[diesel(sql_type = BigInt)]
        id: i64,
    }
    let now = Utc::now();
    let current_end: Option<DateTime<Utc>> = memberships::table
        .filter(memberships::member_id.eq(order.member_id))
        .filter(memberships::store_id.eq(order.store_id))
        .filter(memberships::status.eq_any([MembershipStatus::Active, MembershipStatus::Frozen]))
        .filter(memberships::valid_to.gt(now))
        .select(diesel::dsl::max(memberships::valid_to))
        .get_result(conn)
        .await?;
    let from = current_end.unwrap_or(now).max(now);
    let to = from + chrono::Duration::days(i64::from(days));
    let summary = format!("started: {days} days of {}", order.item_name);
    let row: Started = StaticQuery::new(include_str!("start.sql"))
        .bind::<BigInt, _>(order.member_id)
        .bind::<BigInt, _>(order.store_id)
        .bind::<BigInt, _>(plan_id)
        .bind::<BigInt, _>(order.id)
        .bind::<Timestamptz, _>(from)
        .bind::<Timestamptz, _>(to)
        .bind::<Text, _>(ctx.actor.to_string())
        .bind::<Text, _>(&summary)
        .bind::<Text, _>(ctx.trace.as_str())
        .get_result(conn)
        .await?;
    Ok(row.id)
}

/// The first instant of `day` in the business time zone.
pub fn start_of(day: NaiveDate, tz: Tz) -> DateTime<Utc> {
    tz.from_local_datetime(&day.and_hms_opt(0, 0, 0).expect("midnight exists"))
        .earliest()
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|| Utc.from_utc_datetime(&day.and_hms_opt(0, 0, 0).expect("midnight exists")))
}

/// The card's days: its first (valid_from's date) and its first no longer valid (valid_to's
/// date, the day after when valid_to is past midnight: a started day is the card's).
pub fn days_of(m: &Membership, tz: Tz) -> (NaiveDate, NaiveDate) {
    let first = m.valid_from.with_timezone(&tz).date_naive();
    let end_local = m.valid_to.with_timezone(&tz);
    let end = if end_local.time() == chrono::NaiveTime::MIN {
        end_local.date_naive()
    } else {
        end_local.date_naive() + chrono::Duration::days(1)
    };
    (first, end)
}

fn span(f: &MembershipFreeze) -> FreezeSpan {
    FreezeSpan {
        from: f.from_date,
        until: f.until_date,
    }
}

/// A card's freezes, oldest first.
pub async fn freezes_of(conn: &mut AsyncPgConnection, membership_id: i64) -> AppResult<Vec<MembershipFreeze>> {
    Ok(membership_freezes::table
        .filter(membership_freezes::membership_id.eq(membership_id))
        .order((membership_freezes::from_date, membership_freezes::id))
        .select(MembershipFreeze::as_select())
        .load(conn)
        .await?)
}

/// The whole days of a card not used yet, without the frozen ones: what a refund pays back
/// for (a card not started is unused whole; a started day counts as used; a running freeze's
/// days after today are not the card's to use).
pub fn unused_days(m: &Membership, plan_days: i32, freezes: &[MembershipFreeze], now: DateTime<Utc>, tz: Tz) -> i64 {
    if m.valid_from >= now {
        return i64::from(plan_days);
    }
    let left = (m.valid_to - now).num_seconds().max(0) / 86_400;
    let today = now.with_timezone(&tz).date_naive();
    let tomorrow = today + chrono::Duration::days(1);
    let frozen_ahead: i64 = freezes
        .iter()
        .filter(|f| f.state == FreezeState::Running)
        // The running freeze's days still ahead: from tomorrow, or from its first day when that
        // is later (never in real time, but the holdings count it so: `prepaid_holdings`).
        .map(|f| (f.until_date - f.from_date.max(tomorrow)).num_days().max(0))
        .sum();
    (left - frozen_ahead).clamp(0, i64::from(plan_days))
}

/// Locks a card for a change and checks the caller may make it: a member their own card
/// (another's is answered as missing), staff a card of their stores. Its order is locked first,
/// as a check-in and a refund lock it before the card: the change's outbox rows (whose foreign
/// key shares the order's row) then never wait for a check-in that waits for the card.
async fn lock_card(conn: &mut AsyncPgConnection, viewer: &Viewer, id: i64) -> AppResult<Membership> {
    let missing = || AppError::NotFound(format!("membership {id}"));
    let order_id: i64 = memberships::table
        .find(id)
        .select(memberships::order_id)
        .get_result(conn)
        .await
        .optional()?
        .ok_or_else(missing)?;
    orders::table
        .find(order_id)
        .select(orders::id)
        .for_update()
        .get_result::<i64>(conn)
        .await?;
    let m: Membership = memberships::table
        .find(id)
        .select(Membership::as_select())
        .for_update()
        .get_result(conn)
        .await?;
    if viewer.sees_owned(m.member_id, m.store_id) {
        Ok(m)
    } else {
        Err(missing())
    }
}

async fn order_of(conn: &mut AsyncPgConnection, m: &Membership) -> AppResult<Order> {
    Ok(orders::table
        .find(m.order_id)
        .select(Order::as_select())
        .get_result(conn)
        .await?)
}

fn refusal(r: FreezeRefusal) -> AppError {
    AppError::refused(r.reason(), r.to_string())
}

/// Freezes a card (停卡) from `from` for `days` whole days: the member for their own card, or
/// staff. A freeze from today starts at once (the card FROZEN, `validTo` later by its days,
/// access revoked through the outbox); a later one is scheduled and started by [`tick`].
#[allow(clippy::too_many_arguments)]
pub async fn freeze(
    conn: &mut AsyncPgConnection,
    config: &Config,
    viewer: &Viewer,
    id: i64,
    from: NaiveDate,
    days: i32,
    reason: &str,
    ctx: &Ctx,
) -> AppResult<Membership> {
    viewer.require(&[Role::Member, Role::Admin])?;
    let reason = crate::error::required_text(reason, 500, "reason")?.to_string();
    let tz = config.timezone;
    conn.transaction(async |conn| -> AppResult<Membership> {
        let m = lock_card(conn, viewer, id).await?;
        let plan: MembershipPlan = membership_plans::table
            .find(m.plan_id)
            .select(MembershipPlan::as_select())
            .get_result(conn)
            .await?;
        let all = freezes_of(conn, m.id).await?;
        let counted: Vec<FreezeSpan> = all
            .iter()
            .filter(|f| f.state != FreezeState::CalledOff)
            .map(span)
            .collect();
        let now = Utc::now();
        let today = now.with_timezone(&tz).date_naive();
        let (first_day, end_day) = days_of(&m, tz);
        let s = rules::check_freeze(
            &FreezeCheck {
                status: m.status,
                today,
                first_day,
                end_day,
                max_freeze_days: plan.max_freeze_days,
                max_freezes: plan.max_freezes,
                freezes: &counted,
            },
            from,
            days,
        )
        .map_err(refusal)?;
        let starts_now = s.from <= today;
        let freeze_id: i64 = diesel::insert_into(membership_freezes::table)
            .values((
                membership_freezes::membership_id.eq(m.id),
                membership_freezes::state.eq(if starts_now {
                    FreezeState::Running
                } else {
                    FreezeState::Scheduled
                }),
                membership_freezes::from_date.eq(s.from),
                membership_freezes::until_date.eq(s.until),
                membership_freezes::starts_at.eq(start_of(s.from, tz)),
                membership_freezes::ends_at.eq(start_of(s.until, tz)),
                membership_freezes::reason.eq(&reason),
                membership_freezes::actor.eq(ctx.actor.to_string()),
                membership_freezes::trace_id.eq(ctx.trace.as_str()),
            ))
            .returning(membership_freezes::id)
            .get_result(conn)
            .await
            .on_violation(|v| match v {
                Violation::Check(name) => Some(AppError::bad(format!("the freeze is out of range ({name})"))),
                _ => None,
            })?;
        let d = s.days() as i32;
        let change_row = if starts_now {
            Change {
                id: m.id,
                from: MembershipStatus::Active,
                to: MembershipStatus::Frozen,
                shift_days: d,
                frozen_delta: d,
                to_member: None,
                kind: MembershipEventKind::Frozen,
                reason: Some(reason.clone()),
                summary: rules::freeze_summary(s, true),
            }
        } else {
            Change {
                id: m.id,
                from: m.status,
                to: m.status,
                shift_days: 0,
                frozen_delta: 0,
                to_member: None,
                kind: MembershipEventKind::Frozen,
                reason: Some(reason.clone()),
                summary: rules::freeze_summary(s, false),
            }
        };
        let changed = change(conn, &[change_row], &ctx.actor, &ctx.trace).await?;
        if changed.is_empty() {
            return Err(AppError::Conflict("the card changed meanwhile, please retry".into()));
        }
        if starts_now {
            let order = order_of(conn, &m).await?;
            let effects = outbox::card_access(&order, m.member_id, AccessAction::Revoke, format!("FREEZE-{freeze_id}"));
            outbox::enqueue(conn, Some(order.id), &effects, &ctx.trace, config.max_attempts).await?;
        }
        reload(conn, m.id).await
    })
    .await
}

async fn reload(conn: &mut AsyncPgConnection, id: i64) -> AppResult<Membership> {
    Ok(memberships::table
        .find(id)
        .select(Membership::as_select())
        .get_result(conn)
        .await?)
}

/// Ends a card's running freeze now (its days through today stay frozen, `validTo` back by
/// the days not served, access granted again) or, when none runs, calls off its earliest
/// scheduled one. `BAD_USER_INPUT` (`NOT_FROZEN`) when there is neither.
pub async fn unfreeze(
    conn: &mut AsyncPgConnection,
    config: &Config,
    viewer: &Viewer,
    id: i64,
    ctx: &Ctx,
) -> AppResult<Membership> {
    viewer.require(&[Role::Member, Role::Admin])?;
    let tz = config.timezone;
    conn.transaction(async |conn| -> AppResult<Membership> {
        let m = lock_card(conn, viewer, id).await?;
        let all = freezes_of(conn, m.id).await?;
        let today = Utc::now().with_timezone(&tz).date_naive();
        if let Some(f) = all.iter().find(|f| f.state == FreezeState::Running) {
            if m.status != MembershipStatus::Frozen {
                return Err(AppError::refused(
                    Refusal::NotFrozen,
                    format!("the card is {}", m.status),
                ));
            }
            let kept = rules::end_early(span(f), today);
            let back = (f.until_date - kept.until).num_days() as i32;
            end_freeze(conn, f.id, kept.until).await?;
            let changed = change(
                conn,
                &[Change {
                    id: m.id,
                    from: MembershipStatus::Frozen,
                    to: MembershipStatus::Active,
                    shift_days: -back,
                    frozen_delta: -back,
                    to_member: None,
                    kind: MembershipEventKind::Unfrozen,
                    reason: None,
                    summary: format!(
                        "unfrozen early: frozen {} until {} ({} days), {back} days not served",
                        kept.from,
                        kept.until,
                        kept.days()
                    ),
                }],
                &ctx.actor,
                &ctx.trace,
            )
            .await?;
            if changed.is_empty() {
                return Err(AppError::Conflict("the card changed meanwhile, please retry".into()));
            }
            let order = order_of(conn, &m).await?;
            let effects = outbox::card_access(&order, m.member_id, AccessAction::Grant, format!("FREEZE-{}", f.id));
            outbox::enqueue(conn, Some(order.id), &effects, &ctx.trace, config.max_attempts).await?;
            return reload(conn, m.id).await;
        }
        let Some(f) = all.iter().find(|f| f.state == FreezeState::Scheduled) else {
            return Err(AppError::refused(
                Refusal::NotFrozen,
                "the card has no running or scheduled freeze",
            ));
        };
        call_off(conn, &[f.id]).await?;
        change(
            conn,
            &[Change {
                id: m.id,
                from: m.status,
                to: m.status,
                shift_days: 0,
                frozen_delta: 0,
                to_member: None,
                kind: MembershipEventKind::Unfrozen,
                reason: None,
                summary: format!("scheduled freeze {} until {} called off", f.from_date, f.until_date),
            }],
            &ctx.actor,
            &ctx.trace,
        )
        .await?;
        reload(conn, m.id).await
    })
    .await
}

/// A running freeze done: its last day frozen is the day before `until` (brought forward when
/// ended early, with the instant it ended).
async fn end_freeze(conn: &mut AsyncPgConnection, freeze_id: i64, until: NaiveDate) -> AppResult<()> {
    diesel::update(membership_freezes::table.find(freeze_id))
        .set((
            membership_freezes::state.eq(FreezeState::Done),
            membership_freezes::until_date.eq(until),
            membership_freezes::ended_at.eq(Utc::now()),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

/// Scheduled freezes called off before they started: zero days, no limit counted.
async fn call_off(conn: &mut AsyncPgConnection, ids: &[i64]) -> AppResult<()> {
    diesel::update(
        membership_freezes::table
            .filter(membership_freezes::id.eq_any(ids))
            .filter(membership_freezes::state.eq(FreezeState::Scheduled)),
    )
    .set((
        membership_freezes::state.eq(FreezeState::CalledOff),
        membership_freezes::until_date.eq(membership_freezes::from_date),
        membership_freezes::ends_at.eq(membership_freezes::starts_at),
        membership_freezes::ended_at.eq(Utc::now()),
    ))
    .execute(conn)
    .await?;
    Ok(())
}

/// The card of a refunded order revoked, in the refund's transaction (orders call this): its
/// freezes end (a running one keeps its days through today, scheduled ones are called off).
/// The refund itself revokes the order's access. Nothing for an order without a card.
pub async fn revoke_for_order(
    conn: &mut AsyncPgConnection,
    order_id: i64,
    tz: Tz,
    reason: &str,
    ctx: &Ctx,
) -> AppResult<()> {
    let m: Option<Membership> = memberships::table
        .filter(memberships::order_id.eq(order_id))
        .select(Membership::as_select())
        .for_update()
        .get_result(conn)
        .await
        .optional()?;
    let Some(m) = m else { return Ok(()) };
    if m.status.is_final() {
        return Ok(());
    }
    let all = freezes_of(conn, m.id).await?;
    let today = Utc::now().with_timezone(&tz).date_naive();
    let mut back = 0;
    if let Some(f) = all.iter().find(|f| f.state == FreezeState::Running) {
        let kept = rules::end_early(span(f), today);
        back = (f.until_date - kept.until).num_days() as i32;
        end_freeze(conn, f.id, kept.until).await?;
    }
    let scheduled: Vec<i64> = all
        .iter()
        .filter(|f| f.state == FreezeState::Scheduled)
        .map(|f| f.id)
        .collect();
    call_off(conn, &scheduled).await?;
    change(
        conn,
        &[Change {
            id: m.id,
            from: m.status,
            to: MembershipStatus::Revoked,
            shift_days: -back,
            frozen_delta: -back,
            to_member: None,
            kind: MembershipEventKind::Revoked,
            reason: Some(reason.to_string()),
            summary: "revoked: its order was refunded".into(),
        }],
        &ctx.actor,
        &ctx.trace,
    )
    .await?;
    Ok(())
}

/// One card by its id.
pub async fn find(conn: &mut AsyncPgConnection, id: i64) -> AppResult<Option<Membership>> {
    Ok(memberships::table
        .find(id)
        .select(Membership::as_select())
        .get_result(conn)
        .await
        .optional()?)
}

/// The card of an order, if it has one, and whether it was transferred (its order can no longer
/// be refunded).
pub async fn of_order(conn: &mut AsyncPgConnection, order_id: i64) -> AppResult<Option<Membership>> {
    Ok(memberships::table
        .filter(memberships::order_id.eq(order_id))
        .select(Membership::as_select())
        .get_result(conn)
        .await
        .optional()?)
}

/// A transfer's refusal in words a client acts on.
fn transfer_refused(reason: Refusal, msg: impl Into<String>) -> AppError {
    AppError::refused(reason, msg)
}

/// Passes an ACTIVE card with its order and remaining validity to another member of a store
/// of the same operator (转卡, staff): the fee from the old holder's wallet, the new holder's
/// prepaid caps checked, access moved, scheduled freezes called off; once per card.
#[allow(clippy::too_many_arguments)]
pub async fn transfer(
    conn: &mut AsyncPgConnection,
    config: &Config,
    viewer: &Viewer,
    id: i64,
    to_member_id: i64,
    fee_cents: i64,
    reason: &str,
    ctx: &Ctx,
) -> AppResult<Membership> {
    viewer.require(&[Role::Admin])?;
    let reason = crate::error::required_text(reason, 500, "reason")?.to_string();
    if !(0..=10_000_000).contains(&fee_cents) {
        return Err(transfer_refused(
            Refusal::InvalidFee,
            "feeCents must be between 0 and 10000000",
        ));
    }
    let tz = config.timezone;
    conn.transaction(async |conn| -> AppResult<Membership> {
        let m = lock_card(conn, viewer, id).await?;
        if m.status != MembershipStatus::Active {
            return Err(transfer_refused(
                if m.status == MembershipStatus::Frozen {
                    Refusal::MembershipFrozen
                } else {
                    Refusal::MembershipNotActive
                },
                format!("the card is {}: only an active card can be transferred", m.status),
            ));
        }
        if m.transferred_at.is_some() {
            return Err(transfer_refused(
                Refusal::MembershipTransferred,
                "a card is transferred once",
            ));
        }
        if m.valid_to <= Utc::now() {
            return Err(transfer_refused(
                Refusal::MembershipNotActive,
                "the card's validity is over",
            ));
        }
        if to_member_id == m.member_id {
            return Err(transfer_refused(
                Refusal::SameMember,
                "the card already belongs to this member",
            ));
        }
        // Both holders' rows locked, the lower id first (placings and top-ups of each take turns
        // with the transfer: the new holder's caps, the old holder's wallet).
        let mut ids = [m.member_id, to_member_id];
        ids.sort_unstable();
        let locked: Vec<Member> = members::table
            .filter(members::id.eq_any(ids))
            .order(members::id)
            .select(Member::as_select())
            .for_no_key_update()
            .load(conn)
            .await?;
        let Some(to) = locked.iter().find(|x| x.id == to_member_id) else {
            return Err(AppError::NotFound(format!("member {to_member_id}")));
        };
        if !viewer.sees_store(to.store_id) {
            return Err(AppError::NotFound(format!("member {to_member_id}")));
        }
        let operators: Vec<(i64, String)> = stores::table
            .filter(stores::id.eq_any([m.store_id, to.store_id]))
            .select((stores::id, stores::operator_code))
            .load(conn)
            .await?;
        let op = |s: i64| operators.iter().find(|(id, _)| *id == s).map(|(_, o)| o.clone());
        if op(m.store_id) != op(to.store_id) {
            return Err(transfer_refused(
                Refusal::OtherOperator,
                "the new holder is a member of another business operator's store",
            ));
        }
        let order = order_of(conn, &m).await?;
        let plan_days = order.plan_days.unwrap_or(0);
        let all = freezes_of(conn, m.id).await?;
        let now = Utc::now();
        let left = unused_days(&m, plan_days, &all, now, tz);
        let value = crate::domain::money::pro_rata(order.amount_cents, left, i64::from(plan_days.max(1)));
        let (store, held) = crate::prepaid::rules_and_holdings(conn, m.store_id, to_member_id, true, tz).await?;
        crate::prepaid::check_held(
            &store,
            held.as_ref(),
            crate::domain::prepaid::Adding::Order {
                kind: crate::domain::OrderKind::Membership,
                amount_cents: value,
                plan_days: left as i32,
                sessions: 0,
                wallet_cents: 0,
            },
        )?;
        if fee_cents > 0 {
            crate::wallet::wallet_move(
                conn,
                crate::wallet::WalletMove {
                    member_id: m.member_id,
                    kind: WalletMoveKind::Fee,
                    balance_delta: -fee_cents,
                    frozen_delta: 0,
                    order_id: Some(order.id),
                    reference: Some("transfer"),
                },
                ctx,
            )
            .await?;
        }
        let scheduled: Vec<i64> = all
            .iter()
            .filter(|f| f.state == FreezeState::Scheduled)
            .map(|f| f.id)
            .collect();
        call_off(conn, &scheduled).await?;
        let changed = change(
            conn,
            &[Change {
                id: m.id,
                from: MembershipStatus::Active,
                to: MembershipStatus::Active,
                shift_days: 0,
                frozen_delta: 0,
                to_member: Some(to_member_id),
                kind: MembershipEventKind::Transferred,
                reason: Some(reason.clone()),
                summary: format!(
                    "transferred from member {} to member {}, {left} days left, fee ¥{}",
                    m.member_id,
                    to_member_id,
                    crate::domain::money::format_yuan(fee_cents)
                ),
            }],
            &ctx.actor,
            &ctx.trace,
        )
        .await?;
        if changed.is_empty() {
            return Err(AppError::Conflict("the card changed meanwhile, please retry".into()));
        }
        // The order passes with its card: the new holder sees it as their own (its payment
        // records stay as they were). The only write of `orders.member_id` after placing.
        diesel::update(orders::table.find(order.id))
            .set(orders::member_id.eq(to_member_id))
            .execute(conn)
            .await
            .on_violation(|v| match v {
                Violation::Unique("orders_member_idempotency_key") => Some(AppError::Conflict(
                    "the new holder has an order under the same idempotency key".into(),
                )),
                _ => None,
            })?;
        let mut effects = outbox::card_access(&order, m.member_id, AccessAction::Revoke, "TRANSFER".into()).to_vec();
        effects.extend(outbox::card_access(
            &order,
            to_member_id,
            AccessAction::Grant,
            "TRANSFER".into(),
        ));
        outbox::enqueue(conn, Some(order.id), &effects, &ctx.trace, config.max_attempts).await?;
        reload(conn, m.id).await
    })
    .await
}
