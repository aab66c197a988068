//! B15: the front desk finds a member by the last four digits of the phone (issue 39): the
//! admin console's `FindMembers` (`members(filter: {phone: "1234"})`, its count and first page)
//! on a million members from concurrent clients, against a raw tokio-postgres client running
//! the same two statements; and the plan PostgreSQL takes for them (EXPLAIN), which must use
//! the last-four index, never a scan of the table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use tokio_postgres::Client;

use crate::env::{connect, Bench, CpuSplit};
use crate::load::{self, ms, Prepared, Until};
use crate::report::Row;
use crate::{seed, Sizes};

/// The console's next documents, as the console sends them.
const NEXT_ADMIN: &str = include_str!("../../../playground/operations/next/admin.graphql");

/// The last fours asked, in turn: each matches a hundred of the million (`139` + 8 digits).
const KEYS: usize = 500;

fn last_four(i: usize) -> String {
    format!("{:04}", (i * 7919) % 10_000)
}

/// The `FindMembers` operation cut out of the next admin documents (braces balanced).
fn find_members_operation() -> Result<String> {
    let start = NEXT_ADMIN
        .find("query FindMembers(")
        .context("no `query FindMembers(` in playground/operations/next/admin.graphql")?;
    let mut depth = 0usize;
    for (i, c) in NEXT_ADMIN[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Ok(NEXT_ADMIN[start..start + i + 1].to_string());
                }
            }
            _ => {}
        }
    }
    bail!("the FindMembers operation is not closed")
}

fn request(server: &str, token: &str, doc: &str, phone: &str) -> Prepared {
    let body = serde_json::json!({
        "query": doc, "operationName": "FindMembers",
        "variables": {"filter": {"phone": phone}, "first": 20}
    });
    Prepared {
        url: format!("{server}/graphql"),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("authorization".into(), format!("Bearer {token}")),
        ],
        body: Bytes::from(body.to_string()),
    }
}

const COUNT: &str = "SELECT count(*) FROM members WHERE right(members.phone, 4) = $1";
const PAGE: &str = "SELECT * FROM members WHERE right(members.phone, 4) = $1 ORDER BY id DESC LIMIT 21";
/// What the document selects of the page's members besides their rows: their stores and their
/// unused session credits (the server's two DataLoader batches).
const STORES: &str = "SELECT * FROM stores WHERE id = ANY($1)";
const CREDITS: &str = "SELECT member_id, sum(sessions_total - sessions_used) FROM orders
                        WHERE member_id = ANY($1) AND status IN ('PAID', 'CONSUMING') GROUP BY member_id";

/// What PostgreSQL does for the count and the page of one last four, as text.
async fn plans(db: &Client) -> Result<String> {
    let mut out = String::new();
    for sql in [COUNT, PAGE] {
        let rows = db
            .query(
                &format!(
                    "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) {}",
                    sql.replace("$1", "'1234'")
                ),
                &[],
            )
            .await?;
        for r in rows {
            let line: String = r.get(0);
            out.push_str(&line);
            out.push('\n');
        }
    }
    Ok(out)
}

type Param<'a> = [&'a (dyn tokio_postgres::types::ToSql + Sync); 1];

/// The raw client: the count, the page, then the page's stores and credits pipelined (rows
/// decoded, no JSON), per request.
async fn baseline(url: &str, clients: usize, secs: u64) -> Result<load::Outcome> {
    let mut conns = vec![];
    for _ in 0..clients {
        let db = connect(url).await?;
        let count = db.prepare(COUNT).await?;
        let page = db.prepare(PAGE).await?;
        let stores = db.prepare(STORES).await?;
        let credits = db.prepare(CREDITS).await?;
        conns.push((db, count, page, stores, credits));
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(k, (db, count, page, stores, credits))| {
            tokio::spawn(async move {
                let mut lat = vec![];
                let mut i = k;
                while Instant::now() < deadline {
                    let key = last_four(i % KEYS);
                    let t = Instant::now();
                    let n: i64 = db.query_one(&count, &[&key]).await?.get(0);
                    let rows = db.query(&page, &[&key]).await?;
                    if n == 0 || rows.is_empty() {
                        bail!("the baseline found nobody for {key}");
                    }
                    let ids: Vec<i64> = rows.iter().take(20).map(|r| r.get("id")).collect();
                    let mut in_stores: Vec<i64> = rows.iter().take(20).map(|r| r.get("store_id")).collect();
                    in_stores.sort_unstable();
                    in_stores.dedup();
                    let (ps, pi): (Param, Param) = ([&in_stores], [&ids]);
                    futures_util::try_join!(db.query(&stores, &ps), db.query(&credits, &pi))?;
                    lat.push(t.elapsed());
                    i += clients;
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

pub async fn run(bench: &mut Bench, s: &Sizes) -> Result<Row> {
    let members: i64 = if s.quick { 100_000 } else { 1_000_000 };
    let url = bench.fresh_db("b15").await?;
    let db = connect(&url).await?;
    say!("B15: {members} members ...");
    seed::catalog(&db, members).await?;
    seed::settle(&url).await?;
    let plan = plans(&db).await?;
    say!("B15: plan of the count and the page:\n{plan}");
    let uses_index = plan.contains("members_phone_last4") && !plan.contains("Seq Scan");

    let doc = find_members_operation()?;
    let token = bench.token("admin", "bench")?;
    let server = bench.start_server(&url, "server-b15").await?;
    let reqs: Vec<Prepared> = (0..KEYS)
        .map(|i| request(&server.base, &token, &doc, &last_four(i)))
        .collect();
    // One request first: the page of its last four (20 of the hundred; all ten of a quick run), without errors.
    let probe: serde_json::Value = reqwest::Client::new()
        .post(&reqs[0].url)
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(reqs[0].body.clone())
        .send()
        .await?
        .json()
        .await?;
    let total = probe["data"]["members"]["totalCount"].as_i64().unwrap_or(0);
    let edges = probe["data"]["members"]["edges"].as_array().map_or(0, |e| e.len());
    let expected = members / 10_000;
    if probe.get("errors").is_some() || total != expected || edges as i64 != expected.min(20) {
        bail!(
            "FindMembers did not answer the {expected} members of its last four: {}",
            probe.to_string().chars().take(400).collect::<String>()
        );
    }

    say!(
        "B15: FindMembers by last four, {} connections, {} s ...",
        s.concurrency,
        s.orders_secs
    );
    let cpu0 = CpuSplit::sample(server.proc.pid());
    let ours = load::run(
        Arc::new(reqs),
        s.concurrency,
        Until::Elapsed(Duration::from_secs(s.orders_secs)),
        200,
        true,
    )
    .await?;
    let cpu = CpuSplit::sample(server.proc.pid()).since(&cpu0);
    drop(server);
    say!(
        "B15: {:.0} requests/s, p50 {:.1} ms, p99 {:.1} ms",
        ours.rate(),
        ms(ours.percentile(50.0)),
        ms(ours.percentile(99.0))
    );
    let base = baseline(&url, s.concurrency, s.orders_secs).await?;
    say!(
        "B15: baseline {:.0}/s, p50 {:.1} ms, p99 {:.1} ms",
        base.rate(),
        ms(base.percentile(50.0)),
        ms(base.percentile(99.0))
    );

    let ratio = ours.rate() / base.rate();
    let mut r = Row::new(
        "B15",
        format!(
            "the front desk's `FindMembers` by the last four digits of the phone, {members} members, {} connections",
            s.concurrency
        ),
        "p99 ≤ 50 ms; the count and the page use `members_phone_last4` (no sequential scan)",
    );
    r.ours = format!(
        "{:.0} requests/s (p50 {:.1} ms, p99 {:.1} ms)",
        ours.rate(),
        ms(ours.percentile(50.0)),
        ms(ours.percentile(99.0)),
    );
    r.baseline = format!(
        "raw tokio-postgres, the count, the page, its stores and credits: {:.0}/s (p50 {:.1} ms, p99 {:.1} ms)",
        base.rate(),
        ms(base.percentile(50.0)),
        ms(base.percentile(99.0))
    );
    r.ratio = Some(ratio);
    r.check(
        format!("p99 {:.1} ms > 50 ms", ms(ours.percentile(99.0))),
        ours.percentile(99.0) <= Duration::from_millis(50),
    );
    r.check("the plan uses members_phone_last4", uses_index);
    r.check("no errors", ours.failures() == 0);
    r.note(format!(
        "the `FindMembers` document of playground/operations/next/admin.graphql with {{\"filter\": {{\"phone\": \
         <last four>}}, \"first\": 20}}, {KEYS} different last fours in turn, each matching ~{} members \
         ({total} for the probe)",
        members / 10_000
    ));
    r.note(format!(
        "plan (EXPLAIN ANALYZE of the count, then the page): {}",
        plan.lines().map(str::trim).collect::<Vec<_>>().join(" / ")
    ));
    r.note(format!(
        "{}; server CPU per request {:.2} ms, PostgreSQL CPU per request {:.2} ms",
        cpu.describe("fitorder server", ours.elapsed),
        1e3 * cpu.subject / ours.ok.max(1) as f64,
        1e3 * cpu.postgres / ours.ok.max(1) as f64
    ));
    if ours.failures() > 0 {
        r.note(format!("failed requests: {}", ours.describe_failures()));
    }
    Ok(r)
}
