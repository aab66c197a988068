//! The PostgreSQL baselines of B1/B2/B1b/B10, both run by `pgbench` with the same number of
//! clients as the load generator has connections:
//!
//! - tpcb-like (`pgbench -i -s scale`, then `-c clients -j 2 -T secs`), the classic yardstick;
//! - the one-statement floor of a payment: a custom script whose ONE prepared statement does
//!   every write a real WeChat Pay payment does on the project's own tables (the evidence row,
//!   the idempotency key, the order's status change through its transition trigger, the audit
//!   row, the payment, the two grant events of the outbox, the notifications), over WAIT_PAY
//!   orders prepared for it, with no server in the way. Whatever the server does per payment
//!   on top of that is its own cost; the floor is what PostgreSQL needs at least.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::env::{connect, pgbench, target_dir, Bench, CpuSplit};
use crate::seed;

/// What a pgbench run reported.
pub struct Pgbench {
    pub tps: f64,
    /// PostgreSQL's CPU seconds per transaction.
    pub pg_cpu_per_txn: f64,
    pub latency_ms: f64,
    pub clients: usize,
    pub scale: u32,
    pub secs: f64,
}

fn number_after(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
}

/// Runs pgbench to its end in a blocking thread; its standard output (failing on a non-zero
/// exit or a client that aborted).
async fn pgbench_output(args: Vec<String>) -> Result<String> {
    let exe = pgbench()?;
    let out = tokio::task::spawn_blocking(move || Command::new(exe).args(&args).output()).await??;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    if !out.status.success() || err.contains("aborted") {
        bail!("pgbench failed ({}): {text}{err}", out.status);
    }
    Ok(text)
}

/// tpcb-like on a scratch database, dropped afterwards.
pub async fn tpcb(bench: &mut Bench, clients: usize, scale: u32, secs: u64) -> Result<Pgbench> {
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
    let text = pgbench_output(vec![
        "-c".into(),
        clients.to_string(),
        "-j".into(),
        "2".into(),
        "-T".into(),
        secs.to_string(),
        url.clone(),
    ])
    .await?;
    let cpu1 = CpuSplit::sample(0);
    let tps = number_after(&text, "tps = ").with_context(|| format!("no tps in pgbench's output:\n{text}"))?;
    let latency_ms = number_after(&text, "latency average = ").unwrap_or(0.0);
    // The scratch data is not needed any more; dropping it frees its buffers for what follows.
    let name = bench.db_name("pgbench");
    bench.pg.drop_db(&name).await?;
    say!("pgbench: {tps:.0} tps, latency average {latency_ms:.1} ms");
    Ok(Pgbench {
        tps,
        pg_cpu_per_txn: cpu1.since(&cpu0).postgres / (tps * secs as f64),
        latency_ms,
        clients,
        scale,
        secs: secs as f64,
    })
}

/// The prefix of the orders the floor pays.
const FLOOR_PREFIX: &str = "FBF";

/// The floor's one statement of writes (and its announcements). pgbench turns `:body`, `:headers` and `:actor` (given with `-D`)
/// into parameters of the prepared statement, as the server binds them; every other `:` here is
/// followed by a quote or a second colon, which pgbench leaves alone.
///
/// Each execution takes the next prepared order (a sequence, like the ids the server's rows
/// get) and writes, in one transaction:
/// 1. the evidence: the notification as received, in `payment_callbacks` (`APPLIED`);
/// 2. its idempotency key in `payment_keys` (the primary key decides who applies);
/// 3. the order's `WAIT_PAY → PAID` with paid_at, expires_at and the transaction id, through
///    the `orders_status_guard` trigger;
/// 4. the audit row in `order_transitions`;
/// 5. the payment row;
/// 6. the door and AI-device grant events in `compensation_events`;
/// 7. then, after that transaction's commit and in a statement of its own (as fitorder sends
///    them since issue 29), the notifications: the order's status change, each event, the
///    outbox wake-up. A transaction that notifies holds PostgreSQL's one notify-queue lock from
///    before its commit until its WAL is flushed, so notifying commits are never flushed
///    together; a statement that only notifies writes no WAL.
pub const FLOOR_SQL: &str = r#"WITH pick AS (
    SELECT 'FBF' || lpad(nextval('bench_floor_pick')::text, 10, '0') AS order_no
), o AS (
    SELECT o.id, o.order_no, o.store_id, o.amount_cents, o.wallet_amount_cents,
           '42' || lpad(o.id::text, 26, '0') AS txn
      FROM orders o JOIN pick ON o.order_no = pick.order_no
), cb AS (
    INSERT INTO payment_callbacks (provider, verified, outcome, event_type, body, headers, trace_id,
                                   idempotency_key, order_id, order_no, store_id, provider_txn_id, amount_cents)
    SELECT 'WECHAT_PAY', true, 'APPLIED', 'TRANSACTION.SUCCESS', :body, :headers, 'bench-floor',
           o.order_no || ':' || o.txn, o.id, o.order_no, o.store_id, o.txn, o.amount_cents - o.wallet_amount_cents
      FROM o
    RETURNING id, order_id, idempotency_key, provider_txn_id
), k AS (
    INSERT INTO payment_keys (key, callback_id) SELECT idempotency_key, id FROM cb RETURNING key
), moved AS (
    UPDATE orders SET status = 'PAID', updated_at = now(), paid_at = now(), expires_at = NULL,
                      provider_txn_id = cb.provider_txn_id
      FROM cb
     WHERE orders.id = cb.order_id AND orders.status = 'WAIT_PAY'
    RETURNING orders.id, orders.order_no, orders.member_id, orders.store_id, orders.amount_cents,
              orders.wallet_amount_cents, orders.provider_txn_id, cb.idempotency_key
), audit AS (
    INSERT INTO order_transitions (order_id, from_status, to_status, actor, reason, trace_id)
    SELECT id, 'WAIT_PAY', 'PAID', :actor, 'WECHAT_PAY payment ' || provider_txn_id, 'bench-floor' FROM moved
    RETURNING id
), paid AS (
    INSERT INTO payments (order_id, method, idempotency_key, provider_txn_id, amount_cents, wallet_cents,
                          online_cents, actor, trace_id)
    SELECT id, 'WECHAT_PAY', idempotency_key, provider_txn_id, amount_cents, wallet_amount_cents,
           amount_cents - wallet_amount_cents, :actor, 'bench-floor'
      FROM moved
    RETURNING id
), grants AS (
    INSERT INTO compensation_events (order_id, kind, max_attempts, payload, idempotency_key, trace_id)
    SELECT m.id, g.kind, 5,
           jsonb_build_object('orderNo', m.order_no, 'memberId', m.member_id::text,
                              'storeId', m.store_id::text, 'action', 'GRANT'),
           m.order_no || ':' || g.kind, 'bench-floor'
      FROM moved m CROSS JOIN (VALUES ('DOOR_ACCESS_GRANT'), ('AI_ACCESS_GRANT')) AS g(kind)
    RETURNING id
)
SELECT (SELECT count(*) FROM k) + (SELECT count(*) FROM paid) AS written,
       (SELECT id FROM audit) AS audit_id, (SELECT min(id) FROM grants) AS g1, (SELECT max(id) FROM grants) AS g2 \gset
SELECT pg_notify('fitorder_events', 'order:' || :audit_id), pg_notify('fitorder_events', 'comp:' || :g1),
       pg_notify('fitorder_events', 'comp:' || :g2), pg_notify('fitorder_outbox', '');
"#;

/// The floor's figures.
pub struct Floor {
    pub run: Pgbench,
    pub payments: i64,
    /// The script as run, kept under target/bench/ for whoever wants to rerun it by hand.
    pub script: PathBuf,
    /// What the tables held afterwards: (orders PAID, payments, grant events, keys, callbacks).
    pub written: (i64, i64, i64, i64, i64),
}

/// The one-statement floor: `payments` (a multiple of `clients`) prepared WAIT_PAY orders paid
/// by pgbench `-M prepared -c clients -j 2 -t payments/clients -f <script>`. `body` and
/// `headers` are a real signed notification's, so the evidence row is the size of B1's.
pub async fn floor(bench: &mut Bench, clients: usize, payments: i64, body: &str, headers: &str) -> Result<Floor> {
    let per_client = (payments / clients as i64).max(1);
    let payments = per_client * clients as i64;
    say!("floor: preparing {payments} waiting orders ...");
    let url = bench.fresh_db("floor").await?;
    {
        let db = connect(&url).await?;
        seed::catalog(&db, seed::MEMBERS).await?;
        seed::waiting_orders(&db, FLOOR_PREFIX, payments, seed::MEMBERS, "now() + interval '1 day'").await?;
        seed::exec(&db, "the floor's sequence", "CREATE SEQUENCE bench_floor_pick").await?;
    }
    seed::settle(&url).await?;
    let dir = target_dir().join("bench");
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("floor-payment.sql");
    std::fs::write(&script, FLOOR_SQL).with_context(|| format!("writing {}", script.display()))?;
    say!("floor: one prepared statement per payment, {clients} clients, {per_client} payments each ...");
    let cpu0 = CpuSplit::sample(0);
    let text = pgbench_output(vec![
        "-n".into(),
        "-M".into(),
        "prepared".into(),
        "-c".into(),
        clients.to_string(),
        "-j".into(),
        "2".into(),
        "-t".into(),
        per_client.to_string(),
        "-f".into(),
        script.display().to_string(),
        "-D".into(),
        format!("body={body}"),
        "-D".into(),
        format!("headers={headers}"),
        "-D".into(),
        "actor=provider:WECHAT_PAY".into(),
        url.clone(),
    ])
    .await?;
    let cpu1 = CpuSplit::sample(0);
    let tps = number_after(&text, "tps = ").with_context(|| format!("no tps in pgbench's output:\n{text}"))?;
    let latency_ms = number_after(&text, "latency average = ").unwrap_or(0.0);
    let db = connect(&url).await?;
    let r = db
        .query_one(
            "SELECT (SELECT count(*) FROM orders WHERE status = 'PAID'),
                    (SELECT count(*) FROM payments),
                    (SELECT count(*) FROM compensation_events WHERE kind LIKE '%GRANT'),
                    (SELECT count(*) FROM payment_keys),
                    (SELECT count(*) FROM payment_callbacks WHERE outcome = 'APPLIED')",
            &[],
        )
        .await?;
    let written = (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
    drop(db);
    if written != (payments, payments, 2 * payments, payments, payments) {
        bail!("the floor's script did not pay every order once: (PAID, payments, grants, keys, callbacks) = {written:?}, expected {payments} each (grants twice)");
    }
    let name = bench.db_name("floor");
    bench.pg.drop_db(&name).await?;
    let secs = payments as f64 / tps;
    say!("floor: {tps:.0} payments/s, latency average {latency_ms:.1} ms");
    Ok(Floor {
        run: Pgbench {
            tps,
            pg_cpu_per_txn: cpu1.since(&cpu0).postgres / payments as f64,
            latency_ms,
            clients,
            scale: 0,
            secs,
        },
        payments,
        script,
        written,
    })
}
