-- DEAD deliveries (of alert $1, or all when NULL) go back to PENDING with $2 more attempts.
--
--   $1  alert id, or NULL     bigint
--   $2  more attempts         integer
UPDATE alert_deliveries SET status = 'PENDING', next_attempt_at = now(), max_attempts = attempts + $2,
       locked_until = NULL, locked_by = NULL, updated_at = now()
 WHERE status = 'DEAD' AND ($1::bigint IS NULL OR alert_id = $1)
