//! The front desk's everyday (issue 39, contract "The front desk and the console's everyday"):
//! finding members by phone (whole or last four), name part and store, as each role may;
//! a member's wallet movements with the balance after each; the catalog's changes (price,
//! stock, retirement) holding for new orders only and under the store's prepaid rules. Calls go
//! through the contract's own operations (`playground/operations/next/admin.graphql`).

use fitorder::config::ExposeSecret;
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;
use crate::prepaid::{ext, ok, operation};

const NEXT_ADMIN: &str = include_str!("../../playground/operations/next/admin.graphql");

async fn op(app: &TestApp, token: &str, name: &str, vars: Value) -> Value {
    app.gql(Some(token), &operation(NEXT_ADMIN, name), vars).await
}

fn limited_admin(app: &TestApp, store: &str) -> String {
    fitorder::auth::issue_token(
        app.state.config.jwt_secret.expose_secret(),
        fitorder::auth::Role::Admin,
        "desk-of-one-store",
        Some(vec![store.to_string()]),
        Duration::from_secs(600),
    )
}

async fn member(app: &TestApp, store: &str, name: &str, phone: &str) -> String {
    app.admin(
        "mutation($i: CreateMemberInput!) { createMember(input: $i) { id } }",
        json!({"i": {"storeId": store, "name": name, "phone": phone}}),
    )
    .await["createMember"]["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The ids a FindMembers answer lists, in its order.
fn ids(r: &Value) -> Vec<String> {
    ok(r)["members"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["node"]["id"].as_str().unwrap().to_string())
        .collect()
}

async fn find(app: &TestApp, token: &str, filter: Value) -> Value {
    op(app, token, "FindMembers", json!({"filter": filter, "first": 50})).await
}

#[tokio::test]
async fn members_are_found_by_phone_name_and_store_as_each_role_may() {
    let app = TestApp::new().await;
    let a = app.studio(0, None, 1).await;
    let b = app.studio(0, None, 1).await;
    let zhang = member(&app, &a.store, "Zhang Wei", "13800001234").await;
    let li = member(&app, &a.store, "Li Lei", "13700001234").await;
    let sanfeng = member(&app, &a.store, "张三丰", "13900005678").await;
    let wei_b = member(&app, &b.store, "WEI Zhang", "+8613600001234").await;
    let admin = app.admin_token();

    // The last four digits: every store's, newest first.
    let r = find(&app, &admin, json!({"phone": "1234"})).await;
    assert_eq!(ids(&r), [wei_b.as_str(), li.as_str(), zhang.as_str()], "{r}");
    assert_eq!(ok(&r)["members"]["totalCount"], 3);
    // The whole number, as the desk may type it (spaces, dashes), or with its country code.
    let r = find(&app, &admin, json!({"phone": "138-0000 1234"})).await;
    assert_eq!(ids(&r), [zhang.as_str()], "{r}");
    let node = &ok(&r)["members"]["edges"][0]["node"];
    assert_eq!(node["phone"], "13800001234");
    assert_eq!(node["store"]["id"], a.store.as_str());
    assert_eq!(node["wallet"]["balanceCents"], 0);
    let r = find(&app, &admin, json!({"phone": "+8613600001234"})).await;
    assert_eq!(ids(&r), [wei_b.as_str()]);
    // A number nobody has: nobody, though its last four are common.
    let r = find(&app, &admin, json!({"phone": "13500001234"})).await;
    assert_eq!(ids(&r), Vec::<String>::new());
    // Any part of the name: case-insensitive for Latin, a Chinese substring.
    let r = find(&app, &admin, json!({"name": "wei"})).await;
    assert_eq!(ids(&r), [wei_b.as_str(), zhang.as_str()]);
    let r = find(&app, &admin, json!({"name": "三丰"})).await;
    assert_eq!(ids(&r), [sanfeng.as_str()]);
    let r = find(&app, &admin, json!({"name": "张三丰"})).await;
    assert_eq!(ids(&r), [sanfeng.as_str()]);
    // LIKE's wildcards are letters here, not wildcards.
    let r = find(&app, &admin, json!({"name": "W%i"})).await;
    assert_eq!(ids(&r), Vec::<String>::new());
    let r = find(&app, &admin, json!({"name": "__"})).await;
    assert_eq!(ids(&r), Vec::<String>::new());
    // Filters narrow together; the store narrows.
    let r = find(&app, &admin, json!({"phone": "1234", "storeId": a.store})).await;
    assert_eq!(ids(&r), [li.as_str(), zhang.as_str()]);
    let r = find(&app, &admin, json!({"phone": "1234", "name": "zhang"})).await;
    assert_eq!(ids(&r), [wei_b.as_str(), zhang.as_str()]);

    // A store-limited admin finds only their stores' members, whatever the filter says.
    let limited = limited_admin(&app, &a.store);
    let r = find(&app, &limited, json!({"phone": "1234"})).await;
    assert_eq!(ids(&r), [li.as_str(), zhang.as_str()]);
    let r = find(&app, &limited, json!({"phone": "1234", "storeId": b.store})).await;
    assert_eq!(ids(&r), Vec::<String>::new());
    assert_eq!(ok(&r)["members"]["totalCount"], 0);

    // Ops find them too, with the phone masked as the console shows it; admins see it whole.
    let r = find(&app, &app.ops_token(), json!({"phone": "1234", "storeId": a.store})).await;
    let phones: Vec<&str> = ok(&r)["members"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["node"]["phone"].as_str().unwrap())
        .collect();
    assert_eq!(phones, ["137****1234", "138****1234"]);
    // Members see nobody.
    let r = find(&app, &app.member_token(&zhang), json!({"phone": "1234"})).await;
    assert_eq!(error_code(&r), "FORBIDDEN", "{r}");
    assert!(r["data"].is_null(), "{r}");
    let r = app.gql(None, &operation(NEXT_ADMIN, "FindMembers"), json!({})).await;
    assert_eq!(error_code(&r), "UNAUTHENTICATED", "{r}");

    // What cannot be searched for is refused with its reason.
    for bad in [
        json!({"phone": "123"}),
        json!({"phone": "12a4"}),
        json!({"phone": "+1234"}),
        json!({"phone": "1".repeat(21)}),
        json!({"phone": "13800001234; --"}),
        json!({"name": "w"}),
        json!({"name": "张"}),
        json!({"name": "x".repeat(101)}),
    ] {
        let r = find(&app, &admin, bad.clone()).await;
        assert_eq!(error_code(&r), "BAD_USER_INPUT", "{bad}: {r}");
        assert_eq!(ext(&r)["reason"], "INVALID_FILTER", "{bad}: {r}");
    }
    let r = find(&app, &admin, json!({"storeId": "x"})).await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT");
    // Blank fields are no filter.
    let r = find(&app, &admin, json!({"phone": " ", "name": ""})).await;
    assert_eq!(ok(&r)["members"]["totalCount"], 6);
}

#[tokio::test]
async fn an_empty_filter_pages_through_every_member_once() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 1).await;
    let mut made = vec![s.member.clone()];
    for i in 0..6 {
        made.push(member(&app, &s.store, &format!("Guest {i}"), &format!("1500000{i:04}")).await);
    }
    made.reverse();
    let admin = app.admin_token();
    let doc = operation(NEXT_ADMIN, "FindMembers");
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let r = app
            .gql(Some(&admin), &doc, json!({"filter": null, "first": 3, "after": after}))
            .await;
        let page = &ok(&r)["members"];
        assert_eq!(page["totalCount"], 7);
        seen.extend(ids(&r));
        if page["pageInfo"]["hasNextPage"] == false {
            break;
        }
        after = Some(page["pageInfo"]["endCursor"].as_str().unwrap().to_string());
        assert!(seen.len() < 10, "paging does not end: {seen:?}");
    }
    assert_eq!(seen, made);
    // No page is unbounded: the size is capped as every connection's, a negative one refused,
    // a cursor not ours refused.
    let r = app.gql(Some(&admin), &doc, json!({"first": 100_000})).await;
    assert_eq!(ids(&r).len(), 7);
    let r = app.gql(Some(&admin), &doc, json!({"first": -1})).await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT");
    let r = app.gql(Some(&admin), &doc, json!({"after": "not-a-cursor"})).await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT");
    // The index behind the last four digits is there for the planner (the bench shows the
    // plan on a million members).
    assert_eq!(
        app.sql_i64(
            "SELECT count(*) AS v FROM pg_indexes WHERE indexname IN ('members_phone_last4', 'members_name_trgm')"
        )
        .await,
        2
    );
}

const WALLET_PAGE: &str = "query($id: ID!, $first: Int, $after: String) { member(id: $id) {
    wallet { balanceCents frozenCents }
    walletEntries(first: $first, after: $after) {
      totalCount pageInfo { hasNextPage endCursor }
      edges { node { kind amountCents balanceAfterCents reference orderNo traceId } } } } }";

#[tokio::test]
async fn wallet_entries_explain_the_balance_newest_first() {
    let app = TestApp::new().await;
    let s = app.studio(30_000, None, 3).await;
    // A wallet payment, refunded whole; a MIXED order whose wallet part is frozen, then paid.
    let paid = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WALLET")
        .await;
    let r = app
        .admin(REFUND, json!({"orderNo": paid, "reason": "changed mind"}))
        .await;
    assert_eq!(r["refundOrder"]["refundAmountCents"], 10_000);
    let placed = app
        .place(
            &s.member,
            json!({"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack},
                   "paymentMethod": "MIXED", "walletAmountCents": 4000}),
        )
        .await;
    let mixed = placed["order"]["orderNo"].as_str().unwrap().to_string();
    crate::orders_flow::pay_online(&app, &mixed, "4200000077").await;

    let r = op(
        &app,
        &app.admin_token(),
        "MemberWallet",
        json!({"id": s.member, "first": 10}),
    )
    .await;
    let m = &ok(&r)["member"];
    assert_eq!(m["wallet"], json!({"balanceCents": 26_000, "frozenCents": 0}));
    assert_eq!(m["walletEntries"]["totalCount"], 5);
    let rows: Vec<(String, i64, i64, Value, Value)> = m["walletEntries"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let n = &e["node"];
            assert!(!n["traceId"].as_str().unwrap().is_empty(), "{n}");
            assert!(n["at"].is_string(), "{n}");
            (
                n["kind"].as_str().unwrap().to_string(),
                n["amountCents"].as_i64().unwrap(),
                n["balanceAfterCents"].as_i64().unwrap(),
                n["orderNo"].clone(),
                n["reference"].clone(),
            )
        })
        .collect();
    let row = |k: &str, a: i64, b: i64, o: Value, r: Value| (k.to_string(), a, b, o, r);
    assert_eq!(
        rows,
        [
            // The frozen part taken: the spendable balance stays.
            row("PAYMENT", -4000, 26_000, json!(mixed), json!(null)),
            row("FREEZE", -4000, 26_000, json!(mixed), json!(null)),
            row("REFUND", 10_000, 30_000, json!(paid), json!(null)),
            row("PAYMENT", -10_000, 20_000, json!(paid), json!(null)),
            row(
                "TOP_UP",
                30_000,
                30_000,
                json!(null),
                json!(format!("init-{}", s.member))
            ),
        ]
    );
    // The newest row's balance is the wallet's; the rows' trace ids are their requests'.
    assert_eq!(rows[0].2, m["wallet"]["balanceCents"].as_i64().unwrap());
    let refund_trace = app
        .sql_i64(&format!(
            "SELECT count(*) AS v FROM wallet_ledger l JOIN order_transitions t ON t.trace_id = l.trace_id
              JOIN orders o ON o.id = t.order_id
              WHERE l.kind = 'REFUND' AND o.order_no = '{paid}' AND t.to_status = 'REFUNDED'"
        ))
        .await;
    assert_eq!(refund_trace, 1);

    // Paged, every row once, in the same order.
    let mut paged = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let r = app
            .gql(
                Some(&app.admin_token()),
                WALLET_PAGE,
                json!({"id": s.member, "first": 2, "after": after}),
            )
            .await;
        let page = &ok(&r)["member"]["walletEntries"];
        for e in page["edges"].as_array().unwrap() {
            paged.push(e["node"]["balanceAfterCents"].as_i64().unwrap());
        }
        if page["pageInfo"]["hasNextPage"] == false {
            break;
        }
        after = Some(page["pageInfo"]["endCursor"].as_str().unwrap().to_string());
    }
    assert_eq!(paged, rows.iter().map(|r| r.2).collect::<Vec<_>>());

    // Who reads it: the member themself, ops, an admin of the store; not another member, not
    // an admin of another store.
    let doc = operation(NEXT_ADMIN, "MemberWallet");
    let vars = json!({"id": s.member, "first": 1});
    for token in [
        app.member_token(&s.member),
        app.ops_token(),
        limited_admin(&app, &s.store),
    ] {
        let r = app.gql(Some(&token), &doc, vars.clone()).await;
        assert_eq!(ok(&r)["member"]["walletEntries"]["totalCount"], 5, "{r}");
    }
    let other = app.studio(100, None, 1).await;
    for token in [app.member_token(&other.member), limited_admin(&app, &other.store)] {
        let r = app.gql(Some(&token), &doc, vars.clone()).await;
        assert_eq!(ok(&r)["member"], json!(null), "{r}");
    }
    // Another member's wallet, even reached through an order of theirs, is not read by one.
    let r = app
        .gql(
            Some(&app.member_token(&other.member)),
            "query($no: String!) { order(orderNo: $no) { member { walletEntries { totalCount } } } }",
            json!({"no": paid}),
        )
        .await;
    assert_eq!(r["data"]["order"], json!(null), "{r}");
}

const PLACED_ITEM: &str = "query($no: String!) { order(orderNo: $no) { itemName amountCents status } }";

#[tokio::test]
async fn catalog_changes_hold_for_new_orders_and_retired_items_are_sold_no_more() {
    let app = TestApp::new().await;
    let s = app.studio(200_000, Some(10), 1).await;
    let admin = app.admin_token();
    let before = app
        .buy(&s.member, &s.store, json!({"membershipPlanId": s.plan}), "WALLET")
        .await;
    let pack_before = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WALLET")
        .await;

    // A new name and price: the order placed before keeps its own.
    let r = op(
        &app,
        &admin,
        "UpdateMembershipPlan",
        json!({"id": s.plan, "input": {"name": "Monthly (new)", "priceCents": 25_000}}),
    )
    .await;
    assert_eq!(
        ok(&r)["updateMembershipPlan"],
        json!({"id": s.plan, "name": "Monthly (new)", "priceCents": 25_000, "durationDays": 30, "retired": false})
    );
    let r = app.admin(PLACED_ITEM, json!({"no": before})).await;
    assert_eq!(
        r["order"],
        json!({"itemName": "Monthly", "amountCents": 30_000, "status": "PAID"})
    );
    let after = app
        .buy(&s.member, &s.store, json!({"membershipPlanId": s.plan}), "WALLET")
        .await;
    let r = app.admin(PLACED_ITEM, json!({"no": after})).await;
    assert_eq!(r["order"]["amountCents"], 25_000);
    assert_eq!(r["order"]["itemName"], "Monthly (new)");
    // Freezing limits.
    let r = op(
        &app,
        &admin,
        "UpdateMembershipPlan",
        json!({"id": s.plan, "input": {"maxFreezeDays": 10, "maxFreezes": 1}}),
    )
    .await;
    ok(&r);
    let limits = app
        .sql_i64(&format!(
            "SELECT (max_freeze_days * 100 + max_freezes)::bigint AS v FROM membership_plans WHERE id = {}",
            s.plan
        ))
        .await;
    assert_eq!(limits, 1001);

    // Refused: a price not positive, freezing limits out of range, a stock below zero, both a
    // stock and no limit; nothing changes.
    for (name, input) in [
        ("UpdateMembershipPlan", json!({"priceCents": -100})),
        ("UpdateMembershipPlan", json!({"priceCents": 0})),
        ("UpdateMembershipPlan", json!({"name": " "})),
        ("UpdateMembershipPlan", json!({"maxFreezes": -1})),
        ("UpdateClassPack", json!({"priceCents": -1})),
        ("UpdateClassPack", json!({"stock": -1})),
        ("UpdateClassPack", json!({"stock": 3, "unlimitedStock": true})),
    ] {
        let id = if name == "UpdateMembershipPlan" {
            &s.plan
        } else {
            &s.pack
        };
        let r = op(&app, &admin, name, json!({"id": id, "input": input})).await;
        assert_eq!(error_code(&r), "BAD_USER_INPUT", "{name} {input}: {r}");
    }
    let r = app.admin(PLACED_ITEM, json!({"no": after})).await;
    assert_eq!(r["order"]["amountCents"], 25_000);

    // The pack's stock: units left on sale, then no limit.
    let r = op(
        &app,
        &admin,
        "UpdateClassPack",
        json!({"id": s.pack, "input": {"stock": 5, "priceCents": 12_000}}),
    )
    .await;
    assert_eq!(
        ok(&r)["updateClassPack"],
        json!({"id": s.pack, "name": "Ten", "priceCents": 12_000, "remainingStock": 5, "retired": false})
    );
    let r = op(
        &app,
        &admin,
        "UpdateClassPack",
        json!({"id": s.pack, "input": {"unlimitedStock": true}}),
    )
    .await;
    assert_eq!(ok(&r)["updateClassPack"]["remainingStock"], json!(null));

    // Retired: not in the catalog members read, refused when ordered, kept on its orders;
    // retiring again answers the same; changing it is refused.
    let r = op(&app, &admin, "RetireClassPack", json!({"id": s.pack})).await;
    assert_eq!(ok(&r)["retireClassPack"], json!({"id": s.pack, "retired": true}));
    let r = op(&app, &admin, "RetireMembershipPlan", json!({"id": s.plan})).await;
    assert_eq!(ok(&r)["retireMembershipPlan"], json!({"id": s.plan, "retired": true}));
    let audits = app.sql_i64("SELECT count(*) AS v FROM catalog_changes").await;
    let r = op(&app, &admin, "RetireClassPack", json!({"id": s.pack})).await;
    assert_eq!(ok(&r)["retireClassPack"]["retired"], true);
    assert_eq!(app.sql_i64("SELECT count(*) AS v FROM catalog_changes").await, audits);
    let r = app
        .op(
            &app.member_token(&s.member),
            MEMBER_OPS,
            "Catalog",
            json!({"storeId": s.store}),
        )
        .await;
    assert_eq!(r["data"]["catalog"]["membershipPlans"], json!([]), "{r}");
    assert_eq!(r["data"]["catalog"]["classPacks"], json!([]), "{r}");
    assert_eq!(r["data"]["catalog"]["coachSlots"].as_array().unwrap().len(), 1);
    for item in [json!({"classPackId": s.pack}), json!({"membershipPlanId": s.plan})] {
        let r = app
            .op(
                &app.member_token(&s.member),
                MEMBER_OPS,
                "PlaceOrder",
                json!({"input": {"idempotencyKey": key(), "storeId": s.store, "item": item, "paymentMethod": "WALLET"}}),
            )
            .await;
        assert_eq!(error_code(&r), "BAD_USER_INPUT", "{r}");
        assert_eq!(ext(&r)["reason"], "RETIRED", "{r}");
    }
    let r = app.admin(PLACED_ITEM, json!({"no": pack_before})).await;
    assert_eq!(
        r["order"],
        json!({"itemName": "Ten", "amountCents": 10_000, "status": "PAID"})
    );
    let r = app
        .admin(
            "query($id: ID!) { memberships(filter: {memberId: $id}) { edges { node { plan { id retired } } } } }",
            json!({"id": s.member}),
        )
        .await;
    assert_eq!(
        r["memberships"]["edges"][0]["node"]["plan"],
        json!({"id": s.plan, "retired": true})
    );
    for (name, id) in [("UpdateClassPack", &s.pack), ("UpdateMembershipPlan", &s.plan)] {
        let r = op(&app, &admin, name, json!({"id": id, "input": {"name": "Back again"}})).await;
        assert_eq!(error_code(&r), "BAD_USER_INPUT", "{r}");
        assert_eq!(ext(&r)["reason"], "RETIRED", "{r}");
    }
    // Every change that changed something has its audit row, by whom and under which trace.
    let rows = app
        .sql_i64("SELECT count(*) AS v FROM catalog_changes WHERE actor = 'admin:staff-1' AND trace_id <> ''")
        .await;
    assert_eq!(rows, audits);
    assert_eq!(audits, 6, "2 plan updates, 2 pack updates, 2 retirements");
    let r = op(&app, &admin, "RetireClassPack", json!({"id": "999999"})).await;
    assert_eq!(error_code(&r), "NOT_FOUND", "{r}");
}

#[tokio::test]
async fn catalog_changes_are_admins_of_the_store_and_the_prepaid_rules_hold() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 1).await;
    let other = app.studio(0, None, 1).await;
    let vars = json!({"id": s.plan, "input": {"priceCents": 31_000}});
    for token in [
        app.ops_token(),
        app.member_token(&s.member),
        limited_admin(&app, &other.store),
    ] {
        for (name, v) in [
            ("UpdateMembershipPlan", vars.clone()),
            ("RetireMembershipPlan", json!({"id": s.plan})),
            ("UpdateClassPack", json!({"id": s.pack, "input": {"stock": 1}})),
            ("RetireClassPack", json!({"id": s.pack})),
        ] {
            let r = op(&app, &token, name, v).await;
            assert_eq!(error_code(&r), "FORBIDDEN", "{name}: {r}");
        }
    }
    let r = op(&app, &limited_admin(&app, &s.store), "UpdateMembershipPlan", vars).await;
    assert_eq!(ok(&r)["updateMembershipPlan"]["priceCents"], 31_000);

    // A store under Shanghai's rules: a card's price over membershipMaxCents is refused on
    // update as on creation, with the same reason and limit; the plan keeps its price.
    let r = crate::prepaid::admin_op(
        &app,
        "SetPrepaidRules",
        json!({"storeId": s.store, "input": {"preset": "SHANGHAI_2025"}}),
    )
    .await;
    let max = ok(&r)["setPrepaidRules"]["prepaidRules"]["membershipMaxCents"]
        .as_i64()
        .unwrap();
    let over = max + 1;
    let created = app
        .gql(
            Some(&app.admin_token()),
            "mutation($i: CreateMembershipPlanInput!) { createMembershipPlan(input: $i) { id } }",
            json!({"i": {"storeId": s.store, "name": "Dear", "durationDays": 30, "priceCents": over}}),
        )
        .await;
    let updated = op(
        &app,
        &app.admin_token(),
        "UpdateMembershipPlan",
        json!({"id": s.plan, "input": {"priceCents": over}}),
    )
    .await;
    assert_eq!(error_code(&updated), "BAD_USER_INPUT", "{updated}");
    assert_eq!(ext(&updated)["reason"], "PREPAID_LIMIT", "{updated}");
    assert_eq!(ext(&updated), ext(&created), "{updated} vs {created}");
    let r = op(
        &app,
        &app.admin_token(),
        "UpdateMembershipPlan",
        json!({"id": s.plan, "input": {"priceCents": max}}),
    )
    .await;
    assert_eq!(ok(&r)["updateMembershipPlan"]["priceCents"], max);
    // The pack's sessions price cap likewise.
    let sessions_max = app
        .sql_i64(&format!(
            "SELECT sessions_max_cents AS v FROM prepaid_rules WHERE store_id = {}",
            s.store
        ))
        .await;
    let r = op(
        &app,
        &app.admin_token(),
        "UpdateClassPack",
        json!({"id": s.pack, "input": {"priceCents": sessions_max + 1}}),
    )
    .await;
    assert_eq!(ext(&r)["reason"], "PREPAID_LIMIT", "{r}");
    assert_eq!(
        app.sql_i64(&format!(
            "SELECT price_cents AS v FROM class_packs WHERE id = {}",
            s.pack
        ))
        .await,
        10_000
    );
}
