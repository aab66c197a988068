//! Child processes that are always stopped, and children measured to their end with wait4(2).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

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
