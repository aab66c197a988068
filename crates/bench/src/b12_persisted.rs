//! B12: the member app's `MyOrders` sent by hash (a persisted document: Apollo's automatic
//! persisted queries, `extensions.persistedQuery.sha256Hash`) against the same document sent
//! as text, from concurrent members, on one server: rates and the server's CPU per request.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use bytes::Bytes;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::b11_signin::member_operation;
use crate::env::{connect, Bench, CpuSplit};
use crate::load::{self, ms, Outcome, Prepared, Until};
use crate::report::Row;
use crate::{seed, Sizes};

fn request(server: &str, token: &str, body: &Value) -> Prepared {
    Prepared {
        url: format!("{server}/graphql"),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("authorization".into(), format!("Bearer {token}")),
        ],
        body: Bytes::from(body.to_string()),
    }
}

async fn post(req: &Prepared) -> Result<Value> {
    let mut b = reqwest::Client::new().post(&req.url).body(req.body.clone());
    for (k, v) in &req.headers {
        b = b.header(k, v);
    }
    Ok(b.send().await?.json().await?)
}

/// One form's runs added up: requests, wall time, latencies, the server's CPU.
#[derive(Default)]
struct Form {
    out: Outcome,
    server_cpu: f64,
}

impl Form {
    fn add(&mut self, o: Outcome, cpu: f64) {
        self.out.ok += o.ok;
        self.out.elapsed += o.elapsed;
        self.out.latencies.extend(o.latencies);
        for (k, v) in o.other {
            let e = self.out.other.entry(k).or_insert((0, v.1));
            e.0 += v.0;
        }
        self.server_cpu += cpu;
    }

    fn cpu_per_request_us(&self) -> f64 {
        1e6 * self.server_cpu / self.out.ok.max(1) as f64
    }

    fn describe(&mut self) -> String {
        self.out.latencies.sort_unstable();
        format!(
            "{:.0} requests/s (p50 {:.1} ms, p99 {:.1} ms), server CPU {:.0} µs per request",
            self.out.rate(),
            ms(self.out.percentile(50.0)),
            ms(self.out.percentile(99.0)),
            self.cpu_per_request_us()
        )
    }
}

/// Rounds of each form, taken in turn (text, hash, text, hash, …) so that whatever else the
/// machine does falls on both alike.
const ROUNDS: u32 = 3;

pub async fn run(bench: &mut Bench, s: &Sizes) -> Result<Row> {
    let url = seed::api_db(bench, s).await?;
    let db = connect(&url).await?;
    // The members with the most orders, one per connection.
    let members: Vec<i64> = db
        .query(
            "SELECT member_id FROM orders GROUP BY member_id ORDER BY count(*) DESC, member_id LIMIT $1",
            &[&(s.concurrency as i64)],
        )
        .await?
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    if members.is_empty() {
        bail!("no member has orders");
    }
    drop(db);
    let doc = member_operation("query MyOrders(")?;
    let hash: String = Sha256::digest(doc.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let variables = json!({"first": 20});
    let text_body = json!({"query": doc, "operationName": "MyOrders", "variables": variables});
    let hash_body = json!({
        "operationName": "MyOrders",
        "variables": variables,
        "extensions": {"persistedQuery": {"version": 1, "sha256Hash": hash}},
    });
    let register_body = json!({
        "query": doc,
        "operationName": "MyOrders",
        "variables": variables,
        "extensions": {"persistedQuery": {"version": 1, "sha256Hash": hash}},
    });
    let server = bench.start_server(&url, "server-b12").await?;
    let tokens: Vec<String> = members
        .iter()
        .map(|m| {
            fitorder::auth::issue_token(
                &bench.jwt_secret,
                fitorder::auth::Role::Member,
                &m.to_string(),
                None,
                Duration::from_secs(6 * 3600),
            )
        })
        .collect();

    // The hash unknown at first (PERSISTED_QUERY_NOT_FOUND), registered by sending it with the
    // text, then answered by hash alone exactly as by text.
    let unknown = post(&request(&server.base, &tokens[0], &hash_body)).await?;
    let registered = post(&request(&server.base, &tokens[0], &register_body)).await?;
    let by_hash = post(&request(&server.base, &tokens[0], &hash_body)).await?;
    let by_text = post(&request(&server.base, &tokens[0], &text_body)).await?;
    let edges = by_text["data"]["orders"]["edges"].as_array().map_or(0, |e| e.len());
    if by_text.get("errors").is_some() || registered.get("errors").is_some() || by_hash != by_text || edges == 0 {
        bail!(
            "MyOrders by hash did not answer as by text: {} vs {}",
            by_hash.to_string().chars().take(300).collect::<String>(),
            by_text.to_string().chars().take(300).collect::<String>()
        );
    }
    let total = by_text["data"]["orders"]["totalCount"].as_i64().unwrap_or(0);

    let texts = Arc::new(
        tokens
            .iter()
            .map(|t| request(&server.base, t, &text_body))
            .collect::<Vec<_>>(),
    );
    let hashes = Arc::new(
        tokens
            .iter()
            .map(|t| request(&server.base, t, &hash_body))
            .collect::<Vec<_>>(),
    );
    // Warm-up of both.
    for reqs in [&texts, &hashes] {
        load::run(
            reqs.clone(),
            s.concurrency,
            Until::Elapsed(Duration::from_millis(500)),
            200,
            true,
        )
        .await?;
    }
    let slice = Duration::from_secs_f64((s.orders_secs as f64 / ROUNDS as f64).max(1.0));
    say!(
        "B12: MyOrders as text and by hash in turn, {ROUNDS} × {:.1} s each, {} connections ...",
        slice.as_secs_f64(),
        s.concurrency
    );
    let (mut text, mut hashed) = (Form::default(), Form::default());
    let cpu_start = CpuSplit::sample(server.proc.pid());
    for _ in 0..ROUNDS {
        for (reqs, form) in [(&texts, &mut text), (&hashes, &mut hashed)] {
            let c0 = CpuSplit::sample(server.proc.pid());
            let o = load::run(reqs.clone(), s.concurrency, Until::Elapsed(slice), 200, true).await?;
            let c1 = CpuSplit::sample(server.proc.pid());
            form.add(o, c1.since(&c0).subject);
        }
    }
    let cpu_all = CpuSplit::sample(server.proc.pid()).since(&cpu_start);
    let wall = text.out.elapsed + hashed.out.elapsed;
    drop(server);
    let (text_s, hash_s) = (text.describe(), hashed.describe());
    say!("B12: text {text_s}; hash {hash_s}");

    let ratio = hashed.out.rate() / text.out.rate();
    let mut r = Row::new(
        "B12",
        format!(
            "the member app's `MyOrders` sent by hash (persisted document) vs as text, {} connections",
            s.concurrency
        ),
        "≥ 1.2 × the text form",
    );
    r.ours = format!("by hash: {hash_s}");
    r.baseline = format!("as text: {text_s}");
    r.ratio = Some(ratio);
    r.check(format!("ratio {ratio:.2} < 1.2"), ratio >= 1.2);
    r.check("no errors", text.out.failures() == 0 && hashed.out.failures() == 0);
    r.note(format!(
        "the `MyOrders` document of playground/operations/member.graphql with {{\"first\": 20}}, a member token per \
         connection ({} members with the most orders; the first has {total} orders, {edges} edges a page); as text: \
         `query` in the body ({} bytes); by hash: `extensions.persistedQuery` {{version: 1, sha256Hash}} alone ({} \
         bytes), registered once beforehand by sending it with the text (the unknown hash first answered {:?}); \
         the answer by hash checked equal to the answer by text",
        members.len(),
        text_body.to_string().len(),
        hash_body.to_string().len(),
        unknown["errors"][0]["extensions"]["code"].as_str().unwrap_or("?")
    ));
    r.note(format!(
        "{ROUNDS} rounds of {:.1} s of each form in turn on one server (`serve --no-workers`), each a closed loop; \
         rates are requests over the form's own wall time; server CPU per request from /proc over each round. {}",
        slice.as_secs_f64(),
        cpu_all.describe("fitorder server", wall)
    ));
    if text.out.failures() + hashed.out.failures() > 0 {
        r.note(format!(
            "failures: text {}; hash {}",
            text.out.describe_failures(),
            hashed.out.describe_failures()
        ));
    }
    Ok(r)
}
