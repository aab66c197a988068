//! The books after a chaos run: every check is a query listing its violations, and a test that
//! breaks the books one way at a time proves each check sees its own breakage.

use serde_json::json;

use super::actions::Provider;

#[derive(diesel::QueryableByName)]
struct V {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    v: i64,
}

#[derive(diesel::QueryableByName)]
struct Bad {
    #[diesel(sql_type = diesel::sql_types::Text)]
    what: String,
}

pub async fn scalar(conn: &mut diesel_async::AsyncPgConnection, sql: &str) -> i64 {
    use diesel_async::RunQueryDsl;
    diesel::sql_query(sql).get_result::<V>(conn).await.unwrap().v
}

/// A trade as the provider (the sandbox) holds it at the end of the run.
#[derive(Debug, Clone)]
pub struct ProviderTrade {
    /// `WECHAT_PAY` or `ALIPAY`.
    pub provider: String,
    pub out_trade_no: String,
    pub txn_id: Option<String>,
    /// The provider collected the money (whatever happened since).
    pub paid: bool,
    /// (refund number, status) of every refund the provider took.
    pub refunds: Vec<(String, String)>,
}

impl From<fitorder::dev::sandbox_server::SandboxTrade> for ProviderTrade {
    fn from(t: fitorder::dev::sandbox_server::SandboxTrade) -> ProviderTrade {
        ProviderTrade {
            paid: t.paid_at.is_some(),
            refunds: t.refunds.into_iter().map(|r| (r.out_refund_no, r.status)).collect(),
            provider: t.provider,
            out_trade_no: t.out_trade_no,
            txn_id: t.txn_id,
        }
    }
}

impl ProviderTrade {
    fn finished(&self, refund_no: &str) -> bool {
        self.refunds
            .iter()
            .any(|(no, status)| no == refund_no && matches!(status.as_str(), "SUCCESS" | "REFUND_SUCCESS"))
    }
}

#[derive(diesel::QueryableByName)]
struct RefundNo {
    #[diesel(sql_type = diesel::sql_types::Text)]
    refund_no: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    txn: Option<String>,
}

/// Paid at a provider ⇒ applied, or refunded and the refund confirmed by the provider; and a
/// refund recorded done is one the provider finished.
async fn check_provider_money(conn: &mut diesel_async::AsyncPgConnection, trades: &[ProviderTrade]) -> Vec<String> {
    use diesel_async::RunQueryDsl;
    let mut out = vec![];
    for t in trades {
        let done: Vec<RefundNo> = diesel::sql_query(
            "SELECT payload->>'refundNo' AS refund_no, payload->>'providerTxnId' AS txn FROM compensation_events
              WHERE kind = 'PROVIDER_REFUND' AND status = 'SUCCEEDED' AND payload->>'orderNo' = $1
                AND payload->>'provider' = $2",
        )
        .bind::<diesel::sql_types::Text, _>(&t.out_trade_no)
        .bind::<diesel::sql_types::Text, _>(&t.provider)
        .load(conn)
        .await
        .unwrap_or_default();
        for d in &done {
            if !t.finished(&d.refund_no) {
                out.push(format!(
                    "refund {} of {} recorded done, but {} has not finished it",
                    d.refund_no, t.out_trade_no, t.provider
                ));
            }
        }
        let Some(txn) = t.txn_id.as_deref().filter(|_| t.paid) else {
            continue;
        };
        let applied = diesel::sql_query(
            "SELECT count(*) AS v FROM payments p JOIN orders o ON o.id = p.order_id
              WHERE o.order_no = $1 AND p.provider_txn_id = $2",
        )
        .bind::<diesel::sql_types::Text, _>(&t.out_trade_no)
        .bind::<diesel::sql_types::Text, _>(txn)
        .get_result::<V>(conn)
        .await
        .map(|v| v.v)
        .unwrap_or(0);
        let refunded = done
            .iter()
            .any(|d| d.txn.as_deref() == Some(txn) && t.finished(&d.refund_no));
        if applied == 0 && !refunded {
            out.push(format!(
                "{} collected {} for {}, which is neither applied nor refunded with the provider's confirmation",
                t.provider, txn, t.out_trade_no
            ));
        }
    }
    out
}

/// Reads the books; returns every violation found.
pub async fn check_invariants(
    conn: &mut diesel_async::AsyncPgConnection,
    provider: &Provider,
    trades: &[ProviderTrade],
) -> Vec<String> {
    use diesel_async::RunQueryDsl;
    let checks = [
        // A status history with an illegal step, or one that does not end where the order is.
        "WITH h AS (SELECT order_id, from_status, to_status,
                           lag(to_status) OVER (PARTITION BY order_id ORDER BY id) AS prev,
                           row_number() OVER (PARTITION BY order_id ORDER BY id DESC) AS last
                      FROM order_transitions)
         SELECT 'illegal step in ' || o.order_no || ': ' || coalesce(h.from_status, 'NONE') || ' -> ' || h.to_status AS what
           FROM h JOIN orders o ON o.id = h.order_id
          WHERE (h.prev IS NULL AND NOT (h.from_status IS NULL AND h.to_status = 'WAIT_PAY'))
             OR (h.prev IS NOT NULL AND h.from_status IS DISTINCT FROM h.prev)
             OR (h.from_status, h.to_status) NOT IN (('WAIT_PAY','PAID'),('WAIT_PAY','CANCELED'),('PAID','CONSUMING'),
                   ('PAID','REFUNDED'),('CONSUMING','CONSUMED'),('CONSUMING','REFUNDED'))
                AND h.from_status IS NOT NULL
             OR (h.last = 1 AND h.to_status <> o.status)",
        // Two applied payments, or a paid order without its payment.
        "SELECT 'payments of ' || o.order_no || ': ' || count(p.id) AS what FROM orders o LEFT JOIN payments p ON p.order_id = o.id
          WHERE o.paid_at IS NOT NULL OR o.status IN ('PAID','CONSUMING','CONSUMED','REFUNDED')
          GROUP BY o.order_no HAVING count(p.id) <> 1",
        // Credits: used sessions are exactly the checked-in ones, never more than bought.
        "SELECT 'sessions of ' || o.order_no || ': used ' || o.sessions_used || ', checked in ' || coalesce(sum(c.sessions), 0) AS what
           FROM orders o LEFT JOIN check_ins c ON c.order_id = o.id
          WHERE o.kind <> 'MEMBERSHIP' GROUP BY o.id HAVING o.sessions_used <> coalesce(sum(c.sessions), 0)",
        // A wallet whose balance differs from its ledger.
        "SELECT 'wallet of member ' || m.id || ' differs from its ledger' AS what FROM members m
          WHERE m.balance_cents <> (SELECT coalesce(sum(balance_delta), 0) FROM wallet_ledger l WHERE l.member_id = m.id)
             OR m.frozen_cents <> (SELECT coalesce(sum(frozen_delta), 0) FROM wallet_ledger l WHERE l.member_id = m.id)",
        // Frozen money with no waiting order.
        "SELECT 'member ' || m.id || ' has ' || m.frozen_cents || ' frozen for waiting orders of ' ||
                coalesce((SELECT sum(wallet_amount_cents) FROM orders o WHERE o.member_id = m.id AND o.status = 'WAIT_PAY'
                           AND o.payment_method = 'MIXED'), 0) AS what
           FROM members m
          WHERE m.frozen_cents <> coalesce((SELECT sum(wallet_amount_cents) FROM orders o WHERE o.member_id = m.id
                                             AND o.status = 'WAIT_PAY' AND o.payment_method = 'MIXED'), 0)",
        // Seats that differ from capacity minus holders.
        "SELECT 'slot ' || s.id || ': remaining ' || s.remaining || ' of ' || s.capacity || ', holders ' ||
                (SELECT count(*) FROM orders o WHERE o.coach_slot_id = s.id AND o.status IN ('WAIT_PAY','PAID','CONSUMING','CONSUMED')) AS what
           FROM coach_slots s
          WHERE s.remaining <> s.capacity - (SELECT count(*) FROM orders o WHERE o.coach_slot_id = s.id
                                             AND o.status IN ('WAIT_PAY','PAID','CONSUMING','CONSUMED'))",
        // Stock that differs from the initial 40 minus holders.
        "SELECT 'pack ' || p.id || ': stock ' || p.stock AS what FROM class_packs p
          WHERE p.stock IS NOT NULL AND p.stock <> 40 - (SELECT count(*) FROM orders o WHERE o.class_pack_id = p.id
                                             AND o.status IN ('WAIT_PAY','PAID','CONSUMING','CONSUMED'))",
        // A paid order whose grants were neither delivered nor DEAD with a ticket.
        "SELECT 'grants of ' || o.order_no || ' not settled' AS what FROM orders o JOIN payments p ON p.order_id = o.id
          WHERE (SELECT count(*) FROM compensation_events e WHERE e.order_id = o.id AND e.kind IN ('DOOR_ACCESS_GRANT','AI_ACCESS_GRANT')
                   AND (e.status = 'SUCCEEDED' OR (e.status = 'DEAD' AND EXISTS (SELECT 1 FROM exception_tickets t
                        WHERE t.kind = 'COMPENSATION_DEAD' AND t.detail->>'eventId' = e.id::text)))) <> 2",
        // A late payment without its ticket and its refund.
        "SELECT 'late payment ' || c.provider_txn_id || ' of ' || c.order_no || ' lacks ticket or refund' AS what
           FROM payment_callbacks c
          WHERE c.outcome = 'PAID_AFTER_CANCEL'
            AND (NOT EXISTS (SELECT 1 FROM exception_tickets t WHERE t.kind = 'PAID_AFTER_CANCEL' AND t.provider_txn_id = c.provider_txn_id)
              OR NOT EXISTS (SELECT 1 FROM compensation_events e WHERE e.kind = 'PROVIDER_REFUND'
                              AND e.payload->>'providerTxnId' = c.provider_txn_id))",
    ];
    let mut out = vec![];
    for sql in checks {
        match diesel::sql_query(sql).load::<Bad>(conn).await {
            Ok(rows) => out.extend(rows.into_iter().map(|r| r.what)),
            Err(e) => out.push(format!("check failed to run: {e}: {sql}")),
        }
    }
    out.extend(check_provider_money(conn, trades).await);
    out.extend(check_prepaid(conn).await);
    // No callback lost: every payment the provider took was processed (its key claimed).
    for ((order_no, txn), _) in provider.paid.iter() {
        let key = format!("{order_no}:{txn}");
        let n = diesel::sql_query("SELECT count(*) AS v FROM payment_keys WHERE key = $1")
            .bind::<diesel::sql_types::Text, _>(&key)
            .get_result::<V>(conn)
            .await
            .map(|v| v.v)
            .unwrap_or(0);
        if n != 1 {
            out.push(format!("payment {key} taken by the provider but never processed"));
        }
    }
    out
}

/// Prepaid money: no member holds more with an operator than the total its store allows, and
/// each store's ledger adds up and ends today at what it holds (its members' wallets and the
/// unused value of its paid cards and packs, counted here independently of `ledger.sql`).
pub async fn check_prepaid(conn: &mut diesel_async::AsyncPgConnection) -> Vec<String> {
    use diesel_async::RunQueryDsl;
    let mut out = vec![];
    #[derive(diesel::QueryableByName)]
    struct Capped {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        member: i64,
        #[diesel(sql_type = diesel::sql_types::Text)]
        operator: String,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        total: i64,
    }
    let capped: Vec<Capped> = diesel::sql_query(
        "SELECT DISTINCT m.id AS member, s.operator_code AS operator, r.total_max_cents AS total
           FROM members m JOIN orders o ON o.member_id = m.id JOIN stores s ON s.id = o.store_id
           JOIN prepaid_rules r ON r.store_id = s.id WHERE r.total_max_cents IS NOT NULL",
    )
    .load(conn)
    .await
    .unwrap_or_default();
    let tz = chrono_tz::Asia::Shanghai;
    for c in capped {
        match fitorder::prepaid::holdings(conn, c.member, &c.operator, chrono::Utc::now(), tz).await {
            Ok(h) if h.total_cents > c.total => out.push(format!(
                "member {} holds {} with operator {}, over the total {}",
                c.member, h.total_cents, c.operator, c.total
            )),
            Ok(_) => {}
            Err(e) => out.push(format!("holdings of member {}: {}", c.member, e.message())),
        }
    }
    let stores: Vec<V> = diesel::sql_query("SELECT id AS v FROM stores")
        .load(conn)
        .await
        .unwrap_or_default();
    let today = chrono::Utc::now().with_timezone(&tz).date_naive();
    for store in stores {
        let rows = match fitorder::prepaid::ledger::ledger(conn, store.v, today - chrono::Duration::days(2), today, tz)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                out.push(format!("ledger of store {}: {}", store.v, e.message()));
                continue;
            }
        };
        for w in rows.windows(2) {
            let (a, b) = (&w[0], &w[1]);
            if b.balance_cents != a.balance_cents + b.collected_cents - b.earned_cents - b.refunded_cents {
                out.push(format!("ledger of store {} does not add up on {}", store.v, b.date));
            }
        }
        let held = diesel::sql_query(
            "SELECT ((SELECT coalesce(sum(balance_cents + frozen_cents), 0) FROM members WHERE store_id = $1)
                   + (SELECT coalesce(sum(o.amount_cents - CASE
                         WHEN o.kind = 'CLASS_PACK' THEN CASE WHEN o.sessions_used >= o.sessions_total THEN o.amount_cents
                                                             ELSE o.amount_cents / o.sessions_total * o.sessions_used END
                         ELSE CASE WHEN $2 - (m.valid_from AT TIME ZONE 'Asia/Shanghai')::date + 1 >= o.plan_days THEN o.amount_cents
                                   ELSE o.amount_cents / o.plan_days * greatest(0, $2 - (m.valid_from AT TIME ZONE 'Asia/Shanghai')::date + 1) END
                         END), 0)
                        FROM orders o LEFT JOIN memberships m ON m.order_id = o.id
                       WHERE o.store_id = $1 AND o.status IN ('PAID', 'CONSUMING', 'CONSUMED')
                         AND (o.kind = 'MEMBERSHIP' OR (o.kind = 'CLASS_PACK' AND o.sessions_total > 1))))::bigint AS v",
        )
        .bind::<diesel::sql_types::BigInt, _>(store.v)
        .bind::<diesel::sql_types::Date, _>(today)
        .get_result::<V>(conn)
        .await
        .map(|v| v.v);
        match (held, rows.last()) {
            (Ok(h), Some(last)) if h != last.balance_cents => out.push(format!(
                "ledger of store {} ends today at {} but the store holds {h}",
                store.v, last.balance_cents
            )),
            (Err(e), _) => out.push(format!("what store {} holds: {e}", store.v)),
            _ => {}
        }
    }
    out
}

/// The checker itself must see broken books, or a green chaos run means nothing.
#[tokio::test]
async fn the_invariant_checker_catches_broken_books() {
    use diesel_async::RunQueryDsl;
    let app = crate::harness::TestApp::new().await;
    let s = app.studio(100_000, Some(40), 3).await;
    let placed = app
        .place(
            &s.member,
            json!({"idempotencyKey": crate::harness::key(), "storeId": s.store, "item": {"classPackId": s.pack}, "paymentMethod": "WALLET"}),
        )
        .await;
    let no = placed["order"]["orderNo"].as_str().unwrap().to_string();
    let mut conn = <diesel_async::AsyncPgConnection as diesel_async::AsyncConnection>::establish(&app.db_url)
        .await
        .unwrap();
    // The grants of a paid order were delivered (by the simulator, here by hand).
    diesel::sql_query("UPDATE compensation_events SET status = 'SUCCEEDED'")
        .execute(&mut conn)
        .await
        .unwrap();
    let mut provider = Provider::default();
    assert!(
        check_invariants(&mut conn, &provider, &[]).await.is_empty(),
        "a clean book has no violations"
    );
    // Now break it, one invariant at a time (each in a transaction rolled back afterwards), and
    // each check must see its own breakage: all nine checks of the books, the two of prepaid
    // money, and the lost callback.
    let breakages: [(&str, &[&str]); 11] = [
        (
            "illegal step in",
            &[
                "ALTER TABLE order_transitions DISABLE TRIGGER ALL",
                "UPDATE order_transitions SET to_status = 'CONSUMED' WHERE from_status = 'WAIT_PAY'",
            ],
        ),
        ("payments of", &["ALTER TABLE payments DISABLE TRIGGER ALL", "DELETE FROM payments"]),
        (
            "sessions of",
            &["ALTER TABLE orders DISABLE TRIGGER USER", "UPDATE orders SET sessions_used = 1"],
        ),
        (
            "differs from its ledger",
            &["ALTER TABLE members DISABLE TRIGGER USER", "UPDATE members SET balance_cents = balance_cents + 7"],
        ),
        (
            "frozen for waiting orders",
            &[
                "ALTER TABLE members DISABLE TRIGGER USER",
                "ALTER TABLE wallet_ledger DISABLE TRIGGER ALL",
                "UPDATE members SET frozen_cents = frozen_cents + 7",
                // The ledger agrees (so only the frozen check can see it).
                "INSERT INTO wallet_ledger (member_id, kind, balance_delta, frozen_delta, actor, trace_id)
                 SELECT id, 'FREEZE', 0, 7, 'broken', 'broken' FROM members",
            ],
        ),
        ("slot ", &["UPDATE coach_slots SET remaining = remaining - 1"]),
        ("pack ", &["UPDATE class_packs SET stock = stock - 1"]),
        (
            "grants of",
            &[
                "ALTER TABLE compensation_events DISABLE TRIGGER ALL",
                "DELETE FROM compensation_events WHERE kind = 'AI_ACCESS_GRANT'",
            ],
        ),
        (
            "late payment",
            &["INSERT INTO payment_callbacks (provider, verified, outcome, body, headers, order_no, provider_txn_id, trace_id)
               VALUES ('WECHAT_PAY', true, 'PAID_AFTER_CANCEL', '{}', '{}', 'FO-late', 'T-late', 'broken')"],
        ),
        (
            "over the total",
            &["INSERT INTO prepaid_rules (store_id, preset, total_max_cents, cooling_off_days, refund_within_working_days, set_by, trace_id)
               SELECT id, 'CUSTOM', 1, 0, 5, 'broken', 'broken' FROM stores"],
        ),
        (
            "ends today at",
            // Wallet money the ledger cannot see (dated after today).
            &["INSERT INTO wallet_ledger (member_id, kind, balance_delta, frozen_delta, actor, trace_id, created_at)
               SELECT id, 'TOP_UP', 5, 0, 'broken', 'broken', now() + interval '3 days' FROM members"],
        ),
    ];
    let clean = Provider::default();
    for (expected, sqls) in breakages {
        diesel::sql_query("BEGIN").execute(&mut conn).await.unwrap();
        for sql in sqls {
            diesel::sql_query(*sql)
                .execute(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        let found = check_invariants(&mut conn, &clean, &[]).await;
        diesel::sql_query("ROLLBACK").execute(&mut conn).await.unwrap();
        assert!(
            found.iter().any(|f| f.contains(expected)),
            "the checker missed '{expected}':\n{}",
            found.join("\n")
        );
        assert!(
            !found.iter().any(|f| f.starts_with("check failed to run")),
            "{}",
            found.join("\n")
        );
        assert!(
            check_invariants(&mut conn, &clean, &[]).await.is_empty(),
            "rolled back, the book is clean again"
        );
    }
    // The provider's side: money it collected that fitorder neither applied nor refunded, and a
    // refund recorded done that the provider never finished.
    let collected = ProviderTrade {
        provider: "WECHAT_PAY".into(),
        out_trade_no: no.clone(),
        txn_id: Some("4200000000000000000000000404".into()),
        paid: true,
        refunds: vec![],
    };
    let found = check_invariants(&mut conn, &clean, std::slice::from_ref(&collected))
        .await
        .join("\n");
    assert!(found.contains("neither applied nor refunded"), "{found}");
    diesel::sql_query("BEGIN").execute(&mut conn).await.unwrap();
    diesel::sql_query(format!(
        "UPDATE compensation_events SET kind = 'PROVIDER_REFUND',
                payload = payload || '{{\"provider\": \"WECHAT_PAY\", \"orderNo\": \"{no}\", \"refundNo\": \"RF-not-finished\"}}'::jsonb
          WHERE kind = 'AI_ACCESS_GRANT'"
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    let unpaid = ProviderTrade {
        paid: false,
        ..collected.clone()
    };
    let found = check_invariants(&mut conn, &clean, std::slice::from_ref(&unpaid))
        .await
        .join("\n");
    assert!(found.contains("has not finished it"), "{found}");
    let finished = ProviderTrade {
        refunds: vec![("RF-not-finished".into(), "SUCCESS".into())],
        ..unpaid
    };
    let found = check_invariants(&mut conn, &clean, &[finished]).await.join("\n");
    assert!(!found.contains("has not finished it"), "{found}");
    diesel::sql_query("ROLLBACK").execute(&mut conn).await.unwrap();
    // A payment the provider took that never reached fitorder.
    provider.paid.insert((no.clone(), "T-never-sent".into()), 100);
    let found = check_invariants(&mut conn, &provider, &[]).await.join("\n");
    assert!(
        found.contains("never processed"),
        "the checker missed a lost callback:\n{found}"
    );
}
