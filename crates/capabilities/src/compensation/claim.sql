-- Claims up to $3 due events for worker $1 under a lease of $2 seconds. Rows another worker
-- holds (locked, or under a lease that has not run out) are skipped, never waited for. A
-- provider refund is claimed only by a process that has that provider ($4, e.g.
-- {WECHAT_PAY,ALIPAY}): a process without its keys leaves it for one that has them, rather
-- than spending its attempts on "not configured". Likewise an alert delivery is claimed only by
-- a process that has its chat channel configured ($5, channel ids). A door or AI-device event
-- waits while an earlier one of the same order and device is not delivered (docs/prepaid-and-cards.md "Freezing and
-- transferring cards": one order's access events reach the downstream in the order they were decided;
-- a DEAD one holds nothing up, it is a ticket).
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
          AND NOT (kind IN ('DOOR_ACCESS_GRANT', 'DOOR_ACCESS_REVOKE', 'AI_ACCESS_GRANT', 'AI_ACCESS_REVOKE')
                   AND EXISTS (SELECT 1 FROM compensation_events p
                                WHERE p.order_id = compensation_events.order_id
                                  AND p.id < compensation_events.id
                                  AND split_part(p.kind, '_', 1) = split_part(compensation_events.kind, '_', 1)
                                  AND p.kind IN ('DOOR_ACCESS_GRANT', 'DOOR_ACCESS_REVOKE',
                                                 'AI_ACCESS_GRANT', 'AI_ACCESS_REVOKE')
                                  AND p.status IN ('PENDING', 'RETRYING')))
        ORDER BY next_attempt_at
        LIMIT $3
          FOR UPDATE SKIP LOCKED)
RETURNING e.id, e.order_id, e.kind, e.status, e.attempts, e.max_attempts, e.next_attempt_at,
          e.last_error, e.payload, e.idempotency_key, e.trace_id, e.locked_until, e.locked_by,
          e.created_at, e.updated_at
