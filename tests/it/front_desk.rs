//! The front desk's everyday (issue 39, contract "The front desk and the console's everyday"):
//! a coach's session canceled with everything booked on it (`cancelCoachSlot`), across a
//! `fitorder serve` killed -9 in the middle; the day's takings (`salesReport`) against the
//! providers' bills as the independent stand-in writes them and reconciliation reads them.

use std::collections::BTreeMap;
use std::time::Duration;

use diesel_async::RunQueryDsl;
use fitorder::auth::{issue_token, Role};
use fitorder::domain::{Provider, ReconciliationStatus};
use fitorder::trace::TraceId;
use secrecy::ExposeSecret;
use serde_json::{json, Value};

use crate::harness::*;
use crate::standin::{StandIn, StandInMode, Trade};
use crate::ws::WsClient;

const CANCEL_SLOT: &str = "mutation CancelCoachSlot($id: ID!, $reason: String!) {
  cancelCoachSlot(id: $id, reason: $reason) {
    slot { id canceledAt cancelReason remaining }
    orders { orderNo status refundAmountCents member { id } }
  }
}";

const SALES: &str = "query SalesReport($storeId: ID!, $from: Date!, $to: Date!) {
  salesReport(storeId: $storeId, from: $from, to: $to) { date method ordersPaid takenCents refundedCents netCents }
}";

const REASON: &str = "Coach Liu is ill";

fn statuses(r: &Value) -> BTreeMap<String, (String, Value)> {
    r["cancelCoachSlot"]["orders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["orderNo"].as_str().unwrap().to_string(),
                (
                    o["status"].as_str().unwrap().to_string(),
                    o["refundAmountCents"].clone(),
                ),
            )
        })
        .collect()
}

fn reason(r: &Value) -> &str {
    r["errors"][0]["extensions"]["reason"].as_str().unwrap_or_default()
}

async fn wait_until(what: &str, within: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !done().await {
        assert!(std::time::Instant::now() < deadline, "{what} never happened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every kind of booking on one session: each ends as the contract says, once, the members
/// hear of it, and asking again answers the same and changes nothing.
#[tokio::test]
async fn canceling_a_coach_slot_settles_every_booking_through_the_state_machine_once() {
    let app = TestApp::served().await;
    let s = app.studio(100_000, None, 10).await;
    let slot = json!({"coachSlotId": s.slot});
    // Paid from the wallet.
    let wallet = app.buy(&s.member, &s.store, slot.clone(), "WALLET").await;
    // Paid at WeChat Pay.
    let wechat_member = app.new_member(&s.store, 0).await;
    let wechat = app.buy(&wechat_member, &s.store, slot.clone(), "WECHAT_PAY").await;
    app.sandbox.pay("WECHAT_PAY", &wechat).await.unwrap();
    // Waiting: MIXED, its wallet part frozen, its trade open at WeChat Pay.
    let mixed_member = app.new_member(&s.store, 50_000).await;
    let mixed = app
        .place(
            &mixed_member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": slot, "paymentMethod": "MIXED",
                   "walletAmountCents": 10_000}),
        )
        .await["order"]["orderNo"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(app.member_view(&mixed_member).await["wallet"]["frozenCents"], 10_000);
    // Waiting at Alipay; the member pays while the trade is being closed.
    let alipay_member = app.new_member(&s.store, 0).await;
    let alipay = app.buy(&alipay_member, &s.store, slot.clone(), "ALIPAY").await;
    app.sandbox.set_state("ALIPAY", &alipay, "WAIT_BUYER_PAY");
    app.sandbox.pay_during_close("ALIPAY", &alipay, false);
    // Used already.
    let used_member = app.new_member(&s.store, 50_000).await;
    let used = app.buy(&used_member, &s.store, slot.clone(), "WALLET").await;
    app.admin(
        CHECK_IN,
        json!({"input": {"orderNo": used, "consumeTxnNo": "gate-used"}}),
    )
    .await;
    assert_eq!(app.order(&used).await["status"], "CONSUMED");

    // Two booked members listen to their orders.
    let addr = crate::fakes::serve(app.router.clone()).await;
    let mut listeners = vec![];
    for (member, no) in [(&s.member, &wallet), (&mixed_member, &mixed)] {
        let mut ws = WsClient::connect(&addr, Some(&app.member_token(member)), false)
            .await
            .unwrap();
        ws.subscribe("m", MEMBER_OPS, Some("MyOrderStatus"), json!({"orderNo": no}))
            .await;
        listeners.push(ws);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let first = app.admin(CANCEL_SLOT, json!({"id": s.slot, "reason": REASON})).await;
    let got = statuses(&first);
    let want: BTreeMap<String, (String, Value)> = [
        (&wallet, "REFUNDED", json!(30_000)),
        (&wechat, "REFUNDED", json!(30_000)),
        (&mixed, "CANCELED", Value::Null),
        (&alipay, "REFUNDED", json!(30_000)),
        (&used, "CONSUMED", Value::Null),
    ]
    .into_iter()
    .map(|(no, st, r)| (no.clone(), (st.to_string(), r)))
    .collect();
    assert_eq!(got, want, "{first:#}");
    let slot_now = &first["cancelCoachSlot"]["slot"];
    assert_eq!(slot_now["cancelReason"], REASON);
    assert!(slot_now["canceledAt"].is_string(), "{slot_now}");

    // The money: the wallet's back at once, the frozen part unfrozen, the online parts refunded
    // through the outbox, the MIXED trade closed at WeChat Pay.
    let balance = |m: Value| m["wallet"].clone();
    assert_eq!(
        balance(app.member_view(&s.member).await),
        json!({"balanceCents": 100_000, "frozenCents": 0})
    );
    assert_eq!(
        balance(app.member_view(&mixed_member).await),
        json!({"balanceCents": 50_000, "frozenCents": 0})
    );
    assert_eq!(app.sandbox.trade("WECHAT_PAY", &mixed).unwrap().state, "CLOSED");
    let refunds_of = |no: &str| {
        format!(
            "SELECT count(*) AS v FROM compensation_events e JOIN orders o ON o.id = e.order_id
              WHERE o.order_no = '{no}' AND e.kind = 'PROVIDER_REFUND'"
        )
    };
    for (no, n) in [(&wechat, 1), (&alipay, 1), (&wallet, 0), (&mixed, 0), (&used, 0)] {
        assert_eq!(app.sql_i64(&refunds_of(no)).await, n, "{no}");
    }
    // The audit: each change by the admin who asked, with the reason, under one trace.
    let o = app.order(&alipay).await;
    let last = o["timeline"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (&last["actor"], &last["toStatus"]),
        (&json!("admin:staff-1"), &json!("REFUNDED")),
        "{o:#}"
    );
    assert_eq!(
        app.sql_i64(
            "SELECT count(DISTINCT t.trace_id) AS v FROM order_transitions t JOIN coach_slots s ON s.cancel_trace_id = t.trace_id
              WHERE t.reason = 'Coach Liu is ill' AND t.actor = 'admin:staff-1'"
        )
        .await,
        1
    );
    // The members heard of it.
    for (ws, to) in listeners.iter_mut().zip(["REFUNDED", "CANCELED"]) {
        let p = ws.next_payload(10).await.expect("the booked member hears of it");
        assert_eq!(p["data"]["orderStatusChanged"]["toStatus"], to, "{p}");
    }

    // Asked again (another reason): the same answer, nothing changed.
    let changes = || {
        app.sql_i64(
            "SELECT (SELECT count(*) FROM order_transitions) + (SELECT count(*) FROM refunds)
                  + (SELECT count(*) FROM compensation_events) + (SELECT count(*) FROM wallet_ledger) AS v",
        )
    };
    let before = changes().await;
    let again = app.admin(CANCEL_SLOT, json!({"id": s.slot, "reason": "again"})).await;
    assert_eq!(again, first);
    assert_eq!(changes().await, before);

    // No longer offered, no longer orderable.
    let catalog = app
        .ok(
            &app.member_token(&s.member),
            "query($s: ID!) { catalog(storeId: $s) { coachSlots { id } } }",
            json!({"s": s.store}),
        )
        .await;
    assert_eq!(catalog["catalog"]["coachSlots"], json!([]), "{catalog}");
    let r = app
        .gql_named(
            Some(&app.member_token(&s.member)),
            MEMBER_OPS,
            Some("PlaceOrder"),
            json!({"input": {"idempotencyKey": key(), "storeId": s.store, "item": {"coachSlotId": s.slot},
                             "paymentMethod": "WALLET"}}),
        )
        .await;
    assert_eq!(
        (error_code(&r).as_str(), reason(&r)),
        ("BAD_USER_INPUT", "SLOT_CANCELED"),
        "{r}"
    );
}

/// A payment arriving after the cancel is a paid-after-cancel; a session that has started, a
/// reason left out and the wrong callers are refused.
#[tokio::test]
async fn a_late_payment_is_paid_after_cancel_and_a_started_slot_or_a_stranger_is_refused() {
    let app = TestApp::served().await;
    let s = app.studio(0, None, 3).await;
    let no = app
        .buy(&s.member, &s.store, json!({"coachSlotId": s.slot}), "WECHAT_PAY")
        .await;
    let cancel = |id: &str, reason: &str| json!({"id": id, "reason": reason});

    // The wrong callers.
    let other = app.studio(0, None, 1).await;
    let limited = issue_token(
        app.state.config.jwt_secret.expose_secret(),
        Role::Admin,
        "staff-9",
        Some(vec![other.store.clone()]),
        Duration::from_secs(60),
    );
    for (token, code) in [
        (app.ops_token(), "FORBIDDEN"),
        (app.member_token(&s.member), "FORBIDDEN"),
        (limited.clone(), "NOT_FOUND"),
    ] {
        let r = app.gql(Some(&token), CANCEL_SLOT, cancel(&s.slot, REASON)).await;
        assert_eq!(error_code(&r), code, "{r}");
    }
    let r = app
        .gql(Some(&app.admin_token()), CANCEL_SLOT, cancel(&s.slot, "  "))
        .await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT", "{r}");
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM coach_slots WHERE canceled_at IS NOT NULL")
            .await,
        0
    );
    // A store-limited admin cancels their own store's sessions.
    let r = app.ok(&limited, CANCEL_SLOT, cancel(&other.slot, REASON)).await;
    assert!(r["cancelCoachSlot"]["slot"]["canceledAt"].is_string(), "{r}");

    // WeChat Pay does not answer the close: the order is canceled all the same (its trade ends
    // at its deadline), and the payment that still arrives is a paid-after-cancel.
    app.sandbox.fail_with(Some(500));
    let r = app.admin(CANCEL_SLOT, cancel(&s.slot, REASON)).await;
    app.sandbox.fail_with(None);
    assert_eq!(r["cancelCoachSlot"]["orders"][0]["status"], "CANCELED", "{r}");
    app.sandbox.pay("WECHAT_PAY", &no).await.unwrap();
    let o = app.order(&no).await;
    assert_eq!(o["status"], "CANCELED", "{o:#}");
    let kinds: Vec<&str> = o["tickets"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["PAID_AFTER_CANCEL"], "{o:#}");
    assert!(
        o["compensation"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "PROVIDER_REFUND"),
        "the money goes back: {o:#}"
    );

    // A session that has started.
    let started = app
        .admin(
            "mutation($i: CreateCoachSlotInput!) { createCoachSlot(input: $i) { id } }",
            json!({"i": {"storeId": s.store, "coachName": "Coach Wang", "startsAt": (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339(),
                         "endsAt": (chrono::Utc::now() + chrono::Duration::hours(2)).to_rfc3339(), "capacity": 2, "priceCents": 10000}}),
        )
        .await["createCoachSlot"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    app.sql_i64(&format!(
        "WITH u AS (UPDATE coach_slots SET starts_at = now() - interval '5 minutes' WHERE id = {started} RETURNING 1)
         SELECT count(*) AS v FROM u"
    ))
    .await;
    let r = app
        .gql(Some(&app.admin_token()), CANCEL_SLOT, cancel(&started, REASON))
        .await;
    assert_eq!(
        (error_code(&r).as_str(), reason(&r)),
        ("BAD_USER_INPUT", "SLOT_STARTED"),
        "{r}"
    );
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT count(*) AS v FROM coach_slots WHERE id = {started} AND canceled_at IS NULL"
        ))
        .await,
        1
    );
}

/// Bookings settled one transaction each: `fitorder serve` killed -9 while it is settling a
/// slot with many bookings leaves the durable mark (the slot takes no booking, some orders
/// settled, the rest open); a restarted process resumes it, and every order ends canceled or
/// refunded exactly once, the refunds in the outbox once each.
#[tokio::test]
async fn a_cancel_killed_midway_is_resumed_after_a_restart_and_settles_each_booking_once() {
    const WALLET: usize = 30;
    const WECHAT: usize = 15;
    const MIXED: usize = 15;
    let app = TestApp::served().await;
    // The restarted processes deliver the access effects to a closed port: they may end DEAD.
    app.expect_dead();
    let s = app.studio(0, None, (WALLET + WECHAT + MIXED) as i32).await;
    let slot = json!({"coachSlotId": s.slot});
    let mut bookings = vec![];
    // Every fourth MIXED and waiting, the others paid: from the wallet, or at WeChat Pay.
    for kind in ["WALLET", "WECHAT_PAY", "WALLET", "MIXED"]
        .into_iter()
        .cycle()
        .take(WALLET + WECHAT + MIXED)
    {
        let member = app.new_member(&s.store, 40_000).await;
        let no = match kind {
            "MIXED" => app
                .place(
                    &member,
                    json!({"idempotencyKey": key(), "storeId": s.store, "item": slot, "paymentMethod": "MIXED",
                           "walletAmountCents": 5_000}),
                )
                .await["order"]["orderNo"]
                .as_str()
                .unwrap()
                .to_string(),
            k => app.buy(&member, &s.store, slot.clone(), k).await,
        };
        if kind == "WECHAT_PAY" {
            app.sandbox.pay("WECHAT_PAY", &no).await.unwrap();
        }
        bookings.push((no, kind, member));
    }
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM orders WHERE status = 'PAID'")
            .await,
        (WALLET + WECHAT) as i64
    );

    // The booking in the middle is held by another transaction: the settling stops there.
    let middle = (WALLET + WECHAT + MIXED) / 2;
    let held: i64 = app
        .sql_i64(&format!(
            "SELECT id AS v FROM orders WHERE coach_slot_id = {} ORDER BY id OFFSET {middle} LIMIT 1",
            s.slot
        ))
        .await;
    let mut holder = app.conn().await;
    diesel::sql_query("BEGIN").execute(&mut holder).await.unwrap();
    diesel::sql_query(format!("SELECT id FROM orders WHERE id = {held} FOR UPDATE"))
        .execute(&mut holder)
        .await
        .unwrap();

    let secret = app.state.config.jwt_secret.expose_secret().to_string();
    let process = |role: &str| {
        let f = if role == "serve" {
            Fitorder::serve()
        } else {
            Fitorder::new(&[role])
        };
        f.env("DATABASE_URL", &app.db_url)
            .env("FITORDER_JWT_SECRET", &secret)
            .env("FITORDER_SCAN_INTERVAL", "1s")
            .env("FITORDER_DOOR_ACCESS_URL", "http://127.0.0.1:9/door")
            .env("FITORDER_AI_ACCESS_URL", "http://127.0.0.1:9/ai")
            .spawn()
    };
    let server = process("serve");
    let http = reqwest::Client::new();
    assert!(server.ready(&http, Duration::from_secs(60)).await, "{}", server.log());
    let url = format!("{}/graphql", server.base());
    let token = app.admin_token();
    let asked = tokio::spawn({
        let (http, url, slot) = (http.clone(), url.clone(), s.slot.clone());
        async move {
            http.post(url)
                .bearer_auth(token)
                .json(&json!({"query": CANCEL_SLOT, "variables": {"id": slot, "reason": REASON}}))
                .send()
                .await
        }
    });
    let settled = format!(
        "SELECT count(*) AS v FROM orders WHERE coach_slot_id = {} AND status IN ('CANCELED', 'REFUNDED')",
        s.slot
    );
    wait_until(
        "the settling reached the held booking",
        Duration::from_secs(60),
        async || app.sql_i64(&settled).await == middle as i64,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(server); // SIGKILL, mid-way
    assert!(asked.await.unwrap().is_err(), "the request died with the server");
    diesel::sql_query("ROLLBACK").execute(&mut holder).await.unwrap();
    drop(holder);

    // Half done, durably marked: not offered, not orderable, not settled.
    assert_eq!(app.sql_i64(&settled).await, middle as i64);
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT count(*) AS v FROM coach_slots WHERE id = {} AND canceled_at IS NOT NULL AND cancel_settled_at IS NULL",
            s.slot
        ))
        .await,
        1
    );
    let late = app.new_member(&s.store, 40_000).await;
    let r = app
        .gql_named(
            Some(&app.member_token(&late)),
            MEMBER_OPS,
            Some("PlaceOrder"),
            json!({"input": {"idempotencyKey": key(), "storeId": s.store, "item": slot, "paymentMethod": "WALLET"}}),
        )
        .await;
    assert_eq!(reason(&r), "SLOT_CANCELED", "{r}");

    // A paid booking not settled yet cannot be checked in to meanwhile.
    let (open, _, _) = bookings.iter().rev().find(|(_, kind, _)| *kind == "WALLET").unwrap();
    let r = app
        .gql(
            Some(&app.admin_token()),
            CHECK_IN,
            json!({"input": {"orderNo": open, "consumeTxnNo": "gate-late"}}),
        )
        .await;
    assert_eq!(
        (error_code(&r).as_str(), reason(&r)),
        ("BAD_USER_INPUT", "SLOT_CANCELED"),
        "{r}"
    );

    // Restarted: the scheduler's `coach_slot:cancel` finishes it.
    let mut worker = process("worker");
    wait_until(
        "the restarted worker settled the slot",
        Duration::from_secs(90),
        async || {
            assert!(worker.alive(), "the worker ended: {}", worker.log());
            app.sql_i64(&format!(
                "SELECT count(*) AS v FROM coach_slots WHERE id = {} AND cancel_settled_at IS NOT NULL",
                s.slot
            ))
            .await
                == 1
        },
    )
    .await;
    assert!(
        worker.log().contains("resuming the cancel of a coach slot"),
        "{}",
        worker.log()
    );
    drop(worker);

    // Every booking settled exactly once.
    let slot_id = &s.slot;
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT count(*) AS v FROM orders WHERE coach_slot_id = {slot_id} AND status = 'REFUNDED'
               AND payment_method IN ('WALLET', 'WECHAT_PAY') AND refund_amount_cents = amount_cents"
        ))
        .await,
        (WALLET + WECHAT) as i64
    );
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT count(*) AS v FROM orders WHERE coach_slot_id = {slot_id} AND status = 'CANCELED' AND payment_method = 'MIXED'"
        ))
        .await,
        MIXED as i64
    );
    for (to, n) in [("REFUNDED", WALLET + WECHAT), ("CANCELED", MIXED)] {
        assert_eq!(
            app.sql_i64(&format!(
                "SELECT count(*) AS v FROM (SELECT t.order_id FROM order_transitions t JOIN orders o ON o.id = t.order_id
                  WHERE o.coach_slot_id = {slot_id} AND t.to_status = '{to}' AND t.actor = 'admin:staff-1'
                    AND t.trace_id = (SELECT cancel_trace_id FROM coach_slots WHERE id = {slot_id})
                  GROUP BY 1 HAVING count(*) = 1) x"
            ))
            .await,
            n as i64,
            "{to}: one change per order, in the asking admin's name and trace"
        );
    }
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT count(*) AS v FROM order_transitions t JOIN orders o ON o.id = t.order_id
              WHERE o.coach_slot_id = {slot_id} AND t.to_status IN ('REFUNDED', 'CANCELED')"
        ))
        .await,
        (WALLET + WECHAT + MIXED) as i64
    );
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT count(*) AS v FROM refunds r JOIN orders o ON o.id = r.order_id WHERE o.coach_slot_id = {slot_id}"
        ))
        .await,
        (WALLET + WECHAT) as i64
    );
    // The outbox holds one provider refund per WeChat Pay booking, of its whole amount.
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT count(DISTINCT e.order_id) AS v FROM compensation_events e JOIN orders o ON o.id = e.order_id
              WHERE o.coach_slot_id = {slot_id} AND e.kind = 'PROVIDER_REFUND' AND o.payment_method = 'WECHAT_PAY'
                AND (e.payload->>'amountCents')::bigint = o.amount_cents"
        ))
        .await,
        WECHAT as i64
    );
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT count(*) AS v FROM compensation_events e JOIN orders o ON o.id = e.order_id
              WHERE o.coach_slot_id = {slot_id} AND e.kind = 'PROVIDER_REFUND'"
        ))
        .await,
        WECHAT as i64
    );
    // Every member's wallet whole again: 40 000 each, nothing frozen.
    for (no, kind, member) in &bookings {
        let w = app.member_view(member).await["wallet"].clone();
        assert_eq!(w, json!({"balanceCents": 40_000, "frozenCents": 0}), "{kind} {no}");
    }
    // Asked again after all this: the same, nothing changes.
    let before = app.sql_i64("SELECT (SELECT count(*) FROM order_transitions) + (SELECT count(*) FROM refunds) + (SELECT count(*) FROM compensation_events) AS v").await;
    let r = app.admin(CANCEL_SLOT, json!({"id": s.slot, "reason": REASON})).await;
    assert!(
        statuses(&r)
            .values()
            .all(|(st, _)| st == "REFUNDED" || st == "CANCELED"),
        "{r:#}"
    );
    assert_eq!(
        app.sql_i64("SELECT (SELECT count(*) FROM order_transitions) + (SELECT count(*) FROM refunds) + (SELECT count(*) FROM compensation_events) AS v").await,
        before
    );
}

fn stand_in_app_config(s: &StandIn) -> impl FnOnce(&mut fitorder::config::Config) {
    let dir = s.dir().join("statements");
    let sd = s.dir().to_path_buf();
    let (mch, appid, serial, v3, alipay_app) = (
        s.mch_id(),
        s.wechat_app_id(),
        s.merchant_serial(),
        s.apiv3_key(),
        s.alipay_app_id(),
    );
    let (wx_serial, wx_base, ali_gw) = (s.wechat_serial(), s.wechat_base(), s.alipay_gateway());
    let (mkey, akey) = (s.merchant_key_path(), s.app_key_path());
    move |c| {
        c.statement_dir = dir;
        c.timezone = chrono_tz::Asia::Shanghai;
        c.wechatpay.mch_id = Some(mch);
        c.wechatpay.app_id = Some(appid);
        c.wechatpay.apiv3_key = Some(v3.into());
        c.wechatpay.merchant_private_key = Some(mkey);
        c.wechatpay.merchant_serial = Some(serial);
        c.wechatpay.platform_public_key = Some(sd.join("wechat_public_key.pem"));
        c.wechatpay.public_key_id = Some(wx_serial);
        c.wechatpay.api_base = wx_base;
        c.alipay.app_id = Some(alipay_app);
        c.alipay.app_private_key = Some(akey);
        c.alipay.public_key = Some(sd.join("alipay_public_key.pem"));
        c.alipay.api_base = ali_gw;
    }
}

/// The report agrees with the providers' bills of the day, as reconciliation fetches and reads
/// them from the independent stand-in: per provider the bill's payment rows (count and amount)
/// are the report's ordersPaid and takenCents; the wallet's part is the report's alone; refunds
/// count when the money moved.
#[tokio::test]
async fn the_sales_report_agrees_with_the_providers_bills_of_the_day() {
    let Some(standin) = StandIn::start_or_skip(StandInMode::PublicKey) else {
        return;
    };
    let app = TestApp::served_with(stand_in_app_config(&standin)).await;
    let tz = chrono_tz::Asia::Shanghai;
    let today = chrono::Utc::now().with_timezone(&tz).date_naive();
    let st = app.studio(200_000, None, 10).await;
    let base = app.state.config.public_url.clone();
    // Paid at the stand-in: two WeChat Pay class packs, one Alipay, one MIXED (its online part
    // at WeChat Pay); one from the wallet.
    let mut online = vec![];
    for (method, wallet_part) in [("WECHAT_PAY", 0), ("WECHAT_PAY", 0), ("ALIPAY", 0), ("MIXED", 3_000)] {
        let member = app.new_member(&st.store, 10_000).await;
        let mut input = json!({"idempotencyKey": key(), "storeId": st.store, "item": {"classPackId": st.pack},
                               "paymentMethod": method});
        if wallet_part > 0 {
            input["walletAmountCents"] = json!(wallet_part);
        }
        let no = app.place(&member, input).await["order"]["orderNo"]
            .as_str()
            .unwrap()
            .to_string();
        let online_cents = 10_000 - wallet_part;
        let trade = if method == "ALIPAY" {
            Trade::alipay(&no, "TRADE_SUCCESS").notify_url(&format!("{base}/pay/alipay/notify"))
        } else {
            Trade::wechat(&no, "SUCCESS").notify_url(&format!("{base}/pay/wechat/notify"))
        };
        standin.set_trade(trade.amount(online_cents)).await;
        let (status, body) = standin.notify(&no).await;
        assert!((200..300).contains(&status), "{status} {body}");
        assert_eq!(app.order(&no).await["status"], "PAID", "{method} {no}");
        online.push(no);
    }
    let wallet = app
        .buy(&st.member, &st.store, json!({"classPackId": st.pack}), "WALLET")
        .await;
    // Refunds: the wallet order (at once) and a WeChat Pay one (when the stand-in refunded it).
    app.admin(REFUND, json!({"orderNo": wallet, "reason": "moved away"}))
        .await;
    app.admin(REFUND, json!({"orderNo": online[0], "reason": "moved away"}))
        .await;
    let worker = fitorder::compensation::worker::Worker::new(app.state.clone());
    wait_until(
        "the WeChat Pay refund went through",
        Duration::from_secs(30),
        async || {
            // The stand-in answers PROCESSING; the refund query (asked when the event is due
            // again, here at once) finds it SUCCESS: the money moved then.
            worker.run_once().await.unwrap();
            app.sql_i64(
                "WITH u AS (UPDATE compensation_events SET next_attempt_at = now()
                             WHERE status IN ('PENDING', 'RETRYING') AND kind = 'PROVIDER_REFUND' RETURNING 1)
                 SELECT count(*) AS v FROM u",
            )
            .await;
            app.sql_i64(
                "SELECT count(*) AS v FROM compensation_events WHERE kind = 'PROVIDER_REFUND' AND status = 'SUCCEEDED'",
            )
            .await
                == 1
        },
    )
    .await;

    // The bills, as reconciliation fetches and reads them.
    let mut bills: BTreeMap<(String, &str), (i64, i64)> = BTreeMap::new();
    for provider in [Provider::WechatPay, Provider::Alipay] {
        let r = fitorder::reconciliation::run(&app.state, provider, today, None, &TraceId::new())
            .await
            .unwrap();
        assert_eq!(r.status, ReconciliationStatus::Succeeded, "{provider}: {:?}", r.error);
        let path = fitorder::reconciliation::statement_path(&app.state.config.statement_dir, provider, today);
        let file = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
        fitorder::providers::bills::parse(provider, file, |row| {
            if row.kind == fitorder::providers::bills::BillKind::Payment {
                let day = row.trade_time.expect("a payment row has its time").date().to_string();
                let e = bills.entry((day, provider.as_str())).or_default();
                e.0 += 1;
                e.1 += row.amount_cents;
            }
            Ok(())
        })
        .unwrap();
    }
    assert_eq!(
        bills.values().map(|(n, _)| n).sum::<i64>(),
        4,
        "every online payment is on a bill of today: {bills:?}"
    );

    let r = app
        .admin(
            SALES,
            json!({"storeId": st.store, "from": today.to_string(), "to": today.to_string()}),
        )
        .await;
    let report: BTreeMap<(String, String), Value> = r["salesReport"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                (
                    d["date"].as_str().unwrap().to_string(),
                    d["method"].as_str().unwrap().to_string(),
                ),
                d.clone(),
            )
        })
        .collect();
    for ((day, method), (n, cents)) in &bills {
        let d = &report[&(day.clone(), method.to_string())];
        assert_eq!(
            (d["ordersPaid"].as_i64(), d["takenCents"].as_i64()),
            (Some(*n), Some(*cents)),
            "{method}: {r:#}"
        );
    }
    let day = today.to_string();
    let row = |m: &str| report[&(day.clone(), m.to_string())].clone();
    assert_eq!(
        row("WECHAT_PAY"),
        json!({"date": day, "method": "WECHAT_PAY", "ordersPaid": 3, "takenCents": 27_000,
               "refundedCents": 10_000, "netCents": 17_000})
    );
    // The wallet: the MIXED order's part and the wallet order, its refund at once.
    assert_eq!(
        row("WALLET"),
        json!({"date": day, "method": "WALLET", "ordersPaid": 2, "takenCents": 13_000,
               "refundedCents": 10_000, "netCents": 3_000})
    );
    assert_eq!(
        report.len(),
        3,
        "WECHAT_PAY, ALIPAY and WALLET only (no top-ups): {r:#}"
    );
    // Nothing the day before.
    let yesterday = (today - chrono::Duration::days(1)).to_string();
    let r = app
        .admin(SALES, json!({"storeId": st.store, "from": yesterday, "to": yesterday}))
        .await;
    assert_eq!(r["salesReport"], json!([]));
}

/// Ranges out of bounds are refused with a reason; members cannot ask, ops can, store-limited
/// admins only of their stores.
#[tokio::test]
async fn the_sales_report_refuses_bad_ranges_and_strangers() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 1).await;
    let ask = |token: String, from: &str, to: &str| {
        let vars = json!({"storeId": s.store, "from": from, "to": to});
        let app = &app;
        async move { app.gql(Some(&token), SALES, vars).await }
    };
    for (from, to) in [
        ("2026-12-05", "2026-12-04"),
        ("2025-12-01", "2026-12-02"),
        ("1999-12-31", "2000-01-01"),
    ] {
        let r = ask(app.admin_token(), from, to).await;
        assert_eq!(
            (error_code(&r).as_str(), reason(&r)),
            ("BAD_USER_INPUT", "INVALID_RANGE"),
            "{from}..{to}: {r}"
        );
    }
    let r = ask(app.admin_token(), "2025-12-02", "2026-12-02").await;
    assert_eq!(r["data"]["salesReport"], json!([]), "366 days: {r}");
    let r = ask(app.ops_token(), "2026-12-01", "2026-12-02").await;
    assert!(r.get("errors").is_none(), "{r}");
    let r = ask(app.member_token(&s.member), "2026-12-01", "2026-12-02").await;
    assert_eq!(error_code(&r), "FORBIDDEN", "{r}");
    let other = app.studio(0, None, 1).await;
    let limited = issue_token(
        app.state.config.jwt_secret.expose_secret(),
        Role::Admin,
        "staff-9",
        Some(vec![other.store.clone()]),
        Duration::from_secs(60),
    );
    let r = ask(limited, "2026-12-01", "2026-12-02").await;
    assert_eq!(error_code(&r), "FORBIDDEN", "{r}");
}
