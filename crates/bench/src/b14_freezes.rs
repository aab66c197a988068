//! B14: membership freezes (issue 36). `n` cards each with a freeze due now are frozen by the
//! library code the scheduler's `membership:tick` task runs (`fitorder::memberships::tick::run`),
//! against one hand-written set-based statement doing the same on an identical copy of the
//! data (as B3 measures expiry); then the same freezes, over, end (both sides again).

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use fitorder::app::AppState;
use fitorder::config::Config;
use fitorder::events::EventHub;
use fitorder::providers::keys::ProviderKeys;
use tokio_postgres::Client;

use crate::env::{connect, Bench, CpuSplit};
use crate::report::Row;
use crate::{seed, Sizes};

const MEMBERS: i64 = 20_000;

/// `n` paid 30-day cards (their orders PAID through the status trigger) with a freeze of 7 days
/// from today that is due now, and n/10 more cards with a freeze from a later day, which must
/// be left alone.
async fn seed_cards(db: &Client, n: i64) -> Result<()> {
    let later = n / 10;
    let all = n + later;
    seed::catalog(db, MEMBERS).await?;
    seed::exec(
        db,
        "plans, card orders, cards, freezes",
        &format!(
            "INSERT INTO membership_plans (store_id, name, duration_days, price_cents)
             SELECT id, 'Monthly card', 30, 39900 FROM stores ORDER BY id;
             INSERT INTO orders (order_no, member_id, store_id, kind, item_name, membership_plan_id, plan_days,
                                 amount_cents, payment_method, sessions_total, trace_id, idempotency_key, request_hash)
             SELECT 'FZ' || lpad(g::text, 10, '0'), m.id, m.store_id, 'MEMBERSHIP', p.name, p.id, 30, p.price_cents,
                    'OFFLINE', 0, 'bench-seed', 'fz-' || g, 'bench'
               FROM generate_series(1, {all}) g
               JOIN (SELECT id, store_id, row_number() OVER (ORDER BY id) - 1 AS k FROM members) m ON m.k = g % {MEMBERS}
               JOIN membership_plans p ON p.store_id = m.store_id
              ORDER BY g;
             UPDATE orders SET status = 'PAID', paid_at = now() - interval '3 days' WHERE order_no LIKE 'FZ%';
             INSERT INTO memberships (member_id, store_id, plan_id, order_id, status, valid_from, valid_to)
             SELECT member_id, store_id, membership_plan_id, id, 'ACTIVE', now() - interval '3 days', now() + interval '27 days'
               FROM orders WHERE order_no LIKE 'FZ%' ORDER BY id;
             INSERT INTO membership_events (membership_id, kind, from_status, to_status, actor, summary, trace_id)
             SELECT id, 'STARTED', NULL, 'ACTIVE', 'system:bench', 'started', 'bench-seed' FROM memberships ORDER BY id;
             INSERT INTO membership_freezes (membership_id, from_date, until_date, starts_at, ends_at, reason, actor, trace_id)
             SELECT m.id, d.today + CASE WHEN m.k < {n} THEN 0 ELSE 3 END, d.today + CASE WHEN m.k < {n} THEN 7 ELSE 10 END,
                    CASE WHEN m.k < {n} THEN now() - interval '1 minute' ELSE now() + interval '3 days' END,
                    CASE WHEN m.k < {n} THEN now() + interval '7 days' ELSE now() + interval '10 days' END,
                    'travelling', 'member:' || m.member_id, 'bench-seed'
               FROM (SELECT id, member_id, row_number() OVER (ORDER BY id) - 1 AS k FROM memberships) m,
                    (SELECT (now() AT TIME ZONE 'Asia/Shanghai')::date AS today) d
              ORDER BY m.id;"
        ),
    )
    .await
}

/// The start of every due freeze in one statement, as a DBA would write it: the same rows
/// changed as the application's (cards FROZEN and moved, their history, the freezes RUNNING,
/// a door and an AI revoke per card in the outbox), without the per-event NOTIFY.
const BASELINE_START: &str = "
WITH due AS (
    SELECT f.id AS freeze_id, f.membership_id, f.until_date - f.from_date AS days, f.reason, f.from_date, f.until_date
      FROM membership_freezes f WHERE f.state = 'SCHEDULED' AND f.starts_at <= now()
), cards AS (
    UPDATE memberships m
       SET status = 'FROZEN', valid_to = m.valid_to + make_interval(days => d.days), frozen_days = m.frozen_days + d.days
      FROM due d WHERE m.id = d.membership_id AND m.status = 'ACTIVE'
    RETURNING m.id, m.member_id, m.store_id, m.order_id
), history AS (
    INSERT INTO membership_events (membership_id, kind, from_status, to_status, actor, reason, summary, trace_id)
    SELECT c.id, 'FROZEN', 'ACTIVE', 'FROZEN', 'system:memberships', d.reason,
           'frozen from ' || d.from_date || ' until ' || d.until_date, 'baseline'
      FROM cards c JOIN due d ON d.membership_id = c.id
), running AS (
    UPDATE membership_freezes f SET state = 'RUNNING' FROM cards c, due d
     WHERE f.id = d.freeze_id AND d.membership_id = c.id
), outbox AS (
    INSERT INTO compensation_events (order_id, kind, max_attempts, payload, idempotency_key, trace_id)
    SELECT c.order_id, k.kind, 8,
           jsonb_build_object('orderNo', o.order_no, 'memberId', c.member_id::text, 'storeId', c.store_id::text,
                              'action', 'REVOKE', 'cause', 'FREEZE-' || d.freeze_id),
           o.order_no || ':' || k.kind || ':FREEZE-' || d.freeze_id, 'baseline'
      FROM cards c JOIN due d ON d.membership_id = c.id JOIN orders o ON o.id = c.order_id
           CROSS JOIN (VALUES ('DOOR_ACCESS_REVOKE'), ('AI_ACCESS_REVOKE')) k(kind)
)
SELECT count(*) FROM cards";

/// The end of every freeze that is over, in one statement: cards ACTIVE again, their history,
/// the freezes DONE, a door and an AI grant per card.
const BASELINE_END: &str = "
WITH due AS (
    SELECT f.id AS freeze_id, f.membership_id, f.from_date, f.until_date
      FROM membership_freezes f WHERE f.state = 'RUNNING' AND f.ends_at <= now()
), cards AS (
    UPDATE memberships m SET status = 'ACTIVE'
      FROM due d WHERE m.id = d.membership_id AND m.status = 'FROZEN'
    RETURNING m.id, m.member_id, m.store_id, m.order_id
), history AS (
    INSERT INTO membership_events (membership_id, kind, from_status, to_status, actor, summary, trace_id)
    SELECT c.id, 'UNFROZEN', 'FROZEN', 'ACTIVE', 'system:memberships',
           'freeze ended: frozen ' || d.from_date || ' until ' || d.until_date, 'baseline'
      FROM cards c JOIN due d ON d.membership_id = c.id
), done AS (
    UPDATE membership_freezes f SET state = 'DONE' FROM cards c, due d
     WHERE f.id = d.freeze_id AND d.membership_id = c.id
), outbox AS (
    INSERT INTO compensation_events (order_id, kind, max_attempts, payload, idempotency_key, trace_id)
    SELECT c.order_id, k.kind, 8,
           jsonb_build_object('orderNo', o.order_no, 'memberId', c.member_id::text, 'storeId', c.store_id::text,
                              'action', 'GRANT', 'cause', 'FREEZE-' || d.freeze_id),
           o.order_no || ':' || k.kind || ':FREEZE-' || d.freeze_id, 'baseline'
      FROM cards c JOIN due d ON d.membership_id = c.id JOIN orders o ON o.id = c.order_id
           CROSS JOIN (VALUES ('DOOR_ACCESS_GRANT'), ('AI_ACCESS_GRANT')) k(kind)
)
SELECT count(*) FROM cards";

/// What both sides must leave behind, identically.
async fn fingerprint(db: &Client) -> Result<Vec<i64>> {
    let r = db
        .query_one(
            "SELECT (SELECT count(*) FROM memberships WHERE status = 'FROZEN'),
                    (SELECT count(*) FROM memberships WHERE status = 'ACTIVE'),
                    (SELECT coalesce(sum(frozen_days), 0)::bigint FROM memberships),
                    (SELECT coalesce(sum(extract(epoch FROM valid_to - valid_from)), 0)::bigint FROM memberships),
                    (SELECT count(*) FROM membership_freezes WHERE state = 'RUNNING'),
                    (SELECT count(*) FROM membership_freezes WHERE state = 'DONE'),
                    (SELECT count(*) FROM membership_events WHERE kind IN ('FROZEN', 'UNFROZEN')),
                    (SELECT count(*) FROM compensation_events WHERE idempotency_key LIKE '%:FREEZE-%')",
            &[],
        )
        .await?;
    Ok((0..8).map(|i| r.try_get::<_, i64>(i)).collect::<Result<_, _>>()?)
}

fn state_on(url: &str) -> Result<AppState> {
    let mut config = Config::for_tests(url.to_string());
    config.db_pool_size = 16;
    let pool = fitorder::db::pool(url, config.db_pool_size)?;
    Ok(AppState::with_keys(
        pool,
        config,
        ProviderKeys::default(),
        EventHub::detached(),
        url.to_string(),
    ))
}

async fn ours(url: &str) -> Result<(i64, Duration, CpuSplit, CpuSplit)> {
    let state = state_on(url)?;
    let cpu0 = CpuSplit::sample(0);
    let t = Instant::now();
    let changed = fitorder::memberships::tick::run(state)
        .await
        .map_err(|e| anyhow::anyhow!("membership tick: {}", e.message()))?;
    let took = t.elapsed();
    Ok((changed, took, cpu0, CpuSplit::sample(0)))
}

async fn baseline(db: &Client, sql: &str) -> Result<(i64, Duration, CpuSplit, CpuSplit)> {
    let cpu0 = CpuSplit::sample(0);
    let t = Instant::now();
    let moved: i64 = db.query_one(sql, &[]).await?.get(0);
    let took = t.elapsed();
    Ok((moved, took, cpu0, CpuSplit::sample(0)))
}

pub async fn run(bench: &mut Bench, s: &Sizes) -> Result<Row> {
    let n = s.expiry_orders;
    say!("B14: seeding {n} cards with a freeze due now ...");
    let ours_url = bench.fresh_db("b14_ours").await?;
    {
        let db = connect(&ours_url).await?;
        seed_cards(&db, n).await?;
    }
    seed::settle(&ours_url).await?;
    let ours_name = bench.db_name("b14_ours");
    let base_url = bench.create_db("b14_base", Some(&ours_name)).await?;
    let ours_db = connect(&ours_url).await?;
    let base_db = connect(&base_url).await?;
    let before = fingerprint(&ours_db).await?;

    say!("B14: freezes start: membership tick ...");
    let (started, t_start, c0, c1) = ours(&ours_url).await?;
    say!("B14: freezes start: baseline SQL ...");
    let (b_started, b_start, c2, c3) = baseline(&base_db, BASELINE_START).await?;
    let after_start = (fingerprint(&ours_db).await?, fingerprint(&base_db).await?);
    if b_started != n {
        bail!("the baseline froze {b_started} cards, expected {n}");
    }

    // The freezes are over: their end moved to the past on both sides alike.
    for db in [&ours_db, &base_db] {
        db.execute(
            "UPDATE membership_freezes SET ends_at = now() - interval '1 minute' WHERE state = 'RUNNING'",
            &[],
        )
        .await?;
        db.execute("VACUUM ANALYZE membership_freezes", &[]).await?;
    }
    say!("B14: freezes end: membership tick ...");
    let (ended, t_end, c4, c5) = ours(&ours_url).await?;
    say!("B14: freezes end: baseline SQL ...");
    let (b_ended, b_end, c6, c7) = baseline(&base_db, BASELINE_END).await?;
    let after_end = (fingerprint(&ours_db).await?, fingerprint(&base_db).await?);

    let start_times = t_start.as_secs_f64() / b_start.as_secs_f64();
    let end_times = t_end.as_secs_f64() / b_end.as_secs_f64();
    say!(
        "B14: start ours {:.2} s, baseline {:.2} s ({start_times:.2} ×); end ours {:.2} s, baseline {:.2} s ({end_times:.2} ×)",
        t_start.as_secs_f64(),
        b_start.as_secs_f64(),
        t_end.as_secs_f64(),
        b_end.as_secs_f64()
    );
    let mut r = Row::new(
        "B14",
        format!(
            "{n} membership freezes due at once start, then end (with {} not due left alone)",
            n / 10
        ),
        "time ≤ 3 × baseline, start and end",
    );
    r.ours = format!(
        "start {:.2} s ({:.0} cards/s), end {:.2} s ({:.0} cards/s)",
        t_start.as_secs_f64(),
        started as f64 / t_start.as_secs_f64(),
        t_end.as_secs_f64(),
        ended as f64 / t_end.as_secs_f64()
    );
    r.baseline = format!(
        "one set-based SQL statement each: start {:.2} s, end {:.2} s",
        b_start.as_secs_f64(),
        b_end.as_secs_f64()
    );
    r.ratio = Some(start_times.max(end_times));
    r.check(format!("start {start_times:.2} × baseline > 3"), start_times <= 3.0);
    r.check(format!("end {end_times:.2} × baseline > 3"), end_times <= 3.0);
    r.check(
        "same end states as the baseline",
        started == n
            && ended == n
            && b_ended == n
            && after_start.0 == after_start.1
            && after_end.0 == after_end.1
            && after_start.0 != before,
    );
    r.note(format!(
        "`fitorder::memberships::tick::run` called from the bench process on a 16-connection pool (the code of the \
         scheduler's `membership:tick`: batches of {} cards locked with SKIP LOCKED, one `change.sql` per batch, the \
         freezes moved, a door and an AI event per card through `enqueue.sql` with its NOTIFYs). Ratio column: the \
         larger of our time / the baseline's (≤ 3 wanted)",
        fitorder::memberships::tick::BATCH
    ));
    r.note(format!(
        "end states (frozen, active, frozen days, validity seconds, running, done, freeze history rows, access \
         events): after the start ours {:?}, baseline {:?}; after the end ours {:?}, baseline {:?}",
        after_start.0, after_start.1, after_end.0, after_end.1
    ));
    r.note(format!(
        "start: ours {}; baseline {}. End: ours {}; baseline {}",
        c1.since(&c0).describe("", t_start),
        c3.since(&c2).describe("", b_start),
        c5.since(&c4).describe("", t_end),
        c7.since(&c6).describe("", b_end)
    ));
    Ok(r)
}
