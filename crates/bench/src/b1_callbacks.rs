//! The payments group, each row with its baseline from this run:
//!
//! - B1: signed WeChat Pay notifications applied per second (each a full payment), against the
//!   one-statement floor of a payment (`pgbench::floor`) and `pgbench` tpcb-like, both with as
//!   many clients as the load generator has connections;
//! - B1b: the same notifications against a database that already holds a million orders and
//!   their history (`history`), against B1;
//! - B2: the same notifications again, all duplicates, against tpcb-like;
//! - B8: the server's peak RSS over B1;
//! - B10: B1 through PgBouncer in transaction pooling, against B1.
//!
//! B1b and B10 pay the very orders B1 pays, in copies of B1's database made before B1 ran, so
//! the three send byte-identical requests (signed once, before any of them).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use bytes::Bytes;

use crate::env::{connect, perf_stop, Bench, CpuSplit, Server};
use crate::load::{self, ms, Outcome, Prepared, Until};
use crate::pgbench::{self, Floor, Pgbench};
use crate::pgbouncer;
use crate::report::Row;
use crate::sqlcount::{upstream_of, via, Counts, SqlCounter};
use crate::{history, seed, Args};

/// How long signed notifications stay acceptable after signing: WeChat Pay's window is ±5
/// minutes and they are stamped 4 minutes ahead, so 9 minutes; they are signed anew after 7.
const SIGNED_FOR: Duration = Duration::from_secs(7 * 60);

/// Signs one notification per order with the platform key, on every core (RSA signing is the
/// slow part and must not be inside the timed phase). The timestamps are set 4 minutes ahead:
/// WeChat Pay's window is ±5 minutes. The URLs name no server yet: see [`retarget`].
fn sign_all(bench: &Bench, orders: &[(String, i64)], first_txn: usize) -> Vec<Prepared> {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let chunk = orders.len().div_ceil(threads).max(1);
    let timestamp = chrono::Utc::now().timestamp() + 240;
    let mut all = Vec::with_capacity(orders.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = orders
            .chunks(chunk)
            .enumerate()
            .map(|(c, part)| {
                let w = bench.keys.wechat();
                scope.spawn(move || {
                    part.iter()
                        .enumerate()
                        .map(|(i, (order_no, amount))| {
                            let txn = format!("42{:026}", first_txn + c * chunk + i);
                            let n = w.notification(
                                "TRANSACTION.SUCCESS",
                                &w.transaction(order_no, &txn, *amount),
                                timestamp,
                            );
                            let mut headers = vec![("content-type".to_string(), "application/json".to_string())];
                            headers.extend(n.headers.into_iter().map(|(k, v)| (k.to_string(), v)));
                            Prepared {
                                url: NOTIFY_PATH.to_string(),
                                headers,
                                body: Bytes::from(n.body),
                            }
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            all.extend(h.join().expect("a signing thread panicked"));
        }
    });
    all
}

const NOTIFY_PATH: &str = "/pay/wechat/notify";

/// The same requests addressed to the server at `base`.
pub(crate) fn retarget(requests: &[Prepared], base: &str) -> Arc<Vec<Prepared>> {
    Arc::new(
        requests
            .iter()
            .map(|r| Prepared {
                url: format!("{base}{NOTIFY_PATH}"),
                headers: r.headers.clone(),
                body: r.body.clone(),
            })
            .collect(),
    )
}

/// Notifications signed at a known time, signed anew when they would soon lapse.
pub(crate) struct Signed {
    orders: Vec<(String, i64)>,
    first_txn: usize,
    at: Instant,
    requests: Vec<Prepared>,
}

impl Signed {
    pub(crate) fn new(bench: &Bench, orders: Vec<(String, i64)>, first_txn: usize) -> Signed {
        say!("signing {} notifications on every core ...", orders.len());
        let t = Instant::now();
        let requests = tokio::task::block_in_place(|| sign_all(bench, &orders, first_txn));
        say!("signed in {:.1} s", t.elapsed().as_secs_f64());
        Signed {
            orders,
            first_txn,
            at: Instant::now(),
            requests,
        }
    }

    pub(crate) fn fresh(&mut self, bench: &Bench) -> &[Prepared] {
        if self.at.elapsed() > SIGNED_FOR {
            *self = Signed::new(bench, std::mem::take(&mut self.orders), self.first_txn);
        }
        &self.requests
    }
}

/// The evidence of one real notification, for the floor's rows: (body, headers as JSON).
fn sample_evidence(bench: &Bench) -> (String, String) {
    let w = bench.keys.wechat();
    let n = w.notification(
        "TRANSACTION.SUCCESS",
        &w.transaction("FBF0000000001", &format!("42{:026}", 1), 99_900),
        chrono::Utc::now().timestamp(),
    );
    let headers: serde_json::Map<String, serde_json::Value> = n
        .headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), serde_json::Value::String(v.clone())))
        .collect();
    (
        String::from_utf8_lossy(&n.body).to_string(),
        serde_json::Value::Object(headers).to_string(),
    )
}

pub(crate) async fn waiting(db: &tokio_postgres::Client, prefix: &str) -> Result<Vec<(String, i64)>> {
    Ok(db
        .query(
            &format!(
                "SELECT order_no, amount_cents - wallet_amount_cents FROM orders
                  WHERE order_no LIKE '{prefix}%' AND status = 'WAIT_PAY' ORDER BY id"
            ),
            &[],
        )
        .await?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// The callbacks of B1's orders by outcome.
async fn outcomes(db: &tokio_postgres::Client) -> Result<Vec<(String, i64)>> {
    Ok(db
        .query(
            "SELECT outcome, count(*) FROM payment_callbacks WHERE order_no LIKE 'FB1%' GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

fn fmt_outcomes(o: &[(String, i64)]) -> String {
    if o.is_empty() {
        return "none".into();
    }
    o.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", ")
}

pub(crate) fn count(o: &[(String, i64)], k: &str) -> i64 {
    o.iter().find(|(x, _)| x == k).map(|(_, c)| *c).unwrap_or(0)
}

/// B1's orders after a run: (PAID, payments, grant events).
pub(crate) async fn paid_state(db: &tokio_postgres::Client) -> Result<(i64, i64, i64)> {
    let r = db
        .query_one(
            "SELECT (SELECT count(*) FROM orders WHERE order_no LIKE 'FB1%' AND status = 'PAID'),
                    (SELECT count(*) FROM payments p JOIN orders o ON o.id = p.order_id WHERE o.order_no LIKE 'FB1%'),
                    (SELECT count(*) FROM compensation_events e JOIN orders o ON o.id = e.order_id
                      WHERE o.order_no LIKE 'FB1%')",
            &[],
        )
        .await?;
    Ok((r.get(0), r.get(1), r.get(2)))
}

/// One timed pass of notifications at a server.
pub(crate) struct Pass {
    pub(crate) out: Outcome,
    pub(crate) cpu: CpuSplit,
    pub(crate) outcomes: Vec<(String, i64)>,
    /// Where its slow requests waited ([`crate::stalls`]).
    pub(crate) stalls: String,
}

fn label_unit(label: &str) -> &'static str {
    if label == "B2" {
        "duplicates"
    } else {
        "payments"
    }
}

impl Pass {
    pub(crate) fn describe(&self, unit: &str) -> String {
        format!(
            "{:.0} {unit}/s (p50 {:.1} ms, p99 {:.1} ms)",
            self.out.rate(),
            ms(self.out.percentile(50.0)),
            ms(self.out.percentile(99.0))
        )
    }
}

/// Opens the server's pool connections before the clock starts (pgbench's tps excludes its
/// connection time too).
pub(crate) async fn warm(server: &Server, concurrency: usize) {
    let http = reqwest::Client::new();
    let warm: Vec<_> = (0..concurrency * 2)
        .map(|_| http.get(format!("{}/readyz", server.base)).send())
        .collect();
    futures_util::future::join_all(warm).await;
}

/// One closed-loop pass of `requests` at `server`, sampled for stalls on the PostgreSQL whose
/// maintenance database is `admin` (the machine's, or B5r's private primary).
pub(crate) async fn pass(
    admin: &str,
    bench: &Bench,
    server: &Server,
    db: &tokio_postgres::Client,
    requests: Arc<Vec<Prepared>>,
    concurrency: usize,
    label: &str,
) -> Result<Pass> {
    seed::exec(db, "checkpoint", "CHECKPOINT").await?;
    say!(
        "{label}: {} notifications over {concurrency} connections ...",
        requests.len()
    );
    let datname: String = db.query_one("SELECT current_database()", &[]).await?.get(0);
    let sampler = crate::stalls::Sampler::start(admin, &datname, Some(&server.base)).await?;
    let perf = bench.perf_attach(server.proc.pid(), label)?;
    let cpu0 = CpuSplit::sample(server.proc.pid());
    let out = load::run(requests, concurrency, Until::Exhausted, 204, false).await?;
    let cpu1 = CpuSplit::sample(server.proc.pid());
    perf_stop(perf);
    let stalls = sampler
        .finish(&out, Duration::from_millis(30), label_unit(label))
        .await?;
    let outcomes = outcomes(db).await?;
    let p = Pass {
        out,
        cpu: cpu1.since(&cpu0),
        outcomes,
        stalls,
    };
    say!(
        "{label}: {}; outcomes: {}",
        p.describe("notifications"),
        fmt_outcomes(&p.outcomes)
    );
    Ok(p)
}

/// The statements one payment and one duplicate cost: the probe orders' notifications sent one
/// at a time to a server instance whose database connections go through the counting proxy.
async fn count_statements(bench: &Bench, url: &str, db: &tokio_postgres::Client) -> Result<(Counts, Counts)> {
    let orders = waiting(db, "FBP").await?;
    let counter = SqlCounter::start(upstream_of(url)?).await?;
    let server = bench.start_server(&via(url, counter.port)?, "server-b1-count").await?;
    let probe = tokio::task::block_in_place(|| sign_all(bench, &orders, 1_000_000_000));
    let probe = retarget(&probe, &server.base);
    reqwest::Client::new()
        .get(format!("{}/readyz", server.base))
        .send()
        .await?;
    let c0 = counter.counts();
    let paid = load::run(probe.clone(), 1, Until::Exhausted, 204, false).await?;
    let c1 = counter.counts();
    let dup = load::run(probe, 1, Until::Exhausted, 204, false).await?;
    let c2 = counter.counts();
    if paid.ok != orders.len() || dup.ok != orders.len() {
        bail!(
            "the counted notifications were not all answered 204: {} {}",
            paid.describe_failures(),
            dup.describe_failures()
        );
    }
    Ok((c1.since(&c0), c2.since(&c1)))
}

/// What B1b's database went through before its pass.
struct HistoryDb {
    url: String,
    loaded: history::Loaded,
    settle_secs: f64,
}

async fn history_db(bench: &mut Bench, api: &str, n: i64, body_len: usize) -> Result<HistoryDb> {
    let url = bench.create_db("b1b", Some(api)).await?;
    say!("B1b: loading {n} orders with their history ...");
    let loaded = {
        let db = connect(&url).await?;
        history::load(&db, n, body_len).await?
    };
    say!("B1b: loaded in {:.0} s; vacuum, analyze, checkpoint ...", loaded.secs);
    let t = Instant::now();
    seed::settle(&url).await?;
    Ok(HistoryDb {
        url,
        loaded,
        settle_secs: t.elapsed().as_secs_f64(),
    })
}

/// What B10 found.
struct Pooled {
    pass: Option<Pass>,
    bouncer: pgbouncer::Binary,
    failed: Option<String>,
    /// The older PgBouncer (< 1.21) probed in transaction pooling too, and what it did.
    older: Option<String>,
    pool_size: usize,
}

/// A server whose pool goes through `bouncer` and whose LISTEN goes to PostgreSQL directly.
async fn server_behind(bench: &Bench, direct: &str, bouncer: &pgbouncer::Bouncer, label: &str) -> Result<Server> {
    bench
        .start_server_with(
            &bouncer.url,
            label,
            &[("FITORDER_LISTEN_DATABASE_URL", direct.to_string())],
        )
        .await
}

/// The older PgBouncer in transaction pooling: the probe orders' notifications, a few
/// connections; says what came back.
async fn probe_older(bench: &Bench, url: &str, older: &pgbouncer::Binary, orders: &[(String, i64)]) -> Result<String> {
    let dir = bench.tmp.join("pgbouncer-older");
    let bouncer = pgbouncer::start(older, url, 4, &dir, "pgbouncer-older").await?;
    let server = match server_behind(bench, url, &bouncer, "server-b10-older").await {
        Ok(s) => s,
        Err(e) => return Ok(format!("fitorder serve did not start through it: {e:#}")),
    };
    let requests = tokio::task::block_in_place(|| sign_all(bench, orders, 2_000_000_000));
    let out = load::run(retarget(&requests, &server.base), 4, Until::Exhausted, 204, false).await?;
    drop(server);
    let log = std::fs::read_to_string(bench.tmp.join("server-b10-older.log")).unwrap_or_default();
    let why = log
        .lines()
        .find(|l| l.contains("prepared statement"))
        .map(|l| {
            let at = l.find("prepared statement").unwrap_or(0);
            l[at..].chars().take(120).collect::<String>()
        })
        .unwrap_or_else(|| "no error about prepared statements in the server's log".into());
    Ok(format!(
        "{} of {} notifications applied (204), {}; the server's log: \"{why}\"",
        out.ok,
        orders.len(),
        if out.failures() > 0 {
            out.describe_failures()
        } else {
            "no failures".into()
        }
    ))
}

async fn through_pgbouncer(bench: &Bench, url: &str, requests: &[Prepared], concurrency: usize) -> Result<Pooled> {
    let found = pgbouncer::installed();
    let Some(newest) = found.last().cloned() else {
        bail!(
            "no pgbouncer found (apt-get install pgbouncer gives 1.18, which cannot carry prepared statements in \
             transaction pooling; see bench/README.md for ≥ 1.21)"
        );
    };
    let db = connect(url).await?;
    let mut older = None;
    if newest.tracks_prepared_statements() {
        if let Some(old) = found.iter().find(|b| !b.tracks_prepared_statements()) {
            say!("B10: PgBouncer {} in transaction pooling, a probe ...", old.version);
            let orders = waiting(&db, "FBP").await?;
            older = Some(format!(
                "PgBouncer {} ({}) in transaction pooling, probed with {} notifications: {}",
                old.version,
                old.path.display(),
                orders.len(),
                probe_older(bench, url, old, &orders)
                    .await
                    .unwrap_or_else(|e| format!("{e:#}"))
            ));
        }
    }
    let pool_size = concurrency;
    let dir = bench.tmp.join("pgbouncer");
    let bouncer = pgbouncer::start(&newest, url, pool_size, &dir, "pgbouncer").await?;
    let server = server_behind(bench, url, &bouncer, "server-b10").await?;
    warm(&server, concurrency).await;
    let result = pass(
        &bench.pg.base,
        bench,
        &server,
        &db,
        retarget(requests, &server.base),
        concurrency,
        "B10",
    )
    .await;
    drop(server);
    drop(bouncer);
    let (pass, failed) = match result {
        Ok(p) => (Some(p), None),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    Ok(Pooled {
        pass,
        bouncer: newest,
        failed,
        older,
        pool_size,
    })
}

pub async fn run(bench: &mut Bench, args: &Args) -> Result<Vec<Row>> {
    let s = &args.sizes;
    let tpcb = pgbench::tpcb(bench, s.concurrency, s.pgbench_scale, s.pgbench_secs).await?;
    let (body, headers) = sample_evidence(bench);
    let floor = pgbench::floor(bench, s.concurrency, s.floor_payments, &body, &headers).await?;

    let url = seed::api_db(bench, s).await?;
    let api = bench.db_name("api");
    // Copies of B1's database before B1 pays anything: the same orders for B1b and B10.
    let b10_url = if args.wants("B10") {
        Some(bench.create_db("b10", Some(&api)).await?)
    } else {
        None
    };
    let b1b = if args.wants("B1b") {
        Some(history_db(bench, &api, s.history_orders, body.len()).await?)
    } else {
        None
    };

    let db = connect(&url).await?;
    let orders = waiting(&db, "FB1").await?;
    if orders.len() != s.notifications {
        bail!("expected {} waiting orders, found {}", s.notifications, orders.len());
    }
    let mut signed = Signed::new(bench, orders, 1);
    let n = signed.requests.len() as i64;

    // B1, B2, B8 on the API database.
    let server = bench.start_server(&url, "server-b1").await?;
    warm(&server, s.concurrency).await;
    // B1b's load wrote gigabytes: its checkpoint and autovacuum are not B1's to carry.
    crate::settle(bench, "B1").await;
    let rss_before = server.proc.status_kb("VmRSS").unwrap_or(0);
    let requests = retarget(signed.fresh(bench), &server.base);
    let b1 = pass(
        &bench.pg.base,
        bench,
        &server,
        &db,
        requests.clone(),
        s.concurrency,
        "B1",
    )
    .await?;
    let hwm_b1 = server.proc.status_kb("VmHWM").unwrap_or(0);
    let state = paid_state(&db).await?;
    let b2 = pass(&bench.pg.base, bench, &server, &db, requests, s.concurrency, "B2").await?;
    let hwm_b2 = server.proc.status_kb("VmHWM").unwrap_or(0);
    drop(server);
    let (per_payment, per_duplicate) = count_statements(bench, &url, &db).await?;

    // B1b: the same payments with a million orders and their history in the tables.
    let b1b_pass = match &b1b {
        Some(h) => {
            let hdb = connect(&h.url).await?;
            let server = bench.start_server(&h.url, "server-b1b").await?;
            warm(&server, s.concurrency).await;
            let requests = retarget(signed.fresh(bench), &server.base);
            let p = pass(&bench.pg.base, bench, &server, &hdb, requests, s.concurrency, "B1b").await?;
            let st = paid_state(&hdb).await?;
            Some((p, st))
        }
        None => None,
    };

    // B10: the same payments through PgBouncer in transaction pooling.
    let b10 = match &b10_url {
        Some(u) => {
            let requests = signed.fresh(bench).to_vec();
            Some(through_pgbouncer(bench, u, &requests, s.concurrency).await)
        }
        None => None,
    };

    let applied = count(&b1.outcomes, "APPLIED");
    let tpcb_text = format!(
        "pgbench tpcb-like {:.0} tps ({} clients, scale {}, {:.0} s; latency avg {:.1} ms)",
        tpcb.tps, tpcb.clients, tpcb.scale, tpcb.secs, tpcb.latency_ms
    );
    let mut rows = vec![];

    // ---- B1
    let mut r1 = Row::new(
        "B1",
        format!(
            "signed WeChat Pay notifications applied per second, {} connections, each a full payment",
            s.concurrency
        ),
        "≥ 0.7 × the one-statement floor of the same run (≈ 0.45 × pgbench tpcb-like); p99 ≤ 30 ms",
    );
    let vs_floor = b1.out.rate() / floor.run.tps;
    let vs_tpcb = b1.out.rate() / tpcb.tps;
    r1.ours = format!("{}; {vs_tpcb:.2} × tpcb-like", b1.describe("payments"));
    r1.baseline = format!(
        "one-statement floor {:.0} payments/s ({:.2} × tpcb-like); {tpcb_text}",
        floor.run.tps,
        floor.run.tps / tpcb.tps
    );
    r1.ratio = Some(vs_floor);
    r1.check(format!("ratio {vs_floor:.2} < 0.7"), vs_floor >= 0.7);
    r1.check(
        format!("p99 {:.1} ms > 30 ms", ms(b1.out.percentile(99.0))),
        b1.out.percentile(99.0) <= Duration::from_millis(30),
    );
    r1.check(
        "all applied",
        applied == n && b1.out.failures() == 0 && state == (n, n, 2 * n),
    );
    r1.note(format!(
        "{n} notifications, signed and encrypted ahead of time by `payments::sandbox` (as WeChat Pay does), \
         sent once each over {} keep-alive connections to `POST /pay/wechat/notify`; a 204 counts. \
         {:.1} s; outcomes: {}; orders PAID {}, payments {}, grant events {}.",
        s.concurrency,
        b1.out.elapsed.as_secs_f64(),
        fmt_outcomes(&b1.outcomes),
        state.0,
        state.1,
        state.2
    ));
    r1.note(floor_note(&floor, &tpcb));
    r1.note(b1.cpu.describe("fitorder server", b1.out.elapsed));
    r1.note(b1.stalls.clone());
    r1.note(format!(
        "PostgreSQL CPU per payment {:.2} ms; per floor payment {:.2} ms; per pgbench tpcb-like transaction {:.2} ms",
        1000.0 * b1.cpu.postgres / n as f64,
        1000.0 * floor.run.pg_cpu_per_txn,
        1000.0 * tpcb.pg_cpu_per_txn
    ));
    r1.note(format!(
        "SQL per payment (another {} notifications sent one by one to a server instance talking through a counting \
         wire-protocol proxy): {}",
        seed::PROBE_ORDERS,
        per_payment.per(seed::PROBE_ORDERS as usize, "payment")
    ));
    if b1.out.failures() > 0 {
        r1.note(format!("not 204: {}", b1.out.describe_failures()));
    }
    r1.note(
        "the server runs `serve --no-workers`: the grant events each payment writes are delivered by B6's \
         worker, not during B1",
    );
    rows.push(r1);

    // ---- B1b
    if let Some(h) = &b1b {
        let mut r = Row::new(
            "B1b",
            format!(
                "B1 with {} orders and their history already in the tables",
                h.loaded.orders
            ),
            "≥ 0.9 × B1 of the same run",
        );
        match &b1b_pass {
            Some((p, st)) => {
                let ratio = p.out.rate() / b1.out.rate();
                r.ours = format!(
                    "{}; {:.2} × the floor",
                    p.describe("payments"),
                    p.out.rate() / floor.run.tps
                );
                r.baseline = format!("B1: {}", b1.describe("payments"));
                r.ratio = Some(ratio);
                r.check(format!("ratio {ratio:.2} < 0.9"), ratio >= 0.9);
                r.check(
                    "all applied",
                    count(&p.outcomes, "APPLIED") == n && p.out.failures() == 0 && *st == (n, n, 2 * n),
                );
                r.note(format!(
                    "B1's very requests at a copy of B1's database (made before B1 ran) into which {} historic orders \
                     were loaded first: {}; loaded in {:.0} s by INSERT … SELECT over generate_series, then VACUUM \
                     ANALYZE and CHECKPOINT ({:.0} s)",
                    h.loaded.orders,
                    h.loaded
                        .rows
                        .iter()
                        .map(|(t, c)| format!("{t} {c}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    h.loaded.secs,
                    h.settle_secs
                ));
                r.note(format!(
                    "each historic order: placed and paid over the last 90 days (two audit rows), its payment, the \
                     callback's evidence row (`APPLIED`, a {}-byte body like a real notification's) and key, two \
                     grant events SUCCEEDED with one attempt each",
                    body.len()
                ));
                r.note(p.cpu.describe("fitorder server", p.out.elapsed));
                r.note(p.stalls.clone());
                r.note(format!(
                    "{:.1} s; outcomes: {}; PostgreSQL CPU per payment {:.2} ms (B1: {:.2} ms)",
                    p.out.elapsed.as_secs_f64(),
                    fmt_outcomes(&p.outcomes),
                    1000.0 * p.cpu.postgres / n as f64,
                    1000.0 * b1.cpu.postgres / n as f64
                ));
                if p.out.failures() > 0 {
                    r.note(format!("not 204: {}", p.out.describe_failures()));
                }
            }
            None => {
                r.ours = "failed".into();
                r.check("ran", false);
            }
        }
        rows.push(r);
    }

    // ---- B2
    let duplicates = count(&b2.outcomes, "DUPLICATE");
    let mut r2 = Row::new(
        "B2",
        "the same notifications again (all duplicates)",
        "≥ 2.0 × pgbench tpcb-like",
    );
    let ratio2 = b2.out.rate() / tpcb.tps;
    r2.ours = b2.describe("duplicates");
    r2.baseline = tpcb_text.clone();
    r2.ratio = Some(ratio2);
    r2.check(format!("ratio {ratio2:.2} < 2.0"), ratio2 >= 2.0);
    r2.check("all answered as duplicates", duplicates == n && b2.out.failures() == 0);
    r2.note(format!(
        "the exact requests of B1 resent to the same server; {:.1} s; outcomes after B2: {}",
        b2.out.elapsed.as_secs_f64(),
        fmt_outcomes(&b2.outcomes)
    ));
    r2.note(b2.cpu.describe("fitorder server", b2.out.elapsed));
    r2.note(b2.stalls.clone());
    r2.note(format!(
        "PostgreSQL CPU per duplicate {:.2} ms, per pgbench transaction {:.2} ms",
        1000.0 * b2.cpu.postgres / n as f64,
        1000.0 * tpcb.pg_cpu_per_txn
    ));
    r2.note(format!(
        "SQL per duplicate (counted as for B1): {}",
        per_duplicate.per(seed::PROBE_ORDERS as usize, "duplicate")
    ));
    if b2.out.failures() > 0 {
        r2.note(format!("not 204: {}", b2.out.describe_failures()));
    }
    rows.push(r2);

    // ---- B8
    let mut r8 = Row::new("B8", "server peak RSS during B1", "≤ 150 MB");
    r8.ours = format!("{:.1} MB", hwm_b1 as f64 / 1024.0);
    r8.check(
        format!("peak RSS {:.0} MB > 150 MB", hwm_b1 as f64 / 1024.0),
        hwm_b1 <= 150 * 1024,
    );
    r8.note(format!(
        "VmHWM of the server process (/proc/<pid>/status) after B1; RSS before B1 (started, pool open) {:.1} MB; \
         VmHWM after B2 {:.1} MB",
        rss_before as f64 / 1024.0,
        hwm_b2 as f64 / 1024.0
    ));
    rows.push(r8);

    // ---- B10
    if let Some(found) = b10 {
        let mut r = Row::new(
            "B10",
            "B1 through PgBouncer in transaction pooling",
            "≥ 0.8 × B1 direct",
        );
        match found {
            Err(e) => {
                r.ours = "not measured".into();
                r.check("ran", false);
                r.note(format!("{e:#}"));
            }
            Ok(p) => {
                r.baseline = format!("B1 direct: {}", b1.describe("payments"));
                match &p.pass {
                    Some(x) => {
                        let ratio = x.out.rate() / b1.out.rate();
                        let applied = count(&x.outcomes, "APPLIED");
                        r.ours = format!("{} through PgBouncer {}", x.describe("payments"), p.bouncer.version);
                        r.ratio = Some(ratio);
                        r.check(format!("ratio {ratio:.2} < 0.8"), ratio >= 0.8);
                        r.check("all applied", applied == n && x.out.failures() == 0);
                        r.note(format!(
                            "{:.1} s; outcomes: {}{}",
                            x.out.elapsed.as_secs_f64(),
                            fmt_outcomes(&x.outcomes),
                            if x.out.failures() > 0 {
                                format!("; not 204: {}", x.out.describe_failures())
                            } else {
                                String::new()
                            }
                        ));
                        r.note(x.cpu.describe("fitorder server", x.out.elapsed));
                        r.note(x.stalls.clone());
                    }
                    None => {
                        r.ours = format!("failed through PgBouncer {}", p.bouncer.version);
                        r.check("ran", false);
                        r.note(p.failed.clone().unwrap_or_default());
                    }
                }
                r.note(format!(
                    "PgBouncer {} ({}), pool_mode = transaction, default_pool_size = {} (as many server connections as \
                     the load has connections){}; the server's DATABASE_URL goes through it, \
                     FITORDER_LISTEN_DATABASE_URL (LISTEN and migrations) to PostgreSQL directly; B1's very requests \
                     at a copy of B1's database made before B1 ran",
                    p.bouncer.version,
                    p.bouncer.path.display(),
                    p.pool_size,
                    if p.bouncer.tracks_prepared_statements() {
                        ", max_prepared_statements = 200"
                    } else {
                        " (older than 1.21: no max_prepared_statements, so fitorder's prepared statements cannot work)"
                    }
                ));
                if let Some(o) = p.older {
                    r.note(o);
                }
            }
        }
        rows.push(r);
    }
    Ok(rows)
}

fn floor_note(floor: &Floor, tpcb: &Pgbench) -> String {
    format!(
        "the floor: pgbench -n -M prepared -c {} -j 2 -t {} -f {} (written by the bench): ONE prepared statement \
         per payment doing every write a real one does on the project's tables (the callback's evidence row, its \
         idempotency key, the order's WAIT_PAY → PAID through its transition trigger, the audit row, the payment, \
         the two grant events), then, after its commit and as fitorder does, a statement with the pg_notify of the \
         order, the events and the outbox; each over the next of {} \
         WAIT_PAY orders prepared for it, the evidence a real signed notification's body and headers; {:.0} \
         payments/s, latency avg {:.1} ms, {:.1} s; afterwards (PAID, payments, grant events, keys, callbacks) = \
         {:?}. Floor / tpcb-like = {:.2}",
        floor.run.clients,
        floor.payments / floor.run.clients as i64,
        floor.script.display(),
        floor.payments,
        floor.run.tps,
        floor.run.latency_ms,
        floor.run.secs,
        floor.written,
        floor.run.tps / tpcb.tps
    )
}

/// The rows of the group when B1 itself could not run.
pub fn failed_rows(args: &Args, e: &anyhow::Error) -> Vec<Row> {
    ["B1", "B1b", "B2", "B8", "B10"]
        .into_iter()
        .filter(|id| args.wants(id))
        .map(|id| Row::failed(id, e))
        .collect::<Vec<_>>()
}
