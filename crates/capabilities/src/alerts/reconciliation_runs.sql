-- Finished reconciliation runs that FAILED or opened tickets and have no alert yet: run $1, or
-- (when NULL) every one finished in the last two days; with their tickets' counts by kind.
--
--   $1  run id, or NULL    bigint
SELECT r.id, r.provider, r.bill_date, r.status, r.error, r.trace_id,
       COALESCE((SELECT jsonb_object_agg(kind, n) FROM (
           SELECT t.kind, count(*) AS n FROM exception_tickets t WHERE t.trace_id = r.trace_id GROUP BY t.kind) k),
         '{}'::jsonb) AS kinds
  FROM reconciliation_runs r
 WHERE (($1::bigint IS NULL AND r.finished_at > now() - interval '2 days') OR r.id = $1)
   AND (r.status = 'FAILED' OR (r.status = 'SUCCEEDED' AND r.tickets_opened > 0))
   AND NOT EXISTS (SELECT 1 FROM alerts a WHERE a.dedupe_key = 'RECONCILIATION:' || r.id)
