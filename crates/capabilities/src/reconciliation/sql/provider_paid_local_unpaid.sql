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
-- Every finding statement takes the same binds (some use only a few) and returns the ids of
-- the tickets it opened; a ticket already opened for the same finding is not opened again.
INSERT INTO exception_tickets (kind, provider, order_id, order_no, store_id, provider_txn_id,
                               local_amount_cents, provider_amount_cents, detail, finding_key, trace_id)
SELECT 'PROVIDER_PAID_LOCAL_UNPAID', $2, o.id, b.out_trade_no, o.store_id, b.provider_txn_id,
       CASE WHEN o.id IS NULL THEN NULL ELSE o.amount_cents - o.wallet_amount_cents END, b.amount_cents,
       jsonb_build_object('source', 'reconciliation', 'billDate', $3::text, 'line', b.line,
                          'orderStatus', o.status),
       'RECON:' || $2 || ':PROVIDER_PAID_LOCAL_UNPAID:' || b.out_trade_no || ':' || b.provider_txn_id, $4
  FROM bill_rows b
  LEFT JOIN orders o ON o.order_no = b.out_trade_no
 WHERE b.run_id = $1 AND b.kind = 'PAYMENT'
   AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.provider_txn_id = b.provider_txn_id AND p.method = $2)
   AND NOT EXISTS (SELECT 1 FROM exception_tickets t WHERE t.provider_txn_id = b.provider_txn_id
                    AND t.kind IN ('PAID_AFTER_CANCEL', 'UNKNOWN_ORDER', 'REJECTED_TRANSITION', 'AMOUNT_MISMATCH'))
ON CONFLICT (finding_key) DO NOTHING RETURNING id
