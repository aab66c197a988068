-- How many rows the books have for provider $2's bill of [$3, $4): online payments made then,
-- and refunds asked of the provider then.
--
--   $1  run id (unused: the binds of every count are the same)   bigint
--   $2  provider                                                  text
--   $3  start of the bill day                                     timestamptz
--   $4  end of the bill day                                       timestamptz
SELECT (SELECT count(*) FROM payments p WHERE p.method = $2 AND p.online_cents > 0 AND p.paid_at >= $3 AND p.paid_at < $4)
     + (SELECT count(*) FROM compensation_events e WHERE e.kind = 'PROVIDER_REFUND' AND e.payload->>'provider' = $2
           AND e.created_at >= $3 AND e.created_at < $4) AS n
