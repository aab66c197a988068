//! Integration tests: one binary (one link on slow machines), a fresh database per test cloned
//! from a migrated template, driving the real GraphQL schema and HTTP router.

mod harness;

mod alerts;
mod bill_fetch;
mod business_limits;
mod catalog_wallet;
mod chaos;
mod check_in;
mod client_vs_standin;
mod compensation;
mod deploy;
mod errors;
mod expiry;
mod failover;
mod fakes;
mod faults;
mod front_desk;
mod front_desk_members;
mod fuzz_corpus;
mod graphql_http;
mod hardening;
mod http_surface;
mod layers;
mod limits_and_roles;
mod listen;
mod logs;
mod memberships;
mod oidc;
mod orders_flow;
mod payments;
mod pgbouncer;
mod place_order;
mod platform_keys;
mod playground;
mod prepaid;
mod production;
mod provider_edges;
mod provider_money;
mod providers;
mod read_replica;
mod reconciliation;
mod reconciliation_runs;
mod restore_drill;
mod sandbox_provider;
mod schema_sdl;
mod sdk_crosscheck;
mod security;
mod security_round2;
mod security_round3;
mod settings;
mod signin;
mod standin;
// The bench's counting proxy of the PostgreSQL protocol, shared rather than copied.
#[allow(dead_code)]
#[path = "../../crates/bench/src/sqlcount.rs"]
mod sqlcount;
mod standin_bills;
mod start_payment;
mod state_machine;
mod statement_cache;
mod vocabulary;
mod ws;
