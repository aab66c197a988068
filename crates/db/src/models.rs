//! Rows as they come out of the database.

use chrono::{DateTime, NaiveDate, Utc};
use diesel::prelude::*;

use super::schema::*;
use crate::domain::{
    CallbackOutcome, CompensationKind, CompensationStatus, FreezeState, MembershipEventKind, MembershipStatus,
    OrderKind, OrderStatus, PaymentMethod, Provider, ReconciliationStatus, TaskRunStatus, TicketAction, TicketKind,
    TicketStatus,
};

#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = stores)]
pub struct Store {
    pub id: i64,
    pub name: String,
    pub code: String,
    pub created_at: DateTime<Utc>,
    /// The business operator's 统一社会信用代码: prepaid caps count per member and operator.
    pub operator_code: String,
}

#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = members)]
pub struct Member {
    pub id: i64,
    pub store_id: i64,
    pub name: String,
    pub phone: String,
    pub balance_cents: i64,
    pub frozen_cents: i64,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = membership_plans)]
pub struct MembershipPlan {
    pub id: i64,
    pub store_id: i64,
    pub name: String,
    pub duration_days: i32,
    pub price_cents: i64,
    pub created_at: DateTime<Utc>,
    pub max_freeze_days: i32,
    pub max_freezes: i32,
    /// set when retired: sold no more
    pub retired_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = class_packs)]
pub struct ClassPack {
    pub id: i64,
    pub store_id: i64,
    pub name: String,
    pub sessions: i32,
    pub price_cents: i64,
    pub stock: Option<i32>,
    pub created_at: DateTime<Utc>,
    /// set when retired: sold no more
    pub retired_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = coach_slots)]
pub struct CoachSlot {
    pub id: i64,
    pub store_id: i64,
    pub coach_name: String,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub capacity: i32,
    pub remaining: i32,
    pub price_cents: i64,
    pub created_at: DateTime<Utc>,
    /// Set once by `cancelCoachSlot`, with its reason, actor and trace.
    pub canceled_at: Option<DateTime<Utc>>,
    pub cancel_reason: Option<String>,
    pub canceled_by: Option<String>,
    pub cancel_trace_id: Option<String>,
    /// When every order booked on the canceled slot was settled (canceled or refunded).
    pub cancel_settled_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = orders)]
pub struct Order {
    pub id: i64,
    pub order_no: String,
    pub member_id: i64,
    pub store_id: i64,
    pub kind: OrderKind,
    pub status: OrderStatus,
    pub item_name: String,
    pub membership_plan_id: Option<i64>,
    pub class_pack_id: Option<i64>,
    pub coach_slot_id: Option<i64>,
    pub plan_days: Option<i32>,
    pub amount_cents: i64,
    pub wallet_amount_cents: i64,
    pub payment_method: PaymentMethod,
    pub online_provider: Option<Provider>,
    pub sessions_total: i32,
    pub sessions_used: i32,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub paid_at: Option<DateTime<Utc>>,
    pub canceled_at: Option<DateTime<Utc>>,
    pub cancel_reason: Option<String>,
    pub refunded_at: Option<DateTime<Utc>>,
    pub refund_amount_cents: Option<i64>,
    pub provider_txn_id: Option<String>,
    pub trace_id: String,
    pub idempotency_key: String,
    pub request_hash: String,
    pub updated_at: DateTime<Utc>,
}

impl Order {
    /// The part of the price paid online (WECHAT_PAY, ALIPAY, the online part of MIXED).
    pub fn online_cents(&self) -> i64 {
        if self.payment_method.is_online() {
            self.amount_cents - self.wallet_amount_cents
        } else {
            0
        }
    }

    pub fn is_expired(&self, now: DateTime<Utc>) -> bool {
        self.cancel_reason.as_deref() == Some(crate::domain::TIMEOUT_REASON)
            || (self.status == OrderStatus::WaitPay && self.expires_at.is_some_and(|t| t <= now))
    }
}

#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = order_transitions)]
pub struct OrderTransition {
    pub id: i64,
    pub order_id: i64,
    pub from_status: Option<OrderStatus>,
    pub to_status: OrderStatus,
    pub actor: String,
    pub reason: String,
    pub trace_id: String,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = memberships)]
pub struct Membership {
    pub id: i64,
    pub member_id: i64,
    pub store_id: i64,
    pub plan_id: i64,
    pub order_id: i64,
    pub status: MembershipStatus,
    pub valid_from: DateTime<Utc>,
    pub valid_to: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    pub frozen_days: i32,
    pub transferred_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = membership_freezes)]
pub struct MembershipFreeze {
    pub id: i64,
    pub membership_id: i64,
    pub state: FreezeState,
    pub from_date: NaiveDate,
    pub until_date: NaiveDate,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    pub reason: String,
    pub actor: String,
    pub trace_id: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = membership_events)]
pub struct MembershipEvent {
    pub id: i64,
    pub membership_id: i64,
    pub kind: MembershipEventKind,
    pub from_status: Option<MembershipStatus>,
    pub to_status: MembershipStatus,
    pub actor: String,
    pub reason: Option<String>,
    pub summary: String,
    pub trace_id: String,
    pub from_member_id: Option<i64>,
    pub to_member_id: Option<i64>,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = check_ins)]
pub struct CheckIn {
    pub id: i64,
    pub order_id: i64,
    pub consume_txn_no: String,
    pub sessions: i32,
    pub remaining_after: i32,
    pub actor: String,
    pub trace_id: String,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = compensation_events)]
pub struct CompensationEvent {
    pub id: i64,
    /// `None` for an effect of no order (an alert delivery).
    pub order_id: Option<i64>,
    pub kind: CompensationKind,
    pub status: CompensationStatus,
    pub attempts: i32,
    pub max_attempts: i32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub payload: serde_json::Value,
    pub idempotency_key: String,
    pub trace_id: String,
    pub locked_until: Option<DateTime<Utc>>,
    pub locked_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = compensation_attempts)]
pub struct CompensationAttempt {
    pub id: i64,
    pub event_id: i64,
    pub at: DateTime<Utc>,
    pub ok: bool,
    pub error: Option<String>,
    pub duration_ms: i32,
    pub worker: String,
}

#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = payment_callbacks)]
pub struct PaymentCallback {
    pub id: i64,
    pub provider: Provider,
    pub received_at: DateTime<Utc>,
    pub verified: bool,
    pub outcome: CallbackOutcome,
    pub event_type: Option<String>,
    pub body: String,
    pub headers: serde_json::Value,
    pub order_id: Option<i64>,
    pub order_no: Option<String>,
    pub store_id: Option<i64>,
    pub idempotency_key: Option<String>,
    pub provider_txn_id: Option<String>,
    pub amount_cents: Option<i64>,
    pub error: Option<String>,
    pub trace_id: String,
}

#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = exception_tickets)]
pub struct ExceptionTicket {
    pub id: i64,
    pub kind: TicketKind,
    pub status: TicketStatus,
    pub provider: Option<Provider>,
    pub order_id: Option<i64>,
    pub order_no: Option<String>,
    pub store_id: Option<i64>,
    pub provider_txn_id: Option<String>,
    pub local_amount_cents: Option<i64>,
    pub provider_amount_cents: Option<i64>,
    pub detail: serde_json::Value,
    pub finding_key: String,
    pub opened_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub resolved_at: Option<DateTime<Utc>>,
    pub resolution: Option<TicketAction>,
    pub resolved_by: Option<String>,
    pub note: Option<String>,
    pub trace_id: String,
}

#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = reconciliation_runs)]
pub struct ReconciliationRun {
    pub id: i64,
    pub provider: Provider,
    pub bill_date: chrono::NaiveDate,
    pub status: ReconciliationStatus,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub provider_rows: i32,
    pub local_rows: i32,
    pub matched: i32,
    pub tickets_opened: i32,
    pub error: Option<String>,
    pub trace_id: String,
}

#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = task_runs)]
pub struct TaskRun {
    pub id: i64,
    pub task: String,
    pub tick: DateTime<Utc>,
    pub status: TaskRunStatus,
    pub instance: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub rows_touched: i64,
    pub detail: Option<String>,
}

/// The order an outbox effect is about (the orphan rule puts this beside `Order`).
impl From<&Order> for crate::domain::effect::OrderRef {
    fn from(o: &Order) -> crate::domain::effect::OrderRef {
        crate::domain::effect::OrderRef {
            order_no: o.order_no.clone(),
            member_id: o.member_id.to_string(),
            store_id: o.store_id.to_string(),
        }
    }
}
