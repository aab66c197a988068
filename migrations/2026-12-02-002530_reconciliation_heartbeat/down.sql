ALTER TABLE reconciliation_runs DROP COLUMN heartbeat_at;
