-- Closes the runs whose instance died as FAILED, so the next tick can run: task runs RUNNING
-- for more than $1 minutes, reconciliation runs RUNNING without a heartbeat for $2 seconds
-- (`reconciliation::RUN_LEASE_SECS`; a run of before the heartbeat: for more than an hour).
-- Returns them.
--
--   $1  minutes a task run may stay RUNNING                    bigint
--   $2  seconds a reconciliation run may go without heartbeat  bigint
WITH s AS (UPDATE task_runs SET status = 'FAILED', finished_at = now(),
                  detail = 'stuck: no outcome after ' || $1 || ' minutes (instance died?)'
            WHERE status = 'RUNNING' AND started_at < now() - make_interval(mins => $1::int)
           RETURNING id, task, instance),
     r AS (UPDATE reconciliation_runs SET status = 'FAILED', finished_at = now(),
                  error = 'abandoned: no heartbeat for ' || $2 || ' seconds (its process stopped working on it)'
            WHERE status = 'RUNNING'
              AND (heartbeat_at < now() - make_interval(secs => $2)
                   OR (heartbeat_at IS NULL AND started_at < now() - interval '1 hour'))
           RETURNING id, 'reconcile:' || provider AS task, '' AS instance),
     d AS (DELETE FROM bill_rows WHERE run_id IN (SELECT id FROM r))
SELECT id, task, instance, true AS task_run FROM s
UNION ALL SELECT id, task, instance, false FROM r
