-- The bill payments of run $1 whose order a restore lost (issue 38): an order number of
-- fitorder's own form (FO, the date, ten digits of `order_no_seq`) inside a range that a
-- timeline fence wrote down as possibly issued on the timeline left behind, no order of that
-- number, not booked, and no refund of the transaction queued yet. At most $3, in bill order.
--
--   $1  run id       bigint
--   $2  provider     text
--   $3  at most      bigint
SELECT b.out_trade_no AS order_no, b.provider_txn_id, b.amount_cents, b.line::int AS line
  FROM bill_rows b
 WHERE b.run_id = $1 AND b.kind = 'PAYMENT' AND b.provider_txn_id IS NOT NULL
   AND b.out_trade_no ~ '^FO[0-9]{18}$'
   AND EXISTS (SELECT 1 FROM timeline_fences f
                WHERE substr(b.out_trade_no, 11)::bigint BETWEEN f.lost_order_seq_from AND f.lost_order_seq_to)
   AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.order_no = b.out_trade_no)
   AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.provider_txn_id = b.provider_txn_id AND p.method = $2)
   AND NOT EXISTS (SELECT 1 FROM compensation_events e
                    WHERE e.kind = 'PROVIDER_REFUND' AND e.payload->>'providerTxnId' = b.provider_txn_id)
   AND NOT EXISTS (SELECT 1 FROM stray_payment_refunds s
                    WHERE s.provider = $2 AND s.provider_txn_id = b.provider_txn_id)
 ORDER BY b.line LIMIT $3
