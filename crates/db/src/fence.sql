-- After the migrations, under their lock: the timeline fence (issue 38). When the database runs
-- on another timeline (a point-in-time restore, a promotion) or another cluster than the last
-- row of `timeline_fences` says, what was issued after the restore point may be lost here but
-- not outside (order numbers the providers hold trades for, refund numbers, ids): every sequence
-- of the schema jumps $1 ahead, so nothing is issued twice, and the order numbers that may have
-- been issued and lost are written down. A database's first run writes its row without a range.
-- Returns the rows written (0: nothing moved).
--
--   $1  the jump                       bigint
WITH here AS (
    SELECT (SELECT system_identifier::text FROM pg_control_system()) AS sysid,
           ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int AS timeline
), last AS (
    SELECT system_identifier, timeline FROM timeline_fences ORDER BY id DESC LIMIT 1
), moved AS (
    SELECT 1 AS m FROM here, last WHERE (here.sysid, here.timeline) <> (last.system_identifier, last.timeline)
), jumped AS (
    SELECT s.sequencename::text AS name, coalesce(s.last_value, s.start_value - 1) AS old,
           setval(format('%I.%I', s.schemaname, s.sequencename), coalesce(s.last_value, s.start_value) + $1) AS new
      FROM pg_sequences s, moved
     WHERE s.schemaname = current_schema() AND coalesce(s.last_value, s.start_value) + $1 <= s.max_value
), seen AS (
    SELECT coalesce(max(substr(order_no, 11)::bigint), 0) AS max_seen FROM orders WHERE order_no ~ '^FO[0-9]{18}$'
)
INSERT INTO timeline_fences (system_identifier, timeline, lost_order_seq_from, lost_order_seq_to)
SELECT here.sysid, here.timeline, seen.max_seen + 1, j.new
  FROM here, seen, (SELECT new FROM jumped WHERE name = 'order_no_seq') j
 WHERE (SELECT count(*) FROM jumped) > 0
UNION ALL
SELECT here.sysid, here.timeline, NULL, NULL
  FROM here
 WHERE NOT EXISTS (SELECT 1 FROM last)
RETURNING timeline, lost_order_seq_from, lost_order_seq_to
