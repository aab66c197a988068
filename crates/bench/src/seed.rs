//! Seeding with set-based SQL: generate_series and INSERT … SELECT, so that a hundred thousand
//! orders take seconds. The data respects the schema's rules as the application would leave
//! them: orders are born WAIT_PAY (the status trigger is never disabled) and move on through
//! legal transitions with their audit rows; wallet money moves only through ledger rows.

use anyhow::{Context, Result};
use tokio_postgres::Client;

use crate::env::{connect, Bench};
use crate::Sizes;

pub const STORES: i64 = 20;
pub const MEMBERS: i64 = 2_000;
/// B1's and B2's statement counts: payments sent one by one through the counting proxy.
pub const PROBE_ORDERS: i64 = 50;

/// Runs a script of statements, naming the step when it fails.
pub async fn exec(db: &Client, step: &str, sql: &str) -> Result<()> {
    db.batch_execute(sql).await.with_context(|| format!("seeding: {step}"))
}

/// Stores, members (spread over the stores) and one unlimited class pack per store.
pub async fn catalog(db: &Client, members: i64) -> Result<()> {
    exec(
        db,
        "catalog",
        &format!(
            "INSERT INTO stores (name, code, operator_code)
                  SELECT 'Bench studio ' || i, 'BENCH-' || i, 'BENCH-' || i FROM generate_series(1, {STORES}) i;
             INSERT INTO members (store_id, name, phone)
                  SELECT s.id, 'Member ' || i, '139' || lpad(i::text, 8, '0')
                    FROM generate_series(1, {members}) i JOIN stores s ON s.code = 'BENCH-' || (1 + i % {STORES});
             INSERT INTO class_packs (store_id, name, sessions, price_cents, stock)
                  SELECT id, 'AI strength · 10 sessions', 10, 99900, NULL FROM stores;"
        ),
    )
    .await
}

/// `n` WAIT_PAY class-pack orders paid by WeChat Pay, numbered `<prefix>0000000001`…, spread
/// over the members, each with the audit row of its birth. `expires` is an SQL expression
/// over `g` (the order's number).
pub async fn waiting_orders(db: &Client, prefix: &str, n: i64, members: i64, expires: &str) -> Result<()> {
    exec(
        db,
        "waiting orders",
        &format!(
            "INSERT INTO orders (order_no, member_id, store_id, kind, status, item_name, class_pack_id, amount_cents,
                                 payment_method, online_provider, sessions_total, expires_at, trace_id,
                                 idempotency_key, request_hash)
             SELECT '{prefix}' || lpad(g::text, 10, '0'), m.id, m.store_id, 'CLASS_PACK', 'WAIT_PAY', p.name, p.id,
                    p.price_cents, 'WECHAT_PAY', 'WECHAT_PAY', p.sessions, {expires}, 'bench-seed',
                    '{prefix}-' || g, 'bench'
               FROM generate_series(1, {n}) g
               JOIN (SELECT id, store_id, row_number() OVER (ORDER BY id) - 1 AS k FROM members) m ON m.k = g % {members}
               JOIN class_packs p ON p.store_id = m.store_id AND p.stock IS NULL
              ORDER BY g;
             INSERT INTO order_transitions (order_id, from_status, to_status, actor, reason, trace_id)
             SELECT id, NULL, 'WAIT_PAY', 'member:' || member_id, 'order placed', 'bench-seed'
               FROM orders WHERE order_no LIKE '{prefix}%' ORDER BY id;"
        ),
    )
    .await
}

/// Pays the `<prefix>` orders as a WeChat Pay callback would have: WAIT_PAY -> PAID with its
/// audit row, a payment row (transaction id `42` + the order's number), paid at `paid_at` (an
/// SQL expression over the order's number `g`).
pub async fn pay(db: &Client, prefix: &str, paid_at: &str) -> Result<()> {
    let paid_at = paid_at.replace("{g}", "right(order_no, 10)::bigint");
    exec(
        db,
        "paying orders",
        &format!(
            "UPDATE orders SET status = 'PAID', paid_at = {paid_at}, expires_at = NULL,
                               provider_txn_id = '42' || lpad(right(order_no, 10), 26, '0'), updated_at = now()
              WHERE order_no LIKE '{prefix}%';
             INSERT INTO order_transitions (order_id, from_status, to_status, actor, reason, trace_id)
             SELECT id, 'WAIT_PAY', 'PAID', 'provider:WECHAT_PAY', 'WECHAT_PAY payment ' || provider_txn_id, 'bench-seed'
               FROM orders WHERE order_no LIKE '{prefix}%' ORDER BY id;
             INSERT INTO payments (order_id, method, idempotency_key, provider_txn_id, amount_cents, wallet_cents,
                                   online_cents, actor, trace_id, paid_at)
             SELECT id, 'WECHAT_PAY', order_no || ':' || provider_txn_id, provider_txn_id, amount_cents, 0, amount_cents,
                    'provider:WECHAT_PAY', 'bench-seed', paid_at
               FROM orders WHERE order_no LIKE '{prefix}%' ORDER BY id;"
        ),
    )
    .await
}

/// The door and AI-device grants of the `<prefix>` orders, in `status`.
pub async fn grants(db: &Client, prefix: &str, status: &str) -> Result<()> {
    let (attempts, next) = if status == "SUCCEEDED" {
        (1, "NULL")
    } else {
        (0, "now()")
    };
    exec(
        db,
        "grant events",
        &format!(
            "INSERT INTO compensation_events (order_id, kind, status, attempts, max_attempts, next_attempt_at, payload,
                                              idempotency_key, trace_id)
             SELECT o.id, k.kind, '{status}', {attempts}, 5, {next},
                    jsonb_build_object('orderNo', o.order_no, 'memberId', o.member_id::text,
                                       'storeId', o.store_id::text, 'action', 'GRANT'),
                    o.order_no || ':' || k.kind, 'bench-seed'
               FROM orders o CROSS JOIN (VALUES ('DOOR_ACCESS_GRANT'), ('AI_ACCESS_GRANT')) AS k(kind)
              WHERE o.order_no LIKE '{prefix}%'
              ORDER BY o.id, k.kind;"
        ),
    )
    .await
}

/// Statistics and a clean heap before anything is timed, so that autovacuum does not wake up
/// in the middle of a measurement and plans are those of a settled database.
pub async fn settle(url: &str) -> Result<()> {
    let db = connect(url).await?;
    exec(&db, "vacuum", "VACUUM ANALYZE").await?;
    exec(&db, "checkpoint", "CHECKPOINT").await
}

/// The API database of B1, B2, B5 and B7: B1's waiting orders, then the admin console's
/// listing (paid orders with their grants and, for one in ten, a ticket), newest last so that
/// the first page of `orders` is the listing whatever ran before. Made once per run.
pub async fn api_db(bench: &mut Bench, s: &Sizes) -> Result<String> {
    if let Some(url) = &bench.api_url {
        return Ok(url.clone());
    }
    let url = bench.fresh_db("api").await?;
    let db = connect(&url).await?;
    api_data(&db, s).await?;
    drop(db);
    settle(&url).await?;
    bench.api_url = Some(url.clone());
    Ok(url)
}

/// The API database's rows (B1's waiting orders, the probe's, B5's paid listing with its grants
/// and tickets) into the migrated database `db`.
pub async fn api_data(db: &Client, s: &Sizes) -> Result<()> {
    catalog(db, MEMBERS).await?;
    waiting_orders(db, "FB1", s.notifications as i64, MEMBERS, "now() + interval '1 day'").await?;
    waiting_orders(db, "FBP", PROBE_ORDERS, MEMBERS, "now() + interval '1 day'").await?;
    waiting_orders(db, "FB5", s.listing_orders, MEMBERS, "now() + interval '1 day'").await?;
    pay(db, "FB5", "now() - interval '1 hour'").await?;
    grants(db, "FB5", "SUCCEEDED").await?;
    exec(
        db,
        "tickets",
        "INSERT INTO exception_tickets (kind, provider, order_id, order_no, store_id, provider_txn_id,
                                        local_amount_cents, provider_amount_cents, detail, finding_key, trace_id)
         SELECT 'AMOUNT_MISMATCH', 'WECHAT_PAY', id, order_no, store_id, provider_txn_id, amount_cents,
                amount_cents + 1, '{\"source\": \"bench\"}', 'BENCH:' || order_no, 'bench-seed'
           FROM orders WHERE order_no LIKE 'FB5%' AND id % 10 = 0 ORDER BY id;",
    )
    .await?;
    Ok(())
}
