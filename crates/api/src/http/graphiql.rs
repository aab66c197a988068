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
<script src="/graphql/assets/tabs.js"></script>
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
        "tabs.js" => (tabs_script().as_bytes(), "text/javascript; charset=utf-8"),
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

/// The contract's documents, as the apps send them (`playground/operations/`), with their
/// example variables (`playground/variables/`): (audience, document, variables).
const OPERATIONS: &[(&str, &str, &str)] = &[
    (
        "member",
        include_str!("../../../../playground/operations/member.graphql"),
        include_str!("../../../../playground/variables/member.json"),
    ),
    (
        "admin",
        include_str!("../../../../playground/operations/admin.graphql"),
        include_str!("../../../../playground/variables/admin.json"),
    ),
    (
        "ops",
        include_str!("../../../../playground/operations/ops.graphql"),
        include_str!("../../../../playground/variables/ops.json"),
    ),
];

/// One GraphiQL tab.
#[derive(serde::Serialize)]
pub struct Tab {
    pub query: String,
    pub variables: String,
}

/// A tab per operation of the playground's documents, in their order: the file's opening
/// comment (who sends it), the operation, the fragments it spreads, its example variables.
pub fn tabs() -> Vec<Tab> {
    let mut out = Vec::new();
    for (_, doc, vars) in OPERATIONS {
        let vars: serde_json::Value = serde_json::from_str(vars).unwrap_or_default();
        let (header, blocks) = definitions(doc);
        let fragment = |name: &str| {
            blocks
                .iter()
                .find(|(kind, n, _)| *kind == "fragment" && n == name)
                .map(|(_, _, text)| text.as_str())
        };
        for (kind, name, text) in &blocks {
            if *kind == "fragment" {
                continue;
            }
            let mut query = format!("{header}{text}");
            let mut used: Vec<&str> = Vec::new();
            let mut pending = spreads(text);
            while let Some(f) = pending.pop() {
                if used.contains(&f) {
                    continue;
                }
                if let Some(body) = fragment(f) {
                    used.push(f);
                    query.push_str("\n\n");
                    query.push_str(body);
                    pending.extend(spreads(body));
                }
            }
            query.push('\n');
            let variables = vars
                .get(name)
                .map(|v| serde_json::to_string_pretty(v).unwrap_or_default())
                .unwrap_or_else(|| "{}".into());
            out.push(Tab { query, variables });
        }
    }
    out
}

/// The comment before the first definition, and each definition: (kind, name, text).
fn definitions(doc: &str) -> (String, Vec<(&'static str, String, String)>) {
    let mut header = String::new();
    let mut blocks: Vec<(&'static str, String, String)> = Vec::new();
    for line in doc.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        let kind = ["query", "mutation", "subscription", "fragment"]
            .into_iter()
            .find(|k| *k == first && !line.starts_with(' '));
        match (kind, blocks.last_mut()) {
            (Some(kind), _) => {
                let name = words
                    .next()
                    .unwrap_or("")
                    .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .next()
                    .unwrap_or("")
                    .to_string();
                blocks.push((kind, name, line.to_string()));
            }
            (None, Some((_, _, text))) => {
                text.push('\n');
                text.push_str(line);
            }
            (None, None) => {
                header.push_str(line);
                header.push('\n');
            }
        }
    }
    for (_, _, text) in &mut blocks {
        let trimmed = text.trim_end().len();
        text.truncate(trimmed);
    }
    (header.trim_end().to_string() + "\n\n", blocks)
}

/// The fragment names `...Name` in a text.
fn spreads(text: &str) -> Vec<&str> {
    text.match_indices("...")
        .filter_map(|(i, _)| {
            let rest = text[i + 3..].trim_start();
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let name = &rest[..end];
            (!name.is_empty() && name != "on").then_some(name)
        })
        .collect()
}

/// `tabs.js`: the tabs as a global that `init.js` gives GraphiQL as its default tabs.
fn tabs_script() -> &'static str {
    static SCRIPT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| {
        let json = serde_json::to_string(&tabs()).unwrap_or_else(|_| "[]".into());
        // Inside a script, "</" could end it early in an inline context; escape it anyway.
        format!("window.fitorderTabs = {};\n", json.replace("</", "<\\/"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_is_a_tab_that_parses_alone() {
        let tabs = tabs();
        let mut names = Vec::new();
        for (_, doc, _) in OPERATIONS {
            let parsed = async_graphql::parser::parse_query(doc).unwrap();
            for (name, _) in parsed.operations.iter() {
                names.push(name.map(|n| n.to_string()).unwrap_or_default());
            }
        }
        let mut in_tabs = Vec::new();
        for tab in &tabs {
            let parsed =
                async_graphql::parser::parse_query(&tab.query).unwrap_or_else(|e| panic!("{e}: {}", tab.query));
            let ops: Vec<_> = parsed
                .operations
                .iter()
                .map(|(n, _)| n.map(|n| n.to_string()))
                .collect();
            assert_eq!(ops.len(), 1, "{}", tab.query);
            in_tabs.push(ops[0].clone().unwrap_or_default());
            serde_json::from_str::<serde_json::Value>(&tab.variables).unwrap();
        }
        names.sort();
        in_tabs.sort();
        assert_eq!(in_tabs, names);
        let place = tabs.iter().find(|t| t.query.contains("mutation PlaceOrder")).unwrap();
        assert!(
            place.query.contains("fragment PaymentInstructionFields"),
            "{}",
            place.query
        );
        assert!(place.query.starts_with("# The member app"));
        assert!(place.variables.contains("idempotencyKey"));
    }
}
