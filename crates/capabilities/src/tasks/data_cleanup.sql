-- Prunes what is safe to prune, never anything an open ticket's order needs: idempotency keys
-- older than $1 days, delivered (SUCCEEDED) outbox events older than $2 days (at most $3 a run;
-- never refunds, which are the money's evidence, nor events replayed by hand) with their
-- attempts, successful attempts older than $4 days, unverified callbacks older than $5 days or
-- beyond the newest $6, task runs older than $7 days. Returns how many rows went.
--
--   $1  key retention (days)              bigint
--   $2  outbox retention (days)           bigint
--   $3  outbox events per run             bigint
--   $4  attempt retention (days)          bigint
--   $5  unverified callbacks (days)       bigint
--   $6  unverified callbacks kept         bigint
--   $7  task run retention (days)         bigint
WITH open_orders AS (
    SELECT order_id FROM exception_tickets WHERE status IN ('OPEN', 'IN_PROGRESS') AND order_id IS NOT NULL
), keys AS (
    DELETE FROM payment_keys k USING payment_callbacks c
     WHERE k.callback_id = c.id AND k.created_at < now() - make_interval(days => $1::int)
       AND (c.order_id IS NULL OR c.order_id NOT IN (SELECT order_id FROM open_orders))
    RETURNING 1
), delivered AS (
    SELECT e.id FROM compensation_events e
     WHERE e.status = 'SUCCEEDED' AND e.updated_at < now() - make_interval(days => $2::int)
       AND e.kind <> 'PROVIDER_REFUND'
       AND (e.order_id IS NULL OR e.order_id NOT IN (SELECT order_id FROM open_orders))
       AND NOT EXISTS (SELECT 1 FROM compensation_replays r WHERE r.event_id = e.id)
     ORDER BY e.updated_at
     LIMIT $3
), attempts AS (
    DELETE FROM compensation_attempts a USING compensation_events e
     WHERE a.event_id = e.id AND a.ok AND e.status = 'SUCCEEDED'
       AND a.at < now() - make_interval(days => $4::int)
       AND (e.order_id IS NULL OR e.order_id NOT IN (SELECT order_id FROM open_orders))
       AND e.id NOT IN (SELECT id FROM delivered)
    RETURNING 1
), delivered_attempts AS (
    DELETE FROM compensation_attempts a WHERE a.event_id IN (SELECT id FROM delivered)
    RETURNING 1
), events AS (
    -- With their attempts: the foreign key is checked at the end of the statement.
    DELETE FROM compensation_events e WHERE e.id IN (SELECT id FROM delivered)
    RETURNING 1
), unverified AS (
    DELETE FROM payment_callbacks c
     WHERE NOT c.verified AND c.order_id IS NULL
       AND (c.received_at < now() - make_interval(days => $5::int)
            OR c.id <= (SELECT id FROM payment_callbacks WHERE NOT verified
                         ORDER BY id DESC OFFSET $6 LIMIT 1))
       AND NOT EXISTS (SELECT 1 FROM payment_keys k WHERE k.callback_id = c.id)
    RETURNING 1
), runs AS (
    DELETE FROM task_runs WHERE status <> 'RUNNING' AND started_at < now() - make_interval(days => $7::int)
    RETURNING 1
)
SELECT (SELECT count(*) FROM keys) + (SELECT count(*) FROM attempts) + (SELECT count(*) FROM runs)
       + (SELECT count(*) FROM unverified) + (SELECT count(*) FROM events)
       + (SELECT count(*) FROM delivered_attempts) AS n
