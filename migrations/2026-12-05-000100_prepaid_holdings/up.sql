-- What one member holds with one business operator now (README "Prepaid money"), as a function
-- so that a placing reads it in the same statement as the store's rules
-- (crates/capabilities/src/prepaid/rules_and_holdings.sql) and the others through holdings.sql.
--
-- The unused value of each prepaid order of theirs in the operator's stores that is WAIT_PAY,
-- PAID or CONSUMING, and their wallet money if their own store is the operator's. A card's
-- unused value is amount × unused days ÷ plan days: its days are the dates from the first
-- (valid_from's date) on, the used ones those through today; a card not started and a waiting
-- order are unused whole. A class pack's is amount × unused sessions ÷ sessions. A waiting MIXED
-- order counts in the total less its wallet part (the wallet holds that frozen).
CREATE FUNCTION prepaid_holdings(p_member bigint, p_operator text, p_today date, p_tz text)
RETURNS TABLE (membership_cents bigint, membership_days bigint, sessions_cents bigint,
               sessions_count bigint, wallet_cents bigint, total_cents bigint)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    WITH held AS (
        SELECT o.kind,
               o.status,
               o.wallet_amount_cents,
               CASE WHEN o.kind = 'MEMBERSHIP' THEN
                        CASE WHEN o.status = 'WAIT_PAY' OR m.valid_from IS NULL THEN o.plan_days
                             ELSE greatest(0, o.plan_days
                                  - least(o.plan_days, greatest(0, p_today - (m.valid_from AT TIME ZONE p_tz)::date + 1)))
                        END
                    ELSE o.sessions_total - o.sessions_used
               END AS unused,
               CASE WHEN o.kind = 'MEMBERSHIP' THEN o.plan_days ELSE o.sessions_total END AS whole,
               o.amount_cents
          FROM orders o
          JOIN stores s ON s.id = o.store_id AND s.operator_code = p_operator
          LEFT JOIN memberships m ON m.order_id = o.id
         WHERE o.member_id = p_member
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
          FROM members mb JOIN stores s ON s.id = mb.store_id AND s.operator_code = p_operator
         WHERE mb.id = p_member
    )
    SELECT coalesce(sum(value) FILTER (WHERE kind = 'MEMBERSHIP'), 0)::bigint AS membership_cents,
           coalesce(sum(unused) FILTER (WHERE kind = 'MEMBERSHIP'), 0)::bigint AS membership_days,
           coalesce(sum(value) FILTER (WHERE kind = 'CLASS_PACK'), 0)::bigint AS sessions_cents,
           coalesce(sum(unused) FILTER (WHERE kind = 'CLASS_PACK'), 0)::bigint AS sessions_count,
           (SELECT cents FROM wallet) AS wallet_cents,
           (coalesce(sum(in_total), 0) + (SELECT cents FROM wallet))::bigint AS total_cents
      FROM valued
$$;
