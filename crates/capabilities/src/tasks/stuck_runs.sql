-- Closes the runs whose instance died as FAILED, so the next tick can run: task runs RUNNING
-- for more than $1 minutes, reconciliation runs RUNNING for more than an hour. Returns them.
--
--   $1  minutes a task run may stay RUNNING    bigint
WITH s AS (UPDATE task_runs SET status = 'FAILED', finished_at = now(),
                  detail = 'stuck: no outcome after ' || $1 || ' minutes (instance died?)'
            WHERE status = 'RUNNING' AND started_at < now() - make_interval(mins => $1::int)
           RETURNING id, task, instance),
     r AS (UPDATE reconciliation_runs SET status = 'FAILED', finished_at = now(),
                  error = 'stuck: no outcome after an hour (instance died?)'
            WHERE status = 'RUNNING' AND started_at < now() - interval '1 hour'
           RETURNING id, 'reconcile:' || provider AS task, '' AS instance)
SELECT id, task, instance, true AS task_run FROM s
UNION ALL SELECT id, task, instance, false FROM r
