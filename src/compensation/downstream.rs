//! Delivering one outbox event: door access and AI-device access over HTTP, provider refunds
//! through the providers' refund APIs. Whatever has no endpoint configured is recorded as
//! delivered by the built-in simulator.

use std::sync::Arc;

use serde_json::json;

use crate::config::Config;
use crate::db::models::CompensationEvent;
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
        match e.kind.as_str() {
            "DOOR_ACCESS_GRANT" | "DOOR_ACCESS_REVOKE" => self.access(self.config.door_access_url.as_deref(), e).await,
            "AI_ACCESS_GRANT" | "AI_ACCESS_REVOKE" => self.access(self.config.ai_access_url.as_deref(), e).await,
            "PROVIDER_REFUND" => {
                let p = &e.payload;
                let provider = p["provider"].as_str().unwrap_or_default();
                let req = RefundRequest {
                    out_trade_no: p["orderNo"].as_str().unwrap_or_default(),
                    refund_no: p["refundNo"].as_str().unwrap_or_default(),
                    provider_txn_id: p["providerTxnId"].as_str(),
                    amount_cents: p["amountCents"].as_i64().unwrap_or(0),
                    total_cents: p["totalCents"].as_i64().unwrap_or(0),
                    reason: p["reason"].as_str().unwrap_or("refund"),
                    trace_id: &e.trace_id,
                };
                // Done only on the provider's signed acceptance; nothing is simulated.
                self.api
                    .refund(provider, &req)
                    .await
                    .map(|_| Delivered::Ok)
                    .map_err(|e| e.to_string())
            }
            other => Err(format!("unknown event kind {other}")),
        }
    }

    async fn access(&self, url: Option<&str>, e: &CompensationEvent) -> Result<Delivered, String> {
        let Some(url) = url else {
            return Ok(Delivered::Simulated);
        };
        let p = &e.payload;
        let body = json!({
            "eventId": e.id.to_string(),
            "orderNo": p["orderNo"],
            "memberId": p["memberId"],
            "storeId": p["storeId"],
            "action": p["action"],
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
}
