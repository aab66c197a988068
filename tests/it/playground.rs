//! The playground's documents, with their example variables, run against seeded demo data as
//! the audience they are for: each example answers exactly what is listed for it (data, or the
//! API's error with its code); a document that stopped validating answers BAD_USER_INPUT and
//! fails here.

use serde_json::Value;

use crate::harness::*;

fn operations(doc: &str) -> Vec<(String, String)> {
    doc.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let kind = words.next()?;
            if !["query", "mutation", "subscription"].contains(&kind) {
                return None;
            }
            let name = words.next()?.split('(').next()?.trim_end_matches('{').to_string();
            Some((kind.to_string(), name))
        })
        .collect()
}

#[tokio::test]
async fn every_playground_operation_runs_for_its_audience() {
    let app = TestApp::new().await;
    let seeded = {
        let mut c = app.conn().await;
        fitorder::dev::seed::seed(&mut c)
            .await
            .map_err(|e| e.message())
            .unwrap()
    };
    let member = seeded.member_ids[0].to_string();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("playground");
    let mut ran = Vec::new();
    for (audience, doc, token) in [
        ("member", MEMBER_OPS, app.member_token(&member)),
        ("admin", ADMIN_OPS, app.admin_token()),
        ("ops", OPS_OPS, app.ops_token()),
    ] {
        let vars: Value =
            serde_json::from_str(&std::fs::read_to_string(root.join(format!("variables/{audience}.json"))).unwrap())
                .unwrap();
        for (kind, name) in operations(doc) {
            assert!(
                vars.get(&name).is_some(),
                "playground/variables/{audience}.json has no example for {name}"
            );
            if kind == "subscription" {
                continue; // over WebSocket: see the compensation tests
            }
            let r = app.op(&token, doc, &name, vars[&name].clone()).await;
            let got = outcome(&r);
            ran.push((audience, name.clone(), got, r));
        }
    }
    let mut wrong = Vec::new();
    for (audience, name, got, r) in &ran {
        match EXPECTED.iter().find(|(a, n, _)| a == audience && n == name) {
            Some((_, _, want)) if want == got => {}
            Some((_, _, want)) => wrong.push(format!("{audience} {name}: expected {want}, got {got}: {r}")),
            None => wrong.push(format!("{audience} {name}: no expected outcome listed (got {got})")),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Every listed example ran (none was dropped from the documents unnoticed).
    assert_eq!(ran.len(), EXPECTED.len());
}

/// `OK` (no error, every field asked for answered), `NULL` (no error, a field answered null:
/// the example names nothing the demo data has) or the error's code (`NONE` if it has none).
fn outcome(r: &Value) -> String {
    match r.get("errors").and_then(|e| e.as_array()) {
        None => match r["data"].as_object() {
            Some(fields) if !fields.is_empty() && fields.values().all(|v| !v.is_null()) => "OK".into(),
            Some(_) => "NULL".into(),
            None => "NO DATA".into(),
        },
        Some(errors) => errors[0]["extensions"]["code"].as_str().unwrap_or("NONE").to_string(),
    }
}

/// What each example answers its audience on the seeded demo data. The demo data has two
/// studios (store 1, member 1, class pack 1, …) and no orders: the examples that name order
/// FO202611300000000001, compensation event 1 or ticket 1 are answered as not found (or null for
/// a member's own order lookup), never refused as invalid.
const EXPECTED: &[(&str, &str, &str)] = &[
    // WeChat sign-in is not configured in this test: the provider is unavailable. A made-up
    // refresh token is refused; signing out with one ends nothing (false).
    ("member", "SignInWithWechat", "INTERNAL"),
    ("member", "RefreshSession", "UNAUTHENTICATED"),
    ("member", "SignOut", "OK"),
    ("member", "MyAccount", "OK"),
    ("member", "Catalog", "OK"),
    // WECHAT_NATIVE at the test's provider sandbox: placed, and the trade opened.
    ("member", "PlaceOrder", "OK"),
    ("member", "StartPayment", "NOT_FOUND"),
    ("member", "MyOrders", "OK"),
    ("member", "MyOrder", "NULL"),
    ("member", "CancelMyOrder", "NOT_FOUND"),
    ("member", "CheckIn", "NOT_FOUND"),
    ("admin", "CreateStore", "OK"),
    ("admin", "CreateMember", "OK"),
    ("admin", "CreateMembershipPlan", "OK"),
    ("admin", "CreateClassPack", "OK"),
    ("admin", "CreateCoachSlot", "OK"),
    ("admin", "TopUpWallet", "OK"),
    ("admin", "Orders", "OK"),
    ("admin", "OrderChain", "NULL"),
    ("admin", "Member", "OK"),
    ("admin", "Memberships", "OK"),
    ("admin", "Tickets", "OK"),
    ("admin", "Compensations", "OK"),
    ("admin", "AnomalyStats", "OK"),
    ("admin", "ReconciliationRuns", "OK"),
    ("admin", "ConfirmOfflinePayment", "NOT_FOUND"),
    ("admin", "CancelOrder", "NOT_FOUND"),
    ("admin", "RefundOrder", "NOT_FOUND"),
    ("admin", "ReplayCompensation", "NOT_FOUND"),
    ("admin", "ReplayDeadCompensations", "NOT_FOUND"),
    ("admin", "ResolveTicket", "NOT_FOUND"),
    // No bill for that day in the statement directory: a run that says so, not an error.
    ("admin", "RunReconciliation", "OK"),
    ("ops", "DeadCompensations", "OK"),
    ("ops", "OpenTickets", "OK"),
    ("ops", "Anomalies", "OK"),
    ("ops", "Replay", "NOT_FOUND"),
];
