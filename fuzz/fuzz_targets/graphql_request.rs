#![no_main]
//! The GraphQL request path: a POST body or a GET query string, for a caller without a token,
//! a member or staff, through the bounds, parsing, the trusted-documents gate, the operation,
//! the variables and async-graphql's validation (no resolver runs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fitorder::dev::fuzzing::graphql_request(data);
});
