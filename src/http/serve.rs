//! The HTTP/1.1 server loop: axum's `serve` has no timeouts, so a client that sends its
//! headers a byte a minute (or opens connections and sends nothing) held a task and a socket
//! for ever. Here every connection has a header deadline (also the limit of an idle
//! keep-alive connection between requests); the router bounds the body (see `router`).

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;

/// Serves `router` on `listener` until `shutdown` resolves, then lets open requests finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    header_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: wait a little, keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let svc = WithPeer {
                    inner: TowerToHyperService::new(router.clone()),
                    peer,
                };
                let mut stop = stop_rx.clone();
                conns.spawn(async move {
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

/// The router, with the connection's peer address in every request's extensions (axum's
/// `ConnectInfo`, what `client_addr` starts from).
struct WithPeer {
    inner: TowerToHyperService<Router>,
    peer: std::net::SocketAddr,
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for WithPeer {
    type Response =
        <TowerToHyperService<Router> as hyper::service::Service<hyper::Request<hyper::body::Incoming>>>::Response;
    type Error = <TowerToHyperService<Router> as hyper::service::Service<hyper::Request<hyper::body::Incoming>>>::Error;
    type Future =
        <TowerToHyperService<Router> as hyper::service::Service<hyper::Request<hyper::body::Incoming>>>::Future;

    fn call(&self, mut req: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        req.extensions_mut().insert(axum::extract::ConnectInfo(self.peer));
        self.inner.call(req)
    }
}
