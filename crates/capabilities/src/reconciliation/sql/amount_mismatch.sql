-- Finding: both have the payment, for different amounts.
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
SELECT 'AMOUNT_MISMATCH', $2, o.id, o.order_no, o.store_id, p.provider_txn_id, p.online_cents, b.amount_cents,
       jsonb_build_object('source', 'reconciliation', 'billDate', $3::text, 'line', b.line),
       'RECON:' || $2 || ':AMOUNT_MISMATCH:' || o.order_no || ':' || p.provider_txn_id, $4
  FROM bill_rows b
  JOIN payments p ON p.provider_txn_id = b.provider_txn_id AND p.method = $2
  JOIN orders o ON o.id = p.order_id
 WHERE b.run_id = $1 AND b.kind = 'PAYMENT' AND p.online_cents <> b.amount_cents
ON CONFLICT (finding_key) DO NOTHING RETURNING id
