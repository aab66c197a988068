), prepaid AS (
    -- Prepaid orders of the store that held money at some time of the range, or at its eve
    -- (`prepaid_since` narrows them to those that change in the range).
    SELECT o.id, o.kind, o.amount_cents AS amount, o.wallet_amount_cents, o.sessions_total,
           o.sessions_used, greatest(o.plan_days, 1) AS days, o.paid_at, o.refunded_at,
           (o.paid_at AT TIME ZONE $4)::date AS pd,
           (o.refunded_at AT TIME ZONE $4)::date AS rd,
           coalesce((m.valid_from AT TIME ZONE $4)::date, (o.paid_at AT TIME ZONE $4)::date) AS first,
           -- A card's days frozen so far (a running freeze's whole): its last date is that much
           -- later, and its frozen dates earn nothing (`frozen`).
           m.id AS card, coalesce(m.frozen_days, 0) AS fz
      FROM orders o
      LEFT JOIN memberships m ON m.order_id = o.id
     WHERE o.store_id = $1
       AND o.paid_at IS NOT NULL
       AND (o.kind = 'MEMBERSHIP' OR (o.kind = 'CLASS_PACK' AND o.sessions_total > 1))
       AND o.paid_at < (SELECT e FROM bounds)
       AND (o.refunded_at IS NULL OR o.refunded_at >= (SELECT s FROM bounds))
