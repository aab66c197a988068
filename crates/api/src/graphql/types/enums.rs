//! The GraphQL faces of the studio's words: each enum mirrors its `domain` enum
//! (`#[graphql(remote)]` derives the conversions both ways), so resolvers take and return the
//! domain's words and the schema's names are checked against the domain's texts below.
//! No doc comments on the plain mirrors: they would become descriptions in the served schema.

use async_graphql::Enum;

#[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
#[graphql(remote = "crate::domain::OrderStatus")]
pub enum OrderStatus {
    WaitPay,
    Paid,
    Consuming,
    Consumed,
    Canceled,
    Refunded,
}

#[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
#[graphql(remote = "crate::domain::OrderKind")]
pub enum OrderKind {
    Membership,
    ClassPack,
    PrivateSession,
}

#[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
#[graphql(remote = "crate::domain::PaymentMethod")]
pub enum PaymentMethod {
    WechatPay,
    Alipay,
    Wallet,
    Offline,
    Mixed,
}

#[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
#[graphql(remote = "crate::domain::Provider")]
pub enum PaymentProvider {
    WechatPay,
    Alipay,
}

/// Which cashier the provider opens for the member. Without one: WECHAT_NATIVE for WECHAT_PAY, ALIPAY_QR for ALIPAY.
#[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
#[graphql(remote = "crate::domain::PayChannel")]
pub enum PayChannel {
    /// WeChat mini program or official account page: wx.requestPayment / WeixinJSBridge (JSAPI prepay)
    WechatJsapi,
    /// a QR code the member scans, e.g. at the front desk (Native prepay, code_url)
    WechatNative,
    /// the WeChat SDK inside a native app (APP prepay)
    WechatApp,
    /// a mobile browser outside WeChat (H5 prepay, h5_url)
    WechatH5,
    /// the Alipay SDK inside a native app (alipay.trade.app.pay order string)
    AlipayApp,
    /// a mobile browser (alipay.trade.wap.pay page)
    AlipayWap,
    /// a QR code the member scans (alipay.trade.precreate qr_code)
    AlipayQr,
}

#[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
#[graphql(remote = "crate::domain::MembershipStatus")]
pub enum MembershipStatus {
    Active,
    Frozen,
    Expired,
    Revoked,
}

#[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
#[graphql(remote = "crate::domain::MembershipEventKind")]
pub enum MembershipEventKind {
    Started,
    Frozen,
    Unfrozen,
    Transferred,
    Expired,
    Revoked,
}

#[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
#[graphql(remote = "crate::domain::TicketKind")]
pub enum TicketKind {
    ProviderPaidLocalUnpaid,
    LocalPaidProviderMissing,
    AmountMismatch,
    RefundMismatch,
    PaidAfterCancel,
    CompensationDead,
    UnknownOrder,
    RejectedTransition,
    RefundOverdue,
}

#[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
#[graphql(remote = "crate::domain::PrepaidPreset")]
pub enum PrepaidRulesPreset {
    None,
    #[graphql(name = "SHANGHAI_2025")]
    Shanghai2025,
    Beijing,
    Custom,
}

#[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
#[graphql(remote = "crate::domain::TicketStatus")]
pub enum TicketStatus {
    Open,
    InProgress,
    Resolved,
    Dismissed,
}

#[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
#[graphql(remote = "crate::domain::TicketAction")]
pub enum TicketAction {
    Refund,
    CreditSessions,
    ReplayCompensation,
    MarkPaid,
    NoAction,
}

#[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
#[graphql(remote = "crate::domain::ReconciliationStatus")]
pub enum ReconciliationStatus {
    Running,
    Succeeded,
    Failed,
    Waiting,
}

#[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
#[graphql(remote = "crate::domain::AnomalyCategory")]
pub enum AnomalyCategory {
    DuplicateCallback,
    BadSignature,
    IllegalTransition,
    PaidAfterCancel,
    AmountMismatch,
    OrderExpired,
    DuplicateCheckIn,
    CompensationRetry,
    CompensationDead,
    ReconciliationFinding,
}

/// Domain words to their GraphQL mirrors, for lists (`Vec<domain::X>` to `Vec<X>`) and back.
pub fn mirror<D, G: From<D>>(words: impl IntoIterator<Item = D>) -> Vec<G> {
    words.into_iter().map(G::from).collect()
}

/// The filters' lists of GraphQL words, as the domain's.
pub fn domain_words<G: Copy, D: From<G>>(words: &[G]) -> Vec<D> {
    words.iter().copied().map(D::from).collect()
}

#[cfg(test)]
mod tests {
    use async_graphql::EnumType;

    use super::*;
    use crate::domain;

    /// Every GraphQL name is the domain's text of the same word, and every domain word has one.
    fn same_words<G, D>(all: &[D], text: fn(D) -> &'static str)
    where
        G: EnumType + Into<D>,
        D: Copy + PartialEq + std::fmt::Debug,
    {
        let items = G::items();
        assert_eq!(items.len(), all.len());
        for item in items {
            let word: D = item.value.into();
            assert_eq!(item.name, text(word), "{word:?}");
        }
    }

    #[test]
    fn graphql_names_are_the_domain_texts() {
        same_words::<OrderStatus, _>(&domain::OrderStatus::ALL, domain::OrderStatus::as_str);
        same_words::<OrderKind, _>(&domain::OrderKind::ALL, domain::OrderKind::as_str);
        same_words::<PaymentMethod, _>(&domain::PaymentMethod::ALL, domain::PaymentMethod::as_str);
        same_words::<PaymentProvider, _>(&domain::Provider::ALL, domain::Provider::as_str);
        same_words::<PayChannel, _>(&domain::PayChannel::ALL, domain::PayChannel::as_str);
        same_words::<MembershipStatus, _>(&domain::MembershipStatus::ALL, domain::MembershipStatus::as_str);
        same_words::<MembershipEventKind, _>(&domain::MembershipEventKind::ALL, domain::MembershipEventKind::as_str);
        same_words::<TicketKind, _>(&domain::TicketKind::ALL, domain::TicketKind::as_str);
        same_words::<PrepaidRulesPreset, _>(&domain::PrepaidPreset::ALL, domain::PrepaidPreset::as_str);
        same_words::<TicketStatus, _>(&domain::TicketStatus::ALL, domain::TicketStatus::as_str);
        same_words::<TicketAction, _>(&domain::TicketAction::ALL, domain::TicketAction::as_str);
        same_words::<ReconciliationStatus, _>(&domain::ReconciliationStatus::ALL, domain::ReconciliationStatus::as_str);
        same_words::<AnomalyCategory, _>(&domain::AnomalyCategory::ALL, domain::AnomalyCategory::as_str);
    }
}
