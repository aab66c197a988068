//! B3: expired orders holding seats, stock and frozen wallet money, all canceled and released
//! by the library code the server runs (`fitorder::expiry::expire_due`), against one
//! hand-written set-based statement doing the same updates on an identical copy of the data.

use std::time::Instant;

use anyhow::{bail, Result};
use fitorder::app::AppState;
use fitorder::config::Config;
use fitorder::events::EventHub;
use fitorder::providers::keys::ProviderKeys;
use tokio_postgres::Client;

use crate::env::{connect, Bench, CpuSplit};
use crate::report::Row;
use crate::{seed, Sizes};

/// Seats held per coach slot (its capacity is this; every slot is full of waiting orders).
const SLOT_CAPACITY: i64 = 20;
const PACKS: i64 = 100;
const PACK_STOCK: i64 = 100_000;
const MEMBERS: i64 = 5_000;

/// `n` expired WAIT_PAY orders: half private sessions holding a coach seat, half class packs
/// holding a unit of stock; every third one MIXED with 50 yuan frozen in the wallet. Plus n/10
/// orders not yet due, which must be left alone.
async fn seed_expired(db: &Client, n: i64) -> Result<()> {
    let privates = n / 2;
    let slots = (privates + SLOT_CAPACITY - 1) / SLOT_CAPACITY;
    let future = n / 10;
    seed::catalog(db, MEMBERS).await?;
    seed::exec(
        db,
        "wallets, slots, packs",
        &format!(
            "INSERT INTO wallet_ledger (member_id, kind, balance_delta, frozen_delta, reference, actor, trace_id)
             SELECT id, 'TOP_UP', 5000000, 0, 'seed-' || id || '-' || n, 'system:bench', 'bench-seed'
               FROM members CROSS JOIN generate_series(1, 2) AS n ORDER BY id, n;
             INSERT INTO coach_slots (store_id, coach_name, starts_at, ends_at, capacity, remaining, price_cents)
             SELECT s.id, 'Coach ' || g, now() + interval '1 day' + g * interval '1 hour',
                    now() + interval '1 day' + g * interval '1 hour' + interval '1 hour', {SLOT_CAPACITY}, {SLOT_CAPACITY}, 30000
               FROM generate_series(0, {slots} - 1) g JOIN stores s ON s.code = 'BENCH-' || (1 + g % {STORES})
              ORDER BY g;
             INSERT INTO class_packs (store_id, name, sessions, price_cents, stock)
             SELECT s.id, 'Launch offer · 5 sessions #' || g, 5, 19900, {PACK_STOCK}
               FROM generate_series(0, {PACKS} - 1) g JOIN stores s ON s.code = 'BENCH-' || (1 + g % {STORES})
              ORDER BY g;",
            STORES = seed::STORES
        ),
    )
    .await?;
    seed::exec(
        db,
        "expired orders",
        &format!(
            "WITH m AS (SELECT id, row_number() OVER (ORDER BY id) - 1 AS k FROM members),
                  sl AS (SELECT id, store_id, price_cents, row_number() OVER (ORDER BY id) - 1 AS k FROM coach_slots),
                  pk AS (SELECT id, store_id, name, sessions, price_cents, row_number() OVER (ORDER BY id) - 1 AS k
                           FROM class_packs WHERE stock IS NOT NULL),
                  o AS (
                    SELECT g, g % 2 = 0 AS private, g % 3 = 0 AS mixed, g > {n} AS future FROM generate_series(1, {n} + {future}) g)
             INSERT INTO orders (order_no, member_id, store_id, kind, status, item_name, class_pack_id, coach_slot_id,
                                 amount_cents, wallet_amount_cents, payment_method, online_provider, sessions_total,
                                 expires_at, trace_id, idempotency_key, request_hash)
             SELECT 'FB3' || lpad(o.g::text, 10, '0'), m.id,
                    CASE WHEN o.private AND NOT o.future THEN sl.store_id ELSE pk.store_id END,
                    CASE WHEN o.private AND NOT o.future THEN 'PRIVATE_SESSION' ELSE 'CLASS_PACK' END,
                    'WAIT_PAY',
                    CASE WHEN o.private AND NOT o.future THEN 'Private session' ELSE pk.name END,
                    CASE WHEN o.private AND NOT o.future THEN NULL ELSE pk.id END,
                    CASE WHEN o.private AND NOT o.future THEN sl.id END,
                    CASE WHEN o.private AND NOT o.future THEN sl.price_cents ELSE pk.price_cents END,
                    CASE WHEN o.mixed AND NOT o.future THEN 5000 ELSE 0 END,
                    CASE WHEN o.mixed AND NOT o.future THEN 'MIXED' ELSE 'WECHAT_PAY' END,
                    'WECHAT_PAY',
                    CASE WHEN o.private AND NOT o.future THEN 1 ELSE pk.sessions END,
                    CASE WHEN o.future THEN now() + interval '10 minutes'
                         ELSE now() - interval '1 minute' - o.g * interval '1 millisecond' END,
                    'bench-seed', 'FB3-' || o.g, 'bench'
               FROM o
               JOIN m ON m.k = o.g % {MEMBERS}
               LEFT JOIN sl ON sl.k = (o.g / 2 - 1) / {SLOT_CAPACITY} AND o.private AND NOT o.future
               JOIN pk ON pk.k = o.g % {PACKS}
              ORDER BY o.g;
             INSERT INTO order_transitions (order_id, from_status, to_status, actor, reason, trace_id)
             SELECT id, NULL, 'WAIT_PAY', 'member:' || member_id, 'order placed', 'bench-seed' FROM orders ORDER BY id;
             UPDATE coach_slots s SET remaining = s.remaining - c.n
               FROM (SELECT coach_slot_id, count(*) AS n FROM orders WHERE coach_slot_id IS NOT NULL GROUP BY 1) c
              WHERE s.id = c.coach_slot_id;
             UPDATE class_packs p SET stock = p.stock - c.n
               FROM (SELECT class_pack_id, count(*) AS n FROM orders WHERE class_pack_id IS NOT NULL GROUP BY 1) c
              WHERE p.id = c.class_pack_id AND p.stock IS NOT NULL;
             INSERT INTO wallet_ledger (member_id, kind, balance_delta, frozen_delta, order_id, actor, trace_id)
             SELECT member_id, 'FREEZE', -wallet_amount_cents, wallet_amount_cents, id, 'member:' || member_id, 'bench-seed'
               FROM orders WHERE payment_method = 'MIXED' ORDER BY id;"
        ),
    )
    .await
}

/// The cancel and release of every due order in one statement, as a DBA would write it: the
/// same rows changed as the application's (orders, audit, seats, stock, wallet ledger and, by
/// its trigger, balances), without the per-order NOTIFY.
const BASELINE_SQL: &str = "
WITH moved AS (
    UPDATE orders o
       SET status = 'CANCELED', canceled_at = now(), cancel_reason = 'TIMEOUT', updated_at = now()
     WHERE status = 'WAIT_PAY' AND expires_at IS NOT NULL AND expires_at <= now()
    RETURNING o.id, o.member_id, o.coach_slot_id, o.class_pack_id, o.payment_method, o.wallet_amount_cents
), audit AS (
    INSERT INTO order_transitions (order_id, from_status, to_status, actor, reason, trace_id)
    SELECT id, 'WAIT_PAY', 'CANCELED', 'system:expiry', 'TIMEOUT', 'baseline' FROM moved
), seats AS (
    UPDATE coach_slots s SET remaining = s.remaining + m.n
      FROM (SELECT coach_slot_id, count(*) AS n FROM moved WHERE coach_slot_id IS NOT NULL GROUP BY 1) m
     WHERE s.id = m.coach_slot_id
), stock AS (
    UPDATE class_packs p SET stock = p.stock + m.n
      FROM (SELECT class_pack_id, count(*) AS n FROM moved WHERE class_pack_id IS NOT NULL GROUP BY 1) m
     WHERE p.id = m.class_pack_id AND p.stock IS NOT NULL
), unfrozen AS (
    INSERT INTO wallet_ledger (member_id, kind, balance_delta, frozen_delta, order_id, actor, trace_id)
    SELECT member_id, 'UNFREEZE', wallet_amount_cents, -wallet_amount_cents, id, 'system:expiry', 'baseline'
      FROM moved WHERE payment_method = 'MIXED' AND wallet_amount_cents > 0
)
SELECT count(*) FROM moved";

/// What both runs must leave behind, identically.
async fn fingerprint(db: &Client) -> Result<Vec<i64>> {
    let r = db
        .query_one(
            "SELECT (SELECT count(*) FROM orders WHERE status = 'CANCELED' AND cancel_reason = 'TIMEOUT'),
                    (SELECT count(*) FROM orders WHERE status = 'WAIT_PAY'),
                    (SELECT coalesce(sum(capacity - remaining), 0)::bigint FROM coach_slots),
                    (SELECT coalesce(sum(stock), 0)::bigint FROM class_packs),
                    (SELECT coalesce(sum(frozen_cents), 0)::bigint FROM members),
                    (SELECT coalesce(sum(balance_cents), 0)::bigint FROM members),
                    (SELECT count(*) FROM order_transitions WHERE to_status = 'CANCELED'),
                    (SELECT count(*) FROM wallet_ledger WHERE kind = 'UNFREEZE')",
            &[],
        )
        .await?;
    Ok((0..8).map(|i| r.try_get::<_, i64>(i)).collect::<Result<_, _>>()?)
}

pub async fn run(bench: &mut Bench, s: &Sizes) -> Result<Row> {
    let n = s.expiry_orders;
    say!("B3: seeding {n} expired orders ...");
    let ours_url = bench.fresh_db("b3_ours").await?;
    {
        let db = connect(&ours_url).await?;
        seed_expired(&db, n).await?;
    }
    seed::settle(&ours_url).await?;
    // A file-level copy: the baseline starts from the very same pages and statistics.
    let ours_name = bench.db_name("b3_ours");
    let base_url = bench.create_db("b3_base", Some(&ours_name)).await?;
    let before = fingerprint(&connect(&ours_url).await?).await?;

    // The library code the server's expiry timer and `order:expire` task run, on a pool of
    // the size a server has; no provider API is configured, so nothing is asked of WeChat Pay.
    let mut config = Config::for_tests(ours_url.clone());
    config.db_pool_size = 16;
    let pool = fitorder::db::pool(&ours_url, config.db_pool_size)?;
    let state = AppState::with_keys(
        pool,
        config,
        ProviderKeys::default(),
        EventHub::detached(),
        ours_url.clone(),
    );
    say!("B3: expire_due ...");
    let cpu0 = CpuSplit::sample(0);
    let t = Instant::now();
    let settled = fitorder::expiry::expire_due(&state)
        .await
        .map_err(|e| anyhow::anyhow!("expire_due: {}", e.message()))?;
    let ours = t.elapsed();
    let cpu1 = CpuSplit::sample(0);
    drop(state);
    let after_ours = fingerprint(&connect(&ours_url).await?).await?;

    say!("B3: baseline SQL ...");
    let base_db = connect(&base_url).await?;
    let cpu2 = CpuSplit::sample(0);
    let t = Instant::now();
    let moved: i64 = base_db.query_one(BASELINE_SQL, &[]).await?.get(0);
    let base = t.elapsed();
    let cpu3 = CpuSplit::sample(0);
    let after_base = fingerprint(&base_db).await?;
    if moved != n {
        bail!("the baseline canceled {moved} orders, expected {n}");
    }

    let rate = settled as f64 / ours.as_secs_f64();
    let times = ours.as_secs_f64() / base.as_secs_f64();
    say!(
        "B3: ours {:.2} s ({rate:.0} orders/s), baseline {:.2} s, {times:.2} × baseline",
        ours.as_secs_f64(),
        base.as_secs_f64()
    );
    let mut r = Row::new(
        "B3",
        format!("{n} expired orders holding seats, stock and frozen wallet money, all canceled and released"),
        "time ≤ 3 × baseline; ≥ 5,000 orders/s",
    );
    r.ours = format!("{:.2} s ({rate:.0} orders/s)", ours.as_secs_f64());
    r.baseline = format!("one set-based SQL statement: {:.2} s", base.as_secs_f64());
    // Here the ratio is time over time: lower is better, the goal is at most 3.
    r.ratio = Some(times);
    r.check(format!("{times:.2} × baseline > 3"), times <= 3.0);
    r.check(format!("{rate:.0} orders/s < 5,000"), rate >= 5000.0);
    r.check(
        "same end state as the baseline",
        settled == n && after_ours == after_base && after_ours != before,
    );
    r.note(format!(
        "`fitorder::expiry::expire_due` called from the bench process on a 16-connection pool (the code the \
         server's expiry timer and `order:expire` task run: batches of {} by expires_at, then one set-based \
         cancel per batch with a NOTIFY per order); it settled {settled} orders. Ratio column: our time / the \
         baseline's (≤ 3 wanted)",
        fitorder::expiry::BATCH
    ));
    r.note(format!(
        "data: {} private sessions (slots of {SLOT_CAPACITY} seats, all held), {} class-pack orders (stock), {} MIXED \
         with 50 yuan frozen; {} orders not yet due left alone; the baseline runs on a `CREATE DATABASE … TEMPLATE` copy \
         taken after VACUUM ANALYZE",
        n / 2,
        n - n / 2,
        n / 3,
        n / 10
    ));
    r.note(format!(
        "end state (canceled, waiting, seats held, stock, frozen, balances, cancel audits, unfreezes): ours {after_ours:?}, \
         baseline {after_base:?}"
    ));
    r.note(format!(
        "ours: {}; baseline: {}",
        cpu1.since(&cpu0).describe("", ours),
        cpu3.since(&cpu2).describe("", base)
    ));
    Ok(r)
}
