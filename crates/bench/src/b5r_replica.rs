//! B5r: the admin console's `Orders` page read from a streaming replica
//! (`FITORDER_READ_DATABASE_URL`), against the same page read from the primary, and the
//! primary's payments with the replica streaming against the same payments with it stopped.
//!
//! Both clusters are private to the benchmark ([`crate::replica::Pair`]): the machine's
//! PostgreSQL allows no replication connections, and a base backup of it would copy every
//! other database on it. The primary gets the machine's settings and B1's and B5's very data.

use std::sync::Arc;

use anyhow::{bail, Context, Result};

use crate::b1_callbacks::{count, paid_state, pass, retarget, waiting, warm, Signed};
use crate::b5_orders::{orders_operation, request, timed_pages};
use crate::env::{connect, Bench, CpuSplit, Server};
use crate::load::{self, ms, Outcome, Until};
use crate::replica::Pair;
use crate::report::Row;
use crate::{seed, Args};

/// `Orders` `first: 100` at `server` as B5 measures it, after one request that must answer.
async fn pages(
    bench: &Bench,
    server: &Server,
    token: &str,
    doc: &str,
    args: &Args,
    label: &str,
) -> Result<(Outcome, CpuSplit)> {
    let req = request(&server.base, token, doc, 100);
    // The first answer must be a whole page (a replica that is not read would still answer).
    let probe = load::run(Arc::new(vec![req.clone()]), 1, Until::Exhausted, 200, true).await?;
    if probe.ok != 1 {
        bail!("{label}: Orders did not answer: {}", probe.describe_failures());
    }
    timed_pages(bench, server, req, &args.sizes, label).await
}

/// A counter or gauge of the server's `/metrics` (0 when absent).
async fn metric(server: &Server, series: &str) -> f64 {
    let Ok(r) = reqwest::Client::new()
        .get(format!("{}/metrics", server.base))
        .bearer_auth(crate::env::METRICS_TOKEN)
        .send()
        .await
    else {
        return 0.0;
    };
    let text = r.text().await.unwrap_or_default();
    // `+ 0.0`: a float sum of nothing is -0.
    text.lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
        .sum::<f64>()
        + 0.0
}

/// Rows the sessions of `db` on a cluster have read (`pg_stat_database`), to show where the
/// page's reads went.
async fn tuples_read(url: &str, db: &str) -> Result<i64> {
    let c = connect(url).await?;
    Ok(c.query_one(
        "SELECT (tup_returned + tup_fetched)::int8 FROM pg_stat_database WHERE datname = $1",
        &[&db],
    )
    .await?
    .get(0))
}

pub async fn run(bench: &mut Bench, args: &Args) -> Result<Row> {
    let s = &args.sizes;
    let mut row = Row::new(
        "B5r",
        "B5 from a streaming replica (`FITORDER_READ_DATABASE_URL`), and the primary's payments with the replica attached",
        "≥ 0.9 × B5 on the primary of the same pair; the primary's B1 with the replica streaming ≥ 0.95 × B1 with it stopped",
    );
    say!("B5r: a private primary (initdb) and its standby (pg_basebackup -R) ...");
    let mut pair = tokio::task::block_in_place(|| Pair::start(&bench.tmp))?;
    let name = "fitorder_b5r";
    let admin = connect(&pair.primary.url("postgres")).await?;
    admin.batch_execute(&format!("CREATE DATABASE {name}")).await?;
    let url = pair.primary.url(name);
    bench.migrate(&url).await?;
    {
        let db = connect(&url).await?;
        seed::api_data(&db, s).await?;
    }
    seed::settle(&url).await?;
    tokio::task::block_in_place(|| pair.attach_standby())?;
    pair.caught_up().await?;
    if !pair.streaming().await? {
        bail!("the standby does not stream from the primary");
    }
    let standby_url = pair.standby.url(name);
    let doc = orders_operation()?;
    let token = bench.token("admin", "bench")?;

    // The page from the primary, then from the replica: the same data, the same server build.
    let primary_server = bench.start_server(&url, "server-b5r-primary").await?;
    let on_primary_reads0 = tuples_read(&pair.standby.url("postgres"), name).await?;
    let (on_primary, cpu_p) = pages(bench, &primary_server, &token, &doc, args, "B5r (primary)").await?;
    let on_primary_replica_reads = tuples_read(&pair.standby.url("postgres"), name).await? - on_primary_reads0;
    drop(primary_server);

    let replica_server = bench
        .start_server_with(
            &url,
            "server-b5r-replica",
            &[("FITORDER_READ_DATABASE_URL", standby_url.clone())],
        )
        .await?;
    let read0 = tuples_read(&pair.standby.url("postgres"), name).await?;
    let primary_read0 = tuples_read(&pair.primary.url("postgres"), name).await?;
    let (on_replica, cpu_r) = pages(bench, &replica_server, &token, &doc, args, "B5r (replica)").await?;
    let replica_tuples = tuples_read(&pair.standby.url("postgres"), name).await? - read0;
    let primary_tuples = tuples_read(&pair.primary.url("postgres"), name).await? - primary_read0;
    let replica_reads = metric(&replica_server, "fitorder_read_replica_reads_total").await;
    let fallbacks = metric(&replica_server, "fitorder_read_replica_fallback_total").await;
    drop(replica_server);

    // The primary's payments: half of B1's notifications with the standby streaming, the other
    // half with it stopped (what B1 measures on a primary without a replica).
    let db = connect(&url).await?;
    let orders = waiting(&db, "FB1").await.context("B5r's payments")?;
    let half = orders.len() / 2;
    let (with_orders, alone_orders) = orders.split_at(half);
    let mut with_signed = Signed::new(bench, with_orders.to_vec(), 1);
    let mut alone_signed = Signed::new(bench, alone_orders.to_vec(), 1 + half);
    let admin_url = pair.primary.url("postgres");
    let server = bench.start_server(&url, "server-b5r-b1").await?;
    warm(&server, s.concurrency).await;
    pair.caught_up().await?;
    let streaming_before = pair.streaming().await?;
    let with = pass(
        &admin_url,
        bench,
        &server,
        &db,
        retarget(with_signed.fresh(bench), &server.base),
        s.concurrency,
        "B5r (B1, replica streaming)",
    )
    .await?;
    let lag_at_end = {
        let p = connect(&admin_url).await?;
        let r = p
            .query_opt(
                "SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn), 0)::int8 FROM pg_stat_replication",
                &[],
            )
            .await?;
        r.map(|r| r.get::<_, i64>(0)).unwrap_or(-1)
    };
    pair.caught_up().await?;
    tokio::task::block_in_place(|| pair.standby.stop())?;
    let alone = pass(
        &admin_url,
        bench,
        &server,
        &db,
        retarget(alone_signed.fresh(bench), &server.base),
        s.concurrency,
        "B5r (B1, replica stopped)",
    )
    .await?;
    let state = paid_state(&db).await?;
    drop(server);

    let ratio = on_replica.rate() / on_primary.rate();
    let b1_ratio = with.out.rate() / alone.out.rate();
    row.ours = format!(
        "from the replica {:.0} requests/s (p50 {:.1} ms, p99 {:.1} ms); the primary's payments with it streaming {}",
        on_replica.rate(),
        ms(on_replica.percentile(50.0)),
        ms(on_replica.percentile(99.0)),
        with.describe("payments"),
    );
    row.baseline = format!(
        "from the primary {:.0} requests/s (p50 {:.1} ms, p99 {:.1} ms); payments with the replica stopped {}",
        on_primary.rate(),
        ms(on_primary.percentile(50.0)),
        ms(on_primary.percentile(99.0)),
        alone.describe("payments"),
    );
    row.ratio = Some(ratio);
    row.check(format!("ratio {ratio:.2} < 0.9"), ratio >= 0.9);
    row.check(format!("payments {b1_ratio:.2} × < 0.95"), b1_ratio >= 0.95);
    row.check(
        "pages read the replica",
        replica_reads > 0.0 && fallbacks == 0.0 && on_replica.failures() == 0 && on_primary.failures() == 0,
    );
    let n = orders.len() as i64;
    row.check(
        "all applied",
        count(&with.outcomes, "APPLIED") + count(&alone.outcomes, "APPLIED") >= n && state.0 >= n,
    );
    row.check("streamed during the payments", streaming_before);
    row.note(format!(
        "both clusters private to this benchmark and on this machine: a primary made by `initdb` and started with the \
         machine cluster's settings (`{}`; fsync and synchronous_commit on), the standby by `pg_basebackup -R -X stream` \
         and started with `{}`; B1's and B5's very data (`seed::api_data`) in the primary, replayed by the standby before \
         the clock starts",
        crate::replica::PRIMARY.split_whitespace().collect::<Vec<_>>().join(" "),
        crate::replica::STANDBY.split_whitespace().collect::<Vec<_>>().join(" "),
    ));
    row.note(format!(
        "pages: B5's request (the `Orders` document, first: 100, an admin token) over {} connections for {} s, first at \
         a server whose reads all go to the primary, then at one with FITORDER_READ_DATABASE_URL naming the standby; \
         ratio: replica / primary. With the replica: {replica_reads:.0} pages counted in \
         fitorder_read_replica_reads_total, {fallbacks:.0} fallbacks; rows read by the database's sessions: replica \
         {replica_tuples}, primary {primary_tuples} (the session's role check and read-your-writes look-ups); while the \
         primary served the pages the replica read {on_primary_replica_reads}",
        s.concurrency, s.orders_secs
    ));
    row.note(format!(
        "pages from the primary: {}; server CPU per page {:.2} ms, PostgreSQL (both clusters) {:.2} ms",
        cpu_p.describe("fitorder server", on_primary.elapsed),
        1e3 * cpu_p.subject / on_primary.ok.max(1) as f64,
        1e3 * cpu_p.postgres / on_primary.ok.max(1) as f64
    ));
    row.note(format!(
        "pages from the replica: {}; server CPU per page {:.2} ms, PostgreSQL (both clusters) {:.2} ms",
        cpu_r.describe("fitorder server", on_replica.elapsed),
        1e3 * cpu_r.subject / on_replica.ok.max(1) as f64,
        1e3 * cpu_r.postgres / on_replica.ok.max(1) as f64
    ));
    row.note(format!(
        "payments: B1's notifications for this primary's {n} waiting orders, signed as B1's, half sent with the standby \
         streaming (its WAL sender, and its replay on the same two cores), then the standby stopped and the other half \
         sent: {b1_ratio:.2} × (with {:.0}/s, p99 {:.1} ms; without {:.0}/s, p99 {:.1} ms); the standby was {lag_at_end} \
         bytes behind when the streaming half ended. With the standby streaming: {}; without it, the server {:.1} s \
         (PostgreSQL's share is not given: the stopped standby's processes leave the machine's sums of PostgreSQL \
         CPU while the pass runs)",
        with.out.rate(),
        ms(with.out.percentile(99.0)),
        alone.out.rate(),
        ms(alone.out.percentile(99.0)),
        with.cpu.describe("fitorder server", with.out.elapsed),
        alone.cpu.subject,
    ));
    row.note(
        "on this one machine the replica shares the primary's two cores: how much a read on the replica leaves the \
         primary is a question of separate hardware, which this row cannot answer; what it measures is that the page \
         costs the same from a replica and that streaming to one costs the primary's payments nothing beyond the bound",
    );
    drop(db);
    drop(admin);
    drop(pair);
    Ok(row)
}
