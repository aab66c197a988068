//! Members' wallets: every movement of wallet money is one ledger row, which the ledger trigger
//! applies to the member's spendable balance and frozen amount. Orders pay, freeze, capture and
//! refund through [`wallet_move`]; the desk tops up through [`top_up`].

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use crate::db::models::Member;
use crate::db::schema::{members, wallet_ledger};
use crate::domain::{Ctx, WalletMoveKind};
use crate::error::{AppError, AppResult, OnViolation, Violation};

/// One movement of wallet money: what it is, how it changes the spendable balance and the
/// frozen amount, and what it belongs to.
pub struct WalletMove<'a> {
    pub member_id: i64,
    pub kind: WalletMoveKind,
    pub balance_delta: i64,
    pub frozen_delta: i64,
    pub order_id: Option<i64>,
    pub reference: Option<&'a str>,
}

/// Writes a wallet movement; the ledger trigger applies it to the member's balances.
pub async fn wallet_move(conn: &mut AsyncPgConnection, m: WalletMove<'_>, ctx: &Ctx) -> AppResult<()> {
    use crate::db::schema::wallet_ledger as wl;
    diesel::insert_into(wl::table)
        .values((
            wl::member_id.eq(m.member_id),
            wl::kind.eq(m.kind),
            wl::balance_delta.eq(m.balance_delta),
            wl::frozen_delta.eq(m.frozen_delta),
            wl::order_id.eq(m.order_id),
            wl::reference.eq(m.reference),
            wl::actor.eq(ctx.actor.to_string()),
            wl::trace_id.eq(ctx.trace.as_str()),
        ))
        .execute(conn)
        .await
        .on_violation(ledger_violation)?;
    Ok(())
}

/// What a refused ledger row means to the client. The ledger trigger applies a movement to the
/// member's balances, whose CHECKs refuse going negative; the unique index makes a top-up
/// reference count once. Used by every statement writing ledger rows (`orders/transition.sql`
/// too).
pub fn ledger_violation(v: Violation<'_>) -> Option<AppError> {
    match v {
        Violation::Check("wallet_balance_not_negative") => {
            Some(AppError::InsufficientFunds("wallet balance is too low".into()))
        }
        Violation::Check("wallet_frozen_not_negative") => {
            Some(AppError::Conflict("frozen wallet money was already released".into()))
        }
        Violation::Unique("wallet_ledger_top_up_reference") => {
            Some(AppError::Conflict("top-up reference already used".into()))
        }
        Violation::Check("wallet_balance_fits_int") => Some(AppError::bad(format!(
            "the wallet would hold more than ¥{}",
            crate::domain::money::format_yuan(i64::from(i32::MAX))
        ))),
        Violation::Check("wallet_top_up_in_range") => Some(AppError::bad(format!(
            "a top-up is at most ¥{}",
            crate::domain::money::format_yuan(MAX_TOP_UP_CENTS)
        ))),
        _ => None,
    }
}

/// The most one top-up adds: ¥50,000 (the database's `wallet_top_up_in_range` holds the same).
pub const MAX_TOP_UP_CENTS: i64 = 5_000_000;

/// The most a wallet may hold after a top-up: ¥1,000,000. Far below GraphQL's Int (the
/// database's `wallet_balance_fits_int`), so refunds back to a full wallet still fit.
pub const MAX_BALANCE_CENTS: i64 = 100_000_000;

/// Adds money to a wallet. The reference (the desk's receipt number, the payment serial) makes
/// it idempotent: the same reference for the same member is applied once. At most
/// [`MAX_TOP_UP_CENTS`] at a time, and only while the wallet stays within [`MAX_BALANCE_CENTS`].
/// The store's prepaid rules apply (docs/prepaid-and-cards.md "Prepaid money": `TOP_UP_AMOUNT`, `TOTAL`), checked
/// under the member's row lock, which placements take too.
pub async fn top_up(
    conn: &mut AsyncPgConnection,
    member_id: i64,
    amount_cents: i32,
    reference: &str,
    tz: chrono_tz::Tz,
    ctx: &Ctx,
) -> AppResult<Member> {
    if amount_cents <= 0 {
        return Err(AppError::bad("amountCents must be positive"));
    }
    if i64::from(amount_cents) > MAX_TOP_UP_CENTS {
        return Err(AppError::bad(format!(
            "amountCents is at most {MAX_TOP_UP_CENTS} (¥{}) per top-up",
            crate::domain::money::format_yuan(MAX_TOP_UP_CENTS)
        )));
    }
    let reference = crate::error::required_text(reference, 128, "reference")?;
    conn.transaction(async |conn| -> AppResult<Member> {
        let member: Member = members::table
            .find(member_id)
            .select(Member::as_select())
            .for_update()
            .get_result(conn)
            .await
            .optional()?
            .ok_or_else(|| AppError::NotFound(format!("member {member_id}")))?;
        let earlier: Option<i64> = wallet_ledger::table
            .filter(wallet_ledger::member_id.eq(member_id))
            .filter(wallet_ledger::kind.eq(WalletMoveKind::TopUp))
            .filter(wallet_ledger::reference.eq(reference))
            .select(wallet_ledger::balance_delta)
            .get_result(conn)
            .await
            .optional()?;
        match earlier {
            Some(amount) if amount == i64::from(amount_cents) => return Ok(member),
            Some(amount) => {
                return Err(AppError::Conflict(format!(
                    "reference {reference} was already used for a top-up of {amount} cents"
                )))
            }
            None => {}
        }
        let (store, held) = crate::prepaid::rules_and_holdings(conn, member.store_id, member_id, true, tz).await?;
        crate::prepaid::check_held(
            &store,
            held.as_ref(),
            crate::domain::prepaid::Adding::TopUp {
                amount_cents: i64::from(amount_cents),
            },
        )?;
        if member.balance_cents + member.frozen_cents + i64::from(amount_cents) > MAX_BALANCE_CENTS {
            return Err(AppError::bad(format!(
                "the wallet would hold more than ¥{} (it holds ¥{})",
                crate::domain::money::format_yuan(MAX_BALANCE_CENTS),
                crate::domain::money::format_yuan(member.balance_cents + member.frozen_cents)
            )));
        }
        wallet_move(
            conn,
            WalletMove {
                member_id,
                kind: WalletMoveKind::TopUp,
                balance_delta: i64::from(amount_cents),
                frozen_delta: 0,
                order_id: None,
                reference: Some(reference),
            },
            ctx,
        )
        .await?;
        Ok(members::table
            .find(member_id)
            .select(Member::as_select())
            .get_result(conn)
            .await?)
    })
    .await
}

/// One movement of a member's wallet as the desk reads it (`Member.walletEntries`).
#[derive(Debug, Clone, diesel::QueryableByName)]
pub struct WalletEntry {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub id: i64,
    #[diesel(sql_type = diesel::sql_types::Timestamptz)]
    pub created_at: chrono::DateTime<chrono::Utc>,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub kind: WalletMoveKind,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub balance_delta: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub frozen_delta: i64,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub reference: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub order_no: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub trace_id: String,
    /// the spendable balance (the money not frozen) after this movement
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub balance_after: i64,
}

impl WalletEntry {
    /// The movement's amount, signed as it changes the member's money: what a top-up, an
    /// unfreeze or a refund adds to the spendable balance, what a payment, a freeze or a fee
    /// takes from it; a capture (the frozen part of a MIXED order taken) takes the frozen money,
    /// leaving the spendable balance as it was.
    pub fn amount_cents(&self) -> i64 {
        match self.kind {
            WalletMoveKind::Capture => self.frozen_delta,
            WalletMoveKind::TopUp
            | WalletMoveKind::Pay
            | WalletMoveKind::Freeze
            | WalletMoveKind::Unfreeze
            | WalletMoveKind::Refund
            | WalletMoveKind::Fee => self.balance_delta,
        }
    }
}

/// A page of a member's wallet movements, newest first in write order: `first` rows after the
/// movement `after` (its id; `None`: from the newest).
pub async fn entries(
    conn: &mut AsyncPgConnection,
    member_id: i64,
    after: Option<i64>,
    first: i64,
) -> AppResult<Vec<WalletEntry>> {
    use diesel::sql_types::BigInt;
    Ok(crate::db::sql::StaticQuery::new(include_str!("wallet_entries.sql"))
        .bind::<BigInt, _>(member_id)
        .bind::<BigInt, _>(after.unwrap_or(0))
        .bind::<BigInt, _>(first)
        .load(conn)
        .await?)
}

/// How many movements a member's wallet has had.
pub async fn entry_count(conn: &mut AsyncPgConnection, member_id: i64) -> AppResult<i64> {
    Ok(wallet_ledger::table
        .filter(wallet_ledger::member_id.eq(member_id))
        .count()
        .get_result(conn)
        .await?)
}
