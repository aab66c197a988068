-- Claims a payment's idempotency key and locks its order for the rest of the transaction, in
-- one statement. The unique index on the key decides: the first claimant inserts it, a later
-- one (or a concurrent one, once the first transaction has finished) does nothing and is a
-- duplicate. The order is locked either way (FOR UPDATE reads its newest committed version
-- after any wait), and returned with whether this callback claimed the key. No row: no such
-- order (whether the key was claimed is then read from `payment_keys`).
--
--   $1  idempotency key                text
--   $2  callback id                    bigint
--   $3  out_trade_no (our order no.)   text
--
-- The columns are listed (not *) so that a column added by a later migration does not change
-- the result of this statement, which each connection keeps prepared.
WITH claimed AS (
    INSERT INTO payment_keys (key, callback_id) VALUES ($1, $2)
    ON CONFLICT DO NOTHING
    RETURNING key
)
SELECT id, order_no, member_id, store_id, kind, status, item_name, membership_plan_id,
       class_pack_id, coach_slot_id, plan_days, amount_cents, wallet_amount_cents,
       payment_method, online_provider, sessions_total, sessions_used, expires_at, created_at,
       paid_at, canceled_at, cancel_reason, refunded_at, refund_amount_cents, provider_txn_id,
       trace_id, idempotency_key, request_hash, updated_at,
       EXISTS (SELECT 1 FROM claimed) AS claimed
  FROM orders
 WHERE order_no = $3
   FOR UPDATE
