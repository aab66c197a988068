//! Request bodies, bounded before any handler sees them: read whole within
//! `FITORDER_HTTP_BODY_TIMEOUT` counted from the first byte asked for (a total, not an idle
//! timeout: a body trickled a byte at a time is cut at the deadline like one that never
//! comes), and at most `FITORDER_MAX_BODY_BYTES` long. A refusal is decided by what happened
//! (the deadline passed, the count went over), never by reading an error's text.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

#[derive(Clone, Copy, Debug)]
pub struct BodyBounds {
    pub max_bytes: usize,
    pub timeout: std::time::Duration,
}

/// Why a body was refused.
#[derive(Debug, PartialEq, Eq)]
enum Refused {
    TooLarge,
    TooSlow,
    Unreadable,
}

/// The middleware: the request goes on with its body read whole, or is answered here.
pub async fn bounded(State(bounds): State<BodyBounds>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > bounds.max_bytes as u64) {
        return refusal(Refused::TooLarge, bounds);
    }
    let (parts, body) = req.into_parts();
    match tokio::time::timeout(bounds.timeout, read(body, bounds.max_bytes)).await {
        Err(_) => refusal(Refused::TooSlow, bounds),
        Ok(Err(why)) => refusal(why, bounds),
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
    }
}

async fn read(body: Body, max_bytes: usize) -> Result<bytes::Bytes, Refused> {
    let mut stream = body.into_data_stream();
    let mut buf = bytes::BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| Refused::Unreadable)?;
        if buf.len() + chunk.len() > max_bytes {
            return Err(Refused::TooLarge);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// A GraphQL-shaped error (what the API's clients read), and the connection closed: the rest
/// of a refused body is not waited for.
fn refusal(why: Refused, bounds: BodyBounds) -> Response {
    let (status, message) = match why {
        Refused::TooLarge => (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body too large (limit {} bytes)", bounds.max_bytes),
        ),
        Refused::TooSlow => (
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "request body not received within {}",
                humantime::format_duration(bounds.timeout)
            ),
        ),
        Refused::Unreadable => (
            StatusCode::BAD_REQUEST,
            "the request body could not be read".to_string(),
        ),
    };
    let body = serde_json::json!({"errors": [{"message": message, "extensions": {"code": "BAD_USER_INPUT"}}]});
    let mut resp = (status, axum::Json(body)).into_response();
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}
