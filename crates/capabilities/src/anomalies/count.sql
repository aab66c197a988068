-- Anomaly counts by category in [$1, $2), from the rows the chain leaves behind: callback
-- outcomes, anomaly events (duplicate check-ins, ...), expiries, failed compensation attempts,
-- tickets. Narrowed to store $3 and to the stores $4 (a store-limited admin's), when given.
--
--   $1  from                    timestamptz
--   $2  to                      timestamptz
--   $3  store id, or NULL       bigint
--   $4  store ids, or NULL      bigint[]
WITH f AS (SELECT $1::timestamptz AS t0, $2::timestamptz AS t1),
 counted(category, store_id) AS (
    SELECT CASE outcome
             WHEN 'DUPLICATE' THEN 'DUPLICATE_CALLBACK'
             WHEN 'BAD_SIGNATURE' THEN 'BAD_SIGNATURE'
             WHEN 'REJECTED_TRANSITION' THEN 'ILLEGAL_TRANSITION'
             WHEN 'PAID_AFTER_CANCEL' THEN 'PAID_AFTER_CANCEL'
             WHEN 'AMOUNT_MISMATCH' THEN 'AMOUNT_MISMATCH'
           END, store_id
      FROM payment_callbacks, f WHERE received_at >= f.t0 AND received_at < f.t1
       AND outcome IN ('DUPLICATE', 'BAD_SIGNATURE', 'REJECTED_TRANSITION', 'PAID_AFTER_CANCEL', 'AMOUNT_MISMATCH')
    UNION ALL
    SELECT category, store_id FROM anomaly_events, f WHERE at >= f.t0 AND at < f.t1
    UNION ALL
    SELECT 'ORDER_EXPIRED', o.store_id FROM order_transitions t JOIN orders o ON o.id = t.order_id, f
     WHERE t.to_status = 'CANCELED' AND t.reason = 'TIMEOUT' AND t.at >= f.t0 AND t.at < f.t1
    UNION ALL
    SELECT 'COMPENSATION_RETRY', o.store_id FROM compensation_attempts a
      JOIN compensation_events e ON e.id = a.event_id JOIN orders o ON o.id = e.order_id, f
     WHERE NOT a.ok AND a.at >= f.t0 AND a.at < f.t1
    UNION ALL
    SELECT CASE WHEN kind = 'COMPENSATION_DEAD' THEN 'COMPENSATION_DEAD' ELSE 'RECONCILIATION_FINDING' END, store_id
      FROM exception_tickets, f WHERE opened_at >= f.t0 AND opened_at < f.t1
       AND (kind IN ('COMPENSATION_DEAD', 'PROVIDER_PAID_LOCAL_UNPAID', 'LOCAL_PAID_PROVIDER_MISSING', 'REFUND_MISMATCH')
            OR (kind = 'AMOUNT_MISMATCH' AND detail->>'source' = 'reconciliation'))
 )
 SELECT category, count(*) AS n FROM counted
  WHERE ($3::bigint IS NULL OR store_id = $3)
    AND ($4::bigint[] IS NULL OR store_id = ANY($4))
  GROUP BY category
