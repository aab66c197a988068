//! Expiry: unpaid online orders (and OFFLINE orders a member placed) are canceled on time,
//! exactly once, with their seat or stock released and frozen wallet money unfrozen in the same
//! statement: the one writer of status changes, `orders::transition_all`, in its batch form.
//!
//! Two triggers, one effect. The precise one sleeps until the earliest `expires_at` of the
//! partial index (woken when an order is placed, on any instance); the fallback is the
//! scheduler's `order:expire` scan. Both call [`expire_due`]: before canceling, the provider is
//! asked whether the order was paid after all (a late or lost callback) and the payment is
//! applied instead; otherwise the trade is closed and the orders are canceled set-based, rows
//! another instance holds skipped — zero rows means someone else did it.

use std::time::Duration;

use chrono::Utc;
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use crate::app::AppState;
use crate::db::schema::{expiry_claims, orders};
use crate::db::sql::StaticQuery;
use crate::domain::{Actor, Ctx, OrderStatus, Provider};
use crate::error::AppResult;
use crate::payments;
use crate::payments::closing::{self, Closing};
use crate::providers::api::{ProviderApi, TradeState};
use crate::trace::TraceId;

/// Orders canceled per statement.
pub const BATCH: i64 = 1000;

#[derive(QueryableByName)]
struct Locked {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// Cancels due WAIT_PAY orders (all due ones, or only `ids`), releasing what they hold. Rows
/// locked by another instance are skipped, never waited for. Two statements in one transaction:
/// the due rows locked (`expiry/lock_due.sql`), then canceled together by the one writer of
/// status changes (`orders::transition_all`, `orders/transition.sql`), which writes their audit
/// rows, releases their seats or stock units, unfreezes their wallet money and announces them.
pub async fn cancel_expired(
    conn: &mut AsyncPgConnection,
    ids: Option<&[i64]>,
    limit: i64,
    trace: &TraceId,
) -> AppResult<i64> {
    let ctx = Ctx {
        actor: Actor::system("expiry"),
        trace: trace.clone(),
    };
    let n = conn
        .transaction(async |conn| -> AppResult<i64> {
            let locked: Vec<Locked> = StaticQuery::new(include_str!("expiry/lock_due.sql"))
                .bind::<diesel::sql_types::Nullable<Array<BigInt>>, _>(ids) // $1
                .bind::<BigInt, _>(limit) // $2
                .load(conn)
                .await?;
            let locked: Vec<i64> = locked.into_iter().map(|r| r.id).collect();
            let canceled = crate::orders::transition_all(
                conn,
                &locked,
                OrderStatus::WaitPay,
                OrderStatus::Canceled,
                &ctx,
                TIMEOUT,
                crate::orders::Changes {
                    cancel_reason: Some(TIMEOUT),
                    ..Default::default()
                },
            )
            .await?;
            Ok(canceled.len() as i64)
        })
        .await?;
    if n > 0 {
        metrics::counter!("fitorder_orders_expired_total").increment(n as u64);
        tracing::info!(canceled = n, "expired orders canceled");
    }
    Ok(n)
}

/// The reason (and cancel reason) of an order canceled at its deadline.
const TIMEOUT: &str = "TIMEOUT";

/// Due orders claimed per round: small, so that several instances share a long list.
const CLAIM_BATCH: i64 = 50;

/// Provider queries in flight at once, per instance.
const QUERY_CONCURRENCY: usize = 8;

#[derive(QueryableByName)]
struct Due {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    order_no: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    online_provider: Option<Provider>,
    #[diesel(sql_type = diesel::sql_types::Timestamptz)]
    expires_at: chrono::DateTime<Utc>,
}

/// Claims up to [`CLAIM_BATCH`] due orders whose provider can be asked, for `lease`: rows
/// another instance is claiming right now are skipped, claims that lapsed are taken over.
async fn claim_due(
    conn: &mut AsyncPgConnection,
    providers: &[Provider],
    lease: Duration,
    who: &str,
) -> AppResult<Vec<Due>> {
    Ok(StaticQuery::new(include_str!("expiry/claim_due.sql"))
        .bind::<Array<Text>, _>(providers) // $1
        .bind::<BigInt, _>(CLAIM_BATCH) // $2
        .bind::<diesel::sql_types::Interval, _>(diesel::data_types::PgInterval::from_microseconds(
            lease.as_micros() as i64
        )) // $3
        .bind::<Text, _>(who) // $4
        .load(conn)
        .await?)
}

/// Expires everything due now; returns how many orders were settled (canceled or found paid).
///
/// Orders whose provider is configured are claimed in small batches (one instance asks about
/// a trade at a time), asked with bounded concurrency while no connection is held, and the
/// unpaid ones canceled; the others are canceled set-based at once.
pub async fn expire_due(state: &AppState) -> AppResult<i64> {
    let api = &state.providers;
    let trace = TraceId::new();
    let who = format!("{}:{}", std::process::id(), trace.as_str());
    let asked: Vec<Provider> = Provider::ALL.into_iter().filter(|p| api.configured(*p)).collect();
    // Long enough for a batch of queries and closes, each bounded by the downstream timeout.
    let lease = state.config.downstream_timeout * 4 * (CLAIM_BATCH as u32 / QUERY_CONCURRENCY as u32 + 1)
        + Duration::from_secs(10);
    let mut total = 0;
    loop {
        let mut conn = state.pool.get().await?;
        let due = claim_due(&mut conn, &asked, lease, &who).await?;
        drop(conn);
        if due.is_empty() {
            break;
        }
        use futures_util::StreamExt;
        let claimed = due.len() as i64;
        let verdicts: Vec<(i64, Settle, chrono::DateTime<Utc>)> = futures_util::stream::iter(due)
            .map(|d| {
                let (state, api, trace) = (state.clone(), api.clone(), trace.clone());
                async move {
                    // Claimed orders are those of a provider asked here.
                    let verdict = match d.online_provider {
                        Some(provider) => settle_with_provider(&state, &api, provider, &d.order_no, &trace).await,
                        None => Settle::Cancel,
                    };
                    (d.id, verdict, d.expires_at)
                }
            })
            .buffer_unordered(QUERY_CONCURRENCY)
            .collect()
            .await;
        let mut cancel = vec![];
        for (id, verdict, expires_at) in verdicts {
            match verdict {
                Settle::Paid => total += 1,
                // Asked again once the claim lapses.
                Settle::Wait if Utc::now() - expires_at < USERPAYING_GRACE => {}
                Settle::Wait | Settle::Cancel => cancel.push(id),
            }
        }
        let mut conn = state.pool.get().await?;
        if !cancel.is_empty() {
            total += cancel_expired(&mut conn, Some(&cancel), BATCH, &trace).await?;
        }
        // Settled orders need no claim any more (a waiting one keeps its claim until it lapses).
        diesel::delete(
            expiry_claims::table.filter(
                expiry_claims::order_id.eq_any(
                    orders::table
                        .filter(orders::status.ne(OrderStatus::WaitPay))
                        .select(orders::id),
                ),
            ),
        )
        .execute(&mut conn)
        .await?;
        if claimed < CLAIM_BATCH {
            break;
        }
    }
    // Orders whose provider cannot be asked here: canceled at once, set-based.
    let mut conn = state.pool.get().await?;
    loop {
        let n = cancel_unasked(&mut conn, &asked, &trace).await?;
        total += n;
        if n < BATCH {
            return Ok(total);
        }
    }
}

/// Cancels due orders whose provider is not one of `asked`, and due OFFLINE orders a member
/// placed (WALLET orders and staff's OFFLINE orders have no deadline).
async fn cancel_unasked(conn: &mut AsyncPgConnection, asked: &[Provider], trace: &TraceId) -> AppResult<i64> {
    let ids: Vec<i64> = orders::table
        .filter(orders::status.eq(OrderStatus::WaitPay))
        .filter(orders::expires_at.le(Utc::now()))
        .filter(
            orders::online_provider
                .is_null()
                .or(orders::online_provider.ne_all(asked.to_vec())),
        )
        .order(orders::expires_at)
        .limit(BATCH)
        .select(orders::id)
        .load(conn)
        .await?;
    if ids.is_empty() {
        return Ok(0);
    }
    cancel_expired(conn, Some(&ids), BATCH, trace).await
}

/// How long past its deadline an order whose member is still paying (WeChat `USERPAYING`)
/// waits before it is canceled all the same.
const USERPAYING_GRACE: chrono::TimeDelta = chrono::TimeDelta::minutes(5);

/// What to do with one expiring order after asking its provider.
#[derive(Debug, PartialEq, Eq)]
enum Settle {
    /// It was paid after all; the payment was applied.
    Paid,
    /// The member is paying right now: ask again before canceling.
    Wait,
    Cancel,
}

/// Asks the provider about one expiring order. Only a signed answer counts: an order the
/// provider says is unpaid is closed there and canceled — unless the close finds that the
/// member paid meanwhile, when the payment is applied instead (`payments::closing`); with no
/// (or no trustworthy) answer it is canceled without closing — the trade carries the same
/// deadline, so the provider refuses payment after it, and a payment that still arrives is
/// handled as paid-after-cancel.
async fn settle_with_provider(
    state: &AppState,
    api: &ProviderApi,
    provider: Provider,
    order_no: &str,
    trace: &TraceId,
) -> Settle {
    match api.query(provider, order_no, trace.as_str()).await {
        Ok(TradeState::Paid { txn_id, amount_cents }) => {
            let source = "trade query at expiry";
            match closing::apply_found_payment(state, provider, order_no, &txn_id, amount_cents, source, trace).await {
                Ok(payments::Outcome::Applied) => {
                    tracing::info!(order_no, "expiring order was paid: late payment applied");
                    Settle::Paid
                }
                Ok(other) => {
                    tracing::warn!(
                        order_no,
                        outcome = other.as_str(),
                        "expiring order: provider payment not applied"
                    );
                    Settle::Cancel
                }
                Err(e) => {
                    tracing::warn!(order_no, error = %e.message(), "expiring order: applying the found payment failed");
                    Settle::Cancel
                }
            }
        }
        Ok(TradeState::NotPaid) => match closing::close_trade(state, provider, order_no, trace).await {
            Closing::Closed => Settle::Cancel,
            Closing::Paid => Settle::Paid,
            Closing::Paying => Settle::Wait,
            Closing::NotApplied(outcome) => {
                tracing::warn!(
                    order_no,
                    outcome = outcome.as_str(),
                    "expiring order: paid during the close, payment not applied"
                );
                Settle::Cancel
            }
            Closing::NoAnswer(e) => {
                tracing::warn!(order_no, error = %e, "closing the trade failed; canceling anyway");
                Settle::Cancel
            }
        },
        Ok(TradeState::Paying) => Settle::Wait,
        Err(e) => {
            tracing::warn!(order_no, error = %e, "no trustworthy answer to the trade query; canceling anyway");
            Settle::Cancel
        }
    }
}

/// The precise trigger: sleeps until the earliest deadline, wakes when orders are placed.
pub async fn run_timer(state: AppState, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let wake = state.events.expiry.clone();
    loop {
        if *shutdown.borrow() {
            return;
        }
        let notified = wake.notified();
        let wait = match next_deadline(&state).await {
            Ok(Some(t)) if t <= Utc::now() => {
                match expire_due(&state).await {
                    Err(e) => {
                        tracing::warn!(error = %e.message(), "expiry failed; retrying shortly");
                        Duration::from_secs(1)
                    }
                    // Only orders whose members are still paying are due: ask again shortly.
                    Ok(0) => Duration::from_secs(5),
                    Ok(_) => Duration::ZERO,
                }
            }
            Ok(Some(t)) => (t - Utc::now())
                .to_std()
                .unwrap_or_default()
                .min(Duration::from_secs(30)),
            Ok(None) => Duration::from_secs(30),
            Err(_) => Duration::from_secs(1),
        };
        if wait.is_zero() {
            continue;
        }
        tokio::select! {
            _ = notified => {},
            _ = tokio::time::sleep(wait) => {},
            _ = shutdown.changed() => {},
        }
    }
}

async fn next_deadline(state: &AppState) -> AppResult<Option<chrono::DateTime<Utc>>> {
    let mut conn = state.pool.get().await?;
    Ok(orders::table
        .filter(orders::status.eq(OrderStatus::WaitPay))
        .filter(orders::expires_at.is_not_null())
        .select(diesel::dsl::min(orders::expires_at))
        .get_result(&mut conn)
        .await?)
}
