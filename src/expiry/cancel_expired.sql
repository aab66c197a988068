-- Cancels due WAIT_PAY orders (all due ones when $1 is NULL, else only those of $1), at most
-- $2, under trace id $3: each with its audit row, its seat or stock unit released, its frozen
-- wallet money unfrozen and its announcement, in one statement. Rows another instance holds are
-- skipped, never waited for (zero rows: someone else did it). Returns how many were canceled.
--
--   $1  order ids, or NULL for every due order   bigint[]
--   $2  at most this many                        bigint
--   $3  trace id                                 text
WITH due AS (
    SELECT id FROM orders
     WHERE status = 'WAIT_PAY' AND expires_at IS NOT NULL AND expires_at <= now()
       AND ($1::bigint[] IS NULL OR id = ANY($1))
     ORDER BY expires_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE orders o
       SET status = 'CANCELED', canceled_at = now(), cancel_reason = 'TIMEOUT', updated_at = now()
      FROM due WHERE o.id = due.id AND o.status = 'WAIT_PAY'
    RETURNING o.id, o.member_id, o.coach_slot_id, o.class_pack_id, o.payment_method, o.wallet_amount_cents
), audit AS (
    INSERT INTO order_transitions (order_id, from_status, to_status, actor, reason, trace_id)
    SELECT id, 'WAIT_PAY', 'CANCELED', 'system:expiry', 'TIMEOUT', $3 FROM moved
    RETURNING id
), seats AS (
    UPDATE coach_slots s SET remaining = s.remaining + m.n
      FROM (SELECT coach_slot_id, count(*) AS n FROM moved WHERE coach_slot_id IS NOT NULL GROUP BY 1) m
     WHERE s.id = m.coach_slot_id
), stock AS (
    UPDATE class_packs p SET stock = p.stock + m.n
      FROM (SELECT class_pack_id, count(*) AS n FROM moved WHERE class_pack_id IS NOT NULL GROUP BY 1) m
     WHERE p.id = m.class_pack_id AND p.stock IS NOT NULL
), unfrozen AS (
    INSERT INTO wallet_ledger (member_id, kind, balance_delta, frozen_delta, order_id, actor, trace_id)
    SELECT member_id, 'UNFREEZE', wallet_amount_cents, -wallet_amount_cents, id, 'system:expiry', $3
      FROM moved WHERE payment_method = 'MIXED' AND wallet_amount_cents > 0
), announced AS (
    SELECT count(fitorder_announce('order', id)) AS n FROM audit
)
SELECT (SELECT count(*) FROM moved) + 0 * (SELECT n FROM announced) AS n
