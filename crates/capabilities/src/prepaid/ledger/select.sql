SELECT (SELECT d0 FROM bounds) AS day, 0::bigint AS collected_cents, 0::bigint AS refunded_cents,
       (SELECT cents FROM base)::bigint AS balance_cents, 0::bigint AS card_rate_cents
UNION ALL
SELECT day, collected::bigint, refunded::bigint,
       ((SELECT cents FROM base)
         + sum(change) OVER (ORDER BY day ROWS UNBOUNDED PRECEDING))::bigint,
       card_rate::bigint
  FROM daily
 ORDER BY day
