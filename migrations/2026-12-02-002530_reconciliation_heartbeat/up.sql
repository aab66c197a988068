-- A RUNNING reconciliation run is owned by a process that says so every few seconds: its
-- heartbeat. A run whose heartbeat stopped (its process died, or stopped working on it) is
-- recognised within a minute and closed as FAILED, by the sweep or by the next run of its day.
-- NULL for runs written before (they keep the old rule: stuck after an hour).
ALTER TABLE reconciliation_runs ADD COLUMN heartbeat_at TIMESTAMPTZ;
