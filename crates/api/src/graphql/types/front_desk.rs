//! The front desk's everyday (contract "The front desk and the console's everyday"): a coach's
//! session canceled with its bookings, the day's takings.

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
