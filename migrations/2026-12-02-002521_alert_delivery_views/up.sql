-- The alerts' own delivery tables go (their rows are outbox events since 002520); what read
-- them (`fitorder alerts`, the metrics, the ops queries) reads the same columns from views of
-- the outbox rows.
DROP TABLE alert_attempts;
DROP TABLE alert_deliveries;

CREATE VIEW alert_deliveries AS
SELECT e.id, (e.payload->>'alertId')::bigint AS alert_id, e.payload->>'channel' AS channel, e.status,
       e.attempts, e.max_attempts, e.next_attempt_at, e.last_error, e.locked_until, e.locked_by,
       CASE WHEN e.status = 'SUCCEEDED' THEN e.updated_at END AS delivered_at, e.created_at, e.updated_at
  FROM compensation_events e
 WHERE e.kind = 'ALERT_DELIVERY';

CREATE VIEW alert_attempts AS
SELECT a.id, a.event_id AS delivery_id, e.payload->>'channel' AS channel, a.at, a.ok, a.error,
       a.duration_ms, a.worker
  FROM compensation_attempts a JOIN compensation_events e ON e.id = a.event_id
 WHERE e.kind = 'ALERT_DELIVERY';
