//! fitorder's API: the GraphQL schema ([`graphql`], apart from any transport) and the HTTP
//! routes that carry it, the payment callbacks, the ops pages and the metrics ([`http`]).
//! Rank 6 (ARCHITECTURE.md, "Layers").

pub mod graphql;
pub mod http;

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
