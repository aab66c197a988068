//! The machine and the PostgreSQL server, described for the report.

use std::process::Command;
use std::time::Duration;

use anyhow::Result;

use super::cpu::busy_fraction;
use super::pg::Pg;
use super::repo_root;

pub struct Machine {
    pub date: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub cpu: String,
    pub kernel: String,
    pub pg_version: String,
    pub pg_settings: Vec<(String, String)>,
    pub commit: String,
    /// How busy the machine was with other work in the second before the run (0..1).
    pub busy_before: f64,
}

impl Machine {
    pub async fn describe(pg: &Pg) -> Result<Machine> {
        let admin = pg.admin().await?;
        let version: String = admin.query_one("SELECT version()", &[]).await?.get(0);
        let mut pg_settings = vec![];
        for name in [
            "shared_buffers",
            "synchronous_commit",
            "fsync",
            "wal_level",
            "max_connections",
            "work_mem",
        ] {
            let v: String = admin.query_one(&format!("SHOW {name}"), &[]).await?.get(0);
            pg_settings.push((name.to_string(), v));
        }
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kb: f64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let git = |args: &[&str]| {
            Command::new("git")
                .args(args)
                .current_dir(repo_root())
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        let commit = match git(&["rev-parse", "--short", "HEAD"]) {
            Some(c) => {
                let dirty = git(&["status", "--porcelain", "--", "src", "migrations"]).is_some_and(|s| !s.is_empty());
                if dirty {
                    format!("{c} + uncommitted changes")
                } else {
                    c
                }
            }
            None => "unknown".into(),
        };
        let busy_before = busy_fraction(Duration::from_secs(1)).await;
        Ok(Machine {
            busy_before,
            date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            memory_gib: mem_kb / 1024.0 / 1024.0,
            cpu,
            kernel,
            pg_version: version,
            pg_settings,
            commit,
        })
    }
}
