//! What an order is for and how it is paid.

use super::payment::Provider;
use super::vocabulary::vocabulary;

vocabulary! {
    /// What was bought.
    pub enum OrderKind {
        Membership = "MEMBERSHIP",
        ClassPack = "CLASS_PACK",
        PrivateSession = "PRIVATE_SESSION",
    }
}

vocabulary! {
    /// What a happening in an order's chain (its timeline) is.
    pub enum TimelineKind {
        StatusChange = "STATUS_CHANGE",
        Callback = "CALLBACK",
        CompensationAttempt = "COMPENSATION_ATTEMPT",
        CompensationReplay = "COMPENSATION_REPLAY",
        CheckIn = "CHECK_IN",
        Ticket = "TICKET",
    }
}

vocabulary! {
    /// How an order is paid (`orders.payment_method`); a payment row's method is the one that
    /// took the money (a MIXED order's payment is its online provider's).
    pub enum PaymentMethod {
        WechatPay = "WECHAT_PAY",
        Alipay = "ALIPAY",
        Wallet = "WALLET",
        Offline = "OFFLINE",
        Mixed = "MIXED",
    }
}

impl PaymentMethod {
    /// The provider the method itself names (WECHAT_PAY, ALIPAY); MIXED names none of its own.
    pub fn provider(self) -> Option<Provider> {
        match self {
            PaymentMethod::WechatPay => Some(Provider::WechatPay),
            PaymentMethod::Alipay => Some(Provider::Alipay),
            PaymentMethod::Wallet | PaymentMethod::Offline | PaymentMethod::Mixed => None,
        }
    }

    /// Part of the price is paid online (WECHAT_PAY, ALIPAY, the online part of MIXED).
    pub fn is_online(self) -> bool {
        matches!(
            self,
            PaymentMethod::WechatPay | PaymentMethod::Alipay | PaymentMethod::Mixed
        )
    }
}

impl From<Provider> for PaymentMethod {
    fn from(p: Provider) -> PaymentMethod {
        match p {
            Provider::WechatPay => PaymentMethod::WechatPay,
            Provider::Alipay => PaymentMethod::Alipay,
        }
    }
}

/// The cancel reason of an order that timed out (`orders.cancel_reason` holds the canceller's
/// own words otherwise; this one is reserved).
pub const TIMEOUT_REASON: &str = "TIMEOUT";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn online_methods_and_their_providers() {
        for m in PaymentMethod::ALL {
            assert_eq!(PaymentMethod::parse(m.as_str()), Some(m));
            if let Some(p) = m.provider() {
                assert!(m.is_online());
                assert_eq!(PaymentMethod::from(p), m);
                assert_eq!(p.as_str(), m.as_str());
            }
        }
        assert!(PaymentMethod::Mixed.is_online());
        assert!(!PaymentMethod::Wallet.is_online() && !PaymentMethod::Offline.is_online());
    }
}
