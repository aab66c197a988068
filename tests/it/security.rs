//! Who may do what: every operation of the three clients against every role, with the example
//! variables, on seeded data. A refusal is FORBIDDEN (or UNAUTHENTICATED without a token); an
//! allowed operation may fail for other reasons (NOT_FOUND, ...), never for the role.

use serde_json::Value;

use crate::harness::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    Nobody,
    Member,
    Admin,
    Ops,
}

/// The roles refused each operation (besides Nobody, refused everything).
fn refused(op: &str) -> &'static [Who] {
    use Who::*;
    match op {
        // The member app's own operations: members and staff at the desk.
        "PlaceOrder" | "StartPayment" | "CheckIn" | "CancelMyOrder" | "CancelOrder" => &[Ops],
        "MyAccount" | "Catalog" | "MyOrders" | "MyOrder" | "Orders" | "OrderChain" | "Member" | "Memberships" => &[],
        // Staff views and ops actions.
        "Tickets"
        | "Compensations"
        | "AnomalyStats"
        | "ReconciliationRuns"
        | "DeadCompensations"
        | "OpenTickets"
        | "Anomalies"
        | "ReplayCompensation"
        | "ReplayDeadCompensations"
        | "ResolveTicket"
        | "Replay" => &[Member],
        // Everything else changes the catalog, money or orders: admins only.
        _ => &[Member, Ops],
    }
}

#[tokio::test]
async fn every_operation_against_every_role() {
    let app = TestApp::new().await;
    let seeded = {
        let mut c = app.conn().await;
        fitorder::seed::seed(&mut c).await.map_err(|e| e.message()).unwrap()
    };
    let member = seeded.member_ids[0].to_string();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("playground");
    let mut checked = 0;
    for (audience, doc) in [("member", MEMBER_OPS), ("admin", ADMIN_OPS), ("ops", OPS_OPS)] {
        let vars: Value =
            serde_json::from_str(&std::fs::read_to_string(root.join(format!("variables/{audience}.json"))).unwrap())
                .unwrap();
        for line in doc.lines() {
            let mut words = line.split_whitespace();
            let (Some(kind), Some(name)) = (words.next(), words.next()) else {
                continue;
            };
            if !["query", "mutation"].contains(&kind) {
                continue;
            }
            let name = name.split('(').next().unwrap().trim_end_matches('{');
            for who in [Who::Nobody, Who::Member, Who::Admin, Who::Ops] {
                let token = match who {
                    Who::Nobody => None,
                    Who::Member => Some(app.member_token(&member)),
                    Who::Admin => Some(app.admin_token()),
                    Who::Ops => Some(app.ops_token()),
                };
                let r = app
                    .gql_named(token.as_deref(), doc, Some(name), vars[name].clone())
                    .await;
                let codes: Vec<&str> = r["errors"]
                    .as_array()
                    .map(|e| e.iter().filter_map(|e| e["extensions"]["code"].as_str()).collect())
                    .unwrap_or_default();
                let ctx = format!("{name} as {who:?}: {r}");
                if who == Who::Nobody {
                    assert!(
                        !codes.is_empty() && codes.iter().all(|c| *c == "UNAUTHENTICATED"),
                        "{ctx}"
                    );
                } else if refused(name).contains(&who) {
                    assert_eq!(codes.first().copied(), Some("FORBIDDEN"), "{ctx}");
                } else {
                    assert!(
                        !codes.contains(&"FORBIDDEN") && !codes.contains(&"UNAUTHENTICATED"),
                        "{ctx}"
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 120, "{checked}");
}

#[tokio::test]
async fn fragment_and_alias_bombs_are_refused_before_they_run() {
    let app = TestApp::new().await;
    // A fragment that spreads itself through nested connections, many times over.
    let mut q = String::from("fragment F on Order { orderNo member { memberships { order { orderNo } } } }\nquery {");
    for i in 0..300 {
        q.push_str(&format!(" o{i}: orders(first: 100) {{ edges {{ node {{ ...F }} }} }}"));
    }
    q.push('}');
    let r = app.gql(Some(&app.admin_token()), &q, serde_json::json!({})).await;
    let msg = r["errors"][0]["message"].as_str().unwrap_or_default().to_lowercase();
    assert!(msg.contains("complex") || msg.contains("deep"), "{r}");
    assert!(r["data"].is_null());
}
