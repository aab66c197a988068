//! `FITORDER_READ_DATABASE_URL` against a real streaming replica made on this machine: a private
//! primary cluster (initdb, as development mode makes one) and a standby of it made with
//! `pg_basebackup -R`. Staff lists read the replica; a viewer's own write is read back at once
//! even while the replica's replay is paused, whichever instance took it; a replica that lags,
//! stops or comes back is followed without an error reaching the client.
//!
//! The shared test server is not used as the primary: a base backup of it would copy every
//! other test's databases. Skipped with a message when the PostgreSQL server binaries are
//! missing outside CI; in CI it must run.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use fitorder::auth::Role;
use fitorder::dev::dev_pg::DevPostgres;
use serde_json::{json, Value};

use crate::harness::*;

/// The directory holding `initdb`, `pg_ctl` and `pg_basebackup`, found as dev_pg finds the
/// server's binaries.
fn bin_dir() -> Option<PathBuf> {
    fitorder::dev::dev_pg::server_bin_dir(&["pg_basebackup"]).ok()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The standby: its data directory, port and binaries.
struct Standby {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    user: Option<(u32, u32)>,
}

impl Standby {
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

    fn run(&self, mut c: Command, what: &str) {
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{what}: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default()
        );
    }

    /// `pg_basebackup -R` of the primary at `primary_port` into this standby's data directory.
    fn base_backup(&self, primary_port: u16) {
        let mut c = self.command("pg_basebackup");
        c.args([
            "-h",
            "127.0.0.1",
            "-p",
            &primary_port.to_string(),
            "-U",
            "postgres",
            "-D",
        ])
        .arg(self.data())
        .args(["-R", "-X", "stream", "-c", "fast"]);
        self.run(c, "pg_basebackup");
    }

    fn start(&self) {
        // The standby needs at least the primary's max_connections (dev_pg starts it with 300).
        let opts = format!(
            "-p {} -h 127.0.0.1 -k {} -c fsync=off -c max_connections=300 -c hot_standby=on",
            self.port,
            self.dir.display()
        );
        let mut c = self.command("pg_ctl");
        c.arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.join("postgres.log"))
            .args(["-w", "-t", "60", "-o", &opts, "start"]);
        self.run(c, "pg_ctl start (standby)");
    }

    fn stop(&self) {
        let mut c = self.command("pg_ctl");
        c.arg("-D")
            .arg(self.data())
            .args(["-m", "fast", "-w", "-t", "60", "stop"]);
        self.run(c, "pg_ctl stop (standby)");
    }

    fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }
}

/// Stops both clusters and removes their directory, however the test ends.
struct Clusters {
    primary: DevPostgres,
    standby: Standby,
    base: PathBuf,
}

impl Drop for Clusters {
    fn drop(&mut self) {
        let mut c = self.standby.command("pg_ctl");
        c.arg("-D").arg(self.standby.data()).args(["-m", "immediate", "stop"]);
        let _ = c.output();
        self.primary.stop();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

async fn connect(url: &str) -> AsyncPgConnection {
    AsyncPgConnection::establish(url).await.unwrap()
}

#[derive(diesel::QueryableByName)]
struct B {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    v: bool,
}

async fn bool_of(url: &str, sql: &str) -> bool {
    let mut c = connect(url).await;
    diesel::sql_query(sql).get_result::<B>(&mut c).await.unwrap().v
}

async fn exec(url: &str, sql: &str) {
    let mut c = connect(url).await;
    diesel::sql_query(sql).execute(&mut c).await.unwrap();
}

/// Until the standby has replayed everything the primary has written so far.
async fn caught_up(primary: &str, standby: &str) {
    #[derive(diesel::QueryableByName)]
    struct L {
        #[diesel(sql_type = diesel::sql_types::Text)]
        lsn: String,
    }
    let mut p = connect(primary).await;
    let at: L = diesel::sql_query("SELECT pg_current_wal_insert_lsn()::text AS lsn")
        .get_result(&mut p)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let sql = format!("SELECT pg_last_wal_replay_lsn() >= '{}'::pg_lsn AS v", at.lsn);
    while !bool_of(standby, &sql).await {
        assert!(Instant::now() < deadline, "the standby did not catch up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A counter of this process's `/metrics` (0 when it was never incremented).
async fn metric(app: &TestApp, series: &str) -> f64 {
    let (_, body) = app.metrics().await;
    String::from_utf8(body)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

const REPLICA_READS: &str = "fitorder_read_replica_reads_total";

fn fallback(reason: &str) -> String {
    format!("fitorder_read_replica_fallback_total{{reason=\"{reason}\"}}")
}

const STORES: &str = "{ stores { id name } }";
const ORDERS: &str = "{ orders(first: 50) { totalCount edges { node { orderNo member { id } store { id } } } } }";

fn store_names(data: &Value) -> Vec<String> {
    data["stores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

fn order_nos(data: &Value) -> Vec<String> {
    data["orders"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["node"]["orderNo"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn staff_lists_read_the_replica_read_your_writes_and_fall_back_to_the_primary() {
    let Some(bin) = bin_dir() else {
        if std::env::var_os("CI").is_some() {
            panic!("CI must test the read replica: install the PostgreSQL server (initdb, pg_basebackup)");
        }
        eprintln!("skipped: no initdb/pg_ctl/pg_basebackup on PATH or under /usr/lib/postgresql");
        return;
    };
    let user = fitorder::dev::dev_pg::server_account().unwrap();
    let base = std::env::temp_dir().join(format!("fitorder-rr-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    // The primary: a private cluster as development mode makes one (wal_level=replica, trust
    // for replication connections from 127.0.0.1, max_wal_senders=10 are initdb's defaults).
    let primary_dir = base.join("p");
    let primary = tokio::task::spawn_blocking(move || DevPostgres::ensure(&primary_dir))
        .await
        .unwrap()
        .expect("the private primary starts");
    let standby_dir = base.join("s");
    std::fs::create_dir_all(&standby_dir).unwrap();
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(&standby_dir, Some(uid), Some(gid)).unwrap();
    }
    let standby = Standby {
        bin,
        dir: standby_dir,
        port: free_port(),
        user,
    };
    let primary_port = primary.port();
    let primary_url = primary.url("fitorder");
    let clusters = Clusters {
        primary,
        standby,
        base: base.clone(),
    };
    let mut admin = connect(&clusters.primary.url("postgres")).await;
    diesel::sql_query("CREATE DATABASE fitorder")
        .execute(&mut admin)
        .await
        .unwrap();
    fitorder::db::migrate(&primary_url).await.unwrap();
    assert_eq!(
        {
            #[derive(diesel::QueryableByName)]
            struct S {
                #[diesel(sql_type = diesel::sql_types::Text)]
                wal_level: String,
            }
            diesel::sql_query("SHOW wal_level")
                .get_result::<S>(&mut admin)
                .await
                .unwrap()
                .wal_level
        },
        "replica"
    );
    clusters.standby.base_backup(primary_port);
    clusters.standby.start();
    let standby_url = clusters.standby.url("fitorder");
    assert!(bool_of(&standby_url, "SELECT pg_is_in_recovery() AS v").await);
    // The replica's connections name themselves, so the test can find them on the standby.
    let read_url = format!("{standby_url}?application_name=fitorder_replica_reads");

    // Two `serve` instances on the same primary and replica: A tolerates any lag (so that what
    // sends its reads to the primary below is read-your-writes alone), B at most 2 s.
    let app_a = TestApp::on_database(&primary_url, |c| {
        c.read_database_url = Some(read_url.clone().into());
        c.read_max_lag = Duration::from_secs(3600);
    })
    .await;
    let app_b = TestApp::on_database(&primary_url, |c| {
        c.read_database_url = Some(read_url.clone().into());
        c.read_max_lag = Duration::from_secs(2);
    })
    .await;
    let admin_token = app_a.admin_token();
    let ops_token = app_a.ops_token();
    // Another head-office admin who wrote nothing.
    let other_admin = app_a.token(Role::Admin, "staff-2");

    // Data through the admin console (app B) and a member's order.
    let s = app_b.studio(100_000, None, 3).await;
    let first = app_b
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WALLET")
        .await;
    caught_up(&primary_url, &standby_url).await;

    // 1. Staff lists are served from the replica: the counter grows, and the replica has the
    //    connections of the pool named in its URL.
    let reads = metric(&app_a, REPLICA_READS).await;
    let listed = app_a.ok(&ops_token, ORDERS, json!({})).await;
    assert_eq!(order_nos(&listed), vec![first.clone()]);
    assert_eq!(listed["orders"]["edges"][0]["node"]["member"]["id"], json!(s.member));
    assert!(
        metric(&app_a, REPLICA_READS).await > reads,
        "the list did not read the replica"
    );
    assert!(
        bool_of(
            &standby_url,
            "SELECT count(*) > 0 AS v FROM pg_stat_activity WHERE application_name = 'fitorder_replica_reads'"
        )
        .await
    );
    // A member's own orders, and single records, do not read it.
    let reads = metric(&app_a, REPLICA_READS).await;
    let own = app_a.ok(&app_a.member_token(&s.member), ORDERS, json!({})).await;
    assert_eq!(order_nos(&own), vec![first.clone()]);
    app_a
        .ok(
            &ops_token,
            "query($n: String!) { order(orderNo: $n) { orderNo } }",
            json!({"n": first}),
        )
        .await;
    assert_eq!(
        metric(&app_a, REPLICA_READS).await,
        reads,
        "a member's or a single read used the replica"
    );

    // 2. Read-your-writes with the replica's replay paused: the admin writes on instance B and
    //    reads on instance A, and sees the write; staff who did not write see the replica's
    //    older state; the member sees their new order at once.
    exec(&standby_url, "SELECT pg_wal_replay_pause()").await;
    let ryw = metric(&app_a, &fallback("read_your_writes")).await;
    app_b
        .admin(
            "mutation($i: CreateStoreInput!) { createStore(input: $i) { id } }",
            json!({"i": {"name": "Written while paused", "code": "RYW1"}}),
        )
        .await;
    let second = app_b
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WALLET")
        .await;
    let seen = store_names(&app_a.ok(&admin_token, STORES, json!({})).await);
    assert!(seen.contains(&"Written while paused".to_string()), "{seen:?}");
    assert!(metric(&app_a, &fallback("read_your_writes")).await > ryw);
    let stale = store_names(&app_a.ok(&other_admin, STORES, json!({})).await);
    assert!(
        !stale.contains(&"Written while paused".to_string()),
        "the replica was not read: {stale:?}"
    );
    let stale_orders = order_nos(&app_a.ok(&ops_token, ORDERS, json!({})).await);
    assert_eq!(stale_orders, vec![first.clone()]);
    let own = order_nos(&app_a.ok(&app_a.member_token(&s.member), ORDERS, json!({})).await);
    assert_eq!(own, vec![second.clone(), first.clone()]);

    // 3. Past FITORDER_READ_MAX_LAG (instance B: 2 s) the primary answers, counted as `lag`.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let lag = metric(&app_b, &fallback("lag")).await;
    let fresh = order_nos(&app_b.ok(&ops_token, ORDERS, json!({})).await);
    assert_eq!(fresh, vec![second.clone(), first.clone()]);
    assert!(metric(&app_b, &fallback("lag")).await > lag);

    // 4. Replay resumed and caught up: everyone reads the replica again, the writer too.
    exec(&standby_url, "SELECT pg_wal_replay_resume()").await;
    caught_up(&primary_url, &standby_url).await;
    let reads = metric(&app_a, REPLICA_READS).await;
    let ryw = metric(&app_a, &fallback("read_your_writes")).await;
    let seen = store_names(&app_a.ok(&admin_token, STORES, json!({})).await);
    assert!(seen.contains(&"Written while paused".to_string()), "{seen:?}");
    let seen = store_names(&app_a.ok(&other_admin, STORES, json!({})).await);
    assert!(seen.contains(&"Written while paused".to_string()), "{seen:?}");
    assert!(metric(&app_a, REPLICA_READS).await >= reads + 2.0);
    assert_eq!(metric(&app_a, &fallback("read_your_writes")).await, ryw);

    // 5. The replica stops: reads go to the primary, counted, and no error reaches the client.
    clusters.standby.stop();
    let down = metric(&app_a, &fallback("unavailable")).await;
    for _ in 0..3 {
        let r = app_a.gql(Some(&ops_token), ORDERS, json!({})).await;
        assert!(r.get("errors").is_none(), "{r:#}");
        assert_eq!(order_nos(&r["data"]), vec![second.clone(), first.clone()]);
        let r = app_a.gql(Some(&other_admin), STORES, json!({})).await;
        assert!(r.get("errors").is_none(), "{r:#}");
    }
    assert!(metric(&app_a, &fallback("unavailable")).await > down);

    // 6. The replica returns: reads go back to it (within the second the down state lasts and
    //    the time its WAL receiver takes to stream again).
    clusters.standby.start();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reads = metric(&app_a, REPLICA_READS).await;
        let r = app_a.gql(Some(&ops_token), ORDERS, json!({})).await;
        assert!(r.get("errors").is_none(), "{r:#}");
        assert_eq!(order_nos(&r["data"]), vec![second.clone(), first.clone()]);
        if metric(&app_a, REPLICA_READS).await > reads {
            break;
        }
        assert!(Instant::now() < deadline, "reads did not go back to the replica");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(app_a);
    drop(app_b);
    drop(admin);
    drop(clusters);
    assert!(!Path::new(&base).exists());
}
