-- Finding: a refund in the bill that the books do not know, or for another amount. Its status
-- in the bill does not matter: WeChat books a refund when it is asked for and never updates
-- the row, so one we asked for may read PROCESSING for good. A refund whose callback already
-- opened a ticket (failed, unknown, more than asked) is that same difference.
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
SELECT 'REFUND_MISMATCH'::text AS kind, $2::text AS provider, o.id AS order_id, b.out_trade_no AS order_no,
       o.store_id, coalesce(b.provider_refund_id, b.provider_txn_id) AS provider_txn_id,
       (e.payload->>'amountCents')::bigint AS local_amount_cents, b.amount_cents::bigint AS provider_amount_cents,
       jsonb_build_object('source', 'reconciliation', 'billDate', $3::text, 'line', b.line,
                          'refundNo', b.refund_no, 'known', e.id IS NOT NULL) AS detail,
       'RECON:' || $2 || ':REFUND_MISMATCH:' || b.out_trade_no || ':' || coalesce(b.refund_no, b.provider_txn_id)
         AS finding_key,
       $4::text AS trace_id
  FROM bill_rows b
  LEFT JOIN orders o ON o.order_no = b.out_trade_no
  LEFT JOIN compensation_events e ON e.kind = 'PROVIDER_REFUND' AND e.payload->>'provider' = $2
                                 AND e.payload->>'refundNo' = b.refund_no AND e.payload->>'orderNo' = b.out_trade_no
 WHERE b.run_id = $1 AND b.kind = 'REFUND'
   AND (e.id IS NULL OR (e.payload->>'amountCents')::bigint <> b.amount_cents)
   AND NOT EXISTS (SELECT 1 FROM exception_tickets t WHERE t.kind = 'REFUND_MISMATCH'
                    AND t.order_no = b.out_trade_no AND t.detail->>'refundNo' = b.refund_no
                    AND t.detail->>'source' = 'callback')
