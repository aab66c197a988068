-- Binds openid $1 (unionid $2) to member $3; the member pays JSAPI orders with that openid.
WITH bound AS (
    INSERT INTO wechat_bindings (openid, unionid, member_id) VALUES ($1, $2, $3)
    RETURNING member_id
)
UPDATE members m SET wechat_open_id = $1 FROM bound b WHERE m.id = b.member_id
