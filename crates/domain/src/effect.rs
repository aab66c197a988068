//! The downstream effects of the transactional outbox, as data: what a change asks of the world
//! (open the door, tell the AI devices, send money back through the provider) with the payload
//! each needs. Writing, storing and delivering them is elsewhere (`outbox`, `compensation`);
//! here is only what they are, so every layer can name them.
//!
//! The list in [`for_each_effect!`] is the one place an effect is declared. From it come
//! [`Effect`] (the variant with its payload), [`CompensationKind`] (the text in
//! `compensation_events.kind`), the encoding of both columns, the idempotency key, and the
//! GraphQL enum (in `graphql::outbox`, the first group only: an order's effects; the second
//! group, effects of no order such as alert deliveries, is not in the API). Adding an effect
//! is: a line in the list (and its payload type, if it needs a new one), its arms in the
//! `match`es the compiler asks for (the delivery in `compensation::downstream`, the alert
//! decision in `alerts`, the backoff and DEAD handling in `compensation::worker`), and a
//! migration widening the `compensation_events.kind` CHECK (which a test compares with the
//! list).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::payment::Provider;
use super::vocabulary::vocabulary;

/// Calls `$m! { [Variant(Payload) = "KIND", …] [Variant(Payload) = "KIND", …] }` with the list
/// of effects: an order's, then those of no order. Every enum of effect kinds is made from it,
/// so none can miss one. Exported for the GraphQL mirror (`fitorder-api`).
#[doc(hidden)]
#[macro_export]
macro_rules! __for_each_effect {
    ($m:ident) => {
        $m! {
            // An order's effects, which the API shows (`CompensationKind` in the contract).
            [
            /// Gives the member of a paid order door access at the store.
            DoorAccessGrant(AccessPayload) = "DOOR_ACCESS_GRANT",
            /// Takes door access away again for a refunded order.
            DoorAccessRevoke(AccessPayload) = "DOOR_ACCESS_REVOKE",
            /// Gives the member of a paid order access to the store's AI devices.
            AiAccessGrant(AccessPayload) = "AI_ACCESS_GRANT",
            /// Takes AI-device access away again for a refunded order.
            AiAccessRevoke(AccessPayload) = "AI_ACCESS_REVOKE",
            /// Sends online money back to the payer through the provider's refund API.
            ProviderRefund(RefundPayload) = "PROVIDER_REFUND",
            ]
            // Effects of no order, which the API does not show (their rows have no order).
            [
            /// Sends one alert to one chat channel (a WeCom, DingTalk or Feishu robot, a webhook).
            AlertDelivery(AlertPayload) = "ALERT_DELIVERY",
            ]
        }
    };
}
pub use __for_each_effect as for_each_effect;

macro_rules! define_effects {
    ([$($shown:tt)*] [$($hidden:tt)*]) => {
        define_effects!(@all $($shown)* $($hidden)*);
    };
    (@all $($(#[doc = $doc:literal])* $variant:ident($payload:ty) = $kind:literal,)*) => {
        /// One downstream effect with what its delivery needs. Stored as two columns of
        /// `compensation_events`: the kind ([`Effect::kind`]) and the payload as JSON
        /// ([`Effect::payload_json`]); read back with [`Effect::decode`].
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Effect {
            $($(#[doc = $doc])* $variant($payload),)*
        }

        vocabulary! {
            /// What an effect does, without its payload: the text in `compensation_events.kind`.
            pub enum CompensationKind {
                $($(#[doc = $doc])* $variant = $kind,)*
            }
        }

        impl Effect {
            pub fn kind(&self) -> CompensationKind {
                match self {
                    $(Effect::$variant(_) => CompensationKind::$variant,)*
                }
            }

            fn payload(&self) -> &dyn Payload {
                match self {
                    $(Effect::$variant(p) => p,)*
                }
            }

            /// The payload column.
            pub fn payload_json(&self) -> serde_json::Value {
                match self {
                    $(Effect::$variant(p) => encode(p),)*
                }
            }

            /// The effect of a stored row: its kind and payload columns.
            pub fn decode(kind: &str, payload: &serde_json::Value) -> Result<Effect, DecodeError> {
                match kind {
                    $($kind => decode(kind, payload).map(Effect::$variant),)*
                    other => Err(DecodeError::UnknownKind(other.to_string())),
                }
            }
        }
    };
}
for_each_effect!(define_effects);

fn encode<P: Serialize>(p: &P) -> serde_json::Value {
    // Plain structs of strings and integers: serializing cannot fail.
    serde_json::to_value(p).expect("an effect payload serializes")
}

fn decode<P: DeserializeOwned>(kind: &str, payload: &serde_json::Value) -> Result<P, DecodeError> {
    P::deserialize(payload).map_err(|e| DecodeError::Payload {
        kind: kind.to_string(),
        why: e.to_string(),
    })
}

impl Effect {
    /// The key the downstream deduplicates by, unique per event: `<orderNo>:<KIND>` (one grant
    /// and one revoke per order and kind), with the payload's own part appended when it has one
    /// (`<orderNo>:PROVIDER_REFUND:<refundNo>`); an effect of no order is named by its own
    /// subject (`ALERT-<alertId>:ALERT_DELIVERY:<channel>`).
    pub fn idempotency_key(&self) -> String {
        let p = self.payload();
        let base = format!("{}:{}", p.subject(), self.kind());
        match p.key_part() {
            Some(part) => format!("{base}:{part}"),
            None => base,
        }
    }

    /// The order the effect is about, if it is about one.
    pub fn order(&self) -> Option<&OrderRef> {
        self.payload().order()
    }
}

/// A stored row that is no effect this build knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("unknown event kind {0}")]
    UnknownKind(String),
    #[error("the payload of a {kind} event does not read: {why}")]
    Payload { kind: String, why: String },
}

/// What every payload has: the order it is about (if any), what its idempotency key starts
/// with (the order's number), and the part of the key beyond that and the kind (for effects
/// that happen more than once per order).
trait Payload {
    fn order(&self) -> Option<&OrderRef>;
    fn subject(&self) -> String {
        self.order().map(|o| o.order_no.clone()).unwrap_or_default()
    }
    fn key_part(&self) -> Option<&str> {
        None
    }
}

/// The order an effect is about, as the payload names it (ids as strings, as the downstreams
/// receive them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderRef {
    pub order_no: String,
    pub member_id: String,
    pub store_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AccessAction {
    Grant,
    Revoke,
}

/// Door and AI-device access: who, where, and whether it is granted or revoked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessPayload {
    #[serde(flatten)]
    pub order: OrderRef,
    pub action: AccessAction,
    /// What a grant or revoke after the payment's or the refund's is for, when the card
    /// changes in between (`FREEZE-<id>`, `TRANSFER`, `EXPIRED`): the part of its idempotency
    /// key that keeps it apart from the order's first grant (a downstream that saw that grant
    /// must not drop the grant after a freeze). Absent for the payment's and the refund's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
}

impl Payload for AccessPayload {
    fn order(&self) -> Option<&OrderRef> {
        Some(&self.order)
    }
    fn key_part(&self) -> Option<&str> {
        self.cause.as_deref()
    }
}

/// A refund through the provider's API: of how much of which payment, under which refund number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RefundPayload {
    #[serde(flatten)]
    pub order: OrderRef,
    pub provider: Provider,
    pub refund_no: String,
    pub amount_cents: i64,
    /// What the payment being refunded collected (the providers ask for it).
    pub total_cents: i64,
    pub provider_txn_id: Option<String>,
    pub reason: String,
}

impl Payload for RefundPayload {
    fn order(&self) -> Option<&OrderRef> {
        Some(&self.order)
    }
    fn key_part(&self) -> Option<&str> {
        Some(&self.refund_no)
    }
}

/// One alert for one channel: what is said (the alert's row, as raised) and where. The channel
/// is named by its id (kind and a hash of its URL): the URL's token and the signing secret are
/// never stored, each process has them in its configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlertPayload {
    pub alert_id: String,
    pub channel: String,
    pub cause: String,
    pub title: String,
    pub lines: Vec<String>,
    pub order_no: Option<String>,
    pub raised_at: chrono::DateTime<chrono::Utc>,
}

impl Payload for AlertPayload {
    fn order(&self) -> Option<&OrderRef> {
        None
    }
    fn subject(&self) -> String {
        format!("ALERT-{}", self.alert_id)
    }
    fn key_part(&self) -> Option<&str> {
        Some(&self.channel)
    }
}

vocabulary! {
    /// Where an event is in its delivery: the text in `compensation_events.status`.
    pub enum CompensationStatus {
        /// Not attempted yet (or replayed).
        Pending = "PENDING",
        /// Failed at least once; due again at `next_attempt_at`.
        Retrying = "RETRYING",
        /// Delivered.
        Succeeded = "SUCCEEDED",
        /// Gave up at the attempt limit; a ticket is open, ops may replay it.
        Dead = "DEAD",
    }
}

impl CompensationStatus {
    /// Still to be delivered: claimable once due.
    pub fn is_waiting(self) -> bool {
        matches!(self, CompensationStatus::Pending | CompensationStatus::Retrying)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn order() -> OrderRef {
        OrderRef {
            order_no: "FO1".into(),
            member_id: "7".into(),
            store_id: "3".into(),
        }
    }

    fn refund() -> RefundPayload {
        RefundPayload {
            order: order(),
            provider: Provider::Alipay,
            refund_no: "RF9".into(),
            amount_cents: 6000,
            total_cents: 10000,
            provider_txn_id: None,
            reason: "moving".into(),
        }
    }

    /// The JSON of rows written before the payloads were typed, field by field: they must read.
    #[test]
    fn payloads_keep_the_field_names_of_rows_already_written() {
        let grant = json!({"orderNo": "FO1", "memberId": "7", "storeId": "3", "action": "GRANT"});
        let e = Effect::decode("AI_ACCESS_GRANT", &grant).unwrap();
        assert_eq!(
            e,
            Effect::AiAccessGrant(AccessPayload {
                order: order(),
                action: AccessAction::Grant,
                cause: None,
            })
        );
        assert_eq!(e.payload_json(), grant);
        let refund_json = json!({"orderNo": "FO1", "memberId": "7", "storeId": "3", "provider": "ALIPAY",
            "refundNo": "RF9", "amountCents": 6000, "totalCents": 10000, "providerTxnId": null, "reason": "moving"});
        let e = Effect::decode("PROVIDER_REFUND", &refund_json).unwrap();
        assert_eq!(e, Effect::ProviderRefund(refund()));
        assert_eq!(e.payload_json(), refund_json);
        // Written without the transaction id at all: still the same refund.
        let mut without = refund_json.clone();
        without.as_object_mut().unwrap().remove("providerTxnId");
        assert_eq!(Effect::decode("PROVIDER_REFUND", &without).unwrap(), e);
    }

    #[test]
    fn keys_are_the_order_and_kind_and_the_refund_number() {
        let grant = Effect::DoorAccessGrant(AccessPayload {
            order: order(),
            action: AccessAction::Grant,
            cause: None,
        });
        assert_eq!(grant.idempotency_key(), "FO1:DOOR_ACCESS_GRANT");
        // A grant after a freeze is another event than the payment's, with a key of its own.
        let again = Effect::DoorAccessGrant(AccessPayload {
            order: order(),
            action: AccessAction::Grant,
            cause: Some("FREEZE-4".into()),
        });
        assert_eq!(again.idempotency_key(), "FO1:DOOR_ACCESS_GRANT:FREEZE-4");
        assert_eq!(again.payload_json()["cause"], "FREEZE-4");
        assert_eq!(
            Effect::ProviderRefund(refund()).idempotency_key(),
            "FO1:PROVIDER_REFUND:RF9"
        );
    }

    #[test]
    fn an_alert_delivery_is_keyed_by_its_alert_and_channel_and_has_no_order() {
        let p = AlertPayload {
            alert_id: "42".into(),
            channel: "wecom-0123456789".into(),
            cause: "TASK_STUCK".into(),
            title: "t".into(),
            lines: vec!["a".into()],
            order_no: None,
            raised_at: chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
        };
        let e = Effect::AlertDelivery(p.clone());
        assert_eq!(e.idempotency_key(), "ALERT-42:ALERT_DELIVERY:wecom-0123456789");
        assert_eq!(e.order(), None);
        assert_eq!(Effect::decode("ALERT_DELIVERY", &e.payload_json()), Ok(e));
        // As the migration writes the rows it moves from `alert_deliveries`.
        let migrated = json!({"alertId": "42", "channel": "wecom-0123456789", "cause": "TASK_STUCK",
            "title": "t", "lines": ["a"], "orderNo": null, "raisedAt": "2023-11-14T22:13:20.000000Z"});
        assert_eq!(
            Effect::decode("ALERT_DELIVERY", &migrated),
            Ok(Effect::AlertDelivery(p))
        );
    }

    #[test]
    fn every_kind_round_trips_and_strangers_are_refused() {
        for kind in CompensationKind::ALL {
            assert_eq!(CompensationKind::parse(kind.as_str()), Some(kind));
        }
        for status in CompensationStatus::ALL {
            assert_eq!(CompensationStatus::parse(status.as_str()), Some(status));
        }
        assert_eq!(
            Effect::decode("DOOR_UNLOCK", &json!({})),
            Err(DecodeError::UnknownKind("DOOR_UNLOCK".into()))
        );
        assert!(matches!(
            Effect::decode("PROVIDER_REFUND", &json!({"orderNo": "FO1"})),
            Err(DecodeError::Payload { .. })
        ));
    }
}
