//! What every benchmark needs around it: the fitorder binary, databases on the local PostgreSQL,
//! child processes that are always stopped, provider dev keys, a no-op downstream, and the
//! machine's description for the report.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fitorder::payments::devkeys::DevKeys;
use tokio_postgres::{Client, NoTls};

use crate::Args;

/// Every database this tool creates starts with this, so leftovers are easy to find and drop.
pub const DB_PREFIX: &str = "fitorder_bench_";

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/ lives inside the repository")
        .to_path_buf()
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL
// ---------------------------------------------------------------------------------------------

/// Connects and drives the connection on the runtime; the client is all callers keep.
pub async fn connect(url: &str) -> Result<Client> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("connecting to {}", fitorder::db::redact(url)))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// The server named by BENCH_DATABASE_URL; databases are made next to its maintenance database.
pub struct Pg {
    pub base: String,
}

impl Pg {
    /// `base` with its database replaced by `db` (query parameters kept).
    pub fn url(&self, db: &str) -> String {
        let scheme_end = self.base.find("://").map(|i| i + 3).unwrap_or(0);
        let (head, query) = match self.base.find('?') {
            Some(q) => (&self.base[..q], &self.base[q..]),
            None => (&self.base[..], ""),
        };
        let host_end = head[scheme_end..]
            .find('/')
            .map(|i| scheme_end + i)
            .unwrap_or(head.len());
        format!("{}/{db}{query}", &head[..host_end])
    }

    pub async fn admin(&self) -> Result<Client> {
        connect(&self.base).await
    }

    /// Drops `name` if it exists (kicking out its sessions), then creates it, from `template`
    /// when given (a file-level copy: identical data, statistics included).
    pub async fn recreate(&self, name: &str, template: Option<&str>) -> Result<String> {
        let admin = self.admin().await?;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .await?;
        let sql = match template {
            Some(t) => format!("CREATE DATABASE \"{name}\" TEMPLATE \"{t}\""),
            None => format!("CREATE DATABASE \"{name}\""),
        };
        admin.batch_execute(&sql).await.with_context(|| sql.clone())?;
        Ok(self.url(name))
    }

    pub async fn drop_db(&self, name: &str) -> Result<()> {
        let admin = self.admin().await?;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .await?;
        Ok(())
    }

    /// Drops what an earlier, interrupted run left behind.
    pub async fn drop_leftovers(&self) -> Result<()> {
        let admin = self.admin().await?;
        let rows = admin
            .query(
                "SELECT datname FROM pg_database WHERE datname LIKE $1",
                &[&format!("{DB_PREFIX}%")],
            )
            .await?;
        for r in rows {
            let name: String = r.get(0);
            admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .await?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Child processes
// ---------------------------------------------------------------------------------------------

/// A child process that is stopped when dropped: SIGTERM, a grace period, then SIGKILL.
pub struct Proc {
    pub name: String,
    child: Option<std::process::Child>,
    pub log: Option<PathBuf>,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command, log: Option<PathBuf>) -> Result<Proc> {
        if let Some(path) = &log {
            let f = std::fs::File::create(path)?;
            cmd.stdout(f.try_clone()?).stderr(f);
        }
        cmd.stdin(Stdio::null());
        let child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        Ok(Proc {
            name: name.to_string(),
            child: Some(child),
            log,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// `Some(status)` once the child has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// A field of /proc/<pid>/status in KB (VmRSS, VmHWM).
    pub fn status_kb(&self, field: &str) -> Option<u64> {
        status_kb(self.pid(), field)
    }

    pub fn log_tail(&self) -> String {
        self.log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .map(|t| {
                let lines: Vec<&str> = t.lines().collect();
                lines[lines.len().saturating_sub(15)..].join("\n")
            })
            .unwrap_or_default()
    }

    /// Sends `signal`, waits up to `grace` for the exit, then kills.
    pub fn stop_with(&mut self, signal: i32, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        // SAFETY: kill(2) on the pid of a child we have not reaped yet.
        unsafe {
            libc::kill(child.id() as i32, signal);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("{} did not stop within {:?}: killed", self.name, grace);
        let _ = child.kill();
        let _ = child.wait();
    }

    pub fn stop(&mut self) {
        self.stop_with(libc::SIGTERM, Duration::from_secs(5));
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A field of /proc/<pid>/status in KB.
pub fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// How a child ran to its end.
pub struct Measured {
    pub status: std::process::ExitStatus,
    /// Peak resident set, KB (wait4's ru_maxrss).
    pub peak_kb: u64,
    pub wall: Duration,
    /// User + system CPU seconds of the child.
    pub cpu: f64,
}

/// The hidden first argument that makes this binary the measuring helper of [`run_measured`].
pub const MEASURE_ARG: &str = "__measure-child";

/// Runs `cmd` to the end and measures it with wait4(2). Blocking: call from spawn_blocking.
///
/// The child is started by a fresh, small copy of this binary (the helper below), not by this
/// process: a child's ru_maxrss also counts the memory of the process it was forked from until
/// its exec (Linux keeps the old mm's high-water mark), and this process may hold hundreds of MB
/// (a million bill rows) at that moment.
pub fn run_measured(cmd: &Command, stdout: std::fs::File, stderr: std::fs::File, tmp: &Path) -> Result<Measured> {
    use std::os::unix::process::ExitStatusExt;
    let report = tmp.join(format!("measure-{}.txt", rand::random::<u32>()));
    let mut helper = Command::new(std::env::current_exe()?);
    helper
        .arg(MEASURE_ARG)
        .arg(&report)
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
    if let Some(dir) = cmd.get_current_dir() {
        helper.current_dir(dir);
    }
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => helper.env(k, v),
            None => helper.env_remove(k),
        };
    }
    let status = helper.status().context("starting the measuring helper")?;
    let text = std::fs::read_to_string(&report).with_context(|| format!("the measuring helper failed ({status})"))?;
    let _ = std::fs::remove_file(&report);
    let f: Vec<f64> = text.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    if f.len() != 4 {
        bail!("unreadable measurement {text:?}");
    }
    Ok(Measured {
        status: std::process::ExitStatus::from_raw(f[0] as i32),
        peak_kb: f[1] as u64,
        wall: Duration::from_secs_f64(f[2]),
        cpu: f[3],
    })
}

/// The helper: `fitorder-bench __measure-child <report> <program> <args…>` runs the program
/// and writes "<wait status> <ru_maxrss KB> <wall s> <cpu s>" to <report>.
pub fn measure_helper(args: &[String]) -> i32 {
    let (Some(report), Some(program)) = (args.first(), args.get(1)) else {
        eprintln!("usage: {MEASURE_ARG} <report> <program> [args…]");
        return 2;
    };
    let started = Instant::now();
    let child = match Command::new(program).args(&args[2..]).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("starting {program}: {e}");
            return 127;
        }
    };
    let pid = child.id() as i32;
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our unreaped child (std's Child never reaps behind our back); status and
    // usage are valid for writes. The Child is forgotten so that nothing touches the reaped pid.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = started.elapsed();
    std::mem::forget(child);
    if r != pid {
        eprintln!("wait4: {}", std::io::Error::last_os_error());
        return 1;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let line = format!(
        "{status} {} {} {}\n",
        usage.ru_maxrss,
        wall.as_secs_f64(),
        secs(usage.ru_utime) + secs(usage.ru_stime)
    );
    if std::fs::write(report, line).is_err() {
        return 1;
    }
    0
}

/// CPU seconds (user + system) of a process, its reaped children included.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The command name may contain spaces; fields are counted after its closing parenthesis.
    let Some(rest) = text.rfind(')').map(|i| &text[i + 2..]) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime 14, stime 15, cutime 16, cstime 17.
    let get = |i: usize| f.get(i - 3).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (get(14) + get(15) + get(16) + get(17)) / ticks
}

/// CPU seconds of every PostgreSQL process on the machine. Backends that exited are in their
/// postmaster's reaped-children time, so the sum is monotonic and deltas are meaningful.
pub fn postgres_cpu_seconds() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "postgres"))
        .map(cpu_seconds)
        .sum()
}

/// Where the CPU went during a phase: the process under test, PostgreSQL, the load generator.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSplit {
    pub subject: f64,
    pub postgres: f64,
    pub bench: f64,
    /// Busy CPU seconds of the whole machine (all processes, the kernel's own work included).
    pub machine: f64,
}

/// Busy CPU seconds of the whole machine since boot, from /proc/stat.
fn machine_busy_seconds() -> f64 {
    let Ok(text) = std::fs::read_to_string("/proc/stat") else {
        return 0.0;
    };
    let v: Vec<f64> = text
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 5 {
        return 0.0;
    }
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (v.iter().sum::<f64>() - v[3] - v[4]) / ticks
}

impl CpuSplit {
    pub fn sample(subject_pid: u32) -> CpuSplit {
        CpuSplit {
            subject: if subject_pid > 0 { cpu_seconds(subject_pid) } else { 0.0 },
            postgres: postgres_cpu_seconds(),
            bench: cpu_seconds(std::process::id()),
            machine: machine_busy_seconds(),
        }
    }

    pub fn since(&self, earlier: &CpuSplit) -> CpuSplit {
        CpuSplit {
            subject: self.subject - earlier.subject,
            postgres: self.postgres - earlier.postgres,
            bench: self.bench - earlier.bench,
            machine: self.machine - earlier.machine,
        }
    }

    /// `subject` empty: nothing under test runs outside the bench process (a baseline client).
    pub fn describe(&self, subject: &str, wall: Duration) -> String {
        let w = wall.as_secs_f64().max(1e-9);
        let part = |name: &str, secs: f64| format!("{name} {secs:.1} s ({:.0} % of a core)", 100.0 * secs / w);
        let mut parts = vec![];
        if !subject.is_empty() {
            parts.push(part(subject, self.subject));
        }
        parts.push(part("PostgreSQL", self.postgres));
        parts.push(part(
            if subject.is_empty() {
                "bench process (the client)"
            } else {
                "load generator"
            },
            self.bench,
        ));
        // Whatever else ran meanwhile (another build or test run would show here).
        let other = (self.machine - self.subject - self.postgres - self.bench).max(0.0);
        parts.push(part("everything else", other));
        format!("CPU over {w:.1} s wall: {}", parts.join(", "))
    }
}

// ---------------------------------------------------------------------------------------------
// The no-op downstream
// ---------------------------------------------------------------------------------------------

/// A local HTTP endpoint that answers every request 200 `{}`: the door / AI-device services
/// for B6 and for the baseline client loop, counting what it received.
pub struct Noop {
    pub url: String,
    pub hits: Arc<AtomicU64>,
    pub first_hit: Arc<Mutex<Option<Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct NoopState {
    hits: Arc<AtomicU64>,
    first_hit: Arc<Mutex<Option<Instant>>>,
}

async fn noop_handler(
    axum::extract::State(s): axum::extract::State<NoopState>,
    _body: bytes::Bytes,
) -> impl axum::response::IntoResponse {
    if s.hits.fetch_add(1, Ordering::Relaxed) == 0 {
        *s.first_hit.lock().expect("not poisoned") = Some(Instant::now());
    }
    ([(axum::http::header::CONTENT_TYPE, "application/json")], "{}")
}

impl Noop {
    pub async fn start() -> Result<Noop> {
        let hits = Arc::new(AtomicU64::new(0));
        let first_hit = Arc::new(Mutex::new(None));
        let state = NoopState {
            hits: hits.clone(),
            first_hit: first_hit.clone(),
        };
        let app = axum::Router::new().fallback(noop_handler).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Noop {
            url: format!("http://{addr}"),
            hits,
            first_hit,
            task,
        })
    }

    pub fn reset(&self) {
        self.hits.store(0, Ordering::Relaxed);
        *self.first_hit.lock().expect("not poisoned") = None;
    }

    pub fn first_hit(&self) -> Option<Instant> {
        *self.first_hit.lock().expect("not poisoned")
    }
}

impl Drop for Noop {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// The machine
// ---------------------------------------------------------------------------------------------

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
    async fn describe(pg: &Pg) -> Result<Machine> {
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

/// The fraction of all cores' time spent busy over `window` (from /proc/stat): other work on
/// the machine (a build, a test run) would distort every figure, so it is reported.
pub async fn busy_fraction(window: Duration) -> f64 {
    fn sample() -> Option<(u64, u64)> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        let v: Vec<u64> = text
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal
        let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
        Some((v.iter().take(8).sum(), idle))
    }
    let Some((t0, i0)) = sample() else { return 0.0 };
    tokio::time::sleep(window).await;
    let Some((t1, i1)) = sample() else { return 0.0 };
    let total = t1.saturating_sub(t0).max(1) as f64;
    1.0 - i1.saturating_sub(i0) as f64 / total
}

// ---------------------------------------------------------------------------------------------
// The bench
// ---------------------------------------------------------------------------------------------

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
    pub sandbox: fitorder::payments::sandbox_server::SandboxProvider,
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
        let sandbox = fitorder::payments::sandbox_server::SandboxProvider::start(
            fitorder::payments::devkeys::dev_sandbox_keys(&keys),
            "127.0.0.1:0",
        )
        .await?;
        pg.drop_leftovers().await?;
        let template = format!("{DB_PREFIX}template");
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

    pub fn db_name(&self, suffix: &str) -> String {
        format!("{DB_PREFIX}{suffix}")
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
            .env("FITORDER_STATEMENT_DIR", self.tmp.join("statements"))
            .env("FITORDER_DOOR_ACCESS_URL", format!("{}/door-access", self.noop.url))
            .env("FITORDER_AI_ACCESS_URL", format!("{}/ai-access", self.noop.url))
            .envs(keys.sandbox_env(&self.sandbox.wechat_api_base(), &self.sandbox.alipay_gateway()));
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
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.port()
        };
        let mut cmd = self.fitorder(db_url, &["serve", "--no-workers"]);
        cmd.env("FITORDER_ADDR", format!("127.0.0.1:{port}"));
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

pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// `target/release/fitorder`, built if missing. A binary older than the sources is used but
/// reported, since it would measure other code than what is checked out.
fn find_binary() -> Result<PathBuf> {
    let bin = target_dir().join("release").join("fitorder");
    if !bin.exists() {
        say!("building the fitorder release binary (cargo build --release) ...");
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--release", "-p", "fitorder", "--bin", "fitorder"])
            .current_dir(repo_root())
            .status()
            .context("running cargo")?;
        if !status.success() || !bin.exists() {
            bail!("cargo build --release failed");
        }
    }
    let built = std::fs::metadata(&bin)?.modified()?;
    let newest_source = newest_mtime(&repo_root().join("src")).max(newest_mtime(&repo_root().join("migrations")));
    if newest_source.is_some_and(|t| t > built) {
        println!(
            "warning: {} is older than the sources; run `cargo build --release` to measure the current code",
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
