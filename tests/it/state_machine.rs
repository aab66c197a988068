//! The state machine, table-driven: every status against every requested change, for every
//! actor, through the API; and the database trigger refusing hand-written illegal UPDATEs.

use diesel_async::{AsyncConnection, RunQueryDsl};
use fitorder::domain::OrderStatus;
use serde_json::json;

use crate::harness::*;

/// An OFFLINE class-pack order brought to `status` through the real operations.
async fn order_in(app: &TestApp, s: &Studio, status: OrderStatus) -> String {
    let no = app
        .buy(&s.member, &s.store, json!({"classPackId": s.pack}), "OFFLINE")
        .await;
    let admin = app.admin_token();
    let confirm = || async {
        app.ok(&admin, CONFIRM_OFFLINE, json!({"orderNo": no, "reference": "R1"}))
            .await;
    };
    let check_in = |n: i32| {
        let no = no.clone();
        async move {
            app.ok(
                &app.member_token(&s.member),
                CHECK_IN,
                json!({"input": {"orderNo": no, "consumeTxnNo": key(), "sessions": n}}),
            )
            .await;
        }
    };
    match status {
        OrderStatus::WaitPay => {}
        OrderStatus::Paid => confirm().await,
        OrderStatus::Consuming => {
            confirm().await;
            check_in(1).await;
        }
        OrderStatus::Consumed => {
            confirm().await;
            check_in(10).await;
        }
        OrderStatus::Canceled => {
            app.ok(&admin, CANCEL, json!({"orderNo": no})).await;
        }
        OrderStatus::Refunded => {
            confirm().await;
            app.ok(&admin, REFUND, json!({"orderNo": no, "reason": "test"})).await;
        }
    }
    assert_eq!(app.order(&no).await["status"], status.as_str());
    no
}

#[derive(Clone, Copy, Debug)]
enum Who {
    Member,
    Admin,
    Ops,
}

#[tokio::test]
async fn every_change_for_every_actor_from_every_status() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 5).await;
    for from in OrderStatus::ALL {
        for who in [Who::Member, Who::Admin, Who::Ops] {
            let token = match who {
                Who::Member => app.member_token(&s.member),
                Who::Admin => app.admin_token(),
                Who::Ops => app.ops_token(),
            };
            // (operation, target status, document, variables)
            for (op, to) in [
                ("cancel", OrderStatus::Canceled),
                ("refund", OrderStatus::Refunded),
                ("checkIn", OrderStatus::Consuming),
                ("confirm", OrderStatus::Paid),
            ] {
                let no = order_in(&app, &s, from).await;
                let (doc, vars) = match op {
                    "cancel" => (CANCEL, json!({"orderNo": no})),
                    "refund" => (REFUND, json!({"orderNo": no, "reason": "table test"})),
                    "checkIn" => (CHECK_IN, json!({"input": {"orderNo": no, "consumeTxnNo": key()}})),
                    _ => (CONFIRM_OFFLINE, json!({"orderNo": no, "reference": "R-other"})),
                };
                let r = app.gql(Some(&token), doc, vars).await;
                let role_may = !matches!(
                    (op, who),
                    ("cancel" | "checkIn", Who::Ops) | ("refund" | "confirm", Who::Member | Who::Ops)
                );
                let legal = from.allowed_next().contains(&to);
                let already_there = from == to && op != "confirm";
                let ctx = format!("{op} as {who:?} from {from}: {r}");
                if !role_may {
                    assert_eq!(error_code(&r), "FORBIDDEN", "{ctx}");
                } else if legal || already_there {
                    assert!(r.get("errors").is_none(), "{ctx}");
                } else {
                    assert_eq!(error_code(&r), "ILLEGAL_TRANSITION", "{ctx}");
                    assert_eq!(r["errors"][0]["extensions"]["from"], from.as_str(), "{ctx}");
                    assert_eq!(r["errors"][0]["extensions"]["to"], to.as_str(), "{ctx}");
                }
                // Whatever happened, the order is in a legal state reached by legal steps.
                let o = app.order(&no).await;
                let allowed: Vec<String> = OrderStatus::parse(o["status"].as_str().unwrap())
                    .unwrap()
                    .allowed_next()
                    .iter()
                    .map(|s| s.as_str().to_string())
                    .collect();
                assert_eq!(o["allowedTransitions"], json!(allowed));
                for step in o["timeline"].as_array().unwrap() {
                    if step["kind"] == "STATUS_CHANGE" {
                        if let (Some(f), Some(t)) = (step["fromStatus"].as_str(), step["toStatus"].as_str()) {
                            let (f, t) = (OrderStatus::parse(f).unwrap(), OrderStatus::parse(t).unwrap());
                            assert!(f.allowed_next().contains(&t), "illegal step in history {f} -> {t}");
                        }
                    }
                }
            }
        }
    }
    // Refused attempts are counted for the anomaly statistics.
    let refused = app
        .sql_i64("SELECT count(*) AS v FROM anomaly_events WHERE category = 'ILLEGAL_TRANSITION'")
        .await;
    assert!(refused > 20, "refusals recorded: {refused}");
}

#[tokio::test]
async fn the_trigger_refuses_hand_written_illegal_updates() {
    let app = TestApp::new().await;
    let s = app.studio(0, None, 5).await;
    for from in OrderStatus::ALL {
        let no = order_in(&app, &s, from).await;
        for to in OrderStatus::ALL {
            if to == from {
                continue;
            }
            let mut c = app.conn().await;
            let sql = format!("UPDATE orders SET status = '{}' WHERE order_no = '{no}'", to.as_str());
            // Run inside a transaction that is always rolled back: we only want the verdict.
            let verdict: Result<(), String> = c
                .transaction(async |c| -> Result<(), diesel::result::Error> {
                    diesel::sql_query(sql.as_str()).execute(c).await?;
                    Err(diesel::result::Error::RollbackTransaction)
                })
                .await
                .map_err(|e| e.to_string())
                .or_else(|e| {
                    if e.contains("rollback") || e.contains("Rollback") {
                        Ok(())
                    } else {
                        Err(e)
                    }
                });
            let legal = from.allowed_next().contains(&to);
            match verdict {
                Ok(()) => assert!(legal, "the database let {from} -> {to} through"),
                Err(e) => {
                    assert!(!legal, "the database refused legal {from} -> {to}: {e}");
                    assert!(e.contains("illegal order transition"), "{e}");
                }
            }
        }
    }
    // Orders are born WAIT_PAY, even by hand.
    let mut c = app.conn().await;
    let born_paid = diesel::sql_query(
        "INSERT INTO orders (member_id, store_id, kind, status, item_name, class_pack_id, amount_cents,
            payment_method, sessions_total, trace_id, idempotency_key, request_hash)
         SELECT m.id, m.store_id, 'CLASS_PACK', 'PAID', 'x', p.id, 100, 'OFFLINE', 1, 't', 'k', 'h'
           FROM members m, class_packs p LIMIT 1",
    )
    .execute(&mut c)
    .await;
    assert!(born_paid.unwrap_err().to_string().contains("illegal order transition"));
}

#[tokio::test]
async fn domain_table_and_trigger_agree_on_every_pair() {
    // The trigger's pairs, read back from the function body, equal the domain's table.
    let app = TestApp::new().await;
    #[derive(diesel::QueryableByName)]
    struct Src {
        #[diesel(sql_type = diesel::sql_types::Text)]
        src: String,
    }
    let mut c = app.conn().await;
    let body: Src = diesel::sql_query("SELECT prosrc AS src FROM pg_proc WHERE proname = 'order_status_guard'")
        .get_result(&mut c)
        .await
        .unwrap();
    for from in OrderStatus::ALL {
        for to in OrderStatus::ALL {
            let pair = format!("('{}', '{}')", from.as_str(), to.as_str());
            assert_eq!(
                body.src.contains(&pair),
                from.allowed_next().contains(&to),
                "{pair} differs between the trigger and crates/domain/src/order_status.rs"
            );
        }
    }
}
