//! fitorder: the order backend of a chain of AI fitness studios.
//!
//! `domain` holds the pure rules (the state machine, money); `orders`, `catalog` and
//! `compensation` the capabilities; `graphql` and `http` the API; `db` the database.

pub mod alerts;
pub mod anomalies;
pub mod app;
pub mod auth;
pub mod catalog;
pub mod compensation;
pub mod config;
pub mod db;
pub mod domain;
pub mod error;
pub mod events;
pub mod expiry;
pub mod fuzzing;
pub mod graphql;
pub mod http;
pub mod logging;
pub mod miniprogram;
pub mod orders;
pub mod outbox;
pub mod payments;
pub mod ratelimit;
pub mod reconciliation;
pub mod seed;
pub mod server;
pub mod sessions;
pub mod tasks;
pub mod ticket_resolution;
pub mod tickets;
pub mod timeline;
pub mod trace;
pub mod wallet;
