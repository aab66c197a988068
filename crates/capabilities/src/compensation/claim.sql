-- Claims up to $3 due events for worker $1 under a lease of $2 seconds. Rows another worker
-- holds (locked, or under a lease that has not run out) are skipped, never waited for. A
-- provider refund is claimed only by a process that has that provider ($4, e.g.
-- {WECHAT_PAY,ALIPAY}): a process without its keys leaves it for one that has them, rather
-- than spending its attempts on "not configured". Likewise an alert delivery is claimed only by
-- a process that has its chat channel configured ($5, channel ids).
--
-- The columns are listed (not *) so that a column added by a later migration does not change
-- the result of this statement, which each connection keeps prepared.
UPDATE compensation_events e
   SET locked_until = now() + make_interval(secs => $2), locked_by = $1
 WHERE e.id IN (
       SELECT id FROM compensation_events
        WHERE status IN ('PENDING', 'RETRYING') AND next_attempt_at <= now()
          AND (locked_until IS NULL OR locked_until < now())
          AND (kind <> 'PROVIDER_REFUND' OR payload->>'provider' = ANY($4::text[]))
          AND (kind <> 'ALERT_DELIVERY' OR payload->>'channel' = ANY($5::text[]))
        ORDER BY next_attempt_at
        LIMIT $3
          FOR UPDATE SKIP LOCKED)
RETURNING e.id, e.order_id, e.kind, e.status, e.attempts, e.max_attempts, e.next_attempt_at,
          e.last_error, e.payload, e.idempotency_key, e.trace_id, e.locked_until, e.locked_by,
          e.created_at, e.updated_at
