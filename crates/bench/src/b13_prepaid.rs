//! B13: prepaid money (issue 35).
//!
//! **B13**: `placeOrder` in a store under `SHANGHAI_2025` rules (caps checked under the member's
//! row lock: the store's rules and the member's holdings in one read, the sale's cooling-off row) against the
//! same in a `NONE` store, on one server in alternating rounds; and the statements a placing
//! costs in each, counted by the wire-protocol proxy. WALLET orders of 10-session class packs,
//! so the provider is not involved; one member and one pack per request in flight, each
//! member's holdings well under the caps (no placing may be refused); one more round of a single
//! unlimited pack shows it locks nothing.
//!
//! **B13L**: `prepaidLedger` of a store with a million orders over 90 days, a 30-day range in
//! the middle: before any day is closed (the server computes from every order) and after the
//! nightly `prepaid:close` ran (a `fitorder worker`), plus the last 30 days through today; the
//! statements the server sent captured by the proxy with their binds and run again under
//! `EXPLAIN (ANALYZE, BUFFERS)`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use serde_json::{json, Value};
use tokio_postgres::Client;

use crate::env::{connect, Bench, CpuSplit, Proc, Server};
use crate::load::{self, ms, Outcome, Prepared, Until};
use crate::report::Row;
use crate::sqlcount::{upstream_of, via, Captured, Counts, SqlCounter};
use crate::{seed, Sizes};

/// Rounds of each store kind, taken in turn (NONE, SHANGHAI, NONE, …), as B12 does.
const ROUNDS: usize = 3;
/// Placings per member at most: 5 packs of 10 sessions (¥100 each) stay under SHANGHAI_2025's
/// 60 unused sessions and ¥20,000 held, and within the ¥600 each wallet is topped up with.
const PER_MEMBER: usize = 5;
const PACK_CENTS: i64 = 10_000;
const TOP_UP_CENTS: i64 = 60_000;
/// Members placing the warm-up orders (one each).
const WARM: usize = 64;
/// Class packs of each store, all alike: request j buys pack j mod PACKS, so the requests in
/// flight would lock different pack rows if they had a stock (placing updates a stocked pack's
/// row and holds that lock until commit); one round buys a single unlimited pack, to show it
/// takes no lock).
const PACKS: usize = 64;

/// The two stores: NONE first (the baseline), then SHANGHAI_2025.
const KINDS: [(&str, &str); 2] = [("NONE", "BENCH-B13-NONE"), ("SHANGHAI_2025", "BENCH-B13-SH")];

fn place_order_document() -> Result<String> {
    let cut = crate::b11_signin::member_operation;
    Ok(format!(
        "{}\n{}",
        cut("mutation PlaceOrder(")?,
        cut("fragment PaymentInstructionFields")?
    ))
}

fn graphql(server: &str, token: &str, body: &Value) -> Prepared {
    Prepared {
        url: format!("{server}/graphql"),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("authorization".into(), format!("Bearer {token}")),
        ],
        body: Bytes::from(body.to_string()),
    }
}

async fn post(req: &Prepared) -> Result<Value> {
    let mut b = reqwest::Client::new()
        .post(&req.url)
        .timeout(Duration::from_secs(120))
        .body(req.body.clone());
    for (k, v) in &req.headers {
        b = b.header(k, v);
    }
    Ok(b.send().await?.json().await?)
}

fn member_token(bench: &Bench, member: i64) -> String {
    fitorder::auth::issue_token(
        &bench.jwt_secret,
        fitorder::auth::Role::Member,
        &member.to_string(),
        None,
        Duration::from_secs(6 * 3600),
    )
}

/// One store's catalog and members: its id, its class packs, its members (topped up).
struct Store {
    preset: &'static str,
    id: i64,
    packs: Vec<i64>,
    members: Vec<i64>,
}

/// Historic orders per member of the stores' others (besides the placing members' two).
const HISTORY_PER_MEMBER: usize = 10;

/// The stores' history before the placings: each placing member has a used-up 10-session pack
/// (CONSUMED) and one half used (CONSUMING: 5 sessions, ¥50 held, under the caps with the 5
/// placings to come), and `others` members of each store have `HISTORY_PER_MEMBER` orders each
/// (a third CONSUMED, a third CONSUMING, a third PAID), so that a placing runs against a store
/// with a history and statistics of a filled table, as in production. Born WAIT_PAY and moved on
/// through legal transitions.
async fn seed_history(db: &Client, others: usize) -> Result<i64> {
    seed::exec(
        db,
        "B13 history",
        &format!(
            "INSERT INTO members (store_id, name, phone)
                  SELECT s.id, 'Regular ' || i, '135' || lpad(i::text, 8, '0')
                    FROM stores s CROSS JOIN generate_series(1, {others}) i
                   WHERE s.code LIKE 'BENCH-B13-%' ORDER BY s.id, i;
             CREATE TEMP TABLE b13_history AS
                  SELECT m.id AS member_id, m.store_id, p.id AS pack_id, p.name, k,
                         'b13-h-' || k AS key,
                         now() - k * interval '9 days' - (m.id % 1440) * interval '1 minute' AS placed_at,
                         CASE WHEN k = 1 THEN 10 WHEN k = 2 THEN 5 WHEN k % 3 = 0 THEN 10 WHEN k % 3 = 1 THEN 3 ELSE 0 END AS used
                    FROM members m
                    JOIN stores s ON s.id = m.store_id AND s.code LIKE 'BENCH-B13-%'
                    JOIN LATERAL (SELECT id, name FROM class_packs c WHERE c.store_id = m.store_id
                                   ORDER BY c.id LIMIT 1) p ON true
                   CROSS JOIN LATERAL generate_series(1, CASE WHEN m.phone LIKE '135%' THEN {HISTORY_PER_MEMBER} ELSE 2 END) k;
             INSERT INTO orders (member_id, store_id, kind, item_name, class_pack_id, amount_cents, payment_method,
                                 sessions_total, created_at, updated_at, trace_id, idempotency_key, request_hash)
             SELECT member_id, store_id, 'CLASS_PACK', name, pack_id, {PACK_CENTS}, 'OFFLINE', 10, placed_at, placed_at,
                    'bench-seed', key, 'bench'
               FROM b13_history ORDER BY placed_at;
             UPDATE orders o SET status = 'PAID', paid_at = h.placed_at + interval '1 minute'
               FROM b13_history h WHERE o.member_id = h.member_id AND o.idempotency_key = h.key;
             UPDATE orders o SET status = 'CONSUMING', sessions_used = h.used
               FROM b13_history h WHERE o.member_id = h.member_id AND o.idempotency_key = h.key AND h.used > 0;
             UPDATE orders o SET status = 'CONSUMED'
               FROM b13_history h WHERE o.member_id = h.member_id AND o.idempotency_key = h.key AND h.used = 10;
             DROP TABLE b13_history;"
        ),
    )
    .await?;
    Ok(db.query_one("SELECT count(*) FROM orders", &[]).await?.get(0))
}

async fn seed_stores(db: &Client, members: usize) -> Result<Vec<Store>> {
    seed::exec(
        db,
        "B13 stores",
        &format!(
            "INSERT INTO stores (name, code, operator_code)
                  VALUES ('Bench studio, no rules', 'BENCH-B13-NONE', 'BENCH-B13-NONE'),
                         ('Bench studio, Shanghai', 'BENCH-B13-SH', 'BENCH-B13-SH');
             INSERT INTO class_packs (store_id, name, sessions, price_cents, stock)
                  SELECT id, 'AI strength · 10 sessions #' || k, 10, {PACK_CENTS}, NULL
                    FROM stores CROSS JOIN generate_series(1, {PACKS}) k
                   WHERE code LIKE 'BENCH-B13-%' ORDER BY id, k;
             INSERT INTO members (store_id, name, phone)
                  SELECT s.id, 'Member ' || i, '136' || lpad(i::text, 8, '0')
                    FROM stores s CROSS JOIN generate_series(1, {members}) i
                   WHERE s.code LIKE 'BENCH-B13-%' ORDER BY s.id, i;
             INSERT INTO wallet_ledger (member_id, kind, balance_delta, frozen_delta, reference, actor, trace_id)
                  SELECT m.id, 'TOP_UP', {TOP_UP_CENTS}, 0, 'b13-top-up', 'member:' || m.id, 'bench-seed'
                    FROM members m JOIN stores s ON s.id = m.store_id
                   WHERE s.code LIKE 'BENCH-B13-%' ORDER BY m.id;"
        ),
    )
    .await?;
    let mut out = vec![];
    for (preset, code) in KINDS {
        let id: i64 = db
            .query_one("SELECT id FROM stores WHERE code = $1", &[&code])
            .await?
            .get(0);
        let packs: Vec<i64> = db
            .query("SELECT id FROM class_packs WHERE store_id = $1 ORDER BY id", &[&id])
            .await?
            .into_iter()
            .map(|r| r.get(0))
            .collect();
        let members: Vec<i64> = db
            .query(
                "SELECT id FROM members WHERE store_id = $1 AND phone LIKE '136%' ORDER BY id",
                &[&id],
            )
            .await?
            .into_iter()
            .map(|r| r.get(0))
            .collect();
        out.push(Store {
            preset,
            id,
            packs,
            members,
        });
    }
    Ok(out)
}

/// Sets a store's rules the way a chain-wide admin does: `setPrepaidRules`.
async fn set_rules(server: &str, admin: &str, store: &Store) -> Result<()> {
    let body = json!({
        "query": "mutation B13Rules($store: ID!, $preset: PrepaidRulesPreset!) {
                    setPrepaidRules(storeId: $store, input: {preset: $preset}) {
                      id prepaidRules { preset totalMaxCents sessionsMaxCount coolingOffDays }
                    }
                  }",
        "variables": {"store": store.id.to_string(), "preset": store.preset},
    });
    let v = post(&graphql(server, admin, &body)).await?;
    if v.get("errors").is_some() || v["data"]["setPrepaidRules"]["prepaidRules"]["preset"] != store.preset {
        bail!(
            "setPrepaidRules({}) answered {}",
            store.preset,
            v.to_string().chars().take(400).collect::<String>()
        );
    }
    Ok(())
}

/// A WALLET placing of the store's class pack by `member`.
fn placing(bench: &Bench, server: &str, doc: &str, store: &Store, pack: i64, member: i64, key: &str) -> Prepared {
    let body = json!({
        "query": doc,
        "operationName": "PlaceOrder",
        "variables": {"input": {
            "idempotencyKey": key,
            "storeId": store.id.to_string(),
            "item": {"classPackId": pack.to_string()},
            "paymentMethod": "WALLET",
        }},
    });
    graphql(server, &member_token(bench, member), &body)
}

/// Sends `reqs` one after another; the answers must carry a PAID order.
async fn sequential(reqs: &[Prepared]) -> Result<()> {
    for r in reqs {
        let v = post(r).await?;
        if v.get("errors").is_some() || v["data"]["placeOrder"]["order"]["status"] != "PAID" {
            bail!(
                "placeOrder answered {}",
                v.to_string().chars().take(400).collect::<String>()
            );
        }
    }
    Ok(())
}

/// One store kind's timed rounds added up.
#[derive(Default)]
struct Kind {
    out: Outcome,
    server_cpu: f64,
    postgres_cpu: f64,
}

impl Kind {
    fn add(&mut self, o: Outcome, cpu: &CpuSplit) {
        self.out.ok += o.ok;
        self.out.elapsed += o.elapsed;
        self.out.latencies.extend(o.latencies);
        for (k, v) in o.other {
            let e = self.out.other.entry(k).or_insert((0, v.1));
            e.0 += v.0;
        }
        self.server_cpu += cpu.subject;
        self.postgres_cpu += cpu.postgres;
    }

    fn describe(&mut self) -> String {
        self.out.latencies.sort_unstable();
        let n = self.out.ok.max(1) as f64;
        format!(
            "{:.0} placings/s (p50 {:.1} ms, p99 {:.1} ms), server CPU {:.0} µs and PostgreSQL CPU {:.0} µs per placing",
            self.out.rate(),
            ms(self.out.percentile(50.0)),
            ms(self.out.percentile(99.0)),
            1e6 * self.server_cpu / n,
            1e6 * self.postgres_cpu / n,
        )
    }
}

pub async fn run(bench: &mut Bench, s: &Sizes) -> Result<Row> {
    let per_round = s.prepaid_placings.div_ceil(ROUNDS);
    let timed = per_round * ROUNDS;
    let timed_members = timed.div_ceil(PER_MEMBER);
    let hot_members = per_round.div_ceil(PER_MEMBER);
    let n = s.count_requests;
    // Per store: the timed members, the one-pack round's, the warm-up's, then the counted
    // placings' (one each).
    let members = timed_members + hot_members + WARM + n + 1;
    let url = bench.fresh_db("b13").await?;
    let others = s.prepaid_history_members;
    let (stores, history) = {
        let db = connect(&url).await?;
        let stores = seed_stores(&db, members).await?;
        (stores, seed_history(&db, others).await?)
    };
    seed::settle(&url).await?;
    let db = connect(&url).await?;
    let doc = place_order_document()?;
    let admin = bench.token("admin", "bench")?;
    // Every member places at most PER_MEMBER WALLET orders (never WAIT_PAY): neither limit can
    // refuse, but they are raised all the same so that only the prepaid caps could.
    let env = [
        ("FITORDER_PLACE_RATE", "1000000".to_string()),
        ("FITORDER_MAX_OPEN_ORDERS", "1000000".to_string()),
    ];
    let server = bench.start_server_with(&url, "server-b13", &env).await?;
    for st in &stores {
        set_rules(&server.base, &admin, st).await?;
    }

    // The statements one placing costs in each kind of store: a second server whose pool talks
    // to PostgreSQL through the counting proxy, placings one after another, each by a member of
    // its own (after one that opens the pool's connection).
    say!("B13: counting SQL statements per placing (a server talking through a counting proxy) ...");
    let mut counted: Vec<Counts> = vec![];
    let mut texts: Vec<std::collections::BTreeSet<String>> = vec![];
    {
        let counter = SqlCounter::start(upstream_of(&url)?).await?;
        let proxied = bench
            .start_server_with(&via(&url, counter.port)?, "server-b13-count", &env)
            .await?;
        for st in &stores {
            let first = timed_members + hot_members + WARM;
            let reqs: Vec<Prepared> = (0..=n)
                .map(|i| {
                    placing(
                        bench,
                        &proxied.base,
                        &doc,
                        st,
                        st.packs[i % PACKS],
                        st.members[first + i],
                        &format!("b13-c-{}-{i}", st.preset),
                    )
                })
                .collect();
            sequential(&reqs[..1]).await?;
            counter.take_captured();
            let before = counter.counts();
            sequential(&reqs[1..]).await?;
            counted.push(counter.counts().since(&before));
            texts.push(counter.take_captured().into_iter().map(|c| c.sql).collect());
        }
    }
    // The statements (with parameters) one kind of store ran and the other did not.
    let only = |a: usize, b: usize| -> String {
        let d: Vec<String> = texts[a].difference(&texts[b]).map(|t| describe_sql(t)).collect();
        if d.is_empty() {
            "none".into()
        } else {
            d.join(", ")
        }
    };
    let (only_sh, only_none) = (only(1, 0), only(0, 1));
    let per = |c: &Counts| c.all() as f64 / n.max(1) as f64;
    say!(
        "B13: {:.1} statements per placing in the NONE store, {:.1} in the SHANGHAI_2025 store",
        per(&counted[0]),
        per(&counted[1])
    );

    // Warm-up of both stores (the pool's connections, their prepared statements).
    for st in &stores {
        let warm: Vec<Prepared> = (0..WARM)
            .map(|i| {
                placing(
                    bench,
                    &server.base,
                    &doc,
                    st,
                    st.packs[i % PACKS],
                    st.members[timed_members + hot_members + i],
                    &format!("b13-w-{}-{i}", st.preset),
                )
            })
            .collect();
        let o = load::run(Arc::new(warm), s.concurrency, Until::Exhausted, 200, true).await?;
        if o.failures() > 0 {
            bail!("the warm-up of {} failed: {}", st.preset, o.describe_failures());
        }
    }

    // The timed rounds: request j of the store's run is member j mod timed_members, so the
    // requests in flight at once (≤ connections, in order) are always of different members.
    let requests: Vec<Arc<Vec<Prepared>>> = tokio::task::block_in_place(|| {
        stores
            .iter()
            .map(|st| {
                Arc::new(
                    (0..timed)
                        .map(|j| {
                            placing(
                                bench,
                                &server.base,
                                &doc,
                                st,
                                st.packs[j % PACKS],
                                st.members[j % timed_members],
                                &format!("b13-t-{}-{j}", st.preset),
                            )
                        })
                        .collect(),
                )
            })
            .collect()
    });
    say!(
        "B13: placeOrder (WALLET, a 10-session pack) in the NONE and the SHANGHAI_2025 store in turn, {ROUNDS} × {per_round} each, {} connections ...",
        s.concurrency
    );
    let mut kinds = [Kind::default(), Kind::default()];
    let cpu_start = CpuSplit::sample(server.proc.pid());
    for r in 0..ROUNDS {
        for (k, reqs) in requests.iter().enumerate() {
            let slice = Arc::new(reqs[r * per_round..(r + 1) * per_round].to_vec());
            let c0 = CpuSplit::sample(server.proc.pid());
            let o = load::run(slice, s.concurrency, Until::Exhausted, 200, true).await?;
            let c1 = CpuSplit::sample(server.proc.pid());
            kinds[k].add(o, &c1.since(&c0));
        }
    }
    let cpu_all = CpuSplit::sample(server.proc.pid()).since(&cpu_start);
    let wall = kinds[0].out.elapsed + kinds[1].out.elapsed;

    // One more round in the NONE store, every placing the same pack (the members of their own).
    say!("B13: one round of {per_round} placings of a single pack in the NONE store ...");
    let hot: Vec<Prepared> = (0..per_round)
        .map(|j| {
            placing(
                bench,
                &server.base,
                &doc,
                &stores[0],
                stores[0].packs[0],
                stores[0].members[timed_members + j % hot_members],
                &format!("b13-p-{j}"),
            )
        })
        .collect();
    let mut hot_kind = Kind::default();
    let c0 = CpuSplit::sample(server.proc.pid());
    let o = load::run(Arc::new(hot), s.concurrency, Until::Exhausted, 200, true).await?;
    hot_kind.add(o, &CpuSplit::sample(server.proc.pid()).since(&c0));
    let hot_s = hot_kind.describe();
    say!("B13: one pack: {hot_s}");
    drop(server);
    let none_s = kinds[0].describe();
    let sh_s = kinds[1].describe();
    say!("B13: NONE {none_s}; SHANGHAI_2025 {sh_s}");

    // What the rounds left: every placing PAID, the Shanghai ones with their cooling-off row,
    // and no member over the caps.
    let mut placed = [0i64; 2];
    let mut cooling = [0i64; 2];
    for (k, st) in stores.iter().enumerate() {
        let row = db
            .query_one(
                "SELECT count(*) FILTER (WHERE o.status = 'PAID'),
                        count(p.order_id)
                   FROM orders o LEFT JOIN order_prepaid p ON p.order_id = o.id AND p.cooling_off_days = 7
                  WHERE o.store_id = $1 AND o.idempotency_key LIKE 'b13-t-%'",
                &[&st.id],
            )
            .await?;
        placed[k] = row.get(0);
        cooling[k] = row.get(1);
    }
    let most_held: i64 = db
        .query_one(
            "SELECT coalesce(max(held), 0)::bigint FROM (
                 SELECT m.id, m.balance_cents + m.frozen_cents
                        + coalesce(sum(o.amount_cents * (o.sessions_total - o.sessions_used) / o.sessions_total), 0) AS held
                   FROM members m JOIN stores s ON s.id = m.store_id AND s.code = 'BENCH-B13-SH'
                   LEFT JOIN orders o ON o.member_id = m.id AND o.status IN ('PAID', 'CONSUMING')
                  GROUP BY m.id) h",
            &[],
        )
        .await?
        .get(0);
    let refused = [timed as i64 - placed[0], timed as i64 - placed[1]];

    let ratio = kinds[1].out.rate() / kinds[0].out.rate();
    let mut r = Row::new(
        "B13",
        format!(
            "`placeOrder` in a SHANGHAI_2025 store vs a NONE store (prepaid caps checked under the member's lock), {} connections",
            s.concurrency
        ),
        "≥ 0.9 × the NONE store in the same run; no placing refused",
    );
    r.ours = format!("SHANGHAI_2025: {sh_s}; {:.1} statements per placing", per(&counted[1]));
    r.baseline = format!("NONE: {none_s}; {:.1} statements per placing", per(&counted[0]));
    r.ratio = Some(ratio);
    r.check(format!("ratio {ratio:.2} < 0.9"), ratio >= 0.9);
    r.check(
        format!(
            "refused or failed: NONE {} + {}, SHANGHAI_2025 {} + {}",
            refused[0],
            kinds[0].out.failures(),
            refused[1],
            kinds[1].out.failures()
        ),
        refused == [0, 0] && kinds[0].out.failures() == 0 && kinds[1].out.failures() == 0,
    );
    r.note(format!(
        "the `PlaceOrder` document of playground/operations/member.graphql, paymentMethod WALLET, one of {PACKS} \
         10-session class packs of ¥{} (prepaid money: a pack of more than one session), a member token per request; two stores, one \
         set to NONE and one to SHANGHAI_2025 with `setPrepaidRules` (admin token); {members} placing members in \
         each, every wallet topped up ¥{} by a TOP_UP ledger row, each with a used-up and a half-used pack already \
         (5 sessions, ¥50 held), and {others} other members with {HISTORY_PER_MEMBER} past orders each: {history} \
         orders in the tables before the first placing, then VACUUM ANALYZE (the machine's PostgreSQL runs without \
         autovacuum); request j of a store is member j mod {timed_members}, so the \
         ≤ {} requests in flight are of different members (the member's row lock serializes only one member's \
         placings) and no member places more than {PER_MEMBER} (≤ 55 unused sessions, ≤ ¥{} held: under the \
         SHANGHAI_2025 caps of 60 sessions and ¥20,000); FITORDER_PLACE_RATE and FITORDER_MAX_OPEN_ORDERS raised \
         to 1,000,000 (WALLET orders are paid at once, so neither would bite)",
        PACK_CENTS / 100,
        TOP_UP_CENTS / 100,
        s.concurrency,
        TOP_UP_CENTS / 100 + 50,
    ));
    r.note(format!(
        "{ROUNDS} rounds of {per_round} placings per store in turn (NONE, SHANGHAI_2025, …) on one server \
         (`serve --no-workers`), each a closed loop; a 200 without `errors` counts; rates are placings over the \
         store's own wall time; after the rounds: {} and {} orders PAID (of {timed} each), {} of the SHANGHAI_2025 \
         ones with their 7-day cooling-off row, {} of the NONE ones; the most a SHANGHAI_2025 member holds: ¥{:.2}. {}",
        placed[0],
        placed[1],
        cooling[1],
        cooling[0],
        most_held as f64 / 100.0,
        cpu_all.describe("fitorder server", wall)
    ));
    r.note(format!(
        "the same placings in the NONE store with every one buying the same pack (one round of {per_round}, members \
         of their own): {hot_s}{}. A pack without a stock takes no row lock (`reserve_item` \
         updates only a pack with a stock, and holds that row to the commit), so this round should go as fast as \
         the spread ones; the timed rounds spread over {PACKS} packs all the same",
        if hot_kind.out.failures() > 0 {
            format!(" ({})", hot_kind.out.describe_failures())
        } else {
            String::new()
        }
    ));
    r.note(format!(
        "statements per placing: every statement a second server instance sent to PostgreSQL over {n} sequential \
         placings, each by a member of its own, through the counting proxy (as B5): NONE → {}; SHANGHAI_2025 → {}; \
         statements with parameters only the SHANGHAI_2025 placings ran: {only_sh}; only the NONE ones: {only_none}",
        counted[0].per(n, "placing"),
        counted[1].per(n, "placing")
    ));
    for (k, st) in stores.iter().enumerate() {
        if kinds[k].out.failures() > 0 {
            r.note(format!("failures, {}: {}", st.preset, kinds[k].out.describe_failures()));
        }
    }
    Ok(r)
}

// ---------------------------------------------------------------------------------------------
// B13L: the prepaid ledger of a store with a million orders.

/// The ledger store's orders, numbered g = 0 … n−1 and placed evenly over the 90 days before
/// today (business time zone): member g mod m, so each member places every 90·m/n days; what
/// each order is follows from g alone. Orders are born WAIT_PAY and moved on through legal
/// transitions (the status trigger is never disabled); the order_transitions audit rows and
/// payments rows, which the ledger does not read, are left out.
///
/// - items (by (g·48271) mod 100): 50 % a 10-session class pack ¥999, 10 % a drop-in session
///   ¥150 (one session: a purchase, not prepaid money), 28 % a 30-day card ¥399, 12 % a 365-day
///   card ¥2,999;
/// - payment: each member's 4th order (g div m = 3) from the wallet, the rest 61 % WeChat Pay,
///   22 % Alipay, 17 % offline;
/// - wallets: every member topped up ¥3,000 an hour before their first order, one in four ¥500
///   more mid-period;
/// - refunds: one order in 29 (not in the last 3 days), whole, two days after payment, nothing
///   used (a wallet part back to the wallet);
/// - use: a quarter of the orders never used; of the rest, packs one session every 6 days (a
///   quarter) or 12 days, cards and drop-ins one check-in a day after payment; a pack whose last
///   session is used is CONSUMED, one with some CONSUMING, a card checked in CONSUMING.
fn ledger_seed_sql(n: i64, m: i64) -> String {
    let t0 = "(((now() AT TIME ZONE 'Asia/Shanghai')::date - 90)::timestamp AT TIME ZONE 'Asia/Shanghai')";
    format!(
        "INSERT INTO stores (name, code, operator_code) VALUES ('Bench ledger studio', 'BENCH-B13L', 'BENCH-B13L');
         INSERT INTO membership_plans (store_id, name, duration_days, price_cents)
              SELECT s.id, p.name, p.days, p.price FROM stores s,
                     (VALUES ('Monthly card', 30, 39900), ('Annual card', 365, 299900)) p(name, days, price)
               WHERE s.code = 'BENCH-B13L';
         INSERT INTO class_packs (store_id, name, sessions, price_cents, stock)
              SELECT s.id, p.name, p.sessions, p.price, NULL FROM stores s,
                     (VALUES ('AI strength · 10 sessions', 10, 99900), ('Drop-in session', 1, 15000)) p(name, sessions, price)
               WHERE s.code = 'BENCH-B13L';
         INSERT INTO members (store_id, name, phone)
              SELECT s.id, 'Ledger member ' || i, '137' || lpad(i::text, 8, '0')
                FROM generate_series(0, {m} - 1) i, stores s WHERE s.code = 'BENCH-B13L' ORDER BY i;
         CREATE TEMP TABLE b13_members AS
              SELECT (row_number() OVER (ORDER BY m.id) - 1)::bigint AS m, m.id
                FROM members m JOIN stores s ON s.id = m.store_id WHERE s.code = 'BENCH-B13L';
         CREATE TEMP TABLE b13_items AS
              SELECT 0 AS lo, 50 AS hi, 'CLASS_PACK' AS kind, NULL::bigint AS plan_id, c.id AS pack_id, c.name,
                     NULL::int AS days, c.sessions, c.price_cents AS price
                FROM class_packs c JOIN stores s ON s.id = c.store_id WHERE s.code = 'BENCH-B13L' AND c.sessions = 10
              UNION ALL
              SELECT 50, 60, 'CLASS_PACK', NULL, c.id, c.name, NULL, c.sessions, c.price_cents
                FROM class_packs c JOIN stores s ON s.id = c.store_id WHERE s.code = 'BENCH-B13L' AND c.sessions = 1
              UNION ALL
              SELECT 60, 88, 'MEMBERSHIP', p.id, NULL, p.name, p.duration_days, 0, p.price_cents
                FROM membership_plans p JOIN stores s ON s.id = p.store_id WHERE s.code = 'BENCH-B13L' AND p.duration_days = 30
              UNION ALL
              SELECT 88, 100, 'MEMBERSHIP', p.id, NULL, p.name, p.duration_days, 0, p.price_cents
                FROM membership_plans p JOIN stores s ON s.id = p.store_id WHERE s.code = 'BENCH-B13L' AND p.duration_days = 365;
         CREATE TEMP TABLE b13_orders AS
         SELECT x.g, 'FBL' || lpad(x.g::text, 10, '0') AS order_no, mm.id AS member_id, x.placed_at,
                x.placed_at + interval '1 minute' AS paid_at,
                i.kind, i.plan_id, i.pack_id, i.name, i.days, i.sessions, i.price,
                CASE WHEN x.k = 3 THEN 'WALLET'
                     WHEN x.p < 11 THEN 'WECHAT_PAY' WHEN x.p < 15 THEN 'ALIPAY' ELSE 'OFFLINE' END AS method,
                (x.g % 29 = 3 AND x.placed_at < now() - interval '3 days') AS refunded,
                CASE WHEN x.g % 29 = 3 OR x.g % 4 = 0 THEN 0
                     WHEN i.sessions <= 1 THEN CASE WHEN now() - x.placed_at > interval '2 days' THEN 1 ELSE 0 END
                     ELSE least(i.sessions, floor(extract(epoch FROM now() - x.placed_at - interval '1 hour')
                                                  / (CASE WHEN x.g % 4 = 1 THEN 6 ELSE 12 END * 86400))::int) END AS used,
                CASE WHEN x.g % 4 = 1 THEN interval '6 days' ELSE interval '12 days' END AS step
           FROM (SELECT g, g % {m} AS m, g / {m} AS k, (g * 48271) % 100 AS h, (g * 31) % 18 AS p,
                        {t0} + g * interval '90 days' / {n} AS placed_at
                   FROM generate_series(0::bigint, {n} - 1) g) x
           JOIN b13_members mm ON mm.m = x.m
           JOIN b13_items i ON x.h >= i.lo AND x.h < i.hi;
         INSERT INTO orders (order_no, member_id, store_id, kind, item_name, membership_plan_id, class_pack_id, plan_days,
                             amount_cents, wallet_amount_cents, payment_method, online_provider, sessions_total,
                             created_at, updated_at, trace_id, idempotency_key, request_hash)
         SELECT b.order_no, b.member_id, s.id, b.kind, b.name, b.plan_id, b.pack_id, b.days, b.price,
                CASE WHEN b.method = 'WALLET' THEN b.price ELSE 0 END, b.method,
                CASE WHEN b.method IN ('WECHAT_PAY', 'ALIPAY') THEN b.method END, b.sessions,
                b.placed_at, b.placed_at, 'bench-seed', 'b13l-' || b.g, 'bench'
           FROM b13_orders b, stores s WHERE s.code = 'BENCH-B13L' ORDER BY b.g;
         ALTER TABLE b13_orders ADD COLUMN order_id bigint;
         UPDATE b13_orders b SET order_id = o.id FROM orders o WHERE o.order_no = b.order_no;
         CREATE INDEX ON b13_orders (order_id);
         ANALYZE b13_orders;
         UPDATE orders o SET status = 'PAID', paid_at = b.paid_at, updated_at = b.paid_at,
                provider_txn_id = CASE WHEN b.method IN ('WECHAT_PAY', 'ALIPAY') THEN '42' || lpad(b.g::text, 26, '0') END
           FROM b13_orders b WHERE b.order_id = o.id;
         INSERT INTO memberships (member_id, store_id, plan_id, order_id, status, valid_from, valid_to, created_at)
         SELECT b.member_id, s.id, b.plan_id, b.order_id, 'ACTIVE',
                b.paid_at, b.paid_at + b.days * interval '1 day', b.paid_at
           FROM b13_orders b, stores s WHERE s.code = 'BENCH-B13L' AND b.kind = 'MEMBERSHIP' ORDER BY b.g;
         -- Cards are born ACTIVE (the status trigger); the refunded ones' are revoked after.
         UPDATE memberships m SET status = 'REVOKED', ended_at = b.paid_at + interval '2 days'
           FROM b13_orders b WHERE b.order_id = m.order_id AND b.kind = 'MEMBERSHIP' AND b.refunded;
         INSERT INTO wallet_ledger (member_id, kind, balance_delta, frozen_delta, reference, actor, trace_id, created_at)
         SELECT mm.id, 'TOP_UP', 300000, 0, 'b13l-top-up-1', 'member:' || mm.id, 'bench-seed',
                {t0} + mm.m * interval '90 days' / {n} - interval '1 hour'
           FROM b13_members mm ORDER BY mm.m;
         INSERT INTO wallet_ledger (member_id, kind, balance_delta, frozen_delta, reference, actor, trace_id, created_at)
         SELECT mm.id, 'TOP_UP', 50000, 0, 'b13l-top-up-2', 'member:' || mm.id, 'bench-seed',
                {t0} + (5 * {m} + mm.m) * interval '90 days' / {n} - interval '1 hour'
           FROM b13_members mm WHERE mm.m % 4 = 0 ORDER BY mm.m;
         INSERT INTO wallet_ledger (member_id, kind, balance_delta, frozen_delta, order_id, actor, trace_id, created_at)
         SELECT b.member_id, 'PAY', -b.price, 0, b.order_id, 'member:' || b.member_id, 'bench-seed', b.paid_at
           FROM b13_orders b WHERE b.method = 'WALLET' ORDER BY b.g;
         UPDATE orders o SET status = 'REFUNDED', refunded_at = b.paid_at + interval '2 days',
                refund_amount_cents = o.amount_cents, updated_at = b.paid_at + interval '2 days'
           FROM b13_orders b WHERE b.order_id = o.id AND b.refunded;
         INSERT INTO refunds (order_id, amount_cents, wallet_cents, online_cents, reason, actor, trace_id, created_at)
         SELECT b.order_id, b.price, CASE WHEN b.method = 'WALLET' THEN b.price ELSE 0 END,
                CASE WHEN b.method = 'WALLET' THEN 0 ELSE b.price END, 'changed their mind', 'admin:bench',
                'bench-seed', b.paid_at + interval '2 days'
           FROM b13_orders b WHERE b.refunded ORDER BY b.g;
         INSERT INTO wallet_ledger (member_id, kind, balance_delta, frozen_delta, order_id, actor, trace_id, created_at)
         SELECT b.member_id, 'REFUND', b.price, 0, b.order_id, 'admin:bench', 'bench-seed', b.paid_at + interval '2 days'
           FROM b13_orders b WHERE b.refunded AND b.method = 'WALLET' ORDER BY b.g;
         INSERT INTO check_ins (order_id, consume_txn_no, sessions, remaining_after, actor, trace_id, at)
         SELECT b.order_id, 'CI' || b.g || '-' || j, CASE WHEN b.kind = 'MEMBERSHIP' THEN 0 ELSE 1 END,
                CASE WHEN b.kind = 'MEMBERSHIP' THEN 0 ELSE b.sessions - j END, 'venue:bench', 'bench-seed',
                CASE WHEN b.sessions > 1 THEN b.paid_at + j * b.step - interval '1 hour' ELSE b.paid_at + interval '1 day' END
           FROM b13_orders b CROSS JOIN LATERAL generate_series(1, b.used) j
          WHERE b.used > 0 ORDER BY b.g, j;
         UPDATE orders o SET status = 'CONSUMING', sessions_used = CASE WHEN b.kind = 'MEMBERSHIP' THEN 0 ELSE b.used END,
                updated_at = b.paid_at + interval '1 day'
           FROM b13_orders b WHERE b.order_id = o.id AND b.used > 0;
         UPDATE orders o SET status = 'CONSUMED'
           FROM b13_orders b WHERE b.order_id = o.id AND b.kind = 'CLASS_PACK' AND b.used = b.sessions;
         DROP TABLE b13_orders, b13_items, b13_members;"
    )
}

const LEDGER_DOC: &str = "query B13Ledger($store: ID!, $from: Date!, $to: Date!) {
  prepaidLedger(storeId: $store, from: $from, to: $to) { date collectedCents earnedCents refundedCents balanceCents }
}";

fn ledger_request(server: &str, token: &str, store: i64, from: &str, to: &str) -> Prepared {
    graphql(
        server,
        token,
        &json!({"query": LEDGER_DOC, "variables": {"store": store.to_string(), "from": from, "to": to}}),
    )
}

/// One ledger request: its time and its rows (checked: one per date, no errors).
async fn ledger_once(req: &Prepared, days: usize) -> Result<(Duration, Vec<Value>)> {
    let t = Instant::now();
    let v = post(req).await?;
    let took = t.elapsed();
    let rows = v["data"]["prepaidLedger"].as_array().cloned().unwrap_or_default();
    if v.get("errors").is_some() || rows.len() != days {
        bail!(
            "prepaidLedger answered {}",
            v.to_string().chars().take(400).collect::<String>()
        );
    }
    Ok((took, rows))
}

/// `runs` requests one after another (after one that is not counted): their median, and the
/// first (cold) one's time.
async fn ledger_timed(
    req: &Prepared,
    days: usize,
    runs: usize,
) -> Result<(Duration, Duration, Vec<Duration>, Vec<Value>)> {
    let (first, rows) = ledger_once(req, days).await?;
    let mut times = vec![];
    for _ in 0..runs {
        let (t, again) = ledger_once(req, days).await?;
        if again != rows {
            bail!("prepaidLedger answered differently the second time");
        }
        times.push(t);
    }
    let mut sorted = times.clone();
    sorted.sort_unstable();
    Ok((sorted[sorted.len() / 2], first, times, rows))
}

fn secs(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.2} s", d.as_secs_f64())
    } else {
        format!("{:.0} ms", ms(d))
    }
}

fn quote(v: &Option<String>) -> String {
    match v {
        None => "NULL".into(),
        Some(s) => format!("'{}'", s.replace('\'', "''")),
    }
}

/// Runs a captured statement again, with the values it was bound with, under
/// `EXPLAIN (ANALYZE, BUFFERS)`; the plan's lines.
async fn explain(db: &Client, c: &Captured) -> Result<Vec<String>> {
    if let Some(why) = &c.undecoded {
        bail!("the binds of the captured statement could not be decoded: {why}");
    }
    let types: Option<Vec<&str>> = c.types.iter().copied().collect();
    let decl = match types {
        Some(t) if !t.is_empty() => format!("({})", t.join(", ")),
        _ => String::new(),
    };
    db.batch_execute("DEALLOCATE ALL").await?;
    db.batch_execute(&format!("PREPARE b13_explain {decl} AS {}", c.sql))
        .await
        .context("preparing the captured statement")?;
    let args: Vec<String> = c.values.iter().map(quote).collect();
    let rows = db
        .simple_query(&format!(
            "EXPLAIN (ANALYZE, BUFFERS) EXECUTE b13_explain({})",
            args.join(", ")
        ))
        .await?;
    db.batch_execute("DEALLOCATE b13_explain").await?;
    Ok(rows
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .collect())
}

/// The statement of `captured` that is the ledger's own (the longest text), explained; the full
/// plan written to `target/bench/<file>`; the lines for the report: the statement's first
/// words, the plan's top lines, planning, JIT and execution times.
async fn explain_ledger(db: &Client, captured: &[Captured], file: &str) -> Result<(String, Vec<String>)> {
    let Some(c) = captured.iter().max_by_key(|c| c.sql.len()) else {
        bail!("no statement with parameters was captured");
    };
    let plan = explain(db, c).await?;
    let dir = crate::env::target_dir().join("bench");
    std::fs::create_dir_all(&dir).ok();
    let path = dir.join(file);
    let mut text = format!(
        "-- binds: {}\n{}\n\n",
        c.values.iter().map(quote).collect::<Vec<_>>().join(", "),
        c.sql
    );
    text.push_str(&plan.join("\n"));
    text.push('\n');
    std::fs::write(&path, text)?;
    let top = plan_summary(&plan);
    let mut others: Vec<String> = captured
        .iter()
        .filter(|o| o.sql != c.sql)
        .map(|o| describe_sql(&o.sql))
        .collect();
    others.sort();
    others.dedup();
    let head = format!(
        "{} ({} characters, binds {}; plan in target/bench/{file}){}",
        describe_sql(&c.sql),
        c.sql.len(),
        c.values.iter().map(quote).collect::<Vec<_>>().join(", "),
        if others.is_empty() {
            String::new()
        } else {
            format!("; the request's other statements: {}", others.join(" | "))
        }
    );
    Ok((head, top))
}

/// `actual time=A..B rows=R loops=L` of a plan line: (B, R, L).
fn actual(line: &str) -> Option<(f64, u64, u64)> {
    let a = line.split("actual time=").nth(1)?;
    let end: f64 = a.split("..").nth(1)?.split_whitespace().next()?.parse().ok()?;
    let rows: u64 = a.split("rows=").nth(1)?.split_whitespace().next()?.parse().ok()?;
    let loops: u64 = a
        .split("loops=")
        .nth(1)?
        .trim_end_matches(')')
        .split_whitespace()
        .next()?
        .trim_end_matches(')')
        .parse()
        .ok()?;
    Some((end, rows, loops))
}

/// The plan's top: its root, each CTE with the time its producing node ran until and its rows
/// (a CTE's time includes the CTEs it reads first), and the planning, JIT and execution times.
fn plan_summary(plan: &[String]) -> Vec<String> {
    let mut out = vec![];
    if let Some(root) = plan.first() {
        out.push(root.trim().chars().take(160).collect());
    }
    for (i, l) in plan.iter().enumerate() {
        let t = l.trim();
        if let Some(name) = t.strip_prefix("CTE ") {
            if let Some((end, rows, loops)) = plan.get(i + 1).and_then(|n| actual(n)) {
                let node = plan[i + 1]
                    .trim()
                    .trim_start_matches("->")
                    .trim()
                    .split("  (")
                    .next()
                    .unwrap_or("")
                    .to_string();
                if end >= 1.0 {
                    out.push(format!(
                        "CTE {name} ({node}): {end:.0} ms, {rows} rows{}",
                        if loops > 1 {
                            format!(" × {loops}")
                        } else {
                            String::new()
                        }
                    ));
                }
            }
        }
    }
    out.extend(
        plan.iter()
            .map(|l| l.trim())
            .filter(|t| t.starts_with("Planning Time") || t.starts_with("Execution Time") || t.starts_with("Timing:"))
            .map(|t| format!("{}{t}", if t.starts_with("Timing:") { "JIT " } else { "" })),
    );
    out
}

/// A statement in a few words: its first comment line, or its verb and table.
fn describe_sql(sql: &str) -> String {
    let first = sql.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    if let Some(c) = first.strip_prefix("--") {
        return format!("«{}»", c.trim().chars().take(70).collect::<String>());
    }
    let words: Vec<&str> = sql.split_whitespace().collect();
    let verb = words.first().copied().unwrap_or("").to_ascii_uppercase();
    let after = |kw: &str| {
        words
            .iter()
            .position(|w| w.eq_ignore_ascii_case(kw))
            .and_then(|i| words.get(i + 1))
            .map(|t| t.trim_matches('"').split('"').next().unwrap_or("").to_string())
    };
    let table = match verb.as_str() {
        "INSERT" => after("INTO"),
        "UPDATE" => words.get(1).map(|t| t.trim_matches('"').to_string()),
        _ => after("FROM"),
    };
    match table {
        Some(t) => format!("{verb} {t}"),
        None => words.iter().take(4).copied().collect::<Vec<_>>().join(" "),
    }
}

fn plan_note(label: &str, head: &str, top: &[String]) -> String {
    format!(
        "{label}: the statement the server sent, captured by the counting proxy with its binds and run again by \
         the bench under `EXPLAIN (ANALYZE, BUFFERS)`: {head}. The plan: {}",
        top.join("; ")
    )
}

/// Waits for the `prepaid:close` run of a `fitorder worker` (its scheduler catches the day's
/// tick up at once on a database that never ran it); stops the worker. The run's status, its
/// duration and the days it closed.
async fn close_days(
    bench: &Bench,
    url: &str,
    db: &Client,
    env: &[(&str, &str)],
) -> Result<Option<(String, Duration, i64, String)>> {
    let mut cmd = bench.fitorder(url, &["worker"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let label = format!("worker-b13l-{}", env.len());
    let mut worker = Proc::spawn(&label, cmd, Some(bench.tmp.join(format!("{label}.log"))))?;
    let spawned = Instant::now();
    let deadline = spawned + Duration::from_secs(1800);
    let mut seen = false;
    loop {
        if let Some(st) = worker.exited() {
            bail!("fitorder worker exited ({st}):\n{}", worker.log_tail());
        }
        let row = db
            .query_opt(
                "SELECT status, extract(epoch FROM coalesce(finished_at, clock_timestamp()) - started_at)::float8,
                        rows_touched, coalesce(detail, '')
                   FROM task_runs WHERE task = 'prepaid:close' ORDER BY id DESC LIMIT 1",
                &[],
            )
            .await?;
        if let Some(r) = row {
            seen = true;
            let status: String = r.get(0);
            if status != "RUNNING" {
                let took = Duration::from_secs_f64(r.get::<_, f64>(1));
                return Ok(Some((status, took, r.get(2), r.get(3))));
            }
        } else if !seen && spawned.elapsed() > Duration::from_secs(90) {
            return Ok(None);
        }
        if Instant::now() > deadline {
            bail!("prepaid:close did not finish within 30 minutes:\n{}", worker.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn run_ledger(bench: &mut Bench, s: &Sizes) -> Result<Row> {
    let n = s.ledger_orders;
    let m = (n / 10).max(100);
    let url = bench.fresh_db("b13l").await?;
    let db = connect(&url).await?;
    say!("B13L: loading {n} orders over 90 days into one store ({m} members) ...");
    let started = Instant::now();
    seed::exec(&db, "B13L ledger store", &ledger_seed_sql(n, m)).await?;
    let load_secs = started.elapsed().as_secs_f64();
    // The three passes over every order (paid, used, consumed) left three dead versions of each
    // row: compacted, as autovacuum keeps a table that grew over months.
    seed::exec(&db, "B13L compaction", "VACUUM FULL orders").await?;
    seed::settle(&url).await?;
    let counts = db
        .query_one(
            "SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM check_ins), (SELECT count(*) FROM memberships),
                    (SELECT count(*) FROM refunds), (SELECT count(*) FROM wallet_ledger),
                    (SELECT string_agg(status || ' ' || c, ', ' ORDER BY status)
                       FROM (SELECT status, count(*) AS c FROM orders GROUP BY status) x),
                    pg_size_pretty(pg_table_size('orders')), pg_size_pretty(pg_table_size('check_ins'))",
            &[],
        )
        .await?;
    let (orders, check_ins, cards, refunds, moves): (i64, i64, i64, i64, i64) = (
        counts.get(0),
        counts.get(1),
        counts.get(2),
        counts.get(3),
        counts.get(4),
    );
    let statuses: String = counts.get(5);
    let (orders_size, check_ins_size): (String, String) = (counts.get(6), counts.get(7));
    say!(
        "B13L: loaded in {load_secs:.0} s: {orders} orders ({statuses}), {check_ins} check-ins, {cards} cards, {refunds} refunds, {moves} wallet moves"
    );
    let store: i64 = db
        .query_one("SELECT id FROM stores WHERE code = 'BENCH-B13L'", &[])
        .await?
        .get(0);
    let today: String = db
        .query_one("SELECT (now() AT TIME ZONE 'Asia/Shanghai')::date::text", &[])
        .await?
        .get(0);
    let dates = db
        .query_one(
            "SELECT ($1::text::date - 60)::text, ($1::text::date - 31)::text, ($1::text::date - 29)::text",
            &[&today],
        )
        .await?;
    let (from, to, recent): (String, String, String) = (dates.get(0), dates.get(1), dates.get(2));
    let days = 30;
    let runs = 5;
    let token = bench.token("admin", "bench")?;
    let server = bench.start_server(&url, "server-b13l").await?;
    let counter = SqlCounter::start(upstream_of(&url)?).await?;
    let proxied: Server = bench
        .start_server(&via(&url, counter.port)?, "server-b13l-count")
        .await?;

    // 1. No day closed yet: the server computes the range from every order.
    say!("B13L: prepaidLedger {from} … {to}, no day closed (computed from every order), {runs} runs ...");
    let mid = ledger_request(&server.base, &token, store, &from, &to);
    let (open_median, open_first, open_times, open_rows) = ledger_timed(&mid, days, runs.min(3)).await?;
    say!("B13L: median {} (first {})", secs(open_median), secs(open_first));
    counter.take_captured();
    ledger_once(&ledger_request(&proxied.base, &token, store, &from, &to), days).await?;
    let (open_head, open_top) = explain_ledger(&db, &counter.take_captured(), "B13L-computed.plan.txt").await?;
    say!("B13L: explained: {}", open_top.join(" / "));

    // 2. The nightly closing (prepaid:close) through yesterday.
    say!("B13L: closing the days through yesterday (fitorder worker, prepaid:close) ...");
    let mut close = close_days(bench, &url, &db, &[]).await?;
    // A closing that failed (a statement over FITORDER_STATEMENT_TIMEOUT, 60 s by default) is
    // said, and run again with a longer timeout, so that the closed days can be measured.
    let mut first_close = None;
    if close.as_ref().is_some_and(|c| c.0 != "SUCCEEDED") {
        say!(
            "B13L: prepaid:close failed: {}; again with FITORDER_STATEMENT_TIMEOUT=1800s ...",
            close.as_ref().map(|c| c.3.as_str()).unwrap_or("")
        );
        first_close = close.take();
        db.execute("DELETE FROM task_runs WHERE task = 'prepaid:close'", &[])
            .await?;
        close = close_days(bench, &url, &db, &[("FITORDER_STATEMENT_TIMEOUT", "1800s")]).await?;
    }
    let closed_days: i64 = db
        .query_one(
            "SELECT count(*) FROM prepaid_ledger_days WHERE store_id = $1",
            &[&store],
        )
        .await
        .map(|r| r.get(0))
        .unwrap_or(0);
    if let Some((status, took, rows, _)) = &close {
        say!(
            "B13L: prepaid:close {status} in {}, {rows} rows, {closed_days} days closed",
            secs(*took)
        );
    }
    seed::settle(&url).await?;

    // 3. The same range, closed; and the last 30 days through today (today computed).
    say!("B13L: the same range after the closing, and {recent} … {today}, {runs} runs each ...");
    let (closed_median, closed_first, closed_times, closed_rows) = ledger_timed(&mid, days, runs).await?;
    let last = ledger_request(&server.base, &token, store, &recent, &today);
    let (recent_median, recent_first, recent_times, _) = ledger_timed(&last, days, runs).await?;
    say!(
        "B13L: closed range median {}, through today median {}",
        secs(closed_median),
        secs(recent_median)
    );
    counter.take_captured();
    ledger_once(&ledger_request(&proxied.base, &token, store, &recent, &today), days).await?;
    let (recent_head, recent_top) = explain_ledger(&db, &counter.take_captured(), "B13L-since-closed.plan.txt").await?;
    // The CSV for finance, the same range.
    let t = Instant::now();
    let csv = reqwest::Client::new()
        .get(format!(
            "{}/reports/prepaid.csv?storeId={store}&from={from}&to={to}",
            server.base
        ))
        .bearer_auth(&token)
        .send()
        .await?;
    let csv_status = csv.status();
    let csv_len = csv.bytes().await?.len();
    let csv_took = t.elapsed();

    // 4. The range's own days opened again (their closed rows deleted), its eve still closed:
    // the 30 days computed from the eve's balance and the orders that change in them — what a
    // range costs when the closing has fallen behind, and the closing's own statement for 30 days.
    say!("B13L: {from} … {to} once more, its days not closed (after a closed eve), 3 runs ...");
    db.execute(
        "DELETE FROM prepaid_ledger_days WHERE store_id = $1 AND day >= $2::text::date",
        &[&store, &from],
    )
    .await?;
    let (since_median, since_first, since_times, since_rows) = ledger_timed(&mid, days, runs.min(3)).await?;
    say!("B13L: median {} (first {})", secs(since_median), secs(since_first));
    counter.take_captured();
    ledger_once(&ledger_request(&proxied.base, &token, store, &from, &to), days).await?;
    let (since_head, since_top) =
        explain_ledger(&db, &counter.take_captured(), "B13L-30-days-since-closed.plan.txt").await?;
    let hwm = server.proc.status_kb("VmHWM").unwrap_or(0);
    drop(proxied);
    drop(server);

    let limit = Duration::from_secs(1);
    let mut r = Row::new(
        "B13L",
        format!("`prepaidLedger` of a store with {orders} orders over 90 days, a 30-day range in the middle"),
        "≤ 1 s",
    );
    r.ours = format!(
        "after the closing: median {} (first {}); last 30 days through today: median {} (first {}); no day closed yet (computed from every order): median {} (first {}); the range's days not closed, its eve closed: median {} (first {})",
        secs(closed_median),
        secs(closed_first),
        secs(recent_median),
        secs(recent_first),
        secs(open_median),
        secs(open_first),
        secs(since_median),
        secs(since_first),
    );
    r.baseline = "—".into();
    r.check(
        format!("after closing {} > 1 s", secs(closed_median)),
        closed_median <= limit,
    );
    r.check(
        format!("through today {} > 1 s", secs(recent_median)),
        recent_median <= limit,
    );
    // A store whose days were never closed is the state a worker leaves within minutes of its
    // start (`prepaid:close` runs every ten minutes and catches up every open day, in the time
    // the note below gives): shown, not judged; the states a range meets the rest of the time
    // are the two above.
    r.note(format!(
        "before any closing (only until the first `prepaid:close` of a worker, at most ten minutes after it \
         starts, plus the closing's own time): median {}; not judged",
        secs(open_median)
    ));
    r.check(
        "the closed days answer as computed",
        closed_rows == open_rows && since_rows == open_rows && csv_status.is_success(),
    );
    r.note(format!(
        "one store's {orders} orders placed evenly over the 90 days before today (Asia/Shanghai), {m} members, loaded \
         with set-based SQL in {load_secs:.0} s (born WAIT_PAY, then PAID, REFUNDED, CONSUMING, CONSUMED through the \
         status trigger; `VACUUM FULL orders` after, then VACUUM ANALYZE): {statuses}; 50 % 10-session packs, 10 % \
         drop-in sessions (not prepaid), 28 % 30-day and 12 % 365-day cards ({cards} memberships rows); each \
         member's 4th order from the wallet, the rest WeChat Pay, Alipay, offline; {check_ins} check-ins (packs one \
         session every 6 or 12 days, a quarter never used), {refunds} whole refunds, {moves} wallet ledger rows (a \
         ¥3,000 top-up per member, ¥500 more for a quarter); orders {orders_size}, check_ins {check_ins_size}"
    ));
    r.note(format!(
        "the range {from} … {to} (days 31–60 of 90) by GraphQL over HTTP with an admin token, one request at a time, \
         {runs} timed after one untimed (3 when computed from every order); a 200 with 30 rows and no `errors` \
         counts; times: computed {:?}, closed {:?}, through today {:?}, the range's days not closed {:?} (ms); \
         `GET /reports/prepaid.csv` of the closed range: HTTP {csv_status}, {csv_len} bytes in {}; server VmHWM \
         {:.0} MB",
        open_times.iter().map(|t| ms(*t).round()).collect::<Vec<_>>(),
        closed_times.iter().map(|t| ms(*t).round()).collect::<Vec<_>>(),
        recent_times.iter().map(|t| ms(*t).round()).collect::<Vec<_>>(),
        since_times.iter().map(|t| ms(*t).round()).collect::<Vec<_>>(),
        secs(csv_took),
        hwm as f64 / 1024.0
    ));
    if let Some((status, took, rows, detail)) = &first_close {
        r.check("the nightly closing succeeds with the default statement timeout", false);
        r.note(format!(
            "the first closing, with the defaults: {status} after {}, {rows} rows touched ({detail}); the days it \
             closed before failing stay closed",
            secs(*took)
        ));
    }
    r.note(match &close {
        Some((status, took, rows, detail)) => {
            format!(
            "the closing: a `fitorder worker` started on the database{} ran `prepaid:close` (at its start, as every ten \
             minutes): {status} in {}, {rows} rows touched{}; {closed_days} days of the store closed; then the range \
             reads them, and the last 30 days compute only today, after the last closed day",
            if first_close.is_some() { " with FITORDER_STATEMENT_TIMEOUT=1800s" } else { "" },
            secs(*took),
            if detail.is_empty() { String::new() } else { format!(" ({detail})") }
        )
        }
        None => "the closing: a `fitorder worker` ran no `prepaid:close` within 90 s; the \"closed\" figures are of \
                 the same computation"
            .into(),
    });
    r.note(plan_note("no day closed", &open_head, &open_top));
    r.note(plan_note("through today, after the closing", &recent_head, &recent_top));
    r.note(plan_note(
        "the range's days not closed, after its closed eve",
        &since_head,
        &since_top,
    ));
    Ok(r)
}
