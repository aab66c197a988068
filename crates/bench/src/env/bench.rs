//! The bench: the fitorder binary under test, the databases, the provider sandbox, the servers.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fitorder::dev::devkeys::DevKeys;

use super::machine::Machine;
use super::noop::Noop;
use super::pg::Pg;
use super::procs::Proc;
use super::tools::{find_binary, which};
use super::{target_dir, DB_PREFIX};
use crate::Args;

/// `FITORDER_METRICS_TOKEN` of the servers the bench starts (outside development mode
/// `/metrics` on the API port needs it).
pub const METRICS_TOKEN: &str = "bench-metrics-token";

/// `BENCH_CHILD_ENV`'s `KEY=value` pairs (whitespace between them).
pub fn child_env() -> Vec<(String, String)> {
    std::env::var("BENCH_CHILD_ENV")
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

/// A running fitorder server.
pub struct Server {
    pub proc: Proc,
    pub base: String,
}

pub struct Bench {
    pub pg: Pg,
    pub bin: PathBuf,
    pub tmp: PathBuf,
    pub keys: DevKeys,
    /// WeChat Pay and Alipay on loopback (the development sandbox): the server's providers
    /// are configured whole against it, as a deployment's are against the real ones.
    pub sandbox: fitorder::dev::sandbox_server::SandboxProvider,
    pub jwt_secret: String,
    pub noop: Noop,
    pub machine: Machine,
    /// The migrated, empty database every other one is copied from.
    pub template: String,
    pub perf: bool,
    /// The API database (B1, B2, B5, B7), seeded once per run.
    pub api_url: Option<String>,
    created: Vec<String>,
}

impl Bench {
    pub async fn start(args: &Args) -> Result<Bench> {
        let base = std::env::var("BENCH_DATABASE_URL")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let pg = Pg { base };
        let machine = Machine::describe(&pg)
            .await
            .context("PostgreSQL is not reachable: start it (pg_ctlcluster 15 main start) or set BENCH_DATABASE_URL")?;
        println!(
            "machine: {} cores, {:.1} GiB, {}; {}",
            machine.cores, machine.memory_gib, machine.cpu, machine.pg_version
        );
        if machine.busy_before > 0.15 {
            println!(
                "warning: the machine was {:.0} % busy with other work before the run; the figures will suffer",
                100.0 * machine.busy_before
            );
        }
        if args.perf && which("perf").is_none() {
            bail!("--perf needs perf: apt-get install linux-perf");
        }
        let bin = find_binary()?;
        let tmp = std::env::temp_dir().join(format!("fitorder-bench-{}", std::process::id()));
        std::fs::create_dir_all(&tmp)?;
        let keys_dir = tmp.join("keys");
        let keys = tokio::task::spawn_blocking(move || DevKeys::ensure(&keys_dir)).await??;
        let jwt_secret: String = {
            use rand::Rng;
            let bytes: [u8; 24] = rand::rng().random();
            bytes.iter().map(|b| format!("{b:02x}")).collect()
        };
        let noop = Noop::start().await?;
        let sandbox = fitorder::dev::sandbox_server::SandboxProvider::start(
            fitorder::dev::devkeys::dev_sandbox_keys(&keys),
            "127.0.0.1:0",
        )
        .await?;
        pg.drop_leftovers().await?;
        let template = format!("{DB_PREFIX}{}_template", std::process::id());
        let mut bench = Bench {
            pg,
            bin,
            tmp,
            keys,
            sandbox,
            jwt_secret,
            noop,
            machine,
            template: template.clone(),
            perf: args.perf,
            api_url: None,
            created: vec![],
        };
        let url = bench.create_db("template", None).await?;
        bench.migrate(&url).await?;
        Ok(bench)
    }

    /// Creates `fitorder_bench_<suffix>` (a copy of the migrated template unless `template` is
    /// given) and remembers it for the cleanup. Returns its URL.
    pub async fn create_db(&mut self, suffix: &str, template: Option<&str>) -> Result<String> {
        let name = self.db_name(suffix);
        let url = self.pg.recreate(&name, template).await?;
        if !self.created.contains(&name) {
            self.created.push(name);
        }
        Ok(url)
    }

    /// A fresh migrated database (a copy of the template).
    pub async fn fresh_db(&mut self, suffix: &str) -> Result<String> {
        let template = self.template.clone();
        self.create_db(suffix, Some(&template)).await
    }

    /// `fitorder_bench_<pid>_<suffix>`: runs of the bench side by side on one PostgreSQL (other
    /// worktrees) keep to their own databases.
    pub fn db_name(&self, suffix: &str) -> String {
        format!("{DB_PREFIX}{}_{suffix}", std::process::id())
    }

    pub async fn cleanup(&mut self, keep: bool) {
        if keep {
            println!("kept: databases {} and {}", self.created.join(", "), self.tmp.display());
            return;
        }
        for name in std::mem::take(&mut self.created) {
            if let Err(e) = self.pg.drop_db(&name).await {
                eprintln!("dropping {name}: {e:#}");
            }
        }
        let _ = std::fs::remove_dir_all(&self.tmp);
    }

    /// `fitorder <args>` with a clean environment: the caller's FITORDER_*, provider and
    /// DATABASE_URL variables are removed so that they cannot change what is measured.
    pub fn fitorder(&self, db_url: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args).current_dir(&self.tmp);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().to_string();
            if k.starts_with("FITORDER_")
                || k.starts_with("WECHATPAY_")
                || k.starts_with("ALIPAY_")
                || k == "DATABASE_URL"
            {
                cmd.env_remove(k);
            }
        }
        let keys = &self.keys;
        cmd.env("DATABASE_URL", db_url)
            .env("FITORDER_JWT_SECRET", &self.jwt_secret)
            // Every client of the bench is this one host and one ops token: the production caps
            // per address and per token would measure themselves.
            .env("FITORDER_MAX_CONNECTIONS", "100000")
            .env("FITORDER_MAX_CONNECTIONS_PER_ADDR", "100000")
            .env("FITORDER_MAX_SUBSCRIPTIONS_PER_TOKEN", "1000000")
            .env("FITORDER_METRICS_TOKEN", METRICS_TOKEN)
            .env("FITORDER_STATEMENT_DIR", self.tmp.join("statements"))
            .env("FITORDER_DOOR_ACCESS_URL", format!("{}/door-access", self.noop.url))
            .env("FITORDER_AI_ACCESS_URL", format!("{}/ai-access", self.noop.url))
            .envs(keys.sandbox_env(&self.sandbox.wechat_api_base(), &self.sandbox.alipay_gateway()));
        // An experiment's settings for every child (`BENCH_CHILD_ENV="FITORDER_OUTBOX_BATCH=256
        // FITORDER_OUTBOX_WORKERS=4"`), named in the report's header: the run of record sets none.
        for (k, v) in child_env() {
            cmd.env(k, v);
        }
        cmd
    }

    pub async fn migrate(&self, url: &str) -> Result<()> {
        let out = self
            .fitorder(url, &["migrate"])
            .output()
            .context("running fitorder migrate")?;
        if !out.status.success() {
            bail!("fitorder migrate failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// A token from `fitorder token`, the way an operator would make one.
    pub fn token(&self, role: &str, sub: &str) -> Result<String> {
        let out = self
            .fitorder(
                "postgres://unused",
                &["token", "--role", role, "--sub", sub, "--ttl", "6h"],
            )
            .output()
            .context("running fitorder token")?;
        if !out.status.success() {
            bail!("fitorder token failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Starts `fitorder serve --no-workers` on `db_url` and waits until it answers /healthz.
    /// Workers are off: the outbox is measured on its own (B6), and a worker delivering the
    /// grant events B1 creates would take CPU from the callbacks being measured.
    pub async fn start_server(&self, db_url: &str, label: &str) -> Result<Server> {
        self.start_server_with(db_url, label, &[]).await
    }

    /// [`Bench::start_server`] with more environment (B10's FITORDER_LISTEN_DATABASE_URL).
    pub async fn start_server_with(&self, db_url: &str, label: &str, env: &[(&str, String)]) -> Result<Server> {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.port()
        };
        let mut cmd = self.fitorder(db_url, &["serve", "--no-workers"]);
        cmd.env("FITORDER_ADDR", format!("127.0.0.1:{port}"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut proc = Proc::spawn(label, cmd, Some(self.tmp.join(format!("{label}.log"))))?;
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = proc.exited() {
                bail!("{label} exited ({status}) before answering:\n{}", proc.log_tail());
            }
            if let Ok(r) = http.get(format!("{base}/healthz")).send().await {
                if r.status().is_success() {
                    break;
                }
            }
            if Instant::now() > deadline {
                bail!("{label} did not answer /healthz within 60 s:\n{}", proc.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Server { proc, base })
    }

    /// With --perf: two recordings until [`perf_stop`]: the whole machine without call graphs
    /// (where the CPU goes: fitorder, PostgreSQL, the kernel, the load generator) and the
    /// fitorder process `pid` with DWARF call graphs (which of its functions).
    pub fn perf_attach(&self, pid: u32, label: &str) -> Result<Vec<Proc>> {
        if !self.perf {
            return Ok(vec![]);
        }
        let dir = target_dir().join("bench");
        std::fs::create_dir_all(&dir)?;
        let system = dir.join(format!("perf-{label}-system.data"));
        let process = dir.join(format!("perf-{label}-fitorder.data"));
        let mut a = Command::new("perf");
        a.args(["record", "-a", "-F", "999", "-o"]).arg(&system);
        let mut p = Command::new("perf");
        p.args(["record", "-F", "199", "--call-graph", "dwarf,16384", "-p"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(&process);
        let recs = vec![
            Proc::spawn(
                &format!("perf -a {label}"),
                a,
                Some(self.tmp.join(format!("perf-{label}-a.log"))),
            )?,
            Proc::spawn(
                &format!("perf -p {label}"),
                p,
                Some(self.tmp.join(format!("perf-{label}-p.log"))),
            )?,
        ];
        say!(
            "perf: recording {label} into {} and {}",
            system.display(),
            process.display()
        );
        // perf needs a moment to attach before the load starts.
        std::thread::sleep(Duration::from_millis(700));
        Ok(recs)
    }
}

/// Stops perf recordings so that they write their data (SIGINT is perf's "done").
pub fn perf_stop(recs: Vec<Proc>) {
    for mut p in recs {
        p.stop_with(libc::SIGINT, Duration::from_secs(120));
    }
}

impl Bench {
    /// Drops `fitorder_bench_<pid>_<suffix>` now, if this run made it: a benchmark that is done
    /// with a database leaves nothing for PostgreSQL's background workers to chew on during the
    /// next one.
    pub async fn drop_db_now(&mut self, suffix: &str) {
        let name = self.db_name(suffix);
        if let Some(i) = self.created.iter().position(|n| *n == name) {
            match self.pg.drop_db(&name).await {
                Ok(()) => {
                    self.created.remove(i);
                }
                Err(e) => eprintln!("dropping {name}: {e:#}"),
            }
        }
    }

    /// Waits (at most a minute) until PostgreSQL does nothing of its own: no autovacuum worker
    /// and no other session running a statement, after a CHECKPOINT, so that what the previous
    /// benchmark left behind is not measured with the next. Says how long it waited.
    pub async fn settle(&self, before: &str) -> Result<()> {
        let admin = self.pg.admin().await?;
        admin.batch_execute("CHECKPOINT").await?;
        let started = std::time::Instant::now();
        loop {
            let busy: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                      WHERE pid <> pg_backend_pid()
                        AND (backend_type = 'autovacuum worker'
                             OR (backend_type = 'client backend' AND state = 'active'))",
                    &[],
                )
                .await?
                .get(0);
            if busy == 0 || started.elapsed() > Duration::from_secs(60) {
                if started.elapsed() > Duration::from_secs(1) {
                    say!(
                        "settle: PostgreSQL busy for {:.0} s before {before}",
                        started.elapsed().as_secs_f64()
                    );
                }
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
