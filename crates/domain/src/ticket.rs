//! Exception tickets: what kind of difference a ticket is about, where it stands, and the
//! actions that close it.

use super::order_status::OrderStatus;
use super::vocabulary::vocabulary;

vocabulary! {
    /// What a ticket is about (also the category of a reconciliation finding).
    pub enum TicketKind {
        ProviderPaidLocalUnpaid = "PROVIDER_PAID_LOCAL_UNPAID",
        LocalPaidProviderMissing = "LOCAL_PAID_PROVIDER_MISSING",
        AmountMismatch = "AMOUNT_MISMATCH",
        RefundMismatch = "REFUND_MISMATCH",
        PaidAfterCancel = "PAID_AFTER_CANCEL",
        CompensationDead = "COMPENSATION_DEAD",
        UnknownOrder = "UNKNOWN_ORDER",
        RejectedTransition = "REJECTED_TRANSITION",
        /// A cooling-off refund the provider had not paid back by its deadline (`Order.refundDueBy`).
        RefundOverdue = "REFUND_OVERDUE",
    }
}

impl TicketKind {
    /// The kinds a reconciliation finds by comparing a bill with the books.
    pub const RECONCILIATION_FINDINGS: [TicketKind; 4] = [
        TicketKind::ProviderPaidLocalUnpaid,
        TicketKind::LocalPaidProviderMissing,
        TicketKind::AmountMismatch,
        TicketKind::RefundMismatch,
    ];
}

vocabulary! {
    /// OPEN -> IN_PROGRESS -> RESOLVED, or DISMISSED (closed with NO_ACTION).
    pub enum TicketStatus {
        Open = "OPEN",
        InProgress = "IN_PROGRESS",
        Resolved = "RESOLVED",
        Dismissed = "DISMISSED",
    }
}

impl TicketStatus {
    /// Closed: nothing more is done with the ticket.
    pub fn is_closed(self) -> bool {
        matches!(self, TicketStatus::Resolved | TicketStatus::Dismissed)
    }
}

vocabulary! {
    /// What closes a ticket.
    pub enum TicketAction {
        Refund = "REFUND",
        CreditSessions = "CREDIT_SESSIONS",
        ReplayCompensation = "REPLAY_COMPENSATION",
        MarkPaid = "MARK_PAID",
        NoAction = "NO_ACTION",
    }
}

impl TicketAction {
    /// The change of an order's status the action stands for (`None`: it changes no order).
    /// REFUND is also for money that reached no order of its own: a refund is a refund decision.
    pub fn order_change(self) -> Option<(OrderStatus, OrderStatus)> {
        use OrderStatus::*;
        match self {
            TicketAction::NoAction | TicketAction::ReplayCompensation => None,
            TicketAction::MarkPaid | TicketAction::CreditSessions => Some((WaitPay, Paid)),
            TicketAction::Refund => Some((Paid, Refunded)),
        }
    }

    /// The status a ticket closed with this action ends in.
    pub fn closes_as(self) -> TicketStatus {
        match self {
            TicketAction::NoAction => TicketStatus::Dismissed,
            _ => TicketStatus::Resolved,
        }
    }
}

vocabulary! {
    /// Why an alert reached people (`alerts.cause`, the `alertname` of Alertmanager's payload).
    pub enum AlertCause {
        CompensationDead = "COMPENSATION_DEAD",
        PaidAfterCancel = "PAID_AFTER_CANCEL",
        AmountMismatch = "AMOUNT_MISMATCH",
        RefundOverdue = "REFUND_OVERDUE",
        ReconciliationFailed = "RECONCILIATION_FAILED",
        ReconciliationDifferences = "RECONCILIATION_DIFFERENCES",
        TaskStuck = "TASK_STUCK",
        OutboxOverdue = "OUTBOX_OVERDUE",
        BillNotReconciled = "BILL_NOT_RECONCILED",
        ProviderBadSignature = "PROVIDER_BAD_SIGNATURE",
        ProviderFailing = "PROVIDER_FAILING",
    }
}
