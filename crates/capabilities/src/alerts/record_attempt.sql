-- Records the outcome of attempt $6 + 1 of delivery $1, leased by worker $2, and its attempt
-- row, in one statement; nothing when the lease was lost (another worker took it over, or
-- the attempts moved on).
--
--   $1  delivery id                       bigint
--   $2  worker                            text
--   $3  status (SUCCEEDED, RETRYING,      text
--       DEAD)
--   $4  error                             text, NULL
--   $5  next attempt at                   timestamptz, NULL
--   $6  attempts before this one          integer
--   $7  duration (ms)                     integer
WITH u AS (
    UPDATE alert_deliveries
       SET status = $3, attempts = attempts + 1, last_error = $4, next_attempt_at = $5,
           locked_until = NULL, locked_by = NULL, updated_at = now(),
           delivered_at = CASE WHEN $3 = 'SUCCEEDED' THEN now() END
     WHERE id = $1 AND locked_by = $2 AND attempts = $6
    RETURNING id, channel)
INSERT INTO alert_attempts (delivery_id, channel, ok, error, duration_ms, worker)
SELECT id, channel, $3 = 'SUCCEEDED', $4, $7, $2 FROM u
