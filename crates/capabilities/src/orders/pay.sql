-- The one status change not written by `transition.sql` (the fast payment path, kept one
-- statement for speed; `tests/it/state_machine.rs` checks it stays the only one and writes
-- nothing but PAID): WAIT_PAY -> PAID in one statement: the status change with its audit row, the payment, the
-- grant events, their announcements (on commit, or by the caller after its commit: $16), and, for a payment a provider's callback
-- brought, that callback's outcome (APPLIED, with what it was about). The caller has locked
-- the order and checked the transition with the state machine; the UPDATE matches only a
-- waiting order and the `orders_status_guard` trigger checks the pair once more. A second payment of the order (or
-- of the key) fails on the payments' unique constraints, and with it the whole statement.
--
--   $1  order id                       bigint
--   $2  actor                          text
--   $3  reason                         text
--   $4  provider transaction id        text, NULL (wallet, offline)
--   $5  trace id                       text
--   $6  payment method                 text
--   $7  payment idempotency key        text
--   $8  payment reference              text, NULL
--   $9  online part (cents)            bigint
--   $10 effect kinds                   text[]   one per event (outbox::enqueue's encoding)
--   $11 effect payloads                jsonb[]  the same length
--   $12 effect idempotency keys        text[]   the same length
--   $13 max attempts                   integer
--   $14 the outbox's channel           text
--   $15 the callback that brought it   bigint, NULL (none: wallet, offline, staff)
--   $16 announce on commit             boolean: false when the caller sends the announcements
--                                      after its commit (`audit_id`, `granted_ids`), see
--                                      `orders::apply_payment_announced_later`
--
-- The columns are listed (not RETURNING *) so that a column added by a later migration does
-- not change the result of this statement, which each connection keeps prepared.
WITH moved AS (
    UPDATE orders
       SET status = 'PAID', updated_at = now(), paid_at = now(), expires_at = NULL,
           provider_txn_id = COALESCE($4, provider_txn_id)
     WHERE id = $1 AND status = 'WAIT_PAY'
    RETURNING id, order_no, member_id, store_id, kind, status, item_name, membership_plan_id,
              class_pack_id, coach_slot_id, plan_days, amount_cents, wallet_amount_cents,
              payment_method, online_provider, sessions_total, sessions_used, expires_at, created_at,
              paid_at, canceled_at, cancel_reason, refunded_at, refund_amount_cents, provider_txn_id,
              trace_id, idempotency_key, request_hash, updated_at
), audit AS (
    INSERT INTO order_transitions (order_id, from_status, to_status, actor, reason, trace_id)
    SELECT id, 'WAIT_PAY', 'PAID', $2, $3, $5 FROM moved
    RETURNING id
), payment AS (
    INSERT INTO payments (order_id, method, idempotency_key, provider_txn_id, amount_cents,
                          wallet_cents, online_cents, reference, actor, trace_id)
    SELECT id, $6, $7, $4, amount_cents, wallet_amount_cents, $9, $8, $2, $5 FROM moved
), granted AS (
    INSERT INTO compensation_events (order_id, kind, max_attempts, payload, idempotency_key, trace_id)
    SELECT moved.id, g.kind, $13, g.payload, g.key, $5
      FROM moved, unnest($10::text[], $11::jsonb[], $12::text[]) WITH ORDINALITY AS g(kind, payload, key, n)
     ORDER BY g.n
    RETURNING id
), applied AS (
    UPDATE payment_callbacks c
       SET outcome = 'APPLIED', order_id = moved.id, order_no = moved.order_no, store_id = moved.store_id,
           idempotency_key = $7, provider_txn_id = $4, amount_cents = $9
      FROM moved
     WHERE c.id = $15
)
SELECT moved.*, changed.audit_id, effects.granted_ids
  FROM moved,
       (SELECT id AS audit_id, CASE WHEN $16 THEN fitorder_announce('order', id) END FROM audit) AS changed,
       (SELECT coalesce(array_agg(id ORDER BY id), '{}') AS granted_ids,
               -- FILTER, not CASE: an aggregate's argument is computed before a CASE around it.
               count(pg_notify($14, '')) FILTER (WHERE $16) + count(fitorder_announce('comp', id)) FILTER (WHERE $16)
          FROM granted) AS effects
