-- What one member holds with one business operator now (README "Prepaid money"): the unused
-- value of each prepaid order of theirs in the operator's stores that is WAIT_PAY, PAID or
-- CONSUMING, and their wallet money if their own store is the operator's.
--
--   $1  member id        bigint
--   $2  operator code    text
--   $3  today            date    (business time zone)
--   $4  time zone        text
--
-- A card's unused value is amount × unused days ÷ plan days: its days are the dates from the
-- first (valid_from's date) on, the used ones those through today; a card not started and a
-- waiting order are unused whole. A class pack's is amount × unused sessions ÷ sessions. A
-- waiting MIXED order counts in the total less its wallet part (the wallet holds that frozen).
WITH held AS (
    SELECT o.kind,
           o.status,
           o.wallet_amount_cents,
           CASE WHEN o.kind = 'MEMBERSHIP' THEN
                    CASE WHEN o.status = 'WAIT_PAY' OR m.valid_from IS NULL THEN o.plan_days
                         ELSE greatest(0, o.plan_days
                              - least(o.plan_days, greatest(0, $3 - (m.valid_from AT TIME ZONE $4)::date + 1)))
                    END
                ELSE o.sessions_total - o.sessions_used
           END AS unused,
           CASE WHEN o.kind = 'MEMBERSHIP' THEN o.plan_days ELSE o.sessions_total END AS whole,
           o.amount_cents
      FROM orders o
      JOIN stores s ON s.id = o.store_id AND s.operator_code = $2
      LEFT JOIN memberships m ON m.order_id = o.id
     WHERE o.member_id = $1
       AND o.status IN ('WAIT_PAY', 'PAID', 'CONSUMING')
       AND (o.kind = 'MEMBERSHIP' OR (o.kind = 'CLASS_PACK' AND o.sessions_total > 1))
), valued AS (
    SELECT kind, unused,
           (amount_cents * unused / greatest(whole, 1))::bigint AS value,
           (amount_cents * unused / greatest(whole, 1))::bigint
             - CASE WHEN status = 'WAIT_PAY' THEN wallet_amount_cents ELSE 0 END AS in_total
      FROM held
), wallet AS (
    SELECT coalesce(sum(mb.balance_cents + mb.frozen_cents), 0)::bigint AS cents
      FROM members mb JOIN stores s ON s.id = mb.store_id AND s.operator_code = $2
     WHERE mb.id = $1
)
SELECT coalesce(sum(value) FILTER (WHERE kind = 'MEMBERSHIP'), 0)::bigint AS membership_cents,
       coalesce(sum(unused) FILTER (WHERE kind = 'MEMBERSHIP'), 0)::bigint AS membership_days,
       coalesce(sum(value) FILTER (WHERE kind = 'CLASS_PACK'), 0)::bigint AS sessions_cents,
       coalesce(sum(unused) FILTER (WHERE kind = 'CLASS_PACK'), 0)::bigint AS sessions_count,
       (SELECT cents FROM wallet) AS wallet_cents,
       (coalesce(sum(in_total), 0) + (SELECT cents FROM wallet))::bigint AS total_cents
  FROM valued
