-- The trades opened at the providers for the online part of an order: one per order and
-- channel ("asking again for the same channel answers the same trade"), with exactly what the
-- member's client was given. All of a WeChat order's channels share its out_trade_no, as WeChat
-- allows; the provider takes at most one payment per out_trade_no.
CREATE TABLE payment_trades (
    id            BIGSERIAL PRIMARY KEY,
    order_id      BIGINT NOT NULL REFERENCES orders (id),
    provider      TEXT NOT NULL CHECK (provider IN ('WECHAT_PAY', 'ALIPAY')),
    channel       TEXT NOT NULL CHECK (channel IN ('WECHAT_JSAPI', 'WECHAT_NATIVE', 'WECHAT_APP', 'WECHAT_H5',
                                                    'ALIPAY_APP', 'ALIPAY_WAP', 'ALIPAY_QR')),
    out_trade_no  TEXT NOT NULL,
    amount_cents  BIGINT NOT NULL CHECK (amount_cents > 0),
    expires_at    TIMESTAMPTZ NOT NULL,
    -- The PaymentInstruction's channel fields (prepay parameters, QR text, page URL, order string).
    instruction   JSONB NOT NULL,
    trace_id      TEXT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT payment_trades_one_per_channel UNIQUE (order_id, channel),
    CONSTRAINT payment_trades_channel_of_provider CHECK (
        (provider = 'WECHAT_PAY') = (channel LIKE 'WECHAT\_%'))
);

-- WECHAT_JSAPI needs the payer's openid under WECHATPAY_APP_ID; remembered once given.
ALTER TABLE members ADD COLUMN wechat_open_id TEXT CHECK (wechat_open_id ~ '^[A-Za-z0-9_-]{1,128}$');
