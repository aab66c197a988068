-- The one writer of order status changes (WAIT_PAY -> PAID aside: `pay.sql`, the fast payment
-- path) and of the order's audit rows: the same change of one or many orders, each with its
-- audit row, what the change releases, and its announcement, in one statement. A change without
-- its audit row or its consequences cannot exist, and subscribers hear of it on commit.
--
--   $1  order ids (locked by the caller)   bigint[]
--   $2  to status                          text
--   $3  from status (what the caller       text     the UPDATE matches only the rows still
--       saw and the state machine                   there; the trigger checks the pair once
--       allowed); NULL: the order's birth           more. A birth (NONE -> WAIT_PAY, the row
--                                                   just inserted) changes nothing but writes
--                                                   the first audit row
--   $4  actor                              text
--   $5  reason                             text
--   $6  provider transaction id            text     NULL keeps the current one
--   $7  cancel reason                      text     set when moving to CANCELED
--   $8  refund amount (cents)              bigint   set when moving to REFUNDED
--   $9  sessions used now                  integer  added to sessions_used
--   $10 trace id                           text
--   $11 wallet money refunded (cents)      bigint   0: none (one order only)
--
-- What a change releases, written only here: CANCELED and REFUNDED put the held seat or stock
-- unit back on sale; CANCELED unfreezes the frozen wallet part of a MIXED order; REFUNDED gives
-- back $11 to the wallet.
--
-- The columns are listed (not RETURNING *) so that a column added by a later migration does
-- not change the result of this statement, which each connection keeps prepared.
WITH moved AS (
    UPDATE orders SET
        status = $2,
        updated_at = now(),
        paid_at = CASE WHEN $2 = 'PAID' THEN now() ELSE paid_at END,
        expires_at = CASE WHEN $2 = 'PAID' THEN NULL ELSE expires_at END,
        provider_txn_id = COALESCE($6, provider_txn_id),
        canceled_at = CASE WHEN $2 = 'CANCELED' THEN now() ELSE canceled_at END,
        cancel_reason = CASE WHEN $2 = 'CANCELED' THEN $7 ELSE cancel_reason END,
        refunded_at = CASE WHEN $2 = 'REFUNDED' THEN now() ELSE refunded_at END,
        refund_amount_cents = CASE WHEN $2 = 'REFUNDED' THEN $8 ELSE refund_amount_cents END,
        sessions_used = sessions_used + $9
     WHERE id = ANY($1) AND status = COALESCE($3, $2)
    RETURNING id, order_no, member_id, store_id, kind, status, item_name, membership_plan_id,
              class_pack_id, coach_slot_id, plan_days, amount_cents, wallet_amount_cents,
              payment_method, online_provider, sessions_total, sessions_used, expires_at, created_at,
              paid_at, canceled_at, cancel_reason, refunded_at, refund_amount_cents, provider_txn_id,
              trace_id, idempotency_key, request_hash, updated_at
), audit AS (
    INSERT INTO order_transitions (order_id, from_status, to_status, actor, reason, trace_id)
    SELECT id, $3, $2, $4, $5, $10 FROM moved
    RETURNING id, order_id
), released AS (
    SELECT * FROM moved WHERE $2 IN ('CANCELED', 'REFUNDED')
), seats AS (
    UPDATE coach_slots s SET remaining = s.remaining + r.n
      FROM (SELECT coach_slot_id, count(*) AS n FROM released WHERE coach_slot_id IS NOT NULL GROUP BY 1) r
     WHERE s.id = r.coach_slot_id
), stock AS (
    UPDATE class_packs p SET stock = p.stock + r.n
      FROM (SELECT class_pack_id, count(*) AS n FROM released WHERE class_pack_id IS NOT NULL GROUP BY 1) r
     WHERE p.id = r.class_pack_id AND p.stock IS NOT NULL
), wallet AS (
    INSERT INTO wallet_ledger (member_id, kind, balance_delta, frozen_delta, order_id, actor, trace_id)
    SELECT member_id, 'UNFREEZE', wallet_amount_cents, -wallet_amount_cents, id, $4, $10
      FROM moved WHERE $2 = 'CANCELED' AND payment_method = 'MIXED' AND wallet_amount_cents > 0
    UNION ALL
    SELECT member_id, 'REFUND', $11, 0, id, $4, $10
      FROM moved WHERE $2 = 'REFUNDED' AND $11 > 0
)
SELECT moved.*
  FROM moved JOIN (SELECT order_id, fitorder_announce('order', id) FROM audit) AS announced
    ON announced.order_id = moved.id
 ORDER BY moved.id
