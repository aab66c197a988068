//! One trace id through the whole chain: taken from `traceparent` or `X-Trace-Id` when the
//! caller sends one, made up otherwise, and written on every row a request writes.

// `http`'s HeaderMap, as reqwest re-exports it (axum's is the same type): rank 1 needs no web framework.
use reqwest::header::HeaderMap;

/// The id itself is a plain newtype in `domain` (it travels in [`crate::domain::Ctx`]); reading
/// it from headers is here.
pub use crate::domain::TraceId;

/// The caller's trace id (`traceparent`, then `X-Trace-Id`), or a new one.
pub fn from_headers(headers: &HeaderMap) -> TraceId {
    // W3C traceparent: version-traceid-parentid-flags; the trace id is the second field.
    if let Some(tp) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
        let mut parts = tp.split('-');
        if let (Some(_), Some(id)) = (parts.next(), parts.next()) {
            if id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) && id != "0".repeat(32) {
                return TraceId(id.to_ascii_lowercase());
            }
        }
    }
    if let Some(id) = headers.get("x-trace-id").and_then(|v| v.to_str().ok()) {
        let id = id.trim();
        if (8..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return TraceId(id.to_string());
        }
    }
    TraceId::new()
}
