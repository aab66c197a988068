//! The enqueue side of the transactional outbox: downstream [`Effect`]s written as
//! `compensation_events` rows in the transaction of the change that causes them, and announced
//! on commit. Used by orders, payments, tickets and alerts (one delivery per channel); it knows nothing of delivery, which is the
//! compensation worker's (`compensation`, above payments).

use diesel::prelude::*;
use diesel::sql_types::Text;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::db::models::Order;
use crate::db::schema::compensation_events as ce;
use crate::db::sql::{fitorder_announce, pg_notify, StaticQuery};
pub use crate::domain::effect::{AccessAction, AccessPayload, OrderRef, RefundPayload};
pub use crate::domain::Effect;
use crate::error::AppResult;
use crate::events::{Announced, OUTBOX_CHANNEL};
use crate::trace::TraceId;

/// Door and AI-device access for a paid order.
pub fn grants(order: &Order) -> [Effect; 2] {
    let p = access(order, AccessAction::Grant);
    [Effect::DoorAccessGrant(p.clone()), Effect::AiAccessGrant(p)]
}

/// Door and AI-device access taken away for a refunded order.
pub fn revokes(order: &Order) -> [Effect; 2] {
    let p = access(order, AccessAction::Revoke);
    [Effect::DoorAccessRevoke(p.clone()), Effect::AiAccessRevoke(p)]
}

fn access(order: &Order, action: AccessAction) -> AccessPayload {
    AccessPayload {
        order: order.into(),
        action,
        cause: None,
    }
}

/// Door and AI-device access granted or revoked for `member_id` on `order` because its card
/// changed (`cause`: the freeze, the transfer, the expiry; the events' keys carry it).
pub fn card_access(order: &Order, member_id: i64, action: AccessAction, cause: String) -> [Effect; 2] {
    let p = AccessPayload {
        order: OrderRef {
            order_no: order.order_no.clone(),
            member_id: member_id.to_string(),
            store_id: order.store_id.to_string(),
        },
        action,
        cause: Some(cause),
    };
    match action {
        AccessAction::Grant => [Effect::DoorAccessGrant(p.clone()), Effect::AiAccessGrant(p)],
        AccessAction::Revoke => [Effect::DoorAccessRevoke(p.clone()), Effect::AiAccessRevoke(p)],
    }
}

/// Effects as the outbox writes them: a kind, a payload and an idempotency key per event, the
/// arrays that `enqueue.sql` (and `orders/pay.sql`, which enqueues a payment's grants in its
/// one statement) take.
pub struct Encoded {
    pub kinds: Vec<&'static str>,
    pub payloads: Vec<serde_json::Value>,
    pub keys: Vec<String>,
}

pub fn encode(effects: &[Effect]) -> Encoded {
    Encoded {
        kinds: effects.iter().map(|e| e.kind().as_str()).collect(),
        payloads: effects.iter().map(Effect::payload_json).collect(),
        keys: effects.iter().map(Effect::idempotency_key).collect(),
    }
}

/// Writes `effects` about the order `order_id` (`None`: effects of no order, alert deliveries)
/// as due events and announces them on commit, in
/// one prepared statement (`enqueue.sql`). Each event's idempotency key is unique: the same
/// effect twice is refused.
pub async fn enqueue(
    conn: &mut AsyncPgConnection,
    order_id: Option<i64>,
    effects: &[Effect],
    trace: &TraceId,
    max_attempts: i32,
) -> AppResult<Vec<i64>> {
    let orders = vec![order_id; effects.len()];
    enqueue_of(conn, &orders, effects, trace, max_attempts).await
}

/// [`enqueue`] for effects of many orders at once (`order_ids[i]` is `effects[i]`'s): the
/// scheduler's batches of card changes.
pub async fn enqueue_of(
    conn: &mut AsyncPgConnection,
    order_ids: &[Option<i64>],
    effects: &[Effect],
    trace: &TraceId,
    max_attempts: i32,
) -> AppResult<Vec<i64>> {
    use diesel::sql_types::{Array, BigInt, Integer, Jsonb, Nullable};
    #[derive(diesel::QueryableByName)]
    struct Enqueued {
        #[diesel(sql_type = BigInt)]
        id: i64,
    }
    debug_assert_eq!(order_ids.len(), effects.len());
    if effects.is_empty() {
        return Ok(Vec::new());
    }
    let Encoded { kinds, payloads, keys } = encode(effects);
    let rows: Vec<Enqueued> = StaticQuery::new(include_str!("enqueue.sql"))
        .bind::<Array<Nullable<BigInt>>, _>(order_ids) // $1
        .bind::<Array<Text>, _>(&kinds) // $2
        .bind::<Array<Jsonb>, _>(&payloads) // $3
        .bind::<Array<Text>, _>(&keys) // $4
        .bind::<Integer, _>(max_attempts) // $5
        .bind::<Text, _>(trace.as_str()) // $6
        .bind::<Text, _>(OUTBOX_CHANNEL) // $7
        .load(conn)
        .await?;
    Ok(rows.into_iter().map(|r| r.id).collect())
}

/// Wakes the workers of every process and tells subscribers about each event; on commit.
pub async fn announce(conn: &mut AsyncPgConnection, event_ids: &[i64]) -> AppResult<()> {
    ce::table
        .filter(ce::id.eq_any(event_ids))
        .select((
            pg_notify(OUTBOX_CHANNEL, ""),
            fitorder_announce(Announced::Compensation.as_str(), ce::id),
        ))
        .execute(conn)
        .await?;
    Ok(())
}
