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

/// One writer of status changes: the structural half. Every `.sql` and `.rs` file of the crate
/// (`src/**`, and `crates/*/src/**` once the workspace exists) is read, comments left out, for
/// writes of `orders.status` (SQL `UPDATE orders … SET status =`, `INSERT INTO orders (… status
/// …)`, diesel `update(orders::table)…status.eq(` / `insert_into(orders::table)…status.eq(`), of
/// the audit table `order_transitions`, of a released seat or stock unit (`remaining =
/// remaining +`, `stock = stock +`, their diesel forms) and of an unfrozen wallet (`'UNFREEZE'`,
/// `WalletMoveKind::Unfreeze`). They may appear only in `orders/transition.sql`, which only
/// `orders/mod.rs` runs; the one exception is WAIT_PAY -> PAID in `orders/pay.sql` (its status
/// and audit row, nothing else), which only `orders/lifecycle.rs` runs.
#[test]
fn status_changes_audit_rows_and_releases_are_written_only_by_the_transition() {
    use std::path::{Path, PathBuf};
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs" || x == "sql") {
                out.push(p);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![];
    walk(&root.join("src"), &mut files);
    if let Ok(crates) = std::fs::read_dir(root.join("crates")) {
        // The layers' crates; the bench (its own baselines and seeds) is outside them.
        for c in crates.map(|c| c.unwrap().path()).filter(|c| !c.ends_with("bench")) {
            walk(&c.join("src"), &mut files);
        }
    }
    assert!(files.len() > 50, "sources found: {}", files.len());

    let mut found: Vec<(String, &str)> = vec![];
    let mut includes: Vec<(String, String)> = vec![];
    let mut pay_status_sets = vec![];
    for path in &files {
        let rel = path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
        let text = std::fs::read_to_string(path).unwrap();
        let is_sql = rel.ends_with(".sql");
        let code = strip_comments(&text, if is_sql { "--" } else { "//" });
        let mut hits = vec![];
        // SQL, in .sql files and in strings of .rs files.
        let sql = unqualify_sql(&collapse(&code.to_lowercase()));
        hits.extend(sql_writes(&sql));
        if !is_sql {
            hits.extend(diesel_writes(&code));
        }
        if rel.ends_with("orders/pay.sql") {
            pay_status_sets = update_set_clauses(&sql, "orders");
        }
        for w in hits {
            found.push((rel.clone(), w));
        }
        let tight: String = code.chars().filter(|c| !c.is_whitespace()).collect();
        for f in ["transition.sql", "pay.sql"] {
            if tight.contains(&format!("include_str!(\"{f}\")")) || tight.contains(&format!("/{f}\")")) {
                includes.push((f.to_string(), rel.clone()));
            }
        }
    }

    let allowed = |file: &str, what: &str| {
        file.ends_with("orders/transition.sql")
            || (file.ends_with("orders/pay.sql") && matches!(what, "orders.status" | "order_transitions"))
    };
    let stray: Vec<_> = found.iter().filter(|(f, w)| !allowed(f, w)).collect();
    assert!(
        stray.is_empty(),
        "status changes, audit rows, seat releases and wallet unfreezes are written by \
         orders/transition.sql only (WAIT_PAY -> PAID: orders/pay.sql); found elsewhere: {stray:#?}"
    );
    // The writer writes all of them (so this test would see it if it moved).
    for what in ["orders.status", "order_transitions", "seat release", "wallet unfreeze"] {
        assert!(
            found
                .iter()
                .any(|(f, w)| f.ends_with("orders/transition.sql") && *w == what),
            "orders/transition.sql no longer writes {what}: {found:#?}"
        );
    }
    // The exception is WAIT_PAY -> PAID and nothing else.
    assert_eq!(pay_status_sets.len(), 1, "orders/pay.sql updates orders once");
    assert!(
        pay_status_sets[0].contains("status = 'paid'") && pay_status_sets[0].matches("status =").count() == 1,
        "orders/pay.sql sets the status to PAID only: {}",
        pay_status_sets[0]
    );
    // Each writer is run by one module.
    let runners = |f: &str| {
        includes
            .iter()
            .filter(|(i, _)| i == f)
            .map(|(_, r)| r.clone())
            .collect::<Vec<_>>()
    };
    let t = runners("transition.sql");
    assert!(
        t.len() == 1 && t[0].ends_with("orders/mod.rs"),
        "transition.sql is run by: {t:?}"
    );
    let p = runners("pay.sql");
    assert!(
        p.len() == 1 && p[0].ends_with("orders/lifecycle.rs"),
        "pay.sql is run by: {p:?}"
    );

    // The scanner itself: it sees the forms it claims to see.
    let probe = |s: &str| sql_writes(&unqualify_sql(&collapse(&s.to_lowercase()))).to_vec();
    assert_eq!(
        probe("UPDATE orders o\n SET updated_at = now(), status = 'X' WHERE id = 1"),
        ["orders.status"]
    );
    assert_eq!(
        probe("UPDATE orders SET sessions_used = 1 WHERE status = 'PAID'"),
        Vec::<&str>::new()
    );
    assert_eq!(
        probe("INSERT INTO orders (member_id, status) VALUES (1, 'PAID')"),
        ["orders.status"]
    );
    assert_eq!(
        probe("insert into order_transitions (order_id) values (1)"),
        ["order_transitions"]
    );
    assert_eq!(
        probe("UPDATE coach_slots s SET remaining = s.remaining + 1"),
        ["seat release"]
    );
    assert_eq!(
        probe("SELECT 1 FROM wallet_ledger WHERE kind = 'UNFREEZE'"),
        Vec::<&str>::new()
    );
    assert_eq!(
        probe("INSERT INTO wallet_ledger (kind) SELECT 'UNFREEZE'"),
        ["wallet unfreeze"]
    );
    let rs = |s: &str| diesel_writes(s);
    assert_eq!(
        rs("diesel::update(orders::table.find(id)).set((orders::status.eq(OrderStatus::Paid), x)).execute(c).await"),
        ["orders.status"]
    );
    assert_eq!(
        rs("diesel::update(orders::table.find(id)).set(orders::sessions_used.eq(1)).execute(c).await"),
        Vec::<&str>::new()
    );
    assert_eq!(
        rs("use crate::db::schema::order_transitions as ot;\n diesel::insert_into(ot::table).values(x).execute(c).await"),
        ["order_transitions"]
    );
    assert_eq!(
        rs("diesel::update(coach_slots::table.find(s)).set(coach_slots::remaining.eq(coach_slots::remaining + 1))"),
        ["seat release"]
    );
    assert_eq!(
        rs("WalletMove { kind: WalletMoveKind::Unfreeze, .. }"),
        ["wallet unfreeze"]
    );
    assert_eq!(
        rs("match k { WalletMoveKind::Unfreeze => 1, WalletMoveKind::Unfreeze | WalletMoveKind::Freeze => 2 }"),
        Vec::<&str>::new()
    );
}

/// The text without its comments (`--` or `//` to the end of the line; in SQL `/* */` blocks
/// too: in Rust, `/*` is more often part of a string, a glob, than a comment).
fn strip_comments(text: &str, line: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let next_line = rest.find(line);
        let next_block = if line == "--" { rest.find("/*") } else { None };
        match (next_line, next_block) {
            (Some(l), b) if b.is_none_or(|b| l < b) => {
                out.push_str(&rest[..l]);
                rest = rest[l..].find('\n').map_or("", |e| &rest[l + e..]);
            }
            (_, Some(b)) => {
                out.push_str(&rest[..b]);
                rest = rest[b..].find("*/").map_or("", |e| &rest[b + e + 2..]);
            }
            _ => {
                out.push_str(rest);
                rest = "";
            }
        }
    }
    out
}

/// Every run of whitespace as one space.
fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `alias.column` as `column`.
fn unqualify_sql(s: &str) -> String {
    let b = s.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if ident(b[i]) && (i == 0 || !ident(b[i - 1])) {
            let mut j = i;
            while j < b.len() && ident(b[j]) {
                j += 1;
            }
            if j + 1 < b.len() && b[j] == b'.' && ident(b[j + 1]) && !b[i].is_ascii_digit() {
                i = j + 1;
                continue;
            }
            out.push_str(&s[i..j]);
            i = j;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// The SET clauses of `UPDATE <table> [alias] SET …` (up to WHERE, FROM, RETURNING or the end).
fn update_set_clauses(sql: &str, table: &str) -> Vec<String> {
    let head = format!("update {table} ");
    let mut out = vec![];
    for (at, _) in sql.match_indices(&head) {
        let stmt = &sql[at + head.len()..];
        let stmt = &stmt[..stmt.find(';').unwrap_or(stmt.len())];
        let Some(set) = stmt.find("set ") else { continue };
        let clause = &stmt[set + 4..];
        let end = [" where ", " from ", " returning "]
            .iter()
            .filter_map(|k| clause.find(k))
            .min()
            .unwrap_or(clause.len());
        out.push(clause[..end].to_string());
    }
    out
}

/// Whether `word` occurs in `s` as a whole identifier.
fn has_word(s: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    s.match_indices(word).any(|(i, _)| {
        !s[..i].chars().next_back().is_some_and(ident) && !s[i + word.len()..].chars().next().is_some_and(ident)
    })
}

/// The writes a lowercased, collapsed, unqualified SQL text makes.
fn sql_writes(sql: &str) -> Vec<&'static str> {
    let mut out = vec![];
    for set in update_set_clauses(sql, "orders") {
        if set
            .split(',')
            .any(|a| a.trim_start().starts_with("status =") || a.trim_start().starts_with("status="))
        {
            out.push("orders.status");
        }
    }
    for head in ["insert into orders (", "insert into orders("] {
        for (at, _) in sql.match_indices(head) {
            let cols = &sql[at + head.len()..];
            if has_word(&cols[..cols.find(')').unwrap_or(cols.len())], "status") {
                out.push("orders.status");
            }
        }
    }
    for w in [
        "insert into order_transitions",
        "update order_transitions",
        "delete from order_transitions",
    ] {
        if sql.contains(w) {
            out.push("order_transitions");
        }
    }
    for col in ["remaining", "stock"] {
        for sp in ["", " "] {
            if sql.contains(&format!("{col}{sp}={sp}{col}{sp}+")) {
                out.push("seat release");
            }
        }
    }
    if sql.contains("insert into wallet_ledger") && sql.contains("'unfreeze'") {
        out.push("wallet unfreeze");
    }
    out
}

/// The writes diesel calls in a Rust text make.
fn diesel_writes(code: &str) -> Vec<&'static str> {
    let tight: String = code
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect::<String>()
        .to_lowercase();
    // `order_transitions as ot` aliases.
    let mut audit_tables = vec!["order_transitions::table".to_string()];
    for (at, _) in tight.match_indices("order_transitionsas") {
        let alias: String = tight[at + "order_transitionsas".len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        audit_tables.push(format!("{alias}::table"));
    }
    let mut out = vec![];
    for call in ["update(", "insert_into(", "delete("] {
        for (at, _) in tight.match_indices(call) {
            let chain = &tight[at + call.len()..];
            let chain = &chain[..[chain.find(".await"), chain.find(';')]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(chain.len())];
            let target = &chain[..chain.find([')', '.']).unwrap_or(chain.len())];
            if (target == "orders::table" || target.ends_with("::orders::table"))
                && chain.contains("orders::status.eq(")
            {
                out.push("orders.status");
            }
            if audit_tables
                .iter()
                .any(|t| target == t || target.ends_with(&format!("::{t}")))
            {
                out.push("order_transitions");
            }
        }
    }
    let unq = tight.replace("coach_slots::", "").replace("class_packs::", "");
    if unq.contains("remaining.eq(remaining+") || unq.contains("stock.eq(stock+") {
        out.push("seat release");
    }
    // A match arm names the kind to read it (`Member.walletEntries` maps the ledger's kinds):
    // a pattern is no write, whatever follows it.
    let unpatterned = tight
        .replace("walletmovekind::unfreeze=>", "")
        .replace("walletmovekind::unfreeze|", "");
    if unpatterned.contains("walletmovekind::unfreeze") {
        out.push("wallet unfreeze");
    }
    out
}
