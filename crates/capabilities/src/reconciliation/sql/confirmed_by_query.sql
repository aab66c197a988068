-- The transactions of provider $1's bill day $2 that an earlier run confirmed by asking the
-- provider (no finding either).
--
--   $1  provider    text
--   $2  bill date   date
SELECT provider_txn_id AS v FROM reconciliation_heals
 WHERE provider = $1 AND bill_date = $2 AND category = 'LOCAL_PAID_PROVIDER_MISSING'
   AND provider_txn_id IS NOT NULL
