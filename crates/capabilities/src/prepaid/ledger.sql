-- The prepaid ledger (预收资金台账) of one store: one row per date of [$2, $3], and the day
-- before, with the money coming in (collected), going out of the business (refunded) and the
-- balance the store holds at the end of the day. Earned, the rest of the day's change, is
-- balance(day before) + collected − refunded − balance, computed by the caller, so the
-- identity holds to the cent by construction; what makes earned up is the balance's rules:
--
--   held = wallet money of the store's members (frozen or not)
--        + for each prepaid order of the store (a card, a class pack of more than one session)
--          paid by the end of the day and not refunded by then: amount − earned so far, where
--          a class pack earns amount ÷ sessions (rounded down) per session checked in, all of
--          it with the last; a card amount ÷ plan days per date from its first through the day,
--          all of it on its last.
--
--   $1  store id     bigint
--   $2  from         date
--   $3  to           date
--   $4  time zone    text
WITH days AS (
    SELECT d::date AS day, ((d::date + 1)::timestamp AT TIME ZONE $4) AS day_end
      FROM generate_series($2::date - 1, $3::date, interval '1 day') AS d
), span AS (
    SELECT min(day_end) AS first_end, max(day_end) AS last_end FROM days
), prepaid AS (
    SELECT o.id, o.kind, o.amount_cents, o.wallet_amount_cents, o.sessions_total, o.sessions_used,
           o.plan_days, o.paid_at, o.refunded_at,
           coalesce((m.valid_from AT TIME ZONE $4)::date, (o.paid_at AT TIME ZONE $4)::date) AS first_date
      FROM orders o
      LEFT JOIN memberships m ON m.order_id = o.id
     WHERE o.store_id = $1
       AND o.paid_at IS NOT NULL
       AND o.paid_at < (SELECT last_end FROM span)
       AND (o.refunded_at IS NULL OR o.refunded_at >= (SELECT first_end FROM span))
       AND (o.kind = 'MEMBERSHIP' OR (o.kind = 'CLASS_PACK' AND o.sessions_total > 1))
), later_check_ins AS (
    -- Sessions checked in after the first day's end: used(day) = sessions_used − those after it.
    SELECT c.order_id, c.at, c.sessions
      FROM check_ins c JOIN prepaid p ON p.id = c.order_id AND p.kind = 'CLASS_PACK'
     WHERE c.at >= (SELECT first_end FROM span)
), held AS (
    SELECT d.day,
           sum(p.amount_cents - CASE
               WHEN p.kind = 'CLASS_PACK' THEN
                   CASE WHEN u.used >= p.sessions_total THEN p.amount_cents
                        ELSE (p.amount_cents / p.sessions_total) * u.used END
               ELSE
                   CASE WHEN d.day - p.first_date + 1 >= p.plan_days THEN p.amount_cents
                        ELSE (p.amount_cents / p.plan_days) * greatest(0, d.day - p.first_date + 1) END
           END) AS cents
      FROM days d
      JOIN prepaid p ON p.paid_at < d.day_end AND (p.refunded_at IS NULL OR p.refunded_at >= d.day_end)
      CROSS JOIN LATERAL (
          SELECT p.sessions_used - coalesce((SELECT sum(l.sessions) FROM later_check_ins l
                                              WHERE l.order_id = p.id AND l.at >= d.day_end), 0) AS used
      ) u
     GROUP BY d.day
), wallet_moves AS (
    SELECT l.created_at AS at, l.balance_delta + l.frozen_delta AS delta, l.kind
      FROM wallet_ledger l JOIN members mb ON mb.id = l.member_id
     WHERE mb.store_id = $1 AND l.created_at < (SELECT last_end FROM span)
), wallet AS (
    SELECT d.day,
           coalesce((SELECT sum(w.delta) FROM wallet_moves w WHERE w.at < d.day_end), 0) AS cents,
           coalesce((SELECT sum(w.delta) FROM wallet_moves w
                      WHERE w.kind = 'TOP_UP' AND w.at >= (d.day::timestamp AT TIME ZONE $4)
                        AND w.at < d.day_end), 0) AS topped_up
      FROM days d
), collected AS (
    SELECT d.day, coalesce(sum(p.amount_cents - p.wallet_amount_cents), 0) AS cents
      FROM days d
      LEFT JOIN prepaid p ON p.paid_at >= (d.day::timestamp AT TIME ZONE $4) AND p.paid_at < d.day_end
     GROUP BY d.day
), refunded AS (
    SELECT d.day, coalesce(sum(r.amount_cents - r.wallet_cents), 0) AS cents
      FROM days d
      LEFT JOIN (refunds r JOIN prepaid p ON p.id = r.order_id)
        ON r.created_at >= (d.day::timestamp AT TIME ZONE $4) AND r.created_at < d.day_end
     GROUP BY d.day
)
SELECT d.day,
       (c.cents + w.topped_up)::bigint AS collected_cents,
       r.cents::bigint AS refunded_cents,
       (w.cents + coalesce(h.cents, 0))::bigint AS balance_cents
  FROM days d
  JOIN wallet w ON w.day = d.day
  JOIN collected c ON c.day = d.day
  JOIN refunded r ON r.day = d.day
  LEFT JOIN held h ON h.day = d.day
 ORDER BY d.day
