-- Writes an alert unless the same cause raised one already (its dedupe key), and wakes the
-- outbox workers on commit. Returns the new alert's id (no row: raised before).
--
--   $1  cause        text
--   $2  dedupe key   text
--   $3  title        text
--   $4  lines        jsonb (an array of strings)
--   $5  order no     text, NULL
--   $6  trace id     text
--   $7  detail       jsonb
WITH a AS (
    INSERT INTO alerts (cause, dedupe_key, title, lines, order_no, trace_id, detail)
    VALUES ($1, $2, $3, $4, $5, $6, $7)
    ON CONFLICT (dedupe_key) DO NOTHING RETURNING id)
SELECT id FROM a, LATERAL (SELECT pg_notify('fitorder_outbox', '')) n
