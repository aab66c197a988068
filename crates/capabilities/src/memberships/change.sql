-- The one writer of a card's status, dates, holder and history (README "Membership
-- operations"): each change moves its card only if the card still has the status the caller
-- saw (the trigger `membership_status_guard` holds the pairs), and writes the card's history
-- row in the same statement. A transfer and a scheduled freeze keep the status (from = to).
--
--   $1   membership ids             bigint[]
--   $2   statuses seen              text[]
--   $3   new statuses               text[]
--   $4   days validTo moves         int[]     (negative: back)
--   $5   days added to frozen_days  int[]     (negative: an early end gives days back)
--   $6   new holders                bigint[]  (NULL: the same)
--   $7   event kinds                text[]
--   $8   reasons                    text[]    (NULL: none given)
--   $9   summaries                  text[]
--   $10  actor                      text
--   $11  trace id                   text
--
-- Returns the ids of the cards changed (a card whose status moved on meanwhile is left out).
WITH input AS (
    SELECT *
      FROM unnest($1::bigint[], $2::text[], $3::text[], $4::int[], $5::int[], $6::bigint[],
                  $7::text[], $8::text[], $9::text[])
           AS i(id, from_status, to_status, shift, frozen, to_member, kind, reason, summary)
), before AS (
    SELECT m.id, m.member_id FROM memberships m JOIN input i ON i.id = m.id
), changed AS (
    UPDATE memberships m
       SET status = i.to_status,
           valid_to = m.valid_to + make_interval(days => i.shift),
           frozen_days = m.frozen_days + i.frozen,
           member_id = coalesce(i.to_member, m.member_id),
           ended_at = CASE WHEN i.to_status IN ('EXPIRED', 'REVOKED') THEN now() ELSE m.ended_at END,
           transferred_at = CASE WHEN i.kind = 'TRANSFERRED' THEN now() ELSE m.transferred_at END
      FROM input i
     WHERE m.id = i.id AND m.status = i.from_status
    RETURNING m.id, m.member_id
), logged AS (
    INSERT INTO membership_events (membership_id, kind, from_status, to_status, actor, reason, summary,
                                   trace_id, from_member_id, to_member_id)
    SELECT c.id, i.kind, i.from_status, i.to_status, $10, i.reason, i.summary, $11,
           CASE WHEN i.kind = 'TRANSFERRED' THEN b.member_id END,
           CASE WHEN i.kind = 'TRANSFERRED' THEN c.member_id END
      FROM changed c JOIN input i ON i.id = c.id JOIN before b ON b.id = c.id
)
SELECT id FROM changed
