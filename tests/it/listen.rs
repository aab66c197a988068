//! The LISTEN loop only wakes and forwards: loading the rows that notifications name is a task
//! of its own, behind a bounded queue. A burst of row notifications, or a pool with no
//! connection to spare, delays subscribers, never an outbox or expiry wake-up.

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use fitorder::events::{Event, EventHub, EVENTS_CHANNEL, EXPIRY_CHANNEL, LOAD_QUEUE, OUTBOX_CHANNEL};
use serde_json::json;

use crate::harness::*;

#[tokio::test]
async fn a_burst_of_notifications_behind_an_exhausted_pool_delays_no_wake_up() {
    let app = TestApp::new().await;
    // This "instance": a pool of one connection, its own LISTEN connection.
    let pool = fitorder::db::pool(&app.db_url, 1).unwrap();
    let hub = EventHub::start(app.db_url.clone(), pool.clone());
    // Connected: the hub wakes the workers once when it (re)connects.
    let mut woken = Box::pin(hub.outbox.notified());
    woken.as_mut().enable();
    tokio::time::timeout(Duration::from_secs(10), &mut woken)
        .await
        .expect("the LISTEN connection is up");
    let mut subscriber = hub.subscribe();

    // Every connection of the pool is held: no row can be loaded (a checkout waits its 5 s).
    let held = pool.get().await.unwrap();
    let mut other = AsyncPgConnection::establish(&app.db_url).await.unwrap();
    // More row notifications than the loader queues, then the wake-ups.
    let burst = LOAD_QUEUE + 1_000;
    diesel::sql_query(format!(
        "SELECT count(pg_notify('{EVENTS_CHANNEL}', 'comp:' || g)) FROM generate_series(1, {burst}) g"
    ))
    .execute(&mut other)
    .await
    .unwrap();
    let outbox = hub.outbox.notified();
    let expiry = hub.expiry.notified();
    tokio::pin!(outbox, expiry);
    outbox.as_mut().enable();
    expiry.as_mut().enable();
    let sent = tokio::time::Instant::now();
    diesel::sql_query(format!(
        "SELECT pg_notify('{OUTBOX_CHANNEL}', ''), pg_notify('{EXPIRY_CHANNEL}', '')"
    ))
    .execute(&mut other)
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(3), async {
        outbox.await;
        expiry.await;
    })
    .await
    .expect("the wake-ups arrive while the pool is exhausted and thousands of rows wait");
    assert!(sent.elapsed() < Duration::from_secs(3));

    // The pool frees up: the loader catches up (the rows named do not exist: no events), and
    // a real change reaches the subscriber.
    drop(held);
    let s = app.studio(50_000, Some(3), 3).await;
    let placed = app
        .place(
            &s.member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack},
                   "paymentMethod": "WALLET"}),
        )
        .await;
    let no = placed["order"]["orderNo"].as_str().unwrap().to_string();
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match subscriber.recv().await {
                Ok(Event::Order(change)) if change.order_no == no => return,
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await
    .expect("the placed order's change reaches the subscriber");
}
