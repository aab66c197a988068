-- Providers failing repeatedly in the last ten minutes: callbacks with bad signatures, or
-- refund calls failing (at least three each), with the hour that names the alert.
SELECT 'BAD_SIGNATURE' AS what, provider, count(*) AS n, to_char(now(), 'YYYY-MM-DD"T"HH24') AS hour
  FROM payment_callbacks WHERE outcome = 'BAD_SIGNATURE' AND received_at > now() - interval '10 minutes'
 GROUP BY provider HAVING count(*) >= 3
UNION ALL
SELECT 'API_FAILING', e.payload->>'provider', count(*), to_char(now(), 'YYYY-MM-DD"T"HH24')
  FROM compensation_attempts a JOIN compensation_events e ON e.id = a.event_id
 WHERE NOT a.ok AND e.kind = 'PROVIDER_REFUND' AND a.at > now() - interval '10 minutes'
 GROUP BY e.payload->>'provider' HAVING count(*) >= 3
