//! Integration tests: one binary (one link on slow machines), a fresh database per test cloned
//! from a migrated template, driving the real GraphQL schema and HTTP router.

mod harness;

mod alerts;
mod bill_fetch;
mod catalog_wallet;
mod chaos;
mod check_in;
mod compensation;
mod deploy;
mod expiry;
mod fakes;
mod faults;
mod fuzz_corpus;
mod http_surface;
mod limits_and_roles;
mod logs;
mod orders_flow;
mod payments;
mod pgbouncer;
mod place_order;
mod platform_keys;
mod playground;
mod providers;
mod reconciliation;
mod sandbox_provider;
mod schema_sdl;
mod sdk_crosscheck;
mod security;
mod standin;
mod standin_bills;
mod start_payment;
mod state_machine;
mod ws;
