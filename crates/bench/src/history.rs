//! B1b's database: a million orders and their history already in the tables, loaded with
//! set-based SQL (generate_series, INSERT … SELECT) before the payments are timed.
//!
//! Each historic order went the way a paid WeChat Pay order goes: born WAIT_PAY with its audit
//! row (the status trigger is never disabled), paid by a notification (WAIT_PAY → PAID with its
//! audit row, its payment, the callback's evidence row `APPLIED` with a body the size of a real
//! notification's, its idempotency key), and its door and AI-device grants delivered
//! (`SUCCEEDED`, one attempt each).

use std::time::Instant;

use anyhow::Result;
use tokio_postgres::Client;

use crate::seed;

/// The prefix of the historic orders.
pub const PREFIX: &str = "FBH";

/// What the load wrote and how long it took.
pub struct Loaded {
    pub orders: i64,
    pub rows: Vec<(&'static str, i64)>,
    pub secs: f64,
}

/// Loads `n` historic orders into `db` (a database that has the catalog already). `body_len`:
/// the size of a real notification's body, which each evidence row gets.
pub async fn load(db: &Client, n: i64, body_len: usize) -> Result<Loaded> {
    let started = Instant::now();
    // Paid over the last 90 days, spread evenly (the history of a chain of studios).
    seed::waiting_orders(
        db,
        PREFIX,
        n,
        seed::MEMBERS,
        &format!("now() - interval '90 days' + g * interval '90 days' / {n} + interval '30 minutes'"),
    )
    .await?;
    say!("B1b: {n} orders placed ({:.0} s) ...", started.elapsed().as_secs_f64());
    seed::pay(
        db,
        PREFIX,
        &format!("now() - interval '90 days' + {{g}} * interval '90 days' / {n} + interval '1 minute'"),
    )
    .await?;
    say!("B1b: ... paid ({:.0} s) ...", started.elapsed().as_secs_f64());
    // The evidence: a body of random-looking text as long as a real notification's (what the
    // provider encrypts does not compress), the headers the server keeps.
    let chunks = body_len.div_ceil(32).max(1);
    seed::exec(
        db,
        "historic callbacks",
        &format!(
            "INSERT INTO payment_callbacks (provider, received_at, verified, outcome, event_type, body, headers,
                                            order_id, order_no, store_id, idempotency_key, provider_txn_id,
                                            amount_cents, trace_id)
             SELECT 'WECHAT_PAY', o.paid_at, true, 'APPLIED', 'TRANSACTION.SUCCESS',
                    left((SELECT string_agg(md5(o.id::text || ':' || k), '') FROM generate_series(1, {chunks}) k), {body_len}),
                    jsonb_build_object('wechatpay-timestamp', extract(epoch FROM o.paid_at)::bigint::text,
                                       'wechatpay-nonce', md5(o.order_no),
                                       'wechatpay-serial', 'PUB_KEY_ID_0119000001092026120100000000000001',
                                       'wechatpay-signature-type', 'WECHATPAY2-SHA256-RSA2048'),
                    o.id, o.order_no, o.store_id, o.order_no || ':' || o.provider_txn_id, o.provider_txn_id,
                    o.amount_cents, 'bench-history'
               FROM orders o WHERE o.order_no LIKE '{PREFIX}%' ORDER BY o.id;
             INSERT INTO payment_keys (key, callback_id, created_at)
             SELECT idempotency_key, id, received_at FROM payment_callbacks
              WHERE order_no LIKE '{PREFIX}%' ORDER BY id;"
        ),
    )
    .await?;
    say!(
        "B1b: ... callbacks and keys ({:.0} s) ...",
        started.elapsed().as_secs_f64()
    );
    seed::grants(db, PREFIX, "SUCCEEDED").await?;
    seed::exec(
        db,
        "historic attempts",
        &format!(
            "INSERT INTO compensation_attempts (event_id, at, ok, duration_ms, worker)
             SELECT e.id, e.created_at, true, 3, 'bench-history'
               FROM compensation_events e JOIN orders o ON o.id = e.order_id
              WHERE o.order_no LIKE '{PREFIX}%' ORDER BY e.id"
        ),
    )
    .await?;
    let mut rows = vec![];
    for table in [
        "orders",
        "order_transitions",
        "payments",
        "payment_callbacks",
        "payment_keys",
        "compensation_events",
        "compensation_attempts",
    ] {
        let count: i64 = db
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await?
            .get(0);
        rows.push((table, count));
    }
    Ok(Loaded {
        orders: n,
        rows,
        secs: started.elapsed().as_secs_f64(),
    })
}
