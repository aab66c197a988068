-- Ends the session refresh token hash $1 belongs to (spent or not) and tells every instance.
-- No row: an unknown token, or a session that had ended already.
WITH ended AS (
    UPDATE member_sessions s SET ended_at = now(), end_reason = 'SIGNED_OUT'
      FROM refresh_tokens t
     WHERE t.hash = $1 AND s.id = t.session_id AND s.ended_at IS NULL
    RETURNING s.id
), told AS (
    SELECT pg_notify('fitorder_sessions', id) FROM ended
)
SELECT id, (SELECT count(*) FROM told) AS told FROM ended
