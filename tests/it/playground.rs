//! The playground's documents, with their example variables, run against seeded demo data as
//! the audience they are for: no document may fail validation (every error it gets is one of
//! the API's, with an `extensions.code`).

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
        fitorder::seed::seed(&mut c).await.map_err(|e| e.message()).unwrap()
    };
    let member = seeded.member_ids[0].to_string();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("playground");
    let mut ran = 0;
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
            for e in r.get("errors").and_then(|e| e.as_array()).into_iter().flatten() {
                assert!(e["extensions"]["code"].is_string(), "{audience} {name}: {e}");
            }
            ran += 1;
        }
    }
    assert!(ran >= 30, "ran {ran}");
}
