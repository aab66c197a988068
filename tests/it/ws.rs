//! A GraphQL-over-WebSocket client for tests, speaking `graphql-transport-ws` or the legacy
//! `graphql-ws` protocol.

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

pub type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub struct WsClient {
    socket: Socket,
    legacy: bool,
}

/// What the connection ended with, when it was refused.
#[derive(Debug)]
pub struct Closed {
    pub code: Option<u16>,
}

impl WsClient {
    pub async fn connect(addr: &str, token: Option<&str>, legacy: bool) -> Result<WsClient, Closed> {
        let mut req = format!("ws://{addr}/graphql/ws").into_client_request().unwrap();
        let proto = if legacy { "graphql-ws" } else { "graphql-transport-ws" };
        req.headers_mut()
            .insert("sec-websocket-protocol", proto.parse().unwrap());
        let (mut socket, _) = tokio_tungstenite::connect_async(req).await.expect("websocket upgrade");
        let payload = match token {
            Some(t) => json!({"authorization": format!("Bearer {t}")}),
            None => json!({}),
        };
        socket
            .send(Message::Text(
                json!({"type": "connection_init", "payload": payload})
                    .to_string()
                    .into(),
            ))
            .await
            .unwrap();
        loop {
            match tokio::time::timeout(std::time::Duration::from_secs(10), socket.next()).await {
                Ok(Some(Ok(Message::Text(t)))) => {
                    let v: Value = serde_json::from_str(&t).unwrap();
                    match v["type"].as_str() {
                        Some("connection_ack") => return Ok(WsClient { socket, legacy }),
                        Some("ka") | Some("ping") => continue,
                        _ => continue,
                    }
                }
                Ok(Some(Ok(Message::Close(frame)))) => {
                    return Err(Closed {
                        code: frame.map(|f| u16::from(f.code)),
                    })
                }
                Ok(Some(Ok(_))) => continue,
                other => panic!("no answer to connection_init: {other:?}"),
            }
        }
    }

    pub async fn subscribe(&mut self, id: &str, query: &str, op: Option<&str>, variables: Value) {
        let kind = if self.legacy { "start" } else { "subscribe" };
        let msg =
            json!({"id": id, "type": kind, "payload": {"query": query, "operationName": op, "variables": variables}});
        self.socket.send(Message::Text(msg.to_string().into())).await.unwrap();
    }

    /// The next `data` payload of any subscription (errors included), or None after `secs`.
    pub async fn next_payload(&mut self, secs: u64) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, self.socket.next()).await {
                Ok(Some(Ok(Message::Text(t)))) => {
                    let v: Value = serde_json::from_str(&t).unwrap();
                    match v["type"].as_str() {
                        Some("next") | Some("data") => return Some(v["payload"].clone()),
                        Some("error") => return Some(json!({"errors": v["payload"]})),
                        Some("ping") => {
                            let pong = json!({"type": "pong"}).to_string();
                            self.socket.send(Message::Text(pong.into())).await.unwrap();
                        }
                        _ => {}
                    }
                }
                Ok(Some(Ok(_))) => {}
                _ => return None,
            }
        }
    }
}

impl WsClient {
    /// Sends any protocol message as it is.
    pub async fn send_raw(&mut self, v: Value) {
        self.socket.send(Message::Text(v.to_string().into())).await.unwrap();
    }

    /// Reads until the server closes the connection; its close code (None: no close frame
    /// within `secs`, or the socket dropped without one). Messages before are collected.
    pub async fn close_code(&mut self, secs: u64) -> (Option<u16>, Vec<Value>) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
        let mut seen = vec![];
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, self.socket.next()).await {
                Ok(Some(Ok(Message::Text(t)))) => seen.push(serde_json::from_str(&t).unwrap()),
                Ok(Some(Ok(Message::Close(frame)))) => return (frame.map(|f| u16::from(f.code)), seen),
                Ok(Some(Ok(_))) => {}
                _ => return (None, seen),
            }
        }
    }

    /// The next message of any type, or None after `secs`.
    pub async fn next_message(&mut self, secs: u64) -> Option<Value> {
        match tokio::time::timeout(std::time::Duration::from_secs(secs), self.socket.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => Some(serde_json::from_str(&t).unwrap()),
            _ => None,
        }
    }
}

/// A WebSocket upgraded with `graphql-transport-ws` that has sent nothing yet.
pub async fn connect_silent(addr: &str) -> Socket {
    let mut req = format!("ws://{addr}/graphql/ws").into_client_request().unwrap();
    req.headers_mut()
        .insert("sec-websocket-protocol", "graphql-transport-ws".parse().unwrap());
    tokio_tungstenite::connect_async(req)
        .await
        .expect("websocket upgrade")
        .0
}
