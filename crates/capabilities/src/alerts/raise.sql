-- Writes an alert unless the same cause raised one already (its dedupe key). Its deliveries
-- are enqueued by the caller in the same transaction when channels are configured ($8: then
-- the alert is fanned out now). Returns the new alert's id and time (no row: raised before).
--
--   $1  cause        text
--   $2  dedupe key   text
--   $3  title        text
--   $4  lines        jsonb (an array of strings)
--   $5  order no     text, NULL
--   $6  trace id     text
--   $7  detail       jsonb
--   $8  fanned out   boolean (a channel is configured)
INSERT INTO alerts (cause, dedupe_key, title, lines, order_no, trace_id, detail, fanned_out_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, CASE WHEN $8 THEN now() END)
ON CONFLICT (dedupe_key) DO NOTHING
RETURNING id, created_at
