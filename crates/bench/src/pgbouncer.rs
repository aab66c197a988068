//! PgBouncer for B10: found on the machine (the newest of those installed), started in
//! transaction pooling in front of one database, stopped by its guard.
//!
//! fitorder's driver (tokio-postgres under diesel-async) uses named protocol-level prepared
//! statements. PgBouncer carries them in transaction pooling only from 1.21 on, with
//! `max_prepared_statements > 0`; Debian 12 ships 1.18, which answers `prepared statement "…"
//! does not exist` as soon as a statement runs on another server connection than the one it
//! was prepared on. Both are run when both are there: the newest for the figure, the older one
//! for a short probe that shows what happens.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::env::{which, Proc};

/// An installed PgBouncer.
#[derive(Clone, Debug)]
pub struct Binary {
    pub path: PathBuf,
    /// "1.24.1"
    pub version: String,
    pub major_minor: (u32, u32),
}

impl Binary {
    /// Transaction pooling with protocol-level prepared statements (`max_prepared_statements`).
    pub fn tracks_prepared_statements(&self) -> bool {
        self.major_minor >= (1, 21)
    }
}

fn probe(path: &Path) -> Option<Binary> {
    let out = Command::new(path).arg("--version").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let version = text.lines().next()?.split_whitespace().nth(1)?.to_string();
    let mut it = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let major_minor = (it.next()?, it.next()?);
    Some(Binary {
        path: std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
        version,
        major_minor,
    })
}

/// Every PgBouncer found (BENCH_PGBOUNCER, PATH, /usr/sbin, /opt/pgbouncer/bin,
/// /usr/local/bin), oldest first, each binary once.
pub fn installed() -> Vec<Binary> {
    let mut candidates: Vec<PathBuf> = vec![];
    if let Some(p) = std::env::var_os("BENCH_PGBOUNCER") {
        candidates.push(PathBuf::from(p));
    }
    candidates.extend(which("pgbouncer"));
    for p in [
        "/usr/sbin/pgbouncer",
        "/opt/pgbouncer/bin/pgbouncer",
        "/usr/local/bin/pgbouncer",
        "/usr/local/sbin/pgbouncer",
    ] {
        candidates.push(PathBuf::from(p));
    }
    let mut found: Vec<Binary> = vec![];
    for c in candidates {
        if let Some(b) = probe(&c) {
            if !found.iter().any(|f| f.path == b.path) {
                found.push(b);
            }
        }
    }
    found.sort_by_key(|b| b.major_minor);
    found
}

/// A running PgBouncer; stopped when dropped.
pub struct Bouncer {
    /// Stops PgBouncer when the bouncer is dropped.
    _proc: Proc,
    pub url: String,
}

/// `postgres://user[:pw]@host:port/db?…` → (user, password, host, port, db).
fn parts(url: &str) -> Result<(String, Option<String>, String, u16, String)> {
    let rest = url.split_once("://").context("not a URL")?.1;
    let (auth, rest) = rest.rsplit_once('@').context("no user in the database URL")?;
    let (user, pw) = match auth.split_once(':') {
        Some((u, p)) => (u.to_string(), Some(p.to_string())),
        None => (auth.to_string(), None),
    };
    let (hostport, db) = rest.split_once('/').context("no database in the URL")?;
    let db = db.split('?').next().unwrap_or_default().to_string();
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), p.parse().context("port")?),
        None => (hostport.to_string(), 5432),
    };
    Ok((user, pw, host, port, db))
}

/// Starts `bin` in front of `db_url` in transaction pooling with `pool_size` server
/// connections, its files in `dir`. Waits until it accepts connections.
pub async fn start(bin: &Binary, db_url: &str, pool_size: usize, dir: &Path, label: &str) -> Result<Bouncer> {
    let (user, pw, host, port, db) = parts(db_url)?;
    std::fs::create_dir_all(dir)?;
    // PgBouncer refuses to run as root: it runs as postgres, which must write its log here.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))?;
    }
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let password = pw.as_deref().map(|p| format!(" password={p}")).unwrap_or_default();
    let prepared = if bin.tracks_prepared_statements() {
        "max_prepared_statements = 200\n"
    } else {
        ""
    };
    let ini = format!(
        "[databases]\n{db} = host={host} port={port} dbname={db} user={user}{password}\n\
         [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =\n\
         auth_type = any\npool_mode = transaction\nmax_client_conn = 500\ndefault_pool_size = {pool_size}\n\
         min_pool_size = {pool_size}\nlogfile = {log}\npidfile = {pid}\n\
         ignore_startup_parameters = extra_float_digits\nserver_reset_query =\n{prepared}",
        log = dir.join(format!("{label}.log")).display(),
        pid = dir.join(format!("{label}.pid")).display(),
    );
    let ini_path = dir.join(format!("{label}.ini"));
    std::fs::write(&ini_path, &ini)?;
    let mut cmd = Command::new(&bin.path);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.args(["-u", "postgres"]);
    }
    cmd.arg(&ini_path);
    let mut proc = Proc::spawn(label, cmd, Some(dir.join(format!("{label}.out"))))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(st) = proc.exited() {
            let log = std::fs::read_to_string(dir.join(format!("{label}.log"))).unwrap_or_default();
            bail!("pgbouncer {} exited ({st}):\n{}{log}", bin.version, proc.log_tail());
        }
        if tokio::net::TcpStream::connect(("127.0.0.1", listen)).await.is_ok() {
            break;
        }
        if Instant::now() > deadline {
            bail!("pgbouncer {} did not listen within 10 s", bin.version);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let auth = match &pw {
        Some(p) => format!("{user}:{p}"),
        None => user,
    };
    Ok(Bouncer {
        _proc: proc,
        url: format!("postgres://{auth}@127.0.0.1:{listen}/{db}"),
    })
}
