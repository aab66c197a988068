//! fitorder's API: the GraphQL schema ([`graphql`], apart from any transport) and the HTTP
//! routes that carry it, the payment callbacks, the ops pages and the metrics ([`http`]).
//! Rank 6 (ARCHITECTURE.md, "Layers").

pub mod graphql;
pub mod http;

// The lower layers, under the names every crate of the workspace uses (`crate::domain::…`).
#[allow(unused_imports)]
use fitorder_base::{auth, bounds, config, error, logging, ratelimit, trace};
#[allow(unused_imports)]
use fitorder_capabilities::{
    alerts, anomalies, app, catalog, compensation, expiry, memberships, orders, outbox, payments, prepaid,
    reconciliation, sales, sessions, slot_cancel, tasks, ticket_resolution, tickets, timeline, wallet,
};
use fitorder_db as db;
#[allow(unused_imports)]
use fitorder_db::events;
use fitorder_domain as domain;
#[allow(unused_imports)]
use fitorder_providers as providers;
#[allow(unused_imports)]
use fitorder_providers::miniprogram;
