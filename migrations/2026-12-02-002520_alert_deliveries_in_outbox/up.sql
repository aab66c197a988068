-- Alert deliveries become ordinary outbox effects (`ALERT_DELIVERY`): one compensation_events
-- row per alert and channel, claimed, retried, DEAD and replayed like any other event. They
-- are about no order, so `order_id` may be NULL (for them only).
ALTER TABLE compensation_events ALTER COLUMN order_id DROP NOT NULL;
ALTER TABLE compensation_events DROP CONSTRAINT compensation_events_kind_check;
ALTER TABLE compensation_events ADD CONSTRAINT compensation_events_kind_check
    CHECK (kind IN ('DOOR_ACCESS_GRANT', 'DOOR_ACCESS_REVOKE', 'AI_ACCESS_GRANT', 'AI_ACCESS_REVOKE',
                    'PROVIDER_REFUND', 'ALERT_DELIVERY'));
-- An order's effects have their order; an alert delivery has none.
ALTER TABLE compensation_events ADD CONSTRAINT compensation_events_order
    CHECK ((order_id IS NULL) = (kind = 'ALERT_DELIVERY'));
-- An alert's deliveries, for `fitorder alerts`.
CREATE INDEX compensation_alert_deliveries ON compensation_events (((payload->>'alertId')::bigint), id)
    WHERE kind = 'ALERT_DELIVERY';

-- Each channel's sending allowance (a token bucket of FITORDER_ALERT_RATE tokens, refilled at
-- that rate a minute), taken in one statement by the worker about to send: the rate holds for
-- the whole cluster without a lock held across the claim.
CREATE TABLE alert_channel_tokens (
    channel  TEXT PRIMARY KEY,
    tokens   DOUBLE PRECISION NOT NULL,
    at       TIMESTAMPTZ NOT NULL
);

-- Every delivery row written so far becomes its outbox event, with its state (a pending one
-- stays due; a DEAD one can be replayed by the outbox), and every attempt its attempt row.
INSERT INTO compensation_events (order_id, kind, status, attempts, max_attempts, next_attempt_at, last_error,
                                 payload, idempotency_key, trace_id, locked_until, locked_by, created_at, updated_at)
SELECT NULL, 'ALERT_DELIVERY', d.status, d.attempts, d.max_attempts, d.next_attempt_at, d.last_error,
       jsonb_build_object('alertId', a.id::text, 'channel', d.channel, 'cause', a.cause, 'title', a.title,
                          'lines', a.lines, 'orderNo', a.order_no,
                          'raisedAt', to_char(a.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')),
       'ALERT-' || a.id || ':ALERT_DELIVERY:' || d.channel, a.trace_id, d.locked_until, d.locked_by,
       d.created_at, d.updated_at
  FROM alert_deliveries d JOIN alerts a ON a.id = d.alert_id
 ORDER BY d.id
ON CONFLICT (idempotency_key) DO NOTHING;

INSERT INTO compensation_attempts (event_id, at, ok, error, duration_ms, worker)
SELECT e.id, x.at, x.ok, x.error, x.duration_ms, x.worker
  FROM alert_attempts x
  JOIN alert_deliveries d ON d.id = x.delivery_id
  JOIN compensation_events e ON e.idempotency_key = 'ALERT-' || d.alert_id || ':ALERT_DELIVERY:' || d.channel
 ORDER BY x.id;
