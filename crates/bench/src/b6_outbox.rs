//! B6: pending compensation events delivered by `fitorder worker` to a local no-op downstream,
//! against a plain HTTP client loop posting the same requests to the same downstream, and
//! against graphile-worker (npm) delivering the same requests as jobs on the same PostgreSQL
//! (`peer`), all measured in this run.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use bytes::Bytes;

use crate::env::{connect, perf_stop, Bench, CpuSplit, Proc};
use crate::load::{self, Prepared, Until};
use crate::report::Row;
use crate::sqlcount::{upstream_of, via, Counts, SqlCounter};
use crate::{peer, seed, Sizes};

/// The requests the worker makes for these events (`compensation::downstream`'s access body),
/// for the baseline to make too.
async fn same_requests(db: &tokio_postgres::Client, noop: &str) -> Result<Vec<Prepared>> {
    let rows = db
        .query(
            "SELECT id, kind, payload::text, idempotency_key, trace_id FROM compensation_events
              WHERE trace_id <> 'bench-probe' ORDER BY id",
            &[],
        )
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let id: i64 = r.get(0);
            let kind: String = r.get(1);
            let payload: serde_json::Value = serde_json::from_str(r.get::<_, &str>(2)).unwrap_or_default();
            let body = serde_json::json!({
                "eventId": id.to_string(),
                "orderNo": payload["orderNo"],
                "memberId": payload["memberId"],
                "storeId": payload["storeId"],
                "action": payload["action"],
                "idempotencyKey": r.get::<_, String>(3),
            });
            let path = if kind.starts_with("DOOR") {
                "door-access"
            } else {
                "ai-access"
            };
            Prepared {
                url: format!("{noop}/{path}"),
                headers: vec![
                    ("content-type".into(), "application/json".into()),
                    ("x-trace-id".into(), r.get::<_, String>(4)),
                ],
                body: Bytes::from(body.to_string()),
            }
        })
        .collect())
}

/// Events for the statement count: revocations of the first orders (the grants are taken).
const PROBE_EVENTS: i64 = 256;

/// The statements one delivered event costs: a worker whose connections go through the counting
/// proxy, idle first (its start-up is not counted), then given PROBE_EVENTS new events.
async fn count_statements(bench: &Bench, url: &str, db: &tokio_postgres::Client) -> Result<Counts> {
    let counter = SqlCounter::start(upstream_of(url)?).await?;
    let log = bench.tmp.join("worker-b6-count.log");
    let mut worker = Proc::spawn(
        "worker-b6-count",
        bench.fitorder(&via(url, counter.port)?, &["worker"]),
        Some(log),
    )?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    if let Some(st) = worker.exited() {
        bail!("fitorder worker exited ({st}):\n{}", worker.log_tail());
    }
    let c0 = counter.counts();
    seed::exec(
        db,
        "probe events",
        &format!(
            "INSERT INTO compensation_events (order_id, kind, max_attempts, payload, idempotency_key, trace_id)
             SELECT o.id, k.kind, 5,
                    jsonb_build_object('orderNo', o.order_no, 'memberId', o.member_id::text,
                                       'storeId', o.store_id::text, 'action', 'REVOKE'),
                    o.order_no || ':' || k.kind, 'bench-probe'
               FROM (SELECT * FROM orders ORDER BY id LIMIT {PROBE_EVENTS} / 2) o
              CROSS JOIN (VALUES ('DOOR_ACCESS_REVOKE'), ('AI_ACCESS_REVOKE')) AS k(kind);
             SELECT pg_notify('fitorder_outbox', '');"
        ),
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pending: i64 = db
            .query_one(
                "SELECT count(*) FROM compensation_events WHERE status IN ('PENDING', 'RETRYING')",
                &[],
            )
            .await?
            .get(0);
        if pending == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the counted worker left {pending} events pending:\n{}",
                worker.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(counter.counts().since(&c0))
}

pub async fn run(bench: &mut Bench, s: &Sizes) -> Result<Row> {
    let n = s.outbox_events;
    say!("B6: seeding {n} pending events ...");
    let url = bench.fresh_db("b6").await?;
    let db = connect(&url).await?;
    seed::catalog(&db, seed::MEMBERS).await?;
    seed::waiting_orders(&db, "FB6", n / 2, seed::MEMBERS, "now() + interval '1 day'").await?;
    seed::pay(&db, "FB6", "now()").await?;
    seed::grants(&db, "FB6", "PENDING").await?;
    seed::settle(&url).await?;

    say!("B6: fitorder worker ...");
    bench.noop.reset();
    let spawned = Instant::now();
    let log = bench.tmp.join("worker-b6.log");
    let mut worker = Proc::spawn("worker-b6", bench.fitorder(&url, &["worker"]), Some(log))?;
    let perf = bench.perf_attach(worker.pid(), "B6")?;
    let cpu0 = CpuSplit::sample(worker.pid());
    // The downstream counts what it receives: poll that (free) until everything arrived, then
    // the database until every event is recorded as delivered.
    let mut last = (0, Instant::now());
    loop {
        let hits = bench.noop.hits.load(Ordering::Relaxed);
        if hits >= n as u64 {
            break;
        }
        if hits != last.0 {
            last = (hits, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(30) {
            bail!("the worker stopped delivering at {hits} of {n}:\n{}", worker.log_tail());
        }
        if let Some(st) = worker.exited() {
            bail!("fitorder worker exited ({st}):\n{}", worker.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pending: i64 = db
            .query_one(
                "SELECT count(*) FROM compensation_events WHERE status IN ('PENDING', 'RETRYING')",
                &[],
            )
            .await?
            .get(0);
        if pending == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!("{pending} events still pending a minute after the downstream got them all");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let done = Instant::now();
    let cpu1 = CpuSplit::sample(worker.pid());
    perf_stop(perf);
    worker.stop();
    let first = bench.noop.first_hit().unwrap_or(spawned);
    let ours = done - first;
    let hits = bench.noop.hits.load(Ordering::Relaxed);
    let (succeeded, attempts): (i64, i64) = {
        let r = db
            .query_one(
                "SELECT (SELECT count(*) FROM compensation_events WHERE status = 'SUCCEEDED'),
                        (SELECT count(*) FROM compensation_attempts)",
                &[],
            )
            .await?;
        (r.get(0), r.get(1))
    };
    let rate = n as f64 / ours.as_secs_f64();
    say!("B6: {rate:.0} events/s ({:.2} s)", ours.as_secs_f64());
    let per_event = count_statements(bench, &url, &db).await?;

    say!("B6: baseline, plain HTTP client loop ...");
    let requests = Arc::new(same_requests(&db, &bench.noop.url).await?);
    bench.noop.reset();
    let cpu2 = CpuSplit::sample(0);
    let base = load::run(requests.clone(), s.concurrency, Until::Exhausted, 200, false).await?;
    let cpu3 = CpuSplit::sample(0);
    let base_rate = base.rate();
    say!("B6: baseline {base_rate:.0} requests/s");

    // The requests go to the downstream as they are; the peer gets the very same list.
    let peer = peer::run(bench, &requests).await;
    match &peer {
        Ok(p) => say!("B6: graphile-worker {:.0} jobs/s ({:.2} s)", p.rate, p.secs),
        Err(e) => say!("B6: graphile-worker failed: {e:#}"),
    }

    let ratio = rate / base_rate;
    let mut r = Row::new(
        "B6",
        format!("{n} pending compensation events delivered to a local no-op downstream"),
        "≥ 0.5 × a bare HTTP loop, and ≥ 2 × graphile-worker delivering the same calls as jobs on the same PostgreSQL",
    );
    r.ours = format!("{rate:.0} events/s ({:.2} s)", ours.as_secs_f64());
    r.baseline = format!(
        "plain reqwest loop, {} concurrent: {base_rate:.0} requests/s ({:.2} s); {}",
        s.concurrency,
        base.elapsed.as_secs_f64(),
        match &peer {
            Ok(p) => format!(
                "graphile-worker {}: {:.0} jobs/s ({:.2} s) = {:.2} × ours",
                p.version,
                p.rate,
                p.secs,
                p.rate / rate
            ),
            Err(_) => "graphile-worker: failed".into(),
        }
    );
    r.ratio = Some(ratio);
    r.check(format!("ratio {ratio:.2} < 0.5 of the bare loop"), ratio >= 0.5);
    match &peer {
        Ok(p) => {
            let vs = rate / p.rate;
            r.check(format!("{vs:.2} < 2 × graphile-worker"), vs >= 2.0);
        }
        Err(_) => r.check("graphile-worker measured", false),
    }
    r.check(
        "all delivered once",
        succeeded == n && attempts == n && hits == n as u64 && base.failures() == 0,
    );
    r.note(format!(
        "`fitorder worker` (its workers and batch size as the server runs them) against DOOR_ACCESS_GRANT / \
         AI_ACCESS_GRANT events due now; timed from the first request reaching the downstream ({:.2} s after the \
         spawn) until no event is PENDING or RETRYING; {succeeded} SUCCEEDED, {attempts} attempts recorded, {hits} \
         requests received",
        (first - spawned).as_secs_f64()
    ));
    // The bench process is the downstream here, not a load generator.
    r.note(
        cpu1.since(&cpu0)
            .describe("fitorder worker", done - spawned)
            .replace("load generator", "bench process (the no-op downstream)"),
    );
    r.note(format!(
        "SQL per event ({PROBE_EVENTS} more events given to an idle worker talking through a counting wire-protocol \
         proxy): {}",
        per_event.per(PROBE_EVENTS as usize, "event")
    ));
    r.note(format!(
        "baseline: the worker's very requests (same JSON body and headers, same URLs) posted by {} keep-alive \
         connections, each request once; {}",
        s.concurrency,
        cpu3.since(&cpu2).describe("", base.elapsed)
    ));
    match &peer {
        Ok(p) => r.note(format!(
            "peer: graphile-worker {} (npm, pinned in crates/bench/peer/package-lock.json) on Node.js {}, its own database on \
             the same PostgreSQL; the same {n} requests added as `deliver` jobs beforehand (not timed), then \
             crates/bench/peer/deliver.mjs runs the worker with concurrency {}, localQueue.size {}, completeJobBatchDelay \
             and failJobBatchDelay 0 (its documented batching for many fast jobs), each job one POST over \
             keep-alive node:http; timed from the first request reaching the downstream until \
             graphile_worker._private_jobs is empty; {} requests received. {}",
            p.version,
            p.node,
            peer::CONCURRENCY,
            peer::LOCAL_QUEUE,
            p.hits,
            p.cpu
                .describe("graphile-worker (node)", p.wall)
                .replace("load generator", "bench process (the no-op downstream)")
        )),
        Err(e) => r.note(format!("graphile-worker failed: {e:#}")),
    }
    Ok(r)
}
