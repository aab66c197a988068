//! Delivering one outbox event: door access and AI-device access over HTTP, provider refunds
//! through the providers' refund APIs. Whatever has no endpoint configured is recorded as
//! delivered by the built-in simulator.

use std::sync::Arc;

use serde_json::json;

use crate::config::Config;
use crate::db::models::CompensationEvent;
use crate::domain::effect::{AccessPayload, RefundPayload};
use crate::domain::Effect;
use crate::payments::api::{self, ProviderApi, RefundRequest};
use crate::payments::keys::ProviderKeys;

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// The downstream accepted it.
    Ok,
    /// No endpoint configured: recorded as delivered by the simulator.
    Simulated,
}

#[derive(Clone)]
pub struct Downstream {
    api: ProviderApi,
    config: Arc<Config>,
}

impl Downstream {
    pub fn new(config: Arc<Config>, keys: Arc<ProviderKeys>) -> Downstream {
        Downstream {
            api: ProviderApi::new(config.clone(), keys),
            config,
        }
    }

    /// One attempt. `Err` carries what went wrong, for the attempt log.
    pub async fn deliver(&self, e: &CompensationEvent) -> Result<Delivered, String> {
        let effect = Effect::decode(&e.kind, &e.payload).map_err(|err| err.to_string())?;
        match effect {
            Effect::DoorAccessGrant(p) | Effect::DoorAccessRevoke(p) => {
                self.access(self.config.door_access_url.as_deref(), e, &p).await
            }
            Effect::AiAccessGrant(p) | Effect::AiAccessRevoke(p) => {
                self.access(self.config.ai_access_url.as_deref(), e, &p).await
            }
            Effect::ProviderRefund(p) => self.refund(e, &p).await,
        }
    }

    async fn access(&self, url: Option<&str>, e: &CompensationEvent, p: &AccessPayload) -> Result<Delivered, String> {
        let Some(url) = url else {
            return Ok(Delivered::Simulated);
        };
        let body = json!({
            "eventId": e.id.to_string(),
            "orderNo": p.order.order_no,
            "memberId": p.order.member_id,
            "storeId": p.order.store_id,
            "action": p.action,
            "idempotencyKey": e.idempotency_key,
        });
        let resp = self
            .api
            .http()
            .post(url)
            .header("X-Trace-Id", &e.trace_id)
            .json(&body)
            .send()
            .await
            .map_err(|err| api::describe(&err, self.config.downstream_timeout))?;
        api::check(resp).await.map(|_| Delivered::Ok)
    }

    /// Done only on the provider's signed acceptance; nothing is simulated.
    async fn refund(&self, e: &CompensationEvent, p: &RefundPayload) -> Result<Delivered, String> {
        let req = RefundRequest {
            out_trade_no: &p.order.order_no,
            refund_no: &p.refund_no,
            provider_txn_id: p.provider_txn_id.as_deref(),
            amount_cents: p.amount_cents,
            total_cents: p.total_cents,
            reason: &p.reason,
            trace_id: &e.trace_id,
        };
        self.api
            .refund(p.provider, &req)
            .await
            .map(|_| Delivered::Ok)
            .map_err(|e| e.to_string())
    }
}
