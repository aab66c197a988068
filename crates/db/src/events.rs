//! Events across every instance: Postgres NOTIFY on commit, one LISTEN connection per process,
//! fanned out to subscribers through a broadcast channel. A slow subscriber lags (and skips),
//! it never blocks the others; a lost connection is re-established with backoff.
//!
//! The LISTEN loop never waits for the database: wake-ups (outbox, expiry, ended sessions) are
//! handled in place, and a row notification only joins a bounded queue ([`LOAD_QUEUE`]). A
//! loader task of its own reads the rows, a batch of queued notifications in one query per
//! kind, and broadcasts them; a notification that finds the queue full is dropped and counted
//! (`fitorder_events_dropped_total`), like a lagging subscriber's. So a burst of row changes, or
//! a pool with no connection to spare, delays subscribers, never an outbox or expiry wake-up,
//! and what waits is bounded.

use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use futures_util::StreamExt;
use tokio::sync::{broadcast, mpsc, Notify};

use crate::db::models::{CompensationEvent, ExceptionTicket};
use crate::db::schema::{compensation_events, exception_tickets, order_transitions, orders};
use crate::db::sql::{fitorder_announce, pg_notify};
use crate::db::DbPool;
use crate::domain::OrderStatus;

/// Channel of row changes subscribers see: `<what>:<id>` ([`Announced`]), built by the database
/// function `fitorder_announce` alone (statements call it, Rust code through [`announce`]).
pub const EVENTS_CHANNEL: &str = "fitorder_events";
/// Channel that wakes outbox workers when a new event is due.
pub const OUTBOX_CHANNEL: &str = "fitorder_outbox";
/// Channel that wakes the expiry timers when an order with a deadline is placed.
pub const EXPIRY_CHANNEL: &str = "fitorder_expiry";
/// Channel naming a member session that has ended (payload: the session id).
pub const SESSIONS_CHANNEL: &str = "fitorder_sessions";

/// The LISTEN connection's first retry after losing a connection that was listening.
const LISTEN_RETRY_FIRST: Duration = Duration::from_millis(200);
/// Its longest wait between attempts while no server takes the connection (a failover in
/// progress): short, so subscribers hear again within seconds of a new primary; an attempt
/// costs one connection refused.
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(2);

/// How many row notifications wait for the loader; past that they are dropped (and counted).
pub const LOAD_QUEUE: usize = 4096;
/// How many queued notifications the loader reads together (one query per kind).
const LOAD_BATCH: usize = 256;

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
    /// Member sessions that ended anywhere in the cluster (signed out, refresh token reused).
    pub ended_sessions: Arc<EndedSessions>,
}

impl EventHub {
    /// A hub that is not connected (tests of parts that do not need events).
    pub fn detached() -> EventHub {
        let (tx, _) = broadcast::channel(1024);
        EventHub {
            tx,
            outbox: Arc::new(Notify::new()),
            expiry: Arc::new(Notify::new()),
            ended_sessions: Arc::new(EndedSessions::new(ENDED_SESSIONS_KEPT)),
        }
    }

    /// Starts the process's LISTEN connection on `url`, and the task that loads the rows the
    /// notifications name through `pool`.
    pub fn start(url: String, pool: DbPool) -> EventHub {
        let hub = EventHub::detached();
        let (queue, queued) = mpsc::channel(LOAD_QUEUE);
        tokio::spawn(load_forever(hub.tx.clone(), pool, queued));
        let h = hub.clone();
        tokio::spawn(async move { h.listen_forever(url, queue).await });
        hub
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }

    pub fn subscriber_count(&self) -> usize {
        self.tx.receiver_count()
    }

    /// Listens until the connection is lost, then connects again: 200 ms after a connection
    /// that was listening, doubling up to [`LISTEN_RETRY_MAX`] while none can be made. A
    /// multi-host URL (`target_session_attrs=read-write`) finds the new primary after a
    /// failover; what was committed while nobody listened is picked up by the wake-ups below.
    async fn listen_forever(self, url: String, queue: mpsc::Sender<String>) {
        let mut delay = LISTEN_RETRY_FIRST;
        loop {
            let mut listening = false;
            if let Err(e) = self.listen_once(&url, &queue, &mut listening).await {
                if listening {
                    delay = LISTEN_RETRY_FIRST;
                }
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "LISTEN connection lost");
                metrics::counter!("fitorder_listen_reconnects_total").increment(1);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(LISTEN_RETRY_MAX);
        }
    }

    async fn listen_once(&self, url: &str, queue: &mpsc::Sender<String>, listening: &mut bool) -> anyhow::Result<()> {
        let mut conn = AsyncPgConnection::establish(url).await?;
        // Once per connection, in one round trip (simple protocol: nothing to prepare).
        conn.batch_execute(&format!(
            "LISTEN {EVENTS_CHANNEL}; LISTEN {OUTBOX_CHANNEL}; LISTEN {EXPIRY_CHANNEL}; LISTEN {SESSIONS_CHANNEL}"
        ))
        .await?;
        *listening = true;
        // Sessions may have ended while we were not listening: the next check reloads them.
        self.ended_sessions.mark_stale();
        // Anything committed while we were not listening is still due: let workers look.
        self.outbox.notify_waiters();
        self.expiry.notify_waiters();
        let mut stream = std::pin::pin!(conn.notifications_stream());
        let mut dropping = false;
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
            if n.channel == SESSIONS_CHANNEL {
                self.ended_sessions.insert(&n.payload);
                continue;
            }
            if self.tx.receiver_count() == 0 {
                continue;
            }
            // Never awaits: the loader takes it from here, or it is dropped.
            match queue.try_send(n.payload) {
                Ok(()) => dropping = false,
                Err(mpsc::error::TrySendError::Full(payload)) => {
                    metrics::counter!("fitorder_events_dropped_total").increment(1);
                    if !dropping {
                        tracing::warn!(payload = %payload, queued = LOAD_QUEUE,
                            "event loader behind: notifications dropped until it catches up");
                    }
                    dropping = true;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => anyhow::bail!("the event loader stopped"),
            }
        }
        anyhow::bail!("notification stream ended")
    }
}

/// Loads the rows of queued notifications, a batch at a time, and broadcasts them in the order
/// they were notified (one event per notification, as each row is when loaded).
async fn load_forever(tx: broadcast::Sender<Event>, pool: DbPool, mut queued: mpsc::Receiver<String>) {
    let mut batch = Vec::with_capacity(LOAD_BATCH);
    while queued.recv_many(&mut batch, LOAD_BATCH).await > 0 {
        // Nobody listens any more: nothing to load.
        if tx.receiver_count() > 0 {
            match load(&pool, &batch).await {
                Ok(events) => {
                    for event in events {
                        let _ = tx.send(event);
                    }
                }
                Err(e) => tracing::warn!(notifications = batch.len(), error = %e, "events not loaded"),
            }
        }
        batch.clear();
    }
}

/// transition id, order_no, store, member, from, to, at, actor, trace id.
type TransitionRow = (
    i64,
    String,
    i64,
    i64,
    Option<OrderStatus>,
    OrderStatus,
    chrono::DateTime<chrono::Utc>,
    String,
    String,
);

/// What a notification on the events channel names: `<what>:<id>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Announced {
    /// `order:<transition id>`: an order changed status (or was placed).
    Transition,
    /// `comp:<event id>`: an outbox event was written or moved on.
    Compensation,
    /// `ticket:<ticket id>`: an exception ticket opened.
    Ticket,
    /// `ticketchange:<ticket id>`: a ticket was taken or closed.
    TicketChanged,
}

impl Announced {
    pub const ALL: [Announced; 4] = [
        Announced::Transition,
        Announced::Compensation,
        Announced::Ticket,
        Announced::TicketChanged,
    ];

    /// The `what` of `fitorder_announce(what, id)`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Announced::Transition => "order",
            Announced::Compensation => "comp",
            Announced::Ticket => "ticket",
            Announced::TicketChanged => "ticketchange",
        }
    }

    /// What a notification's payload names; `None` for anything else.
    pub fn parse(payload: &str) -> Option<(Announced, i64)> {
        let (what, id) = payload.split_once(':')?;
        let what = Announced::ALL.into_iter().find(|a| a.as_str() == what)?;
        Some((what, id.parse().ok()?))
    }
}

/// A statement announcing the row `id` (`what` it is) to subscribers when the transaction
/// commits, through the one builder of such notifications (`fitorder_announce`).
pub fn announce(what: Announced, id: i64) -> diesel::dsl::select<fitorder_announce<&'static str, i64>> {
    diesel::select(fitorder_announce(what.as_str(), id))
}

/// The events of `payloads`, in their order: one query per kind of row named, on one connection.
async fn load(pool: &DbPool, payloads: &[String]) -> anyhow::Result<Vec<Event>> {
    use std::collections::HashMap;
    let named: Vec<(Announced, i64)> = payloads.iter().filter_map(|p| Announced::parse(p)).collect();
    let ids = |of: &[Announced]| -> Vec<i64> {
        let mut ids: Vec<i64> = named
            .iter()
            .filter(|(what, _)| of.contains(what))
            .map(|(_, id)| *id)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    };
    let transitions = ids(&[Announced::Transition]);
    let events = ids(&[Announced::Compensation]);
    let tickets = ids(&[Announced::Ticket, Announced::TicketChanged]);
    if named.is_empty() {
        return Ok(Vec::new());
    }
    let mut conn = pool.get().await?;
    let mut changes = HashMap::new();
    if !transitions.is_empty() {
        let rows: Vec<TransitionRow> = order_transitions::table
            .inner_join(orders::table)
            .filter(order_transitions::id.eq_any(&transitions))
            .select((
                order_transitions::id,
                orders::order_no,
                orders::store_id,
                orders::member_id,
                order_transitions::from_status,
                order_transitions::to_status,
                order_transitions::at,
                order_transitions::actor,
                order_transitions::trace_id,
            ))
            .load(&mut conn)
            .await?;
        for (id, order_no, store_id, member_id, from_status, to_status, at, actor, trace_id) in rows {
            let change = StatusChange {
                order_no,
                store_id,
                member_id,
                from_status,
                to_status,
                at,
                actor,
                trace_id,
            };
            changes.insert(id, Arc::new(change));
        }
    }
    let mut compensations = HashMap::new();
    if !events.is_empty() {
        let rows: Vec<(CompensationEvent, String, i64)> = compensation_events::table
            .inner_join(orders::table)
            .filter(compensation_events::id.eq_any(&events))
            .select((CompensationEvent::as_select(), orders::order_no, orders::store_id))
            .load(&mut conn)
            .await?;
        for (e, no, store) in rows {
            compensations.insert(e.id, (Arc::new(e), Arc::new(no), store));
        }
    }
    let mut ticket_rows = HashMap::new();
    if !tickets.is_empty() {
        let rows: Vec<ExceptionTicket> = exception_tickets::table
            .filter(exception_tickets::id.eq_any(&tickets))
            .select(ExceptionTicket::as_select())
            .load(&mut conn)
            .await?;
        for t in rows {
            ticket_rows.insert(t.id, Arc::new(t));
        }
    }
    drop(conn);
    Ok(named
        .into_iter()
        .filter_map(|(what, id)| match what {
            Announced::Transition => changes.get(&id).cloned().map(Event::Order),
            Announced::Compensation => compensations
                .get(&id)
                .map(|(e, no, store)| Event::Compensation(e.clone(), no.clone(), *store)),
            Announced::Ticket => ticket_rows.get(&id).cloned().map(Event::Ticket),
            Announced::TicketChanged => ticket_rows.get(&id).cloned().map(Event::TicketChanged),
        })
        .collect())
}

/// A statement waking the expiry timers of every instance when the transaction commits.
pub fn wake_expiry() -> diesel::dsl::select<pg_notify<&'static str, &'static str>> {
    diesel::select(pg_notify(EXPIRY_CHANNEL, ""))
}

/// How many ended sessions an instance remembers (a session's access tokens outlive its end by
/// at most the access token's lifetime; past this many ends within that time, a session the
/// cache does not hold is asked of the database).
pub const ENDED_SESSIONS_KEPT: usize = 100_000;

/// The ended member sessions whose access tokens may still be unexpired: a bounded cache fed by
/// the NOTIFY of every instance (and by this instance at once when it ends one), reloaded from
/// the database on every (re)connection of the LISTEN connection. Open WebSockets of a session
/// hear of its end through [`EndedSessions::watch`].
pub struct EndedSessions {
    inner: std::sync::Mutex<EndedInner>,
    /// How long an ended session matters: the access token lifetime (plus the leeway).
    window_secs: std::sync::atomic::AtomicI64,
    /// More ends within the window than `capacity`: a miss is not an answer.
    overflowed: std::sync::atomic::AtomicBool,
    capacity: usize,
    tx: broadcast::Sender<Arc<str>>,
    /// Set whenever the LISTEN connection (re)connects: ends may have been missed, so the next
    /// check loads them from the database first (an instance nobody asks never does).
    stale: std::sync::atomic::AtomicBool,
    reloading: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct EndedInner {
    ids: std::collections::HashMap<Arc<str>, i64>,
    order: std::collections::VecDeque<(i64, Arc<str>)>,
}

impl EndedSessions {
    pub fn new(capacity: usize) -> EndedSessions {
        let (tx, _) = broadcast::channel(256);
        EndedSessions {
            inner: Default::default(),
            window_secs: std::sync::atomic::AtomicI64::new(2 * 3600 + 60),
            overflowed: Default::default(),
            capacity: capacity.max(1),
            tx,
            stale: std::sync::atomic::AtomicBool::new(true),
            reloading: tokio::sync::Mutex::new(()),
        }
    }

    /// How long after its end a session's access tokens may still be presented.
    pub fn set_window(&self, access_token_ttl: Duration) {
        let secs = i64::try_from(access_token_ttl.as_secs()).unwrap_or(i64::MAX / 2) + 60;
        self.window_secs.store(secs, std::sync::atomic::Ordering::Relaxed);
    }

    fn window(&self) -> i64 {
        std::sync::atomic::AtomicI64::load(&self.window_secs, std::sync::atomic::Ordering::Relaxed)
    }

    /// Notes that `sid` ended (now) and tells the open WebSockets of it.
    pub fn insert(&self, sid: &str) {
        if sid.is_empty() || sid.len() > 64 {
            return;
        }
        let now = chrono::Utc::now().timestamp();
        let sid: Arc<str> = Arc::from(sid);
        self.remember(sid.clone(), now);
        let _ = self.tx.send(sid);
    }

    fn remember(&self, sid: Arc<str>, ended_at: i64) {
        let mut g = self.inner.lock().expect("ended sessions lock");
        if g.ids.contains_key(&sid) {
            return;
        }
        let horizon = chrono::Utc::now().timestamp() - self.window();
        while let Some((at, _)) = g.order.front() {
            if *at >= horizon && g.ids.len() < self.capacity {
                break;
            }
            let (at, old) = g.order.pop_front().expect("front exists");
            g.ids.remove(&old);
            if at >= horizon {
                // Dropped while its tokens may still be live: misses must ask the database.
                self.overflowed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        g.ids.insert(sid.clone(), ended_at);
        g.order.push_back((ended_at, sid));
    }

    /// Whether the cache says `sid` has ended; `None` when it cannot tell (it overflowed).
    pub fn cached(&self, sid: &str) -> Option<bool> {
        let hit = self.inner.lock().expect("ended sessions lock").ids.contains_key(sid);
        if hit {
            Some(true)
        } else if std::sync::atomic::AtomicBool::load(&self.overflowed, std::sync::atomic::Ordering::Relaxed) {
            None
        } else {
            Some(false)
        }
    }

    /// Ends may have been missed (the LISTEN connection (re)connected): the next check reloads,
    /// and open WebSockets are told to check again (an empty id).
    pub fn mark_stale(&self) {
        self.stale.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = self.tx.send(Arc::from(""));
    }

    /// Whether `sid` has ended: the cache (loaded from the database first when stale), and the
    /// database only when the cache overflowed.
    pub async fn has_ended(&self, pool: &DbPool, sid: &str) -> bool {
        if std::sync::atomic::AtomicBool::load(&self.stale, std::sync::atomic::Ordering::SeqCst) {
            let _one = self.reloading.lock().await;
            if std::sync::atomic::AtomicBool::load(&self.stale, std::sync::atomic::Ordering::SeqCst) {
                self.stale.store(false, std::sync::atomic::Ordering::SeqCst);
                if let Err(e) = self.reload(pool).await {
                    self.stale.store(true, std::sync::atomic::Ordering::SeqCst);
                    // A database that cannot answer cannot vouch for the session either.
                    tracing::warn!(error = %e, "ended sessions not loaded");
                    return true;
                }
            }
        }
        if let Some(known) = self.cached(sid) {
            return known;
        }
        let asked: anyhow::Result<bool> = async {
            let mut conn = pool.get().await?;
            let n: i64 = crate::db::sql::StaticQuery::new(
                "SELECT count(*) AS n FROM member_sessions WHERE id = $1 AND ended_at IS NOT NULL",
            )
            .bind::<diesel::sql_types::Text, _>(sid)
            .get_result::<Count>(&mut conn)
            .await?
            .n;
            Ok(n > 0)
        }
        .await;
        // A database that cannot answer cannot vouch for the session either.
        asked.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "ended session check failed");
            true
        })
    }

    /// Ends announced from now on (a receiver that lags must ask [`EndedSessions::has_ended`]).
    pub fn watch(&self) -> broadcast::Receiver<Arc<str>> {
        self.tx.subscribe()
    }

    /// Loads the sessions that ended within the window (on every LISTEN (re)connection).
    async fn reload(&self, pool: &DbPool) -> anyhow::Result<()> {
        #[derive(diesel::QueryableByName)]
        struct Ended {
            #[diesel(sql_type = diesel::sql_types::Text)]
            id: String,
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            at: i64,
        }
        let mut conn = pool.get().await?;
        let rows: Vec<Ended> = crate::db::sql::StaticQuery::new(
            "SELECT id, extract(epoch FROM ended_at)::bigint AS at FROM member_sessions \
             WHERE ended_at > now() - make_interval(secs => $1) ORDER BY ended_at DESC LIMIT $2",
        )
        .bind::<diesel::sql_types::Double, _>(self.window() as f64)
        .bind::<diesel::sql_types::BigInt, _>(self.capacity as i64 + 1)
        .load(&mut conn)
        .await?;
        let full = rows.len() > self.capacity;
        for r in rows.into_iter().take(self.capacity).rev() {
            self.remember(Arc::from(r.id.as_str()), r.at);
        }
        self.overflowed.store(full, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

#[cfg(test)]
mod ended_sessions_tests {
    use super::*;

    #[test]
    fn bounded_and_a_miss_after_overflow_is_no_answer() {
        let e = EndedSessions::new(3);
        e.stale.store(false, std::sync::atomic::Ordering::SeqCst);
        for sid in ["a", "b", "c"] {
            e.insert(sid);
        }
        assert_eq!(e.cached("a"), Some(true));
        assert_eq!(e.cached("zz"), Some(false));
        e.insert("d");
        assert_eq!(e.inner.lock().unwrap().ids.len(), 3);
        // "a" was dropped while its tokens may live: the cache no longer vouches for misses.
        assert_eq!(e.cached("a"), None);
        assert_eq!(e.cached("d"), Some(true));
    }

    #[test]
    fn an_end_reaches_the_watchers() {
        let e = EndedSessions::new(10);
        let mut rx = e.watch();
        e.insert("s1");
        assert_eq!(&*rx.try_recv().unwrap(), "s1");
    }
}
