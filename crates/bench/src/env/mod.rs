//! What every benchmark needs around it: the fitorder binary, databases on the local PostgreSQL,
//! child processes that are always stopped, provider dev keys, a no-op downstream, and the
//! machine's description for the report. One module per seam; the names are re-exported here.

mod bench;
mod cpu;
mod machine;
mod noop;
mod pg;
mod procs;
mod tools;

use std::path::{Path, PathBuf};

pub use bench::{child_env, perf_stop, Bench, Server, METRICS_TOKEN};
pub use cpu::CpuSplit;
pub use machine::Machine;
pub use pg::connect;
pub use procs::{measure_helper, run_measured, Proc, MEASURE_ARG};
pub use tools::{pgbench, which};

/// Every database this tool creates starts with this, so leftovers are easy to find and drop.
pub const DB_PREFIX: &str = "fitorder_bench_";

pub fn repo_root() -> PathBuf {
    // This crate is crates/bench.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}
