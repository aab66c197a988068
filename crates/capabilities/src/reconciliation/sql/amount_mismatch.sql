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
-- Every finding query takes the same binds (some use only a few); its rows are the findings
-- that `tickets/open.sql` (after it, through `tickets::opening`) opens tickets for, once per
-- finding key, returning the tickets it opened.
SELECT 'AMOUNT_MISMATCH'::text AS kind, $2::text AS provider, o.id AS order_id, o.order_no, o.store_id,
       p.provider_txn_id, p.online_cents::bigint AS local_amount_cents,
       b.amount_cents::bigint AS provider_amount_cents,
       jsonb_build_object('source', 'reconciliation', 'billDate', $3::text, 'line', b.line) AS detail,
       'RECON:' || $2 || ':AMOUNT_MISMATCH:' || o.order_no || ':' || p.provider_txn_id AS finding_key,
       $4::text AS trace_id
  FROM bill_rows b
  JOIN payments p ON p.provider_txn_id = b.provider_txn_id AND p.method = $2
  JOIN orders o ON o.id = p.order_id
 WHERE b.run_id = $1 AND b.kind = 'PAYMENT' AND p.online_cents <> b.amount_cents
