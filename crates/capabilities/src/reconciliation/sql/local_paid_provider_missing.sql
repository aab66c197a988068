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
-- Every finding query takes the same binds (some use only a few); its rows are the findings
-- that `tickets/open.sql` (after it, through `tickets::opening`) opens tickets for, once per
-- finding key, returning the tickets it opened.
SELECT 'LOCAL_PAID_PROVIDER_MISSING'::text AS kind, $2::text AS provider, o.id AS order_id, o.order_no,
       o.store_id, p.provider_txn_id, p.online_cents::bigint AS local_amount_cents,
       NULL::bigint AS provider_amount_cents,
       jsonb_build_object('source', 'reconciliation', 'billDate', $3::text, 'paidAt', p.paid_at) AS detail,
       'RECON:' || $2 || ':LOCAL_PAID_PROVIDER_MISSING:' || o.order_no || ':' || coalesce(p.provider_txn_id, '')
         AS finding_key,
       $4::text AS trace_id
  FROM payments p
  JOIN orders o ON o.id = p.order_id
 WHERE p.method = $2 AND p.online_cents > 0 AND p.paid_at >= $5 AND p.paid_at < $6
   AND NOT EXISTS (SELECT 1 FROM bill_rows b WHERE b.run_id = $1 AND b.kind = 'PAYMENT'
                    AND b.provider_txn_id = p.provider_txn_id)
   AND NOT (coalesce(p.provider_txn_id, '') = ANY($7))
