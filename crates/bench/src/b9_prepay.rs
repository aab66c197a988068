//! B9: a WeChat Pay Native prepay round trip through the server — `placeOrder` with
//! `paymentMethod: WECHAT_PAY, channel: WECHAT_NATIVE` places the order, the server creates the
//! trade at the provider (the bench's sandbox, standing in for WeChat Pay on loopback), verifies
//! its signed answer and answers the `code_url` — against the stand-in's own latency: signed
//! Native prepay requests sent by the bench straight to the sandbox, the same way, one at a time.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use bytes::Bytes;
use fitorder::dev::devkeys::{DEV_MCH_ID, DEV_MERCHANT_SERIAL, DEV_WECHAT_APP_ID};
use fitorder::providers::wechat::signing::{authorization, Merchant};

use crate::env::{connect, Bench, CpuSplit};
use crate::load::{self, ms, Outcome, Prepared, Until};
use crate::report::Row;
use crate::{seed, Sizes};

/// The `PlaceOrder` operation and the fragment it spreads, cut out of the member documents.
fn place_order_document() -> Result<String> {
    let cut = crate::b11_signin::member_operation;
    Ok(format!(
        "{}\n{}",
        cut("mutation PlaceOrder(")?,
        cut("fragment PaymentInstructionFields")?
    ))
}

/// Sequential requests, one connection: the latency of one round trip, nothing queued behind.
const CONNECTIONS: usize = 1;

async fn members(db: &tokio_postgres::Client) -> Result<Vec<(i64, i64, i64)>> {
    Ok(db
        .query(
            "SELECT m.id, m.store_id, p.id FROM members m JOIN class_packs p ON p.store_id = m.store_id ORDER BY m.id",
            &[],
        )
        .await?
        .into_iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// `n` signed Native prepay requests to the sandbox, as fitorder's client makes them, for trades
/// `FB9S<first>`… (each a new out_trade_no: a repeated one is `OUT_TRADE_NO_USED`).
fn standin_requests(bench: &Bench, n: usize, first: usize) -> Vec<Prepared> {
    let merchant = Merchant {
        mch_id: DEV_MCH_ID,
        serial: DEV_MERCHANT_SERIAL,
        key: &bench.keys.merchant,
    };
    let path = "/v3/pay/transactions/native";
    let url = format!("{}{path}", bench.sandbox.wechat_api_base());
    let expire = (chrono::Utc::now() + chrono::Duration::minutes(30))
        .with_timezone(&chrono::FixedOffset::east_opt(8 * 3600).expect("UTC+8"))
        .format("%Y-%m-%dT%H:%M:%S%:z")
        .to_string();
    (0..n)
        .map(|i| {
            let body = serde_json::json!({
                "appid": DEV_WECHAT_APP_ID,
                "mchid": DEV_MCH_ID,
                "description": "AI strength · 10 sessions",
                "out_trade_no": format!("FB9S{:010}", first + i),
                "time_expire": expire,
                "notify_url": "http://127.0.0.1:9/pay/wechat/notify",
                "amount": {"total": 99_900, "currency": "CNY"},
            })
            .to_string();
            let ts = chrono::Utc::now().timestamp();
            let nonce = format!("{:032x}", rand::random::<u128>());
            let auth = authorization(&merchant, "POST", path, ts, &nonce, &body);
            Prepared {
                url: url.clone(),
                headers: vec![
                    ("authorization".into(), auth),
                    ("content-type".into(), "application/json".into()),
                    ("accept".into(), "application/json".into()),
                ],
                body: Bytes::from(body),
            }
        })
        .collect()
}

fn place_requests(
    bench: &Bench,
    server: &str,
    doc: &str,
    members: &[(i64, i64, i64)],
    n: usize,
    prefix: &str,
) -> Vec<Prepared> {
    (0..n)
        .map(|i| {
            let (member, store, pack) = members[i % members.len()];
            let token = fitorder::auth::issue_token(
                &bench.jwt_secret,
                fitorder::auth::Role::Member,
                &member.to_string(),
                None,
                Duration::from_secs(6 * 3600),
            );
            let body = serde_json::json!({
                "query": doc,
                "operationName": "PlaceOrder",
                "variables": {"input": {
                    "idempotencyKey": format!("{prefix}-{i}"),
                    "storeId": store.to_string(),
                    "item": {"classPackId": pack.to_string()},
                    "paymentMethod": "WECHAT_PAY",
                    "channel": "WECHAT_NATIVE",
                }},
            });
            Prepared {
                url: format!("{server}/graphql"),
                headers: vec![
                    ("content-type".into(), "application/json".into()),
                    ("authorization".into(), format!("Bearer {token}")),
                ],
                body: Bytes::from(body.to_string()),
            }
        })
        .collect()
}

fn latencies(o: &Outcome) -> String {
    format!(
        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        ms(o.percentile(50.0)),
        ms(o.percentile(99.0)),
        ms(o.latencies.last().copied().unwrap_or_default())
    )
}

pub async fn run(bench: &mut Bench, s: &Sizes) -> Result<Row> {
    let n = s.prepay_requests;
    let url = bench.fresh_db("b9").await?;
    {
        let db = connect(&url).await?;
        seed::catalog(&db, seed::MEMBERS).await?;
    }
    seed::settle(&url).await?;
    let db = connect(&url).await?;
    let members = members(&db).await?;
    let doc = place_order_document()?;
    let server = bench.start_server(&url, "server-b9").await?;

    // One order first: it must be placed WAIT_PAY with the Native code_url.
    let probe = place_requests(bench, &server.base, &doc, &members, 1, "b9-probe").remove(0);
    let mut req = reqwest::Client::new().post(&probe.url).body(probe.body.clone());
    for (k, v) in &probe.headers {
        req = req.header(k, v);
    }
    let answer: serde_json::Value = req.send().await?.json().await?;
    let code_url = answer["data"]["placeOrder"]["payment"]["qrCode"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if answer.get("errors").is_some() || code_url.is_empty() {
        bail!(
            "placeOrder did not answer a Native code_url: {}",
            answer.to_string().chars().take(400).collect::<String>()
        );
    }

    // Warm-up on both sides (connections, the server's pool, the sandbox's first answers).
    let warm = Arc::new(place_requests(bench, &server.base, &doc, &members, 20, "b9-warm"));
    load::run(warm, CONNECTIONS, Until::Exhausted, 200, true).await?;
    let warm = Arc::new(standin_requests(bench, 20, 1_000_000));
    load::run(warm, CONNECTIONS, Until::Exhausted, 200, false).await?;

    say!("B9: the stand-in's own latency, {n} signed Native prepay requests straight to it ...");
    let direct = Arc::new(tokio::task::block_in_place(|| standin_requests(bench, n, 0)));
    let calls_before = bench.sandbox.calls().len();
    let standin = load::run(direct, CONNECTIONS, Until::Exhausted, 200, false).await?;
    say!("B9: stand-in {}", latencies(&standin));

    say!("B9: {n} placeOrder (WECHAT_PAY, WECHAT_NATIVE) through the server, one at a time ...");
    let requests = Arc::new(place_requests(bench, &server.base, &doc, &members, n, "b9"));
    let cpu0 = CpuSplit::sample(server.proc.pid());
    let ours = load::run(requests, CONNECTIONS, Until::Exhausted, 200, true).await?;
    let cpu1 = CpuSplit::sample(server.proc.pid());
    drop(server);
    say!("B9: placeOrder {}", latencies(&ours));

    let native_ok = bench
        .sandbox
        .calls()
        .iter()
        .skip(calls_before)
        .filter(|c| c.api == "/v3/pay/transactions/native" && c.verified && c.status == 200)
        .count();
    let placed: i64 = db
        .query_one(
            "SELECT count(*) FROM orders WHERE status = 'WAIT_PAY' AND idempotency_key LIKE 'b9-%'
                AND idempotency_key NOT LIKE 'b9-warm%' AND idempotency_key NOT LIKE 'b9-probe%'",
            &[],
        )
        .await?
        .get(0);

    let p99 = ours.percentile(99.0);
    let limit = standin.percentile(99.0) * 2 + Duration::from_millis(10);
    let mut r = Row::new(
        "B9",
        "a WeChat Pay Native prepay round trip (placeOrder → trade at a local provider stand-in → answer verified)",
        "p99 ≤ 2 × the stand-in's own p99 + 10 ms",
    );
    r.ours = format!("placeOrder {}", latencies(&ours));
    r.baseline = format!("the stand-in alone: {}", latencies(&standin));
    r.ratio = Some(p99.as_secs_f64() / limit.as_secs_f64());
    r.check(format!("p99 {:.1} ms > {:.1} ms", ms(p99), ms(limit)), p99 <= limit);
    r.check(
        "all placed with a trade",
        ours.ok == n && ours.failures() == 0 && standin.ok == n && placed == n as i64 && native_ok >= 2 * n,
    );
    r.note(format!(
        "ours: the `PlaceOrder` document of playground/operations/member.graphql with paymentMethod WECHAT_PAY, \
         channel WECHAT_NATIVE, a class pack of the member's store, a member token per member ({} members in \
         turn), {n} requests over {CONNECTIONS} keep-alive connection one after another; a 200 without `errors` \
         counts (the first answer checked to carry the code_url, {code_url:?}); the server signs the prepay \
         request with the merchant key, the sandbox verifies it and signs its answer, the server verifies that \
         and records the trade; {placed} orders WAIT_PAY afterwards",
        members.len()
    ));
    r.note(format!(
        "baseline: {n} Native prepay requests signed ahead of time by the bench with fitorder's \
         `providers::wechat::signing::authorization` (the merchant key, the body fitorder's client sends), posted to \
         the sandbox's /v3/pay/transactions/native over {CONNECTIONS} keep-alive connection one after another; a \
         200 counts; {native_ok} verified Native prepays answered 200 by the sandbox over both phases"
    ));
    r.note(format!(
        "ratio: ours' p99 / (2 × the stand-in's p99 + 10 ms), ≤ 1 meets the goal; the stand-in runs in the bench \
         process (as the load generator does), the server in its own. {}",
        cpu1.since(&cpu0).describe("fitorder server", ours.elapsed)
    ));
    if ours.failures() > 0 || standin.failures() > 0 {
        r.note(format!(
            "failures: ours {}; stand-in {}",
            ours.describe_failures(),
            standin.describe_failures()
        ));
    }
    Ok(r)
}
