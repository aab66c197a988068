//! GraphiQL at `GET /graphql`, served entirely by this service: the pinned npm builds of
//! GraphiQL, React, ReactDOM and graphql-ws (see `build.rs` and `playground/graphiql/`) are
//! embedded in the binary and served under `/graphql/assets/`, with a Content-Security-Policy
//! that lets the page load nothing from anywhere else.

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

include!(concat!(env!("OUT_DIR"), "/graphiql_assets.rs"));

const BOOT: &str = include_str!("graphiql/init.js");

const PAGE: &str = r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>fitorder GraphiQL</title>
<link rel="stylesheet" href="/graphql/assets/graphiql.min.css">
<link rel="stylesheet" href="/graphql/assets/page.css">
</head>
<body>
<div id="graphiql">Loading…</div>
<script src="/graphql/assets/react.production.min.js"></script>
<script src="/graphql/assets/react-dom.production.min.js"></script>
<script src="/graphql/assets/graphql-ws.min.js"></script>
<script src="/graphql/assets/graphiql.min.js"></script>
<script src="/graphql/assets/init.js"></script>
</body>
</html>
"#;

const PAGE_CSS: &str = "html, body, #graphiql { height: 100%; margin: 0; width: 100%; overflow: hidden; }\n";

const MISSING: &str = r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>fitorder GraphiQL</title></head>
<body style="font-family: system-ui, sans-serif; max-width: 42em; margin: 3em auto; line-height: 1.5">
<h1>GraphiQL is not in this build</h1>
<p>This binary was built without GraphiQL's assets (npm was not available or offline when it
was built). The API works: <code>POST /graphql</code> with a bearer token.</p>
<p>To get GraphiQL: <code>npm ci --prefix playground/graphiql</code>, then
<code>cargo run --release</code> again (or point <code>FITORDER_GRAPHIQL_DIR</code> at a
<code>node_modules</code> installed from <code>playground/graphiql/package-lock.json</code>).</p>
</body></html>
"#;

/// Whether this build embeds GraphiQL.
pub fn available() -> bool {
    !GRAPHIQL_ASSETS.is_empty()
}

/// The policy of the page: scripts and styles from this origin only, requests to this origin
/// only (the WebSocket named explicitly for browsers without CSP 3's `'self'` for `ws:`),
/// never framed.
fn policy(headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b)));
    let ws = host.map(|h| format!(" ws://{h} wss://{h}")).unwrap_or_default();
    format!(
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
         font-src 'self' data:; connect-src 'self'{ws}; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    )
}

/// Headers every HTML page of the service carries.
pub fn html_headers(resp: &mut Response, csp: &str) {
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(csp) {
        h.insert(header::CONTENT_SECURITY_POLICY, v);
    }
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
}

pub async fn page(headers: HeaderMap) -> Response {
    let body = if available() { PAGE } else { MISSING };
    let mut resp = axum::response::Html(body).into_response();
    html_headers(&mut resp, &policy(&headers));
    resp
}

pub async fn asset(Path(name): Path<String>) -> Response {
    let (bytes, kind): (&[u8], &str) = match name.as_str() {
        "init.js" => (BOOT.as_bytes(), "text/javascript; charset=utf-8"),
        "page.css" => (PAGE_CSS.as_bytes(), "text/css; charset=utf-8"),
        _ => match GRAPHIQL_ASSETS.iter().find(|(n, _)| *n == name) {
            Some((n, b)) if n.ends_with(".css") => (b, "text/css; charset=utf-8"),
            Some((_, b)) => (b, "text/javascript; charset=utf-8"),
            None => return StatusCode::NOT_FOUND.into_response(),
        },
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        bytes,
    )
        .into_response()
}
