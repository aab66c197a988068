//! Stores, members and what the studios sell.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

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

// ---- The front desk's everyday (issue 39): finding members, the catalog changing ----

/// How the front desk looks a member up by phone: the whole number, or its last four digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PhoneSearch {
    LastFour(String),
    Whole(String),
}

/// A checked `members(filter)`: a phone, a part of the name, a store (each optional).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberSearch {
    pub phone: Option<PhoneSearch>,
    /// a part of the name, as typed (trimmed)
    pub name: Option<String>,
    pub store_id: Option<i64>,
}

/// The shortest part of a name looked for: one character matches too many members to be a
/// search (a family name alone is a list, not a member).
pub const MIN_NAME_PART_CHARS: usize = 2;

fn invalid_filter(msg: impl Into<String>) -> AppError {
    AppError::refused(crate::domain::Refusal::InvalidFilter, msg)
}

impl MemberSearch {
    /// Checks what the desk typed. A blank field is no filter; a phone is written as members'
    /// phones are (spaces and dashes dropped): four digits are the last four, 5 to 20 digits
    /// (a leading `+` allowed) the whole number; anything else, or a name part shorter than
    /// [`MIN_NAME_PART_CHARS`] (or over 100 characters), is refused (`INVALID_FILTER`).
    pub fn parse(phone: Option<&str>, name: Option<&str>, store_id: Option<i64>) -> AppResult<MemberSearch> {
        let phone = phone
            .map(|p| {
                p.chars()
                    .filter(|c| !c.is_whitespace() && *c != '-')
                    .collect::<String>()
            })
            .filter(|p| !p.is_empty())
            .map(|p| {
                let digits = p.strip_prefix('+').unwrap_or(&p);
                let all_digits = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
                match digits.len() {
                    4 if all_digits && !p.starts_with('+') => Ok(PhoneSearch::LastFour(p)),
                    5..=20 if all_digits => Ok(PhoneSearch::Whole(p)),
                    _ => Err(invalid_filter(
                        "phone must be the last four digits or the whole number (5 to 20 digits)",
                    )),
                }
            })
            .transpose()?;
        let name = name
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(|n| {
                let chars = n.chars().count();
                if !(MIN_NAME_PART_CHARS..=100).contains(&chars) {
                    Err(invalid_filter(format!(
                        "name must be {MIN_NAME_PART_CHARS} to 100 characters of the name"
                    )))
                } else {
                    Ok(n.to_string())
                }
            })
            .transpose()?;
        Ok(MemberSearch { phone, name, store_id })
    }
}

/// The members a search finds, among the stores given (`None`: every store), as a query the
/// caller pages (newest first by id). The phone's last four digits are looked up through
/// `members_phone_last4` (the whole number too: its last four, then the whole), a part of the
/// name through the trigram index `members_name_trgm` (`ILIKE`: case-insensitive for Latin
/// letters, any substring for Chinese).
pub fn find_members(search: &MemberSearch, stores: Option<&[i64]>) -> members::BoxedQuery<'static, diesel::pg::Pg> {
    use diesel::dsl::sql;
    use diesel::sql_types::{Bool, Text};
    let mut q = members::table.into_boxed();
    if let Some(stores) = stores {
        q = q.filter(members::store_id.eq_any(stores.to_vec()));
    }
    if let Some(store) = search.store_id {
        q = q.filter(members::store_id.eq(store));
    }
    match &search.phone {
        Some(PhoneSearch::LastFour(last4)) => {
            q = q.filter(sql::<Bool>("right(members.phone, 4) = ").bind::<Text, _>(last4.clone()));
        }
        Some(PhoneSearch::Whole(phone)) => {
            let last4: String = phone.chars().skip(phone.chars().count() - 4).collect();
            q = q
                .filter(sql::<Bool>("right(members.phone, 4) = ").bind::<Text, _>(last4))
                .filter(members::phone.eq(phone.clone()));
        }
        None => {}
    }
    if let Some(name) = &search.name {
        let mut pattern = String::with_capacity(name.len() + 2);
        pattern.push('%');
        for c in name.chars() {
            if matches!(c, '%' | '_' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push('%');
        q = q.filter(members::name.ilike(pattern));
    }
    q
}

/// A change of a membership plan (`None`: left as it is).
#[derive(Debug, Clone, Default)]
pub struct PlanChange {
    pub name: Option<String>,
    pub price_cents: Option<i32>,
    pub max_freeze_days: Option<i32>,
    pub max_freezes: Option<i32>,
}

/// A class pack's stock, changed: so many units left on sale, or no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StockChange {
    Units(i32),
    Unlimited,
}

/// A change of a class pack (`None`: left as it is).
#[derive(Debug, Clone, Default)]
pub struct PackChange {
    pub name: Option<String>,
    pub price_cents: Option<i32>,
    pub stock: Option<StockChange>,
}

fn retired(what: &str, id: i64) -> AppError {
    AppError::refused(
        crate::domain::Refusal::Retired,
        format!("{what} {id} is retired: it is sold and changed no more"),
    )
}

/// What changed, for the audit row: `field old → new` for each field that did.
fn summarize(changes: &[(&str, String, String)]) -> String {
    changes
        .iter()
        .filter(|(_, old, new)| old != new)
        .map(|(field, old, new)| format!("{field} {old} → {new}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// One row of `catalog_changes`, in the change's transaction.
async fn audit(
    conn: &mut AsyncPgConnection,
    store_id: i64,
    item: (Option<i64>, Option<i64>),
    retired: bool,
    summary: &str,
    ctx: &crate::domain::Ctx,
) -> AppResult<()> {
    use crate::db::schema::catalog_changes as cc;
    diesel::insert_into(cc::table)
        .values((
            cc::store_id.eq(store_id),
            cc::membership_plan_id.eq(item.0),
            cc::class_pack_id.eq(item.1),
            cc::retired.eq(retired),
            cc::summary.eq(summary),
            cc::actor.eq(ctx.actor.to_string()),
            cc::trace_id.eq(ctx.trace.as_str()),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

async fn locked_plan(conn: &mut AsyncPgConnection, v: &crate::auth::Viewer, id: i64) -> AppResult<MembershipPlan> {
    let plan: MembershipPlan = membership_plans::table
        .find(id)
        .select(MembershipPlan::as_select())
        .for_update()
        .get_result(conn)
        .await
        .optional()?
        .ok_or_else(|| AppError::NotFound(format!("membership plan {id}")))?;
    v.require_store(plan.store_id)?;
    Ok(plan)
}

async fn locked_pack(conn: &mut AsyncPgConnection, v: &crate::auth::Viewer, id: i64) -> AppResult<ClassPack> {
    let pack: ClassPack = class_packs::table
        .find(id)
        .select(ClassPack::as_select())
        .for_update()
        .get_result(conn)
        .await
        .optional()?
        .ok_or_else(|| AppError::NotFound(format!("class pack {id}")))?;
    v.require_store(pack.store_id)?;
    Ok(pack)
}

/// Changes a plan's name, price or freezing limits for the orders placed from now on (an order
/// carries its own amount, days and name). A retired plan is refused (`RETIRED`); a new price
/// must be positive and one the store's prepaid rules allow, as when the plan was made. One
/// transaction: the plan (locked), its change and its audit row; nothing changed, nothing
/// written.
pub async fn update_membership_plan(
    conn: &mut AsyncPgConnection,
    v: &crate::auth::Viewer,
    id: i64,
    change: PlanChange,
    ctx: &crate::domain::Ctx,
) -> AppResult<MembershipPlan> {
    let name = change.name.as_deref().map(|n| name_ok("name", n)).transpose()?;
    let price = change.price_cents.map(price_ok).transpose()?;
    if change.max_freeze_days.is_some_and(|d| !(0..=3660).contains(&d)) {
        return Err(AppError::bad("maxFreezeDays must be between 0 and 3660"));
    }
    if change.max_freezes.is_some_and(|n| !(0..=100).contains(&n)) {
        return Err(AppError::bad("maxFreezes must be between 0 and 100"));
    }
    conn.transaction(async |conn| -> AppResult<MembershipPlan> {
        let plan = locked_plan(conn, v, id).await?;
        if plan.retired_at.is_some() {
            return Err(retired("membership plan", id));
        }
        let new_name = name.clone().unwrap_or_else(|| plan.name.clone());
        let new_price = price.unwrap_or(plan.price_cents);
        let new_days = change.max_freeze_days.unwrap_or(plan.max_freeze_days);
        let new_freezes = change.max_freezes.unwrap_or(plan.max_freezes);
        let summary = summarize(&[
            ("name", format!("{:?}", plan.name), format!("{new_name:?}")),
            ("priceCents", plan.price_cents.to_string(), new_price.to_string()),
            ("maxFreezeDays", plan.max_freeze_days.to_string(), new_days.to_string()),
            ("maxFreezes", plan.max_freezes.to_string(), new_freezes.to_string()),
        ]);
        if summary.is_empty() {
            return Ok(plan);
        }
        if new_price != plan.price_cents {
            sellable(
                conn,
                plan.store_id,
                crate::domain::OrderKind::Membership,
                new_price,
                plan.duration_days,
                0,
            )
            .await?;
        }
        let updated = diesel::update(membership_plans::table.find(id))
            .set((
                membership_plans::name.eq(new_name),
                membership_plans::price_cents.eq(new_price),
                membership_plans::max_freeze_days.eq(new_days),
                membership_plans::max_freezes.eq(new_freezes),
            ))
            .returning(MembershipPlan::as_returning())
            .get_result(conn)
            .await?;
        audit(conn, plan.store_id, (Some(id), None), false, &summary, ctx).await?;
        tracing::info!(plan = id, actor = %ctx.actor, %summary, "membership plan changed");
        Ok(updated)
    })
    .await
}

/// Retires a plan: sold no more (placing it is refused `RETIRED`), kept on the orders and
/// cards that bought it. Retiring a retired plan answers it as it is.
pub async fn retire_membership_plan(
    conn: &mut AsyncPgConnection,
    v: &crate::auth::Viewer,
    id: i64,
    ctx: &crate::domain::Ctx,
) -> AppResult<MembershipPlan> {
    conn.transaction(async |conn| -> AppResult<MembershipPlan> {
        let plan = locked_plan(conn, v, id).await?;
        if plan.retired_at.is_some() {
            return Ok(plan);
        }
        let updated = diesel::update(membership_plans::table.find(id))
            .set(membership_plans::retired_at.eq(Some(Utc::now())))
            .returning(MembershipPlan::as_returning())
            .get_result(conn)
            .await?;
        audit(conn, plan.store_id, (Some(id), None), true, "retired", ctx).await?;
        tracing::info!(plan = id, actor = %ctx.actor, "membership plan retired");
        Ok(updated)
    })
    .await
}

/// Changes a class pack's name, price or stock (so many units left on sale, or unlimited) for
/// the orders placed from now on; the rules of [`update_membership_plan`] hold.
pub async fn update_class_pack(
    conn: &mut AsyncPgConnection,
    v: &crate::auth::Viewer,
    id: i64,
    change: PackChange,
    ctx: &crate::domain::Ctx,
) -> AppResult<ClassPack> {
    let name = change.name.as_deref().map(|n| name_ok("name", n)).transpose()?;
    let price = change.price_cents.map(price_ok).transpose()?;
    if let Some(StockChange::Units(n)) = change.stock {
        if n < 0 {
            return Err(AppError::bad("stock may not be negative"));
        }
    }
    conn.transaction(async |conn| -> AppResult<ClassPack> {
        let pack = locked_pack(conn, v, id).await?;
        if pack.retired_at.is_some() {
            return Err(retired("class pack", id));
        }
        let new_name = name.clone().unwrap_or_else(|| pack.name.clone());
        let new_price = price.unwrap_or(pack.price_cents);
        let new_stock = match change.stock {
            Some(StockChange::Units(n)) => Some(n),
            Some(StockChange::Unlimited) => None,
            None => pack.stock,
        };
        let shown = |s: Option<i32>| s.map_or_else(|| "unlimited".to_string(), |n| n.to_string());
        let summary = summarize(&[
            ("name", format!("{:?}", pack.name), format!("{new_name:?}")),
            ("priceCents", pack.price_cents.to_string(), new_price.to_string()),
            ("stock", shown(pack.stock), shown(new_stock)),
        ]);
        if summary.is_empty() {
            return Ok(pack);
        }
        if new_price != pack.price_cents {
            sellable(
                conn,
                pack.store_id,
                crate::domain::OrderKind::ClassPack,
                new_price,
                0,
                pack.sessions,
            )
            .await?;
        }
        let updated = diesel::update(class_packs::table.find(id))
            .set((
                class_packs::name.eq(new_name),
                class_packs::price_cents.eq(new_price),
                class_packs::stock.eq(new_stock),
            ))
            .returning(ClassPack::as_returning())
            .get_result(conn)
            .await?;
        audit(conn, pack.store_id, (None, Some(id)), false, &summary, ctx).await?;
        tracing::info!(pack = id, actor = %ctx.actor, %summary, "class pack changed");
        Ok(updated)
    })
    .await
}

/// Retires a class pack, as [`retire_membership_plan`] a plan.
pub async fn retire_class_pack(
    conn: &mut AsyncPgConnection,
    v: &crate::auth::Viewer,
    id: i64,
    ctx: &crate::domain::Ctx,
) -> AppResult<ClassPack> {
    conn.transaction(async |conn| -> AppResult<ClassPack> {
        let pack = locked_pack(conn, v, id).await?;
        if pack.retired_at.is_some() {
            return Ok(pack);
        }
        let updated = diesel::update(class_packs::table.find(id))
            .set(class_packs::retired_at.eq(Some(Utc::now())))
            .returning(ClassPack::as_returning())
            .get_result(conn)
            .await?;
        audit(conn, pack.store_id, (None, Some(id)), true, "retired", ctx).await?;
        tracing::info!(pack = id, actor = %ctx.actor, "class pack retired");
        Ok(updated)
    })
    .await
}
