//! The ops workbench (`GET /ops/tickets`): exception tickets, one ticket's chain and the actions
//! that close it, in Chinese or English. Plain files (no build step, no CDN) compiled into the
//! binary: the page and its modules under `/ops/assets/`, which also serves the watch page's
//! (`GET /ops`: `watch.js`, `watch.css`, and `live.js`, shared).

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};

use super::HttpState;

const PAGE: &str = include_str!("../../../../playground/ops/tickets.html");
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "workbench.js",
        include_str!("../../../../playground/ops/workbench.js"),
        "text/javascript; charset=utf-8",
    ),
    (
        "i18n.js",
        include_str!("../../../../playground/ops/i18n.js"),
        "text/javascript; charset=utf-8",
    ),
    (
        "live.js",
        include_str!("../../../../playground/ops/live.js"),
        "text/javascript; charset=utf-8",
    ),
    (
        "charts.js",
        include_str!("../../../../playground/ops/charts.js"),
        "text/javascript; charset=utf-8",
    ),
    (
        "workbench.css",
        include_str!("../../../../playground/ops/workbench.css"),
        "text/css; charset=utf-8",
    ),
    (
        "watch.js",
        include_str!("../../../../playground/ops/watch.js"),
        "text/javascript; charset=utf-8",
    ),
    (
        "watch.css",
        include_str!("../../../../playground/ops/watch.css"),
        "text/css; charset=utf-8",
    ),
];
/// The page names the business time zone in this tag; it is served with `FITORDER_TIMEZONE`.
const TZ_META: &str = r#"<meta name="fitorder-timezone" content="Asia/Shanghai">"#;

pub async fn page(State(s): State<HttpState>) -> Response {
    let tz = s.app.config.timezone.name();
    let body = PAGE.replacen(
        TZ_META,
        &format!(r#"<meta name="fitorder-timezone" content="{tz}">"#),
        1,
    );
    let mut resp = Html(body).into_response();
    super::graphiql::html_headers(
        &mut resp,
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self' ws: wss:; \
         img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    );
    resp
}

pub async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, ..)| *n == name) {
        Some((_, body, kind)) => (
            [(header::CONTENT_TYPE, *kind), (header::CACHE_CONTROL, "no-cache")],
            *body,
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_page_carries_the_time_zone_tag() {
        assert!(super::PAGE.contains(super::TZ_META));
    }
}
