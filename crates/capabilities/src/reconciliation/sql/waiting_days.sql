-- The days whose latest run (per provider) is WAITING for its bill, oldest first.
SELECT id, provider, bill_date, error FROM (
    SELECT DISTINCT ON (provider, bill_date) id, provider, bill_date, status, error
      FROM reconciliation_runs ORDER BY provider, bill_date, id DESC) latest
 WHERE status = 'WAITING' ORDER BY bill_date, provider
