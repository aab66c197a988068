//! The transactional outbox: downstream effects written in the transaction of the change that
//! causes them, delivered by [`worker`] (retries with backoff, DEAD, replay).

pub mod downstream;
pub mod worker;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde_json::json;

use crate::db::models::CompensationEvent;
use crate::db::models::Order;
use crate::db::schema::compensation_events as ce;
use crate::domain::Ctx;
use crate::error::{AppError, AppResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, async_graphql::Enum)]
#[graphql(rename_items = "SCREAMING_SNAKE_CASE")]
pub enum CompensationKind {
    DoorAccessGrant,
    DoorAccessRevoke,
    AiAccessGrant,
    AiAccessRevoke,
    ProviderRefund,
}

impl CompensationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CompensationKind::DoorAccessGrant => "DOOR_ACCESS_GRANT",
            CompensationKind::DoorAccessRevoke => "DOOR_ACCESS_REVOKE",
            CompensationKind::AiAccessGrant => "AI_ACCESS_GRANT",
            CompensationKind::AiAccessRevoke => "AI_ACCESS_REVOKE",
            CompensationKind::ProviderRefund => "PROVIDER_REFUND",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [
            CompensationKind::DoorAccessGrant,
            CompensationKind::DoorAccessRevoke,
            CompensationKind::AiAccessGrant,
            CompensationKind::AiAccessRevoke,
            CompensationKind::ProviderRefund,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, async_graphql::Enum)]
#[graphql(rename_items = "SCREAMING_SNAKE_CASE")]
pub enum CompensationStatus {
    Pending,
    Retrying,
    Succeeded,
    Dead,
}

impl CompensationStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CompensationStatus::Pending => "PENDING",
            CompensationStatus::Retrying => "RETRYING",
            CompensationStatus::Succeeded => "SUCCEEDED",
            CompensationStatus::Dead => "DEAD",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [
            CompensationStatus::Pending,
            CompensationStatus::Retrying,
            CompensationStatus::Succeeded,
            CompensationStatus::Dead,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// Grants door and AI-device access for a paid order.
pub async fn enqueue_grants(
    conn: &mut AsyncPgConnection,
    order: &Order,
    ctx: &Ctx,
    max_attempts: i32,
) -> AppResult<()> {
    enqueue_access(conn, order, "GRANT", ctx, max_attempts).await
}

/// Revokes door and AI-device access for a refunded order.
pub async fn enqueue_revokes(
    conn: &mut AsyncPgConnection,
    order: &Order,
    ctx: &Ctx,
    max_attempts: i32,
) -> AppResult<()> {
    enqueue_access(conn, order, "REVOKE", ctx, max_attempts).await
}

/// The door and the AI-device event of one action, written in one statement.
async fn enqueue_access(
    conn: &mut AsyncPgConnection,
    order: &Order,
    action: &str,
    ctx: &Ctx,
    max_attempts: i32,
) -> AppResult<()> {
    let kinds = match action {
        "GRANT" => [CompensationKind::DoorAccessGrant, CompensationKind::AiAccessGrant],
        _ => [CompensationKind::DoorAccessRevoke, CompensationKind::AiAccessRevoke],
    };
    let payload = json!({
        "orderNo": order.order_no,
        "memberId": order.member_id.to_string(),
        "storeId": order.store_id.to_string(),
        "action": action,
    });
    // One grant and one revoke per order and kind: the key doubles as the downstream's
    // idempotency key and as a guard against a second grant for the same order.
    let rows: Vec<_> = kinds
        .iter()
        .map(|kind| {
            (
                ce::order_id.eq(order.id),
                ce::kind.eq(kind.as_str()),
                ce::max_attempts.eq(max_attempts),
                ce::payload.eq(payload.clone()),
                ce::idempotency_key.eq(format!("{}:{}", order.order_no, kind.as_str())),
                ce::trace_id.eq(ctx.trace.as_str()),
            )
        })
        .collect();
    let ids: Vec<i64> = diesel::insert_into(ce::table)
        .values(rows)
        .returning(ce::id)
        .get_results(conn)
        .await?;
    announce_all(conn, &ids).await
}

/// Sends online money back to the payer through the provider's refund API.
#[allow(clippy::too_many_arguments)]
pub async fn enqueue_provider_refund(
    conn: &mut AsyncPgConnection,
    order: &Order,
    provider: &str,
    refund_no: &str,
    amount_cents: i64,
    total_cents: i64,
    provider_txn_id: Option<&str>,
    reason: &str,
    ctx: &Ctx,
    max_attempts: i32,
) -> AppResult<()> {
    let payload = json!({
        "orderNo": order.order_no,
        "memberId": order.member_id.to_string(),
        "storeId": order.store_id.to_string(),
        "provider": provider,
        "refundNo": refund_no,
        "amountCents": amount_cents,
        "totalCents": total_cents,
        "providerTxnId": provider_txn_id,
        "reason": reason,
    });
    let key = format!("{}:PROVIDER_REFUND:{}", order.order_no, refund_no);
    insert(
        conn,
        order.id,
        CompensationKind::ProviderRefund,
        payload,
        &key,
        ctx,
        max_attempts,
    )
    .await
}

async fn insert(
    conn: &mut AsyncPgConnection,
    order_id: i64,
    kind: CompensationKind,
    payload: serde_json::Value,
    key: &str,
    ctx: &Ctx,
    max_attempts: i32,
) -> AppResult<()> {
    let id: i64 = diesel::insert_into(ce::table)
        .values((
            ce::order_id.eq(order_id),
            ce::kind.eq(kind.as_str()),
            ce::max_attempts.eq(max_attempts),
            ce::payload.eq(payload),
            ce::idempotency_key.eq(key),
            ce::trace_id.eq(ctx.trace.as_str()),
        ))
        .returning(ce::id)
        .get_result(conn)
        .await?;
    announce(conn, id).await
}

/// Wakes the workers of every process and tells subscribers about each event; on commit.
pub async fn announce_all(conn: &mut AsyncPgConnection, event_ids: &[i64]) -> AppResult<()> {
    diesel::sql_query(
        "SELECT pg_notify('fitorder_outbox', ''), pg_notify('fitorder_events', 'comp:' || id::text) FROM unnest($1) AS id",
    )
    .bind::<diesel::sql_types::Array<diesel::sql_types::BigInt>, _>(event_ids)
    .execute(conn)
    .await?;
    Ok(())
}

/// Wakes the workers of every process and tells subscribers; delivered on commit.
pub async fn announce(conn: &mut AsyncPgConnection, event_id: i64) -> AppResult<()> {
    diesel::sql_query("SELECT pg_notify('fitorder_outbox', ''), pg_notify('fitorder_events', 'comp:' || $1::text)")
        .bind::<diesel::sql_types::BigInt, _>(event_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// DEAD -> PENDING: the event is due now, with a fresh allowance of attempts (the count goes
/// on, so the log shows the whole history). Who asked is recorded.
pub async fn replay(
    conn: &mut AsyncPgConnection,
    event_id: i64,
    ctx: &Ctx,
    more_attempts: i32,
) -> AppResult<CompensationEvent> {
    use crate::db::schema::compensation_replays as cr;
    conn.transaction(async |conn| -> AppResult<CompensationEvent> {
        let event: CompensationEvent = ce::table
            .find(event_id)
            .select(CompensationEvent::as_select())
            .for_update()
            .get_result(conn)
            .await
            .optional()?
            .ok_or_else(|| AppError::NotFound(format!("compensation event {event_id}")))?;
        if event.status != "DEAD" {
            return Err(AppError::Conflict(format!(
                "only DEAD events are replayed; event {event_id} is {}",
                event.status
            )));
        }
        let replayed: CompensationEvent = diesel::update(ce::table.find(event_id))
            .set((
                ce::status.eq("PENDING"),
                ce::next_attempt_at.eq(diesel::dsl::now),
                ce::max_attempts.eq(event.attempts + more_attempts),
                ce::locked_until.eq(None::<chrono::DateTime<chrono::Utc>>),
                ce::locked_by.eq(None::<String>),
                ce::updated_at.eq(diesel::dsl::now),
            ))
            .returning(CompensationEvent::as_returning())
            .get_result(conn)
            .await?;
        diesel::insert_into(cr::table)
            .values((
                cr::event_id.eq(event_id),
                cr::actor.eq(ctx.actor.to_string()),
                cr::trace_id.eq(ctx.trace.as_str()),
            ))
            .execute(conn)
            .await?;
        announce(conn, event_id).await?;
        Ok(replayed)
    })
    .await
}

/// [`replay`] for a staff member: an event of an order outside their stores is answered as not
/// found, like one that does not exist.
pub async fn replay_seen_by(
    conn: &mut AsyncPgConnection,
    viewer: &crate::auth::Viewer,
    event_id: i64,
    ctx: &Ctx,
    more_attempts: i32,
) -> AppResult<CompensationEvent> {
    use crate::db::schema::orders;
    let order_store: Option<i64> = ce::table
        .inner_join(orders::table)
        .filter(ce::id.eq(event_id))
        .select(orders::store_id)
        .get_result(conn)
        .await
        .optional()?;
    match order_store {
        Some(s) if viewer.sees_store(s) => replay(conn, event_id, ctx, more_attempts).await,
        _ => Err(AppError::NotFound(format!("compensation event {event_id}"))),
    }
}

/// The most DEAD events one `replayDeadCompensations` call replays (each in a transaction of
/// its own): a call answers in bounded time however many died; the caller calls again until
/// the answer is 0.
pub const REPLAY_BATCH: i64 = 500;

/// Replays DEAD events (of one order, or of all), the oldest [`REPLAY_BATCH`]; returns how many.
pub async fn replay_dead(
    conn: &mut AsyncPgConnection,
    order_id: Option<i64>,
    stores: Option<&[i64]>,
    ctx: &Ctx,
    more_attempts: i32,
) -> AppResult<i32> {
    use crate::db::schema::orders;
    let mut q = ce::table.filter(ce::status.eq("DEAD")).select(ce::id).into_boxed();
    if let Some(id) = order_id {
        q = q.filter(ce::order_id.eq(id));
    }
    if let Some(stores) = stores {
        q = q.filter(
            ce::order_id.eq_any(
                orders::table
                    .filter(orders::store_id.eq_any(stores.to_vec()))
                    .select(orders::id),
            ),
        );
    }
    let ids: Vec<i64> = q.order(ce::id).limit(REPLAY_BATCH).load(conn).await?;
    let mut n = 0;
    for id in ids {
        match replay(conn, id, ctx, more_attempts).await {
            Ok(_) => n += 1,
            // Replayed by someone else in the meantime.
            Err(AppError::Conflict(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
