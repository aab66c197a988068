//! Orders, their timelines and status changes, check-ins.

use async_graphql::{Context, Object, SimpleObject};
use chrono::{DateTime, Utc};

use super::super::int;
use super::super::loaders::*;
use super::member::scoped_member;
use super::{
    is_member, mirror, CompensationEventNode, ExceptionTicketNode, MemberNode, MembershipNode, OrderKind, OrderStatus,
    PaymentCallbackNode, PaymentMethod, PaymentProvider, StoreNode,
};
use crate::db::models;
use crate::domain::TimelineKind;
use crate::error::AppResult;
use crate::graphql::error::{GqlResult, IntoGqlResult};

pub struct OrderNode(pub models::Order);

impl OrderNode {
    async fn sale_terms(&self, ctx: &Context<'_>) -> AppResult<Option<crate::orders::SaleTerms>> {
        loader(ctx)
            .load_one(OrderSaleTerms(self.0.id))
            .await
            .map_err(|e| e.into_app())
    }
}

#[Object(name = "Order")]
impl OrderNode {
    async fn order_no(&self) -> &str {
        &self.0.order_no
    }
    async fn kind(&self) -> OrderKind {
        self.0.kind.into()
    }
    async fn status(&self) -> OrderStatus {
        self.0.status.into()
    }
    async fn member(&self, ctx: &Context<'_>) -> GqlResult<MemberNode> {
        scoped_member(ctx, self.0.member_id).await.gql()
    }
    async fn store(&self, ctx: &Context<'_>) -> GqlResult<StoreNode> {
        load_store(ctx, self.0.store_id).await.gql()
    }
    async fn item_name(&self) -> &str {
        &self.0.item_name
    }
    async fn amount_cents(&self) -> GqlResult<i32> {
        int(self.0.amount_cents).gql()
    }
    /// the part paid from the wallet (MIXED and WALLET)
    async fn wallet_amount_cents(&self) -> GqlResult<i32> {
        int(self.0.wallet_amount_cents).gql()
    }
    async fn payment_method(&self) -> PaymentMethod {
        self.0.payment_method.into()
    }
    /// The provider that takes the online part (WECHAT_PAY, ALIPAY), if any.
    async fn online_provider(&self) -> Option<PaymentProvider> {
        self.0.online_provider.map(Into::into)
    }
    async fn sessions_total(&self) -> i32 {
        self.0.sessions_total
    }
    async fn sessions_used(&self) -> i32 {
        self.0.sessions_used
    }
    async fn expires_at(&self) -> Option<DateTime<Utc>> {
        self.0.expires_at
    }
    async fn is_expired(&self) -> bool {
        self.0.is_expired(Utc::now())
    }
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }
    async fn paid_at(&self) -> Option<DateTime<Utc>> {
        self.0.paid_at
    }
    async fn canceled_at(&self) -> Option<DateTime<Utc>> {
        self.0.canceled_at
    }
    /// TIMEOUT for expired orders
    async fn cancel_reason(&self) -> Option<&str> {
        self.0.cancel_reason.as_deref()
    }
    async fn refunded_at(&self) -> Option<DateTime<Utc>> {
        self.0.refunded_at
    }
    async fn refund_amount_cents(&self) -> GqlResult<Option<i32>> {
        self.0.refund_amount_cents.map(int).transpose().gql()
    }
    /// end of the cooling-off period (null: the store has none, or not paid)
    async fn cooling_off_until(&self, ctx: &Context<'_>) -> GqlResult<Option<DateTime<Utc>>> {
        let Some(terms) = self.sale_terms(ctx).await? else {
            return Ok(None);
        };
        let tz = super::super::state(ctx).config.timezone;
        Ok(crate::orders::cooling_off_until(&self.0, terms.cooling_off_days, tz))
    }
    /// the date a cooling-off refund must have reached the payer
    async fn refund_due_by(&self, ctx: &Context<'_>) -> GqlResult<Option<super::Date>> {
        Ok(self
            .sale_terms(ctx)
            .await?
            .and_then(|t| t.refund_due_by)
            .map(super::Date))
    }
    async fn accepted_terms_version(&self, ctx: &Context<'_>) -> GqlResult<Option<String>> {
        Ok(self.sale_terms(ctx).await?.and_then(|t| t.accepted_terms_version))
    }
    async fn provider_txn_id(&self) -> Option<&str> {
        self.0.provider_txn_id.as_deref()
    }
    async fn trace_id(&self) -> &str {
        &self.0.trace_id
    }
    /// statuses the state machine allows from here
    async fn allowed_transitions(&self) -> Vec<OrderStatus> {
        mirror(self.0.status.allowed_next())
    }
    /// Status changes, callbacks, check-ins, compensation attempts and tickets, oldest first.
    async fn timeline(&self, ctx: &Context<'_>) -> GqlResult<Vec<TimelineEntry>> {
        let entries = loader(ctx)
            .load_one(OrderTimeline(self.0.id))
            .await
            .map_err(LoadError::into_app)?
            .unwrap_or_default();
        if !is_member(ctx) {
            return Ok(entries.into_iter().map(TimelineEntry).collect());
        }
        // Members: no tickets (staff's working material), no downstream error texts, no
        // worker names.
        Ok(entries
            .into_iter()
            .filter(|e| e.kind != TimelineKind::Ticket)
            .map(|mut e| {
                if e.kind == TimelineKind::CompensationAttempt {
                    if let Some((head, _)) = e.summary.split_once(": ") {
                        e.summary = head.to_string();
                    }
                    e.actor = "system".into();
                }
                TimelineEntry(e)
            })
            .collect())
    }
    async fn callbacks(&self, ctx: &Context<'_>) -> GqlResult<Vec<PaymentCallbackNode>> {
        Ok(loader(ctx)
            .load_one(OrderCallbacks(self.0.id))
            .await
            .map_err(|e| e.into_app())?
            .unwrap_or_default()
            .into_iter()
            .map(PaymentCallbackNode)
            .collect())
    }
    async fn compensation(&self, ctx: &Context<'_>) -> GqlResult<Vec<CompensationEventNode>> {
        if let Some(rows) = prefetched_compensation(ctx, self.0.id) {
            return Ok(rows.into_iter().map(CompensationEventNode).collect());
        }
        Ok(loader(ctx)
            .load_one(OrderCompensation(self.0.id))
            .await
            .map_err(|e| e.into_app())?
            .unwrap_or_default()
            .into_iter()
            .map(CompensationEventNode)
            .collect())
    }
    async fn tickets(&self, ctx: &Context<'_>) -> GqlResult<Vec<ExceptionTicketNode>> {
        if is_member(ctx) {
            // Tickets are staff's working material, not the member's.
            return Ok(vec![]);
        }
        if let Some(rows) = prefetched_tickets(ctx, self.0.id) {
            return Ok(rows.into_iter().map(ExceptionTicketNode).collect());
        }
        Ok(loader(ctx)
            .load_one(OrderTickets(self.0.id))
            .await
            .map_err(|e| e.into_app())?
            .unwrap_or_default()
            .into_iter()
            .map(ExceptionTicketNode)
            .collect())
    }
    async fn membership(&self, ctx: &Context<'_>) -> GqlResult<Option<MembershipNode>> {
        Ok(loader(ctx)
            .load_one(OrderMembership(self.0.id))
            .await
            .map_err(|e| e.into_app())?
            .map(MembershipNode))
    }
}

/// One happening in an order's chain, as [`crate::timeline`] tells it.
pub struct TimelineEntry(pub crate::timeline::Entry);

#[Object]
impl TimelineEntry {
    async fn at(&self) -> DateTime<Utc> {
        self.0.at
    }
    /// STATUS_CHANGE, CALLBACK, COMPENSATION_ATTEMPT, COMPENSATION_REPLAY, CHECK_IN, TICKET
    async fn kind(&self) -> &'static str {
        self.0.kind.as_str()
    }
    async fn actor(&self) -> &str {
        &self.0.actor
    }
    async fn from_status(&self) -> Option<OrderStatus> {
        self.0.from_status.map(Into::into)
    }
    async fn to_status(&self) -> Option<OrderStatus> {
        self.0.to_status.map(Into::into)
    }
    async fn summary(&self) -> &str {
        &self.0.summary
    }
    async fn trace_id(&self) -> &str {
        &self.0.trace_id
    }
}

#[derive(SimpleObject)]
pub struct CheckInPayload {
    pub order: OrderNode,
    pub duplicate: bool,
    pub remaining_sessions: i32,
}

#[derive(SimpleObject, Clone, Debug)]
pub struct OrderStatusChange {
    pub order_no: String,
    pub from_status: Option<OrderStatus>,
    pub to_status: OrderStatus,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub trace_id: String,
}
