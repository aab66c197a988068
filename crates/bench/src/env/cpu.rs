//! Where the CPU went: per process from /proc/<pid>/stat, the whole machine from /proc/stat.

use std::time::Duration;

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
