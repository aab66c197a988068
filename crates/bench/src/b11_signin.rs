//! B11: members signing in from the mini program — `signInWithWechat` of members already bound
//! to their WeChat account (the `wx.login` code exchanged at a local WeChat stand-in, the bench's
//! sandbox under `/wechat-mp`, for the openid; then one statement opens the session), from
//! concurrent clients — against the stand-in's own rate of `jscode2session` exchanges on as many
//! connections. Also `refreshSession` from as many clients, and the SQL statements each costs.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::env::{connect, Bench, CpuSplit};
use crate::load::{self, ms, Outcome, Prepared, Until};
use crate::report::Row;
use crate::sqlcount::{upstream_of, via, SqlCounter};
use crate::{seed, Sizes};

/// The member app's documents, as the app sends them.
const MEMBER_DOCUMENTS: &str = include_str!("../../../playground/operations/member.graphql");

/// The operation that starts with `head` (`"mutation SignInWithWechat("`), braces balanced.
pub fn member_operation(head: &str) -> Result<String> {
    let start = MEMBER_DOCUMENTS
        .find(head)
        .with_context(|| format!("no `{head}` in playground/operations/member.graphql"))?;
    let mut depth = 0usize;
    for (i, c) in MEMBER_DOCUMENTS[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Ok(MEMBER_DOCUMENTS[start..start + i + 1].to_string());
                }
            }
            _ => {}
        }
    }
    bail!("`{head}` is not closed")
}

/// The server's environment for signing in against the sandbox's mini-program API; the
/// per-address and per-openid sign-in limits raised (every client of the bench is one address).
fn sign_in_env(bench: &Bench) -> Vec<(&'static str, String)> {
    use fitorder::dev::sandbox_server::miniprogram;
    vec![
        ("WECHAT_MINIPROGRAM_APP_ID", miniprogram::DEV_MINIPROGRAM_APP_ID.into()),
        ("WECHAT_MINIPROGRAM_SECRET", miniprogram::DEV_MINIPROGRAM_SECRET.into()),
        ("WECHAT_API_BASE", miniprogram::api_base(&bench.sandbox.base_url)),
        ("FITORDER_SIGNIN_RATE", "100000000".into()),
        ("FITORDER_SIGNIN_RATE_PER_OPENID", "100000000".into()),
    ]
}

/// `n` fresh `wx.login` codes from the stand-in, for the openids in turn.
async fn codes(bench: &Bench, openids: &[String], n: usize) -> Result<Vec<String>> {
    let http = reqwest::Client::new();
    let base = format!("{}/wechat-mp/codes.json", bench.sandbox.base_url);
    let got: Vec<Result<String>> = futures_util::stream::iter(0..n)
        .map(|i| {
            let http = http.clone();
            let url = format!("{base}?openid={}", openids[i % openids.len()]);
            async move {
                let v: Value = http.get(&url).send().await?.error_for_status()?.json().await?;
                v["code"]
                    .as_str()
                    .map(str::to_string)
                    .with_context(|| format!("codes.json answered {v}"))
            }
        })
        .buffered(16)
        .collect()
        .await;
    got.into_iter().collect()
}

fn graphql(server: &str, doc: &str, op: &str, variables: Value) -> Prepared {
    Prepared {
        url: format!("{server}/graphql"),
        headers: vec![("content-type".into(), "application/json".into())],
        body: Bytes::from(json!({"query": doc, "operationName": op, "variables": variables}).to_string()),
    }
}

/// Sends `reqs` over 16 connections, keeping the answers (for the refresh tokens).
async fn answers(reqs: &[Prepared]) -> Result<Vec<Value>> {
    let http = reqwest::Client::new();
    let got: Vec<Result<Value>> = futures_util::stream::iter(reqs.iter().cloned())
        .map(|r| {
            let http = http.clone();
            async move {
                let mut b = http.post(&r.url).body(r.body.clone());
                for (k, v) in &r.headers {
                    b = b.header(k, v);
                }
                Ok(b.send().await?.json::<Value>().await?)
            }
        })
        .buffered(16)
        .collect()
        .await;
    got.into_iter().collect()
}

fn refresh_token_of(v: &Value, field: &str) -> Result<String> {
    v["data"][field]["refreshToken"]
        .as_str()
        .map(str::to_string)
        .with_context(|| {
            format!(
                "{field} answered {}",
                v.to_string().chars().take(300).collect::<String>()
            )
        })
}

fn rate(o: &Outcome) -> String {
    format!(
        "{:.0}/s (p50 {:.1} ms, p99 {:.1} ms)",
        o.rate(),
        ms(o.percentile(50.0)),
        ms(o.percentile(99.0))
    )
}

pub async fn run(bench: &mut Bench, s: &Sizes) -> Result<Row> {
    let n = s.sign_ins;
    let url = seed::api_db(bench, s).await?;
    let db = connect(&url).await?;
    // Every member bound to a WeChat account (as after their first sign-in).
    db.batch_execute(
        "INSERT INTO wechat_bindings (openid, member_id)
           SELECT 'oFB11member' || id, id FROM members ON CONFLICT DO NOTHING;
         UPDATE members m SET wechat_open_id = b.openid FROM wechat_bindings b
          WHERE b.member_id = m.id AND m.wechat_open_id IS DISTINCT FROM b.openid;",
    )
    .await?;
    let openids: Vec<String> = db
        .query("SELECT openid FROM wechat_bindings ORDER BY member_id", &[])
        .await?
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    if openids.is_empty() {
        bail!("no member is bound to a WeChat account");
    }
    seed::settle(&url).await?;
    let sign_in = member_operation("mutation SignInWithWechat(")?;
    let refresh = member_operation("mutation RefreshSession(")?;
    let env = sign_in_env(bench);
    let server = bench.start_server_with(&url, "server-b11", &env).await?;

    // One sign-in first: it must answer a session of the bound member, without errors.
    let probe_code = codes(bench, &openids, 1).await?.remove(0);
    let probe = answers(&[graphql(
        &server.base,
        &sign_in,
        "SignInWithWechat",
        json!({"code": probe_code}),
    )])
    .await?
    .remove(0);
    if probe.get("errors").is_some() || probe["data"]["signInWithWechat"]["newMember"] != json!(false) {
        bail!(
            "signInWithWechat did not sign the bound member in: {}",
            probe.to_string().chars().take(400).collect::<String>()
        );
    }
    // The stand-in answers an openid for a fresh code.
    let probe_code = codes(bench, &openids, 1).await?.remove(0);
    let exchange = |code: &str| -> Prepared {
        use fitorder::dev::sandbox_server::miniprogram::{DEV_MINIPROGRAM_APP_ID, DEV_MINIPROGRAM_SECRET};
        Prepared {
            url: format!(
                "{}/wechat-mp/sns/jscode2session?appid={DEV_MINIPROGRAM_APP_ID}&secret={DEV_MINIPROGRAM_SECRET}\
                 &js_code={code}&grant_type=authorization_code",
                bench.sandbox.base_url
            ),
            headers: vec![],
            // An empty body: the load generator sends a GET.
            body: Bytes::new(),
        }
    };
    let answer: Value = reqwest::get(&exchange(&probe_code).url).await?.json().await?;
    if answer["openid"].as_str().is_none() {
        bail!("the stand-in's jscode2session answered {answer}");
    }

    // Warm-up on both sides (connections, the server's pool and statement cache).
    let warm_codes = codes(bench, &openids, 200).await?;
    let warm: Vec<Prepared> = warm_codes[..100]
        .iter()
        .map(|c| graphql(&server.base, &sign_in, "SignInWithWechat", json!({"code": c})))
        .collect();
    load::run(Arc::new(warm), s.concurrency, Until::Exhausted, 200, true).await?;
    let warm: Vec<Prepared> = warm_codes[100..].iter().map(|c| exchange(c)).collect();
    load::run(Arc::new(warm), s.concurrency, Until::Exhausted, 200, false).await?;

    say!(
        "B11: the stand-in's own rate, {n} jscode2session exchanges, {} connections ...",
        s.concurrency
    );
    let direct: Vec<Prepared> = codes(bench, &openids, n).await?.iter().map(|c| exchange(c)).collect();
    let cpu_a = CpuSplit::sample(0);
    let standin = load::run(Arc::new(direct), s.concurrency, Until::Exhausted, 200, false).await?;
    let cpu_b = CpuSplit::sample(0);
    say!("B11: stand-in {}", rate(&standin));

    say!(
        "B11: {n} signInWithWechat of bound members, {} connections ...",
        s.concurrency
    );
    let reqs: Vec<Prepared> = codes(bench, &openids, n)
        .await?
        .iter()
        .map(|c| graphql(&server.base, &sign_in, "SignInWithWechat", json!({"code": c})))
        .collect();
    let cpu0 = CpuSplit::sample(server.proc.pid());
    let ours = load::run(Arc::new(reqs), s.concurrency, Until::Exhausted, 200, true).await?;
    let cpu1 = CpuSplit::sample(server.proc.pid());
    say!("B11: signInWithWechat {}", rate(&ours));

    // Sessions to refresh, opened untimed; then each refresh token spent once, timed.
    let opened: Vec<Prepared> = codes(bench, &openids, n)
        .await?
        .iter()
        .map(|c| graphql(&server.base, &sign_in, "SignInWithWechat", json!({"code": c})))
        .collect();
    let tokens: Vec<String> = answers(&opened)
        .await?
        .iter()
        .map(|v| refresh_token_of(v, "signInWithWechat"))
        .collect::<Result<_>>()?;
    let reqs: Vec<Prepared> = tokens
        .iter()
        .map(|t| graphql(&server.base, &refresh, "RefreshSession", json!({"refreshToken": t})))
        .collect();
    say!("B11: {n} refreshSession, {} connections ...", s.concurrency);
    let cpu2 = CpuSplit::sample(server.proc.pid());
    let refreshed = load::run(Arc::new(reqs), s.concurrency, Until::Exhausted, 200, true).await?;
    let cpu3 = CpuSplit::sample(server.proc.pid());
    drop(server);
    say!("B11: refreshSession {}", rate(&refreshed));

    say!("B11: counting SQL statements per sign-in and per refresh (a server talking through a counting proxy) ...");
    let counted_n = s.count_requests;
    let (per_sign_in, per_refresh) = {
        let counter = SqlCounter::start(upstream_of(&url)?).await?;
        let counted = bench
            .start_server_with(&via(&url, counter.port)?, "server-b11-count", &env)
            .await?;
        let sign_ins: Vec<Prepared> = codes(bench, &openids, counted_n + 1)
            .await?
            .iter()
            .map(|c| graphql(&counted.base, &sign_in, "SignInWithWechat", json!({"code": c})))
            .collect();
        // The first opens the pool's connection and prepares; the others are counted.
        let mut tokens = vec![refresh_token_of(
            &answers(&sign_ins[..1]).await?[0],
            "signInWithWechat",
        )?];
        let before = counter.counts();
        for r in &sign_ins[1..] {
            tokens.push(refresh_token_of(
                &answers(std::slice::from_ref(r)).await?[0],
                "signInWithWechat",
            )?);
        }
        let per_sign_in = counter.counts().since(&before);
        let first = graphql(
            &counted.base,
            &refresh,
            "RefreshSession",
            json!({"refreshToken": tokens[0]}),
        );
        refresh_token_of(&answers(&[first]).await?[0], "refreshSession")?;
        let before = counter.counts();
        for t in &tokens[1..] {
            let r = graphql(&counted.base, &refresh, "RefreshSession", json!({"refreshToken": t}));
            refresh_token_of(&answers(&[r]).await?[0], "refreshSession")?;
        }
        (per_sign_in, counter.counts().since(&before))
    };
    let refresh_statements = per_refresh.all() as f64 / counted_n as f64;
    say!(
        "B11: {:.1} statements per sign-in, {refresh_statements:.1} per refresh",
        per_sign_in.all() as f64 / counted_n as f64
    );

    let ratio = ours.rate() / standin.rate();
    let mut r = Row::new(
        "B11",
        format!(
            "members signing in (`signInWithWechat`, bound members) against a local WeChat mini-program stand-in, {} connections",
            s.concurrency
        ),
        "≥ 0.5 × the stand-in's own request rate; a `refreshSession` ≤ 2 SQL statements",
    );
    r.ours = format!(
        "{} sign-ins; refreshSession {}, {refresh_statements:.1} statements each",
        rate(&ours),
        rate(&refreshed)
    );
    r.baseline = format!("the stand-in's jscode2session alone: {}", rate(&standin));
    r.ratio = Some(ratio);
    r.check(format!("ratio {ratio:.2} < 0.5"), ratio >= 0.5);
    r.check(
        format!("{refresh_statements:.1} statements per refreshSession > 2"),
        refresh_statements <= 2.0,
    );
    r.check(
        "no errors",
        ours.failures() == 0 && standin.failures() == 0 && refreshed.failures() == 0 && ours.ok == n,
    );
    r.note(format!(
        "ours: the `SignInWithWechat` document of playground/operations/member.graphql with a fresh `wx.login` code \
         each ({n} codes handed out by the stand-in beforehand, for {} bound members in turn), no token, over {} \
         keep-alive connections, each request once; a 200 without `errors` counts. The server exchanges the code at \
         the stand-in (`GET /sns/jscode2session`, the bench's sandbox under /wechat-mp, in the bench process) and \
         opens the session in one statement; the sign-in limits per address and per openid raised for the run. {}",
        openids.len(),
        s.concurrency,
        cpu1.since(&cpu0).describe("fitorder server", ours.elapsed)
    ));
    r.note(format!(
        "baseline: {n} `jscode2session` exchanges of fresh codes sent by the bench straight to the stand-in over {} \
         keep-alive connections, each once; a 200 counts. {}",
        s.concurrency,
        cpu_b.since(&cpu_a).describe("", standin.elapsed)
    ));
    r.note(format!(
        "refreshSession: the `RefreshSession` document with the refresh tokens of {n} sessions opened beforehand \
         (untimed), each spent once over {} connections. {}",
        s.concurrency,
        cpu3.since(&cpu2).describe("fitorder server", refreshed.elapsed)
    ));
    r.note(format!(
        "statements (a second server instance through the counting wire-protocol proxy, {counted_n} sequential \
         requests each after one that prepares): signInWithWechat → {}; refreshSession → {}",
        per_sign_in.per(counted_n, "sign-in"),
        per_refresh.per(counted_n, "refresh")
    ));
    if ours.failures() + standin.failures() + refreshed.failures() > 0 {
        r.note(format!(
            "failures: sign-in {}; stand-in {}; refresh {}",
            ours.describe_failures(),
            standin.describe_failures(),
            refreshed.describe_failures()
        ));
    }
    Ok(r)
}
