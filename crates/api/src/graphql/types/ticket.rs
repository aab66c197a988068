//! Exception tickets.

use async_graphql::{Context, Object, SimpleObject, ID};
use chrono::{DateTime, Utc};

use super::super::loaders::load_order;
use super::super::{conn, int, viewer};
use super::{OrderNode, PaymentProvider, TicketAction, TicketKind, TicketStatus};
use crate::db::models;
use crate::graphql::error::{GqlResult, IntoGqlResult};

pub struct ExceptionTicketNode(pub models::ExceptionTicket);

#[Object(name = "ExceptionTicket")]
impl ExceptionTicketNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn kind(&self) -> TicketKind {
        self.0.kind.into()
    }
    async fn status(&self) -> TicketStatus {
        self.0.status.into()
    }
    async fn provider(&self) -> Option<PaymentProvider> {
        self.0.provider.map(Into::into)
    }
    async fn order_no(&self) -> Option<&str> {
        self.0.order_no.as_deref()
    }
    async fn provider_txn_id(&self) -> Option<&str> {
        self.0.provider_txn_id.as_deref()
    }
    async fn local_amount_cents(&self) -> GqlResult<Option<i32>> {
        self.0.local_amount_cents.map(int).transpose().gql()
    }
    async fn provider_amount_cents(&self) -> GqlResult<Option<i32>> {
        self.0.provider_amount_cents.map(int).transpose().gql()
    }
    /// JSON text with what was found
    async fn detail(&self) -> String {
        self.0.detail.to_string()
    }
    async fn opened_at(&self) -> DateTime<Utc> {
        self.0.opened_at
    }
    async fn resolved_at(&self) -> Option<DateTime<Utc>> {
        self.0.resolved_at
    }
    async fn resolution(&self) -> Option<TicketAction> {
        self.0.resolution.map(Into::into)
    }
    async fn note(&self) -> Option<&str> {
        self.0.note.as_deref()
    }
    async fn resolved_by(&self) -> Option<&str> {
        self.0.resolved_by.as_deref()
    }
    async fn trace_id(&self) -> &str {
        &self.0.trace_id
    }
    /// What closing this ticket can do now, for the one asking: the actions `resolveTicket`
    /// would take (the state machine and the ticket's kind decide) and what REFUND sends back.
    async fn actions(&self, ctx: &Context<'_>) -> GqlResult<TicketActions> {
        let v = viewer(ctx)?;
        let mut c = conn(ctx).await?;
        let tz = super::super::state(ctx).config.timezone;
        let o = crate::ticket_resolution::offer(&mut c, v, &self.0, tz).await?;
        Ok(TicketActions {
            allowed: o.actions.into_iter().map(Into::into).collect(),
            refund_cents: o.refund_cents.map(int).transpose()?,
            refund_amount_adjustable: o.refund_amount_adjustable,
        })
    }
    async fn order(&self, ctx: &Context<'_>) -> GqlResult<Option<OrderNode>> {
        match self.0.order_id {
            Some(id) => load_order(ctx, id).await.map(Some).gql(),
            None => Ok(None),
        }
    }
}

/// The actions a ticket can be closed with now, as `resolveTicket` would take them.
#[derive(SimpleObject)]
pub struct TicketActions {
    /// Empty once the ticket is closed.
    pub allowed: Vec<TicketAction>,
    /// What REFUND without `amountCents` sends back: the order's unused share when the ticket is
    /// about the order's own payment, the whole stray payment otherwise; null without REFUND.
    pub refund_cents: Option<i32>,
    /// REFUND takes an `amountCents` (only a refund of the order's own payment does).
    pub refund_amount_adjustable: bool,
}
