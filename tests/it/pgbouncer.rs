//! fitorder behind a real PgBouncer (Debian's `pgbouncer`) in transaction pooling, started by the
//! test (transaction pooling from PgBouncer 1.21 on, session pooling before): a `fitorder serve` process whose pool goes through PgBouncer and whose LISTEN (and
//! migrations) go straight to PostgreSQL places, pays, expires, delivers and tells subscribers.
//! Skipped with a message only when pgbouncer is missing outside CI; in CI it must run.

use fitorder::config::ExposeSecret;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::fakes::{FakeDownstream, Mode};
use crate::harness::*;
use crate::ws::WsClient;

fn pgbouncer_bin() -> Option<String> {
    ["pgbouncer", "/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
        .iter()
        .find(|b| {
            Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(|b| b.to_string())
}

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `postgres://user[:pw]@host:port/db` → (user, password, host, port, db).
fn parts(url: &str) -> (String, Option<String>, String, u16, String) {
    let rest = url.split_once("://").unwrap().1;
    let (auth, rest) = rest.rsplit_once('@').unwrap();
    let (user, pw) = match auth.split_once(':') {
        Some((u, p)) => (u.to_string(), Some(p.to_string())),
        None => (auth.to_string(), None),
    };
    let (hostport, db) = rest.split_once('/').unwrap();
    let db = db.split('?').next().unwrap().to_string();
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), p.parse().unwrap()),
        None => (hostport.to_string(), 5432),
    };
    (user, pw, host, port, db)
}

async fn gql(http: &reqwest::Client, base: &str, token: &str, query: &str, variables: Value) -> Value {
    let r: Value = http
        .post(format!("{base}/graphql"))
        .bearer_auth(token)
        .json(&json!({"query": query, "variables": variables}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(r.get("errors").is_none(), "{r:#}");
    r["data"].clone()
}

const PLACE: &str = "mutation($input: PlaceOrderInput!) { placeOrder(input: $input) { order { orderNo status } } }";

#[tokio::test]
async fn place_pay_expire_deliver_and_subscribe_through_pgbouncer() {
    let Some(bin) = pgbouncer_bin() else {
        if std::env::var_os("CI").is_some() {
            panic!("CI must run the PgBouncer test: apt-get install pgbouncer");
        }
        eprintln!("SKIPPED place_pay_expire_deliver_and_subscribe_through_pgbouncer: pgbouncer is not installed (apt-get install pgbouncer)");
        return;
    };
    let app = TestApp::new().await;
    let s = app.studio(1_000_000, Some(100), 50).await;
    let (user, pw, host, port, db) = parts(&app.db_url);
    let dir = std::env::temp_dir().join(format!("fitorder-pgbouncer-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let bport = free_port();
    let version = String::from_utf8(Command::new(&bin).arg("--version").output().unwrap().stdout).unwrap();
    // PgBouncer ≥ 1.21 tracks protocol-level prepared statements in transaction mode.
    let modern = version
        .split_whitespace()
        .nth(1)
        .and_then(|v| {
            let mut it = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
            Some((it.next()?, it.next()?))
        })
        .is_some_and(|(a, b)| (a, b) >= (1, 21));
    // fitorder's driver (tokio-postgres under diesel-async) uses named protocol-level prepared
    // statements: in transaction pooling they need PgBouncer ≥ 1.21 with
    // max_prepared_statements (older ones answer `prepared statement "s24" does not exist`).
    // On an older PgBouncer the same scenario runs in session pooling, and says so.
    let (pool_mode, pool_size) = if modern {
        ("transaction", 3)
    } else {
        eprintln!(
            "NOTE: {} is older than 1.21 and cannot carry prepared statements in transaction pooling; \
             running the PgBouncer scenario in session pooling",
            version.lines().next().unwrap_or_default()
        );
        ("session", 20)
    };
    let password = pw.as_deref().map(|p| format!(" password={p}")).unwrap_or_default();
    let ini = format!(
        "[databases]\n{db} = host={host} port={port} dbname={db} user={user}{password}\n\
         [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {bport}\nunix_socket_dir =\n\
         auth_type = any\npool_mode = {pool_mode}\nmax_client_conn = 200\ndefault_pool_size = {pool_size}\n\
         admin_users = {user}\nlogfile = {log}\npidfile = {pid}\nignore_startup_parameters = extra_float_digits\n{prepared}",
        log = dir.join("pgbouncer.log").display(),
        pid = dir.join("pgbouncer.pid").display(),
        prepared = if modern { "max_prepared_statements = 200\n" } else { "" },
    );
    let ini_path = dir.join("pgbouncer.ini");
    std::fs::write(&ini_path, ini).unwrap();
    let mut cmd = Command::new(&bin);
    // PgBouncer refuses to run as root.
    if unsafe { libc::geteuid() } == 0 {
        cmd.args(["-u", "postgres"]);
    }
    let _bouncer = Proc(
        cmd.arg(&ini_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer"),
    );
    let bouncer_url = format!(
        "postgres://{user}{}@127.0.0.1:{bport}/{db}",
        pw.as_deref().map(|p| format!(":{p}")).unwrap_or_default()
    );
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", bport)).is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fake = FakeDownstream::start(Mode::Healthy).await;
    let server = Fitorder::serve()
        .env("DATABASE_URL", &bouncer_url)
        .env("FITORDER_LISTEN_DATABASE_URL", &app.db_url)
        .env("FITORDER_JWT_SECRET", app.state.config.jwt_secret.expose_secret())
        .env("FITORDER_ORDER_TIMEOUT", "3s")
        .env("FITORDER_SCAN_INTERVAL", "2s")
        .env("FITORDER_DOOR_ACCESS_URL", &fake.url)
        .env("FITORDER_AI_ACCESS_URL", &fake.url)
        .env("FITORDER_DB_POOL_SIZE", "8")
        // One member places every order here: past the open-order cap and the placing rate.
        .env("FITORDER_MAX_OPEN_ORDERS", "100000")
        .env("FITORDER_PLACE_RATE", "100000")
        .env("FITORDER_LOG_FORMAT", "json")
        // Both providers, their APIs at the app's sandbox.
        .envs(crate::providers::env_of(&app.state.config))
        .env_remove("RUST_LOG")
        .spawn();
    let base = server.base();
    let http = reqwest::Client::new();
    let ready = server.ready(&http, Duration::from_secs(20)).await;
    assert!(ready, "fitorder behind PgBouncer never got ready: {}", server.log());
    let admin = app.admin_token();
    let member = app.member_token(&s.member);
    let mut ws = WsClient::connect(&server.addr(), Some(&admin), false)
        .await
        .unwrap_or_else(|_| panic!("subscription refused"));
    ws.subscribe(
        "1",
        "subscription($s: ID) { orderStatusChanged(storeId: $s) { orderNo fromStatus toStatus traceId } }",
        None,
        json!({"s": s.store}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Twenty wallet orders at once (in transaction pooling more clients than PgBouncer's three
    // server connections), paid as they are placed.
    let placed = futures_util::future::join_all((0..20).map(|_| {
        let http = http.clone();
        let base = base.clone();
        let member = member.clone();
        let input = json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WALLET"});
        async move { gql(&http, &base, &member, PLACE, json!({"input": input})).await }
    }))
    .await;
    let paid: Vec<String> = placed
        .iter()
        .map(|p| {
            assert_eq!(p["placeOrder"]["order"]["status"], "PAID", "{p}");
            p["placeOrder"]["order"]["orderNo"].as_str().unwrap().to_string()
        })
        .collect();
    // An online order nobody pays: expired by the server's timer.
    let online = gql(
        &http,
        &base,
        &member,
        PLACE,
        json!({"input": {"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WECHAT_PAY"}}),
    )
    .await["placeOrder"]["order"]["orderNo"]
        .as_str()
        .unwrap()
        .to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let expired = app
            .sql_i64(&format!(
                "SELECT count(*) AS v FROM orders WHERE order_no = '{online}' AND status = 'CANCELED'"
            ))
            .await;
        let delivered = app
            .sql_i64("SELECT count(*) AS v FROM compensation_events WHERE status = 'SUCCEEDED'")
            .await;
        if expired == 1 && delivered == 40 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "expired {expired}, delivered {delivered}: {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(fake.calls().len(), 40, "every grant reached the downstream once");
    // Subscribers heard every payment and the expiry (through the direct LISTEN connection).
    let mut heard = std::collections::HashSet::new();
    let expected: Vec<(String, String)> = paid
        .iter()
        .map(|no| (no.clone(), "PAID".to_string()))
        .chain([(online.clone(), "CANCELED".to_string())])
        .collect();
    while !expected.iter().all(|e| heard.contains(e)) {
        let Some(p) = ws.next_payload(10).await else { break };
        let c = &p["data"]["orderStatusChanged"];
        heard.insert((
            c["orderNo"].as_str().unwrap_or_default().to_string(),
            c["toStatus"].as_str().unwrap_or_default().to_string(),
        ));
    }
    for no in &paid {
        assert!(
            heard.contains(&(no.clone(), "PAID".to_string())),
            "{no} PAID not heard: {heard:?}"
        );
    }
    assert!(heard.contains(&(online.clone(), "CANCELED".to_string())), "{heard:?}");
    // The pool really went through PgBouncer: its admin console counts the transactions.
    let (console, conn) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={bport} user={user} dbname=pgbouncer"),
        tokio_postgres::NoTls,
    )
    .await
    .expect("PgBouncer's admin console");
    tokio::spawn(conn);
    let mut xacts = 0u64;
    for m in console.simple_query("SHOW STATS").await.unwrap() {
        if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
            if r.get("database") == Some(db.as_str()) {
                xacts = r.get("total_xact_count").unwrap().parse().unwrap();
            }
        }
    }
    assert!(xacts > 100, "only {xacts} transactions went through PgBouncer");
    let log = server.log();
    assert!(
        !log.contains("prepared statement") && !log.contains("does not exist"),
        "prepared statements broke behind PgBouncer ({version}): {log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
