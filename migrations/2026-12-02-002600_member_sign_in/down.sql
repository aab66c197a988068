DROP TABLE wechat_access_tokens;
DROP TABLE refresh_tokens;
DROP TABLE member_sessions;
DROP TABLE wechat_bindings;
