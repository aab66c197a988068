//! fitorder-bench: every hot path of fitorder measured against what PostgreSQL itself does on
//! the same machine in the same run, so that the ratios mean something on any hardware.
//!
//! `cargo run --release -p fitorder-bench -- [--quick] [--only B1,B3] [--keep] [--perf] [--out F]`
//!
//! The bench process is the load generator and the stopwatch; the system under test runs in
//! child processes (`fitorder serve`, `fitorder worker`, `fitorder reconcile`), the baselines
//! are `pgbench` or plain SQL / HTTP clients. Everything is started here and stopped here, also
//! when a benchmark fails: children are killed by their guards, databases dropped at the end.

/// Progress on stdout, stamped with the seconds since the run started.
macro_rules! say {
    ($($arg:tt)*) => {
        println!("[{:6.1}s] {}", $crate::STARTED.get_or_init(std::time::Instant::now).elapsed().as_secs_f64(), format!($($arg)*))
    };
}

pub static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

mod env;
mod history;
mod load;
mod peer;
mod pgbench;
mod pgbouncer;
mod replica;
mod report;
mod seed;
mod sqlcount;
mod stalls;

mod b11_signin;
mod b12_persisted;
mod b13_prepaid;
mod b14_freezes;
mod b15_members;
mod b1_callbacks;
mod b3_expiry;
mod b4_reconcile;
mod b5_orders;
mod b5r_replica;
mod b6_outbox;
mod b7_subscriptions;
mod b9_prepay;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use futures_util::FutureExt;

use env::Bench;
use report::Row;

const USAGE: &str = "\
fitorder-bench: fitorder's hot paths as ratios to PostgreSQL on the same machine

Usage:
  cargo run --release -p fitorder-bench -- [--quick] [--only B1,B3] [--keep] [--perf] [--out FILE]

  --quick        small sizes: a smoke run of about five minutes (after the build)
  --only LIST    run only these benchmarks (B1 runs whenever B1b, B2, B8 or B10 does: it is
                 their baseline or their server)
  --keep         keep the databases (fitorder_bench_*) and the temp dir for inspection
  --perf         record with `perf record` during B1, B2, B5 and B6 (the whole machine, and the
                 fitorder process with call graphs); slows them down, for profiling, not
                 for figures: perf data under target/bench/
  --out FILE     where to write the report (default: BENCHMARKS.md for a full run of
                 everything, target/bench/BENCHMARKS.md otherwise)

Environment:
  BENCH_DATABASE_URL   PostgreSQL server to use (default postgres://postgres@127.0.0.1:5432/postgres);
                       databases named fitorder_bench_* are created and dropped on it
  BENCH_PGBOUNCER      a PgBouncer binary for B10 (else the newest of PATH, /usr/sbin,
                       /opt/pgbouncer/bin, /usr/local/bin)
  CARGO_TARGET_DIR     where target/production/fitorder is looked for (default <repo>/target)
";

/// What a run measures, and how much of it.
#[derive(Clone, Debug)]
pub struct Sizes {
    pub quick: bool,
    /// B1/B2: signed notifications (one WAIT_PAY order each).
    pub notifications: usize,
    /// pgbench: seconds of the timed run and the scale of `pgbench -i`.
    pub pgbench_secs: u64,
    pub pgbench_scale: u32,
    /// B1's floor: payments made by the one-statement pgbench script.
    pub floor_payments: i64,
    /// B1b: historic orders in the tables before the payments.
    pub history_orders: i64,
    /// B9: placeOrder round trips (and as many prepay requests straight to the stand-in).
    pub prepay_requests: usize,
    /// B3: expired orders (plus a tenth as many not yet due, which must stay).
    pub expiry_orders: i64,
    /// B4: rows of the bill and local payments.
    pub bill_rows: i64,
    /// B5: seconds of load, paid orders in the listing, requests for the statement count.
    pub orders_secs: u64,
    pub listing_orders: i64,
    pub count_requests: usize,
    /// B11: sign-ins (and as many refreshes, and stand-in exchanges).
    pub sign_ins: usize,
    /// B13: placings per store kind (NONE, SHANGHAI_2025), over its rounds; other members of
    /// each store with ten past orders each.
    pub prepaid_placings: usize,
    pub prepaid_history_members: usize,
    /// B13L: orders of the ledger's store (over 90 days; a tenth as many members).
    pub ledger_orders: i64,
    /// B6: pending outbox events.
    pub outbox_events: i64,
    /// B7: WebSocket subscribers and events sent to them.
    pub subscribers: usize,
    pub subscriber_events: usize,
    /// Concurrent connections of the load generator (B1, B2, B5) and of the baselines.
    pub concurrency: usize,
}

impl Sizes {
    fn full() -> Sizes {
        Sizes {
            quick: false,
            notifications: 20_000,
            pgbench_secs: 30,
            pgbench_scale: 16,
            floor_payments: 48_000,
            history_orders: 1_000_000,
            prepay_requests: 2_000,
            expiry_orders: 100_000,
            bill_rows: 1_000_000,
            orders_secs: 20,
            listing_orders: 20_000,
            count_requests: 50,
            sign_ins: 4_000,
            prepaid_placings: 18_000,
            prepaid_history_members: 20_000,
            ledger_orders: 1_000_000,
            outbox_events: 50_000,
            subscribers: 1_000,
            subscriber_events: 3,
            concurrency: 16,
        }
    }

    fn quick() -> Sizes {
        Sizes {
            quick: true,
            notifications: 2_000,
            pgbench_secs: 5,
            pgbench_scale: 16,
            floor_payments: 8_000,
            history_orders: 100_000,
            prepay_requests: 300,
            expiry_orders: 10_000,
            bill_rows: 100_000,
            orders_secs: 4,
            listing_orders: 2_000,
            count_requests: 20,
            sign_ins: 500,
            prepaid_placings: 1_500,
            prepaid_history_members: 2_000,
            ledger_orders: 100_000,
            outbox_events: 5_000,
            subscribers: 200,
            subscriber_events: 1,
            concurrency: 16,
        }
    }
}

pub struct Args {
    pub sizes: Sizes,
    pub only: Option<BTreeSet<String>>,
    pub keep: bool,
    pub perf: bool,
    pub out: Option<PathBuf>,
}

/// Every benchmark, in the report's order.
pub const ALL: [&str; 18] = [
    "B1", "B1b", "B2", "B3", "B4", "B5", "B5r", "B6", "B7", "B8", "B9", "B10", "B11", "B12", "B13", "B13L", "B14",
    "B15",
];

fn parse_args() -> Result<Args> {
    let mut args = Args {
        sizes: Sizes::full(),
        only: None,
        keep: false,
        perf: false,
        out: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (a.clone(), None),
        };
        let mut value = |what: &str| -> Result<String> {
            inline
                .clone()
                .or_else(|| it.next())
                .with_context(|| format!("{what} needs a value"))
        };
        match name.as_str() {
            "--quick" => args.sizes = Sizes::quick(),
            "--keep" => args.keep = true,
            "--perf" => args.perf = true,
            "--out" => args.out = Some(PathBuf::from(value("--out")?)),
            "--only" => {
                let mut list = BTreeSet::new();
                for b in value("--only")?.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    let Some(id) = ALL.iter().find(|id| id.eq_ignore_ascii_case(b)) else {
                        bail!("unknown benchmark {b} (known: {})", ALL.join(", "));
                    };
                    list.insert(id.to_string());
                }
                args.only = Some(list);
            }
            "-h" | "--help" | "help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n\n{USAGE}"),
        }
    }
    Ok(args)
}

impl Args {
    pub fn wants(&self, id: &str) -> bool {
        self.only.as_ref().is_none_or(|o| o.contains(id))
    }

    /// B2 resends B1's notifications, B8 watches B1's server, B1b and B10 are measured against
    /// B1: any of them runs B1.
    fn wants_callbacks(&self) -> bool {
        ["B1", "B1b", "B2", "B8", "B10"].iter().any(|id| self.wants(id))
    }
}

fn main() -> std::process::ExitCode {
    let raw: Vec<String> = std::env::args().collect();
    if raw.get(1).map(String::as_str) == Some(env::MEASURE_ARG) {
        return std::process::ExitCode::from(env::measure_helper(&raw[2..]) as u8);
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("fitorder-bench: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match rt.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fitorder-bench: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

async fn run(args: Args) -> Result<()> {
    let started = *STARTED.get_or_init(Instant::now);
    let mut bench = Bench::start(&args).await?;
    // Neither a panic in a benchmark nor Ctrl-C may skip the cleanup below: the benchmark's
    // future is dropped (its children's guards stop them) and the databases are dropped after.
    let benchmarks = std::panic::AssertUnwindSafe(run_all(&mut bench, &args)).catch_unwind();
    let result = tokio::select! {
        r = benchmarks => r.unwrap_or_else(|p| {
            let why = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(anyhow::anyhow!("a benchmark panicked: {why}"))
        }),
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    // Whatever happened: stop children, drop databases (unless --keep), remove the temp dir.
    bench.cleanup(args.keep).await;
    let rows = result?;
    let elapsed = started.elapsed();
    let markdown = report::markdown(&bench.machine, &args, &rows, elapsed);
    println!("\n{}", report::table(&rows));
    let out = args.out.clone().unwrap_or_else(|| {
        if args.only.is_none() && !args.sizes.quick {
            env::repo_root().join("BENCHMARKS.md")
        } else {
            env::target_dir().join("bench").join("BENCHMARKS.md")
        }
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).ok();
    }
    std::fs::write(&out, markdown).with_context(|| format!("writing {}", out.display()))?;
    println!("written to {} ({:.0} s)", out.display(), elapsed.as_secs_f64());
    Ok(())
}

/// Before a benchmark: PostgreSQL quiet (see `Bench::settle`); a failure to check is said, not fatal.
pub async fn settle(bench: &Bench, before: &str) {
    if let Err(e) = bench.settle(before).await {
        eprintln!("settle before {before}: {e:#}");
    }
}

/// Runs the selected benchmarks. A failing benchmark becomes a row saying so; the others run.
async fn run_all(bench: &mut Bench, args: &Args) -> Result<Vec<Row>> {
    let mut rows: Vec<Row> = vec![];
    let s = &args.sizes;
    if args.wants_callbacks() {
        match b1_callbacks::run(bench, args).await {
            Ok(r) => rows.extend(r),
            Err(e) => rows.extend(b1_callbacks::failed_rows(args, &e)),
        }
        // B1b's million orders and B10's copy are done with (B1's own database serves B5, B7).
        for done in ["b1b", "b10", "floor", "pgbench"] {
            bench.drop_db_now(done).await;
        }
    }
    if args.wants("B5") {
        settle(bench, "B5").await;
        rows.push(
            b5_orders::run(bench, args)
                .await
                .unwrap_or_else(|e| Row::failed("B5", &e)),
        );
    }
    if args.wants("B5r") {
        settle(bench, "B5r").await;
        rows.push(
            b5r_replica::run(bench, args)
                .await
                .unwrap_or_else(|e| Row::failed("B5r", &e)),
        );
    }
    if args.wants("B11") {
        settle(bench, "B11").await;
        rows.push(
            b11_signin::run(bench, s)
                .await
                .unwrap_or_else(|e| Row::failed("B11", &e)),
        );
    }
    if args.wants("B12") {
        settle(bench, "B12").await;
        rows.push(
            b12_persisted::run(bench, s)
                .await
                .unwrap_or_else(|e| Row::failed("B12", &e)),
        );
    }
    if args.wants("B7") {
        settle(bench, "B7").await;
        rows.push(
            b7_subscriptions::run(bench, s)
                .await
                .unwrap_or_else(|e| Row::failed("B7", &e)),
        );
    }
    if args.wants("B3") {
        settle(bench, "B3").await;
        rows.push(b3_expiry::run(bench, s).await.unwrap_or_else(|e| Row::failed("B3", &e)));
        bench.drop_db_now("b3_ours").await;
        bench.drop_db_now("b3_base").await;
    }
    if args.wants("B4") {
        settle(bench, "B4").await;
        rows.push(
            b4_reconcile::run(bench, s)
                .await
                .unwrap_or_else(|e| Row::failed("B4", &e)),
        );
        // A million bill rows and payments: their autovacuum would run during the next ones.
        bench.drop_db_now("b4").await;
    }
    if args.wants("B9") {
        settle(bench, "B9").await;
        rows.push(b9_prepay::run(bench, s).await.unwrap_or_else(|e| Row::failed("B9", &e)));
        bench.drop_db_now("b9").await;
    }
    if args.wants("B13") {
        settle(bench, "B13").await;
        rows.push(
            b13_prepaid::run(bench, s)
                .await
                .unwrap_or_else(|e| Row::failed("B13", &e)),
        );
        if !args.keep {
            bench.drop_db_now("b13").await;
        }
    }
    if args.wants("B13L") {
        settle(bench, "B13L").await;
        rows.push(
            b13_prepaid::run_ledger(bench, s)
                .await
                .unwrap_or_else(|e| Row::failed("B13L", &e)),
        );
        // A million orders and their check-ins: their autovacuum would run during the next ones.
        if !args.keep {
            bench.drop_db_now("b13l").await;
        }
    }
    if args.wants("B14") {
        settle(bench, "B14").await;
        rows.push(
            b14_freezes::run(bench, s)
                .await
                .unwrap_or_else(|e| Row::failed("B14", &e)),
        );
    }
    if args.wants("B15") {
        settle(bench, "B15").await;
        rows.push(
            b15_members::run(bench, s)
                .await
                .unwrap_or_else(|e| Row::failed("B15", &e)),
        );
        // A million members: their autovacuum would run during the next ones.
        if !args.keep {
            bench.drop_db_now("b15").await;
        }
    }
    if args.wants("B6") {
        settle(bench, "B6").await;
        rows.push(b6_outbox::run(bench, s).await.unwrap_or_else(|e| Row::failed("B6", &e)));
    }
    rows.sort_by_key(|r| ALL.iter().position(|id| *id == r.id).unwrap_or(ALL.len()));
    Ok(rows)
}
