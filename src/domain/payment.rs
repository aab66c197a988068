//! The payment vocabulary: who takes the money online, and which cashier the member opens.

use std::fmt;

/// An online payment provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    WechatPay,
    Alipay,
}

impl Provider {
    pub const ALL: [Provider; 2] = [Provider::WechatPay, Provider::Alipay];

    /// As stored (`orders.online_provider`, `payment_trades.provider`, …) and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::WechatPay => "WECHAT_PAY",
            Provider::Alipay => "ALIPAY",
        }
    }

    pub fn parse(s: &str) -> Option<Provider> {
        Provider::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The cashier opened when the client names none (the contract's rule).
    pub fn default_channel(self) -> PayChannel {
        match self {
            Provider::WechatPay => PayChannel::WechatNative,
            Provider::Alipay => PayChannel::AlipayQr,
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which cashier the provider opens for the member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayChannel {
    /// WeChat mini program / official account page (JSAPI prepay; needs the payer's openid).
    WechatJsapi,
    /// A QR code the member scans (Native prepay, `code_url`).
    WechatNative,
    /// The WeChat SDK inside a native app (APP prepay).
    WechatApp,
    /// A mobile browser outside WeChat (H5 prepay, `h5_url`).
    WechatH5,
    /// The Alipay SDK inside a native app (`alipay.trade.app.pay` order string, signed locally).
    AlipayApp,
    /// A mobile browser (`alipay.trade.wap.pay` page, signed locally).
    AlipayWap,
    /// A QR code the member scans (`alipay.trade.precreate`).
    AlipayQr,
}

impl PayChannel {
    pub const ALL: [PayChannel; 7] = [
        PayChannel::WechatJsapi,
        PayChannel::WechatNative,
        PayChannel::WechatApp,
        PayChannel::WechatH5,
        PayChannel::AlipayApp,
        PayChannel::AlipayWap,
        PayChannel::AlipayQr,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PayChannel::WechatJsapi => "WECHAT_JSAPI",
            PayChannel::WechatNative => "WECHAT_NATIVE",
            PayChannel::WechatApp => "WECHAT_APP",
            PayChannel::WechatH5 => "WECHAT_H5",
            PayChannel::AlipayApp => "ALIPAY_APP",
            PayChannel::AlipayWap => "ALIPAY_WAP",
            PayChannel::AlipayQr => "ALIPAY_QR",
        }
    }

    pub fn parse(s: &str) -> Option<PayChannel> {
        PayChannel::ALL.into_iter().find(|c| c.as_str() == s)
    }

    pub fn provider(self) -> Provider {
        match self {
            PayChannel::WechatJsapi | PayChannel::WechatNative | PayChannel::WechatApp | PayChannel::WechatH5 => {
                Provider::WechatPay
            }
            PayChannel::AlipayApp | PayChannel::AlipayWap | PayChannel::AlipayQr => Provider::Alipay,
        }
    }
}

impl fmt::Display for PayChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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
        }
    }
}
