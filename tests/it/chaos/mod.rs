//! Chaos: thousands of random actions over several real `fitorder` processes — callbacks
//! duplicated, reordered and late, check-ins racing, cancels, refunds, expiries, members paying
//! at the provider just as the trade is closed, refunds answered PROCESSING / `fund_change` N
//! that finish later, a downstream failing a third of the time, processes killed -9 and
//! restarted, PostgreSQL restarted once — then an invariant checker reads the books (and the
//! provider's trades: paid there ⇒ applied, or refunded and confirmed) and fails on any violation.
//! Cards are frozen (from today, or from a later day that the scheduler starts once its day is
//! moved into the past), unfrozen and transferred among it all (issue 36), and the checker holds
//! no check-in on a frozen card, door and AI access that follows who holds which active card, and
//! `validTo` = start + plan days + days frozen.
//!
//! Seeded and reproducible in what it asks (the interleaving is the machine's): it prints its
//! seed. CI runs a short version; the long one:
//! `CHAOS_ACTIONS=20000 CHAOS_SEED=7 cargo test --release --test it chaos -- --nocapture`.
//!
//! [`cluster`] runs the machines, [`actions`] plays the members, staff and providers,
//! [`invariants`] reads the books.

mod actions;
mod cluster;
mod invariants;

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use self::actions::{send, Provider, World};
use self::cluster::{Cluster, Database};
use self::invariants::{check_downstream, check_invariants, scalar};
use crate::fakes::{FakeDownstream, Mode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_keeps_the_books_right() {
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let actions: usize = std::env::var("CHAOS_ACTIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    eprintln!("chaos: seed {seed}, {actions} actions (CHAOS_SEED={seed} reproduces the script)");
    let mut rng = StdRng::seed_from_u64(seed);

    let mut db = Database::start().await;
    let downstream = FakeDownstream::start(Mode::Flaky).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut cluster = Cluster::start(&db.url, &downstream, &http).await;
    let urls = cluster.urls();
    let mut w = World::set_up(&http, &urls, cluster.sandbox.clone(), &db.url).await;

    let mut provider = Provider::default();
    let pg_restart_at = actions / 2;
    for step in 0..actions {
        // Processes die and come back.
        if step > 0 && step % (actions / 4).max(50) == 0 {
            let victim = rng.random_range(0..cluster.procs.len());
            eprintln!(
                "chaos: step {step}: kill -9 process {victim} ({:?})",
                cluster.procs[victim].args
            );
            cluster.kill(victim);
            tokio::time::sleep(Duration::from_millis(300)).await;
            cluster.start_proc(victim);
        }
        if step == pg_restart_at {
            eprintln!("chaos: step {step}: restarting PostgreSQL");
            db.restart().await;
        }
        for said in cluster.revive() {
            eprintln!("chaos: step {step}: a process had ended, started again: {said}");
        }
        w.act(step, &mut rng, &mut provider).await;
    }

    // Settle: every process up, the provider delivers everything it still owes (retrying on 5xx),
    // orders expire, freezes whose day has come start or end, the outbox drains.
    cluster.start_stopped();
    cluster.revive();
    provider.release_all();
    let deadline = Instant::now() + Duration::from_secs(120);
    while let Some(n) = provider.pending.pop() {
        let mut ok = false;
        while !ok {
            assert!(
                Instant::now() < deadline,
                "the server kept refusing a genuine notification"
            );
            let url = urls[rng.random_range(0..urls.len())].clone();
            ok = send(&http, &url, &n).await;
            if !ok {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let mut conn = loop {
        match <diesel_async::AsyncPgConnection as diesel_async::AsyncConnection>::establish(&db.url).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    loop {
        let open = scalar(
            &mut conn,
            "SELECT count(*) AS v FROM orders WHERE status = 'WAIT_PAY' AND expires_at IS NOT NULL",
        )
        .await
            + scalar(
                &mut conn,
                "SELECT count(*) AS v FROM compensation_events WHERE status IN ('PENDING', 'RETRYING')",
            )
            .await
            + scalar(
                &mut conn,
                "SELECT count(*) AS v FROM membership_freezes
                  WHERE (state = 'SCHEDULED' AND starts_at <= now()) OR (state = 'RUNNING' AND ends_at <= now())",
            )
            .await;
        if open == 0 {
            break;
        }
        // An hour passes for refunds still PROCESSING at WeChat Pay whose notification was
        // lost (their recheck is an hour away): asked of the refund query now.
        use diesel_async::RunQueryDsl;
        // The days the chaos let pass for a scheduled freeze pass for its card's earlier freeze
        // too: one from today accepted after those days "passed" (its dates lie before the
        // scheduled one's, so it was rightly accepted) ends before the scheduled one starts, as
        // it would in real time.
        let _ = diesel::sql_query(
            "UPDATE membership_freezes f SET ends_at = greatest(f.starts_at, now() - interval '2 seconds')
              WHERE f.state = 'RUNNING' AND f.ends_at > now()
                AND EXISTS (SELECT 1 FROM membership_freezes s
                             WHERE s.membership_id = f.membership_id AND s.state = 'SCHEDULED'
                               AND s.starts_at <= now() AND s.from_date > f.from_date)",
        )
        .execute(&mut conn)
        .await;
        let _ = diesel::sql_query(
            "UPDATE compensation_events SET next_attempt_at = now()
              WHERE kind = 'PROVIDER_REFUND' AND status = 'RETRYING' AND next_attempt_at > now() + interval '1 minute'",
        )
        .execute(&mut conn)
        .await;
        if Instant::now() >= deadline {
            let rows = diesel::sql_query(
                "SELECT 'order ' || order_no || ' ' || status AS v FROM orders WHERE status = 'WAIT_PAY' AND expires_at IS NOT NULL
                 UNION ALL SELECT 'event ' || id || ' ' || kind || ' ' || status || ' ' || idempotency_key || ' next ' || next_attempt_at
                   FROM compensation_events WHERE status IN ('PENDING', 'RETRYING')
                 UNION ALL SELECT 'freeze ' || f.id || ' ' || f.state || ' card ' || m.status || ' ' || f.from_date || '..' || f.until_date
                   FROM membership_freezes f JOIN memberships m ON m.id = f.membership_id
                  WHERE (f.state = 'SCHEDULED' AND f.starts_at <= now()) OR (f.state = 'RUNNING' AND f.ends_at <= now())",
            )
            .load::<invariants::Text>(&mut conn)
            .await
            .unwrap_or_default();
            panic!(
                "{open} orders, events or due freezes never settled: {:#?}",
                rows.iter().map(|r| &r.v).collect::<Vec<_>>()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let mut violations = check_invariants(&mut conn, &provider, &w.provider_trades()).await;
    violations.extend(check_downstream(&mut conn, &downstream.calls()).await);
    let sees_frozen_check_ins = frozen_check_in_is_seen(&mut conn).await;
    let orders = scalar(&mut conn, "SELECT count(*) AS v FROM orders").await;
    let callbacks = scalar(&mut conn, "SELECT count(*) AS v FROM payment_callbacks").await;
    // Members who paid during the close, found by the query that followed the refused close.
    let raced = scalar(
        &mut conn,
        "SELECT count(*) AS v FROM payment_callbacks WHERE event_type = 'TRADE_QUERY' AND outcome = 'APPLIED'",
    )
    .await;
    let confirmed = scalar(
        &mut conn,
        "SELECT count(*) AS v FROM compensation_events WHERE kind = 'PROVIDER_REFUND' AND status = 'SUCCEEDED'",
    )
    .await;
    eprintln!("chaos: {raced} orders paid during their close, {confirmed} provider refunds confirmed");
    let cooled = scalar(
        &mut conn,
        "SELECT count(*) AS v FROM order_prepaid p JOIN orders o ON o.id = p.order_id
          WHERE p.refund_due_by IS NOT NULL AND o.status = 'REFUNDED'",
    )
    .await;
    eprintln!(
        "chaos: {} placements refused over a prepaid cap, {cooled} orders taken back in cooling-off",
        w.prepaid_refused
    );
    // The cards' life: what was asked and answered, and what the books say happened.
    for (what, n) in &w.cards {
        eprintln!("chaos: cards: {what}: {n}");
    }
    let c = card_counts(&mut conn).await;
    eprintln!(
        "chaos: {} cards: {} frozen from today, {} freezes scheduled, {} started and {} ended by the scheduler, \
         {} unfrozen early, {} called off, {} refunded while frozen, {} transferred; {} check-ins with cards, \
         {} refused MEMBERSHIP_FROZEN",
        c.cards,
        c.frozen_now,
        c.scheduled,
        c.frozen_by_tick,
        c.ended_by_tick,
        c.unfrozen_early,
        c.called_off,
        c.revoked_frozen,
        c.transfers,
        c.check_ins,
        w.frozen_check_ins_refused
    );
    eprintln!(
        "chaos: seed {seed}: {orders} orders, {callbacks} callbacks, {} violations",
        violations.len()
    );
    let deadlocks = db.deadlocks();
    eprintln!("chaos: PostgreSQL broke {} deadlocks", deadlocks.len());
    for d in deadlocks.iter().take(3) {
        eprintln!("chaos: deadlock: {d}");
    }
    for v in &violations {
        eprintln!("chaos: violation: {v}");
    }
    drop(conn);
    drop(cluster);
    db.remove().await;
    assert!(
        orders > (actions / 10) as i64,
        "the run did too little to mean anything: {orders} orders"
    );
    assert!(raced > 0, "no member paid during a close: the race was not exercised");
    // Every request locks an order before its card (check-ins, refunds, freezes, transfers,
    // the scheduler): PostgreSQL never has a deadlock to break.
    assert!(deadlocks.is_empty(), "PostgreSQL broke deadlocks: {deadlocks:#?}");
    assert!(
        w.prepaid_refused > 0,
        "no placement met a prepaid cap: the caps were not exercised"
    );
    assert!(cooled > 0, "no order was taken back in cooling-off");
    assert!(
        c.frozen_now > 0 && c.frozen_by_tick > 0 && c.ended_by_tick > 0 && c.unfrozen_early > 0 && c.transfers > 0,
        "the cards' life was not exercised: {c:?}"
    );
    assert!(w.frozen_check_ins_refused > 0, "no check-in met a frozen card");
    assert!(
        sees_frozen_check_ins,
        "the checker did not see a check-in put into a frozen interval of the run"
    );
    assert!(
        violations.is_empty(),
        "seed {seed}: invariants violated:\n{}",
        violations.join("\n")
    );
}

/// The checker's test of its own, on this run's books and commit timestamps (the checker's
/// unit test runs on a server without them): a check-in put (in a transaction rolled back)
/// into the middle of the longest interval a card of the run was frozen must be seen.
async fn frozen_check_in_is_seen(conn: &mut diesel_async::AsyncPgConnection) -> bool {
    use diesel_async::RunQueryDsl;
    diesel::sql_query("BEGIN").execute(conn).await.unwrap();
    let put = diesel::sql_query(
        "WITH ev AS (SELECT e.id, e.membership_id, e.from_status, e.to_status,
                            pg_xact_commit_timestamp(e.xmin) AS t FROM membership_events e),
              spans AS (SELECT s.membership_id, s.t AS since,
                               (SELECT x.t FROM ev x WHERE x.membership_id = s.membership_id AND x.id > s.id
                                   AND x.from_status = 'FROZEN' AND x.to_status <> 'FROZEN' ORDER BY x.id LIMIT 1) AS until
                          FROM ev s WHERE s.to_status = 'FROZEN' AND s.from_status = 'ACTIVE')
         INSERT INTO check_ins (order_id, consume_txn_no, sessions, remaining_after, actor, trace_id, at)
         SELECT m.order_id, 'self-check', 0, 0, 'chaos', 'chaos', s.since + (s.until - s.since) / 2
           FROM spans s JOIN memberships m ON m.id = s.membership_id
          WHERE s.until IS NOT NULL ORDER BY s.until - s.since DESC LIMIT 1",
    )
    .execute(conn)
    .await
    .unwrap();
    let found = invariants::check_cards(conn).await;
    diesel::sql_query("ROLLBACK").execute(conn).await.unwrap();
    put == 1 && found.iter().any(|f| f.contains("check-in self-check of"))
}

/// What the books say the cards went through.
#[derive(diesel::QueryableByName, Debug)]
struct CardCounts {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    cards: i64,
    /// Frozen at once (a freeze from today).
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    frozen_now: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    scheduled: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    frozen_by_tick: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    ended_by_tick: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    unfrozen_early: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    called_off: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    revoked_frozen: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    transfers: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    check_ins: i64,
}

async fn card_counts(conn: &mut diesel_async::AsyncPgConnection) -> CardCounts {
    use diesel_async::RunQueryDsl;
    diesel::sql_query(
        "SELECT (SELECT count(*) FROM memberships) AS cards,
                count(*) FILTER (WHERE kind = 'FROZEN' AND to_status = 'FROZEN' AND from_status = 'ACTIVE'
                                   AND actor NOT LIKE 'system:%') AS frozen_now,
                count(*) FILTER (WHERE kind = 'FROZEN' AND to_status = from_status) AS scheduled,
                count(*) FILTER (WHERE kind = 'FROZEN' AND to_status = 'FROZEN' AND from_status = 'ACTIVE'
                                   AND actor LIKE 'system:%') AS frozen_by_tick,
                count(*) FILTER (WHERE kind = 'UNFROZEN' AND from_status = 'FROZEN' AND actor LIKE 'system:%') AS ended_by_tick,
                count(*) FILTER (WHERE kind = 'UNFROZEN' AND from_status = 'FROZEN'
                                   AND actor NOT LIKE 'system:%') AS unfrozen_early,
                (SELECT count(*) FROM membership_freezes WHERE state = 'CALLED_OFF') AS called_off,
                count(*) FILTER (WHERE kind = 'REVOKED' AND from_status = 'FROZEN') AS revoked_frozen,
                count(*) FILTER (WHERE kind = 'TRANSFERRED') AS transfers,
                (SELECT count(*) FROM check_ins c JOIN memberships m ON m.order_id = c.order_id) AS check_ins
           FROM membership_events",
    )
    .get_result(conn)
    .await
    .unwrap()
}
