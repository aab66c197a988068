//! Development tools, kept out of the layers the production paths are made of: the provider
//! sandbox (WeChat Pay, Alipay and the mini-program on loopback), the dev keys it signs with,
//! the private PostgreSQL cluster `cargo run` starts, the demo data, the fuzzing entry points
//! and the writers of the providers' bills (the sandbox's downloads, tests, the benchmark).
//! Rank 7 (ARCHITECTURE.md, "Layers"); only the binary's wiring uses it.

pub mod bill_writers;
pub mod dev_pg;
pub mod devkeys;
pub mod fuzzing;
pub mod sandbox;
pub mod sandbox_server;
pub mod seed;
pub mod stories;

// The lower layers, under the names every crate of the workspace uses (`crate::domain::…`).
#[allow(unused_imports)]
use fitorder_api::{graphql, http};
#[allow(unused_imports)]
use fitorder_base::{auth, config, error, logging, ratelimit, trace};
#[allow(unused_imports)]
use fitorder_capabilities::{
    alerts, anomalies, app, catalog, compensation, expiry, orders, outbox, payments, reconciliation, sessions, tasks,
    ticket_resolution, tickets, timeline, wallet,
};
use fitorder_db as db;
#[allow(unused_imports)]
use fitorder_db::events;
use fitorder_domain as domain;
#[allow(unused_imports)]
use fitorder_providers as providers;
#[allow(unused_imports)]
use fitorder_providers::miniprogram;
