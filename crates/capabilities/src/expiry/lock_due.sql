-- Locks due WAIT_PAY orders for canceling (all due ones when $1 is NULL, else only those of $1),
-- at most $2, earliest deadline first. Rows another instance holds are skipped, never waited for
-- (none left: someone else is canceling them). The caller cancels what it locked, in the same
-- transaction, through `orders/transition.sql`.
--
--   $1  order ids, or NULL for every due order   bigint[]
--   $2  at most this many                        bigint
SELECT id FROM orders
 WHERE status = 'WAIT_PAY' AND expires_at IS NOT NULL AND expires_at <= now()
   AND ($1::bigint[] IS NULL OR id = ANY($1))
 ORDER BY expires_at
 LIMIT $2
   FOR UPDATE SKIP LOCKED
