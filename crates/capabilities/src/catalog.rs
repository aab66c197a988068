//! Stores, members and what the studios sell.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::db::models::{ClassPack, CoachSlot, Member, MembershipPlan, Store};
use crate::db::schema::{class_packs, coach_slots, members, membership_plans, stores};
use crate::error::{AppError, AppResult, OnViolation, Violation};

fn name_ok(field: &str, value: &str) -> AppResult<String> {
    let v = value.trim();
    if v.is_empty() || v.chars().count() > 100 {
        return Err(AppError::bad(format!("{field} must be 1 to 100 characters")));
    }
    Ok(v.to_string())
}

fn price_ok(price_cents: i32) -> AppResult<i64> {
    if price_cents <= 0 {
        return Err(AppError::bad("priceCents must be positive"));
    }
    Ok(i64::from(price_cents))
}

fn code_ok<'a>(field: &str, code: &'a str) -> AppResult<&'a str> {
    let code = code.trim();
    if code.is_empty()
        || code.len() > 32
        || !code
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(AppError::bad(format!(
            "{field} must be 1 to 32 letters, digits, - or _"
        )));
    }
    Ok(code)
}

/// Opens a store; its business operator is `operator_code` (the operator's 统一社会信用代码), by
/// default the store's own code.
pub async fn create_store(
    conn: &mut AsyncPgConnection,
    name: &str,
    code: &str,
    operator_code: Option<&str>,
) -> AppResult<Store> {
    let name = name_ok("name", name)?;
    let code = code_ok("code", code)?;
    let operator = operator_code
        .map(|o| code_ok("operatorCode", o))
        .transpose()?
        .unwrap_or(code);
    diesel::insert_into(stores::table)
        .values((
            stores::name.eq(name),
            stores::code.eq(code),
            stores::operator_code.eq(operator),
        ))
        .returning(Store::as_returning())
        .get_result(conn)
        .await
        .on_violation(|v| match v {
            Violation::Unique("stores_code_key") => Some(AppError::Conflict("a store with this code exists".into())),
            _ => None,
        })
}

/// Renames a store or names its business operator (prepaid caps count per member and
/// operator from then on: what a member holds with the new operator counts at the next sale).
pub async fn update_store(
    conn: &mut AsyncPgConnection,
    store_id: i64,
    name: Option<&str>,
    operator_code: Option<&str>,
) -> AppResult<Store> {
    let name = name.map(|n| name_ok("name", n)).transpose()?;
    let operator = operator_code.map(|o| code_ok("operatorCode", o)).transpose()?;
    require_store(conn, store_id).await?;
    if name.is_none() && operator.is_none() {
        return require_store(conn, store_id).await;
    }
    Ok(diesel::update(stores::table.find(store_id))
        .set((
            name.map(|n| stores::name.eq(n)),
            operator.map(|o| stores::operator_code.eq(o)),
        ))
        .returning(Store::as_returning())
        .get_result(conn)
        .await?)
}

/// Refuses a catalog item the store could never sell under its prepaid rules.
async fn sellable(
    conn: &mut AsyncPgConnection,
    store_id: i64,
    kind: crate::domain::OrderKind,
    price: i64,
    days: i32,
    sessions: i32,
) -> AppResult<()> {
    let store = crate::prepaid::rules_of(conn, store_id).await?;
    crate::domain::prepaid::check_item(&store.rules, kind, price, days, sessions).map_err(crate::prepaid::refusal)
}

pub async fn require_store(conn: &mut AsyncPgConnection, store_id: i64) -> AppResult<Store> {
    stores::table
        .find(store_id)
        .select(Store::as_select())
        .get_result(conn)
        .await
        .optional()?
        .ok_or_else(|| AppError::NotFound(format!("store {store_id}")))
}

pub async fn create_member(conn: &mut AsyncPgConnection, store_id: i64, name: &str, phone: &str) -> AppResult<Member> {
    let name = name_ok("name", name)?;
    let phone: String = phone.chars().filter(|c| !c.is_whitespace() && *c != '-').collect();
    let digits = phone.strip_prefix('+').unwrap_or(&phone);
    if !(5..=20).contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AppError::bad("phone must be 5 to 20 digits"));
    }
    require_store(conn, store_id).await?;
    diesel::insert_into(members::table)
        .values((
            members::store_id.eq(store_id),
            members::name.eq(name),
            members::phone.eq(phone),
        ))
        .returning(Member::as_returning())
        .get_result(conn)
        .await
        .on_violation(|v| match v {
            Violation::Unique("members_store_phone_key") => Some(AppError::Conflict(
                "a member with this phone exists in this store".into(),
            )),
            _ => None,
        })
}

/// How a plan limits freezing its cards (docs/prepaid-and-cards.md "Freezing and transferring cards"); `None`: the
/// defaults, 30 days over a card's life and 3 freezes.
#[derive(Debug, Clone, Copy, Default)]
pub struct FreezeLimits {
    pub max_freeze_days: Option<i32>,
    pub max_freezes: Option<i32>,
}

pub async fn create_membership_plan(
    conn: &mut AsyncPgConnection,
    store_id: i64,
    name: &str,
    duration_days: i32,
    price_cents: i32,
    freezing: FreezeLimits,
) -> AppResult<MembershipPlan> {
    let name = name_ok("name", name)?;
    if !(1..=3660).contains(&duration_days) {
        return Err(AppError::bad("durationDays must be between 1 and 3660"));
    }
    let max_freeze_days = freezing
        .max_freeze_days
        .unwrap_or(crate::domain::membership::DEFAULT_MAX_FREEZE_DAYS);
    let max_freezes = freezing
        .max_freezes
        .unwrap_or(crate::domain::membership::DEFAULT_MAX_FREEZES);
    if !(0..=3660).contains(&max_freeze_days) {
        return Err(AppError::bad("maxFreezeDays must be between 0 and 3660"));
    }
    if !(0..=100).contains(&max_freezes) {
        return Err(AppError::bad("maxFreezes must be between 0 and 100"));
    }
    let price = price_ok(price_cents)?;
    require_store(conn, store_id).await?;
    sellable(
        conn,
        store_id,
        crate::domain::OrderKind::Membership,
        price,
        duration_days,
        0,
    )
    .await?;
    Ok(diesel::insert_into(membership_plans::table)
        .values((
            membership_plans::store_id.eq(store_id),
            membership_plans::name.eq(name),
            membership_plans::duration_days.eq(duration_days),
            membership_plans::price_cents.eq(price),
            membership_plans::max_freeze_days.eq(max_freeze_days),
            membership_plans::max_freezes.eq(max_freezes),
        ))
        .returning(MembershipPlan::as_returning())
        .get_result(conn)
        .await?)
}

pub async fn create_class_pack(
    conn: &mut AsyncPgConnection,
    store_id: i64,
    name: &str,
    sessions: i32,
    price_cents: i32,
    stock: Option<i32>,
) -> AppResult<ClassPack> {
    let name = name_ok("name", name)?;
    if !(1..=1000).contains(&sessions) {
        return Err(AppError::bad("sessions must be between 1 and 1000"));
    }
    if stock.is_some_and(|s| s < 0) {
        return Err(AppError::bad("stock may not be negative"));
    }
    let price = price_ok(price_cents)?;
    require_store(conn, store_id).await?;
    sellable(conn, store_id, crate::domain::OrderKind::ClassPack, price, 0, sessions).await?;
    Ok(diesel::insert_into(class_packs::table)
        .values((
            class_packs::store_id.eq(store_id),
            class_packs::name.eq(name),
            class_packs::sessions.eq(sessions),
            class_packs::price_cents.eq(price),
            class_packs::stock.eq(stock),
        ))
        .returning(ClassPack::as_returning())
        .get_result(conn)
        .await?)
}

#[allow(clippy::too_many_arguments)]
pub async fn create_coach_slot(
    conn: &mut AsyncPgConnection,
    store_id: i64,
    coach_name: &str,
    starts_at: DateTime<Utc>,
    ends_at: DateTime<Utc>,
    capacity: i32,
    price_cents: i32,
) -> AppResult<CoachSlot> {
    let coach = name_ok("coachName", coach_name)?;
    if ends_at <= starts_at {
        return Err(AppError::bad("endsAt must be after startsAt"));
    }
    if !(1..=1000).contains(&capacity) {
        return Err(AppError::bad("capacity must be between 1 and 1000"));
    }
    let price = price_ok(price_cents)?;
    require_store(conn, store_id).await?;
    Ok(diesel::insert_into(coach_slots::table)
        .values((
            coach_slots::store_id.eq(store_id),
            coach_slots::coach_name.eq(coach),
            coach_slots::starts_at.eq(starts_at),
            coach_slots::ends_at.eq(ends_at),
            coach_slots::capacity.eq(capacity),
            coach_slots::remaining.eq(capacity),
            coach_slots::price_cents.eq(price),
        ))
        .returning(CoachSlot::as_returning())
        .get_result(conn)
        .await?)
}
