//! The deadline race: an order is canceled only once its trade is closed at the provider. A
//! close the provider refuses because the trade is not open any more (the member paid in the
//! meantime: WeChat `ORDERPAID`, Alipay `ACQ.TRADE_STATUS_ERROR` / `ACQ.TRADE_HAS_SUCCESS`) is
//! followed by a query, and a payment found then is applied: the order ends `PAID`, not
//! canceled and refunded as paid-after-cancel. Expiry and `cancelOrder` both close here.

use diesel::prelude::*;
use diesel_async::RunQueryDsl;
use serde_json::json;

use super::{Notice, Outcome, Received};
use crate::app::AppState;
use crate::auth::Viewer;
use crate::db::models::Order;
use crate::db::schema::payment_trades;
use crate::domain::{Ctx, OrderStatus, Provider};
use crate::error::{AppError, AppResult};
use crate::orders;
use crate::providers::api::{Closed, ProviderError, TradeState};
use crate::trace::TraceId;

/// How closing a trade ended.
#[derive(Debug)]
pub enum Closing {
    /// Closed at the provider (or never opened there): the order may be canceled.
    Closed,
    /// The provider says it was paid, and the payment was applied: the order is PAID.
    Paid,
    /// Paid at the provider, but the payment could not simply be applied (a ticket says why).
    NotApplied(Outcome),
    /// The member is paying right now (WeChat `USERPAYING`): ask again before canceling.
    Paying,
    /// No trustworthy answer: nothing is known about the trade.
    NoAnswer(ProviderError),
}

/// Closes `order_no`'s trade at `provider`; a refused close is followed by a query, and a
/// payment it finds is applied ([`apply_found_payment`]). No connection is held meanwhile.
pub async fn close_trade(state: &AppState, provider: Provider, order_no: &str, trace: &TraceId) -> Closing {
    match state.providers.close(provider, order_no, trace.as_str()).await {
        Ok(Closed::Closed) => Closing::Closed,
        Err(e) => Closing::NoAnswer(e),
        Ok(Closed::NotOpen) => match state.providers.query(provider, order_no, trace.as_str()).await {
            Ok(TradeState::Paid { txn_id, amount_cents }) => {
                let source = "trade query after the provider refused to close the trade";
                match apply_found_payment(state, provider, order_no, &txn_id, amount_cents, source, trace).await {
                    Ok(Outcome::Applied | Outcome::Duplicate) => {
                        tracing::info!(order_no, %provider, "the trade was paid while it was closed: payment applied");
                        Closing::Paid
                    }
                    Ok(other) => Closing::NotApplied(other),
                    Err(e) => Closing::NoAnswer(ProviderError::Unreachable(format!(
                        "the payment found could not be applied: {}",
                        e.message()
                    ))),
                }
            }
            // Not open and not paid: closed already (Alipay answers a closed trade the same way).
            Ok(TradeState::NotPaid) => Closing::Closed,
            Ok(TradeState::Paying) => Closing::Paying,
            Err(e) => Closing::NoAnswer(e),
        },
    }
}

/// Applies a payment the provider reported in a signed query answer, as its notification
/// would have been: the answer is kept as a verified `TRADE_QUERY` callback (`source` says
/// what asked), then applied under the payment's own idempotency key, so the notification
/// arriving later is a duplicate.
pub async fn apply_found_payment(
    state: &AppState,
    provider: Provider,
    order_no: &str,
    txn_id: &str,
    amount_cents: i64,
    source: &str,
    trace: &TraceId,
) -> AppResult<Outcome> {
    let body = json!({"source": source, "out_trade_no": order_no, "transaction_id": txn_id, "amount": amount_cents})
        .to_string();
    let callback_id = {
        let mut conn = state.pool.get().await?;
        super::record(
            &mut conn,
            Received {
                provider,
                verified: true,
                event_type: Some("TRADE_QUERY"),
                body: &body,
                headers: json!({}),
                error: None,
            },
            Outcome::Received,
            trace,
        )
        .await?
    };
    let notice = Notice::Paid {
        out_trade_no: order_no.to_string(),
        txn_id: txn_id.to_string(),
        amount_cents,
    };
    super::apply(state, provider, callback_id, notice, trace).await
}

/// `cancelOrder`: a waiting order with a trade at its provider is canceled only once the trade
/// is closed there. A trade found paid meanwhile pays the order, which is answered `PAID`; a
/// provider that cannot be asked leaves the order waiting (`PROVIDER_UNAVAILABLE`: try again).
pub async fn cancel_order(
    state: &AppState,
    viewer: &Viewer,
    order_no: &str,
    cancel_reason: &str,
    ctx: &Ctx,
) -> AppResult<Order> {
    let mut conn = state.pool.get().await?;
    let order = orders::find_order(&mut conn, order_no)
        .await?
        .filter(|o| orders::viewer_sees_order(viewer, o))
        .ok_or_else(|| AppError::NotFound(format!("order {order_no}")))?;
    let open_trade = match order.online_provider {
        Some(p) if order.status == OrderStatus::WaitPay && state.providers.configured(p) => {
            let trades: i64 = payment_trades::table
                .filter(payment_trades::order_id.eq(order.id))
                .count()
                .get_result(&mut conn)
                .await?;
            (trades > 0).then_some(p)
        }
        _ => None,
    };
    if let Some(provider) = open_trade {
        drop(conn);
        match close_trade(state, provider, order_no, &ctx.trace).await {
            Closing::Closed => {}
            Closing::Paid => {
                let mut conn = state.pool.get().await?;
                return orders::load_order_by_id(&mut conn, order.id).await;
            }
            Closing::NotApplied(outcome) => {
                return Err(AppError::Conflict(format!(
                    "order {order_no} was paid at {provider} meanwhile ({}); staff will look into it",
                    outcome.as_str()
                )))
            }
            Closing::Paying => {
                return Err(AppError::Conflict(format!(
                    "the member is paying order {order_no} at {provider} right now: try again in a moment"
                )))
            }
            Closing::NoAnswer(e) => {
                tracing::warn!(order_no, %provider, error = %e, "closing the trade failed; the order is not canceled");
                metrics::counter!("fitorder_provider_failures_total", "provider" => provider.as_str(), "call" => "close")
                    .increment(1);
                return Err(AppError::ProviderUnavailable(format!(
                    "{provider} could not be reached to close the trade; the order is kept, try cancelOrder again"
                )));
            }
        }
        conn = state.pool.get().await?;
    }
    orders::cancel_order(&mut conn, Some(viewer), order_no, cancel_reason, ctx).await
}
