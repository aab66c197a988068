//! Reconciliation: every morning, the providers' bills against the books.
//!
//! A run streams the bill (bounded memory) into the `bill_rows` staging table with COPY, and
//! only when the whole file parsed and its summary lines agree does it match — in SQL, set-based
//! — against the local payments and refunds. Each difference opens a ticket keyed by what it is,
//! so re-running a day opens nothing new. Runs of one provider and day never overlap (a unique
//! index on running runs).
//!
//! The files: `run.rs` a run's lifecycle (its row, task, heartbeat and outcome), `fetch.rs` the
//! bill fetched and unpacked, `load.rs` the COPY into the staging table, `matching.rs` the
//! findings in SQL, `healing.rs` what a run settles by itself, `schedule.rs` the daily run and
//! the WAITING days; the statements are in `sql/`, the bills' parsers in [`bills`].

use crate::providers::bills;
mod fetch;
mod healing;
mod load;
mod matching;
mod run;
mod schedule;

use std::path::{Path, PathBuf};

use chrono::NaiveDate;
use diesel::sql_types::BigInt;

use crate::domain::Provider;
pub use healing::{healing, REFUNDED_LOST_ORDER};
pub use run::{run, HEARTBEAT_SECS, RUN_LEASE_SECS, WAITING_NOTE};
pub use schedule::{
    configured_providers, daily, retry_waiting, retry_waiting_at, CATCH_UP_DAYS, WAIT_RETRY_SECS, WAIT_UNTIL,
};

/// Where the bill of `provider` for `date` is found (`wechatpay-2024-05-01.csv`).
pub fn statement_path(dir: &Path, provider: Provider, date: NaiveDate) -> PathBuf {
    dir.join(format!("{}-{}.csv", provider.short_name(), date.format("%Y-%m-%d")))
}

#[derive(diesel::QueryableByName)]
struct N {
    #[diesel(sql_type = BigInt)]
    n: i64,
}
