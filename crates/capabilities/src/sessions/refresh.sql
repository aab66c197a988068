-- Spends refresh token hash $1 for a new one, hash $2 valid for $3 seconds, in one statement.
-- The presented token's row is locked first, so of two racing presentations of one token the
-- second sees it spent. A token presented again after it was spent ends its whole session
-- (every access and refresh token of it) and tells every instance (NOTIFY fitorder_sessions).
-- No row: an unknown token. `refresh_expires_at` NULL: nothing was issued (spent, expired, or
-- the session had ended); `reused`: this presentation ended the session.
WITH presented AS (
    SELECT t.hash, t.session_id, t.spent_at, t.expires_at, s.member_id, s.ended_at
      FROM refresh_tokens t
      JOIN member_sessions s ON s.id = t.session_id
     WHERE t.hash = $1
       FOR UPDATE OF t
), spent AS (
    UPDATE refresh_tokens t SET spent_at = now()
      FROM presented p
     WHERE t.hash = p.hash AND p.spent_at IS NULL AND p.ended_at IS NULL AND p.expires_at > now()
    RETURNING t.session_id
), fresh AS (
    INSERT INTO refresh_tokens (hash, session_id, expires_at)
    SELECT $2, session_id, now() + make_interval(secs => $3) FROM spent
    RETURNING expires_at
), ended AS (
    UPDATE member_sessions s SET ended_at = now(), end_reason = 'REFRESH_REUSED'
      FROM presented p
     WHERE s.id = p.session_id AND p.spent_at IS NOT NULL AND s.ended_at IS NULL
    RETURNING s.id
), told AS (
    SELECT pg_notify('fitorder_sessions', id) FROM ended
)
SELECT p.session_id,
       p.member_id,
       p.spent_at IS NOT NULL AS was_spent,
       (SELECT expires_at FROM fresh) AS refresh_expires_at,
       (SELECT count(*) FROM told) > 0 AS reused
  FROM presented p
