//! The HTTP surface: GraphQL (POST and GET, GraphiQL for a browser, WebSocket subscriptions), health,
//! metrics. Every request gets a trace id (taken from `traceparent`/`X-Trace-Id` when sent),
//! echoed in the `X-Trace-Id` response header.

mod body;
mod callbacks;
pub mod client_addr;
pub mod graphiql;
mod graphql_over_http;
mod graphql_routes;
mod health;
pub mod metrics;
pub mod persisted;
mod reports;
mod serve;
mod workbench;
pub mod ws_quota;

pub use graphql_routes::fuzz_request;
pub use serve::{serve, serve_with, ServeLimits};

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::Router;

use crate::app::AppState;
use crate::graphql::{build_schema, AppSchema};

#[derive(Clone)]
pub struct HttpState {
    pub app: AppState,
    pub schema: AppSchema,
    /// The same schema without schema extensions, for queries and mutations over HTTP
    /// (`graphql::build_http_schema`).
    pub http_schema: AppSchema,
    /// Introspection-only documents: the same schema with room for introspection's depth, and
    /// answers kept (the schema does not change while the process runs).
    pub introspection: crate::graphql::Introspection,
    /// Documents by hash: the persisted queries, the trusted manifest, the parsed trees.
    pub documents: std::sync::Arc<persisted::PersistedDocuments>,
    /// When `/metrics` last read the outbox backlog from the database (it does at most every
    /// [`metrics::BACKLOG_EVERY`], however often it is scraped).
    pub backlog_read: std::sync::Arc<tokio::sync::Mutex<Option<Instant>>>,
    /// Running WebSocket operations per token, over all connections of this process.
    pub subscriptions: std::sync::Arc<ws_quota::TokenOperations>,
}

pub fn router(app: AppState) -> Router {
    metrics::install();
    let schema = build_schema(app.clone());
    let http_schema = crate::graphql::build_http_schema(app.clone());
    let introspection = crate::graphql::Introspection::new(crate::graphql::build_introspection_schema(app.clone()));
    let limit = app.config.max_body_bytes;
    let bounds = body::BodyBounds {
        max_bytes: limit,
        timeout: app.config.http_body_timeout,
    };
    // Outside development mode `/metrics` is for Prometheus only: behind FITORDER_METRICS_TOKEN
    // here, or open on the FITORDER_METRICS_ADDR listener (`ops_router`).
    let metrics_open = app.config.dev_mode;
    let metrics_token = app.config.metrics_token.clone();
    let documents = std::sync::Arc::new(persisted::PersistedDocuments::new(
        app.config.trusted_documents.as_deref(),
        app.config.trusted_documents_for,
    ));
    let state = HttpState {
        app,
        schema,
        http_schema,
        introspection,
        documents,
        backlog_read: Default::default(),
        subscriptions: Default::default(),
    };
    let metrics_route = if metrics_open {
        get(metrics::render)
    } else {
        match metrics_token {
            Some(token) => {
                get(metrics::render).route_layer(middleware::from_fn(move |req: Request, next: Next| {
                    let token = token.clone();
                    async move {
                        metrics::require_token(crate::config::ExposeSecret::expose_secret(&token), req, next).await
                    }
                }))
            }
            None => get(metrics::not_here),
        }
    };
    let routes = Router::new()
        .route(
            "/graphql",
            get(graphql_routes::graphql_get).post(graphql_routes::graphql),
        )
        .route("/graphql/assets/{name}", get(graphiql::asset))
        .route("/graphql/ws", get(graphql_routes::subscriptions))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", metrics_route)
        .route("/ops", get(ops_page))
        .route("/ops/tickets", get(workbench::page))
        .route("/ops/assets/{name}", get(workbench::asset))
        .route("/reports/prepaid.csv", get(reports::prepaid_csv));
    // Each provider's notify path (the contract's), from the registry.
    let routes = crate::providers::provider::PLUGINS.iter().fold(routes, |routes, p| {
        let provider = p.provider();
        let notify =
            move |st: axum::extract::State<HttpState>,
                  trace: axum::Extension<crate::trace::TraceId>,
                  ext: axum::http::Extensions,
                  headers: axum::http::HeaderMap,
                  body: axum::body::Bytes| callbacks::notify(provider, st, trace, ext, headers, body);
        routes.route(p.notify_path(), axum::routing::post(notify))
    });
    routes
        .with_state(state)
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(bounds, body::bounded))
        .layer(tower_http::set_header::SetResponseHeaderLayer::if_not_present(
            axum::http::header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        .layer(middleware::from_fn(trace_requests))
}

/// What the FITORDER_METRICS_ADDR listener serves (of `fitorder worker`, and of `fitorder
/// serve` beside the API): metrics and health, for Prometheus and the orchestrator.
pub fn ops_router(app: AppState) -> Router {
    metrics::install();
    let schema = build_schema(app.clone());
    let introspection = crate::graphql::Introspection::new(schema.clone());
    let state = HttpState {
        app,
        http_schema: schema.clone(),
        schema,
        introspection,
        documents: std::sync::Arc::new(persisted::PersistedDocuments::new(
            None,
            crate::config::TrustedDocumentsFor::Member,
        )),
        backlog_read: Default::default(),
        subscriptions: Default::default(),
    };
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(metrics::render))
        .with_state(state)
        .layer(middleware::from_fn(trace_requests))
}

/// The ops watch page: plain files (no build step, no CDN) compiled into the binary, its script
/// and styles under `/ops/assets/` (`watch.js`, `watch.css`), so nothing inline runs or styles.
/// Its own `<meta>` policy cannot forbid framing; the header does.
async fn ops_page() -> Response {
    let mut resp = axum::response::IntoResponse::into_response(axum::response::Html(include_str!(
        "../../../../playground/ops/index.html"
    )));
    graphiql::html_headers(
        &mut resp,
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self' ws: wss:; \
         img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    );
    resp
}

/// Gives the request its trace id, logs it with the outcome, and counts it by route.
async fn trace_requests(mut req: Request, next: Next) -> Response {
    let trace = crate::trace::from_headers(req.headers());
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| req.uri().path().to_string());
    let method = req.method().to_string();
    req.extensions_mut().insert(trace.clone());
    let started = Instant::now();
    let span = tracing::info_span!("request", trace_id = %trace, %method, %route);
    let mut resp = tracing::Instrument::instrument(next.run(req), span.clone()).await;
    let elapsed = started.elapsed();
    let status = resp.status().as_u16();
    if let Ok(v) = HeaderValue::from_str(trace.as_str()) {
        resp.headers_mut().insert("x-trace-id", v);
    }
    let route_label = known_route(&route);
    ::metrics::counter!("fitorder_http_requests_total", "route" => route_label, "method" => method.clone(), "status" => status.to_string())
        .increment(1);
    ::metrics::histogram!("fitorder_http_request_seconds", "route" => route_label).record(elapsed.as_secs_f64());
    tracing::debug!(parent: &span, status, ms = elapsed.as_millis() as u64, "done");
    resp
}

/// Bounded label values: unknown paths share one label.
fn known_route(path: &str) -> &'static str {
    match path {
        "/graphql" => "/graphql",
        "/graphql/ws" => "/graphql/ws",
        "/healthz" => "/healthz",
        "/readyz" => "/readyz",
        "/metrics" => "/metrics",
        "/ops" => "/ops",
        "/ops/tickets" => "/ops/tickets",
        "/reports/prepaid.csv" => "/reports/prepaid.csv",
        "/ops/assets/{name}" => "/ops/assets",
        "/graphql/assets/{name}" => "/graphql/assets",
        // The providers' notify paths.
        other => crate::providers::provider::PLUGINS
            .iter()
            .map(|p| p.notify_path())
            .find(|p| *p == other)
            .unwrap_or("other"),
    }
}
