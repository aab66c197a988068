//! Events across every instance: Postgres NOTIFY on commit, one LISTEN connection per process,
//! fanned out to subscribers through a broadcast channel. A slow subscriber lags (and skips),
//! it never blocks the others; a lost connection is re-established with backoff.

use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use futures_util::StreamExt;
use tokio::sync::{broadcast, Notify};

use crate::db::models::{CompensationEvent, ExceptionTicket};
use crate::db::schema::{compensation_events, exception_tickets, order_transitions, orders};
use crate::db::sql::pg_notify;
use crate::db::DbPool;
use crate::domain::OrderStatus;

/// Channel of row changes subscribers see (`order:<transition id>`, `comp:<event id>`,
/// `ticket:<ticket id>` when a ticket opens, `ticketchange:<ticket id>` when it is taken or closed).
pub const EVENTS_CHANNEL: &str = "fitorder_events";
/// Channel that wakes outbox workers when a new event is due.
pub const OUTBOX_CHANNEL: &str = "fitorder_outbox";
/// Channel that wakes the expiry timers when an order with a deadline is placed.
pub const EXPIRY_CHANNEL: &str = "fitorder_expiry";

#[derive(Debug, Clone)]
pub struct StatusChange {
    pub order_no: String,
    pub store_id: i64,
    pub member_id: i64,
    pub from_status: Option<OrderStatus>,
    pub to_status: OrderStatus,
    pub at: chrono::DateTime<chrono::Utc>,
    pub actor: String,
    pub trace_id: String,
}

#[derive(Debug, Clone)]
pub enum Event {
    Order(Arc<StatusChange>),
    Compensation(Arc<CompensationEvent>, Arc<String>, i64),
    Ticket(Arc<ExceptionTicket>),
    /// A ticket taken or closed (its row after the change).
    TicketChanged(Arc<ExceptionTicket>),
}

#[derive(Clone)]
pub struct EventHub {
    tx: broadcast::Sender<Event>,
    /// Woken on every outbox notification (and by the hub on reconnect, in case one was missed).
    pub outbox: Arc<Notify>,
    /// Woken when an order with a deadline is placed anywhere in the cluster.
    pub expiry: Arc<Notify>,
}

impl EventHub {
    /// A hub that is not connected (tests of parts that do not need events).
    pub fn detached() -> EventHub {
        let (tx, _) = broadcast::channel(1024);
        EventHub {
            tx,
            outbox: Arc::new(Notify::new()),
            expiry: Arc::new(Notify::new()),
        }
    }

    /// Starts the process's LISTEN connection on `url`; rows are loaded through `pool`.
    pub fn start(url: String, pool: DbPool) -> EventHub {
        let hub = EventHub::detached();
        let h = hub.clone();
        tokio::spawn(async move { h.listen_forever(url, pool).await });
        hub
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }

    pub fn subscriber_count(&self) -> usize {
        self.tx.receiver_count()
    }

    async fn listen_forever(self, url: String, pool: DbPool) {
        let mut delay = Duration::from_millis(200);
        loop {
            match self.listen_once(&url, &pool).await {
                Ok(()) => delay = Duration::from_millis(200),
                Err(e) => {
                    tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "LISTEN connection lost");
                    metrics::counter!("fitorder_listen_reconnects_total").increment(1);
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(10));
        }
    }

    async fn listen_once(&self, url: &str, pool: &DbPool) -> anyhow::Result<()> {
        let mut conn = AsyncPgConnection::establish(url).await?;
        // Once per connection, in one round trip (simple protocol: nothing to prepare).
        conn.batch_execute(&format!(
            "LISTEN {EVENTS_CHANNEL}; LISTEN {OUTBOX_CHANNEL}; LISTEN {EXPIRY_CHANNEL}"
        ))
        .await?;
        // Anything committed while we were not listening is still due: let workers look.
        self.outbox.notify_waiters();
        self.expiry.notify_waiters();
        let mut stream = std::pin::pin!(conn.notifications_stream());
        while let Some(n) = stream.next().await {
            let n = n?;
            if n.channel == OUTBOX_CHANNEL {
                self.outbox.notify_waiters();
                continue;
            }
            if n.channel == EXPIRY_CHANNEL {
                self.expiry.notify_waiters();
                continue;
            }
            if self.tx.receiver_count() == 0 {
                continue;
            }
            match load(pool, &n.payload).await {
                Ok(Some(event)) => {
                    let _ = self.tx.send(event);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(payload = %n.payload, error = %e, "event not loaded"),
            }
        }
        anyhow::bail!("notification stream ended")
    }
}

/// order_no, store, member, from, to, at, actor, trace id.
type TransitionRow = (
    String,
    i64,
    i64,
    Option<OrderStatus>,
    OrderStatus,
    chrono::DateTime<chrono::Utc>,
    String,
    String,
);

async fn load(pool: &DbPool, payload: &str) -> anyhow::Result<Option<Event>> {
    let Some((kind, id)) = payload.split_once(':') else {
        return Ok(None);
    };
    let Ok(id) = id.parse::<i64>() else {
        return Ok(None);
    };
    let mut conn = pool.get().await?;
    Ok(match kind {
        "order" => {
            let row: Option<TransitionRow> = order_transitions::table
                .inner_join(orders::table)
                .filter(order_transitions::id.eq(id))
                .select((
                    orders::order_no,
                    orders::store_id,
                    orders::member_id,
                    order_transitions::from_status,
                    order_transitions::to_status,
                    order_transitions::at,
                    order_transitions::actor,
                    order_transitions::trace_id,
                ))
                .get_result(&mut conn)
                .await
                .optional()?;
            row.map(
                |(order_no, store_id, member_id, from_status, to_status, at, actor, trace_id)| {
                    Event::Order(Arc::new(StatusChange {
                        order_no,
                        store_id,
                        member_id,
                        from_status,
                        to_status,
                        at,
                        actor,
                        trace_id,
                    }))
                },
            )
        }
        "comp" => {
            let row: Option<(CompensationEvent, String, i64)> = compensation_events::table
                .inner_join(orders::table)
                .filter(compensation_events::id.eq(id))
                .select((CompensationEvent::as_select(), orders::order_no, orders::store_id))
                .get_result(&mut conn)
                .await
                .optional()?;
            row.map(|(e, no, store)| Event::Compensation(Arc::new(e), Arc::new(no), store))
        }
        "ticket" | "ticketchange" => exception_tickets::table
            .find(id)
            .select(ExceptionTicket::as_select())
            .get_result(&mut conn)
            .await
            .optional()?
            .map(|t| match kind {
                "ticket" => Event::Ticket(Arc::new(t)),
                _ => Event::TicketChanged(Arc::new(t)),
            }),
        _ => None,
    })
}

/// A statement announcing `payload` on the events channel when the transaction commits.
pub fn notify_sql(payload: &str) -> diesel::dsl::select<pg_notify<&'static str, String>> {
    diesel::select(pg_notify(EVENTS_CHANNEL, payload.to_string()))
}

/// A statement waking the expiry timers of every instance when the transaction commits.
pub fn wake_expiry() -> diesel::dsl::select<pg_notify<&'static str, &'static str>> {
    diesel::select(pg_notify(EXPIRY_CHANNEL, ""))
}
