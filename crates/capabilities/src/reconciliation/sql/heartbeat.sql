-- A RUNNING run's heartbeat: its process is still working on it.
--
--   $1  run id    bigint
UPDATE reconciliation_runs SET heartbeat_at = clock_timestamp() WHERE id = $1 AND status = 'RUNNING'
