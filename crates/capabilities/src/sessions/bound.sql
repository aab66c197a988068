-- A new session for the member bound to openid $1 (or, failing that, to unionid $2):
-- session id $3, refresh token hash $4 valid for $5 seconds. The bound openid is also the
-- member's wechat_open_id (JSAPI payments). No row: nobody is bound to that WeChat account.
WITH bound AS (
    SELECT member_id FROM wechat_bindings
     WHERE openid = $1 OR (unionid IS NOT NULL AND unionid = $2)
     ORDER BY (openid = $1) DESC
     LIMIT 1
), payer AS (
    UPDATE members m SET wechat_open_id = $1
      FROM bound b
     WHERE m.id = b.member_id AND m.wechat_open_id IS DISTINCT FROM $1
), session AS (
    INSERT INTO member_sessions (id, member_id)
    SELECT $3, member_id FROM bound
    RETURNING id, member_id
), token AS (
    INSERT INTO refresh_tokens (hash, session_id, expires_at)
    SELECT $4, id, now() + make_interval(secs => $5) FROM session
    RETURNING expires_at
)
SELECT session.member_id, token.expires_at FROM session, token
