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
        // A paid order whose grants were neither delivered nor DEAD with a ticket (the payment's
        // two, `<orderNo>:<KIND>`; a card's freezes and transfer have grants of their own keys).
        "SELECT 'grants of ' || o.order_no || ' not settled' AS what FROM orders o JOIN payments p ON p.order_id = o.id
          WHERE (SELECT count(*) FROM compensation_events e WHERE e.order_id = o.id AND e.kind IN ('DOOR_ACCESS_GRANT','AI_ACCESS_GRANT')
                   AND e.idempotency_key = o.order_no || ':' || e.kind
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
    out.extend(check_cards(conn).await);
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

/// Whether the server records when each transaction committed (`track_commit_timestamp`: the
/// chaos cluster turns it on).
pub async fn commit_timestamps(conn: &mut diesel_async::AsyncPgConnection) -> bool {
    scalar(
        conn,
        "SELECT (current_setting('track_commit_timestamp') = 'on')::int::bigint AS v",
    )
    .await
        == 1
}

/// (a) No check-in succeeded on a frozen card. The intervals a card was frozen are read from
/// its history, not from its freezes' dates: from the change that made it FROZEN (from
/// ACTIVE: a freeze from today, or a scheduled one the scheduler started — whose `from_date`
/// may still be ahead when its start was moved by hand) to the next change that took it out of
/// FROZEN (UNFROZEN: ended early or on time; REVOKED: refunded), or open while it still is.
/// The start of `from_date` is not the bound: a freeze from today is asked for in the course
/// of the day, and check-ins before it are the card's.
///
/// Each instant is the one its transaction committed at (`{ts_e}`, `{ts_c}` below: the commit
/// timestamp of the row's transaction, or for a row of a transaction not committed or on a
/// server without commit timestamps, the row's own `at`). That is exact: a check-in reads its card FOR SHARE and holds the lock until
/// it commits, and every change of a card takes the card's row lock, so a check-in that saw
/// the card ACTIVE commits before the freeze that follows commits, or after the change that
/// ended it committed. A check-in committed strictly between is one that let a frozen card in.
/// (The `at` columns alone are not: a check-in's `at` is its transaction's start, which may
/// precede an unfreeze it waited for.)
pub const FROZEN_CHECK_INS: &str = "
    WITH ev AS (
        SELECT e.id, e.membership_id, e.from_status, e.to_status, {ts_e} AS t FROM membership_events e
    ), frozen AS (
        SELECT s.membership_id, s.t AS since,
               (SELECT x.t FROM ev x
                 WHERE x.membership_id = s.membership_id AND x.id > s.id
                   AND x.from_status = 'FROZEN' AND x.to_status <> 'FROZEN'
                 ORDER BY x.id LIMIT 1) AS until
          FROM ev s
         WHERE s.to_status = 'FROZEN' AND s.from_status IS DISTINCT FROM 'FROZEN'
    )
    SELECT 'check-in ' || c.consume_txn_no || ' of ' || o.order_no || ' committed at ' || {ts_c}
           || ' while its card ' || m.id || ' was frozen (from ' || f.since || ' until '
           || coalesce(f.until::text, 'now') || ')' AS what
      FROM check_ins c
      JOIN orders o ON o.id = c.order_id
      JOIN memberships m ON m.order_id = c.order_id
      JOIN frozen f ON f.membership_id = m.id
     WHERE {ts_c} > f.since AND (f.until IS NULL OR {ts_c} < f.until)";

/// The cards' books (issue 36): (a) [`FROZEN_CHECK_INS`], (b) door and AI access, (c) validity
/// and days frozen, and the card's status against its freezes and its order.
pub async fn check_cards(conn: &mut diesel_async::AsyncPgConnection) -> Vec<String> {
    use diesel_async::RunQueryDsl;
    let (ts_e, ts_c) = if commit_timestamps(conn).await {
        (
            "coalesce(pg_xact_commit_timestamp(e.xmin), e.at)",
            "coalesce(pg_xact_commit_timestamp(c.xmin), c.at)",
        )
    } else {
        ("e.at", "c.at")
    };
    let frozen_check_ins = FROZEN_CHECK_INS.replace("{ts_e}", ts_e).replace("{ts_c}", ts_c);
    let checks = [
        frozen_check_ins.as_str(),
        // (b) The last door and AI-device action for each member matches the cards they hold.
        // For each card's order, each member named in its access events (payload memberId: the
        // payment's grants and a refund's revokes name the holder of the day, a freeze's and its
        // end's the holder, a transfer's revokes the old holder and its grants the new one) and
        // each device (DOOR, AI), and the card's holder and each device even without an event
        // (a holder never granted is caught): the last of those events delivered (SUCCEEDED;
        // one order's events of a device are delivered in the order they were decided, so the
        // last by id is the last the device took) is a GRANT exactly when the card is that
        // member's and ACTIVE
        // — a FROZEN card, a REVOKED (refunded) one, or one transferred away: a REVOKE, or
        // nothing delivered at all. Not judged: a member and device whose events include a DEAD
        // one decided after the last delivered (the device was left as it was, and the DEAD
        // event is a ticket, which the next check requires), and one with events still on their
        // way (none once the outbox drained, which the run waits for; a freeze starting at a
        // midnight during the check would make some). An order never paid has no card and no
        // access events: nothing to judge. Orders without a card (packs, sessions) are not
        // judged here.
        "WITH acc AS (
             SELECT e.id, e.order_id, e.payload->>'memberId' AS member, split_part(e.kind, '_', 1) AS device,
                    split_part(e.kind, '_', 3) AS action, e.status
               FROM compensation_events e
              WHERE e.kind IN ('DOOR_ACCESS_GRANT', 'DOOR_ACCESS_REVOKE', 'AI_ACCESS_GRANT', 'AI_ACCESS_REVOKE')
         ), pairs AS (
             SELECT order_id, member, device FROM acc
             UNION
             SELECT m.order_id, m.member_id::text, d.device FROM memberships m CROSS JOIN (VALUES ('DOOR'), ('AI')) d (device)
         ), last AS (
             SELECT p.order_id, p.member, p.device,
                    (SELECT max(a.id) FROM acc a WHERE a.order_id = p.order_id AND a.member = p.member
                        AND a.device = p.device AND a.status = 'SUCCEEDED') AS last_id,
                    EXISTS (SELECT 1 FROM acc a WHERE a.order_id = p.order_id AND a.member = p.member
                               AND a.device = p.device AND a.status IN ('PENDING', 'RETRYING')) AS moving
               FROM pairs p
         ), judged AS (
             SELECT l.*, (SELECT a.action FROM acc a WHERE a.id = l.last_id) AS last_action,
                    EXISTS (SELECT 1 FROM acc a WHERE a.order_id = l.order_id AND a.member = l.member
                               AND a.device = l.device AND a.status = 'DEAD' AND a.id > coalesce(l.last_id, 0)) AS dead
               FROM last l
         )
         SELECT 'access of member ' || j.member || ' (' || j.device || ') for ' || o.order_no || ': last delivered '
                || coalesce(j.last_action, 'nothing') || ', but card ' || m.id || ' is ' || m.status
                || ' held by member ' || m.member_id AS what
           FROM judged j JOIN orders o ON o.id = j.order_id JOIN memberships m ON m.order_id = j.order_id
          WHERE NOT j.dead AND NOT j.moving
            AND (m.member_id::text = j.member AND m.status = 'ACTIVE') <> (j.last_action IS NOT DISTINCT FROM 'GRANT')",
        // A door or AI-device event given up on is a ticket.
        "SELECT 'access event ' || e.idempotency_key || ' is DEAD without its ticket' AS what
           FROM compensation_events e
          WHERE e.kind IN ('DOOR_ACCESS_GRANT', 'DOOR_ACCESS_REVOKE', 'AI_ACCESS_GRANT', 'AI_ACCESS_REVOKE')
            AND e.status = 'DEAD'
            AND NOT EXISTS (SELECT 1 FROM exception_tickets t
                             WHERE t.kind = 'COMPENSATION_DEAD' AND t.detail->>'eventId' = e.id::text)",
        // (c) validTo = start + plan days + days frozen, and the days frozen are those of its
        // freezes that started (RUNNING: its whole days; DONE: the days it kept, an early end
        // having given the rest back; SCHEDULED and CALLED_OFF count none). `valid_from` is the
        // card's start: a renewal queued behind a current card starts when that one ends.
        "SELECT 'card ' || m.id || ' of ' || o.order_no || ': valid from ' || m.valid_from || ' to ' || m.valid_to
                || ' with a plan of ' || p.duration_days || ' days and ' || m.frozen_days || ' days frozen; its freezes ran '
                || coalesce(f.days, 0) || ' days' AS what
           FROM memberships m
           JOIN orders o ON o.id = m.order_id
           JOIN membership_plans p ON p.id = m.plan_id
           LEFT JOIN (SELECT membership_id, sum(until_date - from_date) AS days FROM membership_freezes
                       WHERE state IN ('RUNNING', 'DONE') GROUP BY membership_id) f ON f.membership_id = m.id
          WHERE m.valid_to - m.valid_from <> make_interval(days => p.duration_days + m.frozen_days)
             OR m.frozen_days <> coalesce(f.days, 0)",
        // A card is FROZEN exactly while one of its freezes runs; a refunded card has nothing
        // scheduled; the order is its holder's (it passes with the card).
        "SELECT 'card ' || m.id || ' of ' || o.order_no || ' is ' || m.status || ' with '
                || count(f.id) FILTER (WHERE f.state = 'RUNNING') || ' running and '
                || count(f.id) FILTER (WHERE f.state = 'SCHEDULED') || ' scheduled freezes, held by member '
                || m.member_id || ', its order by member ' || o.member_id AS what
           FROM memberships m
           JOIN orders o ON o.id = m.order_id
           LEFT JOIN membership_freezes f ON f.membership_id = m.id
          GROUP BY m.id, o.order_no, o.member_id
         HAVING (m.status = 'FROZEN') <> (count(f.id) FILTER (WHERE f.state = 'RUNNING') = 1)
             OR count(f.id) FILTER (WHERE f.state = 'RUNNING') > 1
             OR (m.status = 'REVOKED' AND count(f.id) FILTER (WHERE f.state = 'SCHEDULED') > 0)
             OR m.member_id <> o.member_id",
    ];
    let mut out = vec![];
    for sql in checks {
        match diesel::sql_query(sql).load::<Bad>(conn).await {
            Ok(rows) => out.extend(rows.into_iter().map(|r| r.what)),
            Err(e) => out.push(format!("check failed to run: {e}: {sql}")),
        }
    }
    out
}

/// (b) as the door and the AI devices saw it: every call the downstream answered 2xx, in the
/// order it took them, each idempotency key applied once (a downstream that keeps keys ignores a
/// redelivery); the last action it applied for each card order, member and device is a GRANT
/// exactly when the card is that member's and ACTIVE (not judged: a member and device with a DEAD
/// event decided after the last one applied). And an event recorded delivered reached it.
pub async fn check_downstream(conn: &mut diesel_async::AsyncPgConnection, calls: &[crate::fakes::Call]) -> Vec<String> {
    use diesel_async::RunQueryDsl;
    use std::collections::{BTreeMap, HashMap, HashSet};
    #[derive(diesel::QueryableByName)]
    struct Held {
        #[diesel(sql_type = diesel::sql_types::Text)]
        order_no: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        holder: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        status: String,
    }
    #[derive(diesel::QueryableByName)]
    struct Ev {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        id: i64,
        #[diesel(sql_type = diesel::sql_types::Text)]
        order_no: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        member: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        device: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        status: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        key: String,
    }
    let mut out = vec![];
    let cards: Vec<Held> = match diesel::sql_query(
        "SELECT o.order_no, m.member_id::text AS holder, m.status FROM memberships m JOIN orders o ON o.id = m.order_id",
    )
    .load(conn)
    .await
    {
        Ok(c) => c,
        Err(e) => return vec![format!("check failed to run: cards: {e}")],
    };
    let events: Vec<Ev> = match diesel::sql_query(
        "SELECT e.id, o.order_no, e.payload->>'memberId' AS member, split_part(e.kind, '_', 1) AS device, e.status,
                e.idempotency_key AS key
           FROM compensation_events e JOIN orders o ON o.id = e.order_id
          WHERE e.kind IN ('DOOR_ACCESS_GRANT', 'DOOR_ACCESS_REVOKE', 'AI_ACCESS_GRANT', 'AI_ACCESS_REVOKE')",
    )
    .load(conn)
    .await
    {
        Ok(e) => e,
        Err(e) => return vec![format!("check failed to run: access events: {e}")],
    };
    let held: HashMap<&str, (&str, &str)> = cards
        .iter()
        .map(|c| (c.order_no.as_str(), (c.holder.as_str(), c.status.as_str())))
        .collect();
    // (order, member, device) -> (action, event id) of the last call applied.
    let mut applied: BTreeMap<(String, String, String), (String, i64)> = BTreeMap::new();
    let mut keys: HashSet<String> = HashSet::new();
    for c in calls.iter().filter(|c| c.body["__ok"] == true) {
        let b = &c.body;
        let key = b["idempotencyKey"].as_str().unwrap_or_default().to_string();
        if !keys.insert(key.clone()) {
            continue;
        }
        let device = key
            .split(':')
            .nth(1)
            .unwrap_or_default()
            .split('_')
            .next()
            .unwrap_or_default();
        let id: i64 = b["eventId"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0);
        applied.insert(
            (
                b["orderNo"].as_str().unwrap_or_default().to_string(),
                b["memberId"].as_str().unwrap_or_default().to_string(),
                device.to_string(),
            ),
            (b["action"].as_str().unwrap_or_default().to_string(), id),
        );
    }
    for e in events.iter().filter(|e| e.status == "SUCCEEDED") {
        if !keys.contains(&e.key) {
            out.push(format!(
                "access event {} recorded delivered, but the downstream never took it",
                e.key
            ));
        }
    }
    let mut pairs: HashSet<(String, String, String)> = applied.keys().cloned().collect();
    pairs.extend(
        events
            .iter()
            .map(|e| (e.order_no.clone(), e.member.clone(), e.device.clone())),
    );
    for c in &cards {
        for device in ["DOOR", "AI"] {
            pairs.insert((c.order_no.clone(), c.holder.clone(), device.to_string()));
        }
    }
    let mut pairs: Vec<_> = pairs.into_iter().collect();
    pairs.sort();
    for (order_no, member, device) in pairs {
        let Some((holder, status)) = held.get(order_no.as_str()) else {
            continue;
        };
        let last = applied.get(&(order_no.clone(), member.clone(), device.clone()));
        let last_id = last.map(|(_, id)| *id).unwrap_or(0);
        let dead_after = events.iter().any(|e| {
            e.order_no == order_no && e.member == member && e.device == device && e.status == "DEAD" && e.id > last_id
        });
        if dead_after {
            continue;
        }
        let should = *holder == member && *status == "ACTIVE";
        let granted = last.is_some_and(|(a, _)| a == "GRANT");
        if should != granted {
            out.push(format!(
                "the downstream's {device} access of member {member} for {order_no} is {}, but the card is {status} held by member {holder}",
                last.map(|(a, _)| a.as_str()).unwrap_or("nothing")
            ));
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
                         ELSE CASE WHEN u.days >= o.plan_days THEN o.amount_cents
                                   ELSE o.amount_cents / o.plan_days * greatest(0, u.days) END
                         END), 0)
                        FROM orders o LEFT JOIN memberships m ON m.order_id = o.id
                        -- a card's days used through today: its dates from its first, without
                        -- those frozen (freezes that started; a date frozen earns nothing)
                        CROSS JOIN LATERAL (SELECT $2 - (m.valid_from AT TIME ZONE 'Asia/Shanghai')::date + 1
                               - coalesce((SELECT sum(greatest(0, least(f.until_date, $2 + 1) - f.from_date))
                                             FROM membership_freezes f
                                            WHERE f.membership_id = m.id AND f.state IN ('RUNNING', 'DONE')), 0) AS days) u
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
    // A card, frozen from today for a moment and unfrozen (its day frozen counts), and a second
    // one transferred to another member for a fee.
    let card_no = app
        .buy(&s.member, &s.store, json!({"membershipPlanId": s.plan}), "WALLET")
        .await;
    let card = app.order(&card_no).await["membership"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let today = chrono::Utc::now()
        .with_timezone(&app.state.config.timezone)
        .date_naive();
    app.admin(
        "mutation($id: ID!, $from: Date!) { freezeMembership(id: $id, from: $from, days: 3, reason: \"trip\") { id } }",
        json!({"id": card, "from": today.to_string()}),
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    app.admin(
        "mutation($id: ID!) { unfreezeMembership(id: $id) { id } }",
        json!({"id": card}),
    )
    .await;
    let friend = app.new_member(&s.store, 0).await;
    let gift_no = app
        .buy(&s.member, &s.store, json!({"membershipPlanId": s.plan}), "WALLET")
        .await;
    let gift = app.order(&gift_no).await["membership"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    app.admin(
        "mutation($id: ID!, $to: ID!) { transferMembership(id: $id, toMemberId: $to, feeCents: 500, reason: \"gift\") { id } }",
        json!({"id": gift, "to": friend}),
    )
    .await;
    let mut conn = <diesel_async::AsyncPgConnection as diesel_async::AsyncConnection>::establish(&app.db_url)
        .await
        .unwrap();
    // The grants of a paid order were delivered (by the simulator, here by hand).
    diesel::sql_query("UPDATE compensation_events SET status = 'SUCCEEDED'")
        .execute(&mut conn)
        .await
        .unwrap();
    let mut provider = Provider::default();
    let found = check_invariants(&mut conn, &provider, &[]).await;
    assert!(
        found.is_empty(),
        "a clean book has no violations:\n{}",
        found.join("\n")
    );
    // Now break it, one invariant at a time (each in a transaction rolled back afterwards), and
    // each check must see its own breakage: all nine checks of the books, the two of prepaid
    // money, the five of the cards (two ways each for access and validity), and the lost callback.
    let breakages: [(&str, &[&str]); 18] = [
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
            &["ALTER TABLE orders DISABLE TRIGGER USER", "UPDATE orders SET sessions_used = 1 WHERE kind <> 'MEMBERSHIP'"],
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
        // The cards' books (issue 36).
        (
            "while its card",
            // A check-in in the moment the card was frozen.
            &["INSERT INTO check_ins (order_id, consume_txn_no, sessions, remaining_after, actor, trace_id, at)
               SELECT m.order_id, 'broken', 0, 0, 'broken', 'broken', e.at + interval '150 milliseconds'
                 FROM memberships m JOIN membership_events e ON e.membership_id = m.id
                WHERE e.from_status = 'ACTIVE' AND e.to_status = 'FROZEN'"],
        ),
        (
            "access of member",
            // The grants after the freeze never made: the door still refuses an active card.
            &[
                "ALTER TABLE compensation_events DISABLE TRIGGER ALL",
                "DELETE FROM compensation_events WHERE idempotency_key LIKE '%:DOOR_ACCESS_GRANT:FREEZE-%'",
            ],
        ),
        (
            "access of member",
            // The old holder of a transferred card keeps the door.
            &[
                "ALTER TABLE compensation_events DISABLE TRIGGER ALL",
                "DELETE FROM compensation_events WHERE idempotency_key LIKE '%:AI_ACCESS_REVOKE:TRANSFER'",
            ],
        ),
        (
            "DEAD without its ticket",
            &[
                "ALTER TABLE compensation_events DISABLE TRIGGER ALL",
                "UPDATE compensation_events SET status = 'DEAD' WHERE idempotency_key LIKE '%:AI_ACCESS_GRANT:FREEZE-%'",
            ],
        ),
        (
            "days frozen; its freezes ran",
            &["UPDATE memberships SET valid_to = valid_to + interval '1 day'"],
        ),
        (
            "days frozen; its freezes ran",
            &["UPDATE membership_freezes SET until_date = until_date + 1, ends_at = ends_at + interval '1 day'"],
        ),
        (
            "running and",
            &["UPDATE memberships SET status = 'FROZEN' WHERE transferred_at IS NULL AND frozen_days > 0"],
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
    // The door and the AI devices as the downstream saw them: every access event delivered once,
    // in order, is clean; the last grant after the freeze lost, or a delivery recorded that the
    // downstream never took, is not.
    #[derive(diesel::QueryableByName)]
    struct Delivered {
        #[diesel(sql_type = diesel::sql_types::Jsonb)]
        body: serde_json::Value,
    }
    let delivered: Vec<Delivered> = diesel::sql_query(
        "SELECT jsonb_build_object('eventId', id::text, 'orderNo', payload->>'orderNo', 'memberId', payload->>'memberId',
                                   'action', split_part(kind, '_', 3), 'idempotencyKey', idempotency_key, '__ok', true) AS body
           FROM compensation_events WHERE kind LIKE '%ACCESS%' ORDER BY id",
    )
    .load(&mut conn)
    .await
    .unwrap();
    let calls: Vec<crate::fakes::Call> = delivered
        .into_iter()
        .map(|d| crate::fakes::Call {
            body: d.body,
            trace_id: None,
        })
        .collect();
    let found = check_downstream(&mut conn, &calls).await;
    assert!(found.is_empty(), "{}", found.join("\n"));
    // Delivered twice, the second time long after: the first delivery of a key is what counts.
    let mut twice = calls.clone();
    twice.push(calls[0].clone());
    assert!(check_downstream(&mut conn, &twice).await.is_empty());
    let lost: Vec<_> = calls
        .iter()
        .filter(|c| {
            !c.body["idempotencyKey"]
                .as_str()
                .unwrap()
                .contains(":DOOR_ACCESS_GRANT:FREEZE-")
        })
        .cloned()
        .collect();
    let found = check_downstream(&mut conn, &lost).await.join("\n");
    assert!(found.contains("the downstream's DOOR access of member"), "{found}");
    assert!(found.contains("the downstream never took it"), "{found}");
    // A payment the provider took that never reached fitorder.
    provider.paid.insert((no.clone(), "T-never-sent".into()), 100);
    let found = check_invariants(&mut conn, &provider, &[]).await.join("\n");
    assert!(
        found.contains("never processed"),
        "the checker missed a lost callback:\n{found}"
    );
}

/// One text column, for the chaos run's report of what never settled.
#[derive(diesel::QueryableByName)]
pub struct Text {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub v: String,
}
