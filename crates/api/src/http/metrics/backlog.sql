-- The outbox backlog as `/metrics` reports it: events by status (PENDING, RETRYING, DEAD),
-- the ones overdue by more than five minutes (OVERDUE), of orders' effects; and DEAD alert
-- deliveries (ALERT_DEAD), the outbox's `ALERT_DELIVERY` events.
SELECT status, count(*) AS n FROM compensation_events
 WHERE status IN ('PENDING', 'RETRYING', 'DEAD') AND kind <> 'ALERT_DELIVERY' GROUP BY status
UNION ALL
SELECT 'OVERDUE', count(*) FROM compensation_events
 WHERE status IN ('PENDING', 'RETRYING') AND next_attempt_at < now() - interval '5 minutes' AND kind <> 'ALERT_DELIVERY'
UNION ALL
SELECT 'ALERT_DEAD', count(*) FROM compensation_events WHERE status = 'DEAD' AND kind = 'ALERT_DELIVERY'
