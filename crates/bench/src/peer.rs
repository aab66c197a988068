//! B6's peer: graphile-worker (npm, pinned in crates/bench/peer/package.json and its lock) delivering
//! the same HTTP calls as fitorder's outbox worker, as jobs on the same PostgreSQL server, in
//! its own database. `crates/bench/peer/deliver.mjs` adds the jobs (not timed) and runs the worker;
//! the bench times it as it times fitorder's: from the first request reaching the no-op
//! downstream until no job is left in `graphile_worker._private_jobs`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::env::{connect, repo_root, which, Bench, CpuSplit, Proc};
use crate::load::Prepared;

/// Jobs run at once by the peer, and the jobs it fetches (and locks) per round trip: the
/// settings graphile-worker's performance guide gives for many small, fast jobs.
pub const CONCURRENCY: usize = 16;
pub const LOCAL_QUEUE: usize = 256;

pub struct PeerRun {
    pub version: String,
    pub node: String,
    pub rate: f64,
    pub secs: f64,
    pub hits: u64,
    pub cpu: CpuSplit,
    pub wall: Duration,
}

fn peer_dir() -> PathBuf {
    repo_root().join("crates/bench/peer")
}

/// `npm ci` when node_modules is missing or older than the lock.
fn install() -> Result<()> {
    let dir = peer_dir();
    let lock = dir.join("package-lock.json");
    let installed = dir.join("node_modules").join(".package-lock.json");
    let fresh = match (std::fs::metadata(&lock), std::fs::metadata(&installed)) {
        (Ok(l), Ok(i)) => i.modified()? >= l.modified()?,
        _ => false,
    };
    if fresh {
        return Ok(());
    }
    let npm = which("npm").context("B6's peer needs Node.js and npm (apt-get install nodejs npm)")?;
    say!("B6 peer: npm ci in {} ...", dir.display());
    let out = Command::new(npm)
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(&dir)
        .output()
        .context("running npm ci")?;
    if !out.status.success() {
        bail!(
            "npm ci failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn version() -> String {
    let path = peer_dir().join("node_modules/graphile-worker/package.json");
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["version"].as_str().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// Delivers `requests` (the very requests fitorder's worker made) through graphile-worker.
pub async fn run(bench: &mut Bench, requests: &[Prepared]) -> Result<PeerRun> {
    tokio::task::spawn_blocking(install).await??;
    let node = which("node").context("B6's peer needs Node.js")?;
    let node_version = Command::new(&node)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let url = bench.create_db("graphile", None).await?;
    let jobs = bench.tmp.join("peer-requests.json");
    {
        let list: Vec<serde_json::Value> = requests
            .iter()
            .map(|r| {
                serde_json::json!({
                    "url": r.url,
                    "headers": r.headers.iter().map(|(k, v)| [k, v]).collect::<Vec<_>>(),
                    "body": String::from_utf8_lossy(&r.body),
                })
            })
            .collect();
        std::fs::write(&jobs, serde_json::to_vec(&list)?)?;
    }
    let script = peer_dir().join("deliver.mjs");
    say!("B6 peer: adding {} jobs to graphile-worker ...", requests.len());
    let out = Command::new(&node)
        .arg(&script)
        .args(["add", &url])
        .arg(&jobs)
        .current_dir(peer_dir())
        .output()
        .context("running the peer's add")?;
    if !out.status.success() {
        bail!(
            "the peer could not add its jobs: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let db = connect(&url).await?;
    db.batch_execute("VACUUM ANALYZE").await?;
    db.batch_execute("CHECKPOINT").await?;
    let queued: i64 = db
        .query_one("SELECT count(*) FROM graphile_worker._private_jobs", &[])
        .await?
        .get(0);
    if queued != requests.len() as i64 {
        bail!("the peer queued {queued} jobs, not {}", requests.len());
    }

    say!("B6 peer: graphile-worker {} delivering ...", version());
    bench.noop.reset();
    let mut cmd = Command::new(&node);
    cmd.arg(&script)
        .args(["work", &url, &CONCURRENCY.to_string(), &LOCAL_QUEUE.to_string()])
        .current_dir(peer_dir());
    let spawned = Instant::now();
    let mut worker = Proc::spawn("graphile-worker", cmd, Some(bench.tmp.join("graphile-worker.log")))?;
    let cpu0 = CpuSplit::sample(worker.pid());
    let n = requests.len() as i64;
    let mut last = (0, Instant::now());
    loop {
        let hits = bench.noop.hits.load(Ordering::Relaxed);
        if hits >= n as u64 {
            break;
        }
        if hits != last.0 {
            last = (hits, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(30) {
            bail!(
                "graphile-worker stopped delivering at {hits} of {n}:\n{}",
                worker.log_tail()
            );
        }
        if let Some(st) = worker.exited() {
            bail!("graphile-worker exited ({st}):\n{}", worker.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left: i64 = db
            .query_one("SELECT count(*) FROM graphile_worker._private_jobs", &[])
            .await?
            .get(0);
        if left == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!("{left} jobs still there a minute after the downstream got them all");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let done = Instant::now();
    let cpu1 = CpuSplit::sample(worker.pid());
    worker.stop();
    drop(db);
    let name = bench.db_name("graphile");
    bench.pg.drop_db(&name).await?;
    let first = bench.noop.first_hit().unwrap_or(spawned);
    let secs = (done - first).as_secs_f64();
    Ok(PeerRun {
        version: version(),
        node: node_version,
        rate: n as f64 / secs,
        secs,
        hits: bench.noop.hits.load(Ordering::Relaxed),
        cpu: cpu1.since(&cpu0),
        wall: done - spawned,
    })
}
