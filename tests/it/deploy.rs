//! deploy/: the Prometheus rules pass `promtool check rules` and their unit tests, and the
//! Grafana dashboard and the rules query only metric families the server exports, with the
//! type it exports them as.

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

use fitorder::http::metrics::FAMILIES;
use serde_json::json;

use crate::harness::*;

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy");

fn promtool() -> Option<&'static str> {
    Command::new("promtool")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| "promtool")
}

#[test]
fn promtool_checks_and_tests_the_alerting_rules() {
    let Some(promtool) = promtool() else {
        if std::env::var_os("CI").is_some() {
            panic!("CI must check the rules: apt-get install prometheus (promtool)");
        }
        eprintln!("SKIPPED promtool_checks_and_tests_the_alerting_rules: promtool is not installed (apt-get install prometheus)");
        return;
    };
    let dir = format!("{DEPLOY}/prometheus");
    for args in [
        vec!["check", "rules", "fitorder-rules.yml"],
        vec!["test", "rules", "fitorder-rules.test.yml"],
        vec!["check", "config", "prometheus.yml"],
    ] {
        let out = Command::new(promtool).args(&args).current_dir(&dir).output().unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The `fitorder_…` names in a PromQL text.
fn names_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("fitorder_") {
        let start = i + at;
        let mut end = start;
        while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
            end += 1;
        }
        let before_ok = start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_');
        if before_ok {
            out.insert(expr[start..end].to_string());
        }
        i = end;
    }
    out
}

/// A queried series name → its family (summaries add `_sum` and `_count`).
fn family_of(name: &str) -> Option<&'static (&'static str, &'static str, &'static [&'static str])> {
    FAMILIES.iter().find(|(f, ty, _)| {
        *f == name || (*ty == "summary" && [format!("{f}_sum"), format!("{f}_count")].iter().any(|s| s == name))
    })
}

fn dashboard_exprs() -> Vec<String> {
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{DEPLOY}/grafana/fitorder-dashboard.json")).unwrap())
            .unwrap();
    let mut out = vec![];
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    out
}

#[test]
fn the_dashboard_and_the_rules_query_only_exported_families_and_the_list_matches_the_code() {
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 20, "{}", exprs.len());
    let rules = std::fs::read_to_string(format!("{DEPLOY}/prometheus/fitorder-rules.yml")).unwrap();
    let mut used = BTreeSet::new();
    for e in exprs.iter().chain(std::iter::once(&rules)) {
        used.extend(names_in(e));
    }
    let unknown: Vec<_> = used.iter().filter(|n| family_of(n).is_none()).collect();
    assert!(unknown.is_empty(), "queried but not exported: {unknown:?}");
    // Quantiles are asked of summaries only (the exporter renders histograms as summaries).
    for e in &exprs {
        if e.contains("quantile=") {
            for n in names_in(e) {
                assert_eq!(family_of(&n).unwrap().1, "summary", "{n} in {e}");
            }
        }
        assert!(!e.contains("histogram_quantile") && !e.contains("_bucket"), "{e}");
    }
    // Every family the dashboard is about is charted.
    for f in [
        "fitorder_callbacks_total",
        "fitorder_transitions_total",
        "fitorder_compensation_backlog",
        "fitorder_outbox_delivery_seconds",
        "fitorder_orders_expired_total",
        "fitorder_reconciliation_findings_total",
        "fitorder_subscribers",
        "fitorder_db_pool_available",
    ] {
        assert!(used.contains(f), "{f} is not charted");
    }
    // FAMILIES is what the code records: every call site's name, and nothing else.
    let mut recorded = BTreeSet::new();
    // The binary's sources and every layer's (the bench records nothing of the server's).
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut stack = vec![root.join("src")];
    for c in std::fs::read_dir(root.join("crates")).unwrap() {
        let c = c.unwrap().path();
        if !c.ends_with("bench") {
            stack.push(c.join("src"));
        }
    }
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                for macro_ in ["counter!(\"", "gauge!(\"", "histogram!(\""] {
                    for (at, _) in text.match_indices(macro_) {
                        let rest = &text[at + macro_.len()..];
                        recorded.insert(rest[..rest.find('"').unwrap()].to_string());
                    }
                }
            }
        }
    }
    let listed: BTreeSet<String> = FAMILIES.iter().map(|(f, ..)| f.to_string()).collect();
    assert_eq!(recorded, listed);
}

#[tokio::test]
async fn a_running_server_exports_the_families_with_the_listed_types() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    app.buy(&s.member, &s.store, json!({"classPackId": s.pack}), "WALLET")
        .await;
    fitorder::compensation::worker::Worker::new(app.state.clone())
        .run_once()
        .await
        .unwrap();
    let (status, body) = app.metrics().await;
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    let types: HashMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    for (name, ty) in &types {
        if name.starts_with("fitorder_") {
            let f = FAMILIES
                .iter()
                .find(|(f, ..)| f == name)
                .unwrap_or_else(|| panic!("{name} is exported but not in FAMILIES"));
            assert_eq!(f.1, *ty, "{name}");
        }
    }
    // What this test itself caused is there, with the labels the dashboard groups by.
    for (name, labels) in [
        ("fitorder_orders_placed_total", vec!["method"]),
        ("fitorder_transitions_total", vec!["from", "to"]),
        ("fitorder_compensation_backlog", vec!["status"]),
        ("fitorder_compensation_attempts_total", vec!["kind", "outcome"]),
        ("fitorder_outbox_delivery_seconds", vec!["kind"]),
        ("fitorder_ready", vec![]),
        ("fitorder_db_pool_available", vec![]),
        ("fitorder_http_requests_total", vec!["route", "method", "status"]),
    ] {
        assert!(types.contains_key(name), "{name} not exported");
        let f = FAMILIES.iter().find(|(f, ..)| *f == name).unwrap();
        let sample = text
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .unwrap();
        for l in labels {
            assert!(
                f.2.contains(&l) && sample.contains(&format!("{l}=\"")),
                "{name} lacks {l}: {sample}"
            );
        }
    }
    assert!(text.contains("fitorder_ready 1"), "the database answered");
}
