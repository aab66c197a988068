//! What every layer of fitorder shares: configuration, errors, trace ids, tokens, logging,
//! the per-key rate limiter and the bounds on text from outside. Rank 1 (ARCHITECTURE.md, "Layers").

pub mod auth;
pub mod bounds;
pub mod config;
pub mod error;
pub mod logging;
pub mod ratelimit;
pub mod trace;

// The lower layers, under the names every crate of the workspace uses (`crate::domain::…`).
use fitorder_domain as domain;
