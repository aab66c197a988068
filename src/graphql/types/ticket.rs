//! Exception tickets.

use async_graphql::{Context, Object, ID};
use chrono::{DateTime, Utc};

use super::super::int;
use super::super::loaders::load_order;
use super::{OrderNode, PaymentProvider, TicketAction, TicketKind, TicketStatus};
use crate::db::models;
use crate::error::AppResult;

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
    async fn local_amount_cents(&self) -> AppResult<Option<i32>> {
        self.0.local_amount_cents.map(int).transpose()
    }
    async fn provider_amount_cents(&self) -> AppResult<Option<i32>> {
        self.0.provider_amount_cents.map(int).transpose()
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
    async fn order(&self, ctx: &Context<'_>) -> AppResult<Option<OrderNode>> {
        match self.0.order_id {
            Some(id) => load_order(ctx, id).await.map(Some),
            None => Ok(None),
        }
    }
}
