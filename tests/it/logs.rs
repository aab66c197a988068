//! JSON logs of a real `fitorder serve`: every line parses, no colours, no secrets, and the trace
//! id of a request finds its log lines — the request's and the outbox worker's that delivered
//! (here: killed) its effects — as well as its rows.

use fitorder::config::ExposeSecret;
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;

#[tokio::test]
async fn json_log_lines_carry_the_trace_id_of_the_rows_of_the_same_request() {
    let app = TestApp::new().await;
    app.expect_dead(); // no downstream runs: its grants end DEAD
    let s = app.studio(100_000, None, 3).await;
    // Nothing listens on port 9 (discard): every grant fails and, at one attempt, goes DEAD.
    let server = Fitorder::serve()
        .env("DATABASE_URL", &app.db_url)
        .env("FITORDER_JWT_SECRET", app.state.config.jwt_secret.expose_secret())
        .env("FITORDER_DOOR_ACCESS_URL", "http://127.0.0.1:9/door")
        .env("FITORDER_AI_ACCESS_URL", "http://127.0.0.1:9/ai")
        .env("FITORDER_MAX_ATTEMPTS", "1")
        .env(
            "FITORDER_ALERT_WEBHOOKS",
            "dingtalk:http://127.0.0.1:9/robot/send?access_token=TOKEN123#SECsupersecret",
        )
        .env("RUST_LOG", "info,fitorder=debug")
        .env_remove("FITORDER_LOG_FORMAT") // the default off a terminal: JSON
        .spawn();
    let http = reqwest::Client::new();
    let base = server.base();
    let ready = server.ready(&http, Duration::from_secs(20)).await;
    assert!(ready);
    let trace = format!("logtest{:025}", server.port());
    let r: Value = http
        .post(format!("{base}/graphql"))
        .bearer_auth(app.member_token(&s.member))
        .header("X-Trace-Id", &trace)
        .json(&json!({"query": "mutation($i: PlaceOrderInput!) { placeOrder(input: $i) { order { orderNo status } } }",
                      "variables": {"i": {"idempotencyKey": key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WALLET"}}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let no = r["data"]["placeOrder"]["order"]["orderNo"]
        .as_str()
        .unwrap()
        .to_string();
    // Wait for both events to go DEAD (and their alerts to be tried).
    for _ in 0..100 {
        if app.sql_i64("SELECT count(*) AS v FROM alert_attempts").await >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = server.stop();
    assert!(!text.contains('\u{1b}'), "no ANSI colours");
    for secret in [
        "SECsupersecret",
        "TOKEN123",
        app.state.config.jwt_secret.expose_secret(),
    ] {
        assert!(!text.contains(secret), "{secret} leaked into the log");
    }
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for l in &lines {
        for k in ["time", "level", "target", "message", "fields"] {
            assert!(l.get(k).is_some(), "{k} missing: {l}");
        }
    }
    let mine: Vec<&Value> = lines.iter().filter(|l| l["trace_id"] == trace.as_str()).collect();
    let messages: Vec<&str> = mine.iter().map(|l| l["message"].as_str().unwrap()).collect();
    // The request's own line, and the worker's, in another task, for the same chain.
    assert!(mine.iter().any(|l| l["span"] == "request"), "{messages:?}");
    assert!(
        mine.iter()
            .any(|l| l["span"] == "compensation" && l["message"] == "compensation event is DEAD"),
        "{messages:?}"
    );
    assert!(messages.iter().any(|m| m.starts_with("ALERT:")), "{messages:?}");
    assert!(
        mine.iter().any(|l| l["message"] == "exception ticket opened"
            && l["fields"]["order_no"].as_str().is_some_and(|o| o.contains(&no))),
        "{messages:?}"
    );
    // The same id finds the rows.
    let rows = app
        .sql_i64(&format!(
            "SELECT (SELECT count(*) FROM orders WHERE order_no = '{no}' AND trace_id = '{trace}')
                  + (SELECT count(*) FROM order_transitions WHERE trace_id = '{trace}')
                  + (SELECT count(*) FROM compensation_events WHERE trace_id = '{trace}')
                  + (SELECT count(*) FROM exception_tickets WHERE trace_id = '{trace}')
                  + (SELECT count(*) FROM alerts WHERE trace_id = '{trace}') AS v"
        ))
        .await;
    // order, its transition(s), two events, two tickets, two alerts.
    assert!(rows >= 1 + 1 + 2 + 2 + 2, "{rows}");
    // Lines outside any traced span have no trace id rather than a wrong one.
    assert!(lines
        .iter()
        .any(|l| l["message"] == "listening" && l.get("trace_id").is_none()));
}
