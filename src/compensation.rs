//! The transactional outbox: downstream effects written in the transaction of the change that
//! causes them. Delivery (the worker, retries, DEAD, replay) lives in the compensation worker.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::json;

use crate::db::models::Order;
use crate::db::schema::compensation_events as ce;
use crate::error::AppResult;
use crate::orders::Ctx;

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
    for kind in [
        CompensationKind::DoorAccessGrant,
        CompensationKind::AiAccessGrant,
    ] {
        enqueue_access(conn, order, kind, "GRANT", ctx, max_attempts).await?;
    }
    Ok(())
}

/// Revokes door and AI-device access for a refunded order.
pub async fn enqueue_revokes(
    conn: &mut AsyncPgConnection,
    order: &Order,
    ctx: &Ctx,
    max_attempts: i32,
) -> AppResult<()> {
    for kind in [
        CompensationKind::DoorAccessRevoke,
        CompensationKind::AiAccessRevoke,
    ] {
        enqueue_access(conn, order, kind, "REVOKE", ctx, max_attempts).await?;
    }
    Ok(())
}

async fn enqueue_access(
    conn: &mut AsyncPgConnection,
    order: &Order,
    kind: CompensationKind,
    action: &str,
    ctx: &Ctx,
    max_attempts: i32,
) -> AppResult<()> {
    let payload = json!({
        "orderNo": order.order_no,
        "memberId": order.member_id.to_string(),
        "storeId": order.store_id.to_string(),
        "action": action,
    });
    // One grant and one revoke per order and kind: the key doubles as the downstream's
    // idempotency key and as a guard against a second grant for the same order.
    let key = format!("{}:{}", order.order_no, kind.as_str());
    insert(conn, order.id, kind, payload, &key, ctx, max_attempts).await
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
    diesel::insert_into(ce::table)
        .values((
            ce::order_id.eq(order_id),
            ce::kind.eq(kind.as_str()),
            ce::max_attempts.eq(max_attempts),
            ce::payload.eq(payload),
            ce::idempotency_key.eq(key),
            ce::trace_id.eq(ctx.trace.as_str()),
        ))
        .execute(conn)
        .await?;
    // Wakes the workers of every process; delivered when this transaction commits.
    diesel::sql_query("SELECT pg_notify('fitorder_outbox', '')")
        .execute(conn)
        .await?;
    Ok(())
}
