-- A refund provider $1 confirmed for order $2, refund $3 (a signed notification, `$4` names
-- it): its PROVIDER_REFUND event is done, whatever its delivery was doing (waiting to ask a
-- refund still processing again, retrying, DEAD). The attempt is logged and announced.
--
--   $1  provider        text
--   $2  order number    text
--   $3  refund number   text
--   $4  who confirmed   text
WITH done AS (
   UPDATE compensation_events e
      SET status = 'SUCCEEDED', attempts = e.attempts + 1, last_error = NULL, next_attempt_at = NULL,
          locked_until = NULL, locked_by = NULL, updated_at = now()
    WHERE e.kind = 'PROVIDER_REFUND' AND e.payload->>'provider' = $1 AND e.payload->>'orderNo' = $2
      AND e.payload->>'refundNo' = $3 AND e.status <> 'SUCCEEDED'
   RETURNING e.id
), logged AS (
   INSERT INTO compensation_attempts (event_id, ok, error, duration_ms, worker)
   SELECT id, true, NULL, 0, $4 FROM done
)
SELECT count(fitorder_announce('comp', id))::bigint AS n FROM done
