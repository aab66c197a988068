//! fitorder: the order backend of a chain of AI fitness studios.
//!
//! The crates under `crates/` are the layers (ARCHITECTURE.md, "Layers"): `fitorder-domain`
//! (the pure rules), `-base` (what all share), `-db`, `-providers` (the payment providers'
//! clients), `-capabilities`, `-api` (GraphQL and HTTP) and `-dev` (the sandbox and other
//! development tools). This package is the binary and its wiring ([`server`]); its library
//! names the layers' modules in one place for the binary, the tests and the bench.

pub use fitorder_api::{graphql, http};
pub use fitorder_base::{auth, bounds, config, error, logging, ratelimit, trace};
pub use fitorder_capabilities::{
    alerts, anomalies, app, catalog, compensation, expiry, memberships, orders, outbox, payments, prepaid,
    reconciliation, sales, sessions, slot_cancel, tasks, ticket_resolution, tickets, timeline, wallet,
};
pub use fitorder_db as db;
pub use fitorder_db::events;
pub use fitorder_dev as dev;
pub use fitorder_domain as domain;
pub use fitorder_providers as providers;
pub use fitorder_providers::miniprogram;

pub mod server;
