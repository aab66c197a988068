-- The bill payments of run $1 that are safe to settle by themselves: for an order still
-- WAIT_PAY, for its online amount (applied as its callback would have been), or for a canceled
-- order (refunded as paid after cancel); not booked yet and not already a callback's ticket.
-- At most $3, in bill order.
--
--   $1  run id       bigint
--   $2  provider     text
--   $3  at most      bigint
SELECT b.out_trade_no AS order_no, b.provider_txn_id, b.amount_cents, b.line::int AS line
  FROM bill_rows b
  JOIN orders o ON o.order_no = b.out_trade_no
 WHERE b.run_id = $1 AND b.kind = 'PAYMENT'
   AND (o.online_provider IS NULL OR o.online_provider = $2)
   AND ((o.status = 'WAIT_PAY' AND o.amount_cents - o.wallet_amount_cents = b.amount_cents)
        OR o.status = 'CANCELED')
   AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.provider_txn_id = b.provider_txn_id AND p.method = $2)
   AND NOT EXISTS (SELECT 1 FROM exception_tickets t WHERE t.provider_txn_id = b.provider_txn_id
                    AND t.kind IN ('PAID_AFTER_CANCEL', 'UNKNOWN_ORDER', 'REJECTED_TRANSITION', 'AMOUNT_MISMATCH'))
 ORDER BY b.line LIMIT $3
