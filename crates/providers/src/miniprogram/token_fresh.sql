-- The access_token held for appid $1 while it has more than $2 seconds left.
SELECT token FROM wechat_access_tokens
 WHERE app_id = $1 AND token IS NOT NULL AND expires_at > now() + make_interval(secs => $2)
