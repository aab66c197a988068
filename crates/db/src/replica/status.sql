-- On the replica: is it a standby whose WAL receiver runs, has it replayed `$1` (a viewer's last
-- write; NULL: none), and how far behind is it. Behind = the age of the last replayed
-- transaction while WAL it received waits to be replayed (0 when it has replayed all it got).
SELECT pg_is_in_recovery() AS standby,
       EXISTS (SELECT 1 FROM pg_stat_wal_receiver) AS streaming,
       COALESCE(pg_last_wal_replay_lsn() >= $1::pg_lsn, $1 IS NULL) AS caught_up,
       CASE WHEN pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn() THEN 0
            ELSE EXTRACT(EPOCH FROM now() - COALESCE(pg_last_xact_replay_timestamp(), pg_postmaster_start_time()))
       END::float8 AS lag_seconds
