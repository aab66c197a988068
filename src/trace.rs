//! One trace id through the whole chain: taken from `traceparent` or `X-Trace-Id` when the
//! caller sends one, made up otherwise, and written on every row a request writes.

use axum::http::HeaderMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceId(pub String);

impl TraceId {
    pub fn new() -> TraceId {
        use rand::Rng;
        let bytes: [u8; 16] = rand::rng().random();
        TraceId(hex::encode(bytes))
    }

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

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TraceId {
    fn default() -> Self {
        TraceId::new()
    }
}

impl std::fmt::Display for TraceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
