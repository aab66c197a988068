-- Stores a fetched access_token $2 of appid $1, valid for $3 seconds.
UPDATE wechat_access_tokens
   SET token = $2, expires_at = now() + make_interval(secs => $3), fetched_at = now()
 WHERE app_id = $1
