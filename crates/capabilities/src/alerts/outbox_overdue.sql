-- The outbox events overdue by more than five minutes: the oldest one (which names the
-- episode), how many, and by how many minutes the oldest is late. Orders' effects: an alert
-- delivery overdue would be alerted to the channels it cannot reach.
SELECT (array_agg(id ORDER BY next_attempt_at, id))[1] AS oldest, count(*) AS n,
       (extract(epoch FROM now() - min(next_attempt_at)) / 60)::int AS minutes
  FROM compensation_events
 WHERE status IN ('PENDING', 'RETRYING') AND next_attempt_at < now() - interval '5 minutes'
   AND kind <> 'ALERT_DELIVERY'
