UPDATE reconciliation_runs SET status = 'FAILED' WHERE status = 'WAITING';
ALTER TABLE reconciliation_runs DROP CONSTRAINT reconciliation_runs_status_check;
ALTER TABLE reconciliation_runs ADD CONSTRAINT reconciliation_runs_status_check
    CHECK (status IN ('RUNNING', 'SUCCEEDED', 'FAILED'));
DROP TABLE reconciliation_heals;
