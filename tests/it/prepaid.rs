//! Prepaid money (issue 35, docs/prepaid-and-cards.md "Prepaid money"): the rules per store and who sets them, the
//! caps with their refusals and their race, the written notice, the business calendar, the
//! cooling-off refund (wallet at once; a provider refund against the independent stand-in, and
//! its overdue ticket), the ledger's identity on random histories and its CSV. Every call goes
//! through the contract's own operations (`playground/operations/next/`).

use fitorder::config::ExposeSecret;
use std::time::Duration;

use chrono::{Datelike, NaiveDate, Utc};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::harness::*;

const NEXT_ADMIN: &str = include_str!("../../playground/operations/next/admin.graphql");
const NEXT_MEMBER: &str = include_str!("../../playground/operations/next/member.graphql");

/// One operation of a contract document, alone (the document also holds operations of issues
/// still open, which this schema cannot validate yet).
pub(crate) fn operation(doc: &str, name: &str) -> String {
    let starts = |l: &str| {
        ["query ", "mutation ", "subscription "].iter().any(|k| {
            l.strip_prefix(k)
                .is_some_and(|r| r.starts_with(name) && !r[name.len()..].starts_with(|c: char| c.is_alphanumeric()))
        })
    };
    let mut out = String::new();
    let mut inside = false;
    for line in doc.lines() {
        let top = line.starts_with("query ") || line.starts_with("mutation ") || line.starts_with('#');
        if top && inside {
            break;
        }
        if starts(line) {
            inside = true;
        }
        if inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(!out.is_empty(), "no operation {name}");
    out
}

pub(crate) async fn admin_op(app: &TestApp, name: &str, vars: Value) -> Value {
    app.gql(Some(&app.admin_token()), &operation(NEXT_ADMIN, name), vars)
        .await
}

pub(crate) async fn member_op(app: &TestApp, member: &str, name: &str, vars: Value) -> Value {
    app.gql(Some(&app.member_token(member)), &operation(NEXT_MEMBER, name), vars)
        .await
}

pub(crate) fn ok(r: &Value) -> &Value {
    assert!(r.get("errors").is_none(), "unexpected errors: {r:#}");
    &r["data"]
}

pub(crate) fn ext(r: &Value) -> &Value {
    &r["errors"][0]["extensions"]
}

async fn set_rules(app: &TestApp, store: &str, input: Value) -> Value {
    admin_op(app, "SetPrepaidRules", json!({"storeId": store, "input": input})).await
}

async fn place(app: &TestApp, member: &str, store: &str, item: Value, method: &str, extra: Value) -> Value {
    let mut input = json!({"idempotencyKey": key(), "storeId": store, "item": item, "paymentMethod": method});
    for (k, v) in extra.as_object().unwrap() {
        input[k] = v.clone();
    }
    app.op(
        &app.member_token(member),
        MEMBER_OPS,
        "PlaceOrder",
        json!({"input": input}),
    )
    .await
}

async fn plan(app: &TestApp, store: &str, days: i32, price: i32) -> Value {
    app.gql(
        Some(&app.admin_token()),
        "mutation($i: CreateMembershipPlanInput!) { createMembershipPlan(input: $i) { id } }",
        json!({"i": {"storeId": store, "name": "Card", "durationDays": days, "priceCents": price}}),
    )
    .await
}

async fn pack(app: &TestApp, store: &str, sessions: i32, price: i32) -> Value {
    app.gql(
        Some(&app.admin_token()),
        "mutation($i: CreateClassPackInput!) { createClassPack(input: $i) { id } }",
        json!({"i": {"storeId": store, "name": "Pack", "sessions": sessions, "priceCents": price}}),
    )
    .await
}

async fn plan_id(app: &TestApp, store: &str, days: i32, price: i32) -> String {
    let r = plan(app, store, days, price).await;
    ok(&r)["createMembershipPlan"]["id"].as_str().unwrap().to_string()
}

async fn pack_id(app: &TestApp, store: &str, sessions: i32, price: i32) -> String {
    let r = pack(app, store, sessions, price).await;
    ok(&r)["createClassPack"]["id"].as_str().unwrap().to_string()
}

/// A member's order placed at the desk (OFFLINE, paid later or never).
async fn desk(app: &TestApp, member: &str, store: &str, item: Value) -> Value {
    place(app, member, store, item, "OFFLINE", json!({})).await
}

/// A PREPAID_LIMIT refusal as a member app reads it: the rule, its maximum, what is held.
fn refusal(r: &Value) -> (Option<&str>, Option<i64>, Option<i64>) {
    let e = ext(r);
    (e["limit"].as_str(), e["max"].as_i64(), e["current"].as_i64())
}

/// The number of the order a `placeOrder` answer placed.
fn order_no(r: &Value) -> String {
    ok(r)["placeOrder"]["order"]["orderNo"].as_str().unwrap().to_string()
}

async fn top_up(app: &TestApp, member: &str, cents: i64) -> Value {
    app.gql(
        Some(&app.admin_token()),
        "mutation($m: ID!, $a: Int!, $r: String!) { topUpWallet(memberId: $m, amountCents: $a, reference: $r) { wallet { balanceCents } } }",
        json!({"m": member, "a": cents, "r": key()}),
    )
    .await
}

async fn prepaid_balance(app: &TestApp, member: &str) -> i64 {
    let r = admin_op(app, "MemberPrepaid", json!({"id": member})).await;
    ok(&r)["member"]["prepaidBalanceCents"].as_i64().unwrap()
}

fn today() -> NaiveDate {
    Utc::now().with_timezone(&chrono_tz::Asia::Shanghai).date_naive()
}

#[tokio::test]
async fn rules_are_set_by_chain_wide_admins_and_refused_whole_when_wrong() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 1).await;
    // Default: NONE, the store its own operator.
    let r = app
        .admin(
            "query { stores { id operatorCode prepaidRules { preset totalMaxCents coolingOffDays refundWithinWorkingDays termsVersion } } }",
            json!({}),
        )
        .await;
    let mine = r["stores"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == s.store.as_str())
        .unwrap()
        .clone();
    assert_eq!(mine["prepaidRules"]["preset"], "NONE");
    assert_eq!(mine["prepaidRules"]["coolingOffDays"], 0);
    assert!(mine["prepaidRules"]["totalMaxCents"].is_null());

    let r = set_rules(&app, &s.store, json!({"preset": "SHANGHAI_2025"})).await;
    let rules = &ok(&r)["setPrepaidRules"]["prepaidRules"];
    assert_eq!(
        rules,
        &json!({"preset": "SHANGHAI_2025", "membershipMaxCents": 500000, "membershipMaxDays": 731,
                "sessionsMaxCents": 2000000, "sessionsMaxCount": 60, "topUpMaxCents": 500000,
                "totalMaxCents": 2000000, "coolingOffDays": 7, "refundWithinWorkingDays": 5, "termsVersion": null})
    );
    // Stricter overrides are kept; the rest stay the preset's.
    let r = set_rules(
        &app,
        &s.store,
        json!({"preset": "SHANGHAI_2025", "totalMaxCents": 1000000, "coolingOffDays": 10}),
    )
    .await;
    let rules = &ok(&r)["setPrepaidRules"]["prepaidRules"];
    assert_eq!(
        (
            rules["totalMaxCents"].as_i64(),
            rules["coolingOffDays"].as_i64(),
            rules["membershipMaxCents"].as_i64()
        ),
        (Some(1_000_000), Some(10), Some(500_000))
    );
    let r = set_rules(&app, &s.store, json!({"preset": "BEIJING"})).await;
    let rules = &ok(&r)["setPrepaidRules"]["prepaidRules"];
    assert_eq!(
        (
            rules["coolingOffDays"].as_i64(),
            rules["refundWithinWorkingDays"].as_i64()
        ),
        (Some(7), Some(15))
    );
    assert!(rules["totalMaxCents"].is_null());

    // Bad input: each refused as BAD_USER_INPUT, nothing written (the rules stay BEIJING's).
    let too_long = "条".repeat(20_001);
    for bad in [
        json!({"preset": "SHANGHAI_2025", "totalMaxCents": 3000000}),
        json!({"preset": "BEIJING", "refundWithinWorkingDays": 20}),
        json!({"preset": "BEIJING", "coolingOffDays": 3}),
        json!({"preset": "NONE", "totalMaxCents": 100}),
        json!({"preset": "CUSTOM", "totalMaxCents": -1}),
        json!({"preset": "CUSTOM", "membershipMaxDays": 0}),
        json!({"preset": "CUSTOM", "coolingOffDays": 31}),
        json!({"preset": "CUSTOM", "termsVersion": "v1"}),
        json!({"preset": "CUSTOM", "termsVersion": "v1", "termsText": too_long}),
        json!({"preset": "CUSTOM", "termsVersion": "v 1; drop", "termsText": "x"}),
    ] {
        let r = set_rules(&app, &s.store, bad.clone()).await;
        assert_eq!(error_code(&r), "BAD_USER_INPUT", "{bad}: {r}");
    }
    // Who may: chain-wide admins only.
    let limited = fitorder::auth::issue_token(
        app.state.config.jwt_secret.expose_secret(),
        fitorder::auth::Role::Admin,
        "store-admin",
        Some(vec![s.store.clone()]),
        Duration::from_secs(600),
    );
    let doc = operation(NEXT_ADMIN, "SetPrepaidRules");
    let vars = json!({"storeId": s.store, "input": {"preset": "NONE"}});
    for token in [limited, app.ops_token(), app.member_token(&s.member)] {
        let r = app.gql(Some(&token), &doc, vars.clone()).await;
        assert_eq!(error_code(&r), "FORBIDDEN", "{r}");
    }
    let r = app
        .admin(
            "query { stores { id prepaidRules { preset refundWithinWorkingDays } } }",
            json!({}),
        )
        .await;
    let mine = r["stores"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == s.store.as_str())
        .unwrap()
        .clone();
    assert_eq!(
        mine["prepaidRules"],
        json!({"preset": "BEIJING", "refundWithinWorkingDays": 15})
    );
    // No such store: NOT_FOUND, nothing written.
    let r = set_rules(&app, "999999", json!({"preset": "BEIJING"})).await;
    assert_eq!(error_code(&r), "NOT_FOUND", "{r}");
    // CUSTOM starts from NONE.
    let r = set_rules(&app, &s.store, json!({"preset": "CUSTOM", "topUpMaxCents": 100})).await;
    let rules = &ok(&r)["setPrepaidRules"]["prepaidRules"];
    assert_eq!(
        (rules["topUpMaxCents"].as_i64(), rules["coolingOffDays"].as_i64()),
        (Some(100), Some(0))
    );
}

#[tokio::test]
async fn caps_refuse_with_the_rule_its_maximum_and_what_is_held() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 1).await;
    ok(&set_rules(&app, &s.store, json!({"preset": "SHANGHAI_2025"})).await);

    // The catalog: what the store could never sell is refused with the same reason.
    let r = plan(&app, &s.store, 365, 500_001).await;
    assert_eq!(ext(&r)["reason"], "PREPAID_LIMIT", "{r}");
    assert_eq!(refusal(&r), (Some("MEMBERSHIP_AMOUNT"), Some(500_000), Some(0)));
    let r = plan(&app, &s.store, 800, 100_000).await;
    assert_eq!(ext(&r)["limit"], "MEMBERSHIP_DAYS", "{r}");
    let r = pack(&app, &s.store, 61, 100_000).await;
    assert_eq!(ext(&r)["limit"], "SESSIONS_COUNT", "{r}");
    // A single session is a purchase: no cap.
    assert!(pack(&app, &s.store, 1, 3_000_000).await.get("errors").is_none());

    let card = plan_id(&app, &s.store, 365, 400_000).await;
    let big_pack = pack_id(&app, &s.store, 40, 1_500_000).await;

    // The first card passes; a second (a renewal) would hold ¥8,000 of cards and 730 days.
    let r = desk(&app, &s.member, &s.store, json!({"membershipPlanId": card})).await;
    let first = order_no(&r);
    let r = desk(&app, &s.member, &s.store, json!({"membershipPlanId": card})).await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT");
    assert_eq!(
        (
            ext(&r)["reason"].as_str(),
            ext(&r)["limit"].as_str(),
            ext(&r)["max"].as_i64(),
            ext(&r)["current"].as_i64()
        ),
        (
            Some("PREPAID_LIMIT"),
            Some("MEMBERSHIP_AMOUNT"),
            Some(500_000),
            Some(400_000)
        ),
        "{r}"
    );
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT count(*) AS v FROM orders WHERE member_id = {}",
            s.member
        ))
        .await,
        1
    );

    // Top-ups: one at most ¥5,000.
    let r = top_up(&app, &s.member, 500_001).await;
    assert_eq!(
        (ext(&r)["reason"].as_str(), ext(&r)["limit"].as_str()),
        (Some("PREPAID_LIMIT"), Some("TOP_UP_AMOUNT")),
        "{r}"
    );
    for _ in 0..2 {
        ok(&top_up(&app, &s.member, 500_000).await);
    }
    // Held now: the waiting card ¥4,000 + wallet ¥10,000 = ¥14,000; a ¥15,000 pack passes its own
    // cap but not the total of ¥20,000.
    assert_eq!(prepaid_balance(&app, &s.member).await, 1_400_000);
    let r = desk(&app, &s.member, &s.store, json!({"classPackId": big_pack})).await;
    assert_eq!(refusal(&r), (Some("TOTAL"), Some(2_000_000), Some(1_400_000)), "{r}");
    // Paid from the wallet, an order moves money the total counts already: cancel the card,
    // fill the wallet to the total, and the ¥15,000 pack paid from it passes.
    app.admin(CANCEL, json!({"orderNo": first, "reason": "changed mind"}))
        .await;
    assert_eq!(prepaid_balance(&app, &s.member).await, 1_000_000);
    for _ in 0..2 {
        ok(&top_up(&app, &s.member, 500_000).await);
    }
    // Exactly the total is allowed; a cent more is not.
    let r = top_up(&app, &s.member, 1).await;
    assert_eq!(
        (ext(&r)["limit"].as_str(), ext(&r)["current"].as_i64()),
        (Some("TOTAL"), Some(2_000_000)),
        "{r}"
    );
    let r = place(
        &app,
        &s.member,
        &s.store,
        json!({"classPackId": big_pack}),
        "WALLET",
        json!({}),
    )
    .await;
    ok(&r);
    assert_eq!(prepaid_balance(&app, &s.member).await, 2_000_000);

    // Another store of the same operator counts the same money, under its own rules.
    let other = app
        .admin(
            "mutation($i: CreateStoreInput!) { createStore(input: $i) { id operatorCode } }",
            json!({"i": {"name": "Second", "code": format!("X{}", key().len()), "operatorCode": "91310000MA1FL0000X"}}),
        )
        .await["createStore"]
        .clone();
    assert_eq!(other["operatorCode"], "91310000MA1FL0000X");
    let r = admin_op(
        &app,
        "SetPrepaidRules",
        json!({"storeId": other["id"], "input": {"preset": "SHANGHAI_2025"}}),
    )
    .await;
    ok(&r);
    let r = app
        .admin(
            "mutation($id: ID!, $i: UpdateStoreInput!) { updateStore(id: $id, input: $i) { operatorCode } }",
            json!({"id": s.store, "i": {"operatorCode": "91310000MA1FL0000X"}}),
        )
        .await;
    assert_eq!(r["updateStore"]["operatorCode"], "91310000MA1FL0000X");
    let other_card = plan_id(&app, other["id"].as_str().unwrap(), 30, 100_000).await;
    let r = desk(
        &app,
        &s.member,
        other["id"].as_str().unwrap(),
        json!({"membershipPlanId": other_card}),
    )
    .await;
    assert_eq!(
        (ext(&r)["limit"].as_str(), ext(&r)["current"].as_i64()),
        (Some("TOTAL"), Some(2_000_000)),
        "{r}"
    );
    let r = app
        .gql(
            Some(&app.admin_token()),
            "mutation($id: ID!, $i: UpdateStoreInput!) { updateStore(id: $id, input: $i) { operatorCode } }",
            json!({"id": s.store, "i": {"operatorCode": "no spaces allowed"}}),
        )
        .await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT");
}

#[tokio::test]
async fn orders_placed_at_once_never_pass_the_total_together() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 1).await;
    ok(&set_rules(&app, &s.store, json!({"preset": "CUSTOM", "totalMaxCents": 500_000})).await);
    let p = pack_id(&app, &s.store, 10, 100_000).await;
    // Twelve placements of ¥1,000 at once (desk, offline: none expires): five fit.
    let app = &app;
    let tries = (0..12).map(|_| {
        let (member, store, p) = (s.member.clone(), s.store.clone(), p.clone());
        async move {
            let input = json!({"idempotencyKey": key(), "storeId": store, "item": {"classPackId": p},
                               "paymentMethod": "OFFLINE", "memberId": member});
            app.gql(
                Some(&app.admin_token()),
                "mutation($i: PlaceOrderInput!) { placeOrder(input: $i) { order { orderNo } } }",
                json!({"i": input}),
            )
            .await
        }
    });
    let results = futures_util::future::join_all(tries).await;
    let placed = results.iter().filter(|r| r.get("errors").is_none()).count();
    let refused: Vec<&Value> = results.iter().filter(|r| r.get("errors").is_some()).collect();
    assert!(
        refused
            .iter()
            .all(|r| ext(r)["limit"] == "TOTAL" || ext(r)["reason"] == "TOO_MANY_OPEN_ORDERS"),
        "{refused:#?}"
    );
    assert!(placed <= 5, "{placed} placed");
    assert!(prepaid_balance(app, &s.member).await <= 500_000);
    assert_eq!(
        app.sql_i64(&format!("SELECT coalesce(sum(amount_cents), 0)::bigint AS v FROM orders WHERE member_id = {} AND status = 'WAIT_PAY'", s.member))
            .await,
        placed as i64 * 100_000
    );
}

#[tokio::test]
async fn a_store_with_terms_sells_prepaid_money_only_to_members_who_accepted_them() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 1).await;
    let text = "预付式消费告知书：本店适用上海市预付卡三限规定，七天冷静期内未使用可全额退款。";
    ok(&set_rules(
        &app,
        &s.store,
        json!({"preset": "SHANGHAI_2025", "termsVersion": "2025.1", "termsText": text}),
    )
    .await);
    let r = member_op(&app, &s.member, "StoreTerms", json!({"storeId": s.store})).await;
    assert_eq!(ok(&r)["catalog"]["terms"], json!({"version": "2025.1", "text": text}));

    let r = place(
        &app,
        &s.member,
        &s.store,
        json!({"classPackId": s.pack}),
        "WALLET",
        json!({}),
    )
    .await;
    assert_eq!(
        (ext(&r)["reason"].as_str(), ext(&r)["currentVersion"].as_str()),
        (Some("TERMS_NOT_ACCEPTED"), Some("2025.1")),
        "{r}"
    );
    let r = place(
        &app,
        &s.member,
        &s.store,
        json!({"classPackId": s.pack}),
        "WALLET",
        json!({"acceptedTermsVersion": "2024.9"}),
    )
    .await;
    assert_eq!(ext(&r)["reason"], "TERMS_NOT_ACCEPTED", "{r}");
    // A single session is no prepaid money: no terms asked.
    let r = place(
        &app,
        &s.member,
        &s.store,
        json!({"coachSlotId": s.slot}),
        "WALLET",
        json!({}),
    )
    .await;
    ok(&r);
    let r = place(
        &app,
        &s.member,
        &s.store,
        json!({"classPackId": s.pack}),
        "WALLET",
        json!({"acceptedTermsVersion": "2025.1"}),
    )
    .await;
    let no = order_no(&r);
    let r = member_op(&app, &s.member, "MyOrderCoolingOff", json!({"orderNo": no})).await;
    let o = &ok(&r)["order"];
    assert_eq!(o["acceptedTermsVersion"], "2025.1");
    assert_eq!(o["status"], "PAID");
    // Paid today: the cooling-off ends at the start of the 8th day after it (Asia/Shanghai).
    let until = chrono::DateTime::parse_from_rfc3339(o["coolingOffUntil"].as_str().unwrap()).unwrap();
    let local = until.with_timezone(&chrono_tz::Asia::Shanghai);
    assert_eq!(local.date_naive(), today() + chrono::Duration::days(8));
    assert_eq!((local.time().hour_minute()), (0, 0));
    assert!(o["refundDueBy"].is_null());
}

trait HourMinute {
    fn hour_minute(&self) -> (u32, u32);
}
impl HourMinute for chrono::NaiveTime {
    fn hour_minute(&self) -> (u32, u32) {
        use chrono::Timelike;
        (self.hour(), self.minute())
    }
}

#[tokio::test]
async fn the_business_calendar_is_weekdays_unless_staff_set_a_date() {
    let app = TestApp::new().await;
    // 2026-10: National Day holidays Oct 1–8, the Saturday of Oct 10 worked (调休).
    let set: Vec<Value> = (1..=8)
        .map(|d| json!({"date": format!("2026-10-{d:02}"), "working": false, "note": "国庆节"}))
        .chain([json!({"date": "2026-10-10", "working": true, "note": "调休上班"})])
        .collect();
    let r = admin_op(&app, "SetBusinessDays", json!({"days": set})).await;
    assert_eq!(ok(&r)["setBusinessDays"], 9);
    let r = admin_op(&app, "BusinessDays", json!({"from": "2026-09-30", "to": "2026-10-12"})).await;
    let days = ok(&r)["businessDays"].as_array().unwrap().clone();
    assert_eq!(days.len(), 13);
    let of = |d: &str| days.iter().find(|x| x["date"] == d).unwrap().clone();
    assert_eq!(
        of("2026-09-30"),
        json!({"date": "2026-09-30", "working": true, "source": "WEEKDAY", "note": null})
    );
    assert_eq!(
        of("2026-10-01"),
        json!({"date": "2026-10-01", "working": false, "source": "SET", "note": "国庆节"})
    );
    assert_eq!(of("2026-10-10")["working"], true);
    assert_eq!(
        of("2026-10-11"),
        json!({"date": "2026-10-11", "working": false, "source": "WEEKEND", "note": null})
    );
    // A later call for a date wins.
    ok(&admin_op(
        &app,
        "SetBusinessDays",
        json!({"days": [{"date": "2026-10-08", "working": true}]}),
    )
    .await);
    let r = admin_op(&app, "BusinessDays", json!({"from": "2026-10-08", "to": "2026-10-08"})).await;
    assert_eq!(ok(&r)["businessDays"][0]["working"], true);

    // Bad input, each refused whole: nothing of the call is written.
    let thousands: Vec<Value> = (0..3000)
        .map(|i| json!({"date": (NaiveDate::from_ymd_opt(2027, 1, 1).unwrap() + chrono::Duration::days(i)).to_string(), "working": false}))
        .collect();
    for bad in [
        json!({"days": thousands}),
        json!({"days": []}),
        json!({"days": [{"date": "2027-01-01", "working": false}, {"date": "1999-12-31", "working": false}]}),
        json!({"days": [{"date": "2027-01-01", "working": false}, {"date": "2027-01-01", "working": true}]}),
        json!({"days": [{"date": "2027-01-01", "working": false, "note": "x".repeat(201)}]}),
    ] {
        let r = admin_op(&app, "SetBusinessDays", bad).await;
        assert_eq!(error_code(&r), "BAD_USER_INPUT", "{r}");
    }
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM business_days WHERE day >= '2027-01-01'")
            .await,
        0
    );
    for (from, to) in [("2026-01-01", "2027-01-02"), ("2026-02-01", "2026-01-01")] {
        let r = admin_op(&app, "BusinessDays", json!({"from": from, "to": to})).await;
        assert_eq!(error_code(&r), "BAD_USER_INPUT", "{r}");
    }
    let r = app
        .gql(
            Some(&app.ops_token()),
            &operation(NEXT_ADMIN, "SetBusinessDays"),
            json!({"days": [{"date": "2027-01-01", "working": false}]}),
        )
        .await;
    assert_eq!(error_code(&r), "FORBIDDEN");
}

/// Pays `no` at the desk (OFFLINE) and returns the order.
async fn desk_paid(app: &TestApp, no: &str) {
    app.admin(
        CONFIRM_OFFLINE,
        json!({"orderNo": no, "reference": format!("desk-{no}")}),
    )
    .await;
}

#[tokio::test]
async fn the_cooling_off_refund_gives_everything_back_once_and_only_unused() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 1).await;
    ok(&set_rules(&app, &s.store, json!({"preset": "BEIJING"})).await);
    // Weekends only in this calendar's stretch: 15 working days after today.
    let r = place(
        &app,
        &s.member,
        &s.store,
        json!({"classPackId": s.pack}),
        "WALLET",
        json!({}),
    )
    .await;
    let no = order_no(&r);
    assert_eq!(app.member_view(&s.member).await["wallet"]["balanceCents"], 90_000);
    let r = member_op(&app, &s.member, "RequestCoolingOffRefund", json!({"orderNo": no})).await;
    let o = ok(&r)["requestCoolingOffRefund"].clone();
    assert_eq!(
        (o["status"].as_str(), o["refundAmountCents"].as_i64()),
        (Some("REFUNDED"), Some(10_000))
    );
    let mut expect = today();
    let mut left = 15;
    while left > 0 {
        expect += chrono::Duration::days(1);
        if expect.weekday().num_days_from_monday() < 5 {
            left -= 1;
        }
    }
    assert_eq!(o["refundDueBy"], expect.to_string());
    assert_eq!(
        app.member_view(&s.member).await["wallet"]["balanceCents"],
        100_000,
        "the wallet part back at once"
    );
    // A double tap answers with the same order; nothing moves twice.
    let r = member_op(&app, &s.member, "RequestCoolingOffRefund", json!({"orderNo": no})).await;
    assert_eq!(ok(&r)["requestCoolingOffRefund"]["refundedAt"], o["refundedAt"]);
    assert_eq!(app.member_view(&s.member).await["wallet"]["balanceCents"], 100_000);
    let chain = app.order(&no).await;
    assert_eq!(
        chain["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["toStatus"] == "REFUNDED")
            .count(),
        1
    );

    // Used: refused ALREADY_USED, nothing changes.
    let r = place(
        &app,
        &s.member,
        &s.store,
        json!({"classPackId": s.pack}),
        "WALLET",
        json!({}),
    )
    .await;
    let used = order_no(&r);
    app.admin(CHECK_IN, json!({"input": {"orderNo": used, "consumeTxnNo": key()}}))
        .await;
    let r = member_op(&app, &s.member, "RequestCoolingOffRefund", json!({"orderNo": used})).await;
    assert_eq!(ext(&r)["reason"], "ALREADY_USED", "{r}");
    assert_eq!(app.order(&used).await["status"], "CONSUMING");

    // Past the cooling-off: COOLING_OFF_ENDED (the payment moved eight days back).
    let r = place(
        &app,
        &s.member,
        &s.store,
        json!({"classPackId": s.pack}),
        "WALLET",
        json!({}),
    )
    .await;
    let late = order_no(&r);
    app.sql_i64(&format!("WITH u AS (UPDATE orders SET paid_at = paid_at - interval '8 days' WHERE order_no = '{late}' RETURNING 1) SELECT count(*) AS v FROM u")).await;
    let r = member_op(&app, &s.member, "RequestCoolingOffRefund", json!({"orderNo": late})).await;
    assert_eq!(ext(&r)["reason"], "COOLING_OFF_ENDED", "{r}");
    // Staff may ask for a member; another member may not see the order at all.
    let other = app.new_member(&s.store, 0).await;
    let r = member_op(&app, &other, "RequestCoolingOffRefund", json!({"orderNo": late})).await;
    assert_eq!(error_code(&r), "NOT_FOUND", "{r}");
    // A store without cooling-off: refused with the reason, and refundOrder stays staff's.
    let plain = app.studio(100_000, None, 1).await;
    let r = place(
        &app,
        &plain.member,
        &plain.store,
        json!({"classPackId": plain.pack}),
        "WALLET",
        json!({}),
    )
    .await;
    let no_cooling = order_no(&r);
    let r = member_op(
        &app,
        &plain.member,
        "RequestCoolingOffRefund",
        json!({"orderNo": no_cooling}),
    )
    .await;
    assert_eq!(ext(&r)["reason"], "COOLING_OFF_ENDED", "{r}");
    let r = app
        .gql(
            Some(&app.member_token(&plain.member)),
            REFUND,
            json!({"orderNo": no_cooling, "reason": "mine"}),
        )
        .await;
    assert_eq!(error_code(&r), "FORBIDDEN", "{r}");
    // A desk-paid card in cooling-off, asked for by staff: refunded, the card revoked.
    let r = desk(&app, &s.member, &s.store, json!({"membershipPlanId": s.plan})).await;
    let card = order_no(&r);
    desk_paid(&app, &card).await;
    let r = admin_op(&app, "CoolingOffRefund", json!({"orderNo": card})).await;
    assert_eq!(ok(&r)["requestCoolingOffRefund"]["status"], "REFUNDED");
    assert_eq!(app.order(&card).await["membership"]["status"], "REVOKED");
}

/// The stand-in's WeChat Pay keeps a refund PROCESSING: the cooling-off refund is asked for
/// through the same outbox and provider refund as any refund, and when its deadline passes the
/// sweep opens one REFUND_OVERDUE ticket with its alert, however often it runs.
#[tokio::test]
async fn a_provider_refund_past_its_deadline_opens_one_ticket_and_one_alert() {
    use crate::standin::{StandIn, StandInMode, Trade};
    let Some(standin) = StandIn::start_or_skip(StandInMode::PublicKey) else {
        return;
    };
    let app = TestApp::served_with(|c| {
        crate::client_vs_standin::point_at(c, &standin);
        c.retry_base = Duration::from_millis(50);
    })
    .await;
    let s = app.studio(0, None, 3).await;
    ok(&set_rules(&app, &s.store, json!({"preset": "SHANGHAI_2025"})).await);
    let placed = crate::start_payment::place_with(&app, &s, Some("WECHAT_NATIVE"), "WECHAT_PAY", json!({})).await;
    let no = placed["data"]["placeOrder"]["order"]["orderNo"]
        .as_str()
        .unwrap()
        .to_string();
    let total = app.order(&no).await["amountCents"].as_i64().unwrap();
    standin
        .set_trade(
            Trade::wechat(&no, "SUCCESS")
                .amount(total)
                .transaction_id("4200000000000000000000000935"),
        )
        .await;
    let (status, body) = standin.notify(&no).await;
    assert!((200..300).contains(&status), "{status} {body}");
    standin.money(json!({"wechat_refund_hold": true})).await;

    let r = member_op(&app, &s.member, "RequestCoolingOffRefund", json!({"orderNo": no})).await;
    let o = ok(&r)["requestCoolingOffRefund"].clone();
    assert_eq!(o["status"], "REFUNDED");
    let due = NaiveDate::parse_from_str(o["refundDueBy"].as_str().unwrap(), "%Y-%m-%d").unwrap();
    let worker = fitorder::compensation::worker::Worker::new(app.state.clone());
    worker.run_once().await.unwrap();
    let refund = app.order(&no).await["compensation"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "PROVIDER_REFUND")
        .cloned()
        .unwrap();
    assert_eq!(
        refund["status"], "RETRYING",
        "the stand-in holds it PROCESSING: {refund}"
    );
    let asked = standin.requests().await;
    assert!(
        asked.iter().any(|r| r["path"] == "/v3/refund/domestic/refunds"
            && r["verified"] == true
            && r["body"].as_str().unwrap_or("").contains(&no)),
        "the refund went to the provider, signed"
    );

    // On its due date nothing is overdue yet; the day after, one ticket and one alert.
    assert_eq!(fitorder::prepaid::overdue::sweep_on(&app.state, due).await.unwrap(), 0);
    let after = due + chrono::Duration::days(1);
    assert_eq!(
        fitorder::prepaid::overdue::sweep_on(&app.state, after).await.unwrap(),
        1
    );
    assert_eq!(
        fitorder::prepaid::overdue::sweep_on(&app.state, after).await.unwrap(),
        0
    );
    let tickets: Vec<Value> = app.order(&no).await["tickets"].as_array().unwrap().clone();
    assert_eq!(
        tickets.iter().filter(|t| t["kind"] == "REFUND_OVERDUE").count(),
        1,
        "{tickets:#?}"
    );
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT count(*) AS v FROM alerts WHERE cause = 'REFUND_OVERDUE' AND order_no = '{no}'"
        ))
        .await,
        1
    );
    let r = app
        .admin(
            "query($n: String) { exceptionTickets(filter: {orderNo: $n}) { edges { node { kind localAmountCents detail } } } }",
            json!({"n": no}),
        )
        .await;
    let t = &r["exceptionTickets"]["edges"][0]["node"];
    assert_eq!(t["kind"], "REFUND_OVERDUE");
    assert_eq!(t["localAmountCents"].as_i64(), Some(total));

    // Once the provider pays it back, a later sweep finds nothing new.
    standin.money(json!({"wechat_refund_hold": false})).await;
    let requests = standin.requests().await;
    let refund_no = requests
        .iter()
        .find(|r| r["path"] == "/v3/refund/domestic/refunds")
        .map(|r| serde_json::from_str::<Value>(r["body"].as_str().unwrap()).unwrap()["out_refund_no"].clone())
        .unwrap();
    standin
        .end_refund(json!({"provider": "wechat", "out_refund_no": refund_no, "status": "SUCCESS"}))
        .await;
    app.sql_i64("WITH u AS (UPDATE compensation_events SET next_attempt_at = now() WHERE status IN ('PENDING', 'RETRYING') RETURNING 1) SELECT count(*) AS v FROM u").await;
    worker.run_once().await.unwrap();
    assert_eq!(
        fitorder::prepaid::overdue::sweep_on(&app.state, after + chrono::Duration::days(1))
            .await
            .unwrap(),
        0
    );
}

/// The ledger of a store, by the contract's operation.
async fn ledger(app: &TestApp, store: &str, from: NaiveDate, to: NaiveDate) -> Vec<Value> {
    let r = admin_op(
        app,
        "PrepaidLedger",
        json!({"storeId": store, "from": from.to_string(), "to": to.to_string()}),
    )
    .await;
    ok(&r)["prepaidLedger"].as_array().unwrap().clone()
}

fn cents(v: &Value, k: &str) -> i64 {
    v[k].as_i64().unwrap_or_else(|| panic!("{k} in {v}"))
}

/// balance = previous + collected − earned − refunded, on every row, and the first row's
/// previous is the day before's balance.
fn adds_up(rows: &[Value], before: i64) {
    let mut prev = before;
    for r in rows {
        assert_eq!(
            cents(r, "balanceCents"),
            prev + cents(r, "collectedCents") - cents(r, "earnedCents") - cents(r, "refundedCents"),
            "{r}"
        );
        prev = cents(r, "balanceCents");
    }
}

#[tokio::test]
async fn the_ledger_adds_up_on_random_histories_and_matches_what_is_held() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 50).await;
    let card = plan_id(&app, &s.store, 10, 10_003).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(35);
    let members: Vec<String> = {
        let mut v = vec![s.member.clone()];
        for _ in 0..3 {
            v.push(app.new_member(&s.store, 0).await);
        }
        v
    };
    let mut live: Vec<String> = vec![];
    let (mut topped, mut collected_orders, mut refunded_out) = (0i64, 0i64, 0i64);
    for step in 0..60 {
        let m = &members[rng.random_range(0..members.len())];
        match rng.random_range(0..6) {
            0 => {
                let a = rng.random_range(1..50_000);
                ok(&top_up(&app, m, a).await);
                topped += a;
            }
            1 | 2 => {
                let item = match rng.random_range(0..3) {
                    0 => json!({"membershipPlanId": card}),
                    1 => json!({"classPackId": s.pack}),
                    _ => json!({"coachSlotId": s.slot}),
                };
                let method = if rng.random_bool(0.5) { "WALLET" } else { "OFFLINE" };
                let r = place(&app, m, &s.store, item.clone(), method, json!({})).await;
                if r.get("errors").is_some() {
                    continue; // the wallet could not pay it
                }
                let o = &r["data"]["placeOrder"]["order"];
                let no = o["orderNo"].as_str().unwrap().to_string();
                if method == "OFFLINE" {
                    desk_paid(&app, &no).await;
                }
                let chain = app.order(&no).await;
                let prepaid = chain["kind"] == "MEMBERSHIP" || chain["sessionsTotal"].as_i64() > Some(1);
                if prepaid && method == "OFFLINE" {
                    collected_orders += chain["amountCents"].as_i64().unwrap();
                }
                if prepaid {
                    live.push(no);
                }
            }
            3 if !live.is_empty() => {
                let no = &live[rng.random_range(0..live.len())];
                app.gql(
                    Some(&app.admin_token()),
                    CHECK_IN,
                    json!({"input": {"orderNo": no, "consumeTxnNo": key()}}),
                )
                .await;
            }
            4 if !live.is_empty() => {
                let no = live.swap_remove(rng.random_range(0..live.len()));
                let chain = app.order(&no).await;
                let amount = if rng.random_bool(0.5) {
                    None
                } else {
                    Some(rng.random_range(0..=chain["amountCents"].as_i64().unwrap()))
                };
                let r = app
                    .gql(
                        Some(&app.admin_token()),
                        REFUND,
                        json!({"orderNo": no, "reason": format!("step {step}"), "amountCents": amount}),
                    )
                    .await;
                if r.get("errors").is_none() {
                    let o = app.order(&no).await;
                    if o["paymentMethod"] == "OFFLINE" {
                        refunded_out += o["refundAmountCents"].as_i64().unwrap();
                    }
                }
            }
            // A card frozen from today (issue 36): its frozen dates earn nothing; sometimes
            // ended at once (the started day stays frozen).
            5 if !live.is_empty() => {
                let no = &live[rng.random_range(0..live.len())];
                let card = &app.order(no).await["membership"];
                if let Some(id) = card["id"].as_str() {
                    let r = admin_op(
                        &app,
                        "FreezeMembership",
                        json!({"id": id, "from": today().to_string(), "days": rng.random_range(1..5), "reason": "away"}),
                    )
                    .await;
                    if r.get("errors").is_none() && rng.random_bool(0.3) {
                        ok(&admin_op(&app, "UnfreezeMembership", json!({"id": id})).await);
                    }
                }
            }
            _ => {}
        }
    }
    let frozen_cards = app
        .sql_i64("SELECT count(DISTINCT membership_id) AS v FROM membership_freezes WHERE state IN ('RUNNING', 'DONE')")
        .await;
    assert!(frozen_cards >= 2, "the history froze {frozen_cards} cards");
    // Some of the history moves to earlier days (as if paid and used then): the cards' and
    // check-ins' days, their freezes, the top-ups' and payments' dates, consistently per order.
    app.sql_i64(
        "WITH moved AS (SELECT id, (id % 5) * interval '1 day' AS back FROM orders WHERE status IN ('PAID', 'CONSUMING', 'CONSUMED')),
              o AS (UPDATE orders SET paid_at = paid_at - m.back, created_at = created_at - m.back FROM moved m WHERE orders.id = m.id RETURNING 1),
              ms AS (UPDATE memberships SET valid_from = valid_from - m.back, valid_to = valid_to - m.back FROM moved m WHERE memberships.order_id = m.id RETURNING 1),
              f AS (UPDATE membership_freezes SET from_date = (from_date - m.back)::date, until_date = (until_date - m.back)::date,
                           starts_at = starts_at - m.back, ends_at = ends_at - m.back
                      FROM memberships c, moved m WHERE membership_freezes.membership_id = c.id AND c.order_id = m.id RETURNING 1),
              c AS (UPDATE check_ins SET at = at - m.back FROM moved m WHERE check_ins.order_id = m.id RETURNING 1),
              w AS (UPDATE wallet_ledger SET created_at = created_at - m.back FROM moved m WHERE wallet_ledger.order_id = m.id AND wallet_ledger.kind IN ('PAY', 'CAPTURE') RETURNING 1)
         SELECT count(*) AS v FROM o",
    )
    .await;
    let (from, to) = (
        today() - chrono::Duration::days(6),
        today() + chrono::Duration::days(12),
    );
    let rows = ledger(&app, &s.store, from, to).await;
    assert_eq!(rows.len(), 19);
    assert_eq!(rows[0]["date"], from.to_string());
    assert_eq!(rows[18]["date"], to.to_string());
    let before = ledger(
        &app,
        &s.store,
        from - chrono::Duration::days(1),
        from - chrono::Duration::days(1),
    )
    .await[0]["balanceCents"]
        .as_i64()
        .unwrap();
    assert_eq!(before, 0, "nothing was held before the first payment");
    adds_up(&rows, before);
    // Any sub-range adds up from its own day before.
    for (a, b) in [(3usize, 9usize), (10, 18), (0, 0)] {
        let sub = ledger(
            &app,
            &s.store,
            from + chrono::Duration::days(a as i64),
            from + chrono::Duration::days(b as i64),
        )
        .await;
        assert_eq!(&sub[..], &rows[a..=b]);
    }
    // Money in and out, over the whole range: every top-up and desk payment collected, every
    // desk refund paid out; what remains is held or was earned.
    let sum = |k: &str| rows.iter().map(|r| cents(r, k)).sum::<i64>();
    assert_eq!(sum("collectedCents"), topped + collected_orders);
    assert_eq!(sum("refundedCents"), refunded_out);
    // Today's balance is what the store holds: wallets plus the unused value of its paid
    // prepaid orders, counted here from the API (cards by their dates, packs by sessions).
    let today_row = rows.iter().find(|r| r["date"] == today().to_string()).unwrap();
    let mut held = 0i64;
    for m in &members {
        held += app.member_view(m).await["wallet"]
            .as_object()
            .map(|w| w["balanceCents"].as_i64().unwrap() + w["frozenCents"].as_i64().unwrap())
            .unwrap();
    }
    let orders = app
        .admin(
            "query($s: ID!) { orders(first: 100, filter: {storeId: $s, status: [PAID, CONSUMING, CONSUMED]}) { edges { node {
                kind amountCents sessionsTotal sessionsUsed membership { validFrom freezes { from until } } } } } }",
            json!({"s": s.store}),
        )
        .await;
    for e in orders["orders"]["edges"].as_array().unwrap() {
        let o = &e["node"];
        let amount = o["amountCents"].as_i64().unwrap();
        if o["kind"] == "MEMBERSHIP" {
            let from = chrono::DateTime::parse_from_rfc3339(o["membership"]["validFrom"].as_str().unwrap())
                .unwrap()
                .with_timezone(&chrono_tz::Asia::Shanghai)
                .date_naive();
            // Its days through today, less those frozen.
            let frozen: i64 = o["membership"]["freezes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| {
                    let d = |k: &str| f[k].as_str().unwrap().parse::<NaiveDate>().unwrap();
                    (d("until").min(today() + chrono::Duration::days(1)) - d("from"))
                        .num_days()
                        .max(0)
                })
                .sum();
            let used = ((today() - from).num_days() + 1 - frozen).clamp(0, 10);
            held += if used >= 10 { 0 } else { amount - amount / 10 * used };
        } else if o["sessionsTotal"].as_i64() > Some(1) {
            let (total, used) = (
                o["sessionsTotal"].as_i64().unwrap(),
                o["sessionsUsed"].as_i64().unwrap(),
            );
            held += if used >= total {
                0
            } else {
                amount - amount / total * used
            };
        }
    }
    assert_eq!(cents(today_row, "balanceCents"), held);
    // Twelve days on every card has ended: what is left is wallets and packs only.
    assert!(cents(&rows[18], "balanceCents") <= cents(today_row, "balanceCents"));

    // Closed through yesterday (the nightly task), the same ranges read the closed days and
    // compute the rest from the orders that change in them: the same figures.
    let store_id: i64 = s.store.parse().unwrap();
    let tz = chrono_tz::Asia::Shanghai;
    let mut c = app.conn().await;
    let closed = fitorder::prepaid::ledger::close(&mut c, store_id, today() - chrono::Duration::days(1), tz)
        .await
        .unwrap();
    assert!(closed >= 3, "{closed} days closed");
    assert_eq!(
        fitorder::prepaid::ledger::close(&mut c, store_id, today() - chrono::Duration::days(1), tz)
            .await
            .unwrap(),
        0,
        "a closed day is closed once"
    );
    drop(c);
    assert_eq!(ledger(&app, &s.store, from, to).await, rows);
    for (a, b) in [(3usize, 9usize), (10, 18), (0, 0), (5, 6)] {
        let sub = ledger(
            &app,
            &s.store,
            from + chrono::Duration::days(a as i64),
            from + chrono::Duration::days(b as i64),
        )
        .await;
        assert_eq!(&sub[..], &rows[a..=b], "{a}..{b} after closing");
    }

    // The CSV is the same table, for a staff token only.
    let path = format!("/reports/prepaid.csv?storeId={}&from={from}&to={to}", s.store);
    let csv = get_with(&app, &path, Some(&app.admin_token())).await;
    assert_eq!(csv.0, 200);
    assert!(csv.1.starts_with(&[0xEF, 0xBB, 0xBF]), "UTF-8 with a BOM, for Excel");
    let text = String::from_utf8(csv.1[3..].to_vec()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "日期,预收收取(元),消耗确认(元),退款(元),预收余额(元)");
    assert_eq!(lines.len(), 20);
    let yuan = |c: i64| format!("{}{}.{:02}", if c < 0 { "-" } else { "" }, c.abs() / 100, c.abs() % 100);
    for (line, r) in lines[1..].iter().zip(&rows) {
        let want = format!(
            "{},{},{},{},{}",
            r["date"].as_str().unwrap(),
            yuan(cents(r, "collectedCents")),
            yuan(cents(r, "earnedCents")),
            yuan(cents(r, "refundedCents")),
            yuan(cents(r, "balanceCents"))
        );
        assert_eq!(*line, want);
    }
    assert_eq!(get_with(&app, &path, None).await.0, 401);
    assert_eq!(get_with(&app, &path, Some(&app.member_token(&s.member))).await.0, 403);
    let long = format!("/reports/prepaid.csv?storeId={}&from=2025-01-01&to=2026-06-30", s.store);
    let (status, body) = get_with(&app, &long, Some(&app.admin_token())).await;
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("BAD_USER_INPUT"));
    let r = admin_op(
        &app,
        "PrepaidLedger",
        json!({"storeId": s.store, "from": "2025-01-01", "to": "2026-06-30"}),
    )
    .await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT");
}

async fn get_with(app: &TestApp, path: &str, token: Option<&str>) -> (u16, Vec<u8>) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let mut req = axum::http::Request::get(path);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = app
        .router
        .clone()
        .oneshot(req.body(axum::body::Body::empty()).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes().to_vec())
}

#[tokio::test]
async fn a_cards_days_earn_exactly_its_price() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 1).await;
    let card = plan_id(&app, &s.store, 7, 1_000).await;
    let r = desk(&app, &s.member, &s.store, json!({"membershipPlanId": card})).await;
    let no = order_no(&r);
    desk_paid(&app, &no).await;
    let rows = ledger(&app, &s.store, today(), today() + chrono::Duration::days(8)).await;
    let earned: Vec<i64> = rows.iter().map(|r| cents(r, "earnedCents")).collect();
    // ¥10.00 over 7 days: 142 a day, the last day 148; then nothing.
    assert_eq!(earned, vec![142, 142, 142, 142, 142, 142, 148, 0, 0]);
    assert_eq!(cents(&rows[0], "collectedCents"), 1_000);
    assert_eq!(cents(&rows[8], "balanceCents"), 0);
    adds_up(&rows, 0);
    // Refunded on its first day for less than its unused value: the rest is earned that day.
    let r = desk(&app, &s.member, &s.store, json!({"membershipPlanId": card})).await;
    let second = order_no(&r);
    desk_paid(&app, &second).await;
    app.admin(
        REFUND,
        json!({"orderNo": second, "reason": "moving", "amountCents": 300}),
    )
    .await;
    let rows = ledger(&app, &s.store, today(), today()).await;
    assert_eq!(cents(&rows[0], "collectedCents"), 2_000);
    assert_eq!(cents(&rows[0], "refundedCents"), 300);
    // The first card earned 142 today; the second's 1,000 less the 300 paid back is earned.
    assert_eq!(cents(&rows[0], "earnedCents"), 142 + 700);
    assert_eq!(cents(&rows[0], "balanceCents"), 1_000 - 142);
}

/// After a renewal the same limits hold for what is then held: days and value of cards,
/// sessions and value of packs, each against what the member holds of that kind already
/// (a card paid and partly used counts its unused days only).
#[tokio::test]
async fn renewals_count_what_is_held_of_each_kind() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 1).await;
    ok(&set_rules(&app, &s.store, json!({"preset": "SHANGHAI_2025"})).await);
    let long = plan_id(&app, &s.store, 400, 100_000).await;
    let forty = pack_id(&app, &s.store, 40, 1_100_000).await;
    let r = desk(&app, &s.member, &s.store, json!({"membershipPlanId": long})).await;
    let card = order_no(&r);
    desk_paid(&app, &card).await;
    // 400 days held (the card started today: today is used), 400 more is 799 > 731.
    let r = desk(&app, &s.member, &s.store, json!({"membershipPlanId": long})).await;
    assert_eq!(refusal(&r), (Some("MEMBERSHIP_DAYS"), Some(731), Some(399)), "{r}");
    // Seventy days on, 330 days are left: a renewal of 400 passes (730 ≤ 731).
    app.sql_i64(&format!(
        "WITH u AS (UPDATE memberships m SET valid_from = valid_from - interval '70 days', valid_to = valid_to - interval '70 days'
           FROM orders o WHERE o.id = m.order_id AND o.order_no = '{card}' RETURNING 1) SELECT count(*) AS v FROM u"
    ))
    .await;
    ok(&desk(&app, &s.member, &s.store, json!({"membershipPlanId": long})).await);
    // Packs: 40 sessions held, 40 more is 80 > 60; value ¥11,000 + ¥11,000 > ¥20,000 is checked
    // after the count.
    ok(&desk(&app, &s.member, &s.store, json!({"classPackId": forty})).await);
    let r = desk(&app, &s.member, &s.store, json!({"classPackId": forty})).await;
    assert_eq!(
        refusal(&r),
        (Some("SESSIONS_AMOUNT"), Some(2_000_000), Some(1_100_000)),
        "{r}"
    );
    let small = pack_id(&app, &s.store, 25, 100_000).await;
    let r = desk(&app, &s.member, &s.store, json!({"classPackId": small})).await;
    assert_eq!(refusal(&r), (Some("SESSIONS_COUNT"), Some(60), Some(40)), "{r}");
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT count(*) AS v FROM orders WHERE member_id = {}",
            s.member
        ))
        .await,
        3,
        "nothing refused was placed"
    );
}

/// A card running through a range after the last closed day is not read again: its daily
/// earning comes from the closed day's card rate, and the figures are those computed from
/// every order.
#[tokio::test]
async fn closed_days_carry_the_cards_running_through_them() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 1).await;
    let card = plan_id(&app, &s.store, 60, 60_001).await;
    let short = plan_id(&app, &s.store, 3, 3_001).await;
    let mut nos = vec![];
    for item in [card.clone(), card, short] {
        let r = desk(&app, &s.member, &s.store, json!({"membershipPlanId": item})).await;
        let no = order_no(&r);
        desk_paid(&app, &no).await;
        nos.push(no);
    }
    // Paid 20 days ago (the second card renews the first: it starts when that one ends).
    app.sql_i64(
        "WITH o AS (UPDATE orders SET paid_at = paid_at - interval '20 days' RETURNING 1),
              m AS (UPDATE memberships SET valid_from = valid_from - interval '20 days', valid_to = valid_to - interval '20 days' RETURNING 1),
              w AS (UPDATE wallet_ledger SET created_at = created_at - interval '20 days' RETURNING 1)
         SELECT count(*) AS v FROM o",
    )
    .await;
    let day = |n: i64| today() + chrono::Duration::days(n);
    let ranges = [(-25, -1), (-3, 5), (1, 5), (30, 45), (38, 42), (95, 105)];
    let mut before = vec![];
    for (a, b) in ranges {
        before.push(ledger(&app, &s.store, day(a), day(b)).await);
    }
    let mut c = app.conn().await;
    let n = fitorder::prepaid::ledger::close(&mut c, s.store.parse().unwrap(), day(-1), chrono_tz::Asia::Shanghai)
        .await
        .unwrap();
    assert_eq!(n, 20, "20 days ago through yesterday");
    drop(c);
    for ((a, b), want) in ranges.into_iter().zip(before) {
        assert_eq!(ledger(&app, &s.store, day(a), day(b)).await, want, "{a}..{b}");
    }
    // Both cards earn exactly their price over their 120 days; the short one its 3 days.
    let whole = ledger(&app, &s.store, day(-21), day(110)).await;
    let earned: i64 = whole.iter().map(|r| cents(r, "earnedCents")).sum();
    assert_eq!(earned, 60_001 * 2 + 3_001);
    assert_eq!(cents(whole.last().unwrap(), "balanceCents"), 0);
}
