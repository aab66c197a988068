), frozen AS MATERIALIZED (
    -- The frozen dates of those cards, [from, until): they earn nothing then (docs/prepaid-and-cards.md
    -- "Freezing and transferring cards"); only freezes that started (running or done) count.
    SELECT p.id, f.from_date AS f0, f.until_date AS f1
      FROM prepaid p JOIN membership_freezes f ON f.membership_id = p.card
     WHERE p.kind = 'MEMBERSHIP' AND f.state IN ('RUNNING', 'DONE') AND f.until_date > f.from_date
), ci AS MATERIALIZED (
    -- Check-ins of those packs from the start of the range on (later ones too: they tell how
    -- many sessions were used on the eve).
    SELECT c.order_id, c.id, c.at, c.sessions
      FROM check_ins c JOIN prepaid p ON p.id = c.order_id AND p.kind = 'CLASS_PACK'
     WHERE c.at >= (SELECT s FROM bounds)
), used0 AS MATERIALIZED (
    SELECT p.id, p.sessions_used - coalesce(x.n, 0) AS u0
      FROM prepaid p
      LEFT JOIN (SELECT order_id, sum(sessions) AS n FROM ci GROUP BY order_id) x ON x.order_id = p.id
     WHERE p.kind = 'CLASS_PACK'
), moves AS (
    -- Every change of what the orders hold, by date, within the range.
    SELECT pd AS day, amount AS delta FROM prepaid WHERE paid_at >= (SELECT s FROM bounds)
    UNION ALL
    -- A check-in earns what moves the pack from the sessions used before it to those after.
    SELECT day, -(CASE WHEN after >= total THEN amount ELSE amount / total * after END
                 - CASE WHEN before >= total THEN amount ELSE amount / total * before END)
      FROM (SELECT (c.at AT TIME ZONE $4)::date AS day, p.amount, p.sessions_total AS total,
                   u.u0 + sum(c.sessions) OVER w AS after,
                   u.u0 + sum(c.sessions) OVER w - c.sessions AS before
              FROM ci c JOIN prepaid p ON p.id = c.order_id JOIN used0 u ON u.id = c.order_id
             WHERE c.at < (SELECT e FROM bounds)
            WINDOW w AS (PARTITION BY c.order_id ORDER BY c.at, c.id ROWS UNBOUNDED PRECEDING)) k
    UNION ALL
    -- Its last date (later by its frozen days) also earns the remainder.
    SELECT p.first + p.days + p.fz - 1, -(p.amount - p.amount / p.days * p.days)
      FROM prepaid p
     WHERE p.kind = 'MEMBERSHIP'
       AND p.first + p.days + p.fz - 1 BETWEEN $2::date AND $3::date
       AND (p.rd IS NULL OR p.first + p.days + p.fz - 1 < p.rd)
    UNION ALL
    -- A refund takes out what the order still held (a pack's check-ins of that day counted above).
    SELECT p.rd, -(p.amount - CASE
               WHEN p.kind = 'CLASS_PACK' THEN
                   CASE WHEN p.sessions_used >= p.sessions_total THEN p.amount
                        ELSE p.amount / p.sessions_total * p.sessions_used END
               ELSE
                   CASE WHEN p.rd - p.first - x.frozen >= p.days THEN p.amount
                        ELSE p.amount / p.days * greatest(0, p.rd - p.first - x.frozen) END
           END)
      FROM prepaid p
      -- its dates frozen before the refund's earned nothing
      CROSS JOIN LATERAL (SELECT coalesce(sum(greatest(0, least(f.f1, p.rd) - greatest(f.f0, p.first))), 0) AS frozen
                            FROM frozen f WHERE f.id = p.id) x
     WHERE p.refunded_at >= (SELECT s FROM bounds) AND p.refunded_at < (SELECT e FROM bounds)
), windows AS (
    -- The dates a card earns on within the range: from its first (or the range's) through its
    -- last, later by its frozen days (or the day before its refund, or the range's end).
    SELECT p.id, p.amount / p.days AS per_day,
           greatest(p.first, $2::date, p.pd) AS w0,
           least(p.first + p.days + p.fz - 1, coalesce(p.rd - 1, $3::date), $3::date) AS w1
      FROM prepaid p
     WHERE p.kind = 'MEMBERSHIP'
), rate AS (
    -- A card earns amount ÷ days on each date it is held and not frozen: a difference array
    -- of the daily rate, two rows a card however long it runs, and two for each freeze.
    SELECT w0 AS day, -per_day AS delta FROM windows WHERE w0 <= w1
    UNION ALL
    SELECT w1 + 1, per_day FROM windows WHERE w0 <= w1
    UNION ALL
    SELECT greatest(f.f0, w.w0), per_day
      FROM windows w JOIN frozen f ON f.id = w.id
     WHERE greatest(f.f0, w.w0) <= least(f.f1 - 1, w.w1)
    UNION ALL
    SELECT least(f.f1 - 1, w.w1) + 1, -per_day
      FROM windows w JOIN frozen f ON f.id = w.id
     WHERE greatest(f.f0, w.w0) <= least(f.f1 - 1, w.w1)
    UNION ALL
    -- The cards earning since before the range that are not read here (`base_rate`).
    SELECT $2::date, -(SELECT cents FROM base_rate)
), next_rate AS (
    -- What the cards held at the end of each day earn the next day by their plans alone (kept
    -- with a closed day, so that the days after it need not read the cards running through
    -- them; a card ever frozen is read by every range it is valid in, see `prepaid_since`): a
    -- card counts from the day it is paid or the day before its first, through the day before
    -- its plan's last or its refund.
    SELECT greatest(p.pd, p.first - 1, $2::date) AS day, p.amount / p.days AS delta
      FROM prepaid p
     WHERE p.kind = 'MEMBERSHIP'
       AND greatest(p.pd, p.first - 1, $2::date) <= least(coalesce(p.rd - 1, $3::date), p.first + p.days - 2, $3::date)
    UNION ALL
    SELECT least(coalesce(p.rd - 1, $3::date), p.first + p.days - 2, $3::date) + 1, -(p.amount / p.days)
      FROM prepaid p
     WHERE p.kind = 'MEMBERSHIP'
       AND greatest(p.pd, p.first - 1, $2::date) <= least(coalesce(p.rd - 1, $3::date), p.first + p.days - 2, $3::date)
    UNION ALL
    SELECT $2::date, (SELECT cents FROM base_rate)
), card_rates AS (
    SELECT d.day, sum(coalesce(r.delta, 0)) OVER (ORDER BY d.day ROWS UNBOUNDED PRECEDING) AS rate
      FROM days d
      LEFT JOIN (SELECT day, sum(delta) AS delta FROM next_rate GROUP BY day) r ON r.day = d.day
     WHERE d.day >= $2::date
), card_days AS (
    -- What the cards earn each day: the rate's running sum.
    SELECT d.day, sum(coalesce(r.delta, 0)) OVER (ORDER BY d.day ROWS UNBOUNDED PRECEDING) AS delta
      FROM days d
      LEFT JOIN (SELECT day, sum(delta) AS delta FROM rate GROUP BY day) r ON r.day = d.day
     WHERE d.day >= $2::date
), order_days AS (
    SELECT day, sum(delta) AS delta FROM moves WHERE day <= $3::date GROUP BY day
), wallet_moves AS (
    SELECT l.created_at AS at, l.balance_delta + l.frozen_delta AS delta, l.kind
      FROM wallet_ledger l JOIN members mb ON mb.id = l.member_id
     WHERE mb.store_id = $1 AND l.created_at >= (SELECT s FROM bounds) AND l.created_at < (SELECT e FROM bounds)
), wallet_days AS (
    SELECT (at AT TIME ZONE $4)::date AS day, sum(delta) AS delta,
           sum(delta) FILTER (WHERE kind = 'TOP_UP') AS topped_up
      FROM wallet_moves
     GROUP BY 1
), collected AS (
    SELECT pd AS day, sum(amount - wallet_amount_cents) AS cents
      FROM prepaid WHERE paid_at >= (SELECT s FROM bounds) GROUP BY pd
), refunded AS (
    SELECT (r.created_at AT TIME ZONE $4)::date AS day, sum(r.amount_cents - r.wallet_cents) AS cents
      FROM refunds r JOIN prepaid p ON p.id = r.order_id
     WHERE r.created_at >= (SELECT s FROM bounds) AND r.created_at < (SELECT e FROM bounds)
     GROUP BY 1
), daily AS (
    SELECT d.day,
           coalesce(c.cents, 0) + coalesce(w.topped_up, 0) AS collected,
           coalesce(r.cents, 0) AS refunded,
           coalesce(m.delta, 0) + coalesce(k.delta, 0) + coalesce(w.delta, 0) AS change,
           coalesce(q.rate, 0) AS card_rate
      FROM days d
      LEFT JOIN card_rates q ON q.day = d.day
      LEFT JOIN order_days m ON m.day = d.day
      LEFT JOIN card_days k ON k.day = d.day
      LEFT JOIN wallet_days w ON w.day = d.day
      LEFT JOIN collected c ON c.day = d.day
      LEFT JOIN refunded r ON r.day = d.day
     WHERE d.day >= $2::date
