//! The GraphQL-over-HTTP specification's side of `/graphql`: which media type an answer is
//! written in (the `Accept` header), the request parameters from a JSON body or a URL, and the
//! status of an answer.

use async_graphql::ServerError;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

/// The media type of an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Media {
    /// `application/json`: every GraphQL answer is 200.
    Json,
    /// `application/graphql-response+json`: a request that did not run (its document does
    /// not parse or validate, its variables do not coerce) is 400, without `data`.
    GraphqlResponse,
}

impl Media {
    fn content_type(self) -> &'static str {
        match self {
            Media::Json => "application/json; charset=utf-8",
            Media::GraphqlResponse => "application/graphql-response+json; charset=utf-8",
        }
    }
}

/// The type `Accept` prefers: the highest `q` among the two this service writes (`*/*` and
/// `application/*` count as `application/json`; on a tie the one listed first);
/// `application/json` when it names neither or is missing.
pub fn negotiate(headers: &HeaderMap) -> Media {
    let mut best: Option<(f32, Media)> = None;
    for (kind, q) in accepted(headers) {
        let media = match kind.as_str() {
            "application/graphql-response+json" => Media::GraphqlResponse,
            "application/json" | "application/*" | "*/*" => Media::Json,
            _ => continue,
        };
        if q > 0.0 && best.is_none_or(|(b, _)| q > b) {
            best = Some((q, media));
        }
    }
    best.map(|(_, m)| m).unwrap_or(Media::Json)
}

/// Whether `Accept` prefers HTML to both JSON types (a browser opening the URL).
pub fn prefers_html(headers: &HeaderMap) -> bool {
    let mut html = None::<f32>;
    let mut json = None::<f32>;
    for (kind, q) in accepted(headers) {
        let slot = match kind.as_str() {
            "text/html" => &mut html,
            "application/json" | "application/graphql-response+json" => &mut json,
            _ => continue,
        };
        *slot = Some(slot.map_or(q, |s: f32| s.max(q)));
    }
    matches!((html, json), (Some(h), j) if h > 0.0 && j.is_none_or(|j| h > j))
}

/// The media ranges of every `Accept` header, in order, lower-case, with their `q` (1 unless given).
fn accepted(headers: &HeaderMap) -> impl Iterator<Item = (String, f32)> + '_ {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|item| {
            let mut parts = item.split(';');
            let kind = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q=").and_then(|q| q.trim().parse::<f32>().ok()))
                .next()
                .unwrap_or(1.0);
            (kind, q)
        })
}

/// The parameters of one GraphQL request.
#[derive(Debug, Default)]
pub struct Params {
    pub query: Option<String>,
    pub variables: Map<String, Value>,
    pub operation_name: Option<String>,
    pub extensions: Map<String, Value>,
}

/// A request the endpoint cannot take as it came: the status it is answered with, whatever
/// the media type, and the message.
#[derive(Debug)]
pub struct BadRequest {
    pub status: StatusCode,
    pub message: String,
}

impl BadRequest {
    pub fn new(message: impl Into<String>) -> BadRequest {
        BadRequest {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }
}

impl Params {
    /// From a `POST` body: one JSON object. An array (a batch) is refused.
    pub fn from_json(body: &[u8]) -> Result<Params, BadRequest> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(BadRequest::new(
                "the request has no body: send a JSON object with \"query\"",
            ));
        }
        let value: Value = serde_json::from_slice(body).map_err(|e| {
            BadRequest::new(format!(
                "the body is not JSON (line {}, column {})",
                e.line(),
                e.column()
            ))
        })?;
        match value {
            Value::Object(obj) => Params::from_object(obj),
            Value::Array(_) => Err(BadRequest::new(
                "batched requests are not supported: send one operation per request",
            )),
            _ => Err(BadRequest::new("the body must be a JSON object with \"query\"")),
        }
    }

    fn from_object(mut obj: Map<String, Value>) -> Result<Params, BadRequest> {
        let query = match obj.remove("query") {
            None | Some(Value::Null) => None,
            Some(Value::String(q)) => Some(q),
            Some(_) => return Err(BadRequest::new("\"query\" must be a string")),
        };
        let operation_name = match obj.remove("operationName") {
            None | Some(Value::Null) => None,
            Some(Value::String(n)) => Some(n),
            Some(_) => return Err(BadRequest::new("\"operationName\" must be a string or null")),
        };
        let map = |name: &str, v: Option<Value>| match v {
            None | Some(Value::Null) => Ok(Map::new()),
            Some(Value::Object(m)) => Ok(m),
            Some(_) => Err(BadRequest::new(format!("\"{name}\" must be an object or null"))),
        };
        let variables = map("variables", obj.remove("variables"))?;
        let extensions = map("extensions", obj.remove("extensions"))?;
        if query.is_none() && !extensions.contains_key("persistedQuery") {
            return Err(BadRequest::new("the request has no \"query\""));
        }
        Ok(Params {
            query,
            variables,
            operation_name,
            extensions,
        })
    }

    /// From a `GET` URL: `query`, `operationName`, and `variables` and `extensions` as JSON text.
    pub fn from_url(raw: Option<&str>) -> Result<Params, BadRequest> {
        let mut obj = Map::new();
        for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            let value = match k.as_ref() {
                "query" | "operationName" => Value::String(v.into_owned()),
                "variables" | "extensions" if v.trim().is_empty() => Value::Null,
                "variables" | "extensions" => serde_json::from_str(&v)
                    .map_err(|_| BadRequest::new(format!("the URL parameter \"{k}\" is not JSON")))?,
                _ => continue,
            };
            if obj.insert(k.into_owned(), value).is_some() {
                return Err(BadRequest::new("a URL parameter is given twice"));
            }
        }
        Params::from_object(obj)
    }
}

/// An error as the caller reads it: a message, `extensions.code`, and where in the document.
pub fn error(message: impl Into<String>, code: &str, locations: Vec<async_graphql::Pos>) -> ServerError {
    let mut err = ServerError::new(message, None);
    err.locations = locations;
    let mut ext = async_graphql::ErrorExtensionValues::default();
    ext.set("code", code);
    err.extensions = Some(ext);
    err
}

fn encode(media: Media, status: StatusCode, body: Vec<u8>) -> Response {
    let mut resp = (status, body).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(media.content_type()));
    resp
}

/// A GraphQL answer of a request that ran: 200.
pub fn executed(media: Media, response: &async_graphql::Response) -> Response {
    match serde_json::to_vec(response) {
        Ok(body) => encode(media, StatusCode::OK, body),
        Err(_) => encode(
            media,
            StatusCode::INTERNAL_SERVER_ERROR,
            br#"{"errors":[{"message":"internal error","extensions":{"code":"INTERNAL"}}]}"#.to_vec(),
        ),
    }
}

/// The answer to a request that did not run: no `data`; 400 with
/// `application/graphql-response+json`, 200 with `application/json` (`status` when the request
/// was not even well-formed GraphQL over HTTP, whatever the media type).
pub fn not_run(media: Media, status: Option<StatusCode>, errors: Vec<ServerError>) -> Response {
    let status = status.unwrap_or(match media {
        Media::Json => StatusCode::OK,
        Media::GraphqlResponse => StatusCode::BAD_REQUEST,
    });
    let body = serde_json::to_vec(&serde_json::json!({ "errors": errors })).unwrap_or_default();
    encode(media, status, body)
}

/// A request that is not well-formed GraphQL over HTTP.
pub fn bad_request(media: Media, bad: BadRequest) -> Response {
    not_run(
        media,
        Some(bad.status),
        vec![error(bad.message, "BAD_USER_INPUT", vec![])],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn accept_chooses_the_media_type() {
        assert_eq!(negotiate(&HeaderMap::new()), Media::Json);
        assert_eq!(negotiate(&accept("application/json")), Media::Json);
        assert_eq!(negotiate(&accept("*/*")), Media::Json);
        assert_eq!(
            negotiate(&accept("application/graphql-response+json")),
            Media::GraphqlResponse
        );
        // Apollo Client's, urql's.
        assert_eq!(
            negotiate(&accept("application/graphql-response+json,application/json;q=0.9")),
            Media::GraphqlResponse
        );
        assert_eq!(
            negotiate(&accept(
                "application/graphql-response+json, application/graphql+json, application/json, text/event-stream, multipart/mixed"
            )),
            Media::GraphqlResponse
        );
        assert_eq!(
            negotiate(&accept("application/graphql-response+json;q=0.5, application/json")),
            Media::Json
        );
        assert_eq!(negotiate(&accept("text/plain")), Media::Json);
    }

    #[test]
    fn browsers_prefer_html() {
        assert!(prefers_html(&accept(
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
        )));
        assert!(!prefers_html(&accept("application/json")));
        assert!(!prefers_html(&accept("*/*")));
        assert!(!prefers_html(&HeaderMap::new()));
    }

    #[test]
    fn parameters_are_checked() {
        assert!(Params::from_json(br#"[{"query":"{a}"}]"#)
            .unwrap_err()
            .message
            .contains("batched"));
        assert!(Params::from_json(b"").is_err());
        assert!(Params::from_json(br#"{"query": 1}"#).is_err());
        assert!(Params::from_json(br#"{"query": "{a}", "variables": "x"}"#).is_err());
        assert!(Params::from_json(br#"{"query": "{a}", "extensions": []}"#).is_err());
        assert!(Params::from_json(br#"{"query": "{a}", "operationName": 0}"#).is_err());
        assert!(Params::from_json(br#"{"qeury": "{a}"}"#).is_err());
        let p = Params::from_json(br#"{"query": "{a}", "variables": null, "operationName": null, "extensions": null}"#)
            .unwrap();
        assert_eq!(p.query.as_deref(), Some("{a}"));
        let p = Params::from_url(Some("query=%7Ba%7D&variables=%7B%22n%22%3A1%7D&operationName=A")).unwrap();
        assert_eq!(p.variables["n"], 1);
        assert_eq!(p.operation_name.as_deref(), Some("A"));
        assert!(Params::from_url(Some("variables=%7B")).is_err());
        assert!(Params::from_url(Some("query=a&query=b")).is_err());
        // A hash alone is a request.
        let p = Params::from_url(Some(
            "extensions=%7B%22persistedQuery%22%3A%7B%22version%22%3A1%2C%22sha256Hash%22%3A%22ab%22%7D%7D",
        ))
        .unwrap();
        assert!(p.query.is_none() && p.extensions.contains_key("persistedQuery"));
    }
}
