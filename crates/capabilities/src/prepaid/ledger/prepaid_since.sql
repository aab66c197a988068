       -- After a closed day: only the prepaid orders that change in the range — paid, checked
       -- in or refunded then, cards that start or end in it; what every other order holds is
       -- in the closing balance, what the cards running through it earn a day in its card
       -- rate ($6).
       AND o.id IN (
               SELECT id FROM orders
                WHERE store_id = $1 AND paid_at IS NOT NULL
                  AND (kind = 'MEMBERSHIP' OR (kind = 'CLASS_PACK' AND sessions_total > 1))
                  AND paid_at >= (SELECT s FROM bounds) AND paid_at < (SELECT e FROM bounds)
               UNION
               SELECT c.order_id FROM check_ins c
                WHERE c.at >= (SELECT s FROM bounds) AND c.at < (SELECT e FROM bounds)
               UNION
               SELECT r.order_id FROM refunds r
                WHERE r.created_at >= (SELECT s FROM bounds) AND r.created_at < (SELECT e FROM bounds)
               UNION
               -- cards that start or end in the range (or the day after it)
               SELECT ms.order_id FROM memberships ms
                WHERE ms.store_id = $1 AND ms.valid_from >= (SELECT s FROM bounds)
                  AND ms.valid_from < (SELECT e FROM bounds) + interval '1 day'
               UNION
               SELECT ms.order_id FROM memberships ms
                WHERE ms.store_id = $1 AND ms.valid_to >= (SELECT s FROM bounds)
                  AND ms.valid_to < (SELECT e FROM bounds) + interval '1 day'
               UNION
               -- cards ever frozen that are still valid at the range's start: their frozen
               -- dates and their later end are their own rows (a closed card rate counts every
               -- card by its plan alone)
               SELECT ms.order_id FROM memberships ms
                WHERE ms.store_id = $1 AND ms.frozen_days > 0 AND ms.valid_to >= (SELECT s FROM bounds)
                  AND ms.valid_from < (SELECT e FROM bounds))
), base_rate AS (
    -- The closed day's card rate, less the cards read here that it counts (they earn by their
    -- own rows): what the cards running through the range, unread, earn a day.
    SELECT $6::bigint - coalesce((
               SELECT sum(p.amount / p.days) FROM prepaid p, bounds b
                WHERE p.kind = 'MEMBERSHIP' AND p.paid_at < b.s
                  AND (p.refunded_at IS NULL OR p.refunded_at >= b.s)
                  AND p.first <= $2::date AND $2::date <= p.first + p.days - 1), 0) AS cents
