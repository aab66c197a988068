//! What happens in a chaos run: the studio set up over GraphQL, then random actions of members,
//! staff and the providers — orders placed (some with a used key), paid online once, twice, late
//! or never, check-ins racing, cancels, refunds, offline confirmations.

use std::collections::HashMap;
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
}

impl World {
    /// The studio: a store, six members with money in their wallets, a pack with stock and one
    /// without, two coach slots (3 and 8 seats) and a membership plan.
    pub async fn set_up(
        http: &reqwest::Client,
        urls: &[String],
        sandbox: fitorder::dev::sandbox_server::SandboxProvider,
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
        match rng.random_range(0..100) {
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
                let _ = tokio::join!(self.gql(&a, &t, q, vars.clone()), self.gql(&b, &t, q, vars));
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
            _ => {
                let _ = token;
                tokio::time::sleep(Duration::from_millis(5)).await;
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
