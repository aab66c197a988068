//! Subscriptions for the ops screen and the member app, fed by the process's event hub (one
//! LISTEN connection, a broadcast channel): events from every instance reach every subscriber.

use async_graphql::{Context, Subscription, ID};
use futures_util::stream::{BoxStream, StreamExt};
use tokio::sync::broadcast::error::RecvError;

use super::outbox::CompensationStatus;
use super::types::{ExceptionTicketNode, OrderStatusChange};
use super::{parse_id, state, viewer};
use crate::auth::Role;
use crate::events::Event;
use crate::graphql::error::IntoGqlResult;
use crate::graphql::types::CompensationEventNode;

pub struct Subscription;

/// Counts live subscribers for `/metrics` while a stream is alive.
struct Live;
impl Live {
    fn new() -> Live {
        metrics::gauge!("fitorder_subscribers").increment(1.0);
        Live
    }
}
impl Drop for Live {
    fn drop(&mut self) {
        metrics::gauge!("fitorder_subscribers").decrement(1.0);
    }
}

/// The hub's events as a stream; a subscriber that falls behind skips what it missed (counted)
/// instead of slowing anyone else.
fn events(ctx: &Context<'_>) -> BoxStream<'static, Event> {
    let rx = state(ctx).events.subscribe();
    futures_util::stream::unfold((rx, Live::new()), |(mut rx, live)| async move {
        loop {
            match rx.recv().await {
                Ok(e) => return Some((e, (rx, live))),
                Err(RecvError::Lagged(n)) => metrics::counter!("fitorder_subscriber_lagged_total").increment(n),
                Err(RecvError::Closed) => return None,
            }
        }
    })
    .boxed()
}

#[Subscription]
impl Subscription {
    /// Compensation events as they are written and attempted (admin and ops).
    async fn compensation_updates(
        &self,
        ctx: &Context<'_>,
        order_no: Option<String>,
        status: Option<Vec<CompensationStatus>>,
    ) -> async_graphql::Result<BoxStream<'static, CompensationEventNode>> {
        let v = viewer(ctx).gql()?.clone();
        v.require(&[Role::Admin, Role::Ops]).gql()?;
        let wanted: Option<Vec<crate::domain::CompensationStatus>> =
            status.map(|s| s.into_iter().map(Into::into).collect());
        Ok(events(ctx)
            .filter_map(move |e| {
                let keep = match &e {
                    Event::Compensation(ev, no, store) => {
                        v.sees_store(*store)
                            && order_no.as_ref().is_none_or(|o| o == no.as_str())
                            && wanted.as_ref().is_none_or(|w| w.contains(&ev.status))
                    }
                    _ => false,
                };
                let out = match e {
                    Event::Compensation(ev, ..) if keep => Some(CompensationEventNode((*ev).clone())),
                    _ => None,
                };
                futures_util::future::ready(out)
            })
            .boxed())
    }

    /// Status changes of orders: members see only their own; staff filter by order or store.
    async fn order_status_changed(
        &self,
        ctx: &Context<'_>,
        order_no: Option<String>,
        store_id: Option<ID>,
    ) -> async_graphql::Result<BoxStream<'static, OrderStatusChange>> {
        let v = viewer(ctx).gql()?.clone();
        let store = store_id.as_ref().map(|s| parse_id(s, "storeId")).transpose().gql()?;
        Ok(events(ctx)
            .filter_map(move |e| {
                let out = match e {
                    Event::Order(c) => {
                        let keep = v.sees_owned(c.member_id, c.store_id)
                            && order_no.as_ref().is_none_or(|o| *o == c.order_no)
                            && store.is_none_or(|s| s == c.store_id);
                        keep.then(|| OrderStatusChange {
                            order_no: c.order_no.clone(),
                            from_status: c.from_status.map(Into::into),
                            to_status: c.to_status.into(),
                            at: c.at,
                            actor: c.actor.clone(),
                            trace_id: c.trace_id.clone(),
                        })
                    }
                    _ => None,
                };
                futures_util::future::ready(out)
            })
            .boxed())
    }

    /// Exception tickets as they open (admin and ops).
    async fn ticket_opened(
        &self,
        ctx: &Context<'_>,
        store_id: Option<ID>,
    ) -> async_graphql::Result<BoxStream<'static, ExceptionTicketNode>> {
        tickets(ctx, store_id, |e| match e {
            Event::Ticket(t) => Some(t),
            _ => None,
        })
    }

    /// Exception tickets as they are taken or closed, each with its status after the change
    /// (admin and ops).
    async fn ticket_changed(
        &self,
        ctx: &Context<'_>,
        store_id: Option<ID>,
    ) -> async_graphql::Result<BoxStream<'static, ExceptionTicketNode>> {
        tickets(ctx, store_id, |e| match e {
            Event::TicketChanged(t) => Some(t),
            _ => None,
        })
    }
}

/// The tickets `pick` takes from the hub's events that staff `ctx` may see, of one store if asked.
fn tickets(
    ctx: &Context<'_>,
    store_id: Option<ID>,
    pick: fn(Event) -> Option<std::sync::Arc<crate::db::models::ExceptionTicket>>,
) -> async_graphql::Result<BoxStream<'static, ExceptionTicketNode>> {
    let v = viewer(ctx).gql()?.clone();
    v.require(&[Role::Admin, Role::Ops]).gql()?;
    let store = store_id.as_ref().map(|s| parse_id(s, "storeId")).transpose().gql()?;
    Ok(events(ctx)
        .filter_map(move |e| {
            let out = pick(e).and_then(|t| {
                let keep = v.sees_store_of(t.store_id) && store.is_none_or(|s| t.store_id == Some(s));
                keep.then(|| ExceptionTicketNode((*t).clone()))
            });
            futures_util::future::ready(out)
        })
        .boxed())
}
