//! The restore drill (issue 38): a private PostgreSQL archiving to a pgBackRest repository
//! (`deploy/pgbackrest/`), payments and a refund through the real routes against the
//! independent provider stand-in, a base backup, a `DELETE` without `WHERE`, a restore to a time
//! before it onto a NEW cluster (new data directory, new port), `fitorder migrate` and `serve`
//! on it, and the books checked: what was committed before the restore point is there, the
//! accident is not, and the reconciliation of the day (the stand-in's bill) brings back every
//! payment the restore lost — applied through the state machine when its order is still there
//! and waiting, refunded when the order itself was lost — with no ticket, the grants re-sent by
//! the outbox, and a second run finding nothing.
//!
//! Needs Debian's `pgbackrest` (and the stand-in's python3 + cryptography): skipped with a
//! message when missing, a failure under `CI=true`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use fitorder::domain::{Provider, ReconciliationStatus};
use fitorder::trace::TraceId;
use serde_json::json;

use crate::harness::*;
use crate::standin::{need, StandIn, StandInMode, Trade};

const STANZA: &str = "fitorder";

/// A pgBackRest repository and the clusters of one drill, under a directory of its own that the
/// `postgres` account owns (initdb, PostgreSQL and pgBackRest refuse root).
pub struct Drill {
    pub dir: PathBuf,
    bin: PathBuf,
    as_postgres: bool,
    /// Data directories started by the drill, stopped on drop.
    started: Vec<PathBuf>,
}

fn tool(name: &str) -> Result<(), String> {
    match Command::new(name)
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("`{name} version` exited with {s}")),
        Err(e) => Err(format!("{name}: {e} (apt-get install pgbackrest)")),
    }
}

impl Drill {
    /// A drill's directory with `pgbackrest.conf` (from `deploy/pgbackrest/pgbackrest.conf`'s
    /// settings, the paths its own), or `None` (a skip; a failure under `CI=true`) without
    /// pgBackRest.
    pub fn new_or_skip(name: &str) -> Option<Drill> {
        if !need("pgBackRest (Debian's pgbackrest)", || tool("pgbackrest")) {
            return None;
        }
        let bin = fitorder::dev::dev_pg::server_bin_dir(&[]).expect("PostgreSQL's initdb and pg_ctl");
        let as_postgres = String::from_utf8(Command::new("id").arg("-u").output().unwrap().stdout)
            .unwrap()
            .trim()
            == "0";
        let dir = std::env::temp_dir().join(format!("fitorder-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["repo", "log", "lock", "spool", "sock"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let drill = Drill {
            dir,
            bin,
            as_postgres,
            started: vec![],
        };
        drill.write_conf(&drill.data("primary"), 0);
        if as_postgres {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&drill.dir)
                .status()
                .unwrap();
            assert!(ok.success(), "chown the drill's directory to postgres");
        }
        Some(drill)
    }

    pub fn data(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn conf(&self) -> PathBuf {
        self.dir.join("pgbackrest.conf")
    }

    /// The repository's configuration: `deploy/pgbackrest/pgbackrest.conf` with the drill's
    /// paths, the stanza's cluster `data` on `port`, no log file.
    fn write_conf(&self, data: &Path, port: u16) {
        let d = self.dir.display();
        let deployed =
            std::fs::read_to_string(crate::standin::root().join("deploy/pgbackrest/pgbackrest.conf")).unwrap();
        let mut conf = String::new();
        for line in deployed.lines() {
            let key = line.split('=').next().unwrap_or_default().trim();
            let replaced = match key {
                "repo1-path" => format!("repo1-path={d}/repo"),
                "spool-path" => format!("spool-path={d}/spool"),
                "lock-path" => format!("lock-path={d}/lock"),
                "log-path" => format!("log-path={d}/log"),
                "log-level-file" => "log-level-file=off".to_string(),
                "process-max" => "process-max=1".to_string(),
                "pg1-path" => format!("pg1-path={}", data.display()),
                "pg1-port" => format!("pg1-port={port}"),
                "pg1-socket-path" => format!("pg1-socket-path={d}/sock"),
                _ => line.to_string(),
            };
            conf.push_str(&replaced);
            conf.push('\n');
        }
        assert!(
            conf.contains(&format!("[{STANZA}]")),
            "the deployed configuration names the stanza"
        );
        std::fs::write(self.conf(), conf).unwrap();
    }

    /// A command run as `postgres` when we are root (`runuser -u postgres --`).
    fn cmd(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        }
    }

    fn run(&self, mut c: Command, what: &str) -> String {
        let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{what} failed ({}): {text}", out.status);
        text
    }

    /// `pgbackrest --config=… --stanza=fitorder <args>`.
    pub fn pgbackrest(&self, args: &[&str]) -> String {
        let mut c = self.cmd("pgbackrest");
        c.arg(format!("--config={}", self.conf().display()))
            .arg(format!("--stanza={STANZA}"))
            .args(args);
        self.run(c, &format!("pgbackrest {}", args.join(" ")))
    }

    /// A new cluster `name` on `port`, archiving to the repository.
    pub fn initdb(&mut self, name: &str, port: u16) -> PathBuf {
        let data = self.data(name);
        let mut c = self.cmd(self.bin.join("initdb"));
        c.arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]);
        self.run(c, "initdb");
        self.settings(&data, port);
        self.write_conf(&data, port);
        data
    }

    /// What the drill's clusters run with (appended: the last setting wins):
    /// `deploy/pgbackrest/postgresql-archiving.conf`, its archive command naming the drill's
    /// configuration and the cluster's data directory, and a port and socket of their own.
    fn settings(&self, data: &Path, port: u16) {
        use std::io::Write;
        let archiving =
            std::fs::read_to_string(crate::standin::root().join("deploy/pgbackrest/postgresql-archiving.conf"))
                .unwrap()
                .replace(
                    &format!("pgbackrest --stanza={STANZA} "),
                    &format!(
                        "pgbackrest --config={} --stanza={STANZA} --pg1-path={} ",
                        self.conf().display(),
                        data.display()
                    ),
                );
        assert!(
            archiving.contains("--pg1-path="),
            "the deployed archive_command: {archiving}"
        );
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .unwrap();
        write!(
            f,
            "\n# the restore drill\n{archiving}\nport = {port}\nlisten_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{}'\nmax_connections = 60\nshared_buffers = 128MB\nfsync = {}\n\
             max_wal_size = 2GB\n",
            self.dir.join("sock").display(),
            // Measured (BENCHMARKS.md) as production runs; the test's own drill without fsync.
            if measured() { "on" } else { "off" },
        )
        .unwrap();
    }

    pub fn start(&mut self, data: &Path) {
        let mut c = self.cmd(self.bin.join("pg_ctl"));
        c.arg("-D")
            .arg(data)
            .arg("-l")
            .arg(data.with_extension("log"))
            .args(["-w", "-t", "300", "start"]);
        self.run(c, "pg_ctl start");
        self.started.push(data.to_path_buf());
    }

    pub fn stop(&mut self, data: &Path) {
        let mut c = self.cmd(self.bin.join("pg_ctl"));
        c.arg("-D").arg(data).args(["-m", "fast", "-w", "stop"]);
        self.run(c, "pg_ctl stop");
        self.started.retain(|d| d != data);
    }

    /// Restores the repository's backups and archive onto a new data directory `name`, to
    /// `target` (a PostgreSQL timestamp), promoted at the target, running on `port`.
    pub fn restore_to_time(&mut self, name: &str, target: &str, port: u16) -> PathBuf {
        let data = self.data(name);
        self.pgbackrest(&[
            &format!("--pg1-path={}", data.display()),
            "--type=time",
            &format!("--target={target}"),
            "--target-action=promote",
            "restore",
        ]);
        self.settings(&data, port);
        self.write_conf(&data, port);
        data
    }

    /// The log of the cluster in `data` (to explain a failure).
    pub fn log(&self, data: &Path) -> String {
        std::fs::read_to_string(data.with_extension("log")).unwrap_or_default()
    }
}

impl Drop for Drill {
    fn drop(&mut self) {
        for d in std::mem::take(&mut self.started) {
            let mut c = self.cmd(self.bin.join("pg_ctl"));
            c.arg("-D").arg(&d).args(["-m", "immediate", "-w", "stop"]);
            let _ = c.stdout(Stdio::null()).stderr(Stdio::null()).status();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `RESTORE_DRILL_ORDERS`: how many paid orders the measured drill seeds (0: the test's own).
fn seeded_orders() -> i64 {
    std::env::var("RESTORE_DRILL_ORDERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn measured() -> bool {
    seeded_orders() > 0
}

pub fn url(port: u16, db: &str) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/{db}")
}

pub async fn sql(url: &str, statement: &str) {
    let mut c = AsyncPgConnection::establish(url).await.unwrap();
    diesel::sql_query(statement)
        .execute(&mut c)
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
}

#[derive(diesel::QueryableByName)]
struct TextValue {
    #[diesel(sql_type = diesel::sql_types::Text)]
    v: String,
}

pub async fn sql_text(url: &str, query: &str) -> String {
    let mut c = AsyncPgConnection::establish(url).await.unwrap();
    diesel::sql_query(query)
        .get_result::<TextValue>(&mut c)
        .await
        .unwrap_or_else(|e| panic!("{query}: {e}"))
        .v
}

/// Waits until the cluster at `url` accepts writes (a restored one promotes at its target).
pub async fn wait_primary(url: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(mut c) = AsyncPgConnection::establish(url).await {
            if let Ok(t) = diesel::sql_query("SELECT (NOT pg_is_in_recovery())::text AS v")
                .get_result::<TextValue>(&mut c)
                .await
            {
                if t.v == "true" {
                    return true;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

async fn pay_at_standin(app: &TestApp, standin: &StandIn, no: &str, txn: &str) {
    let total = app.order(no).await["amountCents"].as_i64().unwrap();
    standin
        .set_trade(Trade::wechat(no, "SUCCESS").amount(total).transaction_id(txn))
        .await;
    let (status, body) = standin.notify(no).await;
    assert!((200..300).contains(&status), "{status} {body}");
    assert_eq!(app.order(no).await["status"], "PAID", "{no}");
}

async fn place_wechat(app: &TestApp, s: &Studio) -> String {
    let r = crate::start_payment::place_with(app, s, Some("WECHAT_NATIVE"), "WECHAT_PAY", json!({})).await;
    assert!(r.get("errors").is_none(), "{r:#}");
    r["data"]["placeOrder"]["order"]["orderNo"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn deliver_all(app: &TestApp) {
    let worker = fitorder::compensation::worker::Worker::new(app.state.clone());
    for _ in 0..50 {
        worker.run_once().await.unwrap();
        let open = app
            .sql_i64("SELECT count(*) AS v FROM compensation_events WHERE status IN ('PENDING', 'RETRYING')")
            .await;
        if open == 0 {
            return;
        }
        // A WeChat refund answers PROCESSING; the recheck (due in an hour) is due now.
        app.sql_i64(
            "WITH u AS (UPDATE compensation_events SET next_attempt_at = now() \
                         WHERE status IN ('PENDING', 'RETRYING') AND kind = 'PROVIDER_REFUND' RETURNING 1) \
             SELECT count(*) AS v FROM u",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    let mut c = app.conn().await;
    let left: Vec<TextValue> = diesel::sql_query(
        "SELECT kind || ' ' || status || ' ' || coalesce(last_error, '') AS v FROM compensation_events \
          WHERE status IN ('PENDING', 'RETRYING')",
    )
    .load(&mut c)
    .await
    .unwrap();
    panic!(
        "the outbox did not drain: {:?}",
        left.iter().map(|t| &t.v).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_deleted_table_is_restored_to_a_time_on_a_new_cluster_and_the_bills_heal_what_it_lost() {
    let Some(mut drill) = Drill::new_or_skip("restore-drill") else {
        return;
    };
    let Some(standin) = StandIn::start_or_skip(StandInMode::PublicKey) else {
        return;
    };
    // The bills fetched are kept in a directory of the drill's own (a day's bill is fetched once).
    let statements = drill.dir.join("statements");
    let tweak = |c: &mut fitorder::config::Config| {
        crate::client_vs_standin::point_at(c, &standin);
        c.statement_dir = statements.clone();
        c.retry_base = Duration::from_millis(20);
        c.timezone = chrono_tz::Asia::Shanghai;
    };

    // The primary: archiving to the repository from its first WAL segment; the stanza made and
    // checked (archive_command works), fitorder's database migrated by the binary.
    let port_a = free_port();
    let a = drill.initdb("primary", port_a);
    drill.start(&a);
    drill.pgbackrest(&["stanza-create"]);
    drill.pgbackrest(&["check"]);
    sql(&url(port_a, "postgres"), "CREATE DATABASE fitorder").await;
    let db_a = url(port_a, "fitorder");
    let migrated = Fitorder::new(&["migrate"])
        .env("DATABASE_URL", &db_a)
        .env_remove("RUST_LOG")
        .output(Duration::from_secs(120))
        .await
        .expect("fitorder migrate ends");
    assert!(migrated.status.success(), "{}", migrated.stderr);
    // Migrating again on the same timeline moves nothing: one fence row, the sequences where
    // they were.
    let seq = "SELECT last_value::text AS v FROM order_no_seq";
    let (fences, at) = (
        "SELECT count(*)::text AS v FROM timeline_fences",
        sql_text(&db_a, seq).await,
    );
    assert_eq!(sql_text(&db_a, fences).await, "1");
    fitorder::db::migrate(&db_a).await.unwrap();
    assert_eq!(sql_text(&db_a, fences).await, "1");
    assert_eq!(sql_text(&db_a, seq).await, at);

    // Before the backup: two orders paid, one of them refunded through the outbox and the
    // stand-in.
    let app = TestApp::served_on_database(&db_a, tweak).await;
    let s = app.studio(0, None, 20).await;
    let kept = place_wechat(&app, &s).await;
    pay_at_standin(&app, &standin, &kept, "4200000000000000000000003801").await;
    let refunded = place_wechat(&app, &s).await;
    pay_at_standin(&app, &standin, &refunded, "4200000000000000000000003802").await;
    app.admin(
        "mutation($n: String!) { refundOrder(orderNo: $n, reason: \"moving away\") { status } }",
        json!({"n": refunded}),
    )
    .await;
    deliver_all(&app).await;
    assert_eq!(app.order(&refunded).await["status"], "REFUNDED");

    // The measured drill (BENCHMARKS.md, "Restore"): `RESTORE_DRILL_ORDERS` more paid orders
    // with their delivered grants, set-based as crates/bench/src/seed.rs makes them.
    let seeded = seeded_orders();
    if seeded > 0 {
        let t = Instant::now();
        seed_paid_orders(&db_a, &s, seeded).await;
        eprintln!("restore drill: seeded {seeded} paid orders in {:?}", t.elapsed());
    }
    let t = Instant::now();
    drill.pgbackrest(&["--type=full", "backup"]);
    let full_backup_in = t.elapsed();

    // After the full backup, before the restore point: one more payment (in the WAL only), an
    // incremental backup, and an order that waits for its payment.
    let after_full = place_wechat(&app, &s).await;
    pay_at_standin(&app, &standin, &after_full, "4200000000000000000000003803").await;
    drill.pgbackrest(&["--type=incr", "backup"]);
    let waiting = place_wechat(&app, &s).await;
    deliver_all(&app).await;
    // Money fitorder never asked for: a trade of another system on the same merchant account,
    // and one in fitorder's own form but a number no fence calls lost. Not ours to refund.
    let strangers = [
        "OTHERSYSTEM-38-0001".to_string(),
        format!("FO{}9999999999", &kept[2..10]),
    ];
    for (no, txn) in strangers
        .iter()
        .zip(["4200000000000000000000003807", "4200000000000000000000003808"])
    {
        standin
            .set_trade(Trade::wechat(no, "SUCCESS").amount(500).transaction_id(txn))
            .await;
    }
    let payments_before = app.sql_i64("SELECT count(*) AS v FROM payments").await;
    let seq_before = app.sql_i64("SELECT last_value AS v FROM order_no_seq").await;

    // The restore point: the database's own clock, between two commits.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let target = sql_text(&db_a, "SELECT clock_timestamp()::text AS v").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // After it: acknowledged payments the restore will lose. The waiting order's payment, and
    // two orders placed and paid after the restore point (their rows will be gone too); their
    // grants were delivered.
    pay_at_standin(&app, &standin, &waiting, "4200000000000000000000003804").await;
    let lost_1 = place_wechat(&app, &s).await;
    pay_at_standin(&app, &standin, &lost_1, "4200000000000000000000003805").await;
    let lost_2 = place_wechat(&app, &s).await;
    pay_at_standin(&app, &standin, &lost_2, "4200000000000000000000003806").await;
    deliver_all(&app).await;

    // The accident.
    sql(&db_a, "DELETE FROM payments").await;
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payments").await, 0);
    // Everything up to here archived (check switches the WAL segment and waits for it), and
    // the primary gone with its data directory left aside.
    drill.pgbackrest(&["check"]);
    drop(app);
    drill.stop(&a);

    // The restore onto a new cluster: a new data directory, a new port; promoted at the target.
    let port_b = free_port();
    let restore_started = Instant::now();
    let b = drill.restore_to_time("restored", &target, port_b);
    drill.start(&b);
    let db_b = url(port_b, "fitorder");
    assert!(
        wait_primary(&db_b, Duration::from_secs(120)).await,
        "the restored cluster did not promote: {}",
        drill.log(&b)
    );
    let restored_in = restore_started.elapsed();
    let started = Instant::now();

    // fitorder on it: migrate (the timeline fence; two at once, as instances starting together
    // do: the fence is taken once) and serve (which migrates again: nothing moves), ready.
    let migrate = || {
        Fitorder::new(&["migrate"])
            .env("DATABASE_URL", &db_b)
            .env_remove("RUST_LOG")
            .output(Duration::from_secs(120))
    };
    let (one, two) = tokio::join!(migrate(), migrate());
    for m in [one, two] {
        let m = m.expect("fitorder migrate ends");
        assert!(m.status.success(), "{}", m.stderr);
    }
    let server = Fitorder::serve()
        .env("DATABASE_URL", &db_b)
        .env("FITORDER_JWT_SECRET", "restore-drill-secret-3c5e7a9b1d3f5a7c")
        .env_remove("RUST_LOG")
        .spawn();
    assert!(
        server.ready(&reqwest::Client::new(), Duration::from_secs(60)).await,
        "fitorder serve on the restored cluster: {}",
        server.log()
    );
    let started_in = started.elapsed();
    drop(server);

    // The books as of the restore point: the accident undone, what came after it gone.
    let app = TestApp::served_on_database(&db_b, tweak).await;
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM payments").await, payments_before);
    for (no, status) in [
        (&kept, "PAID"),
        (&refunded, "REFUNDED"),
        (&after_full, "PAID"),
        (&waiting, "WAIT_PAY"),
    ] {
        assert_eq!(app.order(no).await["status"], status, "{no}");
    }
    for no in [&lost_1, &lost_2] {
        let n = app
            .sql_i64(&format!("SELECT count(*) AS v FROM orders WHERE order_no = '{no}'"))
            .await;
        assert_eq!(n, 0, "{no} was placed after the restore point");
    }
    // The fence: the restored timeline is another one, every sequence jumped ahead, and the
    // numbers that may have been lost are written down.
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM timeline_fences").await, 2);
    assert_eq!(
        app.sql_i64("SELECT max(timeline)::bigint AS v FROM timeline_fences")
            .await,
        2
    );
    let seq_after = app.sql_i64("SELECT last_value AS v FROM order_no_seq").await;
    assert!(
        seq_after >= seq_before + fitorder::db::FENCE_JUMP && seq_after < seq_before + 2 * fitorder::db::FENCE_JUMP,
        "one jump: {seq_before} -> {seq_after}"
    );

    // A new order does not take a lost order's number: the stand-in opens its trade.
    let fresh = place_wechat(&app, &s).await;
    assert!(![&lost_1, &lost_2, &waiting].contains(&&fresh), "{fresh}");
    let fresh_seq: i64 = fresh[10..].parse().unwrap();
    let lost_seq: i64 = lost_2[10..].parse().unwrap();
    assert!(
        fresh_seq > lost_seq + fitorder::db::FENCE_JUMP / 2,
        "{fresh} after {lost_2}"
    );

    // The reconciliation of the day: the stand-in's bill holds every payment; the books agree
    // with it again, with no ticket.
    let today = chrono::Utc::now()
        .with_timezone(&chrono_tz::Asia::Shanghai)
        .date_naive();
    let reconciled_started = Instant::now();
    let r = fitorder::reconciliation::run(&app.state, Provider::WechatPay, today, None, &TraceId::new())
        .await
        .unwrap();
    assert_eq!(r.status, ReconciliationStatus::Succeeded, "{:?}", r.error);
    deliver_all(&app).await;
    let reconciled_in = reconciled_started.elapsed();
    eprintln!(
        "restore drill: {seeded} seeded orders; full backup {full_backup_in:?}; restore to the time + promote \
         {restored_in:?}; fitorder migrate + serve ready {started_in:?}; reconciliation of the day + outbox \
         {reconciled_in:?}; total {:?}",
        restored_in + started_in + reconciled_in
    );

    // The waiting order's payment applied through the state machine, its grants sent again.
    let o = app.order(&waiting).await;
    let bill_evidence = sql_text(
        &db_b,
        "SELECT coalesce(string_agg(outcome || ': ' || coalesce(error, ''), '; '), '') AS v \
           FROM payment_callbacks WHERE event_type = 'BILL'",
    )
    .await;
    let heal_rows = sql_text(
        &db_b,
        "SELECT coalesce(string_agg(action || ' ' || order_no, '; '), '') AS v FROM reconciliation_heals",
    )
    .await;
    assert_eq!(
        o["status"], "PAID",
        "{o:#}; the bill's evidence: {bill_evidence}; heals: {heal_rows}; the run: {r:?}"
    );
    let grants = app
        .sql_i64(&format!(
            "SELECT count(*) AS v FROM compensation_events e JOIN orders o ON o.id = e.order_id \
              WHERE o.order_no = '{waiting}' AND e.kind IN ('DOOR_ACCESS_GRANT', 'AI_ACCESS_GRANT') \
                AND e.status = 'SUCCEEDED'"
        ))
        .await;
    assert_eq!(grants, 2, "the waiting order's grants were re-sent");
    let transitions = app
        .sql_i64(&format!(
            "SELECT count(*) AS v FROM order_transitions t JOIN orders o ON o.id = t.order_id \
              WHERE o.order_no = '{waiting}' AND t.to_status = 'PAID'"
        ))
        .await;
    assert_eq!(transitions, 1, "audited once");

    // The lost orders' payments refunded at the stand-in (signed, accepted), once each.
    let refunds = standin.requests().await;
    for (no, txn) in [
        (&lost_1, "4200000000000000000000003805"),
        (&lost_2, "4200000000000000000000003806"),
    ] {
        let asked: Vec<_> = refunds
            .iter()
            .filter(|r| r["path"] == "/v3/refund/domestic/refunds" && r["method"] == "POST")
            .filter(|r| {
                let body: serde_json::Value = serde_json::from_str(r["body"].as_str().unwrap_or("{}")).unwrap();
                body["out_trade_no"] == no.as_str() && body["out_refund_no"] == format!("RL{txn}")
            })
            .collect();
        assert_eq!(asked.len(), 1, "{no}: {refunds:#?}");
        assert_eq!(asked[0]["verified"], true);
        let done = app
            .sql_i64(&format!(
                "SELECT count(*) AS v FROM compensation_events WHERE kind = 'PROVIDER_REFUND' \
                  AND order_id IS NULL AND payload->>'orderNo' = '{no}' AND status = 'SUCCEEDED'"
            ))
            .await;
        assert_eq!(done, 1, "{no}");
    }
    // Staff see those refunds in the outbox as any refund, by the lost order's number.
    let listed = app
        .admin(
            "{ compensationEvents(filter: {kind: [PROVIDER_REFUND]}, first: 50) { edges { node { orderNo status } } } }",
            json!({}),
        )
        .await;
    for no in [&lost_1, &lost_2] {
        let found = listed["compensationEvents"]["edges"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["node"]["orderNo"] == no.as_str() && e["node"]["status"] == "SUCCEEDED");
        assert!(found, "{no}: {listed:#}");
    }
    let heals = |action: &'static str| {
        let app = &app;
        async move {
            app.sql_i64(&format!(
                "SELECT count(*) AS v FROM reconciliation_heals WHERE action = '{action}'"
            ))
            .await
        }
    };
    assert_eq!(heals("SETTLED").await, 1);
    assert_eq!(heals(fitorder::reconciliation::REFUNDED_LOST_ORDER).await, 2);
    // No ticket for a difference with one right answer; the strangers' money is a person's
    // question, one ticket each, and nothing of it was refunded.
    let mut expected: Vec<String> = strangers
        .iter()
        .map(|no| format!("PROVIDER_PAID_LOCAL_UNPAID {no}"))
        .collect();
    expected.sort();
    assert_eq!(tickets(&app).await, expected);
    assert!(
        !refunds.iter().any(|r| strangers
            .iter()
            .any(|no| r["body"].as_str().unwrap_or("").contains(no.as_str()))),
        "a stranger's payment was refunded"
    );

    // The same day again: nothing left to heal, nothing to ticket, no second refund.
    let r = fitorder::reconciliation::run(&app.state, Provider::WechatPay, today, None, &TraceId::new())
        .await
        .unwrap();
    assert_eq!(r.status, ReconciliationStatus::Succeeded, "{:?}", r.error);
    deliver_all(&app).await;
    assert_eq!(heals("SETTLED").await, 1);
    assert_eq!(heals(fitorder::reconciliation::REFUNDED_LOST_ORDER).await, 2);
    assert_eq!(tickets(&app).await, expected);
    let mut c = app.conn().await;
    let healing = fitorder::reconciliation::healing(
        &mut c,
        chrono::Utc::now() - chrono::Duration::hours(1),
        chrono::Utc::now() + chrono::Duration::hours(1),
        None,
    )
    .await
    .unwrap();
    for (category, healed, ticketed) in &healing {
        let (h, t) = match category {
            fitorder::domain::TicketKind::ProviderPaidLocalUnpaid => (3, 2),
            _ => (0, 0),
        };
        assert_eq!((*healed, *ticketed), (h, t), "{category}");
    }
}

/// `n` paid WeChat Pay orders of 2,000 new members of the studio's store (numbers `FOSEED…`, paid two days ago: not
/// in the day the drill reconciles; transaction ids `4299…`, none of the drill's own), each with
/// its audit rows, payment and delivered grants: crates/bench/src/seed.rs's `waiting_orders`, `pay` and
/// `grants` in one script.
async fn seed_paid_orders(url: &str, s: &Studio, n: i64) {
    use diesel_async::SimpleAsyncConnection;
    let (store, pack) = (&s.store, &s.pack);
    let mut c = AsyncPgConnection::establish(url).await.unwrap();
    c.batch_execute(&format!(
        "INSERT INTO members (store_id, name, phone)
              SELECT {store}, 'Seeded member ' || i, '138' || lpad(i::text, 8, '0') FROM generate_series(1, 2000) i;
         INSERT INTO orders (order_no, member_id, store_id, kind, status, item_name, class_pack_id, amount_cents,
                             payment_method, online_provider, sessions_total, expires_at, trace_id,
                             idempotency_key, request_hash)
         SELECT 'FOSEED' || lpad(g::text, 10, '0'), m.id, m.store_id, 'CLASS_PACK', 'WAIT_PAY', p.name, p.id,
                p.price_cents, 'WECHAT_PAY', 'WECHAT_PAY', p.sessions, now() + interval '1 hour', 'drill-seed',
                'drill-seed-' || g, 'drill'
           FROM generate_series(1, {n}) g
           JOIN (SELECT id, store_id, row_number() OVER (ORDER BY id) - 1 AS k FROM members
                  WHERE name LIKE 'Seeded member %') m ON m.k = g % 2000
           JOIN class_packs p ON p.id = {pack};
         INSERT INTO order_transitions (order_id, from_status, to_status, actor, reason, trace_id)
         SELECT id, NULL, 'WAIT_PAY', 'member:' || member_id, 'order placed', 'drill-seed'
           FROM orders WHERE order_no LIKE 'FOSEED%' ORDER BY id;
         UPDATE orders SET status = 'PAID', paid_at = now() - interval '2 days', expires_at = NULL,
                           provider_txn_id = '4299' || lpad(right(order_no, 10), 24, '0'), updated_at = now()
          WHERE order_no LIKE 'FOSEED%';
         INSERT INTO order_transitions (order_id, from_status, to_status, actor, reason, trace_id)
         SELECT id, 'WAIT_PAY', 'PAID', 'provider:WECHAT_PAY', 'WECHAT_PAY payment ' || provider_txn_id, 'drill-seed'
           FROM orders WHERE order_no LIKE 'FOSEED%' ORDER BY id;
         INSERT INTO payments (order_id, method, idempotency_key, provider_txn_id, amount_cents, wallet_cents,
                               online_cents, actor, trace_id, paid_at)
         SELECT id, 'WECHAT_PAY', order_no || ':' || provider_txn_id, provider_txn_id, amount_cents, 0, amount_cents,
                'provider:WECHAT_PAY', 'drill-seed', paid_at
           FROM orders WHERE order_no LIKE 'FOSEED%' ORDER BY id;
         INSERT INTO compensation_events (order_id, kind, status, attempts, max_attempts, next_attempt_at, payload,
                                          idempotency_key, trace_id)
         SELECT o.id, k.kind, 'SUCCEEDED', 1, 5, NULL,
                jsonb_build_object('orderNo', o.order_no, 'memberId', o.member_id::text,
                                   'storeId', o.store_id::text, 'action', 'GRANT'),
                o.order_no || ':' || k.kind, 'drill-seed'
           FROM orders o CROSS JOIN (VALUES ('DOOR_ACCESS_GRANT'), ('AI_ACCESS_GRANT')) AS k(kind)
          WHERE o.order_no LIKE 'FOSEED%'
          ORDER BY o.id, k.kind;"
    ))
    .await
    .unwrap();
    c.batch_execute("VACUUM ANALYZE").await.unwrap();
}

/// Every ticket, as `KIND order_no`, by order number.
async fn tickets(app: &TestApp) -> Vec<String> {
    let mut c = app.conn().await;
    let rows: Vec<TextValue> =
        diesel::sql_query("SELECT kind || ' ' || coalesce(order_no, '') AS v FROM exception_tickets ORDER BY order_no")
            .load(&mut c)
            .await
            .unwrap();
    rows.into_iter().map(|r| r.v).collect()
}
