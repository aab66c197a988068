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
        // The ledger trigger applies the movement to the member's balances, whose CHECKs
        // refuse going negative; the unique index makes a top-up reference count once.
        .on_violation(|v| match v {
            Violation::Check("wallet_balance_not_negative") => {
                Some(AppError::InsufficientFunds("wallet balance is too low".into()))
            }
            Violation::Check("wallet_frozen_not_negative") => {
                Some(AppError::Conflict("frozen wallet money was already released".into()))
            }
            Violation::Unique("wallet_ledger_top_up_reference") => {
                Some(AppError::Conflict("top-up reference already used".into()))
            }
            _ => None,
        })?;
    Ok(())
}

/// Adds money to a wallet. The reference (the desk's receipt number, the payment serial) makes
/// it idempotent: the same reference for the same member is applied once.
pub async fn top_up(
    conn: &mut AsyncPgConnection,
    member_id: i64,
    amount_cents: i32,
    reference: &str,
    ctx: &Ctx,
) -> AppResult<Member> {
    if amount_cents <= 0 {
        return Err(AppError::bad("amountCents must be positive"));
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
