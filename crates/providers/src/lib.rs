//! The payment providers' clients: WeChat Pay and Alipay (their keys, certificates, signatures,
//! trades, refunds, bills and notifications), one trait for both ([`api::ProviderApi`]), and
//! WeChat's mini-program API that members sign in with. Rank 3 (ARCHITECTURE.md, "Layers").

pub mod alipay;
pub mod api;
pub mod bills;
pub mod crypto;
pub mod keys;
pub mod miniprogram;
pub mod platform_keys;
pub mod provider;
pub mod sampling;
pub mod seen;
pub mod wechat;

pub use provider::{evidence_header, evidence_text, Notice};

// The lower layers, under the names every crate of the workspace uses (`crate::domain::…`).
#[allow(unused_imports)]
use fitorder_base::{auth, config, error, logging, ratelimit, trace};
use fitorder_db as db;
#[allow(unused_imports)]
use fitorder_db::events;
use fitorder_domain as domain;
// The bill writers of `fitorder-dev`, compiled into this crate's tests (`bills::write`), name
// the bills as any other crate does.
#[cfg(test)]
extern crate self as fitorder_providers;
