-- Fans new alerts out to the channels $1 (at most 200 alerts a round; rows another worker is
-- fanning out are skipped): one delivery per alert and channel, with $2 attempts.
--
--   $1  channel ids     text[]
--   $2  max attempts    integer
WITH a AS (
    UPDATE alerts SET fanned_out_at = now()
     WHERE id IN (SELECT id FROM alerts WHERE fanned_out_at IS NULL ORDER BY id LIMIT 200
                  FOR UPDATE SKIP LOCKED)
    RETURNING id)
INSERT INTO alert_deliveries (alert_id, channel, max_attempts)
SELECT a.id, c.channel, $2 FROM a CROSS JOIN unnest($1::text[]) AS c(channel)
ON CONFLICT DO NOTHING
