-- A payment notification's first step, in the transaction that applies it, as one statement:
-- its evidence row (RECEIVED, until the transaction writes how it ended), the claim of its
-- idempotency key and the lock of its order. The unique index on the key decides as in
-- `claim_and_lock.sql`: the first claimant inserts it, a later one (or a concurrent one, once
-- the first transaction has finished) does nothing and is a duplicate. The order is locked
-- (FOR UPDATE reads its newest committed version after any wait) and returned, NULL when there
-- is no such order. Should the transaction fail, the evidence goes with it and is written on
-- its own (`payments::record`).
--
--   $1  provider                         text
--   $2  event type                       text, NULL
--   $3  body                             text
--   $4  headers                          jsonb
--   $5  trace id                         text
--   $6  idempotency key                  text
--   $7  out_trade_no (our order number)  text
--   $8  provider transaction id          text
--   $9  amount (cents)                   bigint
--   $10 verified                         boolean (always true here: only authentic
--                                        notices are applied)
--
-- The columns are listed (not *) so that a column added by a later migration does not change
-- the result of this statement, which each connection keeps prepared.
WITH o AS (
    SELECT id, order_no, member_id, store_id, kind, status, item_name, membership_plan_id,
           class_pack_id, coach_slot_id, plan_days, amount_cents, wallet_amount_cents,
           payment_method, online_provider, sessions_total, sessions_used, expires_at, created_at,
           paid_at, canceled_at, cancel_reason, refunded_at, refund_amount_cents, provider_txn_id,
           trace_id, idempotency_key, request_hash, updated_at
      FROM orders
     WHERE order_no = $7
       FOR UPDATE
), cb AS (
    INSERT INTO payment_callbacks (provider, verified, outcome, event_type, body, headers, trace_id,
                                   idempotency_key, order_id, order_no, store_id, provider_txn_id, amount_cents)
    SELECT $1, $10, 'RECEIVED', $2, $3, $4, $5, $6, (SELECT id FROM o), $7, (SELECT store_id FROM o), $8, $9
    RETURNING id
), claimed AS (
    INSERT INTO payment_keys (key, callback_id) SELECT $6, id FROM cb
    ON CONFLICT DO NOTHING
    RETURNING key
)
SELECT cb.id AS callback_id, EXISTS (SELECT 1 FROM claimed) AS claimed, o.*
  FROM cb LEFT JOIN o ON true
