//! The ops screens' views: reconciliation runs, anomaly counts, task runs.

use async_graphql::{Object, SimpleObject, ID};
use chrono::{DateTime, Utc};

use super::{AnomalyCategory, Date, PaymentProvider, ReconciliationStatus};
use crate::db::models;

pub struct ReconciliationRunNode(pub models::ReconciliationRun);

#[Object(name = "ReconciliationRun")]
impl ReconciliationRunNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn provider(&self) -> PaymentProvider {
        self.0.provider.into()
    }
    async fn bill_date(&self) -> Date {
        Date(self.0.bill_date)
    }
    async fn status(&self) -> ReconciliationStatus {
        self.0.status.into()
    }
    async fn started_at(&self) -> DateTime<Utc> {
        self.0.started_at
    }
    async fn finished_at(&self) -> Option<DateTime<Utc>> {
        self.0.finished_at
    }
    async fn provider_rows(&self) -> i32 {
        self.0.provider_rows
    }
    async fn local_rows(&self) -> i32 {
        self.0.local_rows
    }
    async fn matched(&self) -> i32 {
        self.0.matched
    }
    async fn tickets_opened(&self) -> i32 {
        self.0.tickets_opened
    }
    async fn error(&self) -> Option<String> {
        self.0.error.as_deref().map(crate::error::public_text)
    }
}

#[derive(SimpleObject, Clone, Debug)]
pub struct AnomalyStat {
    pub category: AnomalyCategory,
    pub count: i32,
}

/// One run of a periodic task (one tick, claimed by one instance).
pub struct TaskRunNode(pub models::TaskRun);

#[Object(name = "TaskRun")]
impl TaskRunNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn task(&self) -> &str {
        &self.0.task
    }
    async fn tick(&self) -> DateTime<Utc> {
        self.0.tick
    }
    /// RUNNING, SUCCEEDED or FAILED
    async fn status(&self) -> &str {
        self.0.status.as_str()
    }
    async fn instance(&self) -> &str {
        &self.0.instance
    }
    async fn started_at(&self) -> DateTime<Utc> {
        self.0.started_at
    }
    async fn finished_at(&self) -> Option<DateTime<Utc>> {
        self.0.finished_at
    }
    async fn rows_touched(&self) -> i32 {
        super::super::count(self.0.rows_touched)
    }
    async fn detail(&self) -> Option<String> {
        self.0.detail.as_deref().map(crate::error::public_text)
    }
}
