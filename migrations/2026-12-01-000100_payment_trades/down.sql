ALTER TABLE members DROP COLUMN wechat_open_id;
DROP TABLE payment_trades;
