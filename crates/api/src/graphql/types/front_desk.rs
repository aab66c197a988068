//! The front desk's everyday (issue 39): finding members, a member's wallet movements, the
//! catalog's changes, a coach's session canceled with its bookings, the day's takings.

use async_graphql::{Enum, InputObject, Object, ID};
use chrono::{DateTime, Utc};

use super::super::int;
use crate::domain::WalletMoveKind;
use crate::graphql::error::{GqlResult, IntoGqlResult};

/// `members(filter)`: each field narrows; none is every member the caller sees, paged.
#[derive(InputObject, Default)]
pub struct MemberFilter {
    /// the whole number or its last four digits
    pub phone: Option<String>,
    /// any part of the name
    pub name: Option<String>,
    pub store_id: Option<ID>,
}

/// What a wallet movement was, in the desk's words (the ledger's own kinds: `PAY` and the
/// `CAPTURE` of a MIXED order's frozen part are both a payment).
#[derive(Enum, Copy, Clone, Eq, PartialEq, Debug)]
pub enum WalletEntryKind {
    TopUp,
    Payment,
    Freeze,
    Unfreeze,
    Refund,
    Fee,
}

impl From<WalletMoveKind> for WalletEntryKind {
    fn from(k: WalletMoveKind) -> Self {
        match k {
            WalletMoveKind::TopUp => WalletEntryKind::TopUp,
            WalletMoveKind::Pay | WalletMoveKind::Capture => WalletEntryKind::Payment,
            WalletMoveKind::Freeze => WalletEntryKind::Freeze,
            WalletMoveKind::Unfreeze => WalletEntryKind::Unfreeze,
            WalletMoveKind::Refund => WalletEntryKind::Refund,
            WalletMoveKind::Fee => WalletEntryKind::Fee,
        }
    }
}

pub struct WalletEntryNode(pub crate::wallet::WalletEntry);

#[Object(name = "WalletEntry")]
impl WalletEntryNode {
    async fn at(&self) -> DateTime<Utc> {
        self.0.created_at
    }
    async fn kind(&self) -> WalletEntryKind {
        self.0.kind.into()
    }
    /// signed: what the movement added to (+) or took from (−) the member's money; a
    /// payment of frozen money (a MIXED order's wallet part) takes the frozen amount
    async fn amount_cents(&self) -> GqlResult<i32> {
        int(self.0.amount_cents()).gql()
    }
    /// the wallet's spendable balance (the money not frozen) after this movement
    async fn balance_after_cents(&self) -> GqlResult<i32> {
        int(self.0.balance_after).gql()
    }
    /// a top-up's receipt number
    async fn reference(&self) -> Option<&str> {
        self.0.reference.as_deref()
    }
    async fn order_no(&self) -> Option<&str> {
        self.0.order_no.as_deref()
    }
    async fn trace_id(&self) -> &str {
        &self.0.trace_id
    }
}

#[derive(InputObject)]
pub struct UpdateMembershipPlanInput {
    pub name: Option<String>,
    pub price_cents: Option<i32>,
    pub max_freeze_days: Option<i32>,
    pub max_freezes: Option<i32>,
}

#[derive(InputObject)]
pub struct UpdateClassPackInput {
    pub name: Option<String>,
    pub price_cents: Option<i32>,
    /// null leaves it; use unlimitedStock to lift it
    pub stock: Option<i32>,
    pub unlimited_stock: Option<bool>,
}

// ----- a coach's session canceled, the day's takings -----

use async_graphql::SimpleObject;

use super::{CoachSlotNode, Date, Long, OrderNode, PaymentMethod};

#[derive(SimpleObject)]
#[graphql(name = "CancelCoachSlotPayload")]
pub struct CancelCoachSlotPayload {
    pub slot: CoachSlotNode,
    /// the orders booked on it, as they are now
    pub orders: Vec<OrderNode>,
}

impl From<crate::slot_cancel::CanceledSlot> for CancelCoachSlotPayload {
    fn from(c: crate::slot_cancel::CanceledSlot) -> Self {
        CancelCoachSlotPayload {
            slot: CoachSlotNode(c.slot),
            orders: c.orders.into_iter().map(OrderNode).collect(),
        }
    }
}

/// One business date and payment method of a store's takings: netCents = takenCents −
/// refundedCents
#[derive(SimpleObject)]
#[graphql(name = "SalesDay")]
pub struct SalesDayNode {
    pub date: Date,
    pub method: PaymentMethod,
    pub orders_paid: i32,
    pub taken_cents: Long,
    pub refunded_cents: Long,
    pub net_cents: Long,
}

impl From<crate::sales::SalesDay> for SalesDayNode {
    fn from(d: crate::sales::SalesDay) -> Self {
        SalesDayNode {
            date: Date(d.day),
            method: d.method.into(),
            orders_paid: d.orders_paid,
            taken_cents: Long(d.taken_cents),
            refunded_cents: Long(d.refunded_cents),
            net_cents: Long(d.net_cents()),
        }
    }
}
