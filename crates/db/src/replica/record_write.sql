-- On the primary, after a staff viewer's mutation committed: every WAL record inserted so far
-- (that commit's included) is before pg_current_wal_insert_lsn().
INSERT INTO read_your_writes (viewer, lsn, written_at)
VALUES ($1, pg_current_wal_insert_lsn(), now())
ON CONFLICT (viewer) DO UPDATE
    SET lsn = GREATEST(read_your_writes.lsn, EXCLUDED.lsn), written_at = EXCLUDED.written_at
