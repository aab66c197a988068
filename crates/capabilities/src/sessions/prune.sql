-- Prunes sign-in sessions that can no longer be used: refresh tokens expired more than a day
-- ago (at most $1 a run), then the sessions left without any token (their access tokens
-- expired long before their last refresh token did). Returns how many rows went.
WITH gone AS (
    DELETE FROM refresh_tokens
     WHERE hash IN (SELECT hash FROM refresh_tokens WHERE expires_at < now() - interval '1 day'
                     ORDER BY expires_at LIMIT $1)
    RETURNING hash, session_id
), sessions AS (
    -- The foreign key is checked at the end of the statement, after `gone`.
    DELETE FROM member_sessions s
     WHERE s.id IN (SELECT session_id FROM gone)
       AND NOT EXISTS (SELECT 1 FROM refresh_tokens t
                        WHERE t.session_id = s.id AND t.hash NOT IN (SELECT hash FROM gone))
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM sessions) AS n
