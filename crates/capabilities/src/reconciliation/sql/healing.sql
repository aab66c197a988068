-- Per finding category, in [$1, $2): how many a reconciliation healed by itself, and how many
-- became tickets for a person; of the stores in $3 only (NULL: every store).
--
--   $1  from    timestamptz
--   $2  to      timestamptz
--   $3  stores  bigint[] (nullable)
SELECT c.category,
       (SELECT count(*) FROM reconciliation_heals h WHERE h.category = c.category
           AND h.created_at >= $1 AND h.created_at < $2
           AND ($3::bigint[] IS NULL OR EXISTS (SELECT 1 FROM orders o
                                                 WHERE o.order_no = h.order_no AND o.store_id = ANY ($3)))) AS healed,
       (SELECT count(*) FROM exception_tickets t WHERE t.kind = c.category
           AND t.detail->>'source' = 'reconciliation' AND t.opened_at >= $1 AND t.opened_at < $2
           AND ($3::bigint[] IS NULL OR t.store_id = ANY ($3))) AS ticketed
  FROM unnest(ARRAY['PROVIDER_PAID_LOCAL_UNPAID', 'LOCAL_PAID_PROVIDER_MISSING', 'AMOUNT_MISMATCH',
                    'REFUND_MISMATCH']) AS c(category)
