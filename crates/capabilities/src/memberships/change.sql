-- The one writer of a card's status, dates, holder and history (docs/prepaid-and-cards.md "Freezing and
-- transferring cards"): each change moves its card only if the card still has the status the caller
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
    SELECT m.id, m.member_id, m.store_id, m.valid_to FROM memberships m JOIN input i ON i.id = m.id
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
), queued AS (
    -- A renewal bought early starts when this card ends: it moves with this card's end (the
    -- holder's later active cards of the store, from this card's old end on).
    UPDATE memberships q
       SET valid_from = q.valid_from + make_interval(days => i.shift),
           valid_to = q.valid_to + make_interval(days => i.shift)
      FROM changed c JOIN input i ON i.id = c.id JOIN before b ON b.id = c.id
     WHERE i.shift <> 0 AND q.member_id = b.member_id AND q.store_id = b.store_id AND q.id <> c.id
       AND q.status = 'ACTIVE' AND q.valid_from >= b.valid_to
       AND NOT EXISTS (SELECT 1 FROM input j WHERE j.id = q.id)
), logged AS (
    INSERT INTO membership_events (membership_id, kind, from_status, to_status, actor, reason, summary,
                                   trace_id, from_member_id, to_member_id)
    SELECT c.id, i.kind, i.from_status, i.to_status, $10, i.reason, i.summary, $11,
           CASE WHEN i.kind = 'TRANSFERRED' THEN b.member_id END,
           CASE WHEN i.kind = 'TRANSFERRED' THEN c.member_id END
      FROM changed c JOIN input i ON i.id = c.id JOIN before b ON b.id = c.id
)
SELECT id FROM changed
