//! GraphQL over HTTP and WebSocket.

use async_graphql::http::{WebSocket as GqlWebSocket, WebSocketProtocols, WsMessage};
use async_graphql::Data;
use async_graphql_axum::rejection::GraphQLRejection;
use async_graphql_axum::{GraphQLRequest, GraphQLResponse};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::{SinkExt, StreamExt};

use super::HttpState;
use crate::auth::{self, Viewer};
use crate::graphql::{DbLoader, RequestContext};
use crate::trace::TraceId;

/// Close code for a connection whose `connection_init` carried no valid token.
const CLOSE_FORBIDDEN: u16 = 4403;

async fn viewer_from(s: &HttpState, header: Option<&str>) -> Result<Option<Viewer>, String> {
    match header {
        None => Ok(None),
        Some(h) => auth::verify_bearer(&s.app.config.jwt_secret, s.app.oidc.as_deref(), h)
            .await
            .map(|(v, _)| Some(v))
            .map_err(|e| e.public_message()),
    }
}

pub async fn graphql(
    State(s): State<HttpState>,
    Extension(trace): Extension<TraceId>,
    peer: Option<Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    headers: HeaderMap,
    req: Result<GraphQLRequest, GraphQLRejection>,
) -> Response {
    let req = match req {
        Ok(r) => r,
        // (A body over the size limit or too slow never gets here: see `http::body`.)
        Err(e) => return super::rejection::graphql(e.0),
    };
    let header = headers.get("authorization").and_then(|v| v.to_str().ok());
    let viewer = match viewer_from(&s, header).await {
        Ok(v) => v,
        Err(msg) => return unauthenticated(msg),
    };
    if let Some(v) = &viewer {
        if let Err(e) = live_session(&s, v).await {
            return unauthenticated(e.public_message());
        }
    }
    let req = req.into_inner();
    // Without a token nothing but signing in and introspection can run (introspection only in
    // development mode or with FITORDER_PUBLIC_INTROSPECTION=1): refuse the rest before parsing.
    if viewer.is_none() && !might_be_sign_in(&s, &req) {
        let introspection = might_be_introspection(&req.query);
        let anonymous_introspection = s.app.config.dev_mode || s.app.config.public_introspection;
        if !introspection {
            return unauthenticated("a bearer token is required".into());
        }
        if !anonymous_introspection {
            return unauthenticated(
                "introspection needs a bearer token outside development mode (FITORDER_PUBLIC_INTROSPECTION=1 allows it)"
                    .into(),
            );
        }
    }
    let client_addr = peer.as_ref().and_then(|Extension(axum::extract::ConnectInfo(p))| {
        super::client_addr::client_addr(*p, &headers, &s.app.config.trusted_proxies)
    });
    let request = req
        .data(RequestContext {
            viewer,
            trace,
            client_ip: client_addr.map(|ip| ip.to_string()),
            payer_ip: payer_ip(peer.as_ref().map(|c| c.0 .0), &headers, &s.app.config.trusted_proxies),
            client_addr,
        })
        .data(DbLoader::new(s.app.pool.clone()));
    let response = if might_be_introspection(&request.query)
        && crate::graphql::is_introspection_only(
            &request.query,
            &crate::graphql::limits::DocumentLimits::from_config(&s.app.config),
        ) {
        s.introspection.execute(request).await
    } else {
        s.schema.execute(request).await
    };
    let retry_after = retry_after(&response);
    let mut resp = GraphQLResponse::from(response).into_response();
    if let Some(secs) = retry_after {
        resp.headers_mut().insert(axum::http::header::RETRY_AFTER, secs.into());
    }
    resp
}

/// A token of a session that has ended (signed out, refresh token reused) is refused.
async fn live_session(s: &HttpState, v: &Viewer) -> crate::error::AppResult<()> {
    let ended = match v.session.as_deref() {
        Some(sid) => s.app.events.ended_sessions.has_ended(&s.app.pool, sid).await,
        None => false,
    };
    auth::refuse_ended_session(v, |_| ended)
}

/// Whether an anonymous request runs only the sign-in mutations (parsed under the bounds).
fn might_be_sign_in(s: &HttpState, req: &async_graphql::Request) -> bool {
    let query = &req.query;
    crate::graphql::ANONYMOUS_MUTATIONS.iter().any(|m| query.contains(m))
        && crate::graphql::is_sign_in_only(
            query,
            req.operation_name.as_deref(),
            &crate::graphql::limits::DocumentLimits::from_config(&s.app.config),
        )
}

/// The longest `extensions.retryAfter` of a rate-limited answer: its `Retry-After` header.
fn retry_after(response: &async_graphql::Response) -> Option<u64> {
    response
        .errors
        .iter()
        .filter_map(|e| match e.extensions.as_ref()?.get("retryAfter")? {
            async_graphql::Value::Number(n) => n.as_u64(),
            _ => None,
        })
        .max()
}

fn unauthenticated(msg: String) -> Response {
    let mut err = async_graphql::ServerError::new(msg, None);
    let mut ext = async_graphql::ErrorExtensionValues::default();
    ext.set("code", "UNAUTHENTICATED");
    err.extensions = Some(ext);
    GraphQLResponse::from(async_graphql::Response::from_errors(vec![err])).into_response()
}

/// Whether an anonymous document may be introspection (GraphiQL asks for the schema before
/// a token is pasted). Anything else needs a token; the document bounds still apply.
fn might_be_introspection(query: &str) -> bool {
    query.len() <= 16 * 1024
        && (query.contains("__schema")
            || query
                .match_indices("__type")
                .any(|(i, _)| !query[i + 6..].starts_with("name")))
}

pub async fn subscriptions(
    State(s): State<HttpState>,
    Extension(trace): Extension<TraceId>,
    ws: WebSocketUpgrade,
) -> Response {
    // Subscribers mostly listen: small socket buffers keep a thousand of them cheap.
    ws.protocols(["graphql-transport-ws", "graphql-ws"])
        .read_buffer_size(4 * 1024)
        .write_buffer_size(4 * 1024)
        .max_message_size(256 * 1024)
        .on_upgrade(move |socket| serve_ws(s, socket, trace))
}

/// Close codes of graphql-transport-ws (also used on the legacy protocol).
const CLOSE_INIT_TIMEOUT: u16 = 4408;
const CLOSE_DUPLICATE_ID: u16 = 4409;

/// What the connection's guard knows: the ids of running operations, and why to close.
#[derive(Default)]
struct WsGuard {
    active: std::collections::HashSet<String>,
    close: Option<(u16, String)>,
    /// The token of `connection_init`: its running operations count against it.
    token: Option<super::ws_quota::TokenKey>,
}

#[derive(serde::Deserialize)]
struct Peek {
    #[serde(rename = "type")]
    kind: Option<String>,
    id: Option<String>,
}

/// `connection_init`'s token, as the guard counts it.
#[derive(serde::Deserialize)]
struct PeekInit {
    payload: Option<serde_json::Value>,
}

/// Gives the token's places back when the connection ends, however it ends.
struct Release {
    quota: std::sync::Arc<super::ws_quota::TokenOperations>,
    guard: std::sync::Arc<std::sync::Mutex<WsGuard>>,
}

impl Drop for Release {
    fn drop(&mut self) {
        let g = self.guard.lock().expect("ws guard");
        if let Some(key) = &g.token {
            self.quota.give_back(key, g.active.len());
        }
    }
}

async fn serve_ws(s: HttpState, socket: WebSocket, trace: TraceId) {
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    use std::sync::{Arc, Mutex};
    let legacy = matches!(socket.protocol().and_then(|p| p.to_str().ok()), Some("graphql-ws"));
    let protocol = if legacy {
        WebSocketProtocols::SubscriptionsTransportWS
    } else {
        WebSocketProtocols::GraphQLWS
    };
    let (mut sink, stream) = socket.split();
    let max_subscriptions = s.app.config.ws_max_subscriptions;
    let per_token = s.app.config.max_subscriptions_per_token;
    let guard = Arc::new(Mutex::new(WsGuard::default()));
    let quota = s.subscriptions.clone();
    let _release = Release {
        quota: quota.clone(),
        guard: guard.clone(),
    };
    let input_quota = quota.clone();
    let (inject_tx, mut inject_rx) = tokio::sync::mpsc::unbounded_channel::<Message>();
    let input_guard = guard.clone();
    let input = stream
        .take_while(|r| futures_util::future::ready(r.is_ok()))
        .filter_map(|r| {
            futures_util::future::ready(match r {
                Ok(Message::Text(t)) => Some(t.as_str().as_bytes().to_vec()),
                Ok(Message::Binary(b)) => Some(b.to_vec()),
                _ => None,
            })
        })
        // Every operation id is tracked: a reused id closes the connection (4409), one over the
        // per-connection cap is answered with an error and never started.
        .filter_map(move |bytes| {
            let pass = match serde_json::from_slice::<Peek>(&bytes) {
                Ok(Peek {
                    kind: Some(kind),
                    id: None,
                }) if kind == "connection_init" => {
                    let authorization = serde_json::from_slice::<PeekInit>(&bytes).ok().and_then(|p| {
                        let p = p.payload?;
                        let v = p.get("authorization").or_else(|| p.get("Authorization"))?;
                        v.as_str().map(super::ws_quota::token_key)
                    });
                    let mut g = input_guard.lock().expect("ws guard");
                    if g.token.is_none() {
                        g.token = authorization;
                    }
                    true
                }
                Ok(Peek {
                    kind: Some(kind),
                    id: Some(id),
                }) => {
                    let mut g = input_guard.lock().expect("ws guard");
                    let token = g.token;
                    match kind.as_str() {
                        "subscribe" | "start" if g.active.contains(&id) => {
                            g.close = Some((CLOSE_DUPLICATE_ID, format!("Subscriber for {id} already exists")));
                            let _ = inject_tx.send(Message::Close(None));
                            false
                        }
                        "subscribe" | "start" if g.active.len() >= max_subscriptions => {
                            let refusal = serde_json::json!({"type": "error", "id": id, "payload": [{
                                "message": format!("too many operations on this connection (limit {max_subscriptions})"),
                                "extensions": {"code": "BAD_USER_INPUT"}}]});
                            let _ = inject_tx.send(Message::Text(refusal.to_string().into()));
                            false
                        }
                        "subscribe" | "start" if token.is_some_and(|k| !input_quota.try_take(&k, per_token)) => {
                            let refusal = serde_json::json!({"type": "error", "id": id, "payload": [{
                                "message": format!("too many operations for this token (limit {per_token} over all its connections)"),
                                "extensions": {"code": "BAD_USER_INPUT"}}]});
                            let _ = inject_tx.send(Message::Text(refusal.to_string().into()));
                            false
                        }
                        "subscribe" | "start" => {
                            g.active.insert(id);
                            true
                        }
                        "complete" | "stop" => {
                            if g.active.remove(&id) {
                                if let Some(k) = &token {
                                    input_quota.give_back(k, 1);
                                }
                            }
                            true
                        }
                        _ => true,
                    }
                }
                _ => true,
            };
            futures_util::future::ready(pass.then_some(bytes))
        });
    let secret = s.app.config.jwt_secret.clone();
    let issuer = s.app.oidc.clone();
    let pool = s.app.pool.clone();
    // The session of the connection's token, once known: its end closes the connection.
    let session: Arc<Mutex<Option<String>>> = Arc::default();
    let session_of_init = session.clone();
    let mut ends = s.app.events.ended_sessions.watch();
    let ended_sessions = s.app.events.ended_sessions.clone();
    let check_pool = s.app.pool.clone();
    let refused = Arc::new(AtomicBool::new(false));
    let refused_flag = refused.clone();
    let expires = Arc::new(AtomicI64::new(i64::MAX));
    let expires_at = expires.clone();
    let on_init = move |payload: serde_json::Value| async move {
        let header = payload
            .get("authorization")
            .or_else(|| payload.get("Authorization"))
            .and_then(|v| v.as_str())
            .map(str::to_string);
        let checked = match header {
            Some(h) => Some(auth::verify_bearer(&secret, issuer.as_deref(), &h).await),
            None => None,
        };
        let verified = match checked {
            Some(Ok((viewer, exp))) => {
                let ended = match viewer.session.as_deref() {
                    Some(sid) => ended_sessions.has_ended(&check_pool, sid).await,
                    None => false,
                };
                auth::refuse_ended_session(&viewer, |_| ended).map(|()| (viewer, exp))
            }
            Some(Err(e)) => Err(e),
            None => Err(crate::error::AppError::Unauthenticated("no token".into())),
        };
        match verified {
            Ok((viewer, exp)) => {
                expires_at.store(exp, Ordering::SeqCst);
                *session_of_init.lock().expect("ws session") = viewer.session.clone();
                let mut data = Data::default();
                data.insert(RequestContext {
                    viewer: Some(viewer),
                    trace,
                    client_ip: None,
                    payer_ip: None,
                    client_addr: None,
                });
                data.insert(DbLoader::new(pool));
                Ok(data)
            }
            _ => {
                refused_flag.store(true, Ordering::SeqCst);
                Err(async_graphql::Error::new(
                    "Forbidden: a valid bearer token is required in connection_init",
                ))
            }
        }
    };
    let mut out = GqlWebSocket::new(s.schema.clone(), input, protocol).on_connection_init(on_init);
    // Until the ack: the connection_init deadline; after it: the token's expiry.
    let mut acked = false;
    let deadline = tokio::time::sleep(s.app.config.ws_init_timeout);
    tokio::pin!(deadline);
    let close = |code: u16, reason: String| {
        Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        }))
    };
    loop {
        let msg = tokio::select! {
            msg = out.next() => match msg {
                None => break,
                Some(WsMessage::Text(t)) => {
                    if t.starts_with(r#"{"type":"connection_ack""#) && !acked {
                        acked = true;
                        let exp = expires.load(Ordering::SeqCst);
                        let left = (exp - chrono::Utc::now().timestamp()).max(0) as u64;
                        deadline.as_mut().reset(tokio::time::Instant::now() + std::time::Duration::from_secs(left));
                    } else if t.starts_with(r#"{"type":"complete""#) {
                        if let Ok(Peek { id: Some(id), .. }) = serde_json::from_str::<Peek>(&t) {
                            let mut g = guard.lock().expect("ws guard");
                            if g.active.remove(&id) {
                                if let Some(k) = &g.token {
                                    quota.give_back(k, 1);
                                }
                            }
                        }
                    }
                    Message::Text(t.into())
                }
                Some(WsMessage::Close(code, reason)) => {
                    let code = if refused.load(Ordering::SeqCst) { CLOSE_FORBIDDEN } else { code };
                    close(code, reason)
                }
            },
            Some(injected) = inject_rx.recv() => match injected {
                Message::Close(_) => {
                    let (code, reason) = guard.lock().expect("ws guard").close.take().unwrap_or((1011, String::new()));
                    let _ = sink.send(close(code, reason)).await;
                    return;
                }
                other => other,
            },
            end = ends.recv() => {
                let mine = session.lock().expect("ws session").clone();
                let Some(mine) = mine else { continue };
                let ended = match end {
                    Ok(sid) => *sid == *mine,
                    // Missed some: ask.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        s.app.events.ended_sessions.has_ended(&s.app.pool, &mine).await
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => false,
                };
                if !ended {
                    continue;
                }
                let _ = sink.send(close(CLOSE_FORBIDDEN, "Forbidden: the session has ended".into())).await;
                return;
            }
            _ = &mut deadline => {
                let frame = if acked {
                    close(CLOSE_FORBIDDEN, "Forbidden: the token has expired".into())
                } else {
                    close(CLOSE_INIT_TIMEOUT, "Connection initialisation timeout".into())
                };
                let _ = sink.send(frame).await;
                return;
            }
        };
        if sink.send(msg).await.is_err() {
            return;
        }
    }
    // The legacy protocol reports the refusal as a message; close the socket with 4403 too.
    if refused.load(Ordering::SeqCst) {
        let _ = sink.send(close(CLOSE_FORBIDDEN, "Forbidden".into())).await;
    }
}

/// The caller's IP (see `client_addr`): None without a peer address (a request handed to the
/// router directly) or when a trusted proxy did not say who the caller is.
fn client_ip(
    peer: Option<std::net::SocketAddr>,
    headers: &axum::http::HeaderMap,
    trusted: &[ipnet::IpNet],
) -> Option<String> {
    super::client_addr::client_addr(peer?, headers, trusted).map(|ip| ip.to_string())
}

/// The caller's IP when a trusted proxy reported it (the payer's address for WeChat H5).
fn payer_ip(
    peer: Option<std::net::SocketAddr>,
    headers: &axum::http::HeaderMap,
    trusted: &[ipnet::IpNet],
) -> Option<String> {
    let peer = peer?;
    let proxied = trusted.iter().any(|net| net.contains(&peer.ip()))
        || match peer.ip() {
            std::net::IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .is_some_and(|v4| trusted.iter().any(|net| net.contains(&std::net::IpAddr::V4(v4)))),
            _ => false,
        };
    if !proxied {
        return None;
    }
    client_ip(Some(peer), headers, trusted)
}
