//! B1: signed WeChat Pay notifications applied per second (each a full payment), against
//! `pgbench` tpcb-like with the same number of clients on the same server.
//! B2: the same notifications again, all duplicates.
//! B8: the server's peak RSS over B1.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;

use crate::env::{connect, perf_stop, pgbench, Bench, CpuSplit};
use crate::load::{self, ms, Prepared, Until};
use crate::report::Row;
use crate::sqlcount::{upstream_of, via, Counts, SqlCounter};
use crate::{seed, Args};

/// pgbench's throughput on a scratch database: `-i -s scale`, then `-c clients -j 2 -T secs`.
pub struct Pgbench {
    pub tps: f64,
    /// PostgreSQL's CPU seconds per transaction.
    pub pg_cpu_per_txn: f64,
    pub latency_ms: f64,
    pub clients: usize,
    pub scale: u32,
    pub secs: u64,
}

pub async fn run_pgbench(bench: &mut Bench, clients: usize, scale: u32, secs: u64) -> Result<Pgbench> {
    let exe = pgbench()?;
    let url = bench.create_db("pgbench", None).await?;
    say!("pgbench: initializing scale {scale} ...");
    let init = tokio::task::spawn_blocking({
        let (exe, url) = (exe.clone(), url.clone());
        move || {
            Command::new(exe)
                .args(["-i", "-q", "-s", &scale.to_string()])
                .arg(&url)
                .output()
        }
    })
    .await??;
    if !init.status.success() {
        bail!("pgbench -i failed: {}", String::from_utf8_lossy(&init.stderr));
    }
    seed::exec(&connect(&url).await?, "checkpoint", "CHECKPOINT").await?;
    say!("pgbench: tpcb-like, {clients} clients, {secs} s ...");
    let cpu0 = CpuSplit::sample(0);
    let out = tokio::task::spawn_blocking({
        let url = url.clone();
        move || {
            Command::new(exe)
                .args(["-c", &clients.to_string(), "-j", "2", "-T", &secs.to_string()])
                .arg(&url)
                .output()
        }
    })
    .await??;
    let cpu1 = CpuSplit::sample(0);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() {
        bail!("pgbench failed: {}{}", text, String::from_utf8_lossy(&out.stderr));
    }
    let number_after = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    let tps = number_after("tps = ").with_context(|| format!("no tps in pgbench's output:\n{text}"))?;
    let latency_ms = number_after("latency average = ").unwrap_or(0.0);
    // The scratch data is not needed any more; dropping it frees its buffers for what follows.
    let name = bench.db_name("pgbench");
    bench.pg.drop_db(&name).await?;
    say!("pgbench: {tps:.0} tps, latency average {latency_ms:.1} ms");
    let pg_cpu_per_txn = cpu1.since(&cpu0).postgres / (tps * secs as f64);
    Ok(Pgbench {
        tps,
        pg_cpu_per_txn,
        latency_ms,
        clients,
        scale,
        secs,
    })
}

/// Signs one notification per order with the platform key, on every core (RSA signing is the
/// slow part and must not be inside the timed phase). The timestamps are set 4 minutes ahead:
/// WeChat Pay's window is ±5 minutes, so B1 and B2 have 9 minutes to send them.
fn sign_all(bench: &Bench, server: &str, orders: &[(String, i64)], first_txn: usize) -> Vec<Prepared> {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let chunk = orders.len().div_ceil(threads).max(1);
    let timestamp = chrono::Utc::now().timestamp() + 240;
    let url = format!("{server}/pay/wechat/notify");
    let mut all = Vec::with_capacity(orders.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = orders
            .chunks(chunk)
            .enumerate()
            .map(|(c, part)| {
                let w = bench.keys.wechat();
                let url = url.clone();
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
                                url: url.clone(),
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

async fn outcomes(db: &tokio_postgres::Client) -> Result<Vec<(String, i64)>> {
    Ok(db
        .query(
            "SELECT outcome, count(*) FROM payment_callbacks GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

fn fmt_outcomes(o: &[(String, i64)]) -> String {
    o.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", ")
}

/// The statements one payment and one duplicate cost: the probe orders' notifications sent one
/// at a time to a server instance whose database connections go through the counting proxy.
async fn count_statements(bench: &Bench, url: &str, db: &tokio_postgres::Client) -> Result<(Counts, Counts)> {
    let orders: Vec<(String, i64)> = db
        .query(
            "SELECT order_no, amount_cents - wallet_amount_cents FROM orders
              WHERE order_no LIKE 'FBP%' AND status = 'WAIT_PAY' ORDER BY id",
            &[],
        )
        .await?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let counter = SqlCounter::start(upstream_of(url)?).await?;
    let server = bench.start_server(&via(url, counter.port)?, "server-b1-count").await?;
    let probe = Arc::new(tokio::task::block_in_place(|| {
        sign_all(bench, &server.base, &orders, 1_000_000_000)
    }));
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

pub async fn run(bench: &mut Bench, args: &Args) -> Result<Vec<Row>> {
    let s = &args.sizes;
    let pg = run_pgbench(bench, s.concurrency, s.pgbench_scale, s.pgbench_secs).await?;
    let url = seed::api_db(bench, s).await?;
    let db = connect(&url).await?;
    let orders: Vec<(String, i64)> = db
        .query(
            "SELECT order_no, amount_cents - wallet_amount_cents FROM orders
              WHERE order_no LIKE 'FB1%' AND status = 'WAIT_PAY' ORDER BY id",
            &[],
        )
        .await?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    if orders.len() != s.notifications {
        bail!("expected {} waiting orders, found {}", s.notifications, orders.len());
    }
    let server = bench.start_server(&url, "server-b1").await?;
    say!("B1: signing {} notifications on every core ...", orders.len());
    let signing = Instant::now();
    let requests = Arc::new(tokio::task::block_in_place(|| {
        sign_all(bench, &server.base, &orders, 1)
    }));
    say!("B1: signed in {:.1} s", signing.elapsed().as_secs_f64());

    // Open the server's pool connections before the clock starts (pgbench's tps excludes its
    // connection time too).
    let http = reqwest::Client::new();
    let warm: Vec<_> = (0..s.concurrency * 2)
        .map(|_| http.get(format!("{}/readyz", server.base)).send())
        .collect();
    futures_util::future::join_all(warm).await;
    let rss_before = server.proc.status_kb("VmRSS").unwrap_or(0);

    seed::exec(&db, "checkpoint", "CHECKPOINT").await?;
    say!("B1: {} payments over {} connections ...", requests.len(), s.concurrency);
    let perf = bench.perf_attach(server.proc.pid(), "B1")?;
    let cpu0 = CpuSplit::sample(server.proc.pid());
    let b1 = load::run(requests.clone(), s.concurrency, Until::Exhausted, 204, false).await?;
    let cpu1 = CpuSplit::sample(server.proc.pid());
    perf_stop(perf);
    let hwm_b1 = server.proc.status_kb("VmHWM").unwrap_or(0);
    let after_b1 = outcomes(&db).await?;
    say!(
        "B1: {:.0} payments/s, p50 {:.1} ms, p99 {:.1} ms; outcomes: {}",
        b1.rate(),
        ms(b1.percentile(50.0)),
        ms(b1.percentile(99.0)),
        fmt_outcomes(&after_b1)
    );

    seed::exec(&db, "checkpoint", "CHECKPOINT").await?;
    say!("B2: the same {} notifications again ...", requests.len());
    let perf = bench.perf_attach(server.proc.pid(), "B2")?;
    let cpu2 = CpuSplit::sample(server.proc.pid());
    let b2 = load::run(requests.clone(), s.concurrency, Until::Exhausted, 204, false).await?;
    let cpu3 = CpuSplit::sample(server.proc.pid());
    perf_stop(perf);
    let hwm_b2 = server.proc.status_kb("VmHWM").unwrap_or(0);
    let after_b2 = outcomes(&db).await?;
    say!(
        "B2: {:.0} duplicates/s, p50 {:.1} ms, p99 {:.1} ms; outcomes: {}",
        b2.rate(),
        ms(b2.percentile(50.0)),
        ms(b2.percentile(99.0)),
        fmt_outcomes(&after_b2)
    );
    let state: (i64, i64, i64) = {
        let r = db
            .query_one(
                "SELECT (SELECT count(*) FROM orders WHERE order_no LIKE 'FB1%' AND status = 'PAID'),
                        (SELECT count(*) FROM payments p JOIN orders o ON o.id = p.order_id WHERE o.order_no LIKE 'FB1%'),
                        (SELECT count(*) FROM compensation_events e JOIN orders o ON o.id = e.order_id
                          WHERE o.order_no LIKE 'FB1%')",
                &[],
            )
            .await?;
        (r.get(0), r.get(1), r.get(2))
    };
    drop(server);
    let (per_payment, per_duplicate) = count_statements(bench, &url, &db).await?;

    let n = requests.len() as i64;
    let count = |o: &[(String, i64)], k: &str| o.iter().find(|(x, _)| x == k).map(|(_, c)| *c).unwrap_or(0);
    let applied = count(&after_b1, "APPLIED");
    let duplicates = count(&after_b2, "DUPLICATE");
    let baseline = format!(
        "pgbench tpcb-like {:.0} tps ({} clients, scale {}, {} s; latency avg {:.1} ms)",
        pg.tps, pg.clients, pg.scale, pg.secs, pg.latency_ms
    );

    let mut r1 = Row::new(
        "B1",
        format!(
            "signed WeChat Pay notifications applied per second, {} connections, each a full payment",
            s.concurrency
        ),
        "ratio ≥ 0.5; p99 ≤ 50 ms",
    );
    let ratio1 = b1.rate() / pg.tps;
    r1.ours = format!(
        "{:.0} payments/s (p50 {:.1} ms, p99 {:.1} ms)",
        b1.rate(),
        ms(b1.percentile(50.0)),
        ms(b1.percentile(99.0))
    );
    r1.baseline = baseline.clone();
    r1.ratio = Some(ratio1);
    r1.check("ratio", ratio1 >= 0.5);
    r1.check("p99", b1.percentile(99.0) <= Duration::from_millis(50));
    r1.check(
        "all applied",
        applied == n && b1.failures() == 0 && state == (n, n, 2 * n),
    );
    r1.note(format!(
        "{n} notifications, signed and encrypted ahead of time by `payments::sandbox` (as WeChat Pay does), \
         sent once each over {} keep-alive connections to `POST /pay/wechat/notify`; a 204 counts. \
         {:.1} s; outcomes after B1: {}; orders PAID {}, payments {}, grant events {}.",
        s.concurrency,
        b1.elapsed.as_secs_f64(),
        fmt_outcomes(&after_b1),
        state.0,
        state.1,
        state.2
    ));
    r1.note(cpu1.since(&cpu0).describe("fitorder server", b1.elapsed));
    r1.note(format!(
        "PostgreSQL CPU per payment {:.2} ms, per pgbench transaction {:.2} ms",
        1000.0 * cpu1.since(&cpu0).postgres / n as f64,
        1000.0 * pg.pg_cpu_per_txn
    ));
    r1.note(format!(
        "SQL per payment (another {} notifications sent one by one to a server instance talking through a counting \
         wire-protocol proxy): {}",
        seed::PROBE_ORDERS,
        per_payment.per(seed::PROBE_ORDERS as usize, "payment")
    ));
    if b1.failures() > 0 {
        r1.note(format!("not 204: {}", b1.describe_failures()));
    }
    r1.note(
        "the server runs `serve --no-workers`: the grant events each payment writes are delivered by B6's \
         worker, not during B1",
    );

    let mut r2 = Row::new("B2", "the same notifications again (all duplicates)", "ratio ≥ 1.5");
    let ratio2 = b2.rate() / pg.tps;
    r2.ours = format!(
        "{:.0} duplicates/s (p50 {:.1} ms, p99 {:.1} ms)",
        b2.rate(),
        ms(b2.percentile(50.0)),
        ms(b2.percentile(99.0))
    );
    r2.baseline = baseline;
    r2.ratio = Some(ratio2);
    r2.check("ratio", ratio2 >= 1.5);
    r2.check("all answered as duplicates", duplicates == n && b2.failures() == 0);
    r2.note(format!(
        "the exact requests of B1 resent; {:.1} s; outcomes after B2: {}",
        b2.elapsed.as_secs_f64(),
        fmt_outcomes(&after_b2)
    ));
    r2.note(cpu3.since(&cpu2).describe("fitorder server", b2.elapsed));
    r2.note(format!(
        "PostgreSQL CPU per duplicate {:.2} ms, per pgbench transaction {:.2} ms",
        1000.0 * cpu3.since(&cpu2).postgres / n as f64,
        1000.0 * pg.pg_cpu_per_txn
    ));
    r2.note(format!(
        "SQL per duplicate (counted as for B1): {}",
        per_duplicate.per(seed::PROBE_ORDERS as usize, "duplicate")
    ));
    if b2.failures() > 0 {
        r2.note(format!("not 204: {}", b2.describe_failures()));
    }

    let mut r8 = Row::new("B8", "server peak RSS during B1", "≤ 150 MB");
    r8.ours = format!("{:.1} MB", hwm_b1 as f64 / 1024.0);
    r8.check("peak RSS", hwm_b1 <= 150 * 1024);
    r8.note(format!(
        "VmHWM of the server process (/proc/<pid>/status) after B1; RSS before B1 (started, pool open) {:.1} MB; \
         VmHWM after B2 {:.1} MB",
        rss_before as f64 / 1024.0,
        hwm_b2 as f64 / 1024.0
    ));
    Ok(vec![r1, r2, r8])
}
