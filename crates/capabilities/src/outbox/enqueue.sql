-- Writes due outbox events, each about an order (or none), and announces them on commit, in one statement:
-- the workers of every process are woken (`fitorder_outbox`) and subscribers told of each
-- event (`fitorder_announce('comp', id)`). The payloads come encoded from the typed effects;
-- nothing of their shape is here. Each event's idempotency key is unique: the same effect
-- twice is refused.
--
--   $1  order ids                      bigint[] one per event, NULL for effects of no order
--   $2  kinds                          text[]   one per event, in order
--   $3  payloads                       jsonb[]  the same length
--   $4  idempotency keys               text[]   the same length
--   $5  max attempts                   integer
--   $6  trace id                       text
--   $7  the outbox's channel           text
WITH inserted AS (
    INSERT INTO compensation_events (order_id, kind, max_attempts, payload, idempotency_key, trace_id)
    SELECT e.order_id, e.kind, $5, e.payload, e.key, $6
      FROM unnest($1::bigint[], $2::text[], $3::jsonb[], $4::text[]) WITH ORDINALITY AS e(order_id, kind, payload, key, n)
     ORDER BY e.n
    RETURNING id
), announced AS (
    SELECT id, pg_notify($7, '') AS woken, fitorder_announce('comp', id) AS told FROM inserted
)
SELECT id FROM announced ORDER BY id
