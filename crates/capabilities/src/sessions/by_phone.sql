-- The member with phone $1 a first sign-in binds to: the one of store $2 if there is one,
-- otherwise the oldest (members are per store; one WeChat account binds one member).
SELECT id, store_id, name, phone, balance_cents, frozen_cents, created_at
  FROM members
 WHERE phone = $1
 ORDER BY (store_id = $2) IS TRUE DESC, id
 LIMIT 1
