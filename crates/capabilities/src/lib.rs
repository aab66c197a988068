//! fitorder's capabilities, one module each, in the order they may use each other
//! (ARCHITECTURE.md, "Layers": rank 4 `app`, rank 5 the rest): the shared state, tickets,
//! alerts, the wallet, the outbox, orders, the catalog, sessions, payments, what closing a
//! ticket does, the outbox's delivery, expiry, reconciliation, the timeline, anomalies and the
//! scheduled tasks.

pub mod alerts;
pub mod anomalies;
pub mod app;
pub mod catalog;
pub mod compensation;
pub mod expiry;
pub mod memberships;
pub mod orders;
pub mod outbox;
pub mod payments;
pub mod prepaid;
pub mod reconciliation;
pub mod sales;
pub mod sessions;
pub mod slot_cancel;
pub mod tasks;
pub mod ticket_resolution;
pub mod tickets;
pub mod timeline;
pub mod wallet;

// The lower layers, under the names every crate of the workspace uses (`crate::domain::…`).
#[allow(unused_imports)]
use fitorder_base::{auth, config, error, logging, ratelimit, trace};
use fitorder_db as db;
#[allow(unused_imports)]
use fitorder_db::events;
use fitorder_domain as domain;
#[allow(unused_imports)]
use fitorder_providers as providers;
#[allow(unused_imports)]
use fitorder_providers::miniprogram;
