//! Payment callbacks: WeChat Pay API v3 and Alipay notifications, applied exactly once.
//!
//! The order of work for a payment notification: authenticate -> in one transaction, record the
//! raw callback, claim the idempotency key with a unique index and lock the order (one
//! statement) -> ask the state machine -> apply -> mark the outcome: the evidence, the business
//! change, its outbox rows, tickets and the callback's outcome commit together
//! ([`receive_and_apply`]); if the transaction fails the evidence is kept on its own with why.
//! A redelivery this process has processed, and every other notice, is recorded first in one
//! statement that also answers a duplicate ([`record_checked`]), then applied ([`apply`]).

pub mod closing;
pub mod trades;

// What a notification says, as the providers' clients (`crate::providers`) read it.
pub use crate::providers::provider::{evidence_header, evidence_text, Notice};

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde_json::json;

use crate::app::AppState;
use crate::db::models::Order;
use crate::db::schema::{payment_callbacks, payment_keys};
use crate::db::sql::StaticQuery;
use crate::domain::money::format_yuan;
use crate::domain::{Actor, Ctx, OrderStatus, PaymentMethod, Provider, TicketKind};
use crate::error::{AppError, AppResult};
use crate::orders::{self, PaymentApplied};
use crate::outbox::{self, Effect, RefundPayload};
use crate::providers::seen::Seen;
use crate::tickets::NewTicket;
use crate::trace::TraceId;

/// How a callback ended (the domain's word; `Outcome` here, where callbacks are applied).
pub use crate::domain::payment::CallbackOutcome as Outcome;

/// The raw evidence of one callback, as received.
pub struct Received<'a> {
    pub provider: Provider,
    pub verified: bool,
    pub event_type: Option<&'a str>,
    /// Decrypted where the provider encrypts.
    pub body: &'a str,
    pub headers: serde_json::Value,
    pub error: Option<&'a str>,
}

/// Writes the raw callback in a transaction of its own and returns its id.
pub async fn record(
    conn: &mut AsyncPgConnection,
    r: Received<'_>,
    outcome: Outcome,
    trace: &TraceId,
) -> AppResult<i64> {
    let id = diesel::insert_into(payment_callbacks::table)
        .values((
            payment_callbacks::provider.eq(r.provider),
            payment_callbacks::verified.eq(r.verified),
            payment_callbacks::outcome.eq(outcome),
            payment_callbacks::event_type.eq(r.event_type),
            payment_callbacks::body.eq(r.body),
            payment_callbacks::headers.eq(r.headers),
            payment_callbacks::error.eq(r.error),
            payment_callbacks::trace_id.eq(trace.as_str()),
        ))
        .returning(payment_callbacks::id)
        .get_result(conn)
        .await?;
    metrics::counter!("fitorder_callbacks_total", "provider" => r.provider.as_str(), "outcome" => outcome.as_str())
        .increment(u64::from(outcome != Outcome::Received));
    Ok(id)
}

/// Records a verified callback (its own transaction, as [`record`]) and, in the same statement,
/// tells whether its key was already processed: the common duplicate (a provider retrying a
/// notification we acknowledged) then costs one round trip and is fully recorded, with no
/// business transaction. A first delivery is recorded as RECEIVED and goes on to [`apply`],
/// whose key claim decides any race between first deliveries.
pub async fn record_checked(
    conn: &mut AsyncPgConnection,
    r: Received<'_>,
    notice: &Notice,
    trace: &TraceId,
) -> AppResult<(i64, bool)> {
    #[derive(diesel::QueryableByName)]
    struct Recorded {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        id: i64,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        duplicate: bool,
    }
    use diesel::sql_types::{Bool, Jsonb, Nullable, Text};
    let (txn, amount) = match notice {
        Notice::Paid {
            txn_id, amount_cents, ..
        } => (Some(txn_id.as_str()), Some(*amount_cents)),
        Notice::Refund {
            refund_id,
            amount_cents,
            ..
        } => (Some(refund_id.as_str()), Some(*amount_cents)),
        Notice::RefundConfirmed {
            trade_no,
            refunded_total_cents,
            ..
        } => (Some(trade_no.as_str()), Some(*refunded_total_cents)),
        Notice::Other { .. } => (None, None),
    };
    // `conn` comes from the evidence pool (asynchronous commit): see `db::evidence_pool`.
    let key = notice.key();
    let rec: Recorded = StaticQuery::new(include_str!("record_checked.sql"))
        .bind::<Text, _>(r.provider) // $1
        .bind::<Bool, _>(r.verified) // $2
        .bind::<Nullable<Text>, _>(r.event_type) // $3
        .bind::<Text, _>(r.body) // $4
        .bind::<Jsonb, _>(r.headers) // $5
        .bind::<Nullable<Text>, _>(r.error) // $6
        .bind::<Text, _>(trace.as_str()) // $7
        .bind::<Nullable<Text>, _>(txn) // $8
        .bind::<Nullable<Text>, _>(key.as_deref()) // $9
        .bind::<Nullable<Text>, _>(notice.out_trade_no()) // $10
        .bind::<Nullable<diesel::sql_types::BigInt>, _>(amount) // $11
        .get_result(conn)
        .await?;
    if rec.duplicate {
        metrics::counter!("fitorder_callbacks_total", "provider" => r.provider.as_str(), "outcome" => Outcome::Duplicate.as_str())
            .increment(1);
    }
    Ok((rec.id, rec.duplicate))
}

/// Applies a verified notice recorded as callback `callback_id`. Returns the outcome; an error
/// means nothing was applied and the provider should retry (5xx).
pub async fn apply(
    state: &AppState,
    provider: Provider,
    callback_id: i64,
    notice: Notice,
    trace: &TraceId,
) -> AppResult<Outcome> {
    let mut conn = state.pool.get().await?;
    let config = state.config.clone();
    let ctx = Ctx {
        actor: Actor::provider(provider),
        trace: trace.clone(),
    };
    let outcome = conn
        .transaction(async |conn| -> AppResult<Outcome> {
            let (outcome, order, key, txn, amount) = match &notice {
                Notice::Paid { out_trade_no, .. } => {
                    // Writes its own outcome.
                    let key = notice.key().expect("a payment has a key");
                    let paid = Paid::of(provider, &notice, &key).expect("a payment notice");
                    let locked = claim_and_lock(conn, &key, callback_id, out_trade_no).await?;
                    return apply_paid(conn, &config, &paid, callback_id, locked, &ctx, false)
                        .await
                        .map(|(outcome, _)| outcome);
                }
                Notice::Refund {
                    out_trade_no,
                    refund_no,
                    refund_id,
                    ok,
                    status,
                    amount_cents,
                } => {
                    let key = notice.key().expect("a refund has a key");
                    let order = orders::find_order(conn, out_trade_no).await?;
                    let outcome = if !claim_key(conn, &key, callback_id).await? {
                        Outcome::Duplicate
                    } else if *ok {
                        let confirmed = ConfirmedRefund {
                            config: &config,
                            provider,
                            out_trade_no,
                            refund_no,
                            trade_no: refund_id,
                            refunded_total_cents: *amount_cents,
                            trade_status: status,
                        };
                        confirmed.check_one(conn, order.as_ref(), &ctx).await?
                    } else {
                        crate::alerts::open_ticket(
                            conn,
                            &config,
                            NewTicket {
                                kind: TicketKind::RefundMismatch,
                                provider: Some(provider),
                                order: order.as_ref(),
                                order_no: Some(out_trade_no),
                                provider_txn_id: Some(refund_id),
                                local_amount_cents: None,
                                provider_amount_cents: Some(*amount_cents),
                                detail: json!({"source": "callback", "refundNo": refund_no, "refundStatus": status,
                                               "why": "the provider reports the refund did not go through"}),
                                finding_key: format!("REFUND_FAILED:{out_trade_no}:{refund_no}:{status}"),
                            },
                            &ctx.trace,
                        )
                        .await?;
                        Outcome::RefundFailed
                    };
                    (outcome, order, Some(key), Some(refund_id.clone()), Some(*amount_cents))
                }
                Notice::RefundConfirmed {
                    out_trade_no,
                    refund_no,
                    trade_no,
                    refunded_total_cents,
                    trade_status,
                } => {
                    let key = notice.key().expect("a refund has a key");
                    let order = orders::find_order(conn, out_trade_no).await?;
                    let outcome = if !claim_key(conn, &key, callback_id).await? {
                        Outcome::Duplicate
                    } else {
                        let confirmed = ConfirmedRefund {
                            config: &config,
                            provider,
                            out_trade_no,
                            refund_no,
                            trade_no,
                            refunded_total_cents: *refunded_total_cents,
                            trade_status,
                        };
                        confirmed.check(conn, order.as_ref(), &ctx).await?
                    };
                    (
                        outcome,
                        order,
                        Some(key),
                        Some(trade_no.clone()),
                        Some(*refunded_total_cents),
                    )
                }
                Notice::Other { out_trade_no, .. } => {
                    let order = match out_trade_no {
                        Some(no) => orders::find_order(conn, no).await?,
                        None => None,
                    };
                    (Outcome::Recorded, order, None, None, None)
                }
            };
            let row = OutcomeRow {
                callback_id,
                outcome,
                order: order.as_ref(),
                out_trade_no: notice.out_trade_no(),
                key: key.as_deref(),
                txn: txn.as_deref(),
                amount,
            };
            row.write(conn).await?;
            Ok(outcome)
        })
        .await;
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            note_unapplied(state, callback_id, &e).await;
            return Err(e);
        }
    };
    metrics::counter!("fitorder_callbacks_total", "provider" => provider.as_str(), "outcome" => outcome.as_str())
        .increment(1);
    if let Some(key) = notice.key() {
        remember_processed(state, &key);
    }
    Ok(outcome)
}

/// Whether this process saw the notice's key processed lately (applied, or found a duplicate;
/// `AppState::processed`). Such a notification is a redelivery, which [`record_checked`]
/// answers in one statement; any other payment goes to [`receive_and_apply`]. Only a hint on
/// which way is cheaper: the key's unique index decides either way, in every process.
pub fn processed_lately(state: &AppState, notice: &Notice) -> bool {
    notice
        .key()
        .is_some_and(|k| state.processed.contains(&Seen::digest(&[k.as_bytes()])))
}

fn remember_processed(state: &AppState, key: &str) {
    state.processed.insert(Seen::digest(&[key.as_bytes()]));
}

/// A payment notification not seen before, in one transaction: its evidence, the key's claim
/// and the order's lock as one statement (`receive_and_lock.sql`), then the payment as in
/// [`apply`] (its statement writes the outcome too), then the commit. Should the
/// transaction fail, the evidence is written on its own as RECEIVED with why (the provider
/// retries); a process killed mid-way leaves nothing but an unanswered notification, which the
/// provider sends again.
pub async fn receive_and_apply(
    state: &AppState,
    r: Received<'_>,
    notice: &Notice,
    trace: &TraceId,
) -> AppResult<Outcome> {
    let provider = r.provider;
    let key = notice.key().unwrap_or_default();
    let Some(paid) = Paid::of(provider, notice, &key) else {
        return Err(AppError::internal("receive_and_apply takes payment notices only"));
    };
    let config = state.config.clone();
    let ctx = Ctx {
        actor: Actor::provider(provider),
        trace: trace.clone(),
    };
    let applied = async {
        let mut conn = state.pool.get().await?;
        let (outcome, later) = conn
            .transaction(async |conn| -> AppResult<(Outcome, orders::Announcements)> {
                let (callback_id, locked) = receive_and_lock(conn, &r, trace, &paid).await?;
                apply_paid(conn, &config, &paid, callback_id, locked, &ctx, true).await
            })
            .await?;
        // Committed: now its announcements (`orders::apply_payment_announced_later`).
        if let Err(e) = later.send(&mut conn).await {
            tracing::warn!(error = %e.message(), "a payment's announcements were not sent; subscribers miss it, the outbox polls");
        }
        Ok::<_, AppError>(outcome)
    }
    .await;
    match applied {
        Ok(outcome) => {
            metrics::counter!("fitorder_callbacks_total", "provider" => provider.as_str(), "outcome" => outcome.as_str())
                .increment(1);
            remember_processed(state, &key);
            Ok(outcome)
        }
        Err(e) => {
            // The evidence went with the transaction: kept on its own, with why.
            let why = evidence_text(e.message().as_bytes(), Some(1024));
            let kept = async {
                let mut conn = state.evidence.get().await?;
                record(&mut conn, Received { error: Some(&why), ..r }, Outcome::Received, trace).await
            }
            .await;
            if let Err(not) = kept {
                tracing::warn!(error = %not.message(), "the evidence of a callback not applied is not recorded");
            }
            Err(e)
        }
    }
}

/// `receive_and_lock.sql`: the callback's id, whether it claimed the key, the order locked.
async fn receive_and_lock(
    conn: &mut AsyncPgConnection,
    r: &Received<'_>,
    trace: &TraceId,
    p: &Paid<'_>,
) -> AppResult<(i64, (bool, Option<Order>))> {
    use diesel::sql_types::{BigInt, Bool, Jsonb, Nullable, Text};
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = BigInt)]
        callback_id: i64,
        #[diesel(sql_type = Bool)]
        claimed: bool,
        #[diesel(embed)]
        order: Option<Order>,
    }
    let got: Row = StaticQuery::new(include_str!("receive_and_lock.sql"))
        .bind::<Text, _>(r.provider) // $1
        .bind::<Nullable<Text>, _>(r.event_type) // $2
        .bind::<Text, _>(r.body) // $3
        .bind::<Jsonb, _>(&r.headers) // $4
        .bind::<Text, _>(trace.as_str()) // $5
        .bind::<Text, _>(p.key) // $6
        .bind::<Text, _>(p.out_trade_no) // $7
        .bind::<Text, _>(p.txn_id) // $8
        .bind::<BigInt, _>(p.amount_cents) // $9
        .bind::<Bool, _>(r.verified) // $10
        .get_result(conn)
        .await?;
    Ok((got.callback_id, (got.claimed, got.order)))
}

/// How callback `callback_id` ended, with what it was about (`record_outcome.sql`), written in
/// the transaction that applied it (an applied payment's is written by its own statement,
/// `orders/pay.sql`).
struct OutcomeRow<'a> {
    callback_id: i64,
    outcome: Outcome,
    order: Option<&'a Order>,
    out_trade_no: Option<&'a str>,
    key: Option<&'a str>,
    txn: Option<&'a str>,
    amount: Option<i64>,
}

impl OutcomeRow<'_> {
    async fn write(&self, conn: &mut AsyncPgConnection) -> AppResult<()> {
        use diesel::sql_types::{BigInt, Nullable, Text};
        StaticQuery::new(include_str!("record_outcome.sql"))
            .bind::<BigInt, _>(self.callback_id) // $1
            .bind::<Text, _>(self.outcome) // $2
            .bind::<Nullable<BigInt>, _>(self.order.map(|o| o.id)) // $3
            .bind::<Nullable<Text>, _>(self.order.map(|o| o.order_no.as_str()).or(self.out_trade_no)) // $4
            .bind::<Nullable<BigInt>, _>(self.order.map(|o| o.store_id)) // $5
            .bind::<Nullable<Text>, _>(self.key) // $6
            .bind::<Nullable<Text>, _>(self.txn) // $7
            .bind::<Nullable<BigInt>, _>(self.amount) // $8
            .execute(conn)
            .await?;
        Ok(())
    }
}

/// Writes why a recorded callback could not be applied on its row, which stays RECEIVED (the
/// provider retries): the whole text, for the people who look into it; the provider is told
/// only to retry. Best effort: the log has it either way.
async fn note_unapplied(state: &AppState, callback_id: i64, e: &AppError) {
    let detail = evidence_text(e.message().as_bytes(), Some(1024));
    let noted = async {
        let mut conn = state.evidence.get().await?;
        diesel::update(
            payment_callbacks::table
                .find(callback_id)
                .filter(payment_callbacks::outcome.eq(Outcome::Received)),
        )
        .set(payment_callbacks::error.eq(&detail))
        .execute(&mut conn)
        .await?;
        Ok::<_, AppError>(())
    }
    .await;
    if let Err(not) = noted {
        tracing::warn!(callback_id, error = %not.message(), "why the callback was not applied is not recorded");
    }
}

/// Claims an idempotency key: true for the first claimant, false for every later one. The
/// unique index decides (a concurrent claimant waits for the first transaction to finish).
async fn claim_key(conn: &mut AsyncPgConnection, key: &str, callback_id: i64) -> AppResult<bool> {
    let claimed = diesel::insert_into(payment_keys::table)
        .values((payment_keys::key.eq(key), payment_keys::callback_id.eq(callback_id)))
        .on_conflict_do_nothing()
        .execute(conn)
        .await?;
    Ok(claimed == 1)
}

/// Claims a payment's key and locks its order in one statement (`claim_and_lock.sql`): whether
/// this callback claimed the key (false: a duplicate), and the order, locked, if it exists.
/// Claiming decides exactly as [`claim_key`]; locking as `orders::lock_order`.
async fn claim_and_lock(
    conn: &mut AsyncPgConnection,
    key: &str,
    callback_id: i64,
    out_trade_no: &str,
) -> AppResult<(bool, Option<Order>)> {
    use diesel::sql_types::{BigInt, Bool, Text};
    #[derive(diesel::QueryableByName)]
    struct Locked {
        #[diesel(embed)]
        order: Order,
        #[diesel(sql_type = Bool)]
        claimed: bool,
    }
    let locked: Option<Locked> = StaticQuery::new(include_str!("claim_and_lock.sql"))
        .bind::<Text, _>(key) // $1
        .bind::<BigInt, _>(callback_id) // $2
        .bind::<Text, _>(out_trade_no) // $3
        .get_result(conn)
        .await
        .optional()?;
    match locked {
        Some(l) => Ok((l.claimed, Some(l.order))),
        // No such order (rare): the statement's claim stands; whose it is tells.
        None => {
            let claimant: i64 = payment_keys::table
                .find(key)
                .select(payment_keys::callback_id)
                .get_result(conn)
                .await?;
            Ok((claimant == callback_id, None))
        }
    }
}

/// A refund the provider confirmed by our refund number, with the trade's refunded total.
struct ConfirmedRefund<'a> {
    /// Where a mismatch's alert goes.
    config: &'a crate::config::Config,
    provider: Provider,
    out_trade_no: &'a str,
    refund_no: &'a str,
    trade_no: &'a str,
    refunded_total_cents: i64,
    trade_status: &'a str,
}

/// Marks the PROVIDER_REFUND event of a refund the provider confirmed as done
/// (`refund_confirmed.sql`), in the caller's transaction.
async fn refund_done(
    conn: &mut AsyncPgConnection,
    provider: Provider,
    out_trade_no: &str,
    refund_no: &str,
) -> AppResult<()> {
    #[derive(diesel::QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        #[allow(dead_code)]
        n: i64,
    }
    use diesel::sql_types::Text;
    let _: N = StaticQuery::new(include_str!("refund_confirmed.sql"))
        .bind::<Text, _>(provider) // $1
        .bind::<Text, _>(out_trade_no) // $2
        .bind::<Text, _>(refund_no) // $3
        .bind::<Text, _>(format!("{provider} notification")) // $4
        .get_result(conn)
        .await?;
    Ok(())
}

#[derive(diesel::QueryableByName)]
struct Asked {
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    this_cents: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    all_cents: i64,
}

impl ConfirmedRefund<'_> {
    async fn asked(&self, conn: &mut AsyncPgConnection) -> AppResult<Asked> {
        Ok(StaticQuery::new(include_str!("refunds_asked.sql"))
            .bind::<diesel::sql_types::Text, _>(self.provider) // $1
            .bind::<diesel::sql_types::Text, _>(self.out_trade_no) // $2
            .bind::<diesel::sql_types::Text, _>(self.refund_no) // $3
            .get_result(conn)
            .await?)
    }

    /// A WeChat Pay `REFUND.SUCCESS`: `refunded_total_cents` is this refund's own amount. It
    /// must name a refund fitorder asked for, of that amount; then that refund is done.
    /// Otherwise a `REFUND_MISMATCH` ticket, once.
    async fn check_one(&self, conn: &mut AsyncPgConnection, order: Option<&Order>, ctx: &Ctx) -> AppResult<Outcome> {
        let asked = self.asked(conn).await?;
        let why = match asked.this_cents {
            None => "the provider confirms a refund fitorder never asked for".to_string(),
            Some(this) if this != self.refunded_total_cents => format!(
                "the provider reports refund {} of {}; fitorder asked for {}",
                self.refund_no,
                format_yuan(self.refunded_total_cents),
                format_yuan(this)
            ),
            Some(_) => {
                refund_done(conn, self.provider, self.out_trade_no, self.refund_no).await?;
                return Ok(Outcome::RefundRecorded);
            }
        };
        self.mismatch(conn, order, &asked, why, ctx).await
    }

    /// Matches the confirmation against the refunds fitorder asked this provider for on the
    /// order (its `PROVIDER_REFUND` events): it must name one of them, and the trade's refunded
    /// total must cover that refund and not exceed all of them together. Otherwise the money
    /// moved in a way the books do not explain: a `REFUND_MISMATCH` ticket, once.
    async fn check(&self, conn: &mut AsyncPgConnection, order: Option<&Order>, ctx: &Ctx) -> AppResult<Outcome> {
        let asked = self.asked(conn).await?;
        let why = match asked.this_cents {
            None => "the provider confirms a refund fitorder never asked for".to_string(),
            Some(this) if self.refunded_total_cents < this || self.refunded_total_cents > asked.all_cents => format!(
                "the provider reports {} refunded in all; fitorder asked for {} in this refund and {} in all",
                format_yuan(self.refunded_total_cents),
                format_yuan(this),
                format_yuan(asked.all_cents)
            ),
            Some(_) => {
                // The money moved: the refund is done, whatever its delivery was waiting for.
                refund_done(conn, self.provider, self.out_trade_no, self.refund_no).await?;
                return Ok(Outcome::RefundRecorded);
            }
        };
        self.mismatch(conn, order, &asked, why, ctx).await
    }

    async fn mismatch(
        &self,
        conn: &mut AsyncPgConnection,
        order: Option<&Order>,
        asked: &Asked,
        why: String,
        ctx: &Ctx,
    ) -> AppResult<Outcome> {
        crate::alerts::open_ticket(
            conn,
            self.config,
            NewTicket {
                kind: TicketKind::RefundMismatch,
                provider: Some(self.provider),
                order,
                order_no: Some(self.out_trade_no),
                provider_txn_id: Some(self.trade_no),
                local_amount_cents: asked.this_cents,
                provider_amount_cents: Some(self.refunded_total_cents),
                detail: json!({"source": "callback", "refundNo": self.refund_no, "tradeStatus": self.trade_status,
                               "refundedTotalCents": self.refunded_total_cents, "askedTotalCents": asked.all_cents,
                               "why": why}),
                finding_key: format!(
                    "REFUND_MISMATCH:callback:{}:{}:{}",
                    self.out_trade_no, self.refund_no, self.trade_status
                ),
            },
            &ctx.trace,
        )
        .await?;
        Ok(Outcome::RefundMismatch)
    }
}

/// A verified payment notice, and what makes it unique.
struct Paid<'a> {
    provider: Provider,
    out_trade_no: &'a str,
    txn_id: &'a str,
    amount_cents: i64,
    key: &'a str,
}

impl<'a> Paid<'a> {
    /// The payment a notice reports, if it reports one (`key`: the notice's).
    fn of(provider: Provider, notice: &'a Notice, key: &'a str) -> Option<Paid<'a>> {
        match notice {
            Notice::Paid {
                out_trade_no,
                txn_id,
                amount_cents,
            } => Some(Paid {
                provider,
                out_trade_no,
                txn_id,
                amount_cents: *amount_cents,
                key,
            }),
            _ => None,
        }
    }

    /// Opens the ticket of a payment that could not simply be applied (once per notice).
    async fn ticket(
        &self,
        conn: &mut AsyncPgConnection,
        config: &crate::config::Config,
        kind: TicketKind,
        order: Option<&Order>,
        mut detail: serde_json::Value,
        ctx: &Ctx,
    ) -> AppResult<()> {
        detail["source"] = json!("callback");
        crate::alerts::open_ticket(
            conn,
            config,
            NewTicket {
                kind,
                provider: Some(self.provider),
                order,
                order_no: Some(self.out_trade_no),
                provider_txn_id: Some(self.txn_id),
                local_amount_cents: order.map(|o| o.online_cents()),
                provider_amount_cents: Some(self.amount_cents),
                detail,
                finding_key: format!("{kind}:callback:{}", self.key),
            },
            &ctx.trace,
        )
        .await?;
        Ok(())
    }
}

/// Applies a payment notice whose key claim and order lock are `locked`, and writes the
/// callback's outcome (an applied payment's by the payment's own statement, `orders/pay.sql`).
async fn apply_paid(
    conn: &mut AsyncPgConnection,
    config: &crate::config::Config,
    p: &Paid<'_>,
    callback_id: i64,
    locked: (bool, Option<Order>),
    ctx: &Ctx,
    announce_later: bool,
) -> AppResult<(Outcome, orders::Announcements)> {
    let (outcome, order, later) = pay_or_ticket(conn, config, p, callback_id, locked, ctx, announce_later).await?;
    if outcome != Outcome::Applied {
        let row = OutcomeRow {
            callback_id,
            outcome,
            order: order.as_ref(),
            out_trade_no: Some(p.out_trade_no),
            key: Some(p.key),
            txn: Some(p.txn_id),
            amount: Some(p.amount_cents),
        };
        row.write(conn).await?;
    }
    Ok((outcome, later))
}

/// What a payment notice does to its locked order: the payment applied, a duplicate, or a
/// ticket for anything that is not a clean payment; and which outcome that is.
async fn pay_or_ticket(
    conn: &mut AsyncPgConnection,
    config: &crate::config::Config,
    p: &Paid<'_>,
    callback_id: i64,
    locked: (bool, Option<Order>),
    ctx: &Ctx,
    announce_later: bool,
) -> AppResult<(Outcome, Option<Order>, orders::Announcements)> {
    let none = orders::Announcements::default;
    let order = match locked {
        (false, order) => return Ok((Outcome::Duplicate, order, none())),
        (true, Some(order)) => order,
        (true, None) => {
            p.ticket(
                conn,
                config,
                TicketKind::UnknownOrder,
                None,
                json!({"why": "paid for an order fitorder does not know"}),
                ctx,
            )
            .await?;
            return Ok((Outcome::UnknownOrder, None, none()));
        }
    };
    match order.status {
        // Money through another provider than the order's (or for an order paid at the desk or
        // from the wallet): signed, so it moved, but not the payment the order waits for. Staff
        // decide (refund it, or mark the order paid); a canceled order's goes back as below.
        OrderStatus::WaitPay if order.online_provider != Some(p.provider) => {
            let why = json!({"status": order.status.as_str(), "paymentMethod": order.payment_method.as_str(),
                             "orderProvider": order.online_provider.map(|o| o.as_str()),
                             "why": format!("paid through {}, which is not how this order is paid", p.provider)});
            p.ticket(conn, config, TicketKind::AmountMismatch, Some(&order), why, ctx)
                .await?;
            Ok((Outcome::AmountMismatch, Some(order), none()))
        }
        // Only a payment that would be applied must match the amount; money for a canceled
        // order goes back whatever it was.
        OrderStatus::WaitPay if p.amount_cents != order.online_cents() => {
            let why = json!({"status": order.status.as_str(),
                             "why": "the provider collected another amount than the order asks"});
            p.ticket(conn, config, TicketKind::AmountMismatch, Some(&order), why, ctx)
                .await?;
            Ok((Outcome::AmountMismatch, Some(order), none()))
        }
        OrderStatus::WaitPay => {
            let payment = PaymentApplied {
                method: PaymentMethod::from(p.provider),
                idempotency_key: p.key.to_string(),
                provider_txn_id: Some(p.txn_id),
                reference: None,
                online_cents: p.amount_cents,
                callback_id: Some(callback_id),
            };
            let reason = format!("{} payment {}", p.provider, p.txn_id);
            let (paid, later) = if announce_later {
                orders::apply_payment_announced_later(conn, config, &order, payment, ctx, &reason).await?
            } else {
                (
                    orders::apply_payment(conn, config, &order, payment, ctx, &reason).await?,
                    none(),
                )
            };
            Ok((Outcome::Applied, Some(paid), later))
        }
        OrderStatus::Canceled => {
            // The order stays canceled; the money goes back to the payer.
            let detail = json!({"canceledAt": order.canceled_at, "cancelReason": order.cancel_reason,
                                "action": "refund to the payer queued as PROVIDER_REFUND"});
            p.ticket(conn, config, TicketKind::PaidAfterCancel, Some(&order), detail, ctx)
                .await?;
            let refund = Effect::ProviderRefund(RefundPayload {
                order: (&order).into(),
                provider: p.provider,
                refund_no: format!("PAC{callback_id}"),
                amount_cents: p.amount_cents,
                total_cents: p.amount_cents,
                provider_txn_id: Some(p.txn_id.to_string()),
                reason: "paid after the order was canceled".into(),
            });
            outbox::enqueue(conn, Some(order.id), &[refund], &ctx.trace, config.max_attempts).await?;
            Ok((Outcome::PaidAfterCancel, Some(order), none()))
        }
        other => {
            // Already paid (by another transaction), used or refunded: a second payment.
            let detail = json!({"status": other.as_str(), "firstTxnId": order.provider_txn_id,
                                "why": format!("payment {} arrived for an order that is {other}", p.txn_id)});
            p.ticket(conn, config, TicketKind::RejectedTransition, Some(&order), detail, ctx)
                .await?;
            Ok((Outcome::RejectedTransition, Some(order), none()))
        }
    }
}
