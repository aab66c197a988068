//! GraphQL over HTTP and WebSocket.

use async_graphql::http::{GraphiQLSource, WebSocket as GqlWebSocket, WebSocketProtocols, WsMessage};
use async_graphql::Data;
use async_graphql_axum::rejection::GraphQLRejection;
use async_graphql_axum::{GraphQLRequest, GraphQLResponse};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::Extension;
use futures_util::{SinkExt, StreamExt};

use super::HttpState;
use crate::auth::{self, Viewer};
use crate::graphql::{DbLoader, RequestContext};
use crate::trace::TraceId;

/// Close code for a connection whose `connection_init` carried no valid token.
const CLOSE_FORBIDDEN: u16 = 4403;

fn viewer_from(secret: &str, header: Option<&str>) -> Result<Option<Viewer>, String> {
    match header {
        None => Ok(None),
        Some(h) => auth::verify(secret, h).map(Some).map_err(|e| e.message()),
    }
}

pub async fn graphql(
    State(s): State<HttpState>,
    Extension(trace): Extension<TraceId>,
    headers: HeaderMap,
    req: Result<GraphQLRequest, GraphQLRejection>,
) -> Response {
    let req = match req {
        Ok(r) => r,
        // A body cut off by the size limit is "too large", not "malformed".
        Err(e) if format!("{:?}", e.0).to_lowercase().contains("length limit") => {
            return (StatusCode::PAYLOAD_TOO_LARGE, "request body too large").into_response();
        }
        Err(e) => return e.into_response(),
    };
    let header = headers.get("authorization").and_then(|v| v.to_str().ok());
    let viewer = match viewer_from(&s.app.config.jwt_secret, header) {
        Ok(v) => v,
        Err(msg) => {
            let err = async_graphql::ServerError::new(msg, None);
            let mut err = err;
            let mut ext = async_graphql::ErrorExtensionValues::default();
            ext.set("code", "UNAUTHENTICATED");
            err.extensions = Some(ext);
            let resp = async_graphql::Response::from_errors(vec![err]);
            return GraphQLResponse::from(resp).into_response();
        }
    };
    let request = req
        .into_inner()
        .data(RequestContext {
            viewer,
            trace,
            client_ip: client_ip(&headers),
        })
        .data(DbLoader::new(s.app.pool.clone()));
    GraphQLResponse::from(s.schema.execute(request).await).into_response()
}

/// GraphiQL, wired to the WebSocket endpoint, with a header editor preset for a token.
pub async fn graphiql() -> Html<String> {
    Html(
        GraphiQLSource::build()
            .endpoint("/graphql")
            .subscription_endpoint("/graphql/ws")
            .header("Authorization", "Bearer <paste a token from `fitorder token`>")
            .title("fitorder GraphiQL")
            .finish(),
    )
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

async fn serve_ws(s: HttpState, socket: WebSocket, trace: TraceId) {
    let protocol = match socket.protocol().and_then(|p| p.to_str().ok()) {
        Some("graphql-ws") => WebSocketProtocols::SubscriptionsTransportWS,
        _ => WebSocketProtocols::GraphQLWS,
    };
    let (mut sink, stream) = socket.split();
    let input = stream
        .take_while(|r| futures_util::future::ready(r.is_ok()))
        .filter_map(|r| {
            futures_util::future::ready(match r {
                Ok(Message::Text(t)) => Some(t.as_str().as_bytes().to_vec()),
                Ok(Message::Binary(b)) => Some(b.to_vec()),
                _ => None,
            })
        });
    let secret = s.app.config.jwt_secret.clone();
    let pool = s.app.pool.clone();
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let refused_flag = refused.clone();
    let on_init = move |payload: serde_json::Value| async move {
        let header = payload
            .get("authorization")
            .or_else(|| payload.get("Authorization"))
            .and_then(|v| v.as_str())
            .map(str::to_string);
        match header.map(|h| auth::verify(&secret, &h)) {
            Some(Ok(viewer)) => {
                let mut data = Data::default();
                data.insert(RequestContext {
                    viewer: Some(viewer),
                    trace,
                    client_ip: None,
                });
                data.insert(DbLoader::new(pool));
                Ok(data)
            }
            _ => {
                refused_flag.store(true, std::sync::atomic::Ordering::SeqCst);
                Err(async_graphql::Error::new(
                    "Forbidden: a valid bearer token is required in connection_init",
                ))
            }
        }
    };
    let mut out = GqlWebSocket::new(s.schema.clone(), input, protocol).on_connection_init(on_init);
    while let Some(msg) = out.next().await {
        let msg = match msg {
            WsMessage::Text(t) => Message::Text(t.into()),
            WsMessage::Close(code, reason) => {
                let code = if refused.load(std::sync::atomic::Ordering::SeqCst) {
                    CLOSE_FORBIDDEN
                } else {
                    code
                };
                Message::Close(Some(CloseFrame {
                    code,
                    reason: reason.into(),
                }))
            }
        };
        if sink.send(msg).await.is_err() {
            return;
        }
    }
    // The legacy protocol reports the refusal as a message; close the socket with 4403 too.
    if refused.load(std::sync::atomic::Ordering::SeqCst) {
        let _ = sink
            .send(Message::Close(Some(CloseFrame {
                code: CLOSE_FORBIDDEN,
                reason: "Forbidden".into(),
            })))
            .await;
    }
}

/// The caller's IP as a load balancer in front reports it (the first `X-Forwarded-For` hop,
/// or `X-Real-IP`); only a well-formed address is taken.
fn client_ip(headers: &axum::http::HeaderMap) -> Option<String> {
    let forwarded = headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next());
    let real = headers.get("x-real-ip").and_then(|v| v.to_str().ok());
    forwarded
        .or(real)
        .and_then(|ip| ip.trim().parse::<std::net::IpAddr>().ok())
        .map(|ip| ip.to_string())
}
