-- Records a batch of successful deliveries ($1 ids, $2 the attempt counts the worker saw, $3
-- durations in ms, $4 who delivered): each event worker $5 still holds becomes SUCCEEDED, its
-- attempt is logged and it is announced, in one statement (and so atomically).
WITH c AS (SELECT * FROM unnest($1::bigint[], $2::int[], $3::int[], $4::text[]) AS c(id, attempts, ms, worker)),
done AS (
   UPDATE compensation_events e
      SET status = 'SUCCEEDED', attempts = e.attempts + 1, last_error = NULL, next_attempt_at = NULL,
          locked_until = NULL, locked_by = NULL, updated_at = now()
     FROM c WHERE e.id = c.id AND e.locked_by = $5 AND e.attempts = c.attempts
   RETURNING e.id
), logged AS (
   INSERT INTO compensation_attempts (event_id, ok, error, duration_ms, worker)
   SELECT c.id, true, NULL, c.ms, c.worker FROM c WHERE c.id IN (SELECT id FROM done)
)
SELECT count(fitorder_announce('comp', id)) FROM done
