-- One status change of one order, with its audit row and its announcement, in one statement:
-- a change without its audit row cannot exist, and subscribers hear of it on commit.
--
--   $1  order id                       bigint
--   $2  to status                      text
--   $3  from status (what the caller   text     the UPDATE matches only while the row is
--       locked and the state machine            still there; the trigger checks the pair
--       allowed)                                once more
--   $4  actor                          text
--   $5  reason                         text
--   $6  provider transaction id        text     NULL keeps the current one
--   $7  cancel reason                  text     set when moving to CANCELED
--   $8  refund amount (cents)          bigint   set when moving to REFUNDED
--   $9  sessions used now              integer  added to sessions_used
--   $10 trace id                       text
--
-- The columns are listed (not RETURNING *) so that a column added by a later migration does
-- not change the result of this statement, which each connection keeps prepared.
WITH moved AS (
    UPDATE orders SET
        status = $2,
        updated_at = now(),
        paid_at = CASE WHEN $2 = 'PAID' THEN now() ELSE paid_at END,
        expires_at = CASE WHEN $2 = 'PAID' THEN NULL ELSE expires_at END,
        provider_txn_id = COALESCE($6, provider_txn_id),
        canceled_at = CASE WHEN $2 = 'CANCELED' THEN now() ELSE canceled_at END,
        cancel_reason = CASE WHEN $2 = 'CANCELED' THEN $7 ELSE cancel_reason END,
        refunded_at = CASE WHEN $2 = 'REFUNDED' THEN now() ELSE refunded_at END,
        refund_amount_cents = CASE WHEN $2 = 'REFUNDED' THEN $8 ELSE refund_amount_cents END,
        sessions_used = sessions_used + $9
     WHERE id = $1 AND status = $3
    RETURNING id, order_no, member_id, store_id, kind, status, item_name, membership_plan_id,
              class_pack_id, coach_slot_id, plan_days, amount_cents, wallet_amount_cents,
              payment_method, online_provider, sessions_total, sessions_used, expires_at, created_at,
              paid_at, canceled_at, cancel_reason, refunded_at, refund_amount_cents, provider_txn_id,
              trace_id, idempotency_key, request_hash, updated_at
), audit AS (
    INSERT INTO order_transitions (order_id, from_status, to_status, actor, reason, trace_id)
    SELECT id, $3, $2, $4, $5, $10 FROM moved
    RETURNING id
)
SELECT moved.*
  FROM moved, (SELECT fitorder_announce('order', id) FROM audit) AS announced
