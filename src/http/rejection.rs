//! A request that is not a GraphQL request, answered in our words: the extractor's own answer
//! was its error's `Debug` text (`InvalidRequest(Error("recursion limit exceeded", line: 1, …))`,
//! `Io(Custom { kind: Other, … })`, `UnsupportedBatch`).

use async_graphql::ParseRequestError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// What the caller reads for a request the GraphQL extractor refused: status 400 (413 for a
/// payload too large), a GraphQL error with `extensions.code` `BAD_USER_INPUT`, nothing quoted.
pub fn graphql(e: ParseRequestError) -> Response {
    let (status, message) = describe(&e);
    tracing::debug!(error = %e, "GraphQL request refused");
    let body = serde_json::json!({"errors": [{"message": message, "extensions": {"code": "BAD_USER_INPUT"}}]});
    (status, axum::Json(body)).into_response()
}

fn describe(e: &ParseRequestError) -> (StatusCode, String) {
    let bad = StatusCode::BAD_REQUEST;
    match e {
        ParseRequestError::InvalidRequest(inner) => match inner.downcast_ref::<serde_json::Error>() {
            Some(json) => {
                use serde_json::error::Category;
                let at = format!("line {}, column {}", json.line(), json.column());
                let what = match json.classify() {
                    Category::Syntax => format!("the request is not valid JSON (or nested too deep) at {at}"),
                    Category::Eof => "the request ends before its JSON does".to_string(),
                    Category::Data => format!(
                        "the request is not a GraphQL request (an object with \"query\", \"variables\", \
                         \"operationName\", \"extensions\") at {at}"
                    ),
                    Category::Io => "the request could not be read".to_string(),
                };
                (bad, what)
            }
            None => (bad, "the request is not a GraphQL request".to_string()),
        },
        ParseRequestError::UnsupportedBatch => (
            bad,
            "batched requests (a JSON array of requests) are not supported: send one request at a time".into(),
        ),
        ParseRequestError::PayloadTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "request body too large".into()),
        ParseRequestError::Io(_) => (bad, "the request could not be read as a GraphQL request".into()),
        // Multipart uploads and their parts: this API takes none.
        _ => (bad, "file uploads (multipart requests) are not supported".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_debug_text() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let json_err = serde_json::from_str::<serde_json::Value>(&deep).unwrap_err();
        for e in [
            ParseRequestError::InvalidRequest(Box::new(json_err)),
            ParseRequestError::UnsupportedBatch,
            ParseRequestError::Io(std::io::Error::other(
                "failed to parse graphql request from uri query: x",
            )),
        ] {
            let (_, text) = describe(&e);
            for leak in ["InvalidRequest", "Error(", "Io(", "Custom", "kind:", "UnsupportedBatch"] {
                assert!(!text.contains(leak), "{text}");
            }
        }
    }
}
