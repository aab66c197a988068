//! What a run settles by itself before the findings are ticketed (bill payments applied, local
//! payments the bill lacks confirmed by the provider), each a `reconciliation_heals` row, and
//! the healed-versus-ticketed counts.

use chrono::{NaiveDate, Utc};
use diesel::sql_types::{BigInt, Text, Timestamptz};
use diesel_async::RunQueryDsl;

use crate::app::AppState;
use crate::db::sql::StaticQuery;
use crate::domain::{Provider, TicketKind};
use crate::error::AppResult;
use crate::trace::TraceId;

#[derive(diesel::QueryableByName)]
struct TextRow {
    #[diesel(sql_type = Text)]
    v: String,
}

#[derive(diesel::QueryableByName)]
struct Unbooked {
    #[diesel(sql_type = Text)]
    order_no: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    provider_txn_id: Option<String>,
    #[diesel(sql_type = BigInt)]
    amount_cents: i64,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    line: i32,
}

/// At most this many local payments missing from one bill are asked of the provider; the rest
/// become tickets.
const MAX_QUERIES: i64 = 500;

/// At most this many bill payments are settled by one run (memory stays bounded whatever the
/// bill holds); the rest become tickets, and a re-run settles the next ones.
const MAX_HEALS: i64 = 5_000;

/// Settles what is safe before the findings are ticketed, under the run's trace id:
/// - a bill payment for an order still `WAIT_PAY`, for its online amount, is applied as its
///   callback would have been (a recorded evidence row, then `payments::apply`, which moves the
///   order through the state machine and audits it);
/// - a bill payment for a canceled order goes the same way, where it is refunded as a
///   paid-after-cancel;
/// - a local payment missing from the bill is asked of the provider; a signed answer saying it
///   was paid, with the same transaction and amount, is no finding.
///
/// Returns the transaction ids confirmed that way (the missing-payment finding skips them).
/// Each healed item is a `reconciliation_heals` row.
pub(super) async fn heal(
    state: &AppState,
    run_id: i64,
    provider: Provider,
    date: NaiveDate,
    t0: chrono::DateTime<Utc>,
    t1: chrono::DateTime<Utc>,
    trace: &TraceId,
) -> AppResult<Vec<String>> {
    use crate::payments::{self, Notice, Outcome, Received};
    use futures_util::StreamExt;
    let mut conn = state.pool.get().await?;
    let unbooked: Vec<Unbooked> = StaticQuery::new(include_str!("sql/unbooked_payments.sql"))
        .bind::<BigInt, _>(run_id)
        .bind::<Text, _>(provider)
        .bind::<BigInt, _>(MAX_HEALS)
        .load(&mut conn)
        .await?;
    drop(conn);
    for u in unbooked {
        let txn = u.provider_txn_id.clone().unwrap_or_default();
        let body = serde_json::json!({"source": "reconciliation", "billDate": date.to_string(), "line": u.line,
                                      "out_trade_no": u.order_no, "transaction_id": txn, "amount": u.amount_cents})
        .to_string();
        let mut conn = state.pool.get().await?;
        let callback_id = payments::record(
            &mut conn,
            Received {
                provider,
                verified: true,
                event_type: Some("BILL"),
                body: &body,
                headers: serde_json::json!({}),
                error: None,
            },
            Outcome::Received,
            trace,
        )
        .await?;
        drop(conn);
        let notice = Notice::Paid {
            out_trade_no: u.order_no.clone(),
            txn_id: txn.clone(),
            amount_cents: u.amount_cents,
        };
        let action = match payments::apply(state, provider, callback_id, notice, trace).await {
            Ok(Outcome::Applied) => "SETTLED",
            Ok(Outcome::PaidAfterCancel) => "REFUNDED_PAID_AFTER_CANCEL",
            Ok(other) => {
                tracing::warn!(order_no = %u.order_no, outcome = other.as_str(), "bill payment not healed");
                continue;
            }
            Err(e) => {
                tracing::warn!(order_no = %u.order_no, error = %e.message(), "bill payment not healed");
                continue;
            }
        };
        tracing::info!(order_no = %u.order_no, action, "reconciliation healed a bill payment");
        record_heal(
            state,
            run_id,
            provider,
            date,
            TicketKind::ProviderPaidLocalUnpaid,
            action,
            &u.order_no,
            Some(&txn),
            trace,
        )
        .await?;
    }

    lost_orders(state, run_id, provider, date, trace).await?;

    // Local payments the bill lacks: asked of the provider.
    if !state.providers.configured(provider) {
        return Ok(vec![]);
    }
    let mut conn = state.pool.get().await?;
    let missing: Vec<Unbooked> = StaticQuery::new(include_str!("sql/missing_from_bill.sql"))
        .bind::<BigInt, _>(run_id)
        .bind::<Text, _>(provider)
        .bind::<Timestamptz, _>(t0)
        .bind::<Timestamptz, _>(t1)
        .bind::<BigInt, _>(MAX_QUERIES)
        .load(&mut conn)
        .await?;
    drop(conn);
    let answers: Vec<(Unbooked, bool)> = futures_util::stream::iter(missing)
        .map(|m| async move {
            let ok = match state.providers.query(provider, &m.order_no, trace.as_str()).await {
                Ok(crate::providers::provider::TradeState::Paid { txn_id, amount_cents }) => {
                    m.provider_txn_id.as_deref() == Some(txn_id.as_str()) && amount_cents == m.amount_cents
                }
                Ok(_) => false,
                Err(e) => {
                    tracing::warn!(order_no = %m.order_no, error = %e, "asking the provider about a payment missing from the bill");
                    false
                }
            };
            (m, ok)
        })
        .buffer_unordered(8)
        .collect()
        .await;
    // Confirmed by an earlier run of this day: no finding either.
    let mut confirmed: Vec<String> = StaticQuery::new(include_str!("sql/confirmed_by_query.sql"))
        .bind::<Text, _>(provider)
        .bind::<diesel::sql_types::Date, _>(date)
        .load::<TextRow>(&mut state.pool.get().await?)
        .await?
        .into_iter()
        .map(|r| r.v)
        .collect();
    for (m, ok) in answers {
        if ok {
            record_heal(
                state,
                run_id,
                provider,
                date,
                TicketKind::LocalPaidProviderMissing,
                "CONFIRMED_BY_QUERY",
                &m.order_no,
                m.provider_txn_id.as_deref(),
                trace,
            )
            .await?;
            confirmed.push(m.provider_txn_id.unwrap_or_default());
        }
    }
    Ok(confirmed)
}

/// The bill payments of orders a restore lost (`sql/lost_orders.sql`: numbers a timeline fence
/// wrote down, no order of that number) go back to the payer: nothing recoverable of the order
/// is in the trade (fitorder sends the provider the order number, a description and the amount:
/// not the member, the store or what was bought), and the member was never served by an order
/// the books no longer have. Each is one transaction: its `PROVIDER_REFUND` of no order (refund
/// number `RL<transaction>`, so the same payment is never refunded twice) and its heal row
/// `REFUNDED_LOST_ORDER`. The outbox sends it as any refund.
async fn lost_orders(
    state: &AppState,
    run_id: i64,
    provider: Provider,
    date: NaiveDate,
    trace: &TraceId,
) -> AppResult<()> {
    use crate::outbox::{self, Effect, OrderRef, RefundPayload};
    use diesel_async::AsyncConnection;
    let mut conn = state.pool.get().await?;
    let lost: Vec<Unbooked> = StaticQuery::new(include_str!("sql/lost_orders.sql"))
        .bind::<BigInt, _>(run_id)
        .bind::<Text, _>(provider)
        .bind::<BigInt, _>(MAX_HEALS)
        .load(&mut conn)
        .await?;
    let max_attempts = state.config.max_attempts;
    for u in lost {
        let Some(txn) = u.provider_txn_id.clone() else {
            continue;
        };
        let refund = Effect::ProviderRefund(RefundPayload {
            order: OrderRef {
                order_no: u.order_no.clone(),
                member_id: String::new(),
                store_id: String::new(),
            },
            provider,
            refund_no: format!("RL{txn}"),
            amount_cents: u.amount_cents,
            total_cents: u.amount_cents,
            provider_txn_id: Some(txn.clone()),
            reason: "paid for an order the database lost in a restore".into(),
        });
        let (order_no, heal_txn) = (u.order_no.clone(), txn.clone());
        conn.transaction(async |conn| -> AppResult<()> {
            outbox::enqueue(conn, None, std::slice::from_ref(&refund), trace, max_attempts).await?;
            StaticQuery::new(include_str!("sql/record_heal.sql"))
                .bind::<BigInt, _>(run_id)
                .bind::<Text, _>(provider)
                .bind::<diesel::sql_types::Date, _>(date)
                .bind::<Text, _>(TicketKind::ProviderPaidLocalUnpaid)
                .bind::<Text, _>(REFUNDED_LOST_ORDER)
                .bind::<Text, _>(&order_no)
                .bind::<diesel::sql_types::Nullable<Text>, _>(Some(&heal_txn))
                .bind::<Text, _>(trace.as_str())
                .execute(conn)
                .await?;
            Ok(())
        })
        .await?;
        tracing::warn!(order_no = %u.order_no, txn = %txn, amount_cents = u.amount_cents,
            "reconciliation refunds a payment whose order a restore lost");
    }
    Ok(())
}

/// The heal action of a payment whose order a restore lost, refunded.
pub const REFUNDED_LOST_ORDER: &str = "REFUNDED_LOST_ORDER";

#[allow(clippy::too_many_arguments)]
async fn record_heal(
    state: &AppState,
    run_id: i64,
    provider: Provider,
    date: NaiveDate,
    category: TicketKind,
    action: &str,
    order_no: &str,
    txn: Option<&str>,
    trace: &TraceId,
) -> AppResult<()> {
    let mut conn = state.pool.get().await?;
    StaticQuery::new(include_str!("sql/record_heal.sql"))
        .bind::<BigInt, _>(run_id)
        .bind::<Text, _>(provider)
        .bind::<diesel::sql_types::Date, _>(date)
        .bind::<Text, _>(category)
        .bind::<Text, _>(action)
        .bind::<Text, _>(order_no)
        .bind::<diesel::sql_types::Nullable<Text>, _>(txn)
        .bind::<Text, _>(trace.as_str())
        .execute(&mut conn)
        .await?;
    Ok(())
}

/// Per finding category in `[from, to)`: how many a reconciliation healed by itself, and how
/// many became tickets for a person; of `stores` only when given.
pub async fn healing(
    conn: &mut diesel_async::AsyncPgConnection,
    from: chrono::DateTime<Utc>,
    to: chrono::DateTime<Utc>,
    stores: Option<Vec<i64>>,
) -> AppResult<Vec<(TicketKind, i64, i64)>> {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        category: TicketKind,
        #[diesel(sql_type = BigInt)]
        healed: i64,
        #[diesel(sql_type = BigInt)]
        ticketed: i64,
    }
    let rows: Vec<Row> = StaticQuery::new(include_str!("sql/healing.sql"))
        .bind::<Timestamptz, _>(from)
        .bind::<Timestamptz, _>(to)
        .bind::<diesel::sql_types::Nullable<diesel::sql_types::Array<BigInt>>, _>(stores)
        .load(conn)
        .await?;
    Ok(rows.into_iter().map(|r| (r.category, r.healed, r.ticketed)).collect())
}
