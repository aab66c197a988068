-- A member's wallet movements, newest first in write order, each with the spendable balance
-- (the money not frozen) after it: the running sum of the ledger, which is the balance's only
-- writer from the member's first row on (`wallet_ledger_apply`).
-- $1 member id, $2 the id after which the page starts (0: from the newest), $3 rows.
SELECT l.id, l.created_at, l.kind, l.balance_delta, l.frozen_delta, l.reference, o.order_no, l.trace_id,
       l.balance_after
  FROM (SELECT id, created_at, kind, balance_delta, frozen_delta, reference, order_id, trace_id,
               (sum(balance_delta) OVER (ORDER BY id))::bigint AS balance_after
          FROM wallet_ledger
         WHERE member_id = $1) l
  LEFT JOIN orders o ON o.id = l.order_id
 WHERE $2 = 0 OR l.id < $2
 ORDER BY l.id DESC
 LIMIT $3
