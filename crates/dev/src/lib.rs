//! Development tools, kept out of the layers the production paths are made of: the provider
//! sandbox (WeChat Pay, Alipay and the mini-program on loopback), the dev keys it signs with,
//! the private PostgreSQL cluster `cargo run` starts, the demo data and the fuzzing entry
//! points. Rank 7 (ARCHITECTURE.md, "Layers"); only the binary's wiring uses it.

pub mod dev_pg;
pub mod devkeys;
pub mod fuzzing;
pub mod sandbox;
pub mod sandbox_server;
pub mod seed;

// The lower layers, under the names every crate of the workspace uses (`crate::domain::…`).
use fitorder_domain as domain;
#[allow(unused_imports)]
use fitorder_base::{trace, error, config, auth, ratelimit, logging};
use fitorder_db as db;
#[allow(unused_imports)]
use fitorder_db::events;
#[allow(unused_imports)]
use fitorder_providers::miniprogram;
#[allow(unused_imports)]
use fitorder_capabilities::{app, tickets, alerts, wallet, outbox, compensation, orders, catalog, sessions, payments, ticket_resolution, expiry, reconciliation, timeline, anomalies, tasks};
#[allow(unused_imports)]
use fitorder_api::{graphql, http};
