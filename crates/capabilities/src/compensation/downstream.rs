//! Delivering one outbox event: door access and AI-device access over HTTP, provider refunds
//! through the providers' refund APIs, alerts to their chat channels (`alerts::deliver`). Whatever has no endpoint configured is recorded as
//! delivered by the built-in simulator.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::config::Config;
use crate::db::models::CompensationEvent;
use crate::domain::effect::{AccessPayload, AlertPayload, RefundPayload};
use crate::domain::Effect;
use crate::providers::api::{self, ProviderApi, RefundRequest, RefundState};

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// The downstream accepted it.
    Ok,
    /// No endpoint configured: recorded as delivered by the simulator.
    Simulated,
}

/// Why an attempt did not deliver, for the attempt log, and when to try again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotDelivered {
    pub error: String,
    pub retry: Retry,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// The event's backoff (`FITORDER_RETRY_BASE × 2^(n−1)`), DEAD at the last attempt.
    Backoff,
    /// Not before this long (a refund the provider is still processing), DEAD at the last attempt.
    After(Duration),
    /// Never: DEAD now, with its ticket (a refund the provider ended without paying back).
    Never,
}

impl From<String> for NotDelivered {
    fn from(error: String) -> NotDelivered {
        NotDelivered {
            error,
            retry: Retry::Backoff,
        }
    }
}

#[derive(Clone)]
pub struct Downstream {
    api: ProviderApi,
    config: Arc<Config>,
    /// For the chat channels: bounded by the downstream timeout.
    chat: reqwest::Client,
}

impl Downstream {
    /// `api`: the process's one provider client (`AppState::providers`).
    pub fn new(api: ProviderApi, config: Arc<Config>) -> Downstream {
        let chat = reqwest::Client::builder()
            .timeout(config.downstream_timeout)
            .build()
            .expect("an HTTP client without TLS settings builds");
        Downstream { api, config, chat }
    }

    /// One attempt. `Err` carries what went wrong, for the attempt log, and when to retry.
    pub async fn deliver(&self, e: &CompensationEvent) -> Result<Delivered, NotDelivered> {
        let effect = Effect::decode(e.kind.as_str(), &e.payload).map_err(|err| err.to_string())?;
        match effect {
            Effect::DoorAccessGrant(p) | Effect::DoorAccessRevoke(p) => {
                self.access(self.config.door_access_url.as_deref(), e, &p).await
            }
            Effect::AiAccessGrant(p) | Effect::AiAccessRevoke(p) => {
                self.access(self.config.ai_access_url.as_deref(), e, &p).await
            }
            Effect::ProviderRefund(p) => self.refund(e, &p).await,
            Effect::AlertDelivery(p) => self.alert(e, &p).await,
        }
    }

    async fn alert(&self, e: &CompensationEvent, p: &AlertPayload) -> Result<Delivered, NotDelivered> {
        crate::alerts::deliver(&self.chat, &self.config, p, &e.trace_id).await?;
        Ok(Delivered::Ok)
    }

    async fn access(
        &self,
        url: Option<&str>,
        e: &CompensationEvent,
        p: &AccessPayload,
    ) -> Result<Delivered, NotDelivered> {
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
            // The shared client's limit is the providers' (FITORDER_PROVIDER_TIMEOUT); a
            // downstream call has its own.
            .timeout(self.config.downstream_timeout)
            .header("X-Trace-Id", &e.trace_id)
            .json(&body)
            .send()
            .await
            .map_err(|err| api::describe(&err, self.config.downstream_timeout))?;
        Ok(api::check(resp).await.map(|_| Delivered::Ok)?)
    }

    /// Done only when the provider says, in a signed answer, that the money went back. A retry
    /// first asks what became of the earlier request (a refund the provider is processing is
    /// not requested twice); a refund the provider does not know is requested.
    async fn refund(&self, e: &CompensationEvent, p: &RefundPayload) -> Result<Delivered, NotDelivered> {
        let req = RefundRequest {
            out_trade_no: &p.order.order_no,
            refund_no: &p.refund_no,
            provider_txn_id: p.provider_txn_id.as_deref(),
            amount_cents: p.amount_cents,
            total_cents: p.total_cents,
            reason: &p.reason,
            trace_id: &e.trace_id,
        };
        let failed = |err: api::ProviderError| NotDelivered::from(err.to_string());
        if e.attempts > 0 {
            match self.api.refund_status(p.provider, &req).await.map_err(failed)? {
                RefundState::Unknown => {}
                known => return refund_outcome(p, known),
            }
        }
        let state = self.api.refund(p.provider, &req).await.map_err(failed)?;
        refund_outcome(p, state)
    }
}

fn refund_outcome(p: &RefundPayload, state: RefundState) -> Result<Delivered, NotDelivered> {
    match state {
        RefundState::Done { .. } => Ok(Delivered::Ok),
        RefundState::Pending {
            status,
            provider_refund_id,
            recheck_in,
        } => Err(NotDelivered {
            error: format!(
                "{} refund {} ({}) is {status}: the money has not moved yet; done when the provider confirms it",
                p.provider,
                p.refund_no,
                provider_refund_id.as_deref().unwrap_or("no refund id")
            ),
            retry: recheck_in.map_or(Retry::Backoff, Retry::After),
        }),
        RefundState::Failed {
            status,
            provider_refund_id,
        } => Err(NotDelivered {
            error: format!(
                "{} ended refund {} ({}) {status}: the money did not go back; it must be refunded by hand",
                p.provider,
                p.refund_no,
                provider_refund_id.as_deref().unwrap_or("no refund id")
            ),
            retry: Retry::Never,
        }),
        RefundState::Unknown => Err(NotDelivered::from(format!(
            "{} knows no refund {}",
            p.provider, p.refund_no
        ))),
    }
}
