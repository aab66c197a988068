-- The outbox backlog as `/metrics` reports it: events by status (PENDING, RETRYING, DEAD),
-- the ones overdue by more than five minutes (OVERDUE), and DEAD alert deliveries (ALERT_DEAD).
SELECT status, count(*) AS n FROM compensation_events WHERE status IN ('PENDING', 'RETRYING', 'DEAD') GROUP BY status
UNION ALL
SELECT 'OVERDUE', count(*) FROM compensation_events
 WHERE status IN ('PENDING', 'RETRYING') AND next_attempt_at < now() - interval '5 minutes'
UNION ALL
SELECT 'ALERT_DEAD', count(*) FROM alert_deliveries WHERE status = 'DEAD'
