//! Membership operations (issue 36, docs/prepaid-and-cards.md "Freezing and transferring cards (停卡, 转卡)"): the card's
//! state machine in the database and in the code, freezing from today and scheduled (started
//! and ended by racing scheduler runs exactly once), the early end and the call-off, every
//! refusal with nothing changed, the transfer with its fee, caps and refusals, the outbox's
//! access events with keys of their own, the history, and refunds of frozen and transferred
//! cards. Calls go through the contract's own operations (`playground/operations/next/`).

use fitorder::config::ExposeSecret;
use std::path::{Path, PathBuf};

use chrono::{Duration, Utc};
use diesel_async::{AsyncConnection, RunQueryDsl};
use serde_json::{json, Value};

use crate::harness::*;
use crate::prepaid::{admin_op, ext, member_op, ok};
use fitorder::domain::membership::TRANSITIONS;
use fitorder::domain::MembershipStatus;

fn today(app: &TestApp) -> chrono::NaiveDate {
    Utc::now().with_timezone(&app.state.config.timezone).date_naive()
}

async fn card_of(app: &TestApp, order_no: &str) -> String {
    app.order(order_no).await["membership"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no card on {order_no}"))
        .to_string()
}

async fn detail(app: &TestApp, id: &str) -> Value {
    let r = admin_op(app, "MembershipDetail", json!({"id": id})).await;
    ok(&r)["membership"].clone()
}

async fn freeze(app: &TestApp, id: &str, from: chrono::NaiveDate, days: i64) -> Value {
    admin_op(
        app,
        "FreezeMembership",
        json!({"id": id, "from": from.to_string(), "days": days, "reason": "travelling"}),
    )
    .await
}

fn valid_to(card: &Value) -> chrono::DateTime<Utc> {
    card["validTo"].as_str().unwrap().parse().unwrap()
}

fn kinds(card: &Value) -> Vec<String> {
    card["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect()
}

async fn check_in(app: &TestApp, member: &str, order_no: &str) -> Value {
    app.op(
        &app.member_token(member),
        MEMBER_OPS,
        "CheckIn",
        json!({"input": {"orderNo": order_no, "consumeTxnNo": key()}}),
    )
    .await
}

/// Access events of an order: (kind, member id, idempotency key), oldest first.
async fn access_events(app: &TestApp, order_no: &str) -> Vec<(String, String, String)> {
    #[derive(diesel::QueryableByName)]
    struct E {
        #[diesel(sql_type = diesel::sql_types::Text)]
        kind: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        member: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        key: String,
    }
    let mut c = app.conn().await;
    let rows: Vec<E> = diesel::sql_query(
        "SELECT e.kind, e.payload->>'memberId' AS member, e.idempotency_key AS key
           FROM compensation_events e JOIN orders o ON o.id = e.order_id
          WHERE o.order_no = $1 AND e.kind LIKE '%ACCESS%' ORDER BY e.id",
    )
    .bind::<diesel::sql_types::Text, _>(order_no)
    .load(&mut c)
    .await
    .unwrap();
    rows.into_iter().map(|e| (e.kind, e.member, e.key)).collect()
}

#[tokio::test]
async fn a_freeze_from_today_stops_check_ins_moves_valid_to_and_revokes_access_until_unfrozen() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let no = app
        .buy(&s.member, &s.store, json!({"membershipPlanId": s.plan}), "WALLET")
        .await;
    let id = card_of(&app, &no).await;
    let before = detail(&app, &id).await;
    assert_eq!(before["status"], "ACTIVE");
    assert_eq!(before["plan"]["maxFreezeDays"], 30);
    assert_eq!(before["plan"]["maxFreezes"], 3);
    assert_eq!(kinds(&before), ["STARTED"]);

    // The member freezes their own card from today for 5 days, in the app.
    let r = member_op(
        &app,
        &s.member,
        "FreezeMyMembership",
        json!({"id": id, "from": today(&app).to_string(), "days": 5, "reason": "business trip"}),
    )
    .await;
    let frozen = ok(&r)["freezeMembership"].clone();
    assert_eq!(frozen["status"], "FROZEN");
    assert_eq!(frozen["frozenDays"], 5);
    assert_eq!(valid_to(&frozen), valid_to(&before) + Duration::days(5));
    assert_eq!(
        frozen["freezes"][0]["until"],
        (today(&app) + Duration::days(5)).to_string()
    );

    let r = check_in(&app, &s.member, &no).await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT", "{r}");
    assert_eq!(ext(&r)["reason"], "MEMBERSHIP_FROZEN");
    // A second freeze over the running one is refused.
    let r = freeze(&app, &id, today(&app) + Duration::days(2), 2).await;
    assert_eq!(ext(&r)["reason"], "FREEZE_LIMIT", "{r}");

    // Staff end it early: the started day counts, the other 4 days go back.
    let r = admin_op(&app, "UnfreezeMembership", json!({"id": id})).await;
    let after = ok(&r)["unfreezeMembership"].clone();
    assert_eq!(after["status"], "ACTIVE");
    assert_eq!(after["frozenDays"], 1);
    assert_eq!(valid_to(&after), valid_to(&before) + Duration::days(1));
    let r = check_in(&app, &s.member, &no).await;
    assert!(r.get("errors").is_none(), "{r}");

    let card = detail(&app, &id).await;
    assert_eq!(kinds(&card), ["STARTED", "FROZEN", "UNFROZEN"]);
    let freeze_row = &card["freezes"][0];
    assert_eq!(freeze_row["until"], (today(&app) + Duration::days(1)).to_string());
    assert!(freeze_row["endedAt"].is_string());
    assert_eq!(freeze_row["actor"], format!("member:{}", s.member));
    for e in card["history"].as_array().unwrap() {
        assert!(!e["traceId"].as_str().unwrap().is_empty() && !e["actor"].as_str().unwrap().is_empty());
    }
    // Access: the payment's grants, the freeze's revokes and the grants after it, each with a
    // key of its own, all for the holder.
    let events = access_events(&app, &no).await;
    let keys: Vec<&str> = events.iter().map(|(_, _, k)| k.as_str()).collect();
    let fid = freeze_row["id"].as_str().unwrap();
    assert_eq!(
        keys,
        [
            format!("{no}:DOOR_ACCESS_GRANT"),
            format!("{no}:AI_ACCESS_GRANT"),
            format!("{no}:DOOR_ACCESS_REVOKE:FREEZE-{fid}"),
            format!("{no}:AI_ACCESS_REVOKE:FREEZE-{fid}"),
            format!("{no}:DOOR_ACCESS_GRANT:FREEZE-{fid}"),
            format!("{no}:AI_ACCESS_GRANT:FREEZE-{fid}"),
        ]
    );
    assert!(events.iter().all(|(_, m, _)| *m == s.member));
}

#[tokio::test]
async fn scheduled_freezes_start_and_end_exactly_once_under_racing_scheduler_runs() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let mut cards = vec![];
    for _ in 0..12 {
        let m = app.new_member(&s.store, 100_000).await;
        let no = app
            .buy(&m, &s.store, json!({"membershipPlanId": s.plan}), "WALLET")
            .await;
        let id = card_of(&app, &no).await;
        let start = today(&app) + Duration::days(3);
        ok(&freeze(&app, &id, start, 4).await);
        let card = detail(&app, &id).await;
        assert_eq!(card["status"], "ACTIVE", "scheduled, not started");
        assert_eq!(card["frozenDays"], 0);
        cards.push((m, no, id, valid_to(&card)));
    }
    // Their first day comes (the clock moved by hand): four scheduler runs at once.
    let mut c = app.conn().await;
    diesel::sql_query("UPDATE membership_freezes SET starts_at = now() - interval '1 second'")
        .execute(&mut c)
        .await
        .unwrap();
    let runs: Vec<_> = (0..4)
        .map(|_| tokio::spawn(fitorder::memberships::tick::run(app.state.clone())))
        .collect();
    let mut changed = 0;
    for r in runs {
        changed += r.await.unwrap().unwrap();
    }
    assert_eq!(changed, 12, "each card frozen once");
    for (m, no, id, before) in &cards {
        let card = detail(&app, id).await;
        assert_eq!(card["status"], "FROZEN");
        assert_eq!(card["frozenDays"], 4);
        assert_eq!(valid_to(&card), *before + Duration::days(4));
        assert_eq!(kinds(&card), ["STARTED", "FROZEN", "FROZEN"]);
        let r = check_in(&app, m, no).await;
        assert_eq!(ext(&r)["reason"], "MEMBERSHIP_FROZEN");
    }
    // Their last day is over: again four runs at once.
    diesel::sql_query("UPDATE membership_freezes SET ends_at = now() - interval '1 second'")
        .execute(&mut c)
        .await
        .unwrap();
    let runs: Vec<_> = (0..4)
        .map(|_| tokio::spawn(fitorder::memberships::tick::run(app.state.clone())))
        .collect();
    let mut changed = 0;
    for r in runs {
        changed += r.await.unwrap().unwrap();
    }
    assert_eq!(changed, 12, "each card unfrozen once");
    for (m, no, id, before) in &cards {
        let card = detail(&app, id).await;
        assert_eq!(card["status"], "ACTIVE");
        assert_eq!(card["frozenDays"], 4, "the days served stay frozen");
        assert_eq!(valid_to(&card), *before + Duration::days(4));
        assert_eq!(kinds(&card), ["STARTED", "FROZEN", "FROZEN", "UNFROZEN"]);
        assert!(card["freezes"][0]["endedAt"].is_null(), "ended on time, not early");
        assert!(check_in(&app, m, no).await.get("errors").is_none());
        assert_eq!(access_events(&app, no).await.len(), 6);
    }
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM membership_events WHERE actor = 'system:memberships'")
            .await,
        24
    );
}

#[tokio::test]
async fn bad_freezes_are_refused_with_a_reason_and_change_nothing() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let no = app
        .buy(&s.member, &s.store, json!({"membershipPlanId": s.plan}), "WALLET")
        .await;
    let id = card_of(&app, &no).await;
    let t = today(&app);
    let cases = [
        (t - Duration::days(1), 3, "INVALID_FREEZE"),
        (t + Duration::days(1), 0, "INVALID_FREEZE"),
        (t + Duration::days(1), -2, "INVALID_FREEZE"),
        (t + Duration::days(40), 2, "INVALID_FREEZE"),
        (t + Duration::days(1), 31, "FREEZE_LIMIT"),
    ];
    for (from, days, reason) in cases {
        let r = freeze(&app, &id, from, days).await;
        assert_eq!(error_code(&r), "BAD_USER_INPUT", "{from} {days}: {r}");
        assert_eq!(ext(&r)["reason"], reason, "{from} {days}: {r}");
    }
    // Three freezes are the plan's limit; a fourth is refused, an overlapping one too.
    for k in 0..3 {
        ok(&freeze(&app, &id, t + Duration::days(2 + 3 * k), 2).await);
    }
    let r = freeze(&app, &id, t + Duration::days(20), 1).await;
    assert_eq!(ext(&r)["reason"], "FREEZE_LIMIT");
    // Calling off the earliest scheduled one frees its place.
    let r = admin_op(&app, "UnfreezeMembership", json!({"id": id})).await;
    assert_eq!(ok(&r)["unfreezeMembership"]["status"], "ACTIVE");
    let card = detail(&app, &id).await;
    let off = &card["freezes"][0];
    assert_eq!(off["from"], off["until"], "called off: no day frozen");
    assert!(off["endedAt"].is_string(), "{card:#}");
    let r = freeze(&app, &id, t + Duration::days(6), 1).await;
    assert_eq!(ext(&r)["reason"], "FREEZE_LIMIT", "overlaps the second: {r}");
    ok(&freeze(&app, &id, t + Duration::days(20), 1).await);
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM membership_freezes").await,
        4,
        "refusals wrote nothing"
    );

    // Someone else's card is not there for a member; ops may not freeze; an empty reason.
    let other = app.new_member(&s.store, 0).await;
    let r = member_op(
        &app,
        &other,
        "FreezeMyMembership",
        json!({"id": id, "from": t.to_string(), "days": 1, "reason": "x"}),
    )
    .await;
    assert_eq!(error_code(&r), "NOT_FOUND");
    let r = app
        .gql(
            Some(&app.ops_token()),
            "mutation($id: ID!) { freezeMembership(id: $id, from: \"2030-01-01\", days: 1, reason: \"x\") { id } }",
            json!({"id": id}),
        )
        .await;
    assert_eq!(error_code(&r), "FORBIDDEN");
    let r = admin_op(
        &app,
        "FreezeMembership",
        json!({"id": id, "from": t.to_string(), "days": 1, "reason": "  "}),
    )
    .await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT");

    // A card over is not frozen.
    let mut c = app.conn().await;
    diesel::sql_query("UPDATE memberships SET status = 'EXPIRED'")
        .execute(&mut c)
        .await
        .unwrap();
    let r = freeze(&app, &id, t + Duration::days(25), 1).await;
    assert_eq!(ext(&r)["reason"], "MEMBERSHIP_NOT_ACTIVE");
}

#[tokio::test]
async fn a_transfer_passes_the_card_and_its_order_once_for_a_fee_and_ends_refunds() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let friend = app.new_member(&s.store, 0).await;
    let no = app
        .buy(&s.member, &s.store, json!({"membershipPlanId": s.plan}), "WALLET")
        .await;
    let id = card_of(&app, &no).await;
    let wallet = |v: &Value| v["wallet"]["balanceCents"].as_i64().unwrap();
    let before = wallet(&app.member_view(&s.member).await);

    let transfer = |to: String, fee: i64| {
        let app = &app;
        let id = id.clone();
        async move {
            admin_op(
                app,
                "TransferMembership",
                json!({"id": id, "toMemberId": to, "feeCents": fee, "reason": "gift to a friend"}),
            )
            .await
        }
    };
    // Refusals first: to oneself, a fee the wallet cannot cover, another operator's member.
    let r = transfer(s.member.clone(), 0).await;
    assert_eq!(ext(&r)["reason"], "SAME_MEMBER", "{r}");
    let r = transfer(friend.clone(), before + 1).await;
    assert_eq!(error_code(&r), "INSUFFICIENT_FUNDS", "{r}");
    let far = app
        .admin(
            "mutation($i: CreateStoreInput!) { createStore(input: $i) { id } }",
            json!({"i": {"name": "Far", "code": format!("F{}", key().len()), "operatorCode": "91440300MA5FAR000X"}}),
        )
        .await["createStore"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let stranger = app.new_member(&far, 0).await;
    let r = transfer(stranger, 0).await;
    assert_eq!(ext(&r)["reason"], "OTHER_OPERATOR", "{r}");
    assert_eq!(
        detail(&app, &id).await["member"]["id"],
        s.member.as_str(),
        "nothing changed"
    );
    assert_eq!(wallet(&app.member_view(&s.member).await), before);

    // A frozen card is not transferred.
    ok(&freeze(&app, &id, today(&app), 2).await);
    let r = transfer(friend.clone(), 0).await;
    assert_eq!(ext(&r)["reason"], "MEMBERSHIP_FROZEN");
    ok(&admin_op(&app, "UnfreezeMembership", json!({"id": id})).await);
    // A scheduled freeze is called off by the transfer.
    ok(&freeze(&app, &id, today(&app) + Duration::days(5), 2).await);

    let r = transfer(friend.clone(), 5_000).await;
    let moved = ok(&r)["transferMembership"].clone();
    assert_eq!(moved["member"]["id"], friend.as_str());
    assert_eq!(moved["status"], "ACTIVE");
    let last = moved["history"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["kind"], "TRANSFERRED");
    assert_eq!(last["fromMember"]["id"], s.member.as_str());
    assert_eq!(last["toMember"]["id"], friend.as_str());
    assert_eq!(wallet(&app.member_view(&s.member).await), before - 5_000);
    let card = detail(&app, &id).await;
    assert_eq!(
        card["order"]["member"]["id"],
        friend.as_str(),
        "the order passes with it"
    );
    assert!(card["freezes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f["from"] == f["until"] || f["endedAt"].is_string()));
    // The new holder checks in with it; the old one no longer sees it.
    assert!(check_in(&app, &friend, &no).await.get("errors").is_none());
    let r = check_in(&app, &s.member, &no).await;
    assert_eq!(error_code(&r), "NOT_FOUND", "{r}");
    // Access moved: revoked for the old holder, granted to the new one.
    let events = access_events(&app, &no).await;
    let tail: Vec<_> = events[events.len() - 4..].to_vec();
    assert_eq!(tail[0].1, s.member);
    assert!(tail[0].0.ends_with("REVOKE") && tail[0].2.ends_with(":TRANSFER"));
    assert_eq!(tail[2].1, friend);
    assert!(tail[2].0.ends_with("GRANT") && tail[2].2.ends_with(":TRANSFER"));

    // Once per card; and its order is no longer refundable, nor taken back in a cooling-off.
    let r = transfer(s.member.clone(), 0).await;
    assert_eq!(ext(&r)["reason"], "MEMBERSHIP_TRANSFERRED");
    let r = app
        .op(
            &app.admin_token(),
            ADMIN_OPS,
            "RefundOrder",
            json!({"orderNo": no, "reason": "asked"}),
        )
        .await;
    assert_eq!(error_code(&r), "BAD_USER_INPUT");
    assert_eq!(ext(&r)["reason"], "MEMBERSHIP_TRANSFERRED");
    assert_eq!(app.order(&no).await["status"], "CONSUMING");
}

#[tokio::test]
async fn a_card_refunded_while_frozen_pays_back_its_unused_days_without_the_frozen_ones() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let no = app
        .buy(&s.member, &s.store, json!({"membershipPlanId": s.plan}), "WALLET")
        .await;
    let id = card_of(&app, &no).await;
    // Started five days ago (moved by hand), frozen from today for ten days.
    let mut c = app.conn().await;
    diesel::sql_query(
        "UPDATE memberships SET valid_from = valid_from - interval '5 days', valid_to = valid_to - interval '5 days'",
    )
    .execute(&mut c)
    .await
    .unwrap();
    ok(&freeze(&app, &id, today(&app), 10).await);
    let r = app
        .op(
            &app.admin_token(),
            ADMIN_OPS,
            "RefundOrder",
            json!({"orderNo": no, "reason": "moving away"}),
        )
        .await;
    let refunded = r["data"]["refundOrder"].clone();
    assert_eq!(refunded["status"], "REFUNDED", "{r}");
    // 30 days for ¥300: 5 used, today frozen (a started day), 24 or 25 left of the plan
    // (less than a whole day of today is left over): never the frozen days.
    let cents = refunded["refundAmountCents"].as_i64().unwrap();
    assert!((24_000..=25_000).contains(&cents), "{cents}");
    let card = detail(&app, &id).await;
    assert_eq!(card["status"], "REVOKED");
    assert_eq!(card["frozenDays"], 1, "the day frozen so far");
    assert_eq!(kinds(&card), ["STARTED", "FROZEN", "REVOKED"]);
    assert_eq!(
        card["freezes"][0]["until"],
        (today(&app) + Duration::days(1)).to_string()
    );
}

#[tokio::test]
async fn the_trigger_refuses_hand_written_illegal_card_changes_and_agrees_with_the_domain() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let no = app
        .buy(&s.member, &s.store, json!({"membershipPlanId": s.plan}), "WALLET")
        .await;
    let id = card_of(&app, &no).await;
    let legal =
        |from: MembershipStatus, to: MembershipStatus| TRANSITIONS.iter().any(|(f, t, ..)| *f == from && *t == to);
    for from in MembershipStatus::ALL {
        for to in MembershipStatus::ALL {
            if from == to {
                continue;
            }
            let mut c = app.conn().await;
            let verdict: Result<(), String> = c
                .transaction(async |c| -> Result<(), diesel::result::Error> {
                    // Put the card in `from` without the trigger, then ask for `to` with it.
                    diesel::sql_query("ALTER TABLE memberships DISABLE TRIGGER memberships_status_guard")
                        .execute(c)
                        .await?;
                    diesel::sql_query(format!(
                        "UPDATE memberships SET status = '{}' WHERE id = {id}",
                        from.as_str()
                    ))
                    .execute(c)
                    .await?;
                    diesel::sql_query("ALTER TABLE memberships ENABLE TRIGGER memberships_status_guard")
                        .execute(c)
                        .await?;
                    diesel::sql_query(format!(
                        "UPDATE memberships SET status = '{}' WHERE id = {id}",
                        to.as_str()
                    ))
                    .execute(c)
                    .await?;
                    Err(diesel::result::Error::RollbackTransaction)
                })
                .await
                .map_err(|e| e.to_string())
                .or_else(|e| {
                    if e.to_lowercase().contains("rollback") {
                        Ok(())
                    } else {
                        Err(e)
                    }
                });
            match verdict {
                Ok(()) => assert!(legal(from, to), "the database let {from} -> {to} through"),
                Err(e) => {
                    assert!(!legal(from, to), "the database refused legal {from} -> {to}: {e}");
                    assert!(e.contains("illegal membership transition"), "{e}");
                }
            }
        }
    }
    // The trigger's pairs, read back from its body, are the domain's table.
    #[derive(diesel::QueryableByName)]
    struct Src {
        #[diesel(sql_type = diesel::sql_types::Text)]
        src: String,
    }
    let mut c = app.conn().await;
    let body: Src = diesel::sql_query("SELECT prosrc AS src FROM pg_proc WHERE proname = 'membership_status_guard'")
        .get_result(&mut c)
        .await
        .unwrap();
    for from in MembershipStatus::ALL {
        for to in MembershipStatus::ALL {
            let pair = format!("('{}', '{}')", from.as_str(), to.as_str());
            assert_eq!(body.src.contains(&pair), legal(from, to), "{pair}");
        }
    }
}

/// One writer of a card's status and history: no file but `memberships/change.sql` (and the
/// birth, `memberships/start.sql`) writes `memberships.status` or `membership_events`.
#[test]
fn card_status_and_history_are_written_only_by_change_sql() {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs" || x == "sql") {
                out.push(p);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![];
    walk(&root.join("crates"), &mut files);
    // The benchmark loads its million rows set-based, outside the layers.
    files.retain(|f| !f.starts_with(root.join("crates/bench")));
    walk(&root.join("src"), &mut files);
    let mut found = vec![];
    for f in &files {
        let text: String = std::fs::read_to_string(f)
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with("--") && !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n")
            .to_lowercase();
        let tight: String = text.split_whitespace().collect();
        let writes = text.contains("insert into membership_events")
            || text.contains("insert into memberships")
            || (text.contains("update memberships") && text.contains("status ="))
            || tight.contains("memberships::status.eq(") && tight.contains("update(memberships::table")
            || tight.contains("insert_into(memberships::table")
            || tight.contains("insert_into(membership_events::table");
        if writes {
            found.push(f.strip_prefix(root).unwrap().display().to_string());
        }
    }
    found.sort();
    assert_eq!(
        found,
        [
            "crates/capabilities/src/memberships/change.sql",
            "crates/capabilities/src/memberships/start.sql"
        ],
        "only change.sql and start.sql write a card's status and history"
    );
}

/// Issue 36: freezes due at once start exactly once, across a `fitorder worker` killed -9 in
/// the middle of its run (its open batch rolls back) and three runs racing after it.
#[tokio::test]
async fn freezes_due_at_once_start_once_across_a_killed_worker_and_racing_runs() {
    const CARDS: i64 = 12_000;
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let no = app
        .buy(&s.member, &s.store, json!({"membershipPlanId": s.plan}), "WALLET")
        .await;
    // Many more cards like it (their orders copied from the paid one), each with a freeze of
    // five days from today that is due now.
    let mut c = app.conn().await;
    diesel::sql_query(format!(
        "WITH o AS (
             INSERT INTO orders (member_id, store_id, kind, item_name, membership_plan_id, plan_days, amount_cents,
                                 payment_method, sessions_total, trace_id, idempotency_key, request_hash)
             SELECT o.member_id, o.store_id, o.kind, o.item_name, o.membership_plan_id, o.plan_days, o.amount_cents,
                    o.payment_method, o.sessions_total, 'bulk', 'bulk-' || g, 'bulk'
               FROM orders o, generate_series(1, {CARDS}) g WHERE o.order_no = '{no}'
             RETURNING id, member_id, store_id, membership_plan_id),
         m AS (
             INSERT INTO memberships (member_id, store_id, plan_id, order_id, status, valid_from, valid_to)
             SELECT member_id, store_id, membership_plan_id, id, 'ACTIVE', now(), now() + interval '30 days' FROM o
             RETURNING id)
         INSERT INTO membership_freezes (membership_id, from_date, until_date, starts_at, ends_at, reason, actor, trace_id)
         SELECT id, (now() AT TIME ZONE 'Asia/Shanghai')::date, (now() AT TIME ZONE 'Asia/Shanghai')::date + 5,
                now() - interval '1 second', now() + interval '5 days', 'bulk', 'admin:bulk', 'bulk'
           FROM m"
    ))
    .execute(&mut c)
    .await
    .unwrap();
    let frozen = || app.sql_i64("SELECT count(*) AS v FROM memberships WHERE status = 'FROZEN'");

    let mut worker = Fitorder::new(&["worker"])
        .env("DATABASE_URL", &app.db_url)
        .env("FITORDER_JWT_SECRET", app.state.config.jwt_secret.expose_secret())
        .env("FITORDER_SCAN_INTERVAL", "1s")
        .env("FITORDER_DOOR_ACCESS_URL", "http://127.0.0.1:9/door")
        .env("FITORDER_AI_ACCESS_URL", "http://127.0.0.1:9/ai")
        .spawn();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while frozen().await == 0 {
        assert!(worker.alive(), "the worker ended: {}", worker.log());
        assert!(
            std::time::Instant::now() < deadline,
            "the worker froze nothing in a minute: {}",
            worker.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop(worker); // SIGKILL
    let at_kill = frozen().await;
    eprintln!("killed the worker with {at_kill} of {CARDS} cards frozen");

    let runs: Vec<_> = (0..3)
        .map(|_| tokio::spawn(fitorder::memberships::tick::run(app.state.clone())))
        .collect();
    for r in runs {
        r.await.unwrap().unwrap();
    }
    assert_eq!(frozen().await, CARDS);
    assert_eq!(
        app.sql_i64(
            "SELECT count(DISTINCT membership_id) AS v FROM membership_events WHERE kind = 'FROZEN' AND to_status = 'FROZEN'"
        )
        .await,
        CARDS
    );
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM membership_events WHERE kind = 'FROZEN'")
            .await,
        CARDS,
        "each card frozen once"
    );
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM memberships WHERE status = 'FROZEN' AND frozen_days = 5")
            .await,
        CARDS
    );
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM membership_freezes WHERE state = 'RUNNING'")
            .await,
        CARDS
    );
    assert_eq!(
        app.sql_i64("SELECT count(*) AS v FROM compensation_events WHERE idempotency_key LIKE '%:FREEZE-%'")
            .await,
        2 * CARDS,
        "a door and an AI revoke per card"
    );
}

/// A renewal bought early starts when the current card ends: it moves with that end when the
/// current card is frozen and unfrozen, so the two never overlap.
#[tokio::test]
async fn a_queued_renewal_moves_with_the_frozen_card_it_follows() {
    let app = TestApp::new().await;
    let s = app.studio(100_000, None, 3).await;
    let first = app
        .buy(&s.member, &s.store, json!({"membershipPlanId": s.plan}), "WALLET")
        .await;
    let renewal = app
        .buy(&s.member, &s.store, json!({"membershipPlanId": s.plan}), "WALLET")
        .await;
    let (a, b) = (card_of(&app, &first).await, card_of(&app, &renewal).await);
    let next_from = |c: &Value| -> chrono::DateTime<Utc> { c["validFrom"].as_str().unwrap().parse().unwrap() };
    let before = detail(&app, &b).await;
    assert_eq!(next_from(&before), valid_to(&detail(&app, &a).await));
    ok(&freeze(&app, &a, today(&app), 5).await);
    let moved = detail(&app, &b).await;
    assert_eq!(next_from(&moved), next_from(&before) + Duration::days(5));
    assert_eq!(valid_to(&moved), valid_to(&before) + Duration::days(5));
    assert_eq!(next_from(&moved), valid_to(&detail(&app, &a).await));
    ok(&admin_op(&app, "UnfreezeMembership", json!({"id": a})).await);
    let back = detail(&app, &b).await;
    assert_eq!(next_from(&back), next_from(&before) + Duration::days(1));
    assert_eq!(next_from(&back), valid_to(&detail(&app, &a).await));
    assert_eq!(back["status"], "ACTIVE");
    assert_eq!(kinds(&back), ["STARTED"]);
}
