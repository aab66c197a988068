-- Finding: the provider collected money the books do not have as an applied payment. Ticket
-- kinds that the callbacks already opened for the same provider transaction (paid after
-- cancel, unknown order, ...) are the same difference and are not opened twice.
--
--   $1  run id                         bigint
--   $2  provider                       text
--   $3  bill date                      text (as written in the ticket detail)
--   $4  trace id                       text
--   $5  start of the bill day          timestamptz
--   $6  end of the bill day            timestamptz
--   $7  transaction ids confirmed by   text[]
--       asking the provider
--
-- Every finding query takes the same binds (some use only a few); its rows are the findings
-- that `tickets/open.sql` (after it, through `tickets::opening`) opens tickets for, once per
-- finding key, returning the tickets it opened.
SELECT 'PROVIDER_PAID_LOCAL_UNPAID'::text AS kind, $2::text AS provider, o.id AS order_id,
       b.out_trade_no AS order_no, o.store_id, b.provider_txn_id,
       CASE WHEN o.id IS NULL THEN NULL ELSE o.amount_cents - o.wallet_amount_cents END::bigint AS local_amount_cents,
       b.amount_cents::bigint AS provider_amount_cents,
       jsonb_build_object('source', 'reconciliation', 'billDate', $3::text, 'line', b.line,
                          'orderStatus', o.status) AS detail,
       'RECON:' || $2 || ':PROVIDER_PAID_LOCAL_UNPAID:' || b.out_trade_no || ':' || b.provider_txn_id AS finding_key,
       $4::text AS trace_id
  FROM bill_rows b
  LEFT JOIN orders o ON o.order_no = b.out_trade_no
 WHERE b.run_id = $1 AND b.kind = 'PAYMENT'
   AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.provider_txn_id = b.provider_txn_id AND p.method = $2)
   AND NOT EXISTS (SELECT 1 FROM exception_tickets t WHERE t.provider_txn_id = b.provider_txn_id
                    AND t.kind IN ('PAID_AFTER_CANCEL', 'UNKNOWN_ORDER', 'REJECTED_TRANSITION', 'AMOUNT_MISMATCH'))
   -- A payment of no order whose refund is queued (an order a restore lost, `lost_orders.sql`).
   AND NOT (o.id IS NULL AND EXISTS (SELECT 1 FROM compensation_events e WHERE e.kind = 'PROVIDER_REFUND'
                                       AND e.payload->>'providerTxnId' = b.provider_txn_id))
