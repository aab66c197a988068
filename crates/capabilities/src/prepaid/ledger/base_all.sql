), eve AS (
    -- What each order live at the end of the day before the range held then.
    SELECT coalesce(sum(p.amount - CASE
               WHEN p.kind = 'CLASS_PACK' THEN
                   CASE WHEN u.u0 >= p.sessions_total THEN p.amount ELSE p.amount / p.sessions_total * u.u0 END
               ELSE
                   CASE WHEN b.d0 - p.first + 1 - x.frozen >= p.days THEN p.amount
                        ELSE p.amount / p.days * greatest(0, b.d0 - p.first + 1 - x.frozen) END
           END), 0) AS cents
      FROM prepaid p CROSS JOIN bounds b
      LEFT JOIN used0 u ON u.id = p.id
      -- its dates frozen through the eve earned nothing
      CROSS JOIN LATERAL (SELECT coalesce(sum(greatest(0, least(f.f1, b.d0 + 1) - greatest(f.f0, p.first))), 0) AS frozen
                            FROM frozen f WHERE f.id = p.id) x
     WHERE p.paid_at < b.s
), wallet_eve AS (
    SELECT coalesce(sum(l.balance_delta + l.frozen_delta), 0) AS cents
      FROM wallet_ledger l JOIN members mb ON mb.id = l.member_id
     WHERE mb.store_id = $1 AND l.created_at < (SELECT s FROM bounds)
), base AS (
    SELECT (SELECT cents FROM eve) + (SELECT cents FROM wallet_eve) AS cents
)
