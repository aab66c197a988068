-- Finding: paid here on that day, absent from the provider's bill (and not confirmed by asking
-- the provider).
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
SELECT 'LOCAL_PAID_PROVIDER_MISSING', $2, o.id, o.order_no, o.store_id, p.provider_txn_id, p.online_cents, NULL,
       jsonb_build_object('source', 'reconciliation', 'billDate', $3::text, 'paidAt', p.paid_at),
       'RECON:' || $2 || ':LOCAL_PAID_PROVIDER_MISSING:' || o.order_no || ':' || coalesce(p.provider_txn_id, ''), $4
  FROM payments p
  JOIN orders o ON o.id = p.order_id
 WHERE p.method = $2 AND p.online_cents > 0 AND p.paid_at >= $5 AND p.paid_at < $6
   AND NOT EXISTS (SELECT 1 FROM bill_rows b WHERE b.run_id = $1 AND b.kind = 'PAYMENT'
                    AND b.provider_txn_id = p.provider_txn_id)
   AND NOT (coalesce(p.provider_txn_id, '') = ANY($7))
ON CONFLICT (finding_key) DO NOTHING RETURNING id
