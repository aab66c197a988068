-- Claims the due deliveries of channels $3 for worker $1, for a lease of $2 seconds, within
-- each channel's rate of $4 a minute: requests made in the last minute plus deliveries in
-- flight (leased) count against it. Run under the `ALERT_CLAIMS` advisory lock, so that the
-- rate holds across all workers. Returns the claimed deliveries with their alerts.
--
--   $1  worker                  text
--   $2  lease (seconds)         double precision
--   $3  channel ids             text[]
--   $4  rate (per minute)       bigint
WITH c AS (
    SELECT d.id, d.channel,
           row_number() OVER (PARTITION BY d.channel ORDER BY d.next_attempt_at, d.id) AS rn
      FROM alert_deliveries d
     WHERE d.status IN ('PENDING', 'RETRYING') AND d.next_attempt_at <= now()
       AND (d.locked_until IS NULL OR d.locked_until < now())
       AND d.channel = ANY($3)
), used AS (
    SELECT ch.channel,
           (SELECT count(*) FROM alert_attempts x WHERE x.channel = ch.channel
               AND x.at > now() - interval '1 minute')
         + (SELECT count(*) FROM alert_deliveries y WHERE y.channel = ch.channel
               AND y.locked_until > now()) AS n
      FROM unnest($3::text[]) AS ch(channel)
), claimed AS (
    UPDATE alert_deliveries d
       SET locked_until = now() + make_interval(secs => $2), locked_by = $1
      FROM c JOIN used u ON u.channel = c.channel
     WHERE d.id = c.id AND c.rn + u.n <= $4
       -- Checked again on the row itself, should it have moved meanwhile.
       AND d.status IN ('PENDING', 'RETRYING')
       AND (d.locked_until IS NULL OR d.locked_until < now())
    RETURNING d.id, d.channel, d.attempts, d.max_attempts, d.alert_id)
SELECT claimed.*, a.cause, a.title, a.lines, a.order_no, a.trace_id, a.created_at
  FROM claimed JOIN alerts a ON a.id = claimed.alert_id
