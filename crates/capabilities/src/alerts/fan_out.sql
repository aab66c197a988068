-- The alerts not fanned out yet (raised where no channel was configured, or before their
-- deliveries were outbox events), at most 200, marked fanned out; the caller enqueues their
-- deliveries in the same transaction. Rows another instance is fanning out are skipped.
WITH a AS (
    UPDATE alerts SET fanned_out_at = now()
     WHERE id IN (SELECT id FROM alerts WHERE fanned_out_at IS NULL ORDER BY id LIMIT 200
                  FOR UPDATE SKIP LOCKED)
    RETURNING id, cause, title, lines, order_no, trace_id, created_at)
SELECT * FROM a ORDER BY id
