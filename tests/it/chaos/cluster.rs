//! The machines of a chaos run: a private PostgreSQL that can be restarted, and several real
//! `fitorder` processes (two serving, one of them without workers, and a worker) that can be
//! killed -9 and started again.

use std::path::PathBuf;
use std::time::Duration;

use fitorder::dev::dev_pg::DevPostgres;

use crate::fakes::FakeDownstream;
use crate::harness::{free_port, wait_ready, Fitorder, Running};
use crate::providers;

/// The JWT secret the processes share with the test's tokens.
pub const SECRET: &str = "chaos-secret-5d7f9b1c3e5a7c9e1f3b";

/// A PostgreSQL of our own, to restart mid-run.
pub struct Database {
    dir: PathBuf,
    pg: Option<DevPostgres>,
    /// The migrated database of the run.
    pub url: String,
}

impl Database {
    pub async fn start() -> Database {
        let dir = std::env::temp_dir().join(format!("fitorder-chaos-{}", std::process::id()));
        let d = dir.clone();
        let pg = tokio::task::spawn_blocking(move || DevPostgres::ensure(&d))
            .await
            .unwrap()
            .expect("private cluster");
        // Commit timestamps: the checker tells whether a check-in committed while its card was
        // frozen by the instants the check-in and the card's changes committed (see
        // `invariants::FROZEN_CHECK_INS`). A server setting: on after a restart.
        run_sql(&pg.url("postgres"), "ALTER SYSTEM SET track_commit_timestamp = on").await;
        let mut db = Database {
            dir,
            pg: Some(pg),
            url: String::new(),
        };
        db.restart().await;
        let pg = db.pg.as_ref().unwrap();
        fitorder::server::ensure_database(&pg.url("postgres"), "chaos")
            .await
            .unwrap();
        db.url = pg.url("chaos");
        fitorder::db::migrate(&db.url).await.unwrap();
        assert!(
            super::invariants::commit_timestamps(&mut connect(&db.url).await).await,
            "track_commit_timestamp did not take effect"
        );
        db
    }

    /// Stops the server and starts it again on the same data.
    pub async fn restart(&mut self) {
        let p = self.pg.take().unwrap();
        let d = self.dir.clone();
        self.pg = Some(
            tokio::task::spawn_blocking(move || {
                p.stop();
                std::thread::sleep(Duration::from_millis(500));
                DevPostgres::ensure(&d).unwrap()
            })
            .await
            .unwrap(),
        );
    }

    /// The deadlocks PostgreSQL broke so far, each as the two statements it named (shortened):
    /// not a violation of the books (one transaction is rolled back, its caller answered
    /// INTERNAL), but worth a look.
    pub fn deadlocks(&self) -> Vec<String> {
        let log = std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let mut out = vec![];
        for (i, l) in lines.iter().enumerate() {
            if l.contains("ERROR:  deadlock detected") {
                let named: Vec<String> = lines[i + 1..(i + 12).min(lines.len())]
                    .iter()
                    .filter_map(|x| x.trim().strip_prefix("Process ").and_then(|x| x.split_once(": ")))
                    .map(|(_, stmt)| {
                        // A long statement by its end (its lock clause), a commented one by its
                        // first line (which names it).
                        let chars: Vec<char> = stmt.chars().collect();
                        if stmt.starts_with("--") || chars.len() <= 90 {
                            chars.iter().take(90).collect()
                        } else {
                            format!("…{}", chars[chars.len() - 90..].iter().collect::<String>())
                        }
                    })
                    .collect();
                out.push(named.join("  ⟷  "));
            }
        }
        out
    }

    /// Stops the server and removes its data.
    pub async fn remove(mut self) {
        let p = self.pg.take().unwrap();
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || {
            p.stop();
            let _ = std::fs::remove_dir_all(&dir);
        })
        .await
        .unwrap();
    }
}

/// A connection to `url`, waiting while the server is (re)starting.
pub async fn connect(url: &str) -> diesel_async::AsyncPgConnection {
    use diesel_async::AsyncConnection;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match diesel_async::AsyncPgConnection::establish(url).await {
            Ok(c) => return c,
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "{url}: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

async fn run_sql(url: &str, sql: &str) {
    use diesel_async::RunQueryDsl;
    diesel::sql_query(sql)
        .execute(&mut connect(url).await)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// One `fitorder` process.
pub struct Proc {
    pub args: Vec<&'static str>,
    port: Option<u16>,
    child: Option<Running>,
}

pub struct Cluster {
    env: Vec<(String, String)>,
    pub procs: Vec<Proc>,
    /// The providers' APIs the processes call, up as long as they are. WeChat refunds answer
    /// PROCESSING and finish a moment later, Alipay refunds answer `fund_change` N and finish a
    /// moment later; members may pay during the close (`World`).
    pub sandbox: fitorder::dev::sandbox_server::SandboxProvider,
}

impl Cluster {
    /// Starts the processes against `db`, the door and AI devices at `downstream` (failing a
    /// third of the time), the providers' APIs at a sandbox of this process, and waits until
    /// every serving process is ready.
    pub async fn start(db: &str, downstream: &FakeDownstream, http: &reqwest::Client) -> Cluster {
        let mut config = fitorder::config::Config::for_tests(db.to_string());
        providers::configure(&mut config);
        let mut env: Vec<(String, String)> = vec![
            ("DATABASE_URL".into(), db.to_string()),
            ("FITORDER_JWT_SECRET".into(), SECRET.into()),
            ("FITORDER_ORDER_TIMEOUT".into(), "3s".into()),
            // Members' OFFLINE orders expire like online ones; the script's volume is not held
            // back by the per-member cap and rate (business_limits.rs tests those).
            ("FITORDER_OFFLINE_ORDER_TIMEOUT".into(), "3s".into()),
            ("FITORDER_MAX_OPEN_ORDERS".into(), "100000".into()),
            ("FITORDER_PLACE_RATE".into(), "100000".into()),
            // The scheduler's scans (order expiry, and `membership:tick`: freezes whose start or
            // end the script moved into the past start or end within a second).
            ("FITORDER_SCAN_INTERVAL".into(), "1s".into()),
            ("FITORDER_RETRY_BASE".into(), "200ms".into()),
            ("FITORDER_MAX_ATTEMPTS".into(), "4".into()),
            ("FITORDER_DOWNSTREAM_TIMEOUT".into(), "1s".into()),
            // A killed worker's claims last 3 provider calls (a refund's queries) + 5 s.
            ("FITORDER_PROVIDER_TIMEOUT".into(), "2s".into()),
            ("FITORDER_DOOR_ACCESS_URL".into(), downstream.url.clone()),
            ("FITORDER_AI_ACCESS_URL".into(), downstream.url.clone()),
            ("FITORDER_DB_POOL_SIZE".into(), "8".into()),
            ("RUST_LOG".into(), "error".into()),
        ];
        // The providers' APIs: a sandbox in this process, both providers configured whole.
        let sandbox = fitorder::dev::sandbox_server::SandboxProvider::start(providers::sandbox_keys(), "127.0.0.1:0")
            .await
            .unwrap();
        config.wechatpay.api_base = sandbox.wechat_api_base();
        config.alipay.api_base = sandbox.alipay_gateway();
        sandbox.set_refund_flow(fitorder::dev::sandbox_server::RefundFlow::Processing);
        sandbox.set_alipay_refund_flow(fitorder::dev::sandbox_server::AlipayRefundFlow::Later);
        env.extend(providers::env_of(&config));
        let serving = free_port();
        // The providers' notifications go to the first serving process (lost while it is down:
        // then only queries tell).
        env.push(("FITORDER_PUBLIC_URL".into(), format!("http://127.0.0.1:{serving}")));
        let mut cluster = Cluster {
            env,
            sandbox,
            procs: vec![
                Proc {
                    args: vec!["serve"],
                    port: Some(serving),
                    child: None,
                },
                Proc {
                    args: vec!["serve", "--no-workers"],
                    port: Some(free_port()),
                    child: None,
                },
                Proc {
                    args: vec!["worker"],
                    port: None,
                    child: None,
                },
            ],
        };
        for i in 0..cluster.procs.len() {
            cluster.start_proc(i);
        }
        for u in &cluster.urls() {
            assert!(
                wait_ready(http, u, Duration::from_secs(60)).await,
                "{u} never became ready"
            );
        }
        cluster
    }

    pub fn start_proc(&mut self, i: usize) {
        let p = &mut self.procs[i];
        let mut cmd = Fitorder::new(&p.args).envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(port) = p.port {
            cmd = cmd.env("FITORDER_ADDR", format!("127.0.0.1:{port}"));
        }
        p.child = Some(cmd.spawn());
    }

    pub fn kill(&mut self, i: usize) {
        // Dropped: SIGKILL.
        drop(self.procs[i].child.take());
    }

    /// Starts again any process that ended by itself (one started while PostgreSQL was
    /// restarting gives up); returns what each said last.
    pub fn revive(&mut self) -> Vec<String> {
        let mut said = vec![];
        for i in 0..self.procs.len() {
            let ended = self.procs[i].child.as_mut().is_some_and(|c| !c.alive());
            if ended {
                let log = self.procs[i].child.take().unwrap().log();
                let tail: Vec<&str> = log.lines().rev().take(3).collect();
                said.push(format!("{:?}: {}", self.procs[i].args, tail.join(" | ")));
                self.start_proc(i);
            }
        }
        said
    }

    /// Starts whichever process is not running.
    pub fn start_stopped(&mut self) {
        for i in 0..self.procs.len() {
            if self.procs[i].child.is_none() {
                self.start_proc(i);
            }
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.procs
            .iter()
            .filter_map(|p| p.port.map(|port| format!("http://127.0.0.1:{port}")))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.procs.len() {
            self.kill(i);
        }
    }
}
