//! Prepaid money (预付款, docs/prepaid-and-cards.md "Prepaid money"): the rules each store sells under, the caps
//! they put on what one member holds with one business operator, checked where money comes in
//! (placing, topping up, the catalog), the business calendar every deadline uses
//! ([`calendar`]), the refunds of the cooling-off period that miss their deadline
//! ([`overdue`]) and the prepaid ledger (预收资金台账, [`ledger`]). The rules themselves are
//! `domain::prepaid`; this module brings them the figures.

pub mod calendar;
pub mod ledger;
pub mod overdue;

use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::db::schema::{prepaid_rules, stores};
use crate::db::sql::StaticQuery;
use crate::domain::prepaid::{self, Adding, Holdings, OverLimit, PrepaidRulesRequest};
use crate::domain::{Ctx, PrepaidPreset, PrepaidRules};
use crate::error::{AppError, AppResult, OnViolation, Violation};

/// A store's rules and the operator its caps count under.
#[derive(Debug, Clone)]
pub struct StoreRules {
    pub store_id: i64,
    pub operator_code: String,
    pub rules: PrepaidRules,
}

type RulesRow = (
    String,
    Option<PrepaidPreset>,
    Option<i64>,
    Option<i32>,
    Option<i64>,
    Option<i32>,
    Option<i64>,
    Option<i64>,
    Option<i32>,
    Option<i32>,
    Option<String>,
    Option<String>,
);

/// The rules of a store (no row: NONE), with its operator; `NotFound` for no such store.
pub async fn rules_of(conn: &mut AsyncPgConnection, store_id: i64) -> AppResult<StoreRules> {
    rules_of_stores(conn, &[store_id])
        .await?
        .remove(&store_id)
        .ok_or_else(|| AppError::NotFound(format!("store {store_id}")))
}

/// The rules of many stores in one statement (a page of stores); missing stores are left out.
pub async fn rules_of_stores(
    conn: &mut AsyncPgConnection,
    store_ids: &[i64],
) -> AppResult<std::collections::HashMap<i64, StoreRules>> {
    let rows: Vec<(i64, RulesRow)> = stores::table
        .left_join(prepaid_rules::table)
        .filter(stores::id.eq_any(store_ids))
        .select((
            stores::id,
            (
                stores::operator_code,
                prepaid_rules::preset.nullable(),
                prepaid_rules::membership_max_cents.nullable(),
                prepaid_rules::membership_max_days.nullable(),
                prepaid_rules::sessions_max_cents.nullable(),
                prepaid_rules::sessions_max_count.nullable(),
                prepaid_rules::top_up_max_cents.nullable(),
                prepaid_rules::total_max_cents.nullable(),
                prepaid_rules::cooling_off_days.nullable(),
                prepaid_rules::refund_within_working_days.nullable(),
                prepaid_rules::terms_version.nullable(),
                prepaid_rules::terms_text.nullable(),
            ),
        ))
        .load(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(
            |(store_id, (operator_code, preset, mmc, mmd, smc, smn, tuc, tot, cod, rwd, tv, tt))| {
                let rules = match preset {
                    None => PrepaidRules::preset(PrepaidPreset::None),
                    Some(preset) => PrepaidRules {
                        preset,
                        membership_max_cents: mmc,
                        membership_max_days: mmd,
                        sessions_max_cents: smc,
                        sessions_max_count: smn,
                        top_up_max_cents: tuc,
                        total_max_cents: tot,
                        cooling_off_days: cod.unwrap_or(0),
                        refund_within_working_days: rwd.unwrap_or(5),
                        terms_version: tv,
                        terms_text: tt,
                    },
                };
                (
                    store_id,
                    StoreRules {
                        store_id,
                        operator_code,
                        rules,
                    },
                )
            },
        )
        .collect())
}

/// Sets the rules a store sells under (chain-wide admins: the caller checks who) and returns
/// them resolved. Orders sold before keep the cooling-off they were sold with.
pub async fn set_rules(
    conn: &mut AsyncPgConnection,
    store_id: i64,
    req: &PrepaidRulesRequest,
    ctx: &Ctx,
) -> AppResult<PrepaidRules> {
    let rules = PrepaidRules::resolve(req).map_err(AppError::bad)?;
    let values = (
        prepaid_rules::store_id.eq(store_id),
        prepaid_rules::preset.eq(rules.preset),
        prepaid_rules::membership_max_cents.eq(rules.membership_max_cents),
        prepaid_rules::membership_max_days.eq(rules.membership_max_days),
        prepaid_rules::sessions_max_cents.eq(rules.sessions_max_cents),
        prepaid_rules::sessions_max_count.eq(rules.sessions_max_count),
        prepaid_rules::top_up_max_cents.eq(rules.top_up_max_cents),
        prepaid_rules::total_max_cents.eq(rules.total_max_cents),
        prepaid_rules::cooling_off_days.eq(rules.cooling_off_days),
        prepaid_rules::refund_within_working_days.eq(rules.refund_within_working_days),
        prepaid_rules::terms_version.eq(rules.terms_version.as_deref()),
        prepaid_rules::terms_text.eq(rules.terms_text.as_deref()),
        prepaid_rules::set_by.eq(ctx.actor.to_string()),
        prepaid_rules::trace_id.eq(ctx.trace.as_str()),
        prepaid_rules::set_at.eq(Utc::now()),
    );
    diesel::insert_into(prepaid_rules::table)
        .values(values.clone())
        .on_conflict(prepaid_rules::store_id)
        .do_update()
        .set(values)
        .execute(conn)
        .await
        .on_violation(|v| match v {
            Violation::Check(name) => Some(AppError::bad(format!("the rules are out of range ({name})"))),
            Violation::ForeignKey("prepaid_rules_store_id_fkey") => {
                Some(AppError::NotFound(format!("store {store_id}")))
            }
            _ => None,
        })?;
    tracing::info!(store_id, preset = %rules.preset, actor = %ctx.actor, "prepaid rules set");
    Ok(rules)
}

/// The figures of [`Holdings`] as `holdings.sql` sums them.
#[derive(diesel::QueryableByName)]
struct HoldingsRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    membership_cents: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    membership_days: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    sessions_cents: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    sessions_count: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    wallet_cents: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    total_cents: i64,
}

/// What a member holds with an operator now: unused value of their prepaid orders in its
/// stores (waiting, paid, being used) and their wallet money if their store is the operator's.
pub async fn holdings(
    conn: &mut AsyncPgConnection,
    member_id: i64,
    operator_code: &str,
    now: DateTime<Utc>,
    tz: Tz,
) -> AppResult<Holdings> {
    use diesel::sql_types::{BigInt, Date, Text};
    let today: NaiveDate = now.with_timezone(&tz).date_naive();
    let row: HoldingsRow = StaticQuery::new(include_str!("holdings.sql"))
        .bind::<BigInt, _>(member_id)
        .bind::<Text, _>(operator_code)
        .bind::<Date, _>(today)
        .bind::<Text, _>(tz.name())
        .get_result(conn)
        .await?;
    Ok(Holdings {
        membership_cents: row.membership_cents,
        membership_days: row.membership_days,
        sessions_cents: row.sessions_cents,
        sessions_count: row.sessions_count,
        wallet_cents: row.wallet_cents,
        total_cents: row.total_cents,
    })
}

/// A member's prepaid balance with the operator of their own store.
pub async fn member_balance(conn: &mut AsyncPgConnection, member_id: i64, store_id: i64, tz: Tz) -> AppResult<i64> {
    let op = rules_of(conn, store_id).await?.operator_code;
    Ok(holdings(conn, member_id, &op, Utc::now(), tz).await?.total_cents)
}

/// `rules_and_holdings.sql`'s row: a store's rules (no `prepaid_rules` row: NONE) and, when
/// asked for and capped, the member's holdings.
#[derive(diesel::QueryableByName)]
struct RulesAndHoldingsRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    operator_code: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    preset: Option<PrepaidPreset>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    membership_max_cents: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Integer>)]
    membership_max_days: Option<i32>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    sessions_max_cents: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Integer>)]
    sessions_max_count: Option<i32>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    top_up_max_cents: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    total_max_cents: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Integer>)]
    cooling_off_days: Option<i32>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Integer>)]
    refund_within_working_days: Option<i32>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    terms_version: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    terms_text: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    membership_cents: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    membership_days: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    sessions_cents: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    sessions_count: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    wallet_cents: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    total_cents: Option<i64>,
}

/// What a sale checks, read at once (`rules_and_holdings.sql`): the store's rules and, when
/// `prepaid` and the rules cap anything, what the member holds with its operator now (`None`
/// otherwise). `NotFound` for no such store. The caller holds the member's row lock:
/// placings, top-ups and transfers of one member take turns, so two never pass a total
/// together.
pub async fn rules_and_holdings(
    conn: &mut AsyncPgConnection,
    store_id: i64,
    member_id: i64,
    prepaid: bool,
    tz: Tz,
) -> AppResult<(StoreRules, Option<Holdings>)> {
    use diesel::sql_types::{BigInt, Bool, Date, Text};
    let today: NaiveDate = Utc::now().with_timezone(&tz).date_naive();
    let row: Option<RulesAndHoldingsRow> = StaticQuery::new(include_str!("rules_and_holdings.sql"))
        .bind::<BigInt, _>(store_id)
        .bind::<BigInt, _>(member_id)
        .bind::<Date, _>(today)
        .bind::<Text, _>(tz.name())
        .bind::<Bool, _>(prepaid)
        .get_result(conn)
        .await
        .optional()?;
    let r = row.ok_or_else(|| AppError::NotFound(format!("store {store_id}")))?;
    let rules = match r.preset {
        None => PrepaidRules::preset(PrepaidPreset::None),
        Some(preset) => PrepaidRules {
            preset,
            membership_max_cents: r.membership_max_cents,
            membership_max_days: r.membership_max_days,
            sessions_max_cents: r.sessions_max_cents,
            sessions_max_count: r.sessions_max_count,
            top_up_max_cents: r.top_up_max_cents,
            total_max_cents: r.total_max_cents,
            cooling_off_days: r.cooling_off_days.unwrap_or(0),
            refund_within_working_days: r.refund_within_working_days.unwrap_or(5),
            terms_version: r.terms_version,
            terms_text: r.terms_text,
        },
    };
    let held = match (
        r.membership_cents,
        r.membership_days,
        r.sessions_cents,
        r.sessions_count,
        r.wallet_cents,
        r.total_cents,
    ) {
        (
            Some(membership_cents),
            Some(membership_days),
            Some(sessions_cents),
            Some(sessions_count),
            Some(wallet_cents),
            Some(total_cents),
        ) => Some(Holdings {
            membership_cents,
            membership_days,
            sessions_cents,
            sessions_count,
            wallet_cents,
            total_cents,
        }),
        _ => None,
    };
    Ok((
        StoreRules {
            store_id,
            operator_code: r.operator_code,
            rules,
        },
        held,
    ))
}

/// Checks what a sale adds against the store's rules with the holdings
/// [`rules_and_holdings`] read (none read: nothing capped, or nothing prepaid).
pub fn check_held(store: &StoreRules, held: Option<&Holdings>, adding: Adding) -> AppResult<()> {
    match held {
        Some(held) => prepaid::check(&store.rules, held, adding).map_err(refusal),
        None => Ok(()),
    }
}

/// The refusal a client reads: `PREPAID_LIMIT` with the rule, its maximum and what is held.
pub fn refusal(o: OverLimit) -> AppError {
    let unit = match o.limit {
        crate::domain::PrepaidLimit::MembershipDays => "days",
        crate::domain::PrepaidLimit::SessionsCount => "sessions",
        _ => "cents",
    };
    AppError::PrepaidLimit {
        limit: o.limit,
        max: o.max,
        current: o.current,
        message: format!(
            "over the store's prepaid limit {}: at most {} {unit}, the member holds {} already",
            o.limit, o.max, o.current
        ),
    }
}

/// The terms a prepaid order needs accepted: refused unless `accepted` is the current version.
pub fn check_terms(rules: &PrepaidRules, accepted: Option<&str>) -> AppResult<()> {
    match &rules.terms_version {
        Some(current) if accepted.map(str::trim) != Some(current.as_str()) => Err(AppError::TermsNotAccepted {
            current_version: current.clone(),
        }),
        _ => Ok(()),
    }
}
