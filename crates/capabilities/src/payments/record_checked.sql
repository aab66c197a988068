-- Records a verified callback and tells, in the same statement, whether its idempotency key
-- was already processed: a duplicate is recorded whole as DUPLICATE (with its order) and costs
-- this one round trip; a first delivery is recorded as RECEIVED and goes on to be applied,
-- where claiming the key decides any race between first deliveries.
--
--   $1  provider                         text
--   $2  verified                         boolean
--   $3  event type                       text, NULL
--   $4  body                             text
--   $5  headers                          jsonb
--   $6  error (why the notice is not     text, NULL
--       readable)
--   $7  trace id                         text
--   $8  provider transaction id          text, NULL
--   $9  idempotency key                  text, NULL (a notice that changes nothing)
--   $10 out_trade_no (our order number)  text, NULL
--   $11 amount (cents)                   bigint, NULL
WITH seen AS (SELECT $9::text IS NOT NULL AND EXISTS (SELECT 1 FROM payment_keys WHERE key = $9) AS dup),
     o AS (SELECT id, store_id FROM orders WHERE order_no = $10)
INSERT INTO payment_callbacks (provider, verified, outcome, event_type, body, headers, error, trace_id,
                               idempotency_key, order_id, order_no, store_id, provider_txn_id, amount_cents)
SELECT $1, $2, CASE WHEN seen.dup THEN 'DUPLICATE' ELSE 'RECEIVED' END, $3, $4, $5, $6, $7,
       CASE WHEN seen.dup THEN $9 END, CASE WHEN seen.dup THEN (SELECT id FROM o) END, $10,
       CASE WHEN seen.dup THEN (SELECT store_id FROM o) END, $8, $11
  FROM seen
RETURNING id, outcome = 'DUPLICATE' AS duplicate
