-- A card's birth, ACTIVE (its order paid), with the first row of its history, in one
-- statement: the only INSERT into memberships.
--
--   $1  member id      bigint
--   $2  store id       bigint
--   $3  plan id        bigint
--   $4  order id       bigint
--   $5  valid from     timestamptz
--   $6  valid to       timestamptz
--   $7  actor          text
--   $8  summary        text
--   $9  trace id       text
WITH card AS (
    INSERT INTO memberships (member_id, store_id, plan_id, order_id, status, valid_from, valid_to)
    VALUES ($1, $2, $3, $4, 'ACTIVE', $5, $6)
    RETURNING id
), logged AS (
    INSERT INTO membership_events (membership_id, kind, from_status, to_status, actor, summary, trace_id)
    SELECT id, 'STARTED', NULL, 'ACTIVE', $7, $8, $9 FROM card
)
SELECT id FROM card
