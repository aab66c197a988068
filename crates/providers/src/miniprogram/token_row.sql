-- The access_token row of appid $1, made empty if there is none yet.
INSERT INTO wechat_access_tokens (app_id) VALUES ($1) ON CONFLICT (app_id) DO NOTHING
