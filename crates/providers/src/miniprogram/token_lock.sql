-- Locks the access_token row of appid $1 and answers its token while it has more than $2
-- seconds left (NULL otherwise: the lock holder fetches a new one). Instances that wait here
-- read the token the holder stored.
SELECT CASE WHEN expires_at > now() + make_interval(secs => $2) THEN token END AS token
  FROM wechat_access_tokens WHERE app_id = $1 FOR UPDATE
