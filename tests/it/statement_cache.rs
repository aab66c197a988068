//! The statement cache: fitorder's hand-written SQL (`db::sql::StaticQuery`) and its diesel DSL
//! statements are prepared once per connection and then only bound and executed; `sql_query`
//! is prepared anew on every call. Counted on the wire by the bench's PostgreSQL proxy.

use axum::http::StatusCode;
use diesel_async::RunQueryDsl;
use serde_json::json;

use crate::harness::*;
use crate::sqlcount::{upstream_of, via, Counts, SqlCounter};

#[tokio::test]
async fn a_static_query_is_parsed_once_per_connection_and_sql_query_every_time() {
    use fitorder::db::sql::StaticQuery;
    let app = TestApp::new().await;
    let counter = SqlCounter::start(upstream_of(&app.db_url).unwrap()).await.unwrap();
    let pool = fitorder::db::pool(&via(&app.db_url, counter.port).unwrap(), 1).unwrap();
    let mut conn = pool.get().await.unwrap();
    #[derive(diesel::QueryableByName)]
    struct V {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        v: i32,
    }
    for i in 0..3 {
        let dynamic: V = diesel::sql_query("SELECT $1 + 100 AS v /* uncached */")
            .bind::<diesel::sql_types::Integer, _>(i)
            .get_result(&mut conn)
            .await
            .unwrap();
        assert_eq!(dynamic.v, i + 100);
        let fixed: V = StaticQuery::new("SELECT $1 + 200 AS v /* cached */")
            .bind::<diesel::sql_types::Integer, _>(i)
            .get_result(&mut conn)
            .await
            .unwrap();
        assert_eq!(fixed.v, i + 200);
    }
    assert_eq!(
        counter.parses_of("/* uncached */"),
        3,
        "sql_query is prepared on every call"
    );
    assert_eq!(counter.parses_of("/* cached */"), 1, "a StaticQuery is prepared once");
    // Kept prepared on the connection (an uncached statement is closed after its call).
    #[derive(diesel::QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let kept: N = diesel::sql_query(
        "SELECT count(*) FILTER (WHERE statement LIKE '%/* cach' || 'ed */%') AS n FROM pg_prepared_statements",
    )
    .get_result(&mut conn)
    .await
    .unwrap();
    assert_eq!(kept.n, 1);
}

#[tokio::test]
async fn the_payment_callbacks_statements_are_prepared_once_per_connection() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 3).await;
    let mut orders = vec![];
    for _ in 0..8 {
        orders.push(
            app.buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WECHAT_PAY")
                .await,
        );
    }
    let counter = SqlCounter::start(upstream_of(&app.db_url).unwrap()).await.unwrap();
    let pool_size = 2;
    let counted = TestApp::on_database(&via(&app.db_url, counter.port).unwrap(), |c| {
        c.db_pool_size = pool_size;
    })
    .await;
    // Counted apart after the first (which prepares): first deliveries and the provider's
    // retries, each recorded as a duplicate in one statement.
    let (mut first, mut retried) = (Counts::default(), Counts::default());
    for (i, no) in orders.iter().enumerate() {
        let txn = format!("42000000000000000000000{:05}", 90_000 + i);
        let before = counter.counts();
        assert_eq!(counted.wechat_paid(no, &txn, 10_000).await, StatusCode::NO_CONTENT);
        let between = counter.counts();
        assert_eq!(counted.wechat_paid(no, &txn, 10_000).await, StatusCode::NO_CONTENT);
        if i > 0 {
            first = add(first, between.since(&before));
            retried = add(retried, counter.counts().since(&between));
        }
    }
    let n = orders.len() - 1;
    eprintln!("first deliveries: {}", first.per(n, "payment"));
    eprintln!("retries: {}", retried.per(n, "duplicate"));
    // A first delivery of a class pack: BEGIN, the evidence with the key's claim and the
    // order's lock, the payment (transition, audit, payment row, grants, the callback's
    // outcome), COMMIT, then its announcements (after the commit, so that the commit does not
    // hold PostgreSQL's notify lock through its WAL flush); each one round trip, none parsed
    // anew.
    assert_eq!(
        (
            first.statements,
            first.transaction_control,
            first.round_trips,
            first.parses
        ),
        (3 * n as u64, 2 * n as u64, 5 * n as u64, 0),
        "a first delivery: {}",
        first.per(n, "payment")
    );
    assert_eq!(
        (retried.statements, retried.round_trips, retried.parses),
        (n as u64, n as u64, 0),
        "a duplicate is one prepared statement in one round trip: {}",
        retried.per(n, "duplicate")
    );
    for no in &orders {
        assert_eq!(app.order(no).await["status"], "PAID");
    }
    // Per connection at most once: the main pool's, and the evidence pool's four.
    let evidence_pool = 4;
    for (what, needle, connections) in [
        ("the payment (orders/pay.sql)", "WITH moved AS (", pool_size),
        ("a retry's record", "WITH seen AS (", evidence_pool),
        (
            "the evidence with the key claim and the order's lock",
            "WITH o AS (",
            pool_size,
        ),
    ] {
        let parsed = counter.parses_of(needle);
        assert!(
            (1..=connections as u64).contains(&parsed),
            "{what} ({needle}) was parsed {parsed} times for {} payments on at most {connections} connections",
            orders.len()
        );
    }
    // Nothing else on the way is prepared per call either.
    let per_call: Vec<(String, u64)> = counter
        .parsed()
        .into_iter()
        .filter(|(_, n)| *n > evidence_pool as u64)
        .collect();
    assert!(per_call.is_empty(), "prepared on every call: {per_call:#?}");
    drop(counted);
}

fn add(a: Counts, b: Counts) -> Counts {
    Counts {
        statements: a.statements + b.statements,
        transaction_control: a.transaction_control + b.transaction_control,
        pings: a.pings + b.pings,
        round_trips: a.round_trips + b.round_trips,
        parses: a.parses + b.parses,
    }
}
