-- The outbox events that need people: DEAD ones (waiting for a replay), and the ones overdue
-- by more than five minutes (no worker running? the downstream unreachable?); orders' effects
-- (DEAD alert deliveries are `fitorder_alert_deliveries_dead`).
SELECT count(*) FILTER (WHERE status = 'DEAD') AS dead,
       count(*) FILTER (WHERE status IN ('PENDING', 'RETRYING') AND next_attempt_at < now() - interval '5 minutes')
           AS overdue
  FROM compensation_events
 WHERE status IN ('DEAD', 'PENDING', 'RETRYING') AND kind <> 'ALERT_DELIVERY'
