//! What happens in a chaos run: the studio set up over GraphQL, then random actions of members,
//! staff and the providers — orders placed (some with a used key), paid online once, twice, late
//! or never, check-ins racing, cancels, refunds, offline confirmations — and the cards' life
//! (issue 36): freezes from today and from a later day, days passing for a freeze (its start
//! or end moved into the past by hand, for the processes' `membership:tick` to act on),
//! unfreezes, transfers for a fee, check-ins on frozen cards and racing freezes.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use fitorder::auth::{issue_token, Role};
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};

use super::cluster::SECRET;
use crate::providers;

/// What the simulated providers believe: trades they collected money for.
#[derive(Default)]
pub struct Provider {
    /// (order, txn) -> fen, for every payment the provider took.
    pub paid: HashMap<(String, String), i64>,
    /// Notifications not yet acknowledged with a 2xx: the provider retries them.
    pub pending: Vec<Notification>,
    /// Notifications held back until a later step: (step, notification).
    pub late: Vec<(usize, Notification)>,
}

impl Provider {
    /// Late notifications whose time has come join the pending ones.
    fn release_due(&mut self, step: usize) {
        let (due, rest): (Vec<_>, Vec<_>) = self.late.drain(..).partition(|(at, _)| *at <= step);
        self.late = rest;
        for (_, n) in due {
            self.pending.push(n);
        }
    }

    /// Everything held back is due now.
    pub fn release_all(&mut self) {
        for (_, n) in self.late.drain(..) {
            self.pending.push(n);
        }
    }
}

#[derive(Clone)]
pub struct Notification {
    alipay: bool,
    order_no: String,
    txn: String,
    fen: i64,
}

pub struct World {
    http: reqwest::Client,
    /// The providers' APIs: members who pay during the close pay there.
    sandbox: fitorder::dev::sandbox_server::SandboxProvider,
    urls: Vec<String>,
    admin: String,
    store: String,
    members: Vec<String>,
    packs: Vec<String>,
    slots: Vec<String>,
    plan: String,
    orders: Vec<(String, String, String)>, // (order_no, member, method)
    keys: Vec<(String, Value)>,            // used idempotency keys and their inputs
    /// Placements and top-ups refused over a prepaid cap (they must happen for the run to mean
    /// anything about caps).
    pub prepaid_refused: usize,
    /// The database, for choosing cards and moving a freeze's days (`None` while it is away).
    db_url: String,
    db: Option<diesel_async::AsyncPgConnection>,
    /// What the card actions asked and how they were answered: "freeze today: ok",
    /// "transfer: PREPAID_LIMIT", ….
    pub cards: BTreeMap<String, usize>,
    /// Check-ins refused with MEMBERSHIP_FROZEN (they must happen for the freezes to mean
    /// anything about check-ins).
    pub frozen_check_ins_refused: usize,
    /// Members who joined during the run to buy a card (a member's second card waits behind
    /// the first, and only a started card freezes from today); transfers go to them too (they
    /// have room under the prepaid cap). The script's other actions use their orders as any.
    joined: Vec<String>,
}

/// A card of the run as the database holds it when an action chooses one.
#[derive(diesel::QueryableByName, Debug, Clone)]
struct Card {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    member_id: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    order_no: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    status: String,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    transferred: bool,
    /// Its first day has come (a renewal waits behind the member's current card).
    #[diesel(sql_type = diesel::sql_types::Bool)]
    started: bool,
    /// Its running freeze's end has come (moved into the past): the scheduler's to end.
    #[diesel(sql_type = diesel::sql_types::Bool)]
    ending: bool,
    /// Its freezes that count against the plan's (3) and whether one of them has today.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    freezes: i64,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    today_frozen: bool,
}

#[derive(diesel::QueryableByName)]
struct Id {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
}

/// How an answer came back: "ok", the refusal's `extensions.reason` (or its code), or "no
/// answer" (a process killed, PostgreSQL restarting).
fn outcome(r: &Option<Value>) -> String {
    match r {
        None => "no answer".into(),
        Some(r) => match r.get("errors").and_then(|e| e.get(0)) {
            None => "ok".into(),
            Some(e) => e["extensions"]["reason"]
                .as_str()
                .or(e["extensions"]["code"].as_str())
                .unwrap_or("error")
                .to_string(),
        },
    }
}

/// Today in the business time zone (the processes run with the default, Asia/Shanghai).
fn today() -> chrono::NaiveDate {
    chrono::Utc::now()
        .with_timezone(&chrono_tz::Asia::Shanghai)
        .date_naive()
}

impl World {
    /// The studio: a store, six members with money in their wallets, a pack with stock and one
    /// without, two coach slots (3 and 8 seats) and a membership plan.
    pub async fn set_up(
        http: &reqwest::Client,
        urls: &[String],
        sandbox: fitorder::dev::sandbox_server::SandboxProvider,
        db_url: &str,
    ) -> World {
        let mut w = World {
            http: http.clone(),
            sandbox,
            urls: urls.to_vec(),
            admin: issue_token(SECRET, Role::Admin, "chaos", None, Duration::from_secs(3600)),
            store: String::new(),
            members: vec![],
            packs: vec![],
            slots: vec![],
            plan: String::new(),
            orders: vec![],
            keys: vec![],
            prepaid_refused: 0,
            db_url: db_url.to_string(),
            db: None,
            cards: BTreeMap::new(),
            frozen_check_ins_refused: 0,
            joined: vec![],
        };
        // The studio.
        let u = w.urls[0].clone();
        let r = w
            .gql(
                &u,
                &w.admin,
                "mutation { createStore(input: {name: \"Chaos\", code: \"CHAOS\"}) { id } }",
                json!({}),
            )
            .await
            .unwrap();
        w.store = r["data"]["createStore"]["id"].as_str().unwrap().to_string();
        // Prepaid rules that bite: ¥5,500 in all per member (each starts with ¥5,000 in the
        // wallet), a week's cooling-off.
        let r = w
            .gql(
                &u,
                &w.admin,
                "mutation($s: ID!) { setPrepaidRules(storeId: $s, input: {preset: CUSTOM, totalMaxCents: 550000, coolingOffDays: 7}) { id } }",
                json!({"s": w.store}),
            )
            .await
            .unwrap();
        assert!(r.get("errors").is_none(), "{r}");
        for i in 0..6 {
            let r = w
                .gql(
                    &u,
                    &w.admin,
                    "mutation($i: CreateMemberInput!) { createMember(input: $i) { id } }",
                    json!({"i": {"storeId": w.store, "name": format!("M{i}"), "phone": format!("1380000{i:04}")}}),
                )
                .await
                .unwrap();
            let m = r["data"]["createMember"]["id"].as_str().unwrap().to_string();
            w.gql(
                &u,
                &w.admin,
                "mutation($m: ID!) { topUpWallet(memberId: $m, amountCents: 500000, reference: \"init\") { id } }",
                json!({"m": m}),
            )
            .await;
            w.members.push(m);
        }
        let stocks = [Some(40), None];
        for stock in stocks {
            let r = w
                .gql(
                    &u,
                    &w.admin,
                    "mutation($i: CreateClassPackInput!) { createClassPack(input: $i) { id } }",
                    json!({"i": {"storeId": w.store, "name": "Pack", "sessions": 5, "priceCents": 5000, "stock": stock}}),
                )
                .await
                .unwrap();
            w.packs
                .push(r["data"]["createClassPack"]["id"].as_str().unwrap().to_string());
        }
        let starts = chrono::Utc::now() + chrono::Duration::days(2);
        for cap in [3, 8] {
            let r = w
                .gql(&u, &w.admin, "mutation($i: CreateCoachSlotInput!) { createCoachSlot(input: $i) { id } }",
                     json!({"i": {"storeId": w.store, "coachName": "Coach", "startsAt": starts.to_rfc3339(),
                                  "endsAt": (starts + chrono::Duration::hours(1)).to_rfc3339(), "capacity": cap, "priceCents": 20000}}))
                .await
                .unwrap();
            w.slots
                .push(r["data"]["createCoachSlot"]["id"].as_str().unwrap().to_string());
        }
        let r = w
            .gql(
                &u,
                &w.admin,
                "mutation($i: CreateMembershipPlanInput!) { createMembershipPlan(input: $i) { id } }",
                json!({"i": {"storeId": w.store, "name": "Month", "durationDays": 30, "priceCents": 30000}}),
            )
            .await
            .unwrap();
        w.plan = r["data"]["createMembershipPlan"]["id"].as_str().unwrap().to_string();
        w
    }

    /// The trades of every order the run placed, as the provider holds them now.
    pub fn provider_trades(&self) -> Vec<super::invariants::ProviderTrade> {
        self.orders
            .iter()
            .flat_map(|(no, ..)| ["WECHAT_PAY", "ALIPAY"].map(|p| self.sandbox.trade(p, no)))
            .flatten()
            .map(Into::into)
            .collect()
    }

    fn url(&self, rng: &mut StdRng) -> String {
        self.urls[rng.random_range(0..self.urls.len())].clone()
    }

    async fn gql(&self, url: &str, token: &str, query: &str, vars: Value) -> Option<Value> {
        let r = self
            .http
            .post(format!("{url}/graphql"))
            .bearer_auth(token)
            .json(&json!({"query": query, "variables": vars}))
            .send()
            .await
            .ok()?;
        r.json().await.ok()
    }

    /// Step `step` of the script: the provider may deliver one pending notification, then one
    /// random action.
    pub async fn act(&mut self, step: usize, rng: &mut StdRng, provider: &mut Provider) {
        provider.release_due(step);
        if !provider.pending.is_empty() && rng.random_bool(0.5) {
            let i = rng.random_range(0..provider.pending.len());
            let n = provider.pending[i].clone();
            let url = self.url(rng);
            if send(&self.http, &url, &n).await {
                provider.pending.swap_remove(i);
            }
        }
        let member = self.members[rng.random_range(0..self.members.len())].clone();
        let token = issue_token(SECRET, Role::Member, &member, None, Duration::from_secs(3600));
        let url = self.url(rng);
        // 0–99: orders, check-ins and their money; 100–177: the cards' life.
        match rng.random_range(0..178) {
            // Place an order (sometimes a double tap with a used key).
            0..=34 => {
                let input = if !self.keys.is_empty() && rng.random_bool(0.1) {
                    self.keys[rng.random_range(0..self.keys.len())].1.clone()
                } else {
                    let method = ["WECHAT_PAY", "ALIPAY", "WALLET", "OFFLINE", "MIXED"][rng.random_range(0..5)];
                    let item = match rng.random_range(0..3) {
                        0 => json!({"classPackId": self.packs[rng.random_range(0..self.packs.len())]}),
                        1 => json!({"coachSlotId": self.slots[rng.random_range(0..self.slots.len())]}),
                        _ => json!({"membershipPlanId": self.plan}),
                    };
                    let mut input = json!({"idempotencyKey": format!("k{step}"), "storeId": self.store, "item": item,
                                           "paymentMethod": method, "memberId": member});
                    if method == "MIXED" {
                        input["walletAmountCents"] = json!(1000);
                        input["onlineProvider"] = json!(if rng.random_bool(0.5) { "ALIPAY" } else { "WECHAT_PAY" });
                    }
                    input
                };
                let owner = input["memberId"].as_str().unwrap().to_string();
                let t = issue_token(SECRET, Role::Member, &owner, None, Duration::from_secs(3600));
                let q = "mutation($input: PlaceOrderInput!) { placeOrder(input: $input) { order { orderNo paymentMethod } payment { provider amountCents } } }";
                if let Some(r) = self.gql(&url, &t, q, json!({"input": input.clone()})).await {
                    if r["errors"][0]["extensions"]["reason"] == "PREPAID_LIMIT" {
                        self.prepaid_refused += 1;
                    }
                    if let Some(o) = r["data"]["placeOrder"]["order"].as_object() {
                        let no = o["orderNo"].as_str().unwrap().to_string();
                        if !self.orders.iter().any(|(n, ..)| *n == no) {
                            self.orders.push((
                                no.clone(),
                                owner.clone(),
                                o["paymentMethod"].as_str().unwrap().to_string(),
                            ));
                            self.keys.push((no.clone(), input));
                        }
                        // The member pays online (sometimes twice, late, or never), or at the
                        // provider's cashier just as the trade is closed (by expiry or a
                        // cancel), its notification sometimes lost.
                        let pay = &r["data"]["placeOrder"]["payment"];
                        if pay.is_object() && rng.random_bool(0.15) {
                            let p = pay["provider"].as_str().unwrap_or_default();
                            self.sandbox.pay_during_close(p, &no, rng.random_bool(0.5));
                        } else if pay.is_object() && rng.random_bool(0.8) {
                            let n = Notification {
                                alipay: pay["provider"] == "ALIPAY",
                                order_no: no.clone(),
                                txn: format!("T{step}"),
                                fen: pay["amountCents"].as_i64().unwrap(),
                            };
                            provider.paid.insert((n.order_no.clone(), n.txn.clone()), n.fen);
                            let copies = rng.random_range(1..=3);
                            for _ in 0..copies {
                                if rng.random_bool(0.3) {
                                    provider.late.push((step + rng.random_range(1..200), n.clone()));
                                } else {
                                    provider.pending.push(n.clone());
                                }
                            }
                        }
                    }
                }
            }
            // Check in (sometimes the same serial number again, sometimes racing).
            35..=59 if !self.orders.is_empty() => {
                let (no, owner, _) = self.orders[rng.random_range(0..self.orders.len())].clone();
                let t = issue_token(SECRET, Role::Member, &owner, None, Duration::from_secs(3600));
                let txn = format!("G{}", rng.random_range(0..(step + 1) / 3 + 1));
                let q = "mutation($i: CheckInInput!) { checkIn(input: $i) { duplicate } }";
                let vars = json!({"i": {"orderNo": no, "consumeTxnNo": txn, "sessions": rng.random_range(1..=2)}});
                let (a, b) = (self.url(rng), self.url(rng));
                let (x, y) = tokio::join!(self.gql(&a, &t, q, vars.clone()), self.gql(&b, &t, q, vars));
                self.count_check_ins(&[x, y]);
            }
            60..=69 if !self.orders.is_empty() => {
                let (no, owner, _) = self.orders[rng.random_range(0..self.orders.len())].clone();
                let t = issue_token(SECRET, Role::Member, &owner, None, Duration::from_secs(3600));
                self.gql(
                    &url,
                    &t,
                    "mutation($n: String!) { cancelOrder(orderNo: $n) { status } }",
                    json!({"n": no}),
                )
                .await;
            }
            70..=77 if !self.orders.is_empty() => {
                let (no, ..) = self.orders[rng.random_range(0..self.orders.len())].clone();
                self.gql(
                    &url,
                    &self.admin,
                    "mutation($n: String!) { refundOrder(orderNo: $n, reason: \"chaos\") { status } }",
                    json!({"n": no}),
                )
                .await;
            }
            78..=85 if !self.orders.is_empty() => {
                let (no, ..) = self.orders[rng.random_range(0..self.orders.len())].clone();
                self.gql(
                    &url,
                    &self.admin,
                    "mutation($n: String!) { confirmOfflinePayment(orderNo: $n, reference: \"POS\") { status } }",
                    json!({"n": no}),
                )
                .await;
            }
            // A member takes an order back in its cooling-off period (a recent one: likelier paid
            // and not used yet).
            86..=93 if !self.orders.is_empty() => {
                let recent = self.orders.len().saturating_sub(12);
                let (no, owner, _) = self.orders[rng.random_range(recent..self.orders.len())].clone();
                let t = issue_token(SECRET, Role::Member, &owner, None, Duration::from_secs(3600));
                self.gql(
                    &url,
                    &t,
                    "mutation($n: String!) { requestCoolingOffRefund(orderNo: $n) { status } }",
                    json!({"n": no}),
                )
                .await;
            }
            n @ 100..=177 => self.card_action(n, step, rng).await,
            _ => {
                let _ = token;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    /// A new member of the store with ¥1,000 in the wallet.
    async fn join(&mut self, rng: &mut StdRng) -> Option<String> {
        let url = self.url(rng);
        let n = self.joined.len();
        let r = self
            .gql(
                &url,
                &self.admin,
                "mutation($i: CreateMemberInput!) { createMember(input: $i) { id } }",
                json!({"i": {"storeId": self.store, "name": format!("J{n}"), "phone": format!("1391000{n:04}")}}),
            )
            .await?;
        let m = r["data"]["createMember"]["id"].as_str()?.to_string();
        self.joined.push(m.clone());
        self.gql(
            &url,
            &self.admin,
            "mutation($m: ID!) { topUpWallet(memberId: $m, amountCents: 100000, reference: \"init\") { id } }",
            json!({"m": m}),
        )
        .await;
        Some(m)
    }

    fn tally(&mut self, what: &str, r: &Option<Value>) {
        *self.cards.entry(format!("{what}: {}", outcome(r))).or_default() += 1;
    }

    fn count_check_ins(&mut self, answers: &[Option<Value>]) {
        for r in answers {
            if outcome(r) == "MEMBERSHIP_FROZEN" {
                self.frozen_check_ins_refused += 1;
            }
        }
    }

    /// The database connection, made again after PostgreSQL restarted (`None` while it is away).
    async fn db(&mut self) -> Option<&mut diesel_async::AsyncPgConnection> {
        use diesel_async::{AsyncConnection, SimpleAsyncConnection};
        if let Some(c) = self.db.as_mut() {
            if c.batch_execute("SELECT 1").await.is_err() {
                self.db = None;
            }
        }
        if self.db.is_none() {
            self.db = diesel_async::AsyncPgConnection::establish(&self.db_url).await.ok();
        }
        self.db.as_mut()
    }

    /// The run's cards, oldest first.
    async fn cards(&mut self) -> Vec<Card> {
        use diesel_async::RunQueryDsl;
        let Some(c) = self.db().await else { return vec![] };
        diesel::sql_query(
            "SELECT m.id, m.member_id, o.order_no, m.status, m.transferred_at IS NOT NULL AS transferred,
                    m.valid_from <= now() AS started,
                    EXISTS (SELECT 1 FROM membership_freezes f
                             WHERE f.membership_id = m.id AND f.state = 'RUNNING' AND f.ends_at <= now()) AS ending,
                    (SELECT count(*) FROM membership_freezes f
                      WHERE f.membership_id = m.id AND f.state <> 'CALLED_OFF') AS freezes,
                    EXISTS (SELECT 1 FROM membership_freezes f
                             WHERE f.membership_id = m.id AND f.state <> 'CALLED_OFF'
                               AND (now() AT TIME ZONE 'Asia/Shanghai')::date >= f.from_date
                               AND (now() AT TIME ZONE 'Asia/Shanghai')::date < f.until_date) AS today_frozen
               FROM memberships m JOIN orders o ON o.id = m.order_id ORDER BY m.id",
        )
        .load(c)
        .await
        .unwrap_or_default()
    }

    /// A card for an action: one that `fits` three times in four when there is one (refusals
    /// are answers too), else any.
    fn pick(cards: &[Card], rng: &mut StdRng, fits: impl Fn(&Card) -> bool) -> Option<Card> {
        let fitting: Vec<&Card> = cards.iter().filter(|c| fits(c)).collect();
        if !fitting.is_empty() && rng.random_bool(0.75) {
            return Some(fitting[rng.random_range(0..fitting.len())].clone());
        }
        (!cards.is_empty()).then(|| cards[rng.random_range(0..cards.len())].clone())
    }

    /// The holder's token half the time, staff's the other half (both may freeze and unfreeze).
    fn member_or_staff(&self, card: &Card, rng: &mut StdRng) -> String {
        if rng.random_bool(0.5) {
            issue_token(
                SECRET,
                Role::Member,
                &card.member_id.to_string(),
                None,
                Duration::from_secs(3600),
            )
        } else {
            self.admin.clone()
        }
    }

    /// The holder checks in with the card, racing `other` (a freeze or an unfreeze of it) from
    /// another process.
    async fn race_check_in(
        &mut self,
        card: &Card,
        step: usize,
        rng: &mut StdRng,
        other: (&str, &str, Value),
    ) -> Option<Value> {
        let t = issue_token(
            SECRET,
            Role::Member,
            &card.member_id.to_string(),
            None,
            Duration::from_secs(3600),
        );
        let q = "mutation($i: CheckInInput!) { checkIn(input: $i) { duplicate } }";
        let vars = json!({"i": {"orderNo": card.order_no, "consumeTxnNo": format!("R{step}"), "sessions": 1}});
        let (a, b) = (self.url(rng), self.url(rng));
        let (token, query, v) = other;
        let (x, y) = tokio::join!(self.gql(&a, token, query, v), self.gql(&b, &t, q, vars));
        self.count_check_ins(std::slice::from_ref(&y));
        self.tally("check-in racing it", &y);
        x
    }

    /// One action of the cards' life (issue 36), `n` in 100..=177.
    async fn card_action(&mut self, n: usize, step: usize, rng: &mut StdRng) {
        const FREEZE: &str = "mutation($id: ID!, $from: Date!, $days: Int!, $reason: String!) {
            freezeMembership(id: $id, from: $from, days: $days, reason: $reason) { status } }";
        const UNFREEZE: &str = "mutation($id: ID!) { unfreezeMembership(id: $id) { status } }";
        const TRANSFER: &str = "mutation($id: ID!, $to: ID!, $fee: Int!) {
            transferMembership(id: $id, toMemberId: $to, feeCents: $fee, reason: \"chaos\") { member { id } } }";
        let cards = self.cards().await;
        match n {
            // A member buys a card with the wallet (paid at once: a card more to freeze and
            // transfer; a second one of a member waits behind the first).
            100..=109 => {
                let member = if self.joined.len() < 40 && rng.random_bool(0.5) {
                    let Some(m) = self.join(rng).await else { return };
                    m
                } else {
                    let all: Vec<&String> = self.members.iter().chain(&self.joined).collect();
                    all[rng.random_range(0..all.len())].clone()
                };
                let input = json!({"idempotencyKey": format!("c{step}"), "storeId": self.store,
                                   "item": {"membershipPlanId": self.plan}, "paymentMethod": "WALLET", "memberId": member});
                let t = issue_token(SECRET, Role::Member, &member, None, Duration::from_secs(3600));
                let url = self.url(rng);
                let q = "mutation($input: PlaceOrderInput!) { placeOrder(input: $input) { order { orderNo paymentMethod } } }";
                let r = self.gql(&url, &t, q, json!({"input": input.clone()})).await;
                if let Some(no) = r
                    .as_ref()
                    .and_then(|r| r["data"]["placeOrder"]["order"]["orderNo"].as_str())
                {
                    if !self.orders.iter().any(|(n, ..)| n == no) {
                        self.orders.push((no.to_string(), member.clone(), "WALLET".into()));
                        self.keys.push((no.to_string(), input));
                    }
                }
                if outcome(&r) == "PREPAID_LIMIT" {
                    self.prepaid_refused += 1;
                }
                self.tally("buy a card", &r);
            }
            // A freeze from today (it freezes at once), sometimes racing the holder's check-in.
            110..=121 => {
                let Some(card) = Self::pick(&cards, rng, |c| {
                    c.status == "ACTIVE" && c.started && c.freezes < 3 && !c.today_frozen
                }) else {
                    return;
                };
                let token = self.member_or_staff(&card, rng);
                let vars = json!({"id": card.id.to_string(), "from": today().to_string(),
                                  "days": rng.random_range(1..=8), "reason": "chaos: today"});
                let r = if rng.random_bool(0.5) {
                    self.race_check_in(&card, step, rng, (&token, FREEZE, vars)).await
                } else {
                    let url = self.url(rng);
                    self.gql(&url, &token, FREEZE, vars).await
                };
                self.tally("freeze from today", &r);
            }
            // A freeze from a later day: scheduled, for the scheduler to start.
            122..=133 => {
                let Some(card) = Self::pick(&cards, rng, |c| {
                    c.started && matches!(c.status.as_str(), "ACTIVE" | "FROZEN") && c.freezes < 3
                }) else {
                    return;
                };
                let token = self.member_or_staff(&card, rng);
                let from = today() + chrono::Duration::days(rng.random_range(1..=6));
                let vars = json!({"id": card.id.to_string(), "from": from.to_string(),
                                  "days": rng.random_range(1..=6), "reason": "chaos: later"});
                let url = self.url(rng);
                let r = self.gql(&url, &token, FREEZE, vars).await;
                self.tally("freeze from a later day", &r);
            }
            // Days pass for one freeze: a scheduled one's first day comes, or a running one's last
            // day is over (as tests/it/memberships.rs moves them); the processes' `membership:tick`
            // starts or ends it within a scan interval.
            134..=153 => {
                use diesel_async::RunQueryDsl;
                let coin = rng.random_bool(0.7);
                let pick = rng.random::<u64>();
                let Some(c) = self.db().await else { return };
                let due = |state: &str| {
                    format!(
                        "SELECT id FROM membership_freezes WHERE state = '{state}' AND {} > now() ORDER BY id",
                        if state == "SCHEDULED" { "starts_at" } else { "ends_at" }
                    )
                };
                let scheduled: Vec<Id> = diesel::sql_query(due("SCHEDULED")).load(c).await.unwrap_or_default();
                let running: Vec<Id> = diesel::sql_query(due("RUNNING")).load(c).await.unwrap_or_default();
                // Either kind, by the coin (a start seven times in ten) when both are there.
                let start = !scheduled.is_empty() && (running.is_empty() || coin);
                let ids = if start { scheduled } else { running };
                if ids.is_empty() {
                    return;
                }
                let (state, set) = if start {
                    ("SCHEDULED", "starts_at = now() - interval '1 second'")
                } else {
                    ("RUNNING", "ends_at = greatest(starts_at, now() - interval '1 second')")
                };
                let id = ids[(pick % ids.len() as u64) as usize].id;
                // The days that pass before a scheduled freeze's first day also end the card's
                // running freeze (they never overlap: it ends before the next one starts).
                let moved = diesel::sql_query(format!(
                    "WITH moved AS (UPDATE membership_freezes SET {set} WHERE id = $1 AND state = '{state}'
                                    RETURNING membership_id),
                          passed AS (UPDATE membership_freezes f
                                        SET ends_at = greatest(f.starts_at, now() - interval '2 seconds')
                                       FROM moved
                                      WHERE '{state}' = 'SCHEDULED' AND f.membership_id = moved.membership_id
                                        AND f.state = 'RUNNING' AND f.ends_at > now())
                     SELECT membership_id FROM moved"
                ))
                .bind::<diesel::sql_types::BigInt, _>(id)
                .execute(c)
                .await;
                let what = if start {
                    "a scheduled freeze's first day comes"
                } else {
                    "a running freeze's last day is over"
                };
                *self
                    .cards
                    .entry(format!(
                        "{what}: {}",
                        if matches!(moved, Ok(1)) { "moved" } else { "not moved" }
                    ))
                    .or_default() += 1;
            }
            // Unfreeze (a running freeze ends early, or a scheduled one is called off), sometimes
            // racing the holder's check-in; mostly not one whose end has come (the scheduler's,
            // which an unfreeze races now and then).
            154..=162 => {
                let Some(card) = Self::pick(&cards, rng, |c| c.status == "FROZEN" && !c.ending) else {
                    return;
                };
                let token = self.member_or_staff(&card, rng);
                let vars = json!({"id": card.id.to_string()});
                let r = if card.status == "FROZEN" && rng.random_bool(0.5) {
                    self.race_check_in(&card, step, rng, (&token, UNFREEZE, vars)).await
                } else {
                    let url = self.url(rng);
                    self.gql(&url, &token, UNFREEZE, vars).await
                };
                self.tally("unfreeze", &r);
            }
            // The desk transfers a card to another member of the store for a small fee from the
            // old holder's wallet.
            163..=172 => {
                let Some(card) = Self::pick(&cards, rng, |c| c.status == "ACTIVE" && !c.transferred) else {
                    return;
                };
                let holder = card.member_id.to_string();
                let joined: Vec<&String> = self.joined.iter().filter(|m| **m != holder).collect();
                let others: Vec<&String> = if !joined.is_empty() && rng.random_bool(0.6) {
                    joined
                } else {
                    self.members.iter().filter(|m| **m != holder).collect()
                };
                let to = others[rng.random_range(0..others.len())].clone();
                let fee = rng.random_range(1..=20) * 100;
                let url = self.url(rng);
                let r = self
                    .gql(
                        &url,
                        &self.admin,
                        TRANSFER,
                        json!({"id": card.id.to_string(), "to": to, "fee": fee}),
                    )
                    .await;
                if outcome(&r) == "ok" {
                    // The order passes with the card: the new holder checks in with it from now on.
                    for o in self.orders.iter_mut().filter(|o| o.0 == card.order_no) {
                        o.1 = to.clone();
                    }
                }
                self.tally("transfer", &r);
            }
            // The holder checks in with a frozen card (twice at once, at two processes).
            _ => {
                let Some(card) = Self::pick(&cards, rng, |c| c.status == "FROZEN") else {
                    return;
                };
                let t = issue_token(
                    SECRET,
                    Role::Member,
                    &card.member_id.to_string(),
                    None,
                    Duration::from_secs(3600),
                );
                let q = "mutation($i: CheckInInput!) { checkIn(input: $i) { duplicate } }";
                let vars = json!({"i": {"orderNo": card.order_no, "consumeTxnNo": format!("F{step}"), "sessions": 1}});
                let (a, b) = (self.url(rng), self.url(rng));
                let (x, y) = tokio::join!(self.gql(&a, &t, q, vars.clone()), self.gql(&b, &t, q, vars));
                self.tally(&format!("check-in with a {} card", card.status), &x);
                self.count_check_ins(&[x, y]);
            }
        }
    }
}

/// Sends a notification as its provider would; true when the server acknowledged it.
pub async fn send(http: &reqwest::Client, url: &str, n: &Notification) -> bool {
    let req = if n.alipay {
        let form = providers::alipay().payment(
            &n.order_no,
            &n.txn,
            "TRADE_SUCCESS",
            &fitorder::domain::money::format_yuan(n.fen),
        );
        http.post(format!("{url}/pay/alipay/notify"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form)
    } else {
        let w = providers::wechat();
        let sealed = w.notification(
            "TRANSACTION.SUCCESS",
            &w.transaction(&n.order_no, &n.txn, n.fen),
            chrono::Utc::now().timestamp(),
        );
        let mut r = http
            .post(format!("{url}/pay/wechat/notify"))
            .header("content-type", "application/json");
        for (k, v) in &sealed.headers {
            r = r.header(*k, v);
        }
        r.body(sealed.body)
    };
    matches!(req.send().await, Ok(r) if r.status().is_success())
}
