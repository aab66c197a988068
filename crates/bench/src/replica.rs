//! A private primary and its streaming replica for B5r, made on this machine the way an
//! operator makes one: `initdb` for the primary, `pg_basebackup -R -X stream` for the standby,
//! both started with `pg_ctl`. The primary has the machine's cluster's settings (fsync and
//! synchronous commit on, 128 MB of shared buffers), so its payments are the machine's B1.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::env::connect;

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// One cluster: its data directory, port and the binaries that run it.
pub struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    pub port: u16,
    user: Option<(u32, u32)>,
    running: bool,
}

impl Cluster {
    fn new(bin: &Path, dir: PathBuf) -> Result<Cluster> {
        std::fs::create_dir_all(&dir)?;
        let user = fitorder::dev::dev_pg::server_account()?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))?;
        }
        Ok(Cluster {
            bin: bin.to_path_buf(),
            dir,
            port: free_port()?,
            user,
            running: false,
        })
    }

    fn command(&self, name: &str) -> Command {
        let mut c = Command::new(self.bin.join(name));
        c.current_dir(&self.dir);
        if let Some((uid, gid)) = self.user {
            c.uid(uid).gid(gid);
        }
        c
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn run(&self, mut c: Command, what: &str) -> Result<()> {
        let out = c.output().with_context(|| format!("running {what}"))?;
        if !out.status.success() {
            bail!(
                "{what} failed: {}{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default()
            );
        }
        Ok(())
    }

    pub fn start(&mut self, settings: &str) -> Result<()> {
        let opts = format!("-p {} -h 127.0.0.1 -k {} {settings}", self.port, self.dir.display());
        let mut c = self.command("pg_ctl");
        c.arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.join("postgres.log"))
            .args(["-w", "-t", "120", "-o", &opts, "start"]);
        self.run(c, "pg_ctl start")?;
        self.running = true;
        Ok(())
    }

    pub fn stop(&mut self) -> Result<()> {
        let mut c = self.command("pg_ctl");
        c.arg("-D")
            .arg(self.data())
            .args(["-m", "fast", "-w", "-t", "120", "stop"]);
        self.run(c, "pg_ctl stop")?;
        self.running = false;
        Ok(())
    }

    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.running {
            let mut c = self.command("pg_ctl");
            c.arg("-D").arg(self.data()).args(["-m", "immediate", "-w", "stop"]);
            let _ = c.output();
        }
    }
}

/// The machine's cluster's settings (Debian's defaults, as `Machine::describe` reports them),
/// with what streaming needs. `hot_standby_feedback` keeps the primary's vacuum from
/// cancelling the replica's reads, as a deployment whose replica serves the console would set.
pub const PRIMARY: &str = "-c shared_buffers=128MB -c max_connections=100 -c wal_level=replica \
                           -c max_wal_senders=4 -c work_mem=4MB";
///
/// The standby does not fsync: on this one machine it shares the primary's disk, which a
/// replica on hardware of its own would not, and its flushes would be the primary's commits'
/// waits. A standby that crashes here is made again; one in production fsyncs on its own disk.
pub const STANDBY: &str = "-c shared_buffers=128MB -c max_connections=100 -c hot_standby=on \
                           -c hot_standby_feedback=on -c work_mem=4MB -c fsync=off";

/// The primary and its standby; both are stopped and their directory removed when dropped.
pub struct Pair {
    pub primary: Cluster,
    pub standby: Cluster,
    base: PathBuf,
}

impl Pair {
    /// A new primary under `tmp`, started; the standby is made by [`Pair::attach_standby`].
    pub fn start(tmp: &Path) -> Result<Pair> {
        let bin = fitorder::dev::dev_pg::server_bin_dir(&["pg_basebackup"])
            .context("B5r needs the PostgreSQL server's binaries (initdb, pg_ctl, pg_basebackup)")?;
        let base = tmp.join("replica-pair");
        let _ = std::fs::remove_dir_all(&base);
        let mut primary = Cluster::new(&bin, base.join("primary"))?;
        let standby = Cluster::new(&bin, base.join("standby"))?;
        let mut c = primary.command("initdb");
        c.arg("-D")
            .arg(primary.data())
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale"]);
        primary.run(c, "initdb")?;
        primary.start(PRIMARY)?;
        Ok(Pair { primary, standby, base })
    }

    /// `pg_basebackup -R` of the primary as it is now, then the standby started.
    pub fn attach_standby(&mut self) -> Result<()> {
        let mut c = self.standby.command("pg_basebackup");
        c.args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.primary.port.to_string(),
            "-U",
            "postgres",
            "-D",
        ])
        .arg(self.standby.data())
        .args(["-R", "-X", "stream", "-c", "fast"]);
        self.standby.run(c, "pg_basebackup")?;
        self.standby.start(STANDBY)
    }

    /// Waits until the standby has replayed all the primary has written so far.
    pub async fn caught_up(&self) -> Result<()> {
        let p = connect(&self.primary.url("postgres")).await?;
        let s = connect(&self.standby.url("postgres")).await?;
        let lsn: String = p
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await?
            .get(0);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let done: bool = s
                .query_one("SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", &[&lsn])
                .await?
                .get(0);
            if done {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the standby did not catch up within two minutes");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the primary streams to a standby now (`pg_stat_replication`).
    pub async fn streaming(&self) -> Result<bool> {
        let p = connect(&self.primary.url("postgres")).await?;
        Ok(p.query_one(
            "SELECT count(*) > 0 FROM pg_stat_replication WHERE state = 'streaming'",
            &[],
        )
        .await?
        .get(0))
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        // The clusters stop in their own Drop (the standby first: it is declared second but
        // stopping the primary first would only make it log reconnects).
        let _ = self.standby.stop();
        let _ = self.primary.stop();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}
