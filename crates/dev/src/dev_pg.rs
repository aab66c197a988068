//! A private, throw-away PostgreSQL cluster for development and tests.
//!
//! When no `DATABASE_URL` is configured, the service (and the test harness)
//! runs its own cluster under a dedicated directory using the machine's
//! `initdb`/`pg_ctl`. Layout of that directory:
//!
//! ```text
//! <dir>/data/           the cluster (initdb needs an empty directory, so nothing else lives here)
//! <dir>/fitorder.port   TCP port chosen the first time, reused afterwards
//! <dir>/fitorder.lock   flock(2) guarding check/initdb/start against concurrent starters
//! <dir>/postgres.log    server log
//! ```
//!
//! The cluster listens on 127.0.0.1 only, trusts every local connection and
//! runs with durability switched off: it is disposable by design.

use std::fs::{self, OpenOptions};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

const HOW_TO_GET_POSTGRES: &str = "install the PostgreSQL server packages (e.g. `apt-get install postgresql`) \
     so that `initdb` and `pg_ctl` are on PATH or under /usr/lib/postgresql/<version>/bin, \
     or set DATABASE_URL to use an existing database";

/// Handle on the private cluster. Dropping it does *not* stop the server (a handle kept in a
/// `static` is never dropped, and an accidental early drop must not kill a shared cluster);
/// call [`DevPostgres::stop`] explicitly on shutdown.
pub struct DevPostgres {
    dir: PathBuf,
    data: PathBuf,
    port: u16,
    started_by_us: bool,
    bin_dir: PathBuf,
    run_as: Option<RunAs>,
    stopped: AtomicBool,
}

/// PostgreSQL refuses to run as root, so when we are root every `initdb`/`pg_ctl` call drops to
/// this account. It is done with `CommandExt::uid/gid` (setgroups+setgid+setuid in the child)
/// rather than `runuser`/`su`: no dependency on util-linux, no shell quoting, same effect.
struct RunAs {
    name: String,
    uid: u32,
    gid: u32,
}

impl DevPostgres {
    /// Starts (or reuses) the private cluster under `dir`.
    pub fn ensure(dir: &Path) -> Result<DevPostgres> {
        let bin_dir = find_bin_dir(&[])?;
        let run_as = run_as_user()?;
        let dir = prepare_dir(dir, run_as.as_ref())?;
        let data = dir.join("data");

        // Held until the end of this function: a second starter waits here and then finds the
        // cluster running, instead of racing us through initdb or `pg_ctl start`.
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("fitorder.lock"))?;
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error()).context("locking fitorder.lock");
        }

        let mut pg = DevPostgres {
            dir,
            data,
            port: 0,
            started_by_us: false,
            bin_dir,
            run_as,
            stopped: AtomicBool::new(false),
        };
        if !pg.data.join("PG_VERSION").exists() {
            pg.initdb()?;
        }
        pg.check_major_version()?;
        pg.remove_foreign_pid_file();

        if pg.pg_ctl(&["status"])?.status.code() == Some(0) {
            pg.port = read_running_port(&pg.data)
                .or_else(|| read_port_file(&pg.dir))
                .context("running cluster without a known port")?;
            tracing::info!(
                port = pg.port,
                dir = %pg.dir.display(),
                "reusing running dev PostgreSQL"
            );
        } else {
            pg.port = match read_port_file(&pg.dir) {
                Some(p) if TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok() => p,
                _ => TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port(),
            };
            fs::write(pg.dir.join("fitorder.port"), pg.port.to_string())?;
            pg.start()?;
            pg.started_by_us = true;
        }
        if let Err(e) = wait_for_tcp(pg.port, Duration::from_secs(30)) {
            pg.stop(); // no-op unless we started it: do not leave a half-working server behind
            return Err(e);
        }
        drop(lock);
        Ok(pg)
    }

    /// `postgres://postgres@127.0.0.1:<port>/<db>`
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{}", self.port, db)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn started_by_us(&self) -> bool {
        self.started_by_us
    }

    /// `pg_ctl stop -m fast`, only if this handle started the server; idempotent. Failures are
    /// logged and ignored because this runs on shutdown paths where nothing better can be done.
    pub fn stop(&self) {
        if !self.started_by_us || self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::info!(dir = %self.dir.display(), "stopping dev PostgreSQL");
        match self.pg_ctl(&["stop", "-m", "fast", "-w", "-t", "60"]) {
            Ok(out) if out.status.success() => {}
            Ok(out) => tracing::warn!("pg_ctl stop failed: {}", output_text(&out)),
            Err(e) => tracing::warn!("pg_ctl stop failed: {e:#}"),
        }
    }

    /// `--locale=C.UTF-8` gives Unicode-aware upper/lower; not every libc has it, so fall back to
    /// the plain C locale (initdb empties the data directory itself after a failed attempt).
    fn initdb(&self) -> Result<()> {
        tracing::info!(dir = %self.data.display(), "initializing dev PostgreSQL cluster");
        let mut last = None;
        for locale in ["--locale=C.UTF-8", "--no-locale"] {
            let out = self
                .command("initdb")
                .arg("-D")
                .arg(&self.data)
                .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", locale])
                .output()
                .context("running initdb")?;
            if out.status.success() {
                return Ok(());
            }
            last = Some(output_text(&out));
        }
        bail!(
            "initdb failed for {}: {}",
            self.data.display(),
            last.unwrap_or_default()
        )
    }

    /// A cluster made by another major version cannot be started; say so instead of failing
    /// later with a log excerpt.
    fn check_major_version(&self) -> Result<()> {
        let cluster = fs::read_to_string(self.data.join("PG_VERSION"))?.trim().to_string();
        let out = self.command("pg_ctl").arg("--version").output()?;
        let version = String::from_utf8_lossy(&out.stdout);
        let binaries = version
            .split_whitespace()
            .nth(2)
            .and_then(|v| v.split('.').next())
            .unwrap_or("");
        if !binaries.is_empty() && binaries != cluster {
            bail!(
                "{} was created by PostgreSQL {cluster} but the binaries in {} are version \
                 {binaries}; delete {} to recreate it",
                self.data.display(),
                self.bin_dir.display(),
                self.dir.display()
            );
        }
        Ok(())
    }

    /// pg_ctl/postgres treat a stale postmaster.pid as live if its PID now belongs to some other
    /// process, which is common after a container restart. Drop it when that PID is not postgres.
    fn remove_foreign_pid_file(&self) {
        let pid_file = self.data.join("postmaster.pid");
        let Some(pid) = fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.lines().next()?.trim().parse::<u32>().ok())
        else {
            return;
        };
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if !comm.is_empty() && !comm.starts_with("postgres") {
            tracing::info!(pid, "removing stale postmaster.pid (PID now used by {:?})", comm.trim());
            let _ = fs::remove_file(pid_file);
        }
    }

    fn start(&self) -> Result<()> {
        // Unix socket paths are limited to ~107 bytes; fall back to /tmp for deep directories.
        let sock_dir = if self.dir.as_os_str().len() < 80 {
            self.dir.to_string_lossy().into_owned()
        } else {
            "/tmp".into()
        };
        // fsync/synchronous_commit/full_page_writes off: this is a disposable dev/test cluster, so
        // crash safety is traded for speed. pg_ctl hands `-o` to /bin/sh, hence the quoting.
        let opts = format!(
            "-p {} -h 127.0.0.1 -k {} -c fsync=off -c synchronous_commit=off \
             -c full_page_writes=off -c max_connections=300 -c shared_buffers=128MB",
            self.port,
            sh_quote(&sock_dir)
        );
        let log = self.dir.join("postgres.log");
        tracing::info!(port = self.port, dir = %self.dir.display(), "starting dev PostgreSQL");
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", "60", "-o", &opts, "start"])
            .output()
            .context("running pg_ctl start")?;
        if !out.status.success() {
            let text = fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(15)..].join("\n");
            bail!(
                "pg_ctl start failed: {}\n--- tail of {} ---\n{tail}",
                output_text(&out),
                log.display()
            );
        }
        Ok(())
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<Output> {
        self.command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(args)
            .output()
            .context("running pg_ctl")
    }

    fn command(&self, bin: &str) -> Command {
        pg_command(&self.bin_dir.join(bin), self.run_as.as_ref())
    }
}

fn pg_command(program: &Path, run_as: Option<&RunAs>) -> Command {
    let mut cmd = Command::new(program);
    // A neutral cwd: the caller's cwd (e.g. /root) may be unreadable for the postgres user.
    cmd.current_dir("/");
    if let Some(u) = run_as {
        cmd.uid(u.uid).gid(u.gid).env("USER", &u.name).env("LOGNAME", &u.name);
    }
    cmd
}

/// The account PostgreSQL must run as: none unless this process is root (PostgreSQL refuses
/// root), then `postgres`, or `nobody`.
fn run_as_user() -> Result<Option<RunAs>> {
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let user = lookup_user("postgres").or_else(|| lookup_user("nobody"));
    Ok(Some(user.context(
        "running as root, but no `postgres`/`nobody` user to run PostgreSQL as",
    )?))
}

/// The directory of the PostgreSQL server's binaries, found as [`DevPostgres::ensure`] finds
/// its own, that also holds `also` (`pg_basebackup`), for other clusters made the same way
/// (the read-replica test's and B5r's standby).
pub fn server_bin_dir(also: &[&str]) -> Result<PathBuf> {
    find_bin_dir(also)
}

/// The (uid, gid) PostgreSQL's commands must run as here, as [`DevPostgres::ensure`] runs them:
/// none unless this process is root.
pub fn server_account() -> Result<Option<(u32, u32)>> {
    Ok(run_as_user()?.map(|u| (u.uid, u.gid)))
}

/// PATH first (respects whatever the developer chose), then the newest Debian-style
/// `/usr/lib/postgresql/<major>/bin`. A candidate must hold both `initdb` and `pg_ctl` and
/// `pg_ctl --version` must actually run; and it must hold `also`.
fn find_bin_dir(also: &[&str]) -> Result<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    let mut versioned: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.path().join("bin"))))
        .collect();
    versioned.sort_by_key(|v| std::cmp::Reverse(v.0));
    candidates.extend(versioned.into_iter().map(|(_, p)| p));
    let is_exe = |p: PathBuf| {
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    candidates
        .into_iter()
        .find(|d| {
            is_exe(d.join("initdb"))
                && is_exe(d.join("pg_ctl"))
                && also.iter().all(|b| is_exe(d.join(b)))
                && Command::new(d.join("pg_ctl"))
                    .arg("--version")
                    .output()
                    .map(|o| o.status.success())
                    .unwrap_or(false)
        })
        .ok_or_else(|| anyhow!("no PostgreSQL server binaries (initdb, pg_ctl) found: {HOW_TO_GET_POSTGRES}"))
}

/// Creates `dir` (absolute) and, when running as root, hands it and every parent we created
/// to the run-as user, then verifies that user can really reach it.
fn prepare_dir(dir: &Path, run_as: Option<&RunAs>) -> Result<PathBuf> {
    let dir = std::path::absolute(dir)?;
    let created: Vec<PathBuf> = dir
        .ancestors()
        .take_while(|a| !a.exists())
        .map(Path::to_path_buf)
        .collect();
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let data = dir.join("data");
    if !data.exists() {
        fs::DirBuilder::new().mode(0o700).create(&data)?;
    }
    if let Some(u) = run_as {
        // `dir` itself must be writable by the server (log file, unix socket), so it is always
        // chowned; it is meant to be dedicated to this cluster.
        for p in created
            .iter()
            .map(PathBuf::as_path)
            .chain([dir.as_path(), data.as_path()])
        {
            std::os::unix::fs::chown(p, Some(u.uid), Some(u.gid))
                .with_context(|| format!("chown {} to {}", p.display(), u.name))?;
        }
        let ok = pg_command(Path::new("test"), Some(u))
            .arg("-w")
            .arg(&dir)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            let mut ancestors: Vec<&Path> = dir.ancestors().collect();
            ancestors.reverse();
            let why = match ancestors.into_iter().find(|a| !traversable(a, u)) {
                Some(b) => format!(
                    "it cannot traverse {} (mode {:o}); `chmod o+x` it or use a directory \
                     elsewhere (e.g. under /tmp)",
                    b.display(),
                    b.metadata().map(|m| m.mode() & 0o7777).unwrap_or(0)
                ),
                None => "it cannot write there".to_string(),
            };
            bail!(
                "running as root, so PostgreSQL must run as user `{}`, but {} is unusable for it: \
                 {why}; or set DATABASE_URL to use an existing database",
                u.name,
                dir.display()
            );
        }
    }
    Ok(dir)
}

/// Permission-bit check (owner, primary group, other) used only to name the culprit in errors.
fn traversable(p: &Path, u: &RunAs) -> bool {
    let Ok(m) = p.metadata() else { return false };
    let bits = if m.uid() == u.uid {
        0o100
    } else if m.gid() == u.gid {
        0o010
    } else {
        0o001
    };
    m.mode() & bits != 0
}

fn lookup_user(name: &str) -> Option<RunAs> {
    let cname = std::ffi::CString::new(name).ok()?;
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let rc = unsafe { libc::getpwnam_r(cname.as_ptr(), &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result) };
    (rc == 0 && !result.is_null()).then(|| RunAs {
        name: name.to_string(),
        uid: pwd.pw_uid,
        gid: pwd.pw_gid,
    })
}

/// Line 4 of postmaster.pid is the port the running server listens on.
fn read_running_port(data: &Path) -> Option<u16> {
    fs::read_to_string(data.join("postmaster.pid"))
        .ok()?
        .lines()
        .nth(3)?
        .trim()
        .parse()
        .ok()
}

fn read_port_file(dir: &Path) -> Option<u16> {
    fs::read_to_string(dir.join("fitorder.port")).ok()?.trim().parse().ok()
}

fn wait_for_tcp(port: u16, timeout: Duration) -> Result<()> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + timeout;
    while TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
        if Instant::now() > deadline {
            bail!("dev PostgreSQL is not accepting connections on {addr}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .trim()
    .to_string()
}
