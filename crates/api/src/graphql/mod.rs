//! The GraphQL API: the admin console's queries, the member app's mutations and the ops
//! screen's subscriptions. The schema lives here, apart from the HTTP transport.

mod connection;
pub mod error;
pub mod introspection;
pub mod limits;
mod loaders;
mod mutation;
mod outbox;
mod query;
pub mod reads;
mod subscription;
mod types;

use async_graphql::parser::types::{ExecutableDocument, OperationDefinition};
use async_graphql::{Context, Schema};

pub use connection::{decode_cursor, encode_cursor};
pub use introspection::Introspection;
pub use loaders::DbLoader;
pub use reads::Reads;

use crate::app::AppState;
use crate::auth::Viewer;
use crate::db::DbConn;
use crate::domain::Ctx;
use crate::error::{AppError, AppResult};
use crate::trace::TraceId;

pub type AppSchema = Schema<query::Query, mutation::Mutation, subscription::Subscription>;

/// Per request: who is asking (None: no token) and the trace id.
#[derive(Clone)]
pub struct RequestContext {
    pub viewer: Option<Viewer>,
    pub trace: TraceId,
    /// The caller's address as a proxy in `FITORDER_TRUSTED_PROXIES` reported it; None when the
    /// request did not come through one. WeChat H5 payments take the payer's IP from here only.
    pub payer_ip: Option<String>,
    /// The caller's address as `http::client_addr` believes it (`FITORDER_TRUSTED_PROXIES`):
    /// what the sign-in rate limits count by.
    pub client_addr: Option<std::net::IpAddr>,
}

pub fn build_schema(state: AppState) -> AppSchema {
    let max_depth = state.config.max_depth;
    build_schema_with_depth(state, max_depth)
}

/// Introspection documents (GraphiQL's asks for nine levels of `ofType`) need more depth than
/// the API allows; the document bounds and the complexity limit stay the same.
pub const INTROSPECTION_DEPTH: usize = 20;

/// The schema that answers introspection-only documents (see [`is_introspection_only`]).
pub fn build_introspection_schema(state: AppState) -> AppSchema {
    build_schema_with_depth(state, INTROSPECTION_DEPTH)
}

/// Whether every operation of `doc` selects only `__schema`, `__type` and `__typename`.
pub fn is_introspection_only(doc: &ExecutableDocument) -> bool {
    use async_graphql::parser::types::Selection;
    let mut any = false;
    for (_, op) in doc.operations.iter() {
        for item in &op.node.selection_set.node.items {
            match &item.node {
                Selection::Field(f) if f.node.name.node.starts_with("__") => any = true,
                _ => return false,
            }
        }
    }
    any
}

/// The mutations a caller without a token may run: signing in.
pub const ANONYMOUS_MUTATIONS: [&str; 3] = ["signInWithWechat", "refreshSession", "signOut"];

/// Whether the operation a request runs ([`operation`]) is a mutation selecting only the
/// sign-in mutations (and `__typename`): the one thing besides introspection that runs
/// without a token.
pub fn is_sign_in_only(doc: &ExecutableDocument, operation_name: Option<&str>) -> bool {
    use async_graphql::parser::types::{OperationType, Selection};
    let Some(op) = operation(doc, operation_name) else {
        return false;
    };
    if op.ty != OperationType::Mutation {
        return false;
    }
    let mut any = false;
    for item in &op.selection_set.node.items {
        match &item.node {
            Selection::Field(f) if ANONYMOUS_MUTATIONS.contains(&f.node.name.node.as_str()) => any = true,
            Selection::Field(f) if f.node.name.node == "__typename" => {}
            _ => return false,
        }
    }
    any
}

/// The operation a request runs: the one `name` names, or the document's only one (named or
/// not: GraphQL lets `operationName` be left out of a one-operation document). None: no such
/// operation, or several and none named.
pub fn operation<'d>(doc: &'d ExecutableDocument, name: Option<&str>) -> Option<&'d OperationDefinition> {
    use async_graphql::parser::types::DocumentOperations;
    let op = match (&doc.operations, name) {
        (DocumentOperations::Single(op), _) => op,
        (DocumentOperations::Multiple(ops), Some(name)) => ops.get(name)?,
        (DocumentOperations::Multiple(ops), None) if ops.len() == 1 => ops.values().next()?,
        (DocumentOperations::Multiple(_), None) => return None,
    };
    Some(&op.node)
}

fn build_schema_with_depth(state: AppState, max_depth: usize) -> AppSchema {
    let state_limits = document_limits(&state.config);
    schema_builder(&state.config, max_depth)
        .data(state)
        .extension(limits::BoundDocuments(state_limits))
        .extension(TraceIds)
        .extension(reads::RecordWrites)
        .finish()
}

fn schema_builder(
    config: &crate::config::Config,
    max_depth: usize,
) -> async_graphql::SchemaBuilder<query::Query, mutation::Mutation, subscription::Subscription> {
    let max_complexity = config.max_complexity;
    Schema::build(query::Query, mutation::Mutation, subscription::Subscription)
        .limit_depth(max_depth)
        .limit_complexity(max_complexity)
        .limit_recursive_depth(32)
        .limit_directives(20)
}

/// The bounds every document is held to (the schema extension's, introspection's weight included).
pub fn document_limits(config: &crate::config::Config) -> limits::DocumentLimits {
    let mut l = limits::DocumentLimits::from_config(config);
    l.introspection = Some(introspection_budget());
    l
}

/// The schema of [`build_schema`] without its schema extensions, for the HTTP route's queries
/// and mutations, which does their work itself, once a request: [`check_bounded`] before,
/// [`finish_bounded`] after. An extension of any kind (even one that only wraps the whole
/// execution) sends every field of a response through async-graphql's extension chain, which
/// was a large part of the server's CPU on a page of 100 orders (~3,000 fields).
pub fn build_http_schema(state: AppState) -> AppSchema {
    let max_depth = state.config.max_depth;
    schema_builder(&state.config, max_depth).data(state).finish()
}

/// The schema with every bound and check of [`build_schema`] that comes before execution
/// (parsing, the document bounds, async-graphql's validation of the document and its
/// variables), and no execution: no state, no resolver runs. For the fuzz target that takes
/// a request from its bytes to the point where it would run.
pub fn validation_only_schema(config: &crate::config::Config) -> AppSchema {
    schema_builder(config, config.max_depth)
        .extension(limits::BoundDocuments(document_limits(config)))
        .extension(NoExecution)
        .finish()
}

/// Ends a request where its execution would begin (see [`validation_only_schema`]).
struct NoExecution;

impl async_graphql::extensions::ExtensionFactory for NoExecution {
    fn create(&self) -> std::sync::Arc<dyn async_graphql::extensions::Extension> {
        std::sync::Arc::new(NoExecution)
    }
}

#[async_graphql::async_trait::async_trait]
impl async_graphql::extensions::Extension for NoExecution {
    async fn execute(
        &self,
        _ctx: &async_graphql::extensions::ExtensionContext<'_>,
        _operation_name: Option<&str>,
        _next: async_graphql::extensions::NextExecute<'_>,
    ) -> async_graphql::Response {
        async_graphql::Response::new(async_graphql::Value::Null)
    }
}

/// What the schema extension `limits::BoundDocuments` checks of a request before it runs, for a
/// document already parsed (the HTTP route's, kept by hash).
pub fn check_bounded(
    text: &str,
    doc: &async_graphql::parser::types::ExecutableDocument,
    variables: &async_graphql::Variables,
    limits: &limits::DocumentLimits,
) -> async_graphql::ServerResult<()> {
    limits::check_text(text, limits)?;
    limits::check_document(doc, limits)?;
    limits::check_no_nul(doc, variables)
}

/// What the schema extensions do to an answer of [`build_http_schema`]'s schema: every
/// INTERNAL error of an execution gets the trace id (`TraceIds`), every error without a code
/// is the caller's input (`BoundDocuments`). Answers whether the request was executed (got
/// past parsing, validation and the choice of its operation), as [`ExecutionStarted`] tells
/// on the other schema: an error of an execution has a path (a field's), a refusal before it
/// none, and an execution that answered data did run. Not for subscriptions (an execution of
/// one over HTTP answers a path-less error).
pub fn finish_bounded(response: async_graphql::Response, trace: &str) -> (async_graphql::Response, bool) {
    let started = response.data != async_graphql::Value::Null || response.errors.iter().any(|e| !e.path.is_empty());
    let mut response = if started {
        stamp_trace(response, trace)
    } else {
        response
    };
    limits::code_uncoded(&mut response);
    (response, started)
}

/// Put in a request's data, set once it got past parsing, validation and the choice of its
/// operation to execution: the HTTP reply tells a request error (nothing ran) from an
/// execution's errors by it.
#[derive(Clone, Default)]
pub struct ExecutionStarted(pub std::sync::Arc<std::sync::atomic::AtomicBool>);

impl ExecutionStarted {
    pub fn started(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The schema extension that gives every INTERNAL error the request's trace id
/// (`extensions.traceId`): the caller reads a stable message and quotes the id; the detail is
/// in the log under it.
struct TraceIds;

impl async_graphql::extensions::ExtensionFactory for TraceIds {
    fn create(&self) -> std::sync::Arc<dyn async_graphql::extensions::Extension> {
        std::sync::Arc::new(TraceIds)
    }
}

fn stamp_trace(mut response: async_graphql::Response, trace: &str) -> async_graphql::Response {
    let internal = async_graphql::Value::from("INTERNAL");
    for err in &mut response.errors {
        if let Some(ext) = err.extensions.as_mut() {
            if ext.get("code") == Some(&internal) && ext.get("traceId").is_none() {
                ext.set("traceId", trace);
            }
        }
    }
    response
}

#[async_graphql::async_trait::async_trait]
impl async_graphql::extensions::Extension for TraceIds {
    async fn execute(
        &self,
        ctx: &async_graphql::extensions::ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: async_graphql::extensions::NextExecute<'_>,
    ) -> async_graphql::Response {
        if let Some(mark) = ctx.data_opt::<ExecutionStarted>() {
            mark.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let response = next.run(ctx, operation_name).await;
        match ctx.data_opt::<RequestContext>() {
            Some(r) => stamp_trace(response, r.trace.as_str()),
            None => response,
        }
    }

    fn subscribe<'s>(
        &self,
        ctx: &async_graphql::extensions::ExtensionContext<'_>,
        stream: futures_util::stream::BoxStream<'s, async_graphql::Response>,
        next: async_graphql::extensions::NextSubscribe<'_>,
    ) -> futures_util::stream::BoxStream<'s, async_graphql::Response> {
        use futures_util::StreamExt;
        let trace = ctx.data_opt::<RequestContext>().map(|r| r.trace.as_str().to_string());
        let events = next.run(ctx, stream);
        match trace {
            Some(t) => events.map(move |r| stamp_trace(r, &t)).boxed(),
            None => events,
        }
    }
}

/// What introspection may cost in one document: measured once on this schema.
pub fn introspection_budget() -> introspection::IntrospectionBudget {
    static BUDGET: std::sync::OnceLock<introspection::IntrospectionBudget> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| introspection::IntrospectionBudget::of_sdl(&sdl()))
}

/// The schema as SDL, as `schema/schema.graphql` holds it.
pub fn sdl() -> String {
    Schema::build(query::Query, mutation::Mutation, subscription::Subscription)
        .finish()
        .sdl()
}

pub fn state<'a>(ctx: &Context<'a>) -> &'a AppState {
    ctx.data_unchecked::<AppState>()
}

pub fn request<'a>(ctx: &Context<'a>) -> &'a RequestContext {
    ctx.data_unchecked::<RequestContext>()
}

/// The authenticated caller, or UNAUTHENTICATED.
pub fn viewer<'a>(ctx: &Context<'a>) -> AppResult<&'a Viewer> {
    request(ctx)
        .viewer
        .as_ref()
        .ok_or_else(|| AppError::Unauthenticated("a bearer token is required".into()))
}

pub fn actor_ctx(ctx: &Context<'_>) -> AppResult<Ctx> {
    Ok(Ctx {
        actor: viewer(ctx)?.actor(),
        trace: request(ctx).trace.clone(),
    })
}

/// A connection for a resolver: the primary, or the replica when this request's `Reads` chose
/// it (a staff query of lists and statistics, see `reads`).
pub(crate) async fn conn(ctx: &Context<'_>) -> AppResult<DbConn> {
    match ctx.data_opt::<std::sync::Arc<Reads>>() {
        Some(reads) => reads.conn().await,
        None => Ok(state(ctx).pool.get().await?),
    }
}

/// An `ID` argument, written the one way ids are written (decimal digits, no sign, no leading
/// zero, no spaces: `+2`, `02` and `" 2"` are not member 2), as tokens' subjects are.
pub fn parse_id(id: &async_graphql::ID, what: &str) -> AppResult<i64> {
    crate::auth::canonical_id(id.as_str()).ok_or_else(|| {
        let shown: String = id.as_str().chars().take(40).collect();
        AppError::bad(format!("{what} {shown:?} is not an id"))
    })
}

/// GraphQL Int is 32-bit; amounts are stored as 64-bit cents. An amount that does not fit is
/// an error, never a wrong number (a wallet topped up past 2^31 - 1 fen answers an error on its
/// balance, not ¥21,474,836.47).
pub fn int(v: i64) -> AppResult<i32> {
    i32::try_from(v).map_err(|_| AppError::internal(format!("an amount of {v} does not fit GraphQL's 32-bit Int")))
}

/// A count (rows, a connection's total): past 2^31 - 1 it is shown as 2^31 - 1.
pub fn count(v: i64) -> i32 {
    i32::try_from(v).unwrap_or(if v < 0 { 0 } else { i32::MAX })
}
