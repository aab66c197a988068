//! Failover, kept true (issue 38): a real `fitorder serve` on a pg_auto_failover formation (a
//! monitor, a primary and a synchronous standby, all on loopback, started here with Debian's
//! `pg-auto-failover-cli` and `postgresql-15-auto-failover`) keeps taking WeChat Pay
//! notifications through (a) a planned switchover and (b) the loss of the new primary's host
//! (its keeper and PostgreSQL killed with SIGKILL). Meanwhile GraphQL answers `INTERNAL` with
//! `extensions.reason` `DATABASE_UNAVAILABLE`, the notify route answers 5xx (the provider
//! retries), `/readyz` is 503; afterwards payments apply again within the named bounds, none is
//! lost or applied twice, the subscription hears again (the LISTEN connection found the new
//! primary), the outbox delivers every grant and the scheduler runs its ticks.
//!
//! Skipped with a message only when pg_autoctl is not installed outside CI; under `CI` it must
//! run (`.ci/run` installs the packages).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fitorder::config::ExposeSecret;
use serde_json::{json, Value};

use crate::fakes::{FakeDownstream, Mode};
use crate::harness::*;
use crate::ws::WsClient;

/// The monitor's timeouts (`pgautofailover.*`, milliseconds but the retries).
#[derive(Clone, Copy, Debug)]
struct MonitorTimeouts {
    health_check_period: u64,
    health_check_timeout: u64,
    health_check_max_retries: u64,
    health_check_retry_delay: u64,
    node_considered_unhealthy_timeout: u64,
    /// How long the standby waits for the lost primary to demote itself before it is
    /// promoted anyway.
    primary_demote_timeout: u64,
}

impl MonitorTimeouts {
    /// This test's: low, so that a lost primary costs seconds rather than the default ~50 s.
    const TEST: MonitorTimeouts = MonitorTimeouts {
        health_check_period: 1_000,
        health_check_timeout: 1_000,
        health_check_max_retries: 1,
        health_check_retry_delay: 500,
        node_considered_unhealthy_timeout: 2_000,
        primary_demote_timeout: 3_000,
    };

    /// pg_auto_failover 2.0's (Debian's packages), kept with `FAILOVER_MONITOR_DEFAULTS=1`
    /// to measure what production gets without tuning (the lost primary then takes ~1 min).
    const DEFAULTS: MonitorTimeouts = MonitorTimeouts {
        health_check_period: 5_000,
        health_check_timeout: 5_000,
        health_check_max_retries: 2,
        health_check_retry_delay: 2_000,
        node_considered_unhealthy_timeout: 20_000,
        primary_demote_timeout: 30_000,
    };

    fn chosen() -> MonitorTimeouts {
        if std::env::var_os("FAILOVER_MONITOR_DEFAULTS").is_some_and(|v| v == "1") {
            MonitorTimeouts::DEFAULTS
        } else {
            MonitorTimeouts::TEST
        }
    }

    fn settings(&self) -> [(&'static str, u64); 6] {
        [
            ("health_check_period", self.health_check_period),
            ("health_check_timeout", self.health_check_timeout),
            ("health_check_max_retries", self.health_check_max_retries),
            ("health_check_retry_delay", self.health_check_retry_delay),
            (
                "node_considered_unhealthy_timeout",
                self.node_considered_unhealthy_timeout,
            ),
            ("primary_demote_timeout", self.primary_demote_timeout),
        ]
    }

    /// The monitor's detection time: the primary is failed once its health checks have failed
    /// (a period, every retry timing out, the delays between them) and it has not reported for
    /// the unhealthy timeout, whichever is later; the standby then waits out the demote
    /// timeout. With the defaults: max(5 + 3·5 + 2·2 = 24 s, 20 s) + 30 s = 54 s; here 6.5 s.
    fn detection(&self) -> Duration {
        let checks = self.health_check_period
            + (self.health_check_max_retries + 1) * self.health_check_timeout
            + self.health_check_max_retries * self.health_check_retry_delay;
        Duration::from_millis(checks.max(self.node_considered_unhealthy_timeout) + self.primary_demote_timeout)
    }
}

/// After a planned switchover, payments apply again within this.
const SWITCHOVER_BOUND: Duration = Duration::from_secs(5);
/// After a lost primary, payments apply again within the detection time plus this.
const AFTER_DETECTION: Duration = Duration::from_secs(5);

/// pg_autoctl and the PostgreSQL whose server has the monitor's extension.
struct Tools {
    /// `/usr/lib/postgresql/<major>/bin`.
    bindir: PathBuf,
    /// Who runs the formation: pg_autoctl refuses root, so `postgres` when we are root.
    user: Option<(u32, u32)>,
}

impl Tools {
    fn find() -> Option<Tools> {
        let autoctl = Command::new("pg_autoctl")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !autoctl {
            return None;
        }
        let mut majors: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("lib/pgautofailover.so").exists() && p.join("bin/pg_ctl").exists())
            .collect();
        majors.sort();
        let bindir = majors.pop()?.join("bin");
        let user = if unsafe { libc::geteuid() } == 0 {
            let pw = unsafe { libc::getpwnam(c"postgres".as_ptr()) };
            assert!(
                !pw.is_null(),
                "running as root, and there is no `postgres` user to run pg_autoctl as"
            );
            Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
        } else {
            None
        };
        Some(Tools { bindir, user })
    }
}

/// A `pg_autoctl … --run` (the monitor or a node), in a process group of its own: its keeper,
/// its services and its PostgreSQL postmaster (whose children leave the group, and die with it).
struct Keeper {
    name: &'static str,
    child: Child,
}

impl Keeper {
    fn signal(&self, sig: i32) {
        unsafe { libc::kill(-(self.child.id() as i32), sig) };
    }

    /// SIGKILL to the keeper and its PostgreSQL: the host is gone.
    fn kill_hard(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        // As an orchestrator stops it (pg_autoctl stops its PostgreSQL), then for good.
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(100));
        }
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }
}

/// The formation: a monitor and two nodes (`n1`, `n2`) on free loopback ports, in a
/// directory of its own (removed when dropped, after every keeper is stopped).
struct Formation {
    tools: Tools,
    dir: PathBuf,
    monitor_port: u16,
    ports: [u16; 2],
    keepers: Vec<Keeper>,
    timeouts: MonitorTimeouts,
}

impl Drop for Formation {
    fn drop(&mut self) {
        // Nodes first, the monitor last.
        while let Some(k) = self.keepers.pop() {
            drop(k);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const NODES: [&str; 2] = ["n1", "n2"];

impl Formation {
    fn new(tools: Tools, timeouts: MonitorTimeouts) -> Formation {
        let dir = std::env::temp_dir().join(format!("fitorder-failover-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        if let Some((uid, gid)) = tools.user {
            let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
            assert_eq!(
                unsafe { libc::chown(c.as_ptr(), uid, gid) },
                0,
                "chown {}",
                dir.display()
            );
        }
        Formation {
            tools,
            dir,
            monitor_port: free_port(),
            ports: [free_port(), free_port()],
            keepers: vec![],
            timeouts,
        }
    }

    /// `pg_autoctl <args>` as the formation's user, its configuration under the directory.
    fn pg_autoctl(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("pg_autoctl");
        // pg_autoctl looks at every pg_ctl on the PATH: only the system's directories (one
        // it may not read, such as root's, stops it).
        let path = format!("{}:/usr/local/bin:/usr/bin:/bin", self.tools.bindir.display());
        cmd.args(args)
            .current_dir(&self.dir)
            .env("PATH", path)
            .env("HOME", &self.dir)
            .env("XDG_CONFIG_HOME", self.dir.join("config"))
            .env("XDG_DATA_HOME", self.dir.join("share"))
            .env("XDG_RUNTIME_DIR", self.dir.join("run"))
            .env_remove("PGDATA")
            .env_remove("PG_CONFIG")
            .stdin(Stdio::null());
        if let Some((uid, gid)) = self.tools.user {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    /// Starts `pg_autoctl <args> --run` (it creates, then keeps running).
    fn keep(&mut self, name: &'static str, args: &[&str]) {
        let log = std::fs::File::create(self.log(name)).unwrap();
        let child = self
            .pg_autoctl(args)
            .arg("--run")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("starting pg_autoctl for {name}: {e}"));
        self.keepers.push(Keeper { name, child });
    }

    fn pgdata(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn monitor_uri(&self) -> String {
        format!(
            "postgres://autoctl_node@127.0.0.1:{}/pg_auto_failover?sslmode=disable",
            self.monitor_port
        )
    }

    /// What `serve` is given: both nodes, writes only where they are taken.
    fn database_url(&self) -> String {
        format!(
            "postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/fitorder?target_session_attrs=read-write&connect_timeout=2",
            self.ports[0], self.ports[1]
        )
    }

    /// The last lines of every log, for a failure's message.
    fn logs(&self) -> String {
        let mut out = String::new();
        for name in ["monitor", "n1", "n2"] {
            let text = std::fs::read_to_string(self.log(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "--- {name}\n{}\n",
                lines[lines.len().saturating_sub(25)..].join("\n")
            ));
        }
        out
    }

    async fn monitor(&self) -> Option<tokio_postgres::Client> {
        let (client, conn) = tokio_postgres::connect(
            &format!(
                "host=127.0.0.1 port={} user=postgres dbname=pg_auto_failover connect_timeout=2",
                self.monitor_port
            ),
            tokio_postgres::NoTls,
        )
        .await
        .ok()?;
        tokio::spawn(conn);
        Some(client)
    }

    /// Each node's (name, reported state, assigned state), as the monitor holds them.
    async fn states(&self) -> Vec<(String, String, String)> {
        let Some(m) = self.monitor().await else { return vec![] };
        let Ok(rows) = m
            .query(
                "SELECT nodename::text, reportedstate::text, goalstate::text FROM pgautofailover.node ORDER BY nodeid",
                &[],
            )
            .await
        else {
            return vec![];
        };
        rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect()
    }

    /// Whether every node named is in one of its states (reported and assigned alike).
    async fn reached(&self, want: &[(&str, &[&str])]) -> bool {
        let states = self.states().await;
        want.iter().all(|(name, ok)| {
            states
                .iter()
                .any(|(n, reported, goal)| n == name && reported == goal && ok.contains(&reported.as_str()))
        })
    }

    /// Waits until every node named is in one of its states (reported and assigned alike).
    async fn wait_for(&self, want: &[(&str, &[&str])], within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if self.reached(want).await {
                return;
            }
            let states = self.states().await;
            assert!(
                Instant::now() < deadline,
                "the formation did not reach {want:?} within {within:?}: {states:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The node the monitor has as primary.
    async fn primary(&self) -> String {
        self.states()
            .await
            .into_iter()
            .find(|(_, reported, goal)| reported == "primary" && goal == "primary")
            .map(|(n, _, _)| n)
            .unwrap_or_else(|| panic!("no primary: {}", self.logs()))
    }

    /// The monitor, its timeouts, then the primary and its synchronous standby.
    async fn start(&mut self) {
        let (pgdata, port) = (self.pgdata("monitor"), self.monitor_port.to_string());
        self.keep(
            "monitor",
            &[
                "create",
                "monitor",
                "--pgdata",
                &pgdata,
                "--pgport",
                &port,
                "--hostname",
                "127.0.0.1",
                "--auth",
                "trust",
                "--no-ssl",
            ],
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        let monitor = loop {
            if let Some(m) = self.monitor().await {
                if m.simple_query("SELECT 1 FROM pgautofailover.formation").await.is_ok() {
                    break m;
                }
            }
            assert!(Instant::now() < deadline, "the monitor never started:\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        for (name, value) in self.timeouts.settings() {
            monitor
                .simple_query(&format!("ALTER SYSTEM SET pgautofailover.{name} = {value}"))
                .await
                .unwrap();
        }
        monitor.simple_query("SELECT pg_reload_conf()").await.unwrap();
        for (i, name) in NODES.into_iter().enumerate() {
            let (pgdata, port, monitor) = (self.pgdata(name), self.ports[i].to_string(), self.monitor_uri());
            // pg_hba.conf is initdb's (trust on loopback: the monitor, the replication, fitorder)
            // and left alone (`--skip-pg-hba`, which takes no `--auth`).
            self.keep(
                name,
                &[
                    "create",
                    "postgres",
                    "--pgdata",
                    &pgdata,
                    "--pgport",
                    &port,
                    "--hostname",
                    "127.0.0.1",
                    "--name",
                    name,
                    "--monitor",
                    &monitor,
                    "--dbname",
                    "fitorder",
                    "--no-ssl",
                    "--skip-pg-hba",
                    "--replication-quorum",
                    "true",
                ],
            );
            if i == 0 {
                self.wait_for(&[("n1", &["single"])], Duration::from_secs(60)).await;
            }
        }
        // The standby's pg_basebackup asks for a spread checkpoint, which on a busy machine takes
        // minutes: a CHECKPOINT on the primary makes the one in progress immediate.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.reached(&[("n2", &["catchingup", "secondary"])]).await && Instant::now() < deadline {
            let primary = format!(
                "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=2",
                self.ports[0]
            );
            if let Ok((c, conn)) = tokio_postgres::connect(&primary, tokio_postgres::NoTls).await {
                tokio::spawn(conn);
                let _ = c.simple_query("CHECKPOINT").await;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        self.wait_for(&[("n1", &["primary"]), ("n2", &["secondary"])], Duration::from_secs(90))
            .await;
    }

    /// `pg_autoctl perform switchover`, to its end.
    async fn switchover(&self) {
        let mut cmd = self.pg_autoctl(&["perform", "switchover", "--monitor", &self.monitor_uri()]);
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap()
            .unwrap();
        assert!(
            out.status.success(),
            "switchover failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// SIGKILL to a node's keeper and PostgreSQL.
    fn lose(&mut self, name: &str) {
        let k = self.keepers.iter_mut().find(|k| k.name == name).unwrap();
        k.kill_hard();
    }
}

/// One notification sent, as the provider saw the answer (0: no answer).
#[derive(Clone, Copy, Debug)]
struct Sent {
    at: Instant,
    order: usize,
    status: u16,
    /// The provider's redelivery of a notification already acknowledged.
    again: bool,
}

impl Sent {
    fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// One probe of GraphQL and `/readyz`: the error's code and reason (None: answered).
#[derive(Clone, Debug)]
struct Probe {
    at: Instant,
    error: Option<(String, String)>,
    ready: u16,
}

/// A WeChat Pay notification of a paid order, signed and sealed as WeChat Pay does; the status
/// of the answer.
async fn notify(http: &reqwest::Client, base: &str, order_no: &str, txn: &str, fen: i64) -> u16 {
    let w = crate::providers::wechat();
    let sealed = w.notification(
        "TRANSACTION.SUCCESS",
        &w.transaction(order_no, txn, fen),
        chrono::Utc::now().timestamp(),
    );
    let mut r = http
        .post(format!("{base}/pay/wechat/notify"))
        .header("content-type", "application/json")
        .timeout(Duration::from_secs(20));
    for (k, v) in &sealed.headers {
        r = r.header(*k, v);
    }
    match r.body(sealed.body).send().await {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

/// What a phase (a switchover, a lost primary) did to payments.
#[derive(Debug)]
struct Gap {
    /// The first notification refused after the phase began (None: none was).
    first_failed: Option<Instant>,
    /// The first payment applied after it (a first delivery answered 2xx).
    first_applied: Instant,
}

impl Gap {
    fn of(sent: &[Sent], from: Instant) -> Option<Gap> {
        let first_failed = sent.iter().find(|s| s.at >= from && !s.ok()).map(|s| s.at);
        let after = first_failed.unwrap_or(from);
        let first_applied = sent.iter().find(|s| s.at >= after && s.ok() && !s.again)?.at;
        Some(Gap {
            first_failed,
            first_applied,
        })
    }

    fn length(&self) -> Duration {
        self.first_failed
            .map(|f| self.first_applied.saturating_duration_since(f))
            .unwrap_or_default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_survive_a_switchover_and_a_lost_primary() {
    let Some(tools) = Tools::find() else {
        if std::env::var_os("CI").is_some() {
            panic!(
                "CI must run the failover test: apt-get install pg-auto-failover-cli postgresql-15-auto-failover (see .ci/run)"
            );
        }
        eprintln!(
            "SKIPPED payments_survive_a_switchover_and_a_lost_primary: pg_autoctl is not installed \
             (apt-get install pg-auto-failover-cli postgresql-15-auto-failover)"
        );
        return;
    };
    let started = Instant::now();
    let timeouts = MonitorTimeouts::chosen();
    let detection = timeouts.detection();
    let mut formation = Formation::new(tools, timeouts);
    formation.start().await;
    let formed = started.elapsed();
    let url = formation.database_url();
    fitorder::db::migrate(&url).await.unwrap();

    // The primary replicates synchronously: what it acknowledges, the standby has.
    {
        let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        let sync: String = c
            .query_one("SELECT current_setting('synchronous_standby_names')", &[])
            .await
            .unwrap()
            .get(0);
        assert!(!sync.is_empty(), "no synchronous standby");
    }

    // The studio and its orders, through the admin's and members' operations.
    let app = TestApp::on_database(&url, |c| {
        crate::providers::configure(c);
        c.max_open_orders = 100_000;
        c.place_rate_per_minute = 100_000;
    })
    .await;
    let s = app.studio(0, None, 10).await;
    let members: Vec<String> = {
        let mut m = vec![s.member.clone()];
        for _ in 0..4 {
            m.push(app.new_member(&s.store, 0).await);
        }
        m
    };
    let mut orders = vec![];
    for i in 0..300 {
        let placed = app
            .place(
                &members[i % members.len()],
                json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WECHAT_PAY"}),
            )
            .await;
        let o = &placed["order"];
        orders.push((
            o["orderNo"].as_str().unwrap().to_string(),
            format!("42{:026}", i + 1),
            o["amountCents"].as_i64().unwrap(),
        ));
    }

    let fake = FakeDownstream::start(Mode::Healthy).await;
    let server = Fitorder::serve()
        .env("DATABASE_URL", &url)
        .env("FITORDER_LISTEN_DATABASE_URL", &url)
        .env("FITORDER_JWT_SECRET", app.state.config.jwt_secret.expose_secret())
        .env("FITORDER_SCAN_INTERVAL", "2s")
        .env("FITORDER_DOOR_ACCESS_URL", &fake.url)
        .env("FITORDER_AI_ACCESS_URL", &fake.url)
        .env("FITORDER_DB_POOL_SIZE", "8")
        .env("FITORDER_LOG_FORMAT", "json")
        .envs(crate::providers::env_of(&app.state.config))
        .env_remove("RUST_LOG")
        .spawn();
    let base = server.base();
    let http = reqwest::Client::new();
    assert!(
        server.ready(&http, Duration::from_secs(30)).await,
        "fitorder on the formation never got ready: {}",
        server.log()
    );

    // A subscriber of the store's order changes, its events kept as they come.
    let admin = app.admin_token();
    let mut ws = WsClient::connect(&server.addr(), Some(&admin), false)
        .await
        .unwrap_or_else(|_| panic!("subscription refused"));
    ws.subscribe(
        "1",
        "subscription($s: ID) { orderStatusChanged(storeId: $s) { orderNo toStatus } }",
        None,
        json!({"s": s.store}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let stop_paying = Arc::new(AtomicBool::new(false));
    let heard: Arc<Mutex<Vec<(Instant, String, String)>>> = Default::default();
    let listener = {
        let (stop, heard) = (stop.clone(), heard.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if let Some(p) = ws.next_payload(1).await {
                    let c = &p["data"]["orderStatusChanged"];
                    heard.lock().unwrap().push((
                        Instant::now(),
                        c["orderNo"].as_str().unwrap_or_default().to_string(),
                        c["toStatus"].as_str().unwrap_or_default().to_string(),
                    ));
                }
            }
        })
    };

    // The provider: each order's notification until it is acknowledged (every 100 ms), then
    // once more (a redelivery), the next order 100 ms later.
    let sent: Arc<Mutex<Vec<Sent>>> = Default::default();
    let payer = {
        let (stop, sent, http, base, orders) = (
            stop_paying.clone(),
            sent.clone(),
            http.clone(),
            base.clone(),
            orders.clone(),
        );
        tokio::spawn(async move {
            for (i, (no, txn, fen)) in orders.iter().enumerate() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                loop {
                    let status = notify(&http, &base, no, txn, *fen).await;
                    let s = Sent {
                        at: Instant::now(),
                        order: i,
                        status,
                        again: false,
                    };
                    sent.lock().unwrap().push(s);
                    if s.ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let status = notify(&http, &base, no, txn, *fen).await;
                sent.lock().unwrap().push(Sent {
                    at: Instant::now(),
                    order: i,
                    status,
                    again: true,
                });
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("the provider ran out of orders to pay");
        })
    };

    // What a client and a load balancer see meanwhile.
    let probes: Arc<Mutex<Vec<Probe>>> = Default::default();
    let prober = {
        let (stop, probes, http, base, admin) =
            (stop.clone(), probes.clone(), http.clone(), base.clone(), admin.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let r: Value = match http
                    .post(format!("{base}/graphql"))
                    .bearer_auth(&admin)
                    .json(&json!({"query": "query { orders { totalCount } }"}))
                    .timeout(Duration::from_secs(20))
                    .send()
                    .await
                {
                    Ok(r) => r
                        .json()
                        .await
                        .unwrap_or(json!({"errors": [{"extensions": {"code": "NOT JSON"}}]})),
                    Err(e) => json!({"errors": [{"extensions": {"code": format!("NO ANSWER: {e}")}}]}),
                };
                let error = r.get("errors").map(|e| {
                    let ext = &e[0]["extensions"];
                    (
                        ext["code"].as_str().unwrap_or_default().to_string(),
                        ext["reason"].as_str().unwrap_or_default().to_string(),
                    )
                });
                let ready = match http
                    .get(format!("{base}/readyz"))
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await
                {
                    Ok(r) => r.status().as_u16(),
                    Err(_) => 0,
                };
                probes.lock().unwrap().push(Probe {
                    at: Instant::now(),
                    error,
                    ready,
                });
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let acked_since = |since: Instant| {
        sent.lock()
            .unwrap()
            .iter()
            .filter(|s| s.at >= since && s.ok() && !s.again)
            .count()
    };
    // Waits until payments have been applied for `settle` after a phase's gap closed; the gap.
    let settle = Duration::from_secs(4);
    let phase_end = |from: Instant, within: Duration| {
        let sent = sent.clone();
        async move {
            let deadline = Instant::now() + within;
            loop {
                let gap = Gap::of(&sent.lock().unwrap(), from);
                if let Some(gap) = gap {
                    let done = sent
                        .lock()
                        .unwrap()
                        .iter()
                        .filter(|s| s.at >= gap.first_applied + settle && s.ok() && !s.again)
                        .count();
                    if done >= 3 {
                        return gap;
                    }
                }
                assert!(Instant::now() < deadline, "payments did not resume within {within:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };

    // Before: payments apply.
    let t = Instant::now();
    while acked_since(t) < 10 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no payments applied: {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // (a) A planned switchover.
    let a = Instant::now();
    formation.switchover().await;
    formation
        .wait_for(&[("n2", &["primary"]), ("n1", &["secondary"])], Duration::from_secs(60))
        .await;
    let gap_a = phase_end(a, Duration::from_secs(60)).await;
    let a_end = Instant::now();

    // (b) The new primary's host is lost: its keeper and PostgreSQL killed.
    let primary = formation.primary().await;
    assert_eq!(primary, "n2");
    let survivor = "n1";
    let b = Instant::now();
    formation.lose(&primary);
    formation
        .wait_for(
            &[(survivor, &["primary", "wait_primary"])],
            detection + Duration::from_secs(60),
        )
        .await;
    let gap_b = phase_end(b, detection + Duration::from_secs(60)).await;
    let recovered_wall = chrono::Utc::now();
    let b_end = Instant::now();

    stop_paying.store(true, Ordering::SeqCst);
    // The provider finishes the order it was paying, then stops; the last events arrive.
    let paid = tokio::time::timeout(Duration::from_secs(60), payer)
        .await
        .expect("the provider stops");
    assert!(paid.is_ok(), "the provider failed: {paid:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    prober.await.unwrap();
    listener.await.unwrap();
    let sent = sent.lock().unwrap().clone();
    let probes = probes.lock().unwrap().clone();
    let heard = heard.lock().unwrap().clone();

    eprintln!(
        "FAILOVER formation up in {:.1} s; switchover: payments stopped {:.2} s ({} refused); lost primary: \
         payments stopped {:.2} s ({} refused), detection {:?} ({timeouts:?}); {} payments",
        formed.as_secs_f64(),
        gap_a.length().as_secs_f64(),
        sent.iter().filter(|x| x.at >= a && x.at < a_end && !x.ok()).count(),
        gap_b.length().as_secs_f64(),
        sent.iter().filter(|x| x.at >= b && !x.ok()).count(),
        detection,
        sent.iter().filter(|x| x.ok() && !x.again).count(),
    );

    let rel = |t: Instant| (t - started).as_secs_f64();
    eprintln!(
        "FAILOVER timeline (s): switchover {:.2}, refused {:?}, applied {:.2}; lost primary {:.2}, refused {:?}, applied {:.2}; end {:.2}",
        rel(a),
        gap_a.first_failed.map(rel),
        rel(gap_a.first_applied),
        rel(b),
        gap_b.first_failed.map(rel),
        rel(gap_b.first_applied),
        rel(b_end)
    );

    // The bounds.
    assert!(
        gap_a.length() <= SWITCHOVER_BOUND,
        "after a switchover payments applied again after {:?} (bound {SWITCHOVER_BOUND:?})",
        gap_a.length()
    );
    assert!(
        gap_b.first_failed.is_some(),
        "losing the primary refused no notification"
    );
    assert!(
        gap_b.length() <= detection + AFTER_DETECTION,
        "after a lost primary payments applied again after {:?} (bound {:?})",
        gap_b.length(),
        detection + AFTER_DETECTION
    );

    // One gap each: nothing refused once payments applied again, until the next phase.
    for (from, to) in [(gap_a.first_applied, b), (gap_b.first_applied, b_end)] {
        let late = sent.iter().find(|x| x.at > from && x.at < to && !x.ok());
        assert!(
            late.is_none(),
            "refused again after payments resumed: {late:?} ({:?} after)",
            late.map(|x| x.at - from)
        );
    }

    // The provider was told to retry, never that a notification was wrong.
    for x in sent.iter().filter(|x| !x.ok()) {
        assert!(
            (500..600).contains(&x.status),
            "a notification was answered {} (not 5xx) at {:?} into the test",
            x.status,
            x.at - started
        );
    }
    // GraphQL: INTERNAL with the reason, nothing else; and the reason was seen while the
    // primary was lost.
    for p in &probes {
        if let Some((code, reason)) = &p.error {
            assert_eq!(
                (code.as_str(), reason.as_str()),
                ("INTERNAL", "DATABASE_UNAVAILABLE"),
                "at {:?} into the test; the server's errors: {}",
                p.at - started,
                server
                    .log()
                    .lines()
                    .filter(|l| l.contains("\"ERROR\""))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
    let during_b = |p: &&Probe| p.at >= b && p.at <= gap_b.first_applied;
    assert!(
        probes.iter().filter(during_b).any(|p| p.error.is_some()),
        "no GraphQL request failed while no primary took writes"
    );
    assert!(
        probes.iter().filter(during_b).any(|p| p.ready == 503),
        "/readyz never said 503 while no primary took writes"
    );
    for (from, to) in [(a, gap_a.first_failed), (b, gap_b.first_failed)] {
        let Some(to) = to else { continue };
        assert!(
            probes
                .iter()
                .filter(|p| p.at >= from && p.at < to)
                .all(|p| p.ready == 200 || p.ready == 503),
            "/readyz answered something else than 200 or 503"
        );
    }
    for (from, to) in [(gap_a.first_applied + settle, b), (gap_b.first_applied + settle, b_end)] {
        let after: Vec<&Probe> = probes.iter().filter(|p| p.at >= from && p.at < to).collect();
        assert!(!after.is_empty());
        assert!(
            after.iter().all(|p| p.ready == 200 && p.error.is_none()),
            "/readyz or GraphQL still failing after payments resumed: {:?}",
            after.iter().find(|p| p.ready != 200 || p.error.is_some())
        );
    }

    // None lost, none applied twice: every acknowledged order is PAID with one payment and
    // one set of grants.
    let acked: std::collections::BTreeSet<usize> = sent.iter().filter(|x| x.ok()).map(|x| x.order).collect();
    let n = acked.len() as i64;
    assert!(n > 30, "only {n} payments");
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM orders WHERE status = 'PAID'")
            .await,
        n
    );
    for (no, _, _) in acked.iter().map(|&i| &orders[i]) {
        assert_eq!(
            app.sql_i64(&format!(
                "SELECT count(*) AS v FROM orders WHERE order_no = '{no}' AND status = 'PAID'"
            ))
            .await,
            1,
            "{no} was acknowledged and is not PAID"
        );
    }
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payments").await, n);
    assert_eq!(
        app.sql_i64("SELECT count(DISTINCT order_id) AS v FROM payments").await,
        n
    );
    let grants = app.sql_i64("SELECT count(*) AS v FROM compensation_events").await;
    assert!(grants >= n, "{grants} grants for {n} payments");
    assert_eq!(
        app.sql_i64(
            "SELECT count(DISTINCT n) AS v FROM (SELECT count(*) AS n FROM compensation_events GROUP BY order_id) c"
        )
        .await,
        1,
        "every payment has the same grants"
    );
    assert_eq!(
        app.sql_i64("SELECT count(DISTINCT order_id) AS v FROM compensation_events")
            .await,
        n
    );

    // The outbox delivered every grant (at least once, each key), through both failovers.
    let deadline = Instant::now() + Duration::from_secs(30);
    while app
        .sql_i64("SELECT count(*) AS v FROM compensation_events WHERE status <> 'SUCCEEDED'")
        .await
        > 0
    {
        assert!(
            Instant::now() < deadline,
            "the outbox did not deliver: {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(fake.delivered_per_key().len() as i64, grants);

    // The scheduler ticks on the new primary.
    let deadline = Instant::now() + Duration::from_secs(20);
    let since = format!(
        "SELECT count(*) AS v FROM task_runs WHERE task = 'order:expire' AND started_at > '{}'",
        recovered_wall.to_rfc3339()
    );
    while app.sql_i64(&since).await == 0 {
        assert!(
            Instant::now() < deadline,
            "the scheduler did not resume: {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The subscriber heard every payment applied once each phase had settled (NOTIFY is not
    // replicated: changes committed in a gap may go unheard), and every one before the first.
    let heard_paid: std::collections::HashSet<&str> = heard
        .iter()
        .filter(|(_, _, to)| to == "PAID")
        .map(|(_, no, _)| no.as_str())
        .collect();
    let first_ack = |i: usize| sent.iter().find(|x| x.order == i && x.ok()).map(|x| x.at).unwrap();
    let windows = [
        (started, a),
        (gap_a.first_applied + settle, b),
        (gap_b.first_applied + settle, b_end),
    ];
    for (from, to) in windows {
        let due: Vec<&str> = acked
            .iter()
            .filter(|&&i| first_ack(i) >= from && first_ack(i) < to)
            .map(|&i| orders[i].0.as_str())
            .collect();
        assert!(!due.is_empty(), "no payment applied in a window");
        let missed: Vec<&&str> = due.iter().filter(|no| !heard_paid.contains(**no)).collect();
        assert!(missed.is_empty(), "the subscriber missed {missed:?}: {}", server.log());
    }
    assert!(server.log().contains("LISTEN connection lost"));
}
