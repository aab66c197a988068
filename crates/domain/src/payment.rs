//! The payment vocabulary: who takes the money online, and which cashier the member opens.

use super::vocabulary::vocabulary;

vocabulary! {
    /// An online payment provider, as stored (`orders.online_provider`,
    /// `payment_trades.provider`, …) and shown.
    pub enum Provider {
        WechatPay = "WECHAT_PAY",
        Alipay = "ALIPAY",
    }
}

impl Provider {
    /// The cashier opened when the client names none (the contract's rule).
    pub fn default_channel(self) -> PayChannel {
        match self {
            Provider::WechatPay => PayChannel::WechatNative,
            Provider::Alipay => PayChannel::AlipayQr,
        }
    }

    /// The provider's short name: `--provider` of the CLI, the prefix of bill files
    /// (`wechatpay-2024-05-01.csv`).
    pub fn short_name(self) -> &'static str {
        match self {
            Provider::WechatPay => "wechatpay",
            Provider::Alipay => "alipay",
        }
    }

    /// The provider a short name (any case; WeChat Pay also as `wechat`, `wechat_pay`) names.
    pub fn from_short_name(name: &str) -> Option<Provider> {
        match name.to_ascii_lowercase().as_str() {
            "wechatpay" | "wechat" | "wechat_pay" => Some(Provider::WechatPay),
            "alipay" => Some(Provider::Alipay),
            _ => None,
        }
    }
}

vocabulary! {
    /// Which cashier the provider opens for the member.
    pub enum PayChannel {
        /// WeChat mini program / official account page (JSAPI prepay; needs the payer's openid).
        WechatJsapi = "WECHAT_JSAPI",
        /// A QR code the member scans (Native prepay, `code_url`).
        WechatNative = "WECHAT_NATIVE",
        /// The WeChat SDK inside a native app (APP prepay).
        WechatApp = "WECHAT_APP",
        /// A mobile browser outside WeChat (H5 prepay, `h5_url`).
        WechatH5 = "WECHAT_H5",
        /// The Alipay SDK inside a native app (`alipay.trade.app.pay` order string, signed locally).
        AlipayApp = "ALIPAY_APP",
        /// A mobile browser (`alipay.trade.wap.pay` page, signed locally).
        AlipayWap = "ALIPAY_WAP",
        /// A QR code the member scans (`alipay.trade.precreate`).
        AlipayQr = "ALIPAY_QR",
    }
}

impl PayChannel {
    pub fn provider(self) -> Provider {
        match self {
            PayChannel::WechatJsapi | PayChannel::WechatNative | PayChannel::WechatApp | PayChannel::WechatH5 => {
                Provider::WechatPay
            }
            PayChannel::AlipayApp | PayChannel::AlipayWap | PayChannel::AlipayQr => Provider::Alipay,
        }
    }
}

vocabulary! {
    /// How a payment callback ended (`payment_callbacks.outcome`, shown in `Order.callbacks`).
    pub enum CallbackOutcome {
        /// Recorded, not yet applied (its key is claimed when it is).
        Received = "RECEIVED",
        Applied = "APPLIED",
        Duplicate = "DUPLICATE",
        PaidAfterCancel = "PAID_AFTER_CANCEL",
        AmountMismatch = "AMOUNT_MISMATCH",
        RejectedTransition = "REJECTED_TRANSITION",
        UnknownOrder = "UNKNOWN_ORDER",
        BadSignature = "BAD_SIGNATURE",
        RefundRecorded = "REFUND_RECORDED",
        RefundFailed = "REFUND_FAILED",
        /// The provider confirmed a refund fitorder did not ask for, or for more than it asked.
        RefundMismatch = "REFUND_MISMATCH",
        Recorded = "RECORDED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_channels_belong_to_one_provider() {
        for c in PayChannel::ALL {
            assert_eq!(PayChannel::parse(c.as_str()), Some(c));
            let prefix = match c.provider() {
                Provider::WechatPay => "WECHAT_",
                Provider::Alipay => "ALIPAY_",
            };
            assert!(c.as_str().starts_with(prefix));
        }
        for p in Provider::ALL {
            assert_eq!(Provider::parse(p.as_str()), Some(p));
            assert_eq!(p.default_channel().provider(), p);
            assert_eq!(Provider::from_short_name(p.short_name()), Some(p));
        }
        assert_eq!(Provider::from_short_name("WeChat"), Some(Provider::WechatPay));
        // The stored name is a short name too (`--provider WECHAT_PAY`).
        assert_eq!(
            Provider::from_short_name(Provider::WechatPay.as_str()),
            Some(Provider::WechatPay)
        );
        assert_eq!(Provider::from_short_name("paypal"), None);
    }
}
