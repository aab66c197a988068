-- The compensation events of orders $1, oldest first, for the order's `compensation` list:
-- every column, but of the payload only `orderNo` (the one thing a CompensationEvent answers of
-- it; absent or not a string, it answers "" either way), so a page does not decode every
-- event's whole JSON.
SELECT id, order_id, kind, status, attempts, max_attempts, next_attempt_at, last_error,
       jsonb_build_object('orderNo', payload -> 'orderNo') AS payload,
       idempotency_key, trace_id, locked_until, locked_by, created_at, updated_at
  FROM compensation_events
 WHERE order_id = ANY($1)
 ORDER BY id
