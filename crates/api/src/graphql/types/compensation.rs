//! The outbox's events and their delivery attempts.

use async_graphql::{Context, Object, SimpleObject, ID};
use chrono::{DateTime, Utc};

use super::super::loaders::*;
use super::super::outbox::{CompensationKind, CompensationStatus};
use super::is_member;
use crate::db::models;
use crate::graphql::error::{GqlResult, IntoGqlResult};

#[derive(SimpleObject, Clone, Debug)]
#[graphql(name = "CompensationAttempt")]
pub struct CompensationAttemptNode {
    pub at: DateTime<Utc>,
    pub ok: bool,
    pub error: Option<String>,
    pub duration_ms: i32,
}

pub struct CompensationEventNode(pub models::CompensationEvent);

#[Object(name = "CompensationEvent")]
impl CompensationEventNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn order_no(&self) -> String {
        self.0.payload["orderNo"].as_str().unwrap_or_default().to_string()
    }
    async fn kind(&self) -> GqlResult<CompensationKind> {
        // An order's events only are listed; an effect of no order here is a broken row.
        CompensationKind::shown(self.0.kind)
            .ok_or_else(|| {
                crate::error::AppError::internal(format!("compensation kind {} on an order", self.0.kind.as_str()))
            })
            .gql()
    }
    async fn status(&self) -> CompensationStatus {
        self.0.status.into()
    }
    async fn attempts(&self) -> i32 {
        self.0.attempts
    }
    async fn max_attempts(&self) -> i32 {
        self.0.max_attempts
    }
    async fn next_attempt_at(&self) -> Option<DateTime<Utc>> {
        self.0.status.is_waiting().then_some(self.0.next_attempt_at).flatten()
    }
    /// the downstream's last answer (staff only: it can hold another system's internals)
    async fn last_error(&self, ctx: &Context<'_>) -> Option<&str> {
        if is_member(ctx) {
            return None;
        }
        self.0.last_error.as_deref()
    }
    async fn updated_at(&self) -> DateTime<Utc> {
        self.0.updated_at
    }
    async fn trace_id(&self) -> &str {
        &self.0.trace_id
    }
    /// The downstream's idempotency key, the same on every attempt.
    async fn idempotency_key(&self) -> &str {
        &self.0.idempotency_key
    }
    async fn attempt_log(&self, ctx: &Context<'_>) -> GqlResult<Vec<CompensationAttemptNode>> {
        let member = is_member(ctx);
        Ok(loader(ctx)
            .load_one(EventAttempts(self.0.id))
            .await
            .map_err(|e| e.into_app())?
            .unwrap_or_default()
            .into_iter()
            .map(|a| CompensationAttemptNode {
                at: a.at,
                ok: a.ok,
                error: if member { None } else { a.error },
                duration_ms: a.duration_ms,
            })
            .collect())
    }
}
