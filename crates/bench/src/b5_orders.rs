//! B5: the admin console's `Orders` operation with `first: 100` from concurrent clients,
//! against a raw tokio-postgres client fetching the same rows; plus the SQL statements one
//! request costs, which must not grow with the page size.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use tokio_postgres::Client;

use crate::env::{connect, perf_stop, Bench, CpuSplit, Server};
use crate::load::{self, ms, Prepared, Until};
use crate::report::Row;
use crate::sqlcount::{upstream_of, via, Counts, SqlCounter};
use crate::{seed, Args, Sizes};

/// The admin console's documents, as the console sends them.
const ADMIN_DOCUMENTS: &str = include_str!("../../../playground/operations/admin.graphql");

/// The `Orders` operation cut out of the admin documents (braces balanced).
pub fn orders_operation() -> Result<String> {
    let start = ADMIN_DOCUMENTS
        .find("query Orders(")
        .context("no `query Orders(` in playground/operations/admin.graphql")?;
    let mut depth = 0usize;
    for (i, c) in ADMIN_DOCUMENTS[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Ok(ADMIN_DOCUMENTS[start..start + i + 1].to_string());
                }
            }
            _ => {}
        }
    }
    bail!("the Orders operation is not closed")
}

pub(crate) fn request(server: &str, token: &str, doc: &str, first: i32) -> Prepared {
    let body = serde_json::json!({"query": doc, "operationName": "Orders", "variables": {"first": first}});
    Prepared {
        url: format!("{server}/graphql"),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("authorization".into(), format!("Bearer {token}")),
        ],
        body: Bytes::from(body.to_string()),
    }
}

/// The statements one request costs, counted by the wire-protocol proxy over `n` sequential
/// requests (after one that opens the pool's connections).
async fn statements_per_request(counter: &SqlCounter, req: &Prepared, n: usize) -> Result<Counts> {
    let http = reqwest::Client::new();
    let send = || async {
        let mut b = http.post(&req.url).body(req.body.clone());
        for (k, v) in &req.headers {
            b = b.header(k, v);
        }
        let r = b.send().await?;
        if !r.status().is_success() {
            bail!("Orders answered {}", r.status());
        }
        r.bytes().await?;
        Ok::<(), anyhow::Error>(())
    };
    send().await?;
    let before = counter.counts();
    for _ in 0..n {
        send().await?;
    }
    Ok(counter.counts().since(&before))
}

/// What the resolver needs for one page, by hand: the count, the page, then members, stores,
/// compensation events and tickets of the page's orders (those four pipelined on the one
/// connection, as the DataLoaders run them concurrently).
type Param<'a> = [&'a (dyn tokio_postgres::types::ToSql + Sync); 1];

struct RawClient {
    db: Client,
    count: tokio_postgres::Statement,
    page: tokio_postgres::Statement,
    members: tokio_postgres::Statement,
    stores: tokio_postgres::Statement,
    events: tokio_postgres::Statement,
    tickets: tokio_postgres::Statement,
}

impl RawClient {
    async fn new(url: &str) -> Result<RawClient> {
        let db = connect(url).await?;
        Ok(RawClient {
            count: db.prepare("SELECT count(*) FROM orders").await?,
            page: db.prepare("SELECT * FROM orders ORDER BY id DESC LIMIT $1").await?,
            members: db.prepare("SELECT * FROM members WHERE id = ANY($1)").await?,
            stores: db.prepare("SELECT * FROM stores WHERE id = ANY($1)").await?,
            events: db
                .prepare("SELECT * FROM compensation_events WHERE order_id = ANY($1) ORDER BY id")
                .await?,
            tickets: db
                .prepare("SELECT * FROM exception_tickets WHERE order_id = ANY($1) ORDER BY id")
                .await?,
            db,
        })
    }

    /// One page; returns how many rows came back in all.
    async fn page(&self, first: i64) -> Result<usize> {
        let count = self.db.query_one(&self.count, &[]).await?;
        let _total: i64 = count.get(0);
        let orders = self.db.query(&self.page, &[&(first + 1)]).await?;
        let n = orders.len().min(first as usize);
        let orders = &orders[..n];
        let ids: Vec<i64> = orders.iter().map(|r| r.get("id")).collect();
        let mut members: Vec<i64> = orders.iter().map(|r| r.get("member_id")).collect();
        let mut stores: Vec<i64> = orders.iter().map(|r| r.get("store_id")).collect();
        members.sort_unstable();
        members.dedup();
        stores.sort_unstable();
        stores.dedup();
        let (pm, ps, pi): (Param, Param, Param) = ([&members], [&stores], [&ids]);
        let (m, s, e, t) = futures_util::try_join!(
            self.db.query(&self.members, &pm),
            self.db.query(&self.stores, &ps),
            self.db.query(&self.events, &pi),
            self.db.query(&self.tickets, &pi),
        )?;
        Ok(1 + n + m.len() + s.len() + e.len() + t.len())
    }
}

async fn baseline(url: &str, clients: usize, secs: u64, first: i64) -> Result<load::Outcome> {
    let mut conns = vec![];
    for _ in 0..clients {
        conns.push(RawClient::new(url).await?);
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|c| {
            tokio::spawn(async move {
                let mut lat = vec![];
                while Instant::now() < deadline {
                    let t = Instant::now();
                    c.page(first).await?;
                    lat.push(t.elapsed());
                }
                Ok::<_, anyhow::Error>(lat)
            })
        })
        .collect();
    let mut out = load::Outcome::default();
    for t in tasks {
        out.latencies.extend(t.await??);
    }
    out.elapsed = started.elapsed();
    out.ok = out.latencies.len();
    out.latencies.sort_unstable();
    Ok(out)
}

/// `req` (an `Orders` page) over `s.concurrency` connections for `s.orders_secs` at `server`,
/// recorded by perf when asked, with where the CPU went over the run (B5, B5r).
pub(crate) async fn timed_pages(
    bench: &Bench,
    server: &Server,
    req: Prepared,
    s: &Sizes,
    label: &str,
) -> Result<(load::Outcome, CpuSplit)> {
    say!(
        "{label}: Orders first: 100, {} connections, {} s ...",
        s.concurrency,
        s.orders_secs
    );
    let perf = bench.perf_attach(server.proc.pid(), label)?;
    let cpu0 = CpuSplit::sample(server.proc.pid());
    let out = load::run(
        Arc::new(vec![req]),
        s.concurrency,
        Until::Elapsed(Duration::from_secs(s.orders_secs)),
        200,
        true,
    )
    .await?;
    let cpu1 = CpuSplit::sample(server.proc.pid());
    perf_stop(perf);
    say!(
        "{label}: {:.0} requests/s, p50 {:.1} ms, p99 {:.1} ms",
        out.rate(),
        ms(out.percentile(50.0)),
        ms(out.percentile(99.0))
    );
    Ok((out, cpu1.since(&cpu0)))
}

pub async fn run(bench: &mut Bench, args: &Args) -> Result<Row> {
    let s = &args.sizes;
    let url = seed::api_db(bench, s).await?;
    // B1 may have just written to the tables: vacuum now rather than let autovacuum's own
    // transactions land in the statement count.
    seed::settle(&url).await?;
    let doc = orders_operation()?;
    let token = bench.token("admin", "bench")?;
    let server = bench.start_server(&url, "server-b5").await?;

    // One request first: it must answer a full page, without errors.
    let probe = request(&server.base, &token, &doc, 100);
    let resp: serde_json::Value = reqwest::Client::new()
        .post(&probe.url)
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(probe.body.clone())
        .send()
        .await?
        .json()
        .await?;
    let edges = resp["data"]["orders"]["edges"].as_array().map(|e| e.len()).unwrap_or(0);
    if resp.get("errors").is_some() || edges != 100 {
        bail!(
            "Orders did not answer a page of 100: {}",
            resp.to_string().chars().take(400).collect::<String>()
        );
    }
    let total = resp["data"]["orders"]["totalCount"].as_i64().unwrap_or(0);
    let comp: usize = resp["data"]["orders"]["edges"]
        .as_array()
        .map(|e| {
            e.iter()
                .map(|x| x["node"]["compensation"].as_array().map_or(0, |a| a.len()))
                .sum()
        })
        .unwrap_or(0);
    let tickets: usize = resp["data"]["orders"]["edges"]
        .as_array()
        .map(|e| {
            e.iter()
                .map(|x| x["node"]["tickets"].as_array().map_or(0, |a| a.len()))
                .sum()
        })
        .unwrap_or(0);

    say!("B5: counting SQL statements per request (a server talking through a counting proxy) ...");
    let (per_100, per_10) = {
        let counter = SqlCounter::start(upstream_of(&url)?).await?;
        let counted = bench.start_server(&via(&url, counter.port)?, "server-b5-count").await?;
        let per_100 =
            statements_per_request(&counter, &request(&counted.base, &token, &doc, 100), s.count_requests).await?;
        let per_10 =
            statements_per_request(&counter, &request(&counted.base, &token, &doc, 10), s.count_requests).await?;
        (per_100, per_10)
    };
    let n = s.count_requests;
    let (all_100, all_10) = (per_100.all() as f64 / n as f64, per_10.all() as f64 / n as f64);
    say!("B5: {all_100:.1} statements per request with first: 100, {all_10:.1} with first: 10");

    let (ours, cpu) = timed_pages(bench, &server, probe, s, "B5").await?;
    let hwm = server.proc.status_kb("VmHWM").unwrap_or(0);
    drop(server);

    say!(
        "B5: baseline, raw SQL, {} connections, {} s ...",
        s.concurrency,
        s.orders_secs
    );
    let cpu2 = CpuSplit::sample(0);
    let base = baseline(&url, s.concurrency, s.orders_secs, 100).await?;
    let cpu3 = CpuSplit::sample(0);
    say!(
        "B5: baseline {:.0} pages/s, p50 {:.1} ms, p99 {:.1} ms",
        base.rate(),
        ms(base.percentile(50.0)),
        ms(base.percentile(99.0))
    );

    let ratio = ours.rate() / base.rate();
    let mut r = Row::new(
        "B5",
        format!(
            "the admin console's `Orders` operation, `first: 100`, {} connections",
            s.concurrency
        ),
        "≥ 0.5 × the raw tokio-postgres client; p99 ≤ 60 ms; SQL statements per request constant in page size (≤ 6)",
    );
    r.ours = format!(
        "{:.0} requests/s (p50 {:.1} ms, p99 {:.1} ms); {all_100:.1} statements/request at first: 100, {all_10:.1} at first: 10",
        ours.rate(),
        ms(ours.percentile(50.0)),
        ms(ours.percentile(99.0)),
    );
    r.baseline = format!(
        "raw tokio-postgres, 6 statements: {:.0} pages/s (p50 {:.1} ms, p99 {:.1} ms)",
        base.rate(),
        ms(base.percentile(50.0)),
        ms(base.percentile(99.0))
    );
    r.ratio = Some(ratio);
    // "Constant" allows the odd background transaction in the counter: within half a statement.
    r.check(format!("ratio {ratio:.2} < 0.5"), ratio >= 0.5);
    r.check(
        format!("p99 {:.1} ms > 60 ms", ms(ours.percentile(99.0))),
        ours.percentile(99.0) <= Duration::from_millis(60),
    );
    r.check(format!("{all_100:.1} statements > 6"), all_100 <= 6.0);
    r.check(
        format!("statements {all_100:.1} at 100 vs {all_10:.1} at 10"),
        (all_100 - all_10).abs() < 0.5,
    );
    r.check("no errors", ours.failures() == 0);
    r.note(format!(
        "the `Orders` document of playground/operations/admin.graphql with {{\"first\": 100}} and an admin token \
         from `fitorder token`; each page: {total} orders in totalCount, 100 edges with member, store, {comp} \
         compensation events and {tickets} tickets; a 200 without `errors` counts"
    ));
    r.note(format!(
        "statements per request: every statement the server sent to PostgreSQL over {n} sequential requests, counted \
         by a wire-protocol proxy between a second server instance and PostgreSQL (simple queries and extended-protocol \
         Executes, classified by their SQL; the timed run talks to PostgreSQL directly): first: 100 → {}; first: 10 → {}",
        per_100.per(n, "request"),
        per_10.per(n, "request")
    ));
    r.note(format!(
        "{}; server CPU per page {:.2} ms, PostgreSQL CPU per page {:.2} ms",
        cpu.describe("fitorder server", ours.elapsed),
        1e3 * cpu.subject / ours.ok.max(1) as f64,
        1e3 * cpu.postgres / ours.ok.max(1) as f64
    ));
    let base_cpu = cpu3.since(&cpu2);
    r.note(format!(
        "baseline: {} tokio-postgres connections, prepared statements: count, page of 101, then members, stores, \
         compensation events, tickets by `= ANY($1)` pipelined; rows decoded, no JSON. {}; PostgreSQL CPU per page \
         {:.2} ms",
        s.concurrency,
        base_cpu.describe("", base.elapsed),
        1e3 * base_cpu.postgres / base.ok.max(1) as f64
    ));
    r.note(format!("server VmHWM after B5: {:.1} MB", hwm as f64 / 1024.0));
    if ours.failures() > 0 {
        r.note(format!("failed requests: {}", ours.describe_failures()));
    }
    Ok(r)
}
