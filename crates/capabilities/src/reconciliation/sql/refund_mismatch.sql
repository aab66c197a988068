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
-- Every finding statement takes the same binds (some use only a few) and returns the ids of
-- the tickets it opened; a ticket already opened for the same finding is not opened again.
INSERT INTO exception_tickets (kind, provider, order_id, order_no, store_id, provider_txn_id,
                               local_amount_cents, provider_amount_cents, detail, finding_key, trace_id)
SELECT 'REFUND_MISMATCH', $2, o.id, b.out_trade_no, o.store_id, coalesce(b.provider_refund_id, b.provider_txn_id),
       (e.payload->>'amountCents')::bigint, b.amount_cents,
       jsonb_build_object('source', 'reconciliation', 'billDate', $3::text, 'line', b.line,
                          'refundNo', b.refund_no, 'known', e.id IS NOT NULL),
       'RECON:' || $2 || ':REFUND_MISMATCH:' || b.out_trade_no || ':' || coalesce(b.refund_no, b.provider_txn_id), $4
  FROM bill_rows b
  LEFT JOIN orders o ON o.order_no = b.out_trade_no
  LEFT JOIN compensation_events e ON e.kind = 'PROVIDER_REFUND' AND e.payload->>'provider' = $2
                                 AND e.payload->>'refundNo' = b.refund_no AND e.payload->>'orderNo' = b.out_trade_no
 WHERE b.run_id = $1 AND b.kind = 'REFUND'
   AND (e.id IS NULL OR (e.payload->>'amountCents')::bigint <> b.amount_cents)
   AND NOT EXISTS (SELECT 1 FROM exception_tickets t WHERE t.kind = 'REFUND_MISMATCH'
                    AND t.order_no = b.out_trade_no AND t.detail->>'refundNo' = b.refund_no
                    AND t.detail->>'source' = 'callback')
ON CONFLICT (finding_key) DO NOTHING RETURNING id
