//! The HTTP/1.1 server loop: axum's `serve` has no timeouts, so a client that sends its
//! headers a byte a minute (or opens connections and sends nothing) held a task and a socket
//! for ever. Here every connection has a header deadline (also the limit of an idle
//! keep-alive connection between requests); the router bounds the body (see `router`).
//! Connections are capped in all and per peer address: one over is answered 503 and closed at
//! once, so a client holding thousands of slow connections cannot take every socket.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;

/// What one listener allows (`FITORDER_HTTP_HEADER_TIMEOUT`, `FITORDER_MAX_CONNECTIONS`,
/// `FITORDER_MAX_CONNECTIONS_PER_ADDR`).
#[derive(Clone, Debug)]
pub struct ServeLimits {
    pub header_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_addr: usize,
    /// Peers the per-address cap does not apply to: the load balancers of
    /// `FITORDER_TRUSTED_PROXIES` (every client behind one shares its address). The total cap
    /// still does.
    pub trusted_proxies: Vec<ipnet::IpNet>,
}

impl ServeLimits {
    pub fn from_config(config: &crate::config::Config) -> ServeLimits {
        ServeLimits {
            header_timeout: config.http_header_timeout,
            max_connections: config.max_connections,
            max_connections_per_addr: config.max_connections_per_addr,
            trusted_proxies: config.trusted_proxies.clone(),
        }
    }
}

/// Open connections, in all and per peer address; a [`Slot`] gives its place back when dropped.
#[derive(Default)]
struct Open {
    total: usize,
    by_addr: HashMap<IpAddr, usize>,
}

struct Slot {
    open: Arc<Mutex<Open>>,
    addr: IpAddr,
}

impl Slot {
    /// A place for a connection from `addr`, or None when either cap is reached.
    fn take(open: &Arc<Mutex<Open>>, addr: IpAddr, limits: &ServeLimits) -> Option<Slot> {
        let mut o = open.lock().expect("connection counts");
        let here = o.by_addr.get(&addr).copied().unwrap_or(0);
        let proxy = limits.trusted_proxies.iter().any(|net| net.contains(&addr));
        if o.total >= limits.max_connections || (here >= limits.max_connections_per_addr && !proxy) {
            return None;
        }
        o.total += 1;
        o.by_addr.insert(addr, here + 1);
        Some(Slot {
            open: open.clone(),
            addr,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut o = self.open.lock().expect("connection counts");
        o.total = o.total.saturating_sub(1);
        if let Some(n) = o.by_addr.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                o.by_addr.remove(&self.addr);
            }
        }
    }
}

/// What a connection over the cap reads before it is closed.
const OVER_CAPACITY: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\nretry-after: 1\r\n\r\n";

/// Serves `router` on `listener` until `shutdown` resolves, then lets open requests finish
/// (the connection caps at their defaults).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    header_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let limits = ServeLimits {
        header_timeout,
        max_connections: crate::config::DEFAULT_MAX_CONNECTIONS,
        max_connections_per_addr: crate::config::DEFAULT_MAX_CONNECTIONS_PER_ADDR,
        trusted_proxies: vec![],
    };
    serve_with(listener, router, limits, shutdown).await
}

/// [`serve`] with every limit given.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let header_timeout = limits.header_timeout;
    let open = Arc::new(Mutex::new(Open::default()));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, slot, peer) = match accepted {
                    Ok((stream, peer)) => match Slot::take(&open, peer.ip(), &limits) {
                        Some(slot) => (stream, slot, peer),
                        None => {
                            // Best effort, never waiting: the socket is closed right after.
                            let _ = stream.try_write(OVER_CAPACITY);
                            tracing::debug!(peer = %peer.ip(), "connection refused: over the connection cap");
                            continue;
                        }
                    },
                    Err(e) => {
                        // Out of file descriptors and the like: wait a little, keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                // The peer's address, for `client_addr` (handlers read `ConnectInfo`).
                let svc = TowerToHyperService::new(tower_http::add_extension::AddExtension::new(
                    router.clone(),
                    axum::extract::ConnectInfo(peer),
                ));
                let mut stop = stop_rx.clone();
                conns.spawn(async move {
                    let _slot = slot;
                    let mut builder = hyper::server::conn::http1::Builder::new();
                    builder.timer(TokioTimer::new()).header_read_timeout(header_timeout);
                    let conn = builder.serve_connection(TokioIo::new(stream), svc).with_upgrades();
                    tokio::pin!(conn);
                    tokio::select! {
                        _ = conn.as_mut() => {}
                        _ = stop.changed() => {
                            conn.as_mut().graceful_shutdown();
                            let _ = conn.await;
                        }
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    let _ = stop_tx.send(true);
    while conns.join_next().await.is_some() {}
    Ok(())
}
