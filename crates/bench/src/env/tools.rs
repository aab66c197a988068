//! The programs the bench runs: the fitorder binary (built when missing), pgbench, perf.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::{repo_root, target_dir};

pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// `target/production/fitorder` (the deployed build, not the incremental `release`), built if
/// missing (or `FITORDER_BIN`, e.g. the `profiling` build's
/// `target/profiling/fitorder` for perf's line numbers). A binary older than the sources is used
/// but reported, since it would measure other code than what is checked out.
pub fn find_binary() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("FITORDER_BIN").map(PathBuf::from) {
        return Ok(bin);
    }
    let bin = target_dir().join("production").join("fitorder");
    if !bin.exists() {
        say!("building the fitorder production binary (cargo build --profile production) ...");
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args([
                "build",
                "--profile",
                "production",
                "-p",
                "fitorder",
                "--bin",
                "fitorder",
            ])
            .current_dir(repo_root())
            .status()
            .context("running cargo")?;
        if !status.success() || !bin.exists() {
            bail!("cargo build --profile production failed");
        }
    }
    let built = std::fs::metadata(&bin)?.modified()?;
    let newest_source = newest_mtime(&repo_root().join("src"))
        .max(newest_mtime(&repo_root().join("crates")))
        .max(newest_mtime(&repo_root().join("migrations")));
    if newest_source.is_some_and(|t| t > built) {
        println!(
            "warning: {} is older than the sources; run `cargo build --profile production` to measure the current code",
            bin.display()
        );
    }
    Ok(bin)
}

fn newest_mtime(dir: &Path) -> Option<std::time::SystemTime> {
    let mut newest = None;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).ok()?.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(t) = e.metadata().and_then(|m| m.modified()) {
                newest = newest.max(Some(t));
            }
        }
    }
    newest
}

/// `pgbench` from PATH or from the PostgreSQL server packages.
pub fn pgbench() -> Result<PathBuf> {
    if let Some(p) = which("pgbench") {
        return Ok(p);
    }
    if let Ok(dirs) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut found: Vec<PathBuf> = dirs
            .flatten()
            .map(|d| d.path().join("bin/pgbench"))
            .filter(|p| p.is_file())
            .collect();
        found.sort();
        if let Some(p) = found.pop() {
            return Ok(p);
        }
    }
    bail!("pgbench is needed for the B1/B2 baseline: apt-get install postgresql-contrib (or postgresql)")
}
