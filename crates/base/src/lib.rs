//! What every layer of fitorder shares: configuration, errors, trace ids, tokens, logging and
//! the per-key rate limiter. Rank 1 (ARCHITECTURE.md, "Layers").

pub mod auth;
pub mod config;
pub mod error;
pub mod logging;
pub mod ratelimit;
pub mod trace;

// The lower layers, under the names every crate of the workspace uses (`crate::domain::…`).
use fitorder_domain as domain;
