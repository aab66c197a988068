-- A store's takings per business date and payment method (`salesReport`): what came in from
-- orders and what went back, each on the date the money moved.
--
--   $1  store id                bigint
--   $2  first date              date    (inclusive)
--   $3  last date               date    (inclusive)
--   $4  business time zone      text    (FITORDER_TIMEZONE, as the prepaid ledger and the
--                                        reconciliation date their days)
--
-- A payment counts on the date it was applied (the provider's notification or trade query that
-- confirmed it, the wallet's capture, the desk's confirmation); a MIXED order counts its online
-- part under its provider and its wallet part under WALLET, an order once per method it was
-- paid with. A refund counts its wallet part when it was made (the wallet gets it at once),
-- its online part when the provider confirmed the money went back (its PROVIDER_REFUND event
-- SUCCEEDED: the delivery's answer or the provider's refund notification), an OFFLINE order's
-- when it was recorded (paid back at the desk). Top-ups are not sales (the prepaid ledger
-- has them), nor is money the provider took for an order already canceled (a paid-after-cancel,
-- refunded as such: its ticket says so).
WITH bounds AS (
    SELECT ($2::date::timestamp AT TIME ZONE $4) AS s, (($3::date + 1)::timestamp AT TIME ZONE $4) AS e
), taken AS (
    SELECT (p.paid_at AT TIME ZONE $4)::date AS day, part.method, count(*) AS n, sum(part.cents) AS cents
      FROM payments p
      JOIN orders o ON o.id = p.order_id
     CROSS JOIN LATERAL (
           SELECT o.online_provider AS method, p.online_cents AS cents WHERE o.payment_method = 'MIXED'
           UNION ALL
           SELECT 'WALLET', p.wallet_cents WHERE o.payment_method = 'MIXED'
           UNION ALL
           SELECT o.payment_method, p.amount_cents WHERE o.payment_method <> 'MIXED'
          ) part
     WHERE o.store_id = $1 AND part.cents > 0
       AND p.paid_at >= (SELECT s FROM bounds) AND p.paid_at < (SELECT e FROM bounds)
     GROUP BY 1, 2
), refund_parts AS (
    SELECT r.created_at AS at, 'WALLET' AS method, r.wallet_cents AS cents
      FROM refunds r JOIN orders o ON o.id = r.order_id
     WHERE o.store_id = $1 AND r.wallet_cents > 0
    UNION ALL
    SELECT r.created_at, 'OFFLINE', r.amount_cents
      FROM refunds r JOIN orders o ON o.id = r.order_id
     WHERE o.store_id = $1 AND o.payment_method = 'OFFLINE' AND r.amount_cents > 0
    UNION ALL
    SELECT e.updated_at, o.online_provider, r.online_cents
      FROM refunds r
      JOIN orders o ON o.id = r.order_id
      JOIN compensation_events e
        ON e.order_id = o.id AND e.kind = 'PROVIDER_REFUND' AND e.status = 'SUCCEEDED'
       AND e.payload->>'refundNo' = 'RF' || r.id
     WHERE o.store_id = $1 AND r.online_cents > 0
), refunded AS (
    SELECT (at AT TIME ZONE $4)::date AS day, method, sum(cents) AS cents
      FROM refund_parts
     WHERE at >= (SELECT s FROM bounds) AND at < (SELECT e FROM bounds)
     GROUP BY 1, 2
)
SELECT coalesce(t.day, r.day) AS day, coalesce(t.method, r.method) AS method,
       coalesce(t.n, 0)::int AS orders_paid, coalesce(t.cents, 0)::bigint AS taken_cents,
       coalesce(r.cents, 0)::bigint AS refunded_cents
  FROM taken t FULL JOIN refunded r ON r.day = t.day AND r.method = t.method
 ORDER BY 1, 2
