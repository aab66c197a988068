-- Closes as FAILED the RUNNING run of one provider and day that its process abandoned: no
-- heartbeat for $3 seconds (a run of before the heartbeat: started more than an hour ago).
-- The same rule as `tasks/stuck_runs.sql`, for one day, before a new run of it starts.
-- Returns how many it closed.
--
--   $1  provider          text
--   $2  bill date         date
--   $3  lease (seconds)   bigint
WITH closed AS (
    UPDATE reconciliation_runs SET status = 'FAILED', finished_at = now(),
           error = 'abandoned: no heartbeat for ' || $3 || ' seconds (its process stopped working on it)'
     WHERE provider = $1 AND bill_date = $2 AND status = 'RUNNING'
       AND (heartbeat_at < now() - make_interval(secs => $3)
            OR (heartbeat_at IS NULL AND started_at < now() - interval '1 hour'))
    RETURNING id),
     staged AS (DELETE FROM bill_rows WHERE run_id IN (SELECT id FROM closed))
SELECT count(*) AS n FROM closed
