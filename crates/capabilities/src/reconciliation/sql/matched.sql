-- How many rows of run $1's bill match the books exactly: payments by transaction and amount,
-- refunds by refund number, order and amount.
--
--   $1  run id     bigint
--   $2  provider   text
SELECT (SELECT count(*) FROM bill_rows b JOIN payments p ON p.provider_txn_id = b.provider_txn_id AND p.method = $2
         WHERE b.run_id = $1 AND b.kind = 'PAYMENT' AND p.online_cents = b.amount_cents)
     + (SELECT count(*) FROM bill_rows b JOIN compensation_events e ON e.kind = 'PROVIDER_REFUND'
           AND e.payload->>'provider' = $2 AND e.payload->>'refundNo' = b.refund_no
           AND e.payload->>'orderNo' = b.out_trade_no AND (e.payload->>'amountCents')::bigint = b.amount_cents
         WHERE b.run_id = $1 AND b.kind = 'REFUND') AS n
