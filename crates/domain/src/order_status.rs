//! The order state machine: the one place that says which status changes exist and who may ask
//! for each. The database trigger `order_status_guard` (migrations/…_core/up.sql) holds the same
//! table of pairs; `tests/it/state_machine.rs` checks that both agree.
//!
//! ```text
//! WAIT_PAY ──> PAID ──> CONSUMING ──> CONSUMED
//!    │           │          │
//!    v           v          v
//! CANCELED    REFUNDED   REFUNDED
//! ```

use super::actor::ActorKind;
use super::ticket::TicketAction;
use super::vocabulary::vocabulary;

vocabulary! {
    /// Where an order stands.
    pub enum OrderStatus {
        WaitPay = "WAIT_PAY",
        Paid = "PAID",
        Consuming = "CONSUMING",
        Consumed = "CONSUMED",
        Canceled = "CANCELED",
        Refunded = "REFUNDED",
    }
}

/// Every transition that exists, with the actors allowed to cause it and what it means.
/// Reading this table is reading the whole lifecycle.
pub const TRANSITIONS: &[(OrderStatus, OrderStatus, &[ActorKind], &str)] = {
    use ActorKind::*;
    use OrderStatus::*;
    &[
        // Wallet orders are paid by the member who places them; online ones by the provider's
        // callback (or a late payment found by the system's query); offline ones by staff.
        (WaitPay, Paid, &[Member, Admin, Provider, System], "payment applied"),
        // The member changes their mind, staff cancel at the desk, or the order times out.
        (WaitPay, Canceled, &[Member, Admin, System], "canceled before payment"),
        // The first check-in; the system passes a never-used membership through here at its end.
        (Paid, Consuming, &[Member, Admin, System], "first check-in"),
        // The last credit used, or the membership's validity over.
        (Consuming, Consumed, &[Member, Admin, System], "everything used"),
        // Refunds are staff decisions (admin, or ops closing a ticket); a member takes back an
        // unused prepaid order within its cooling-off period (`requestCoolingOffRefund`).
        (Paid, Refunded, &[Member, Admin, Ops], "refunded before use"),
        (Consuming, Refunded, &[Admin, Ops], "refunded the unused share"),
    ]
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// The pair is not in the table: nobody may do this.
    #[error("illegal transition {from} -> {to}")]
    Illegal { from: OrderStatus, to: OrderStatus },
    /// The pair exists, but not for this actor.
    #[error("{actor:?} may not move an order {from} -> {to}")]
    NotAllowed {
        from: OrderStatus,
        to: OrderStatus,
        actor: ActorKind,
    },
}

impl OrderStatus {
    /// Statuses reachable from here in one step, whoever asks.
    pub fn allowed_next(self) -> Vec<OrderStatus> {
        TRANSITIONS
            .iter()
            .filter(|(from, ..)| *from == self)
            .map(|(_, to, ..)| *to)
            .collect()
    }

    /// Paid and not yet finished or refunded: the order's credits and access are live.
    pub fn is_live(self) -> bool {
        matches!(self, OrderStatus::Paid | OrderStatus::Consuming)
    }

    pub fn is_final(self) -> bool {
        self.allowed_next().is_empty()
    }
}

/// Decides whether `actor` may move an order from `from` to `to`.
pub fn check(from: OrderStatus, to: OrderStatus, actor: ActorKind) -> Result<(), TransitionError> {
    match TRANSITIONS.iter().find(|(f, t, ..)| *f == from && *t == to) {
        None => Err(TransitionError::Illegal { from, to }),
        Some((_, _, actors, _)) if !actors.contains(&actor) => Err(TransitionError::NotAllowed { from, to, actor }),
        Some(_) => Ok(()),
    }
}

/// Who may close an exception ticket at all (`resolveTicket`).
pub const TICKET_RESOLVERS: &[ActorKind] = &[ActorKind::Admin, ActorKind::Ops];

/// Every action that closes a ticket stands for a change of status ([`TicketAction::order_change`]):
/// its actors are that transition's in [`TRANSITIONS`] (among [`TICKET_RESOLVERS`]), so that
/// the ticket screen, the order operations the actions call and the state machine cannot
/// disagree. An action that changes no order may be taken by any resolver.
/// The actors of a transition in [`TRANSITIONS`] (none when the pair does not exist).
pub fn actors_of(from: OrderStatus, to: OrderStatus) -> &'static [ActorKind] {
    TRANSITIONS
        .iter()
        .find(|(f, t, ..)| *f == from && *t == to)
        .map(|(_, _, actors, _)| *actors)
        .unwrap_or(&[])
}

/// Whether `actor` may close a ticket with `action`.
pub fn may_resolve_ticket(action: TicketAction, actor: ActorKind) -> bool {
    TICKET_RESOLVERS.contains(&actor)
        && action
            .order_change()
            .is_none_or(|(from, to)| actors_of(from, to).contains(&actor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_the_six_contract_transitions_exist() {
        use OrderStatus::*;
        let legal = [
            (WaitPay, Paid),
            (WaitPay, Canceled),
            (Paid, Consuming),
            (Paid, Refunded),
            (Consuming, Consumed),
            (Consuming, Refunded),
        ];
        for from in OrderStatus::ALL {
            for to in OrderStatus::ALL {
                let exists = TRANSITIONS.iter().any(|(f, t, ..)| *f == from && *t == to);
                assert_eq!(exists, legal.contains(&(from, to)), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn every_actor_is_refused_an_illegal_pair() {
        let actors = [
            ActorKind::Member,
            ActorKind::Admin,
            ActorKind::Ops,
            ActorKind::Provider,
            ActorKind::System,
        ];
        for from in OrderStatus::ALL {
            for to in OrderStatus::ALL {
                let legal = from.allowed_next().contains(&to);
                for actor in actors {
                    let r = check(from, to, actor);
                    if !legal {
                        assert_eq!(r, Err(TransitionError::Illegal { from, to }));
                    } else {
                        assert_ne!(r, Err(TransitionError::Illegal { from, to }));
                    }
                }
            }
        }
    }

    #[test]
    fn providers_only_pay_and_members_refund_only_unused_orders() {
        use OrderStatus::*;
        assert!(check(WaitPay, Paid, ActorKind::Provider).is_ok());
        assert!(check(WaitPay, Canceled, ActorKind::Provider).is_err());
        assert!(check(Paid, Refunded, ActorKind::Provider).is_err());
        // A member's cooling-off refund: before any use only.
        assert!(check(Paid, Refunded, ActorKind::Member).is_ok());
        assert!(check(Consuming, Refunded, ActorKind::Member).is_err());
        assert!(check(Paid, Refunded, ActorKind::Admin).is_ok());
        assert!(check(WaitPay, Canceled, ActorKind::System).is_ok());
    }

    #[test]
    fn ticket_actions_follow_the_transitions() {
        use ActorKind::*;
        let table = [
            (TicketAction::NoAction, true, true),
            (TicketAction::ReplayCompensation, true, true),
            (TicketAction::MarkPaid, true, false),
            (TicketAction::CreditSessions, true, false),
            (TicketAction::Refund, true, true),
        ];
        for (action, admin, ops) in table {
            assert_eq!(may_resolve_ticket(action, Admin), admin, "{action}");
            assert_eq!(may_resolve_ticket(action, Ops), ops, "{action}");
            for other in [Member, Provider, System] {
                assert!(!may_resolve_ticket(action, other), "{action}");
            }
        }
        // Every action is in the table above; no other text is an action.
        assert!(TicketAction::ALL.iter().all(|a| table.iter().any(|(t, ..)| t == a)));
        assert_eq!(TicketAction::parse("DELETE"), None);
    }

    #[test]
    fn final_states_have_no_way_out() {
        assert!(OrderStatus::Consumed.is_final());
        assert!(OrderStatus::Canceled.is_final());
        assert!(OrderStatus::Refunded.is_final());
        assert!(!OrderStatus::Paid.is_final());
        assert_eq!(OrderStatus::parse("CONSUMING"), Some(OrderStatus::Consuming));
        assert_eq!(OrderStatus::parse("nope"), None);
    }
}
