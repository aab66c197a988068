//! GraphQL over HTTP and WebSocket.

use crate::config::ExposeSecret;
use async_graphql::http::{WebSocket as GqlWebSocket, WebSocketProtocols, WsMessage};
use async_graphql::parser::types::OperationType;
use async_graphql::{Data, ServerError};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::{SinkExt, StreamExt};

use super::graphql_over_http::{self as over_http, BadRequest, Media, Params};
use super::persisted::{Found, Refusal};
use super::HttpState;
use crate::auth::{self, Viewer};
use crate::graphql::limits::Sender;
use crate::graphql::{DbLoader, ExecutionStarted, Reads, RequestContext};
use crate::trace::TraceId;

/// Close code for a connection whose `connection_init` carried no valid token.
const CLOSE_FORBIDDEN: u16 = 4403;

async fn viewer_from(s: &HttpState, header: Option<&str>) -> Result<Option<Viewer>, String> {
    match header {
        None => Ok(None),
        Some(h) => auth::verify_bearer(s.app.config.jwt_secret.expose_secret(), s.app.oidc.as_deref(), h)
            .await
            .map(|(v, _)| Some(v))
            .map_err(|e| e.public_message()),
    }
}

/// The largest body of a request without a token.
pub const ANONYMOUS_BODY_BYTES: usize = 32 * 1024;

/// The connection's peer address (`ConnectInfo`, put in by `http::serve`).
type Peer = Option<Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>;

/// `POST /graphql`: one JSON request (`application/json`; a batch is refused).
pub async fn graphql(
    State(s): State<HttpState>,
    Extension(trace): Extension<TraceId>,
    peer: Peer,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let media = over_http::negotiate(&headers);
    let body = match body {
        Ok(b) => b,
        // A body cut off by the size limit is "too large", not "malformed".
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return (StatusCode::PAYLOAD_TOO_LARGE, "request body too large").into_response();
        }
        Err(_) => return over_http::bad_request(media, BadRequest::new("the request body could not be read")),
    };
    // A caller without a token sends a sign-in (a few hundred bytes) or, where allowed,
    // introspection: a larger body is refused before its JSON is read.
    if headers.get(header::AUTHORIZATION).is_none() && body.len() > ANONYMOUS_BODY_BYTES {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large for a request without a token",
        )
            .into_response();
    }
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return over_http::bad_request(
            media,
            BadRequest {
                status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
                message: "POST /graphql takes Content-Type: application/json".into(),
            },
        );
    }
    match Params::from_json(&body) {
        Ok(params) => run(&s, trace, peer, &headers, media, params, false).await,
        Err(bad) => over_http::bad_request(media, bad),
    }
}

/// `GET /graphql`: GraphiQL for a browser, otherwise a query from the URL's parameters.
pub async fn graphql_get(
    State(s): State<HttpState>,
    Extension(trace): Extension<TraceId>,
    peer: Peer,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let asks_graphql = raw
        .as_deref()
        .is_some_and(|q| form_urlencoded::parse(q.as_bytes()).any(|(k, _)| k == "query" || k == "extensions"));
    let names_json = headers
        .get_all(header::ACCEPT)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.contains("json")));
    if over_http::prefers_html(&headers) || (!asks_graphql && !names_json) {
        return super::graphiql::page(headers).await;
    }
    let media = over_http::negotiate(&headers);
    match Params::from_url(raw.as_deref()) {
        Ok(params) => run(&s, trace, peer, &headers, media, params, true).await,
        Err(bad) => over_http::bad_request(media, bad),
    }
}

/// A request's document as it may run.
pub struct Admitted {
    pub doc: std::sync::Arc<super::persisted::Document>,
    /// Parsed from its text for this request: kept by hash once it validated.
    pub fresh: bool,
    /// Only introspection: answered by the schema that allows its depth.
    pub introspection: bool,
    pub kind: OperationType,
    /// A query or mutation, bounded here and run on the schema without extensions.
    pub lean: bool,
    pub variables: async_graphql::Variables,
    pub operation_name: Option<String>,
}

/// From a request's parameters to a document that may run, or the answer that refuses it:
/// the gate for callers without a token, the trusted documents, the bounds on the text (before
/// it is parsed), parsing once, the operation and its variables. Nothing here reads the
/// database or runs a resolver (the fuzz target `graphql_request` goes through all of it).
// The refusal is the answer itself, made once for a request that goes no further.
#[allow(clippy::result_large_err)]
pub fn admit_request(
    documents: &super::persisted::PersistedDocuments,
    config: &crate::config::Config,
    viewer: Option<&Viewer>,
    media: Media,
    params: Params,
    via_get: bool,
) -> Result<Admitted, Response> {
    let Params {
        query,
        variables,
        operation_name,
        extensions,
    } = params;
    let found = match documents.find(query, extensions.get("persistedQuery")) {
        Ok(found) => found,
        Err(refusal) => return Err(persisted_refusal(media, refusal)),
    };
    let (text, trusted) = match &found {
        Found::Parsed(doc) => (&*doc.text, doc.trusted),
        Found::Text { text, .. } => (text.as_str(), false),
    };
    // Without a token nothing but signing in and introspection can run (introspection only in
    // development mode or with FITORDER_PUBLIC_INTROSPECTION=1): the rest is refused before
    // anything looks further than the text's words.
    let anonymous_introspection = config.dev_mode || config.public_introspection;
    if viewer.is_none() && !crate::graphql::ANONYMOUS_MUTATIONS.iter().any(|m| text.contains(m)) {
        if !might_be_introspection(text) {
            return Err(unauthenticated(media, "a bearer token is required".into()));
        }
        if !anonymous_introspection {
            return Err(unauthenticated(
                media,
                "introspection needs a bearer token outside development mode (FITORDER_PUBLIC_INTROSPECTION=1 allows it)"
                    .into(),
            ));
        }
    }
    // A member app (in `all` mode, every caller) runs only what its build registered, refused
    // before it is measured, parsed or kept; GraphiQL still gets the schema in `member` mode.
    let may_introspect = viewer.is_none() && anonymous_introspection && might_be_introspection(text);
    if !trusted && documents.binds(viewer) && !may_introspect {
        return Err(over_http::not_run(
            media,
            Some(StatusCode::FORBIDDEN),
            vec![over_http::error(
                "this document is not in the trusted documents manifest: only documents the app's build registered may run",
                "FORBIDDEN",
                vec![],
            )],
        ));
    }
    // Measured (bytes, tokens, nesting: by who sends it) before it is parsed, parsed once, and
    // kept by hash only once it validated (below).
    let limits = crate::graphql::limits::DocumentLimits::from_config(config);
    let sender = Sender::of(viewer);
    let (doc, fresh) = match found {
        Found::Parsed(doc) => {
            if let Err(e) = crate::graphql::limits::check_shape(doc.shape, &limits, sender) {
                return Err(over_http::not_run(media, None, vec![e]));
            }
            (doc, false)
        }
        Found::Text { text, hash } => {
            let shape = match crate::graphql::limits::measure(&text, &limits, sender) {
                Ok(shape) => shape,
                Err(e) => return Err(over_http::not_run(media, None, vec![e])),
            };
            match async_graphql::parser::parse_query(&text) {
                Ok(parsed) => (documents.parsed(hash, text, parsed, shape), true),
                Err(e) => return Err(over_http::not_run(media, None, vec![syntax_error(&e)])),
            }
        }
    };
    let introspection = might_be_introspection(&doc.text) && crate::graphql::is_introspection_only(&doc.parsed);
    if viewer.is_none()
        && !crate::graphql::is_sign_in_only(&doc.parsed, operation_name.as_deref())
        && !(introspection && anonymous_introspection)
    {
        return Err(unauthenticated(media, "a bearer token is required".into()));
    }
    let Some(op) = crate::graphql::operation(&doc.parsed, operation_name.as_deref()) else {
        let message = match &operation_name {
            Some(name) => format!("the document has no operation named {name:?}"),
            None => "the document has several operations: name one with operationName".to_string(),
        };
        return Err(over_http::not_run(
            media,
            None,
            vec![over_http::error(message, "BAD_USER_INPUT", vec![])],
        ));
    };
    let (kind, variable_definitions) = (op.ty, &op.variable_definitions);
    if via_get && kind != OperationType::Query {
        let mut resp = over_http::not_run(
            media,
            Some(StatusCode::METHOD_NOT_ALLOWED),
            vec![over_http::error(
                format!("a {kind} cannot be sent with GET: use POST"),
                "BAD_USER_INPUT",
                vec![],
            )],
        );
        resp.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
        return Err(resp);
    }
    // Variables that do not coerce are a request error; async-graphql checks the values it is
    // given as it validates, a required variable left out is checked here.
    let missing: Vec<ServerError> = variable_definitions
        .iter()
        .filter(|v| {
            !v.node.var_type.node.nullable
                && v.node.default_value.is_none()
                && variables.get(v.node.name.node.as_str()).is_none_or(|x| x.is_null())
        })
        .map(|v| {
            over_http::error(
                format!(
                    "variable ${} of type {} was not provided a value",
                    v.node.name.node, v.node.var_type.node
                ),
                "BAD_USER_INPUT",
                vec![v.pos],
            )
        })
        .collect();
    if !missing.is_empty() {
        return Err(over_http::not_run(media, None, missing));
    }

    // Queries and mutations run on the schema without extensions, bounded here instead (the
    // document is parsed already); introspection and subscriptions on the one with them.
    let lean = !introspection && kind != OperationType::Subscription;
    let variables = async_graphql::Variables::from_json(serde_json::Value::Object(variables));
    if lean {
        let bounds = crate::graphql::document_limits(config);
        if let Err(e) = crate::graphql::check_bounded(&doc.text, &doc.parsed, &variables, &bounds) {
            return Err(over_http::not_run(media, None, vec![e]));
        }
    }
    Ok(Admitted {
        fresh,
        introspection,
        kind,
        lean,
        variables,
        operation_name,
        doc,
    })
}

/// One request, from its parameters to its answer.
async fn run(
    s: &HttpState,
    trace: TraceId,
    peer: Peer,
    headers: &HeaderMap,
    media: Media,
    params: Params,
    via_get: bool,
) -> Response {
    let peer = peer.map(|Extension(axum::extract::ConnectInfo(p))| p);
    let header = headers.get("authorization").and_then(|v| v.to_str().ok());
    let viewer = match viewer_from(s, header).await {
        Ok(v) => v,
        Err(msg) => return unauthenticated(media, msg),
    };
    if let Some(v) = &viewer {
        if let Err(e) = live_session(s, v).await {
            return unauthenticated(media, e.public_message());
        }
    }
    let Admitted {
        doc,
        fresh,
        introspection,
        kind,
        lean,
        variables,
        operation_name,
    } = match admit_request(&s.documents, &s.app.config, viewer.as_ref(), media, params, via_get) {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let op = crate::graphql::operation(&doc.parsed, operation_name.as_deref()).expect("admitted with its operation");
    let trace_id = trace.as_str().to_string();
    let client_addr = peer.and_then(|p| super::client_addr::client_addr(p, headers, &s.app.config.trusted_proxies));
    let started = ExecutionStarted::default();
    // Where this request reads: the replica for staff lists and statistics, else the primary.
    let reads = std::sync::Arc::new(Reads::for_operation(&s.app, viewer.as_ref(), op));
    // A staff mutation is remembered for read-your-writes (the lean schema has no extension).
    let writer = viewer.clone().filter(|_| lean && kind == OperationType::Mutation);
    let mut request = async_graphql::Request::new(doc.text.to_string())
        .variables(variables)
        .data(RequestContext {
            viewer,
            trace,
            // The payer's address for WeChat H5 only as a trusted proxy reported it.
            payer_ip: peer
                .filter(|p| super::client_addr::from_trusted_proxy(*p, &s.app.config.trusted_proxies))
                .and(client_addr)
                .map(|ip| ip.to_string()),
            client_addr,
        })
        .data(DbLoader::reading(reads.clone()))
        .data(reads)
        .data(started.clone());
    if let Some(name) = operation_name {
        request = request.operation_name(name);
    }
    // Parsed once per document: a hash (or the same text) again reuses the tree.
    request.set_parsed_query(doc.parsed.clone());
    let (response, started) = if introspection {
        (s.introspection.execute(request).await, started.started())
    } else if lean {
        let answered = crate::graphql::finish_bounded(s.http_schema.execute(request).await, &trace_id);
        if let (Some(v), true) = (&writer, answered.1) {
            crate::graphql::reads::record_staff_write(&s.app, v).await;
        }
        answered
    } else {
        (s.schema.execute(request).await, started.started())
    };
    if !started && response.is_err() {
        return over_http::not_run(media, None, response.errors);
    }
    // It validated (it ran): kept by hash for the next request of the same text or hash.
    if fresh {
        s.documents.keep(&doc);
    }
    let mut resp = over_http::executed(media, &response);
    if let Some(secs) = retry_after(&response) {
        resp.headers_mut().insert(header::RETRY_AFTER, secs.into());
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

/// A document that does not parse: where, and what was expected, never the document's text.
fn syntax_error(e: &async_graphql::parser::Error) -> ServerError {
    let locations: Vec<_> = e.positions().collect();
    let message = match e {
        // pest's message quotes the line of the document; its last line says what was expected.
        async_graphql::parser::Error::Syntax { message, .. } => {
            let expected = message
                .lines()
                .last()
                .and_then(|l| l.trim().strip_prefix("= "))
                .filter(|l| l.len() <= 200 && !l.contains('\n'));
            match expected {
                Some(what) => format!("syntax error: {what}"),
                None => "syntax error".to_string(),
            }
        }
        other => other.to_string(),
    };
    over_http::error(message, "BAD_USER_INPUT", locations)
}

fn persisted_refusal(media: Media, refusal: Refusal) -> Response {
    let err = match refusal {
        // As Apollo's clients look for it: the message and the code.
        Refusal::NotFound => over_http::error("PersistedQueryNotFound", "PERSISTED_QUERY_NOT_FOUND", vec![]),
        Refusal::Mismatch => over_http::error("provided sha does not match query", "BAD_USER_INPUT", vec![]),
        Refusal::Malformed(why) => over_http::error(why, "BAD_USER_INPUT", vec![]),
        Refusal::Missing => over_http::error("the request has no \"query\"", "BAD_USER_INPUT", vec![]),
    };
    over_http::not_run(media, None, vec![err])
}

fn unauthenticated(media: Media, msg: String) -> Response {
    let err = over_http::error(msg, "UNAUTHENTICATED", vec![]);
    let status = match media {
        Media::Json => None,
        Media::GraphqlResponse => Some(StatusCode::UNAUTHORIZED),
    };
    over_http::not_run(media, status, vec![err])
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
    // Whether the trusted documents bind this connection: until its token says otherwise, as
    // they bind a caller without one.
    let bound = Arc::new(AtomicBool::new(s.documents.binds(None)));
    let (bound_input, bound_init) = (bound.clone(), bound.clone());
    let documents = s.documents.clone();
    let init_documents = s.documents.clone();
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
        .filter_map(move |mut bytes| {
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
                    // Under the trusted documents a subscription runs only a manifest document
                    // (named by its text, or by its id alone: then the text is put in).
                    let mut admitted = true;
                    if matches!(kind.as_str(), "subscribe" | "start") && bound_input.load(Ordering::SeqCst) {
                        match admit(&documents, &bytes) {
                            Some(Some(rewritten)) => bytes = rewritten,
                            Some(None) => {}
                            None => admitted = false,
                        }
                    }
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
                        "subscribe" | "start" if !admitted => {
                            let refusal = serde_json::json!({"type": "error", "id": id, "payload": [{
                                "message": "this document is not in the trusted documents manifest: only documents the app's build registered may run",
                                "extensions": {"code": "FORBIDDEN"}}]});
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
            Some(h) => Some(auth::verify_bearer(secret.expose_secret(), issuer.as_deref(), &h).await),
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
                bound_init.store(init_documents.binds(Some(&viewer)), Ordering::SeqCst);
                *session_of_init.lock().expect("ws session") = viewer.session.clone();
                let mut data = Data::default();
                data.insert(RequestContext {
                    viewer: Some(viewer),
                    trace,
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
                    // Ends may have been missed: ask.
                    Ok(sid) if sid.is_empty() => s.app.events.ended_sessions.has_ended(&s.app.pool, &mine).await,
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

/// A `subscribe` message as the trusted documents let it through: `Some(None)` as it came,
/// `Some(Some(message))` with the manifest's document put in for the id it named, `None` when
/// its document is not in the manifest.
fn admit(documents: &super::persisted::PersistedDocuments, bytes: &[u8]) -> Option<Option<Vec<u8>>> {
    let mut msg: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let payload = msg.get_mut("payload")?;
    let query = payload.get("query").and_then(|q| q.as_str());
    let named_only = query.is_none();
    let persisted = payload.get("extensions").and_then(|e| e.get("persistedQuery"));
    let text = documents.trusted_text(query, persisted)?;
    if !named_only {
        return Some(None);
    }
    payload["query"] = serde_json::Value::String(text.to_string());
    serde_json::to_vec(&msg).ok().map(Some)
}

/// The fuzz target `graphql_request`'s way in (`fuzz/fuzz_targets/graphql_request.rs`, and the
/// test that replays its corpus): bytes as `/graphql` takes them, through everything the route
/// does before a resolver would run — the body's JSON or the URL's parameters, [`admit_request`]
/// (the gate, the trusted documents, the bounds, parsing, the operation, the variables) and
/// async-graphql's validation — and the cache of parsed documents. The first byte picks the
/// transport (its lowest bit: GET) and who sends it (a caller without a token, a member,
/// staff); the rest is the body or the query string.
pub fn fuzz_request(data: &[u8]) {
    use std::sync::OnceLock;
    struct Fixture {
        documents: super::persisted::PersistedDocuments,
        config: crate::config::Config,
        schema: crate::graphql::AppSchema,
        runtime: tokio::runtime::Runtime,
    }
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    let f = FIXTURE.get_or_init(|| {
        let mut config = crate::config::Config::for_tests(String::new());
        // The most the anonymous gate lets through.
        config.public_introspection = true;
        Fixture {
            documents: super::persisted::PersistedDocuments::new(None, crate::config::TrustedDocumentsFor::Member),
            schema: crate::graphql::validation_only_schema(&config),
            config,
            runtime: tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a runtime"),
        }
    });
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let via_get = pick & 1 == 1;
    let viewer = |role| Viewer {
        role,
        subject: "1".into(),
        member_id: Some(1),
        stores: None,
        session: None,
    };
    let viewer = match (pick >> 1) % 3 {
        0 => None,
        1 => Some(viewer(auth::Role::Member)),
        _ => Some(viewer(auth::Role::Admin)),
    };
    let params = if via_get {
        std::str::from_utf8(rest)
            .map_err(|_| ())
            .and_then(|q| Params::from_url(Some(q)).map_err(|_| ()))
    } else {
        Params::from_json(rest).map_err(|_| ())
    };
    let Ok(params) = params else {
        return;
    };
    let Ok(admitted) = admit_request(&f.documents, &f.config, viewer.as_ref(), Media::Json, params, via_get) else {
        return;
    };
    let mut request = async_graphql::Request::new(admitted.doc.text.to_string())
        .variables(admitted.variables)
        .data(RequestContext {
            viewer,
            trace: TraceId::new(),
            payer_ip: None,
            client_addr: None,
        });
    if let Some(name) = admitted.operation_name {
        request = request.operation_name(name);
    }
    request.set_parsed_query(admitted.doc.parsed.clone());
    let response = f.runtime.block_on(f.schema.execute(request));
    if response.errors.is_empty() && admitted.fresh {
        f.documents.keep(&admitted.doc);
    }
}
