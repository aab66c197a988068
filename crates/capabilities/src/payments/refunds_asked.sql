-- What fitorder asked provider $1 to refund on order $2 (its PROVIDER_REFUND events): the
-- amount of refund $3 (NULL when it never asked for that one) and of all of them together.
--
--   $1  provider        text
--   $2  order number    text
--   $3  refund number   text
SELECT max((payload->>'amountCents')::bigint) FILTER (WHERE payload->>'refundNo' = $3) AS this_cents,
       coalesce(sum((payload->>'amountCents')::bigint), 0)::bigint AS all_cents
  FROM compensation_events
 WHERE kind = 'PROVIDER_REFUND' AND payload->>'provider' = $1 AND payload->>'orderNo' = $2
