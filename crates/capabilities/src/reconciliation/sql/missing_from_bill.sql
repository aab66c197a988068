-- Online payments of provider $2 made in [$3, $4) that run $1's bill lacks and that no run has
-- confirmed by asking the provider yet: at most $5, oldest first, to be asked about.
--
--   $1  run id                   bigint
--   $2  provider                 text
--   $3  start of the bill day    timestamptz
--   $4  end of the bill day      timestamptz
--   $5  at most                  bigint
SELECT o.order_no, p.provider_txn_id, p.online_cents AS amount_cents, 0 AS line
  FROM payments p JOIN orders o ON o.id = p.order_id
 WHERE p.method = $2 AND p.online_cents > 0 AND p.paid_at >= $3 AND p.paid_at < $4
   AND NOT EXISTS (SELECT 1 FROM bill_rows b WHERE b.run_id = $1 AND b.kind = 'PAYMENT'
                    AND b.provider_txn_id = p.provider_txn_id)
   AND NOT EXISTS (SELECT 1 FROM reconciliation_heals h WHERE h.provider = $2
                    AND h.category = 'LOCAL_PAID_PROVIDER_MISSING' AND h.provider_txn_id = p.provider_txn_id)
 ORDER BY p.paid_at LIMIT $5
